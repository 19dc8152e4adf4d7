"""The answer checks (`math`, `exact`, `regex`): the policy's final answer against the spec's
gold answer, graded on the host in the isolated check runner (`nodeagent.verifier.checks`:
its own process group, rlimits, a hard deadline) by `nodeagent.verifier.checkers:answer_verdict`
(`verify_answer`). A check killed at its deadline is a `timeout`, one that fails or crashes a
`fail`; a runner that is gone is a VerifierInfraError.

Must not import: zmq, controller.* outside contracts, nodeagent.agent, nodeagent.sandbox,
nodeagent.verifier.grade.
"""
from __future__ import annotations

from typing import Callable

from controller.contracts.checkerspec import CheckerSpec
from nodeagent.verifier.checks import CheckInfraError, CheckRunner, default_runner
from nodeagent.verifier.verdicts import Verdict, VerifierInfraError, check

ANSWER_TIMEOUT_S = 10.0


def verify_answer(spec: CheckerSpec, answer: str | None, clock: Callable[[], float], runner: CheckRunner | None,
                  instruction: str | None = None) -> Verdict:
    """The answer's verdict (see the module docstring); `instruction` (the task's prompt)
    tells a math check whether a decimal approximation was asked."""
    t = clock()
    try:
        res = (runner or default_runner()).run("nodeagent.verifier.checkers:answer_verdict",
                                               [spec.kind, spec.answer, answer, instruction],
                                               timeout_s=spec.timeout_s if spec.timeout_s is not None
                                               else ANSWER_TIMEOUT_S)
    except CheckInfraError as exc:
        raise VerifierInfraError(f"check runner: {exc}") from None
    wall = clock() - t
    if res.outcome == "timeout":
        return Verdict("timeout", 0.0, {"correct": 0.0},
                       [check(spec.kind, "timeout", f"answer check {res.detail}", wall)])
    if res.outcome != "ok":
        return Verdict("fail", 0.0, {"correct": 0.0},
                       [check(spec.kind, "fail", f"answer check {res.outcome}: {res.detail}", wall)])
    value: dict = res.value  # type: ignore[assignment]  # answer_verdict returns {"ok", "detail"}
    ok, detail = bool(value["ok"]), value["detail"]
    return Verdict("pass" if ok else "fail", float(ok), {"correct": float(ok)},
                   [check(spec.kind, "pass" if ok else "fail", detail, wall)])


__all__ = ["ANSWER_TIMEOUT_S", "verify_answer"]
