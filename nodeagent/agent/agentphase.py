"""A rollout attempt's agent phase (the built-in harness, or the task's own harness in the
sandbox): its egress (the task's network policy through the node's proxy, or for a task with
its own harness the gateway's socket), its MCP servers (`nodeagent.harness.mcptools`), its
sandbox, the harness run, and the agent's changes (`diff` of /work). Everything it starts is
stopped before it returns; under the attempt's guard (`nodeagent.agent.guard`) it runs the
`create`, `agent` and `teardown` phases, each under its deadline.

Must not import: zmq, nodeagent.agent.daemon, nodeagent.agent.attempt, nodeagent.verifier.grade.
"""
from __future__ import annotations

from pathlib import Path
from typing import Callable

from controller.contracts.network import PolicyError
from controller.contracts.services import ServiceSpecError
from controller.contracts.states import MODEL_SERVER, SANDBOX, SANDBOX_START, TASK, USER_SIM, InfraReason
from controller.contracts.tasks import BudgetError, LeaseTask
from controller.contracts.tools import ToolSetError
from nodeagent.agent.conversation import Conversation
from nodeagent.agent.core import Attempt
from nodeagent.agent.guard import AttemptGuard
from nodeagent.agent.record import span
from nodeagent.egress import proxy as egress
from nodeagent.gateway.server import GatewayServer
from nodeagent.gateway.session import Session
from nodeagent.harness.external import run_harness
from nodeagent.harness.faults import FaultSpecError, ToolFaults
from nodeagent.harness.loop import AgentResult, run_agent
from nodeagent.harness.mcptools import McpRollout
from nodeagent.harness.model import ModelError
from nodeagent.harness.usersim import UserSimError
from nodeagent.sandbox.runtime import DiffRefused, SandboxError, SandboxRuntime, SandboxSpec
from nodeagent.services.host import ServiceRuleError
from nodeagent.verifier.freshbox import as_bytes


def run_agent_phase(runtime: SandboxRuntime, image: Path, a: Attempt, task: LeaseTask,
               clock: Callable[[], float], t0: float, session: Session,
               layers: tuple[Path, ...] = (), conv: Conversation | None = None,
               guard: AttemptGuard | None = None) -> tuple[AgentResult, InfraReason | None, list, str | None]:
    """The agent's sandbox and harness: (its result, the infra reason or None, its changes, why
    its /work could not be carried to the grader or None: a refused diff, the agent's failure).
    The result's spans start with `sandbox_start`. With a guard: the `create`, `agent` and
    `teardown` phases, each under its deadline; the harness stops when the guard does."""
    guard = guard or AttemptGuard()
    agent, infra, changes, refused = AgentResult(), None, [], None
    egress_id = f"{a.rollout_id}.{a.attempt}"
    gateway = GatewayServer(session) if task.harness else None
    mcp = McpRollout.of(task) if not task.harness else None     # a task's MCP servers (.paddock/mcp.json)
    try:
        if gateway is not None:
            gateway.start()
        relay = gateway.path if gateway is not None else egress.open_for_task(task.network, egress_id)
        relay = mcp.relay(relay) if mcp else relay
        with guard.phase("create"):
            sb = runtime.acquire(SandboxSpec(image=image, limits=dict(task.limits),
                                            files={k: as_bytes(v) for k, v in task.files.items()},
                                            egress_socket=relay, layers=layers))
    except (SandboxError, PolicyError, OSError) as exc:
        infra = InfraReason.of(SANDBOX_START, exc)
        egress.close_for_task(egress_id)
        if gateway is not None:
            gateway.stop()
        if mcp:
            mcp.close()
    start_span = span("sandbox_start", "agent sandbox", t0, t0, clock())

    def teardown() -> None:
        with guard.phase("teardown"):
            if mcp:
                mcp.close()
            sb.destroy()
            egress.close_for_task(egress_id)
            if gateway is not None:
                gateway.stop()

    if infra is None and guard.stopped:     # stopped while it was made: no harness
        teardown()
    elif infra is None:
        try:
            with guard.phase("agent"):
                if task.harness:
                    agent = run_harness(sb, task.harness, task.instruction, session, task.budgets, clock, span_origin=t0)
                else:
                    services, user = conv.start(sb, task.budgets.observation_bytes) if conv else (None, None)
                    tools = task.tools if task.tools is not None or services is None else ()
                    if services is not None:    # its engine runs in this sandbox: a shell can kill it
                        services.agent_has_shell = tools is None or "shell" in tools
                    agent = run_agent(sb, task.instruction, session, a.model, a.seed, task.budgets, clock,
                                      tools=tools, egress_decisions=lambda: egress.decisions_for(egress_id),
                                      span_origin=t0, faults=ToolFaults.of(task.tool_faults, a.seed),
                                      services=services, user=user, stop=lambda: guard.stopped,
                                      toolbox=mcp.toolbox(sb, task) if mcp else None)
                if not guard.stopped:
                    changes = sb.diff("/work", skip_bytecode=True)    # running the tests leaves it; never graded
        except ModelError as exc:
            infra = InfraReason.of(MODEL_SERVER, exc)
            agent = exc.result or agent     # the steps and spans before the failure, for the record
        except (BudgetError, ToolSetError, FaultSpecError, ServiceRuleError, ServiceSpecError) as exc:
            infra = InfraReason.of(TASK, exc)
        except UserSimError as exc:
            infra = InfraReason.of(USER_SIM, exc)
        except DiffRefused as exc:
            refused = str(exc)
        except SandboxError as exc:
            infra = InfraReason.of(SANDBOX, exc)
        finally:
            teardown()
    agent.spans.insert(0, start_span)
    return agent, infra, changes, refused


__all__ = ["run_agent_phase"]
