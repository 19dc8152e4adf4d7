"""`paddock check` and `paddock verify`: the verifier for analysts and task authors.

  paddock check math --gold G --pred P       prints true/false (exit 0/1); also `exact`, `regex`
  paddock verify --task T --solution PATH    grades one solution (a file, a directory or a patch)
  paddock verify --task T --answer TEXT      grades one final answer (answer tasks)

Thin: parses arguments, turns a solution path into sandbox changes, calls the verifier in the
task's own image (its `image: sha256:...`, unless `--image` is given) with its layers stacked
(its repository, then its set-up layer, as a rollout's grading sandbox). A patch on a
repository task is applied to the files it touches, read from the task's layers. The task (a
name, an id or a task file) is decoded once, here, into the verifier's typed `GradedTask`.
(`paddock rescore` is controller/cli/analysis.py.) Must not import: zmq, controller.broker.
"""
from __future__ import annotations

import argparse
import json
import math
import re
import subprocess
import sys
import tempfile
from pathlib import Path

from controller.contracts.checkerspec import MAX_TIMEOUT_S
from controller.contracts.safeload import ParseLimitError, load_json
from controller.contracts.tasks import Budgets, GradedTask, Limits, Task, TaskError, decode_content
from controller.taskbank import bank as taskbank
from controller.taskbank.builtin import builtin_taskset
from layers.builtin import default_store_root, ensure_builtin_image
from layers.store import ImageStore
from nodeagent.sandbox.runtime import Change, SandboxError, SandboxRuntime
from nodeagent.verifier import grade as verifier
from nodeagent.verifier.checks import CheckInfraError, CheckRunner
from nodeagent.verifier.validate import own_image, sandbox_layers, task_layers

MAX_SOLUTION_BYTES = 8 << 20


class SolutionError(ValueError):
    """A solution path cannot be turned into changes; the message names the path."""


