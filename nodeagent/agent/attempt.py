"""One rollout attempt on a node: sandbox → agent loop → diff → verifier → trajectory shards.

`run_attempt` holds the attempt's order and its outcome rules; each step is a module of its
own that does its whole job: the agent phase (`nodeagent.agent.agentphase`: egress, sandbox,
harness, diff), a conversational task's services and user (`nodeagent.agent.conversation`),
grading (`nodeagent.verifier.grade.verify`, given the typed `GradedTask`) and the record
(`nodeagent.agent.record`: the changes artifact and the trajectory shards).

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
import logging
import time
from pathlib import Path
from typing import Callable, Mapping

from controller.contracts.clock import utc_now
from controller.contracts.states import SETUP, TASK, VERIFIER, InfraReason, as_infra_reason
from controller.contracts.tasks import GradedTask, LeaseTask, TaskError
from layers.store import ImageStore
from nodeagent.agent.agentphase import run_agent_phase
from nodeagent.agent.conversation import Conversation
from nodeagent.agent.core import Attempt, AttemptResult
from nodeagent.agent.guard import AttemptGuard, Deadlines, GuardedRuntime
from nodeagent.agent.record import span, store_attempt, write_changes
from nodeagent.agent.taskcache import default_cache, task_layers
from nodeagent.browser.rollout import run_web_agent
from nodeagent.gateway.session import Follow, GatewayBudgets, Session, Upstream
from nodeagent.harness.loop import AgentResult
from nodeagent.harness.progress import NO_OUTPUT, NO_PROGRESS
from nodeagent.sandbox.runtime import SandboxError, SandboxRuntime
from nodeagent.sandbox.setuplayer import ensure_setup_layer
from nodeagent.sandbox.spec import SetupError
from nodeagent.store import tracing
from nodeagent.verifier.grade import Verdict, VerifierInfraError, verify, verify_time_s
from nodeagent.verifier.verdicts import check

log = logging.getLogger(__name__)
__all__ = ["Attempt", "AttemptResult", "run_attempt", "task_sandbox_layers", "write_changes"]


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
    conv = Conversation(task, a, clock, guard)
    if task.family == "web":
        with guard.phase("agent"):
            agent, web_infra, changes = run_web_agent(runtime, image, a, task, clock, t0, session, layers)
        infra, refused = as_infra_reason(web_infra), None
    else:   # refused: what the agent left in /work cannot be carried to the grader, its own failure
        agent, infra, changes, refused = run_agent_phase(runtime, image, a, task, clock, t0, session, layers, conv,
                                                         guard)
    session.close()                 # its kept model-server connections; the rows stay
    conv.close()
    verdict = None
    conversation = conv.captured(agent) if not guard.stopped else None
    user_rows = conv.user_rows()    # the user simulator's model calls
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
        agent.spans.append(span("verification", task.checker_kind, t0, tv, clock(), step=len(agent.steps)))
        if guard.stopped:          # a verdict of killed grading sandboxes is no verdict
            if guard.cancelled() is not None:
                return _stopped(guard)
            verdict = None
            infra, outcome, reward = _deadline_verdict(guard, agent)
    if infra is not None:
        outcome, reward = "infra_error", None
        log.warning("rollout %s attempt %d infra_error: %s", a.rollout_id, a.attempt, infra.text)
    with guard.phase("teardown"):
        res = store_attempt(a, node, task, agent, verdict, outcome, reward, infra, changes, started, clock() - t0,
                            conversation, session, user_rows)
    if guard.stopped and guard.cancelled() is not None:
        return _stopped(guard)
    if guard.deadline_phase() in ("teardown", "total (teardown)") and res.outcome != "infra_error":
        return AttemptResult("infra_error", None, {}, guard.reason())
    return res


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
