"""One rollout attempt on a node: sandbox → agent loop → diff → verifier → trajectory shards.

The agent's changes are kept as an artifact, `<run_dir>/changes/<shard name>.tar` (written
atomically; its path relative to the run dir is the rollouts row's `changes_path`), so that
`paddock rescore` can grade the attempt again without re-running the agent. The agent's
spans get a `sandbox_start` and a `verification` span.

Every model call passes the node's gateway (`nodeagent.gateway`): the built-in harness calls
the attempt's `Session` in process; a task that names its own `harness` runs it in the sandbox
against the session's HTTP front, which the sandbox's relay reaches at 127.0.0.1:3128 (the
gateway's socket takes the relay's place: such a task gets no other egress). The session's
rows are the attempt's `model_calls` shard. The session follows the node's current policy
(`current_policy`, the agent core's newest `policy`): a call refused or aborted during a
weight update is retried under it, the sandbox untouched (`nodeagent.gateway.session.Follow`). Seeded tool faults (`tool_faults`) are drawn per
rollout seed and are the policy's weather, never an infra_error.

A lease may carry the task by reference (`blob`): its content is fetched by digest from shared
storage, verified and cached per node (`nodeagent.agent.taskcache`). A task's `layers` (its
repository) and its set-up layer (`setup` commands, run once: `nodeagent.sandbox.setuplayer`)
are stacked under both the agent's and the grading sandbox; a failing set-up is `infra_error`
with reason `setup: ...` (the controller quarantines the task). A `web` task's agent phase is
`nodeagent.browser.rollout.run_web_agent` (its app and a headless browser in the sandbox, the
browser tools, the app's state captured for the `webstate` checker).

`run_attempt` never raises for operating errors: a sandbox that fails to start, a model server
that fails or a verifier that cannot reach a verdict make an `infra_error` attempt (reward
NULL, retried by the controller), recorded with its reason. A policy that runs out of wall
time is `timeout` (reward 0: its own fault). A task it cannot run (one that does not decode,
or has no instruction) is `infra_error` with reason `task: ...` naming the field, and no row.
`Attempt` and `AttemptResult` are defined in nodeagent/agent/core.py (re-exported here).

Deadlines and cancellation (`nodeagent.agent.guard`): the attempt runs its phases -- `setup`,
`create`, `agent`, `verify`, `teardown` -- under the task's deadlines (its budgets, then the
run's `run_budgets`, then the node's defaults) and its end-to-end `total_s`; every sandbox it
makes goes through the guard's runtime and every model connection through the guard's client,
so a deadline or the attempt's cancel signal kills them at once. A cancelled attempt returns
`infra_error` `cancelled: <code>` and writes nothing (the agent core never reports it); a
deadline in the agent phase is the policy's `timeout` (reward 0, stop reason `deadline`), in
any other phase `infra_error` `deadline: <phase>: ...`; a verdict reached in killed grading
sandboxes is discarded. An episode the harness's no-progress detector ended (`no_progress`,
`no_output`) is the policy's `fail`, reward 0, not graded.

A conversational task (`services`, `user`): the task's mock services run for this rollout
(`nodeagent.services.host.ServiceHost`, each operation inside the agent's sandbox, the state
held here) and its simulated user talks to the agent (`nodeagent.harness.usersim`; a model
user calls the node's `user_sim` endpoint, `$PADDOCK_USER_SIM_ENDPOINT`, through a gateway
session of its own whose rows are `model_calls` with source `user_sim`). The final service
state, the operations, the transcript and what the agent told the user go to the verifier
(`verify(..., conversation=...)`). The verifier receives the lease's typed task as it grades
it (`GradedTask`, built with the task, its checker spec validated once; no JSON round trip); a
malformed checker spec is the verifier's `infra_error` `verifier: task ...` when the attempt
reaches grading. A broken service rule is `infra_error: task: ...`; a
failing user simulator `infra_error: user_sim: ...`.

Must not import: zmq, nodeagent.agent.daemon.
"""
from __future__ import annotations

import dataclasses
import json
import logging
import os
import time
from pathlib import Path
from typing import Callable, Mapping

