"""Grading outside the agent's reach.

`verify(runtime, image, task, changes, answer)` grades one finished rollout of `task`, a
`controller.contracts.tasks.GradedTask`: typed, its checker spec validated when it was built,
once, at the caller's edge (`graded_task`: from the node's `LeaseTask` or from a task's JSON; a
malformed spec is the task's fault, an infra error naming the field, never a score). The
rollout's own inputs (its sandbox layers, a conversational rollout's captured conversation) are
arguments; nothing here decodes or changes the task.

1. Protected paths are compared by SHA-256 against the task's originals: any change or deletion
   is tampering (reward 0).
2. The checker of the spec's kind grades the rollout, each in a module of its own that takes
   the typed task and returns the `Verdict`: unit tests (`pytest`,
   `nodeagent.verifier.pytestcheck`) and custom commands (`command`,
   `nodeagent.verifier.commandcheck`) in a *fresh* sandbox of the same image
   (`nodeagent.verifier.freshbox`); answer checks (math, exact, regex,
   `nodeagent.verifier.answercheck`) on the host in the isolated check runner; a
   conversation's final service state (`state`, `nodeagent.verifier.statecheck`); a web app's
   captured state (`webstate`, `nodeagent.verifier.webstate`).
3. An optional LLM judge (`checker.judge`, off unless the spec has it) adds a weighted component
   (`nodeagent.verifier.judge`).

Outcomes: `pass`, `fail`, `timeout` (the policy's code ran out of time: reward 0), or
`VerifierInfraError` (sandbox, runner, report or judge failure — retried once here, then the
rollout is `infra_error`: reward NULL, masked). A failure after the agent's changes went in is
first compared with the task graded without them (`Baseline`): clean, it is `fail` at once, not
retried (the agent's code could trigger the retry to double its grading time).

`VERIFIER_VERSION` hashes every source that decides a verdict (see `_version`); trajectories
record it. Must not import zmq, controller.* outside contracts, nodeagent.agent,
nodeagent.harness.loop.
"""
from __future__ import annotations

import hashlib
import importlib.metadata
import json
import time
from pathlib import Path
from typing import Any, Callable, Mapping

from controller.contracts import checkerspec
from controller.contracts.checkerspec import CheckerSpec
from controller.contracts.tasks import GradedTask, LeaseTask, TaskError
from nodeagent.harness import model as model_client
from nodeagent.sandbox.runtime import Change, SandboxRuntime
from nodeagent.sandbox.spec import SandboxError
from nodeagent.verifier import judge, statecheck, webstate
from nodeagent.verifier.answercheck import ANSWER_TIMEOUT_S, verify_answer
from nodeagent.verifier.baseline import BASELINE, NO_BASELINE, Baseline, Watched  # noqa: F401 - re-exported
from nodeagent.verifier.checks import CheckRunner
from nodeagent.verifier.commandcheck import verify_command
from nodeagent.verifier.freshbox import CHECK_TIMEOUT_S, as_bytes  # noqa: F401 - re-exported: a task file's bytes
from nodeagent.verifier.pytestcheck import (
    CALLEE_UID,
    GRADER_UID,
    PYTEST_ARGS,
    PYTEST_INI,
    PYTEST_INI_CALL,
    verify_pytest,
)
from nodeagent.verifier.pytestreport import environment_error, grade_report, match_outcomes, parse_report  # noqa: F401 - re-exported: the report's reading
from nodeagent.verifier.verdicts import Verdict, VerifierInfraError  # noqa: F401 - re-exported
from nodeagent.verifier.verdicts import check as _check

INFRA_RETRIES = 1


def _sha(data: bytes | str) -> str:
    return hashlib.sha256(data.encode() if isinstance(data, str) else data).hexdigest()


