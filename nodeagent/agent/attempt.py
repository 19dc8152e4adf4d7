"""One rollout attempt on a node: sandbox → agent loop → diff → verifier → trajectory shards.

The agent's changes are kept as an artifact, `<run_dir>/changes/<shard name>.tar` (written
atomically; its path relative to the run dir is the rollouts row's `changes_path`), so that
`paddock rescore` can grade the attempt again without re-running the agent. The agent's
spans get a `sandbox_start` and a `verification` span.

`run_attempt` never raises for operating errors: a sandbox that fails to start, a model server
that fails or a verifier that cannot reach a verdict make an `infra_error` attempt (reward
NULL, retried by the controller), recorded with its reason. A policy that runs out of wall
time is `timeout` (reward 0: its own fault). Must not import zmq.
"""
from __future__ import annotations

import json
import logging
import os
import time
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import Callable

from nodeagent.egress import proxy as egress

from nodeagent.store import writer as trajwriter
from controller.contracts.network import PolicyError
from controller.contracts.tasks import BudgetError
from controller.contracts.tools import ToolSetError
from nodeagent.harness.loop import AgentResult, run_agent
from nodeagent.harness.model import ModelError
from nodeagent.sandbox.runtime import SandboxError, SandboxRuntime, SandboxSpec, changes_to_tar
from nodeagent.verifier.grade import VERIFIER_VERSION, Verdict, VerifierInfraError, as_bytes, decode_task, verify

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Attempt:
    run_id: str
    run_dir: str
    rollout_id: str
    attempt: int
    token: int
    batch_id: str
    seed: int
    task: dict
    policy_version: int
    endpoint: str
    model: str


@dataclass(frozen=True)
class AttemptResult:
    outcome: str
    reward: float | None
    shards: dict
    infra_reason: str | None


def _utc() -> datetime:
    return datetime.now(timezone.utc)


def run_attempt(runtime: SandboxRuntime, image: Path, node: str, a: Attempt,
                clock: Callable[[], float] = time.monotonic) -> AttemptResult:
    task = decode_task(a.task)
    started, t0 = _utc(), clock()
    agent, verdict, infra, changes = AgentResult(), None, None, []
    egress_id = f"{a.rollout_id}.{a.attempt}"
    try:
        sb = runtime.create(SandboxSpec(image=image, limits=dict(task["limits"]),
                                        files={k: as_bytes(v) for k, v in task["files"].items()},
                                        egress_socket=egress.open_for_task(task.get("network"), egress_id)))
    except (SandboxError, PolicyError) as exc:
        infra = f"sandbox_start: {exc}"
        egress.close_for_task(egress_id)
    start_span = _span("sandbox_start", "agent sandbox", t0, t0, clock())
    if infra is None:
        try:
            agent = run_agent(sb, task["instruction"], a.endpoint, a.model, a.seed, task["budgets"], clock,
                              tools=task.get("tools"), egress_decisions=lambda: egress.decisions_for(egress_id),
                              span_origin=t0)
            changes = sb.diff("/work")
        except ModelError as exc:
            infra = f"model_server: {exc}"
            agent = exc.result or agent     # the steps and spans before the failure, for the record
        except (BudgetError, ToolSetError) as exc:
            infra = f"task: {exc}"
        except SandboxError as exc:
            infra = f"sandbox: {exc}"
        finally:
            sb.destroy()
            egress.close_for_task(egress_id)
    agent.spans.insert(0, start_span)
    if infra is None and agent.stop_reason == "wall_time":
        outcome, reward = "timeout", 0.0
    elif infra is None:
        tv = clock()
        try:
            verdict = verify(runtime, image, task, changes, agent.answer, clock)
            outcome, reward = verdict.outcome, verdict.reward
        except VerifierInfraError as exc:
            infra = f"verifier: {exc}"
        agent.spans.append(_span("verification", task.get("checker", {}).get("kind", "?"), t0, tv, clock(),
                                 step=len(agent.steps)))
    if infra is not None:
        outcome, reward = "infra_error", None
        log.warning("rollout %s attempt %d infra_error: %s", a.rollout_id, a.attempt, infra)
    try:
        changes_path = write_changes(a.run_dir, node, a, changes) if infra is None else None
    except OSError as exc:
        return AttemptResult("infra_error", None, {}, f"store: changes artifact: {exc}")
    row = _rollout_row(a, node, task, agent, verdict, outcome, reward, infra, changes, started, clock() - t0)
    row["changes_path"] = changes_path
    checks = verdict.checks if verdict else []
    try:
        shards = trajwriter.write_attempt(a.run_dir, node, row, agent.steps, checks,
                                          spans=agent.spans, egress=agent.egress)
    except OSError as exc:
        return AttemptResult("infra_error", None, {}, f"store: {exc}")
    return AttemptResult(outcome, reward, shards, infra)


def _span(kind: str, name: str, t0: float, start: float, end: float, step: int = 0) -> dict:
    """A span row; `start_s` is seconds since the attempt started."""
    return {"kind": kind, "name": name, "step": step, "start_s": start - t0, "duration_s": max(end - start, 0.0)}


def write_changes(run_dir: str, node: str, a: Attempt, changes: list) -> str:
    """Write the agent's changes as `changes/<shard>.tar` (tmp + rename); return the relative path."""
    name = trajwriter.shard_name(node, a.rollout_id, a.attempt, a.token).rsplit(".parquet", 1)[0] + ".tar"
    directory = Path(run_dir) / "changes"
    directory.mkdir(parents=True, exist_ok=True)
    tmp = directory / (name + ".tmp")
    with open(tmp, "wb") as f:
        f.write(changes_to_tar(changes))
        f.flush()
        os.fsync(f.fileno())
    os.rename(tmp, directory / name)
    return f"changes/{name}"


def _rollout_row(a: Attempt, node: str, task: dict, agent: AgentResult, verdict: Verdict | None,
                 outcome: str, reward, infra, changes, started, wall_s) -> dict:
    return {
        "run_id": a.run_id, "rollout_id": a.rollout_id, "attempt": a.attempt, "fencing_token": a.token,
        "batch_id": a.batch_id, "task_id": task["task_id"], "task_name": task["name"],
        "task_family": task["family"], "taskset_hash": task.get("taskset_hash", ""),
        "image_digest": task.get("image_digest", ""), "verifier_version": VERIFIER_VERSION,
        "policy_version": a.policy_version, "seed": a.seed, "node": node, "outcome": outcome,
        "reward": reward, "reward_components": json.dumps(verdict.components if verdict else {}),
        "tampered": bool(verdict and verdict.tampered), "infra_reason": infra,
        "started_at": started, "finished_at": _utc(), "wall_s": wall_s, "agent_s": agent.agent_s,
        "verify_s": verdict.verify_s if verdict else 0.0, "steps": len(agent.steps),
        "prompt_tokens": agent.prompt_tokens, "completion_tokens": agent.completion_tokens,
        "limits": json.dumps(task["limits"], sort_keys=True), "answer": agent.answer,
        "diff_bytes": sum(len(c.data or b"") for c in changes), "split": task.get("split"),
        "stop_reason": agent.stop_reason, "diff_files": len(changes),
    }