from controller.contracts.clock import utc_now
from controller.contracts.network import PolicyError
from controller.contracts.services import ServiceSpecError, validate_services, validate_user
from controller.contracts.states import (
    MODEL_SERVER,
    SANDBOX,
    SANDBOX_START,
    SETUP,
    STORE,
    TASK,
    USER_SIM,
    VERIFIER,
    InfraReason,
    as_infra_reason,
)
from controller.contracts.tasks import BudgetError, GradedTask, LeaseTask, TaskError
from controller.contracts.tools import ToolSetError
from controller.ondisk.fileio import atomic_write
from layers.store import ImageStore
from nodeagent.agent.core import Attempt, AttemptResult
from nodeagent.agent.guard import AttemptGuard, Deadlines, GuardedRuntime
from nodeagent.agent.taskcache import default_cache, task_layers
from nodeagent.browser.rollout import run_web_agent
from nodeagent.egress import proxy as egress
from nodeagent.gateway.server import GatewayServer
from nodeagent.gateway.session import Follow, GatewayBudgets, Session, Upstream
from nodeagent.harness.external import run_harness
from nodeagent.harness.faults import FaultSpecError, ToolFaults
from nodeagent.harness.loop import AgentResult, run_agent
from nodeagent.harness.mcptools import McpRollout
from nodeagent.harness.model import ModelError
from nodeagent.harness.progress import NO_OUTPUT, NO_PROGRESS
from nodeagent.harness.usersim import UserSimError, simulator
from nodeagent.sandbox.runtime import DiffRefused, SandboxError, SandboxRuntime, SandboxSpec, changes_to_tar
from nodeagent.sandbox.setuplayer import ensure_setup_layer
from nodeagent.sandbox.spec import SetupError
from nodeagent.services.host import ServiceHost, ServiceRuleError
from nodeagent.store import tracing
from nodeagent.store import writer as trajwriter
from nodeagent.verifier.grade import VERIFIER_VERSION, Verdict, VerifierInfraError, as_bytes, verify, verify_time_s
from nodeagent.verifier.verdicts import check

log = logging.getLogger(__name__)
__all__ = ["Attempt", "AttemptResult", "conversation_path", "run_attempt", "write_changes"]


def _task_of(a: Attempt) -> LeaseTask:
    """The attempt's task: decoded when its lease arrived; an attempt built by hand (replay,
    tests) may carry the task's dict, decoded here. A reference lease's content is fetched by
    digest (nodeagent.agent.taskcache). Raises TaskError naming the field."""
    task = a.task if isinstance(a.task, LeaseTask) else LeaseTask.decode(a.task)
    return default_cache().resolve(task)


def _graded(task: LeaseTask) -> GradedTask | VerifierInfraError:
    """The task as the verifier grades it, built once with the task; a malformed checker spec
    is the error the verify phase raises (the rollout is recorded as any grading failure is)."""
    try:
        return GradedTask.of(task)
    except TaskError as exc:
        return VerifierInfraError(str(exc))


def task_sandbox_layers(runtime: SandboxRuntime, image: Path, task: LeaseTask) -> tuple[Path, ...]:
    """The task's layers (its repository), then its set-up layer (built once per task and
    image, then reused by every rollout and the grading sandbox). Raises TaskError (a layer
    missing from the store) or SetupError (a set-up command failed)."""
    layers = task_layers(image, task.layers)
    if not task.setup:
        return layers
    setup = ensure_setup_layer(runtime, ImageStore(Path(image).parent.parent), image, layers, task.setup)
    return layers + ((setup,) if setup is not None else ())


def run_attempt(runtime: SandboxRuntime, image: Path, node: str, a: Attempt,
                clock: Callable[[], float] = time.monotonic,
                current_policy: Callable[[], object] | None = None,
                run_budgets: Mapping[str, float] | None = None) -> AttemptResult:
    """Run one attempt (see the module docstring). `run_budgets`: the run's defaults for the
    deadline and no-progress budget keys the task leaves at 0 (`Budgets.with_run_defaults`)."""
    try:
        task = _task_of(a)
        if run_budgets:
            task = dataclasses.replace(task, budgets=task.budgets.with_run_defaults(run_budgets))
    except TaskError as exc:
        return AttemptResult("infra_error", None, {}, InfraReason.of(TASK, exc))
    if not task.instruction:
        return AttemptResult("infra_error", None, {}, InfraReason.of(TASK, "the lease task has no 'instruction'"))
    with AttemptGuard(Deadlines.of(task.budgets), getattr(a, "cancel", None), clock,
                      name=f"rollout {a.rollout_id} attempt {a.attempt}") as guard:
        res = _guarded_attempt(guard.runtime(runtime), image, node, a, task, clock, current_policy, guard)
    code = guard.cancelled()
    if code is not None:
        log.info("rollout %s attempt %d stopped (cancelled: %s): sandboxes destroyed %.3fs after the cancel",
                 a.rollout_id, a.attempt, code, clock() - (guard.stopped_at or clock()))
    return res


