"""The state checker (`checker.kind: state`): a conversational rollout's final service state
against the task's goal state, plus what the agent told the user.

`grade_state(spec, conversation)` returns the `Verdict` of the typed checker spec (a
`controller.contracts.checkerspec.CheckerSpec` of kind `state`). `conversation` is what the
rollout's harness captured on the node (nodeagent/agent/attempt.py): `final_state` ({service:
state}, from `nodeagent.services.host.ServiceHost`, which holds the state outside the agent's
sandbox), `tampered` (service replies that did not verify: the agent interfered with the
service's interpreter), `told` (the agent's messages to the user). The comparison itself
(`match: exact` or `fields`, `told.include` / `exclude`) is the contract's
`controller.contracts.services.compare_state`, which task validation uses too.

The goal lives in the checker spec, which reaches only the node's verifier: the agent's
sandbox never holds it, and nothing the agent says or writes is read as a verdict. Any failed
check or any tampering is `fail` (reward 0); the final state is kept as the check
`state:final` (its JSON). No conversation captured is an infrastructure error
(`StateCheckError`, a `VerifierInfraError`), never a score.

Must not import: zmq, controller.* outside contracts, nodeagent.agent, nodeagent.harness.loop,
nodeagent.verifier.grade.
"""
from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Mapping

from controller.contracts import services as _services
from controller.contracts.checkerspec import CheckerSpec
from controller.contracts.services import compare_state
from nodeagent.verifier.verdicts import Verdict, VerifierInfraError
from nodeagent.verifier.verdicts import check as _check

# The files whose code decides this checker's verdicts beyond this package (VERIFIER_VERSION).
CONTRACT_SOURCES = (Path(_services.__file__),)


class StateCheckError(VerifierInfraError):
    """No state to grade: infrastructure, never a score."""


def grade_state(spec: CheckerSpec, conversation: Mapping[str, Any] | None) -> Verdict:
    """The verdict of a state checker (see the module docstring)."""
    if not conversation or not isinstance(conversation.get("final_state"), Mapping):
        raise StateCheckError("the rollout captured no service state to grade")
    final = conversation["final_state"]
    checks = [_check("state:final", "recorded", json.dumps(final, sort_keys=True, separators=(",", ":")))]
    tampered = list(conversation.get("tampered") or ())
    if tampered:
        checks.append(_check("service_integrity", "tampered", "; ".join(tampered)))
        return Verdict("fail", 0.0, {"correct": 0.0, "state": 0.0, "tamper": 1.0}, checks, tampered=True)
    results = compare_state(spec.raw, final, list(conversation.get("told") or ()))
    checks += [_check(name, "pass" if ok else "fail", detail) for name, ok, detail in results]
    ok = all(r[1] for r in results)
    state_ok = all(r[1] for r in results if r[0].startswith("state:"))
    return Verdict("pass" if ok else "fail", float(ok), {"correct": float(ok), "state": float(state_ok)}, checks)


__all__ = ["CONTRACT_SOURCES", "StateCheckError", "grade_state"]
