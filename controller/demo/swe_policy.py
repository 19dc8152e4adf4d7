"""The scripted policy's player for `swe` tasks: per-task scripts read from a policy-script file.

A repository task's fix cannot be derived from what the agent sees, and the fake model must not
take it from the task either: the run hands the policy server a *policy script* (`paddock run
--policy-script FILE`, config key `policy_script`; `policy_script=` of a Slurm job), an oracle
file read outside every sandbox, JSON or YAML:

    tasks:                                   # by task name (or the name without "swe/")
      swe/python-babel__babel-637:
        solve: {patch: "<unified diff>", commands: ["python3 -m pytest -q ..."], final: "done"}
        wrong: {patch: "<a wrong diff>"}
        null: {}                             # changes nothing
    versions: [wrong, solve]                 # optional: the variant policy version v plays

A variant's script is one `edit` call per hunk of its patch (old text: the hunk's context and
removed lines; new text: its context and added lines), a `write_file` per new file and a `shell
rm` per deleted one, then each command as a `shell` call, then the final message. With
`versions`, version v plays `versions[v]` (past the end, the last), so the run's pass rate moves
with the version; without it, the variant is drawn uniformly with the request's seed. The first
message says which (`plan: <variant>`), as the built-in strategies do; the REINFORCE trainer
leaves the family alone.

`SwePlayer` is what `ScriptedPolicy(players={"swe": ...})` asks: `choose(task, version, seed)`
and `script(task, variant, tool_results)`.

Must not import: zmq, sqlite3, nodeagent.
"""
from __future__ import annotations

import math
import random
import re
import shlex
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterable

from controller.contracts.safeload import ParseLimitError, load_json, load_yaml
from controller.contracts.tasks import Task
from controller.demo.policy_server import UNKNOWN_TASK_REPLY, FinalStep, Step, ToolStep

FAMILY = "swe"
WORKDIR = "/work"
DEFAULT_FINAL = "done"
VARIANT_KEYS = ("patch", "commands", "final")
_HUNK = re.compile(r"^@@ -(\d+)(?:,(\d+))? \+(\d+)(?:,(\d+))? @@")


class PolicyScriptError(ValueError):
    """A policy-script file is unreadable or malformed; the message names the file and key."""


@dataclass(frozen=True)
class Variant:
    steps: tuple[Step, ...]          # the tool calls; the final message follows them
    final: str


@dataclass(frozen=True)
class FilePatch:
    path: str                        # relative to the repository root; the new path
    hunks: tuple[tuple[str, str], ...]   # (old text, new text) per hunk
    created: bool = False
    deleted: bool = False


def _strip(path: str) -> str:
    path = path.split("\t")[0].strip()
    return path[2:] if path[:2] in ("a/", "b/") else path


def _hunk(lines: list[str], i: int, old_n: int, new_n: int) -> tuple[str, str, int]:
    """One hunk's (old text, new text) from lines[i:], and the index after it."""
    old: list[str] = []
    new: list[str] = []
    last = ""
    while i < len(lines) and (old_n > 0 or new_n > 0 or lines[i].startswith("\\")):
        line = lines[i]
        tag, text = line[:1], line[1:]
        if tag == "\\":                       # "\ No newline at end of file": the line before
            for side, tags in ((old, " -"), (new, " +")):
                if last in tags and side:
                    side[-1] = side[-1].rstrip("\n")
        elif tag in (" ", "") and old_n > 0 and new_n > 0:
            text = text or "\n"
            old.append(text), new.append(text)
            old_n, new_n = old_n - 1, new_n - 1
        elif tag == "-" and old_n > 0:
            old.append(text)
            old_n -= 1
        elif tag == "+" and new_n > 0:
            new.append(text)
            new_n -= 1
        else:
            raise PolicyScriptError(f"malformed hunk line {line[:60]!r}")
        last = tag or " "
        i += 1
    if old_n or new_n:
        raise PolicyScriptError("a hunk ends before its line counts say")
    return "".join(old), "".join(new), i


def parse_patch(patch: str) -> list[FilePatch]:
    """A unified diff (git's or diff -u's) as one FilePatch per file. PolicyScriptError if malformed."""
    lines = patch.splitlines(keepends=True)
    out: list[FilePatch] = []
    i = 0
    while i < len(lines):
        if not (lines[i].startswith("--- ") and i + 1 < len(lines) and lines[i + 1].startswith("+++ ")):
            i += 1
            continue
        old_path, new_path = _strip(lines[i][4:]), _strip(lines[i + 1][4:])
        i += 2
        hunks = []
        while i < len(lines) and (m := _HUNK.match(lines[i])):
            old_n = int(m.group(2)) if m.group(2) is not None else 1
            new_n = int(m.group(4)) if m.group(4) is not None else 1
            old, new, i = _hunk(lines, i + 1, old_n, new_n)
            hunks.append((old, new))
        if not hunks:
            raise PolicyScriptError(f"the diff of {new_path} has no hunk")
        created, deleted = old_path == "/dev/null", new_path == "/dev/null"
        out.append(FilePatch(old_path if deleted else new_path, tuple(hunks), created, deleted))
    if patch.strip() and not out:
        raise PolicyScriptError("the patch holds no '--- a/<path>' / '+++ b/<path>' file header")
    return out


