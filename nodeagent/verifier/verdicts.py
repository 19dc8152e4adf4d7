"""A grading's result and its failure: `Verdict`, `VerifierInfraError`, and the check rows a
verdict lists (`check`). Shared by the verifier's modules (grade.py, pytestreport.py, the state
and web checkers).

Must not import: zmq, controller, nodeagent.sandbox, nodeagent.agent.
"""
from __future__ import annotations

from dataclasses import dataclass, field


class VerifierInfraError(Exception):
    """The verifier could not reach a verdict for reasons that are not the policy's fault."""

    agent_ran: bool = False     # set by `verify`: the agent's changes were applied or its code ran


@dataclass
class Verdict:
    outcome: str                    # pass | fail | timeout | judge_failed (reward None)
    reward: float | None
    components: dict = field(default_factory=dict)
    checks: list[dict] = field(default_factory=list)
    tampered: bool = False
    verify_s: float = 0.0


def check(name: str, verdict: str, detail: str, wall_s: float = 0.0) -> dict:
    return {"check": name, "verdict": verdict, "detail": detail[:4000], "wall_s": float(wall_s)}
