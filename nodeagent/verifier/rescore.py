"""Grading a stored rollout again on this node: its stored changes and answer through the
verifier in fresh sandboxes (`paddock rescore`; the run-level bookkeeping, which rows and
where the results go, is `controller.analysis.rescore`). A conversational rollout is graded on
its captured conversation (final service state, what the agent told the user), kept next to its
changes as `changes/<shard>.conversation.json`.

`regrade(row, run_dir, tasks, runtime, image_for, clock)` takes one committed rollout row (the
columns of `controller.analysis.rescore`) and returns its result row; a rollout that was never
verified (infra_error, or an agent out of wall time) is carried over as it was. The grading
sandbox stacks the task's layers (repository, then set-up layer) as the rollout's did. A grading
failure is an `infra_error` result naming the reason, never an exception.

Must not import: zmq, controller.analysis, controller.store, controller.broker.
"""
from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Callable

from controller.contracts.clock import utc_now
from controller.ondisk import taskblobs
from nodeagent.sandbox.runtime import SandboxError, tar_to_changes
from nodeagent.verifier import grade as verifier
from nodeagent.verifier.validate import sandbox_layers


def _conversation(run_dir: Path, row: dict) -> dict | None:
    """A conversational rollout's captured conversation, kept next to its changes artifact
    (`changes/<shard>.conversation.json`, written by the attempt); None if there is none."""
    rel = row.get("changes_path") or ""
    path = run_dir / ((rel[: -len(".tar")] if rel.endswith(".tar") else rel) + ".conversation.json")
    return json.loads(path.read_text()) if rel and path.exists() else None


def regrade(row: dict, run_dir: Path, tasks: dict, runtime, image_for: Callable[[str], Path],
                clock: Callable[[], float] = time.monotonic) -> dict:
    out = {k: row[k] for k in ("rollout_id", "attempt", "fencing_token", "task_id", "task_name")}
    out.update(stored_outcome=row["outcome"], stored_reward=row["reward"],
               stored_verifier_version=row["verifier_version"], verifier_version=verifier.VERIFIER_VERSION,
               rescored=False, note=None, tampered=False, infra_reason=None, reward_components="{}",
               outcome=row["outcome"], reward=row["reward"], verify_s=0.0,
               rescored_at=utc_now())
    if row["outcome"] == "infra_error" or row.get("stop_reason") == "wall_time":
        out["note"] = "never verified (infra_error or agent out of wall time): carried over"
        return out
    stored = tasks.get(row["task_id"])
    stored = taskblobs.inflate(stored) if stored else stored
    try:
        if stored is None:
            raise verifier.VerifierInfraError(f"task {row['task_id']} is not in the run's tasks.json")
        task = verifier.graded_task(stored)      # the run's JSON, decoded once
        changes = []
        if not task.checker.answer_kind:
            if not row.get("changes_path"):
                raise verifier.VerifierInfraError("no stored changes (changes_path is NULL)")
            changes = tar_to_changes((run_dir / row["changes_path"]).read_bytes())
        image = image_for(task.image_digest or row.get("image_digest") or "")
        conversational = task.checker.kind == "state" or bool(task.services)
        v = verifier.verify(runtime, image, task, changes, row.get("answer"), clock,
                            layers=sandbox_layers(runtime, image, task),
                            conversation=_conversation(run_dir, row) if conversational else None)
        out.update(outcome=v.outcome, reward=v.reward, reward_components=json.dumps(v.components),
                   tampered=v.tampered, rescored=True, verify_s=v.verify_s)
    except (verifier.VerifierInfraError, SandboxError, OSError, ValueError) as exc:
        out.update(outcome="infra_error", reward=None, infra_reason=str(exc)[:1000], rescored=True)
    return out