def check_protected(task: GradedTask, changes: list[Change]) -> list[dict]:
    """Each protected path: `ok`, or `tampered` if the agent changed, deleted, replaced (symlink,
    directory) it or deleted a directory above it."""
    checks = []
    for rel in task.protected:
        path, verdict, detail = f"/work/{rel}", "ok", "unchanged"
        for c in changes:
            if c.path == path and c.kind in ("added", "modified"):
                same = c.data is not None and _sha(c.data) == _sha(task.files[rel])
                verdict, detail = ("ok", "rewritten unchanged") if same else ("tampered", "content changed")
            elif c.path == path or path.startswith(c.path.rstrip("/") + "/") and c.kind in ("deleted", "symlink"):
                verdict, detail = "tampered", f"{c.kind} ({c.path})"
        checks.append(_check(f"protected:{rel}", verdict, detail))
    return checks


def graded_task(task: LeaseTask | GradedTask | Mapping[str, Any]) -> GradedTask:
    """The task as `verify` takes it, built once at the caller's edge: from the node's
    `LeaseTask`, or from a task's JSON (a task file, a run's tasks.json, validation's task
    dicts; `{"base64": ...}` contents decoded). A malformed task or checker spec is a
    VerifierInfraError naming the task and the field: the task's fault, never a score."""
    if isinstance(task, GradedTask):
        return task
    try:
        return GradedTask.of(task) if isinstance(task, LeaseTask) else GradedTask.from_json(task)
    except TaskError as exc:
        raise VerifierInfraError(str(exc)) from None


def verify(runtime: SandboxRuntime, image: Path, task: GradedTask, changes: list[Change], answer: str | None,
           clock: Callable[[], float] = time.monotonic, runner: CheckRunner | None = None,
           layers: tuple = (), baseline: Baseline | None = None,
           conversation: dict | None = None) -> Verdict:
    """Grade one rollout (see the module docstring). Raises VerifierInfraError, never scores it.

    An infrastructure error is only what reproduces without the agent: when grading fails after
    the agent's changes were applied or its code ran (a collection or import error, a killed
    or stopped grader, a missing report, pytest not starting), or when this host's own code
    raised while it read the rollout's changes or answer (anything but an `OSError` or a
    `SandboxError`: a parser's `RecursionError` or `MemoryError` on the agent's file), the
    task is graded without the agent (`Baseline`); if that grades cleanly the rollout is
    `fail`, reward 0, with both reasons in its checks. `baseline`: where clean runs are known (default: `BASELINE`, cached
    per task, image and verifier version); `NO_BASELINE` turns the comparison off (validation's
    own reference and null runs). `conversation`: a conversational rollout's final service
    state and transcript (the `state` checker's input)."""
    t0 = clock()
    spec, layers = task.checker, tuple(layers)
    checks = check_protected(task, changes)
    if any(c["verdict"] == "tampered" for c in checks):
        v = Verdict("fail", 0.0, {"tamper": 1.0, "correct": 0.0, "weights": {"correct": 1.0}}, checks,
                    tampered=True)
        v.verify_s = clock() - t0
        return v

    def without_agent(other: list, other_answer: str | None) -> str:
        """The baseline's grading: other changes (the task's reference, none) graded as a
        rollout's, `infra_error` when grading fails."""
        try:
            return _primary(Watched(runtime, False, spec.kind == "pytest"), image, layers, task, other, other_answer,
                            conversation, clock, runner).outcome
        except VerifierInfraError:
            return "infra_error"

    agent_ran, clean = False, None
    for attempt in range(INFRA_RETRIES + 1):
        watched = Watched(runtime, bool(changes), spec.kind == "pytest")
        try:
            try:
                v = _primary(watched, image, layers, task, changes, answer, conversation, clock, runner)
                break
            except VerifierInfraError:
                raise
            except Exception as error:     # this host's code reading the rollout's own input raised
                if isinstance(error, (OSError, SandboxError)) or not (changes or answer):
                    raise
                watched.agent_ran = True
                raise VerifierInfraError(f"grading raised {type(error).__name__} on the rollout's "
                                         f"input: {str(error)[:300]}") from error
        except VerifierInfraError as exc:
            checks.append(_check(spec.kind, "infra_error", f"attempt {attempt + 1}: {exc}"))
            if watched.agent_ran and not agent_ran:   # compared before any retry: a retry the agent's
                agent_ran = True                      # code could trigger would double its time
                clean = (baseline or BASELINE).clean(task, image, without_agent, layers)
            if clean:
                v = Verdict("fail", 0.0, {"correct": 0.0},
                            [_check(spec.kind, "fail", f"grading failed with the agent's changes ({exc}), and the "
                                    f"task grades cleanly without them ({clean}): the rollout's fault", clock() - t0)])
                break
            if attempt < INFRA_RETRIES:
                continue
            exc.agent_ran = agent_ran
            raise
    v.checks[:0] = checks
    if spec.judge and v.outcome != "timeout" and not v.tampered:
        judge.apply(v, task, changes, answer, conversation, clock)   # rate limits, retries, cache, judge_failed
    v.components.setdefault("weights", {"correct": 1.0})
    v.verify_s = clock() - t0
    return v