def _guarded_attempt(runtime: GuardedRuntime, image: Path, node: str, a: Attempt, task: LeaseTask,
                     clock: Callable[[], float], current_policy: Callable[[], object] | None,
                     guard: AttemptGuard) -> AttemptResult:
    """The attempt's phases, each under its deadline; every sandbox made through `runtime` is
    the guard's to kill. After each phase a stop of the guard decides (`_stopped`)."""
    if guard.stopped:               # cancelled while it waited for a slot thread: nothing to do
        return _stopped(guard)
    graded = _graded(task)          # the task as the verifier takes it, built once
    try:
        with guard.phase("setup"):
            layers = task_sandbox_layers(runtime, image, task)
    except TaskError as exc:
        return _stopped(guard) or AttemptResult("infra_error", None, {}, InfraReason.of(TASK, exc))
    except SetupError as exc:
        log.warning("rollout %s attempt %d: task %s set-up failed: %s", a.rollout_id, a.attempt, task.name, exc)
        return _stopped(guard) or AttemptResult("infra_error", None, {}, InfraReason.of(SETUP, str(exc)[:1993]))
    except SandboxError as exc:
        return _stopped(guard) or AttemptResult("infra_error", None, {}, InfraReason.of(SETUP, str(exc)[:1993]))
    if guard.stopped:
        return _stopped(guard)
    started, t0 = utc_now(), clock()
    start = Upstream(a.policy_version, a.endpoint, a.model)
    session = Session(Follow(start, current_policy) if current_policy else start, GatewayBudgets.of(task.budgets),
                      source="harness" if task.harness else "builtin", clock=clock,
                      client=guard.model_client(clock),
                      trace=tracing.attempt_context(a.run_id, a.rollout_id, a.attempt, a.token))
    conv = _Conversation(task, a, clock, guard)
    if task.family == "web":
        with guard.phase("agent"):
            agent, web_infra, changes = run_web_agent(runtime, image, a, task, clock, t0, session, layers)
        infra, refused = as_infra_reason(web_infra), None
    else:   # refused: what the agent left in /work cannot be carried to the grader, its own failure
        agent, infra, changes, refused = _run_agent(runtime, image, a, task, clock, t0, session, layers, conv, guard)
    session.close()                 # its kept model-server connections; the rows stay
    conv.close()
    verdict = None
    conversation = conv.captured(agent) if not guard.stopped else None
    if guard.stopped:
        if guard.cancelled() is not None:
            return _stopped(guard)     # never reported, never scored: nothing to write
        infra, outcome, reward = _deadline_verdict(guard, agent)
    elif infra is None and agent.stop_reason == "wall_time":
        outcome, reward = "timeout", 0.0
    elif infra is None and agent.stop_reason in (NO_PROGRESS, NO_OUTPUT):
        outcome, reward = "fail", 0.0     # the policy looped: its failure, not graded
    elif infra is None and refused is not None:
        verdict = Verdict("fail", 0.0, {"correct": 0.0, "weights": {"correct": 1.0}}, [check("diff", "fail", refused)])
        outcome, reward = "fail", 0.0     # its /work cannot be carried to the grader: not graded
    elif infra is None:
        tv = clock()
        floor = verify_time_s(None if isinstance(graded, VerifierInfraError) else graded.checker)  # a slow solution: its timeout
        if not task.budgets.verify_s and guard.deadlines.verify_s < floor:    # the default deadline only
            guard.deadlines = dataclasses.replace(guard.deadlines, verify_s=floor)
        try:
            with guard.phase("verify"):
                if isinstance(graded, VerifierInfraError):
                    raise graded
                verdict = verify(runtime, image, graded, changes, agent.answer, clock, layers=layers,
                                 conversation=conversation)
            outcome, reward = verdict.outcome, verdict.reward
        except VerifierInfraError as exc:
            infra = InfraReason.of(VERIFIER, exc)
        agent.spans.append(_span("verification", task.checker_kind, t0, tv, clock(), step=len(agent.steps)))
        if guard.stopped:          # a verdict of killed grading sandboxes is no verdict
            if guard.cancelled() is not None:
                return _stopped(guard)
            verdict = None
            infra, outcome, reward = _deadline_verdict(guard, agent)
    if infra is not None:
        outcome, reward = "infra_error", None
        log.warning("rollout %s attempt %d infra_error: %s", a.rollout_id, a.attempt, infra.text)
    with guard.phase("teardown"):
        res = _store(a, node, task, agent, verdict, outcome, reward, infra, changes, started, clock() - t0,
                     conversation, session, conv)
    if guard.stopped and guard.cancelled() is not None:
        return _stopped(guard)
    if guard.deadline_phase() in ("teardown", "total (teardown)") and res.outcome != "infra_error":
        return AttemptResult("infra_error", None, {}, guard.reason())
    return res