def _check_timeout(text: str) -> float:
    """A check deadline: finite, > 0 and at most MAX_TIMEOUT_S (NaN or inf would fail every answer)."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number: {text!r}") from None
    if not math.isfinite(value) or not 0 < value <= MAX_TIMEOUT_S:
        raise argparse.ArgumentTypeError(f"must be > 0 and at most {MAX_TIMEOUT_S:g} seconds, got {text!r}")
    return value


def solution_changes(task: GradedTask, path: str | Path, layers: tuple = ()) -> tuple[list, str | None]:
    """(changes under /work, answer) for a solution: a patch (*.patch / *.diff), a directory
    (its files laid over the task's visible files), or a file (placed at /work/<name>; for answer tasks, its text
    is the answer). `layers`: the task's layer files (a patch's pre-images are read from them)."""
    p = Path(path)
    if not p.exists():
        raise SolutionError(f"solution {str(p)!r} does not exist")
    if p.is_file() and task.checker.answer_kind:
        return [], p.read_text(errors="replace")
    original = {k: verifier.as_bytes(v) for k, v in task.files.items()}
    if p.is_dir():
        files = {**original,
                 **{str(f.relative_to(p)): f.read_bytes() for f in sorted(p.rglob("*")) if f.is_file()}}
    elif p.suffix in (".patch", ".diff"):
        original.update(layer_files(layers, patch_paths(p.read_text(errors="replace"))))
        files = _patched(original, p)
    else:
        files = {**original, p.name: p.read_bytes()}
    if sum(len(v) for v in files.values()) > MAX_SOLUTION_BYTES:
        raise SolutionError(f"solution {str(p)!r} is larger than {MAX_SOLUTION_BYTES} bytes")
    changes = [Change(f"/work/{rel}", "deleted", None, 0) for rel in sorted(set(original) - set(files))]
    changes += [Change(f"/work/{rel}", "modified" if rel in original else "added", data, 0o644)
                for rel, data in sorted(files.items()) if original.get(rel) != data]
    return changes, None


def patch_paths(patch: str) -> list[str]:
    """The repository paths a unified diff reads or writes (its `--- a/` and `+++ b/` lines)."""
    return sorted({m for m in re.findall(r"^(?:---|\+\+\+) [ab]/(\S+)", patch, flags=re.M)})


def layer_files(layers: tuple, paths: list[str]) -> dict[str, bytes]:
    """The files at `paths` (under /work) as the stacked `layers` show them: the topmost layer
    holding a path wins; a path no layer holds is left out. Reads each layer with `unsquashfs`."""
    out: dict[str, bytes] = {}
    if not paths:
        return out
    for layer in layers:
        with tempfile.TemporaryDirectory(prefix="paddock-layer-") as tmp:
            argv = ["unsquashfs", "-q", "-n", "-f", "-d", f"{tmp}/x", str(layer), *(f"work/{p}" for p in paths)]
            r = subprocess.run(argv, capture_output=True, text=True, timeout=120)
            if r.returncode not in (0, 2):      # 2: some of the paths are not in this layer
                raise SolutionError(f"cannot read {layer}: {argv} exit {r.returncode}: {r.stderr.strip()[-300:]}")
            for rel in paths:
                f = Path(tmp, "x", "work", rel)
                if f.is_file() and not f.is_symlink():
                    out[rel] = f.read_bytes()
    return out


def _patched(original: dict[str, bytes], patch: Path) -> dict[str, bytes]:
    with tempfile.TemporaryDirectory(prefix="paddock-patch-") as tmp:
        for rel, data in original.items():
            (Path(tmp) / rel).parent.mkdir(parents=True, exist_ok=True)
            (Path(tmp) / rel).write_bytes(data)
        argv = ["patch", "-p1", "--batch", "--forward", "--silent", "-d", tmp, "-i", str(patch.resolve())]
        r = subprocess.run(argv, capture_output=True, text=True, timeout=60)
        if r.returncode != 0:
            raise SolutionError(f"patch {str(patch)!r} does not apply ({argv} exit {r.returncode}): "
                                f"{(r.stdout + r.stderr).strip()[-500:]}")
        return {str(f.relative_to(tmp)): f.read_bytes() for f in Path(tmp).rglob("*")
                if f.is_file() and not f.name.endswith((".orig", ".rej"))}


def find_task(ref: str, bank: str | None = None) -> GradedTask:
    """A task by name or id: a task `.json` file, the built-in set, or the task bank; as the
    verifier takes it (VerifierInfraError naming the field if its checker spec is malformed)."""
    if ref.endswith(".json") and Path(ref).is_file():
        return verifier.graded_task(task_from_json(Path(ref)))
    for t in builtin_taskset().tasks:
        if ref in (t.name, t.task_id, t.short_id):
            return verifier.graded_task(dict(t.canonical(), task_id=t.task_id))
    try:
        t = taskbank.find_task(taskbank.TaskBank(bank), ref)
    except (TaskError, OSError) as exc:
        raise SolutionError(f"no task {ref!r} in the built-in set, and {exc}") from None
    return verifier.graded_task(dict(t.canonical(), task_id=t.task_id))


def task_from_json(path: Path) -> dict:
    """A task `.json` file (a task's canonical form, `Task.canonical()` with or without its
    `task_id`), checked like a task package: SolutionError naming the file and the field."""
    try:
        data = load_json(path)
    except (OSError, ParseLimitError) as exc:
        raise SolutionError(f"task file {exc}") from None
    if not isinstance(data, dict):
        raise SolutionError(f"{path}: a task file must be a JSON object (a task's canonical form), "
                            f"got a JSON {type(data).__name__}")
    fields = {k: v for k, v in data.items() if k != "task_id"}
    try:
        for key in ("files", "hidden"):
            if key in fields:
                if not isinstance(fields[key], dict):
                    raise TaskError(f"'{key}' must be an object of path: content")
                fields[key] = {p: decode_content(v) for p, v in fields[key].items()}
        if "budgets" in fields:
            fields["budgets"] = Budgets.from_dict(fields["budgets"])
        if "limits" in fields:
            if not isinstance(fields["limits"], dict):
                raise TaskError("'limits' must be an object")
            fields["limits"] = Limits(**fields["limits"])
        task = Task(**fields)
    except TaskError as exc:
        raise SolutionError(f"{path}: not a valid task: {exc}") from None
    except (TypeError, ValueError, KeyError) as exc:
        raise SolutionError(f"{path}: not a valid task: {' '.join(str(exc).split())}") from None
    if data.get("task_id") not in (None, task.task_id):
        raise SolutionError(f"{path}: content hashes to {task.task_id} but the file records task_id "
                            f"{data['task_id']} (edited after it was written?)")
    return dict(task.canonical(), task_id=task.task_id)


def cmd_check(args) -> int:
    try:
        with CheckRunner(preload=("nodeagent.verifier.checkers", "math_verify")) as runner:
            r = runner.run("nodeagent.verifier.checkers:answer_verdict", [args.kind, args.gold, args.pred, getattr(args, "instruction", None)],
                           timeout_s=args.timeout)
    except CheckInfraError as exc:
        print(f"paddock check: {exc}", file=sys.stderr)
        return 2
    if r.outcome != "ok":
        print(f"paddock check: {r.outcome}: {r.detail}", file=sys.stderr)
        print("false")
        return 1
    print("true" if r.value["ok"] else "false")
    if args.verbose:
        print(r.value["detail"], file=sys.stderr)
    return 0 if r.value["ok"] else 1


def cmd_verify(args) -> int:
    if args.solution is None and args.answer is None:
        print("paddock verify: give --solution PATH, --answer TEXT, or both", file=sys.stderr)
        return 2
    store = ImageStore(args.image_store or default_store_root())
    try:
        task = find_task(args.task, args.bank)
        image = store.resolve(args.image) if args.image else own_image(ensure_builtin_image(store)[1], task)
        changes, answer = (solution_changes(task, args.solution, task_layers(image, task))
                           if args.solution is not None else ([], None))
    except (SolutionError, OSError, ValueError, verifier.VerifierInfraError) as exc:
        print(f"paddock verify: {exc}", file=sys.stderr)
        return 2
    answer = args.answer if args.answer is not None else answer
    try:
        with SandboxRuntime() as rt:
            v = verifier.verify(rt, image, task, changes, answer, layers=sandbox_layers(rt, image, task))
    except (verifier.VerifierInfraError, SandboxError) as exc:
        print(json.dumps({"outcome": "infra_error", "reward": None, "reason": str(exc)}, indent=2))
        return 3
    print(json.dumps({"task": task.name, "outcome": v.outcome, "reward": v.reward,
                      "components": v.components, "tampered": v.tampered,
                      "verifier_version": verifier.VERIFIER_VERSION, "checks": v.checks}, indent=2))
    return 0 if v.outcome == "pass" else 1


def register(sub: argparse._SubParsersAction) -> None:
    """Add `paddock check` and `paddock verify`."""
    chk = sub.add_parser("check", help="check one answer against a gold answer (prints true/false)")
    kinds = chk.add_subparsers(dest="kind", required=True)
    for kind, what in (("math", "math equivalence"), ("exact", "exact match"), ("regex", "regex full match")):
        k = kinds.add_parser(kind, help=what)
        k.add_argument("--gold", required=True, help="gold answer (a regex for `regex`)")
        k.add_argument("--pred", required=True, help="the model's text")
        if kind == "math":
            k.add_argument("--instruction", default=None,
                           help="the task's prompt: says whether a decimal for an exact gold was asked "
                                "(e.g. 'to the nearest hundredth')")
        k.add_argument("--timeout", type=_check_timeout, default=10.0, help="seconds before the check is killed "
                       f"(> 0, at most {MAX_TIMEOUT_S:g})")
        k.add_argument("-v", "--verbose", action="store_true", help="print what was extracted")
        k.set_defaults(func=cmd_check)

    ver = sub.add_parser("verify", help="grade one solution of one task, print outcome and reward components")
    ver.add_argument("--task", required=True, help="task name or id (built-in set or task bank), or a task .json")
    ver.add_argument("--bank", metavar="DIR", help="task-bank directory (default $PADDOCK_TASKBANK or ./taskbank)")
    ver.add_argument("--solution", help="a file, a directory or a *.patch/*.diff")
    ver.add_argument("--answer", help="the final answer text (answer tasks); alone, or with --solution "
                                      "(then it replaces the answer read from the file)")
    ver.add_argument("--image", help="image path or sha256:<digest> (default: the task's own image, else "
                                     "the built-in python image)")
    ver.add_argument("--image-store", metavar="DIR", help="the image store holding the task's image and "
                                                          "layers (default: the default image store)")
    ver.set_defaults(func=cmd_verify)

