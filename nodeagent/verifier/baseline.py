"""What "reproduces without the agent" means for the verifier.

- `Watched`: a sandbox runtime wrapper that notes when the agent's work entered a verification
  sandbox (its changes applied, a command run over them), and runs the pytest grader at
  `GRADER_OOM_SCORE_ADJ` (its unprivileged workload is kept at 1000 by the sandbox init).
- `Baseline`: whether a task grades cleanly without the agent (reference passes, null reaches
  a verdict), cached per task + image + layers, seeded by validation (`BASELINE`).
- The task's own solutions: `reference_of`, `solution_file`, `solution_changes`, `null_changes`
  (a web task's null is its initial state: `nodeagent.verifier.webstate.initial_changes`).

Tasks are the verifier's typed `controller.contracts.tasks.GradedTask`.

See docs/verifier.md, "Infrastructure errors: only what reproduces without the agent".
Must not import zmq, controller.* outside contracts, nodeagent.verifier.grade (which imports
this module: it hands `Baseline` its grading function).
"""
from __future__ import annotations

import inspect
import threading
from typing import Callable, Mapping

from controller.contracts.tasks import GradedTask
from nodeagent.sandbox.runtime import Change
from nodeagent.verifier import webstate

GRADER_OOM_SCORE_ADJ = 0     # the in-sandbox grader; its unprivileged workload is kept at 1000


class Watched:
    """A runtime whose sandboxes (`acquire`, `create`: every grading sandbox) note when the agent's work entered them: its changes applied
    (non-empty) or a command run after them. A failure before that (no sandbox, a task file
    missing before any change) cannot be the agent's doing; after it, it might be. With
    `grader`, commands run at `GRADER_OOM_SCORE_ADJ` (the pytest grader, which runs the code
    under test under other uids: the sandbox init keeps those at 1000, the OOM killer's first
    choice), where the sandbox supports it."""

    def __init__(self, runtime, has_work: bool, grader: bool = False) -> None:
        self._runtime, self.has_work, self.grader, self.agent_ran = runtime, has_work, grader, False

    def __getattr__(self, name):
        return getattr(self._runtime, name)

    def acquire(self, *a, **k):
        return _WatchedSandbox(self._runtime.acquire(*a, **k), self)

    def create(self, *a, **k):          # a sandbox made without the pool (the web state's grading)
        return _WatchedSandbox(self._runtime.create(*a, **k), self)


class _WatchedSandbox:
    def __init__(self, sb, owner: Watched) -> None:
        self._sb, self._owner = sb, owner

    def __getattr__(self, name):
        return getattr(self._sb, name)

    def apply(self, changes):
        self._owner.agent_ran = self._owner.agent_ran or bool(changes)
        return self._sb.apply(changes)

    def exec(self, *a, **k):
        self._owner.agent_ran = self._owner.agent_ran or self._owner.has_work
        if self._owner.grader and "oom_score_adj" in inspect.signature(self._sb.exec).parameters:
            k.setdefault("oom_score_adj", GRADER_OOM_SCORE_ADJ)
        return self._sb.exec(*a, **k)