GRADING_START_S = 60.0   # one grading's overhead besides its check: a sandbox, the grader's start


def verify_time_s(spec: CheckerSpec | None) -> float:
    """The longest `verify` may legitimately take with checker `spec` (None: a task whose spec
    did not decode): the rollout's grading, then (after a failure with the agent's changes in)
    the baseline's reference and null gradings with their retries, then the rollout's retries;
    each grading its checker's `timeout_s` plus GRADING_START_S. The verify phase's deadline is
    at least this, so a slow solution is the checker's `timeout` or `fail`, never a phase
    deadline (an infrastructure error)."""
    kind = spec.kind if spec is not None else ""
    default = CHECK_TIMEOUT_S if kind in ("pytest", "command") else ANSWER_TIMEOUT_S
    one = float((spec.timeout_s if spec is not None else None) or default) + GRADING_START_S
    return one * (1 + INFRA_RETRIES + 2 * (1 + INFRA_RETRIES))


def _primary(runtime, image, layers, task: GradedTask, changes, answer, conversation, clock, runner) -> Verdict:
    """The verdict of the checker of `task`'s kind (the module docstring's step 2)."""
    kind = task.checker.kind
    if kind == "pytest":
        return verify_pytest(runtime, image, layers, task, changes, clock)
    if kind == "command":
        return verify_command(runtime, image, layers, task, changes, clock)
    if kind == "state":
        return statecheck.grade_state(task.checker, conversation)
    if kind == "webstate":
        return webstate.verify_webstate(runtime, image, task, changes, clock)
    return verify_answer(task.checker, answer, clock, runner, task.instruction)


def _dependency_versions() -> dict[str, str]:
    """Versions of the libraries that decide verdicts (an upgrade of the math parser changes
    which answers are equal, so it is a new verifier version)."""
    out = {}
    for dist in ("math-verify", "latex2sympy2_extended", "sympy"):
        try:
            out[dist] = importlib.metadata.version(dist)
        except importlib.metadata.PackageNotFoundError:
            out[dist] = "absent"
    return out


WEB_EVALUATORS = Path(__file__).resolve().parents[1] / "browser" / "apps"   # their evaluate() decides web verdicts


def _version() -> str:
    """A hash of everything that decides a verdict: every source file of this package (the
    grader plugin included), the checker-spec contract, the state checker's comparison (the
    services contract), the web apps' state evaluators, the judge's model client, and the
    grading constants. Any change to
    them is a new verifier version."""
    h = hashlib.sha256()
    sources = sorted(Path(__file__).parent.glob("*.py")) + [Path(checkerspec.__file__), Path(model_client.__file__),
                                                            *statecheck.CONTRACT_SOURCES,
                                                            *sorted(WEB_EVALUATORS.glob("*.py"))]
    for path in sources:
        h.update(path.name.encode() + b"\0" + path.read_bytes())
    h.update(json.dumps([CHECK_TIMEOUT_S, ANSWER_TIMEOUT_S, GRADER_UID, CALLEE_UID, "call-deadline=check", INFRA_RETRIES,
                         PYTEST_ARGS, PYTEST_INI, PYTEST_INI_CALL, _dependency_versions()]).encode())
    return "v3-" + h.hexdigest()[:16]


VERIFIER_VERSION = _version()