def _store(a: Attempt, node: str, task: LeaseTask, agent: AgentResult, verdict: Verdict | None,
           outcome: str, reward, infra, changes, started, wall_s: float, conversation, session: Session,
           conv: "_Conversation") -> AttemptResult:
    """The changes artifact and the trajectory shards of the attempt; its result."""
    try:
        changes_path = write_changes(a.run_dir, node, a, changes) if infra is None else None
        if changes_path and conversation is not None:   # what `paddock rescore` grades a conversation on
            kept = Path(a.run_dir) / conversation_path(changes_path)
            atomic_write(kept, json.dumps(conversation).encode())
    except OSError as exc:
        return AttemptResult("infra_error", None, {}, InfraReason.of(STORE, f"changes artifact: {exc}"))
    row = _rollout_row(a, node, task, agent, verdict, outcome, reward, infra, changes, started, wall_s)
    row["changes_path"] = changes_path
    checks = verdict.checks if verdict else []
    calls = _call_rows(session, bool(task.harness), agent.steps, conv.user_rows())
    try:
        shards = trajwriter.write_attempt(a.run_dir, node, row, agent.steps, checks,
                                          spans=agent.spans, egress=agent.egress, model_calls=calls)
    except OSError as exc:
        return AttemptResult("infra_error", None, {}, InfraReason.of(STORE, exc))
    return AttemptResult(outcome, reward, shards, infra)


def _stopped(guard: AttemptGuard) -> AttemptResult | None:
    """The result of an attempt its guard stopped, or None if it was not. A cancelled attempt's
    result is never reported (the agent core dropped it) nor scored; a deadline outside the
    agent phase is the infrastructure's."""
    code = guard.cancelled()
    if code is not None:
        return AttemptResult("infra_error", None, {}, guard.reason())
    if guard.deadline_phase() is not None:
        return AttemptResult("infra_error", None, {}, guard.reason())
    return None


def _deadline_verdict(guard: AttemptGuard, agent: AgentResult) -> tuple[InfraReason | None, str, float | None]:
    """(infra reason, outcome, reward) of an attempt stopped by a deadline: in the agent phase
    the policy's (`timeout`, reward 0, stop reason `deadline`), elsewhere the infrastructure's."""
    phase = guard.deadline_phase() or ""
    if phase in ("agent", "total (agent)"):
        agent.stop_reason = "deadline"
        return None, "timeout", 0.0
    return guard.reason(), "infra_error", None


def _call_rows(session: Session, harness: bool, steps: list[dict] = (), user_rows: list[dict] = ()) -> list[dict]:
    """The session's rows; the built-in harness makes one call per assistant step, in order
    (a conversation's user turns are steps too). The user simulator's rows follow, numbered on."""
    rows = [dict(r) for r in session.rows]
    if not harness:
        assistant = [s["step"] for s in steps if s.get("role") == "assistant"]
        for r in rows:
            i = r["call_index"]
            r["step"] = assistant[i] if i < len(assistant) else i
    user = [s["step"] for s in steps if s.get("role") == "user"][1:]      # the opening makes no call
    for j, r in enumerate(user_rows):
        rows.append(dict(r, call_index=len(session.rows) + j, step=user[j] if j < len(user) else None))
    return rows