class Baseline:
    """Does a task grade cleanly without the agent, on this image (and layers)? Its reference
    solution must `pass` and its null solution (no change) must reach a verdict
    (`pass`/`fail`/`timeout`). Known outcomes come from validation (`seed`); otherwise they
    are graded once, through the verifier's own `grade(changes, answer) -> outcome` (`infra_error` for an
    infrastructure failure; one retry), and kept for the life of the
    process (whose verifier version cannot change) when clean; a baseline that is not clean
    is graded again at the next failure (it may have met a transient fault). `clean` returns a short reason when the
    task grades cleanly, None when it does not (then the failure is infrastructure)."""

    def __init__(self) -> None:
        self._known: dict[tuple, dict[str, str]] = {}
        self._locks: dict[tuple, threading.Lock] = {}
        self._lock = threading.Lock()

    @staticmethod
    def key(task: GradedTask, image, layers: tuple = ()) -> tuple:
        return task.ident, str(image), tuple(map(str, layers))

    def seed(self, task: GradedTask, image, outcomes: dict[str, str], layers: tuple = ()) -> None:
        """Record validation's outcomes ({"reference": ..., "null": ...}) for `task` on `image`
        with `layers` (its grading sandbox's layer files) stacked."""
        got: dict[str, str] = {k: outcomes[k] for k in ("reference", "null") if k in outcomes}
        if "null" in got:
            with self._lock:
                self._known[self.key(task, image, layers)] = got

    def outcomes(self, task: GradedTask, image, grade: Callable[[list, str | None], str],
                 layers: tuple = ()) -> dict[str, str]:
        key = self.key(task, image, layers)
        with self._lock:
            lock = self._locks.setdefault(key, threading.Lock())
        with lock:
            if key in self._known:
                return self._known[key]
            got = self._grade(task, grade)
            if _clean(got):         # a failing baseline is graded again next time: it may have been transient
                self._known[key] = got
            return got

    def clean(self, task: GradedTask, image, grade: Callable[[list, str | None], str],
              layers: tuple = ()) -> str | None:
        return _clean(self.outcomes(task, image, grade, layers))

    @staticmethod
    def _grade(task: GradedTask, grade) -> dict[str, str]:
        ref = reference_of(task)
        todo: dict[str, tuple[Mapping, str | None]] = (
            {"null": ({}, None)} | ({"reference": ref} if ref is not None else {}))
        out = {}
        for name, (files, answer) in todo.items():
            changes = null_changes(task) if name == "null" else solution_changes(task, files)
            for _attempt in range(2):       # one retry, as a rollout gets
                out[name] = grade(changes, answer)
                if out[name] != "infra_error":
                    break
        return out


# -- the task's own solutions (reference, null): the baseline and validation grade them ----------

ANSWER_KINDS = ("math", "exact", "regex")
GOLD_PATCH = "gold.patch"        # a repository task's reference (controller/taskbank/swe.py)
GOLD_PREFIX = "gold/"


def solution_file(task: GradedTask) -> str:
    """The visible file the agent is meant to edit: the first non-test, unprotected .py file."""
    protected = set(task.protected)
    for rel in sorted(task.files):
        base = rel.rsplit("/", 1)[-1]
        if rel.endswith(".py") and not base.startswith("test") and rel not in protected:
            return rel
    return "solution.py"


def reference_of(task: GradedTask) -> tuple[dict, str | None] | None:
    """(files, answer) of the task's reference solution, or None when it has none."""
    kind = task.checker.kind
    hidden = task.hidden
    if kind in ANSWER_KINDS:
        gold = _text(hidden.get("answer.txt")) or (task.checker.answer if kind != "regex" else None)
        if gold is None:
            return None
        return {}, (f"\\boxed{{{gold.strip()}}}" if kind == "math" else gold.strip())
    if "reference.py" in hidden:
        return {solution_file(task): hidden["reference.py"]}, None
    if GOLD_PATCH in hidden:       # a repository task: the gold patch's post-images
        return {rel[len(GOLD_PREFIX):]: text for rel, text in hidden.items() if rel.startswith(GOLD_PREFIX)}, None
    return None


def null_changes(task: GradedTask) -> list[Change]:
    """The changes of a rollout that did nothing: none, or for a web task (`webstate`) its
    initial state as the app would leave it untouched (a web rollout always carries its state)."""
    if task.checker.kind == "webstate":
        return webstate.initial_changes(webstate.as_bytes(task.hidden.get("seed.sql", "")).decode())
    return []


def _text(content: str | bytes | None) -> str | None:
    return content.decode("utf-8", "replace") if isinstance(content, bytes) else content


def solution_changes(task: GradedTask, files: Mapping) -> list[Change]:
    """`files` (rel -> text, bytes, or None to delete) as the changes of a rollout that wrote them."""
    original = task.files
    out = []
    for rel, text in sorted(files.items()):
        if text is None:
            out.append(Change(f"/work/{rel}", "deleted", None, 0))
        else:
            data = text if isinstance(text, bytes) else text.encode()
            out.append(Change(f"/work/{rel}", "modified" if rel in original else "added", data, 0o644))
    return out


def _clean(got: dict[str, str]) -> str | None:
    ref, null = got.get("reference"), got.get("null")
    if null in (None, "infra_error") or ref not in (None, "pass"):
        return None
    return f"reference: {ref}, null: {null}" if ref else f"no reference; null: {null}"


class _NoBaseline(Baseline):
    """No comparison: every failure stays infrastructure (validation's own reference and null runs)."""

    def clean(self, *a, **k) -> None:
        return None


BASELINE = Baseline()
NO_BASELINE = _NoBaseline()