def patch_steps(patch: str) -> list[ToolStep]:
    """The tool calls that make `patch`'s change with the agent's own tools."""
    steps: list[ToolStep] = []
    for fp in parse_patch(patch):
        path = f"{WORKDIR}/{fp.path}"
        if fp.created:
            steps.append(ToolStep("write_file", {"path": path, "content": "".join(n for _o, n in fp.hunks)}))
        elif fp.deleted:
            steps.append(ToolStep("shell", {"command": f"rm -f -- {shlex.quote(path)}"}))
        else:
            for old, new in fp.hunks:
                if not old:
                    raise PolicyScriptError(f"a hunk of {fp.path} has no context or removed line to edit at")
                steps.append(ToolStep("edit", {"path": path, "old": old, "new": new}))
    return steps


def _variant(where: str, spec: Any) -> Variant:
    if spec is None:
        spec = {}
    if not isinstance(spec, dict) or set(spec) - set(VARIANT_KEYS):
        raise PolicyScriptError(f"{where} must be an object with keys among {list(VARIANT_KEYS)}, got {spec!r:.120}")
    patch, commands, final = spec.get("patch") or "", spec.get("commands") or [], spec.get("final", DEFAULT_FINAL)
    if not isinstance(patch, str):
        raise PolicyScriptError(f"{where}.patch must be a unified diff (a string)")
    if not isinstance(commands, list) or not all(isinstance(c, str) and c for c in commands):
        raise PolicyScriptError(f"{where}.commands must be a list of shell commands")
    if not isinstance(final, str) or not final:
        raise PolicyScriptError(f"{where}.final must be a non-empty string")
    try:
        steps: list[Step] = [*patch_steps(patch)]
    except PolicyScriptError as exc:
        raise PolicyScriptError(f"{where}.patch: {exc}") from None
    steps += [ToolStep("shell", {"command": c}) for c in commands]
    return Variant(tuple(steps), final)


@dataclass(frozen=True)
class PolicyScript:
    """The parsed file: {task key: {variant: Variant}} and the optional version pins."""
    tasks: dict[str, dict[str, Variant]]
    versions: tuple[str, ...] = ()
    source: str = ""

    def variants_of(self, task: Task) -> dict[str, Variant] | None:
        return self.tasks.get(task.name) or self.tasks.get(task.name.removeprefix(f"{FAMILY}/"))

    def missing(self, tasks: Iterable[Task]) -> list[str]:
        """Names of the swe tasks this script has no variants for."""
        return [t.name for t in tasks if t.family == FAMILY and not self.variants_of(t)]


def parse_policy_script(data: Any, source: str = "<policy script>") -> PolicyScript:
    if not isinstance(data, dict) or "tasks" not in data or set(data) - {"tasks", "versions"}:
        raise PolicyScriptError(f"{source}: must be an object with 'tasks' (and optionally 'versions')")
    if not isinstance(data["tasks"], dict) or not data["tasks"]:
        raise PolicyScriptError(f"{source}: 'tasks' must map task names to their variants")
    tasks: dict[str, dict[str, Variant]] = {}
    for name, variants in data["tasks"].items():
        if not isinstance(variants, dict) or not variants:
            raise PolicyScriptError(f"{source}: tasks[{name!r}] must map variant names to scripts")
        tasks[str(name)] = {str(v): _variant(f"{source}: tasks[{name!r}][{v!r}]", spec) for v, spec in variants.items()}
    versions = data.get("versions") or []
    if not isinstance(versions, list) or not all(isinstance(v, str) for v in versions):
        raise PolicyScriptError(f"{source}: 'versions' must be a list of variant names")
    for i, v in enumerate(versions):
        lacking = sorted(n for n, vs in tasks.items() if v not in vs)
        if lacking:
            raise PolicyScriptError(f"{source}: versions[{i}] is {v!r}, which task {lacking[0]!r} has no script for")
    return PolicyScript(tasks, tuple(versions), source)


def load_policy_script(path: str | Path) -> PolicyScript:
    """Read a policy-script file (JSON or YAML). PolicyScriptError names the file and the key."""
    try:
        data = load_json(path) if str(path).endswith(".json") else load_yaml(path)
    except OSError as exc:
        raise PolicyScriptError(f"cannot read policy script {path}: {exc}") from None
    except ParseLimitError as exc:
        line = f" (line {exc.line})" if exc.line else ""
        raise PolicyScriptError(f"policy script {exc.source} is not valid JSON/YAML{line}: {exc.detail}") from None
    return parse_policy_script(data, str(path))


class SwePlayer:
    """Plays `swe` tasks from a PolicyScript (see the module docstring)."""

    def __init__(self, script: PolicyScript) -> None:
        self.policy_script = script

    def choose(self, task: Task, version: int, seed: int) -> tuple[str, float]:
        """(variant, its log-probability) for this version and seed."""
        variants = self.policy_script.variants_of(task)
        if not variants:
            return "unknown", 0.0
        pins = self.policy_script.versions
        if pins:
            return pins[min(version, len(pins) - 1)], 0.0
        names = sorted(variants)
        return names[random.Random(seed).randrange(len(names))], -math.log(len(names))

    def script(self, task: Task, variant: str, tool_results: list[str]) -> list[Step]:
        """The variant's tool calls, then its final message."""
        v = (self.policy_script.variants_of(task) or {}).get(variant)
        if v is None:
            return [FinalStep(UNKNOWN_TASK_REPLY)]
        return [*v.steps, FinalStep(v.final)]
