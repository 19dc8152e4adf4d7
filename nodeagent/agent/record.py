"""What one rollout attempt leaves on shared storage: the agent's changes as an artifact,
`<run_dir>/changes/<shard name>.tar` (written atomically; its path relative to the run dir is
the rollouts row's `changes_path`, what `paddock rescore` grades again), a conversational
attempt's captured conversation next to it (`conversation_path`), and the attempt's trajectory
shards (`nodeagent.store.writer`): its rollouts row, steps, checks, spans, egress and
`model_calls` rows (`store_attempt`). A store that fails is `infra_error` with reason
`store: ...`.

Must not import: zmq, nodeagent.agent.daemon, nodeagent.agent.attempt.
"""
from __future__ import annotations

import json
from pathlib import Path

from controller.contracts.clock import utc_now
from controller.contracts.states import STORE, InfraReason
from controller.contracts.tasks import LeaseTask
from controller.ondisk.fileio import atomic_write
from nodeagent.agent.core import Attempt, AttemptResult
from nodeagent.gateway.session import Session
from nodeagent.harness.loop import AgentResult
from nodeagent.sandbox.runtime import changes_to_tar
from nodeagent.store import writer as trajwriter
from nodeagent.verifier.grade import VERIFIER_VERSION, Verdict


def store_attempt(a: Attempt, node: str, task: LeaseTask, agent: AgentResult, verdict: Verdict | None,
                  outcome: str, reward, infra, changes, started, wall_s: float, conversation,
                  session: Session, user_rows: list[dict]) -> AttemptResult:
    """The changes artifact and the trajectory shards of the attempt (`user_rows`: the user
    simulator's model calls, `Conversation.user_rows`); its result."""
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
    calls = call_rows(session, bool(task.harness), agent.steps, user_rows)
    try:
        shards = trajwriter.write_attempt(a.run_dir, node, row, agent.steps, checks,
                                          spans=agent.spans, egress=agent.egress, model_calls=calls)
    except OSError as exc:
        return AttemptResult("infra_error", None, {}, InfraReason.of(STORE, exc))
    return AttemptResult(outcome, reward, shards, infra)


def call_rows(session: Session, harness: bool, steps: list[dict] = (), user_rows: list[dict] = ()) -> list[dict]:
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


def conversation_path(changes_path: str) -> str:
    """Where a conversational attempt's captured conversation (final service state, operations,
    transcript, what was told) is kept: next to its changes artifact."""
    return changes_path[: -len(".tar")] + ".conversation.json" if changes_path.endswith(".tar") else \
        changes_path + ".conversation.json"


def span(kind: str, name: str, t0: float, start: float, end: float, step: int = 0) -> dict:
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


__all__ = ["call_rows", "conversation_path", "span", "store_attempt", "write_changes"]