class _Conversation:
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
        if not self.task.services and not self.task.user:
            return None
        transcript = [{"role": s["role"], "content": s.get("content"), "tool_args": s.get("tool_args"),
                       "observation": s.get("observation")} for s in agent.steps]
        told = [s.get("content") or "" for s in agent.steps if s["role"] == "assistant" and not s.get("tool_name")]
        return {"final_state": self.host.final_state() if self.host else {},
                "tampered": list(self.host.tampered) if self.host else [],
                "ops": list(self.host.log) if self.host else [], "transcript": transcript, "told": told}

    def user_rows(self) -> list[dict]:
        return [dict(r, call_policy_version=None) for r in self.session.rows] if self.session is not None else []

    def close(self) -> None:
        if self.session is not None:
            self.session.close()


def _run_agent(runtime: SandboxRuntime, image: Path, a: Attempt, task: LeaseTask,
               clock: Callable[[], float], t0: float, session: Session,
               layers: tuple[Path, ...] = (), conv: "_Conversation | None" = None,
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
    start_span = _span("sandbox_start", "agent sandbox", t0, t0, clock())
    if infra is None and guard.stopped:     # stopped while it was made: no harness
        with guard.phase("teardown"):
            if mcp:
                mcp.close()
            sb.destroy()
            egress.close_for_task(egress_id)
            if gateway is not None:
                gateway.stop()
    elif infra is None:
        try:
            with guard.phase("agent"):
                if task.harness:
                    agent = run_harness(sb, task.harness, task.instruction, session, task.budgets, clock, span_origin=t0)
                else:
                    services, user = conv.start(sb, task.budgets.observation_bytes) if conv else (None, None)
                    tools = task.tools if task.tools is not None or services is None else ()
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
            with guard.phase("teardown"):
                if mcp:
                    mcp.close()
                sb.destroy()
                egress.close_for_task(egress_id)
                if gateway is not None:
                    gateway.stop()
    agent.spans.insert(0, start_span)
    return agent, infra, changes, refused


def conversation_path(changes_path: str) -> str:
    """Where a conversational attempt's captured conversation (final service state, operations,
    transcript, what was told) is kept: next to its changes artifact."""
    return changes_path[: -len(".tar")] + ".conversation.json" if changes_path.endswith(".tar") else \
        changes_path + ".conversation.json"


def _span(kind: str, name: str, t0: float, start: float, end: float, step: int = 0) -> dict:
    """A span row; `start_s` is seconds since the attempt started."""
    return {"kind": kind, "name": name, "step": step, "start_s": start - t0, "duration_s": max(end - start, 0.0)}


def write_changes(run_dir: str, node: str, a: Attempt, changes: list) -> str:
    """Write the agent's changes as `changes/<shard>.tar` (atomically); return the relative path."""
    name = trajwriter.shard_name(node, a.rollout_id, a.attempt, a.token).rsplit(".parquet", 1)[0] + ".tar"
    directory = Path(run_dir) / "changes"
    directory.mkdir(parents=True, exist_ok=True)
    atomic_write(directory / name, changes_to_tar(changes))
    return f"changes/{name}"


def _rollout_row(a: Attempt, node: str, task: LeaseTask, agent: AgentResult, verdict: Verdict | None,
                 outcome: str, reward, infra, changes, started, wall_s) -> dict:
    return {
        "run_id": a.run_id, "rollout_id": a.rollout_id, "attempt": a.attempt, "fencing_token": a.token,
        "batch_id": a.batch_id, "task_id": task.task_id, "task_name": task.name,
        "task_family": task.family, "taskset_hash": task.taskset_hash,
        "image_digest": task.image_digest, "verifier_version": VERIFIER_VERSION,
        "policy_version": a.policy_version, "seed": a.seed, "node": node, "outcome": outcome,
        "reward": reward, "reward_components": json.dumps(verdict.components if verdict else {}),
        "tampered": bool(verdict and verdict.tampered), "infra_reason": infra,
        "started_at": started, "finished_at": utc_now(), "wall_s": wall_s, "agent_s": agent.agent_s,
        "verify_s": verdict.verify_s if verdict else 0.0, "steps": len(agent.steps),
        "prompt_tokens": agent.prompt_tokens, "completion_tokens": agent.completion_tokens,
        "limits": json.dumps(dict(task.limits), sort_keys=True), "answer": agent.answer,
        "diff_bytes": sum(len(c.data or b"") for c in changes), "split": task.split,
        "stop_reason": agent.stop_reason, "diff_files": len(changes),
    }
