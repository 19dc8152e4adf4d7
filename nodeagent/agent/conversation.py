"""A conversational task's side of one rollout attempt (`services`, `user`): the task's mock
services (`nodeagent.services.host.ServiceHost`, each operation inside the agent's sandbox, the
state held here), its simulated user (`nodeagent.harness.usersim`; a model user calls the
node's `user_sim` endpoint, `$PADDOCK_USER_SIM_ENDPOINT`, through a gateway session of its own
whose rows are `model_calls` with source `user_sim`), and what the verifier and the record
receive of it (`captured`: final service state, operations, transcript, what the agent told
the user).

Must not import: zmq, nodeagent.agent.daemon, nodeagent.agent.attempt, nodeagent.verifier.
"""
from __future__ import annotations

import os
from typing import Callable

from controller.contracts.services import validate_services, validate_user
from controller.contracts.tasks import LeaseTask
from nodeagent.agent.core import Attempt
from nodeagent.agent.guard import AttemptGuard
from nodeagent.gateway.session import GatewayBudgets, Session, Upstream
from nodeagent.harness.loop import AgentResult
from nodeagent.harness.usersim import simulator
from nodeagent.services.host import ServiceHost


class Conversation:
    """A conversational task's services, user simulator and user_sim session for one attempt."""

    def __init__(self, task: LeaseTask, a: Attempt, clock: Callable[[], float],
                 guard: AttemptGuard | None = None) -> None:
        self.task, self.session, self.host = task, None, None
        endpoint = os.environ.get("PADDOCK_USER_SIM_ENDPOINT", "")
        if task.user and task.user.get("kind") == "model" and endpoint:
            self.session = Session(Upstream(a.policy_version, endpoint, str(task.user["model"])),
                                   GatewayBudgets.of(task.budgets), source="user_sim", clock=clock,
                                   client=guard.model_client(clock) if guard is not None else None)
        self.clock = clock

    def start(self, sandbox, observation_bytes: int):
        """(service host or None, user simulator or None) for the agent's sandbox. A lease whose
        services or user do not validate raises ServiceSpecError (the task's fault)."""
        if self.task.services:
            validate_services(self.task.services)
        if self.task.user:
            validate_user(self.task.user)
        if self.task.services:
            self.host = ServiceHost(self.task.services, sandbox, observation_bytes=observation_bytes)
            self.host.install()
        user = simulator(self.task.user, self.session, self.clock) if self.task.user else None
        return self.host, user

    def captured(self, agent: AgentResult) -> dict | None:
        """What the verifier grades a conversation on; None for a task without one."""
        if not self.task.services and not self.task.user:
            return None
        transcript = [{"role": s["role"], "content": s.get("content"), "tool_args": s.get("tool_args"),
                       "observation": s.get("observation")} for s in agent.steps]
        told = [s.get("content") or "" for s in agent.steps if s["role"] == "assistant" and not s.get("tool_name")]
        return {"final_state": self.host.final_state() if self.host else {},
                "tampered": list(self.host.tampered) if self.host else [],
                "ops": list(self.host.log) if self.host else [], "transcript": transcript, "told": told}

    def user_rows(self) -> list[dict]:
        """The user simulator's `model_calls` rows (no policy version: not the policy's calls)."""
        return [dict(r, call_policy_version=None) for r in self.session.rows] if self.session is not None else []

    def close(self) -> None:
        if self.session is not None:
            self.session.close()


__all__ = ["Conversation"]
