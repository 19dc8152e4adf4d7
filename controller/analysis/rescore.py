"""`paddock rescore --run DIR`: grade a run's committed rollouts again with this verifier.

No agent runs again: each committed rollout's stored changes (`changes_path`, the tar written
by nodeagent.agent.attempt) and its stored answer go through `nodeagent.verifier.grade.verify` in fresh
sandboxes. Results form a new result set, `<run>/rescore/<verifier_version>/results.parquet`
(written to a temporary name and renamed), next to the original rows, which are never
modified: one row per rollout with the stored and the new outcome, reward and verifier
version. Rollouts that were never verified (`infra_error`, or an agent that ran out of wall
time) are carried over as they are, marked `rescored = false` with the reason.

Must not import zmq.
"""
from __future__ import annotations

import json
import logging
import os
import time
from concurrent.futures import ThreadPoolExecutor
from datetime import datetime, timezone
from pathlib import Path
from typing import Callable

import pyarrow as pa
import pyarrow.parquet as pq

log = logging.getLogger(__name__)

RESULTS_SCHEMA = pa.schema([
    ("rollout_id", pa.string()), ("attempt", pa.int32()), ("fencing_token", pa.int64()),
    ("task_id", pa.string()), ("task_name", pa.string()),
    ("stored_outcome", pa.string()), ("stored_reward", pa.float64()), ("stored_verifier_version", pa.string()),
    ("outcome", pa.string()), ("reward", pa.float64()), ("reward_components", pa.string()),
    ("tampered", pa.bool_()), ("infra_reason", pa.string()), ("rescored", pa.bool_()),
    ("note", pa.string()), ("verifier_version", pa.string()), ("verify_s", pa.float64()),
    ("rescored_at", pa.timestamp("us", tz="UTC")),
])
_COLUMNS = ("rollout_id", "attempt", "fencing_token", "task_id", "task_name", "outcome", "reward",
            "verifier_version", "answer", "changes_path", "stop_reason", "image_digest")


class RescoreError(ValueError):
    """The run cannot be re-scored (no rollouts, no task table); the message says what is missing."""


def stored_rollouts(run_dir: Path) -> list[dict]:
    """The run's committed rollout rows (the columns rescoring needs)."""
    from controller.analysis.query import connect
    con = connect(run_dir)
    try:
        have = {r[0] for r in con.execute("SELECT column_name FROM (DESCRIBE rollouts)").fetchall()}
        cols = [c if c in have else f"NULL AS {c}" for c in _COLUMNS]
        rows = con.execute(f"SELECT {', '.join(cols)} FROM rollouts ORDER BY rollout_id").fetchall()
    finally:
        con.close()
    return [dict(zip(_COLUMNS, r)) for r in rows]


def rescore_one(row: dict, run_dir: Path, tasks: dict, runtime, image_for: Callable[[str], Path],
                clock: Callable[[], float] = time.monotonic) -> dict:
    from nodeagent.verifier import grade as verifier
    from nodeagent.sandbox.runtime import SandboxError, tar_to_changes
    out = {k: row[k] for k in ("rollout_id", "attempt", "fencing_token", "task_id", "task_name")}
    out.update(stored_outcome=row["outcome"], stored_reward=row["reward"],
               stored_verifier_version=row["verifier_version"], verifier_version=verifier.VERIFIER_VERSION,
               rescored=False, note=None, tampered=False, infra_reason=None, reward_components="{}",
               outcome=row["outcome"], reward=row["reward"], verify_s=0.0,
               rescored_at=datetime.now(timezone.utc))
    if row["outcome"] == "infra_error" or row.get("stop_reason") == "wall_time":
        out["note"] = "never verified (infra_error or agent out of wall time): carried over"
        return out
    task = tasks.get(row["task_id"])
    kind = (task or {}).get("checker", {}).get("kind")
    try:
        if task is None:
            raise verifier.VerifierInfraError(f"task {row['task_id']} is not in the run's tasks.json")
        changes = []
        if kind not in ("math", "exact", "regex"):
            if not row.get("changes_path"):
                raise verifier.VerifierInfraError("no stored changes (changes_path is NULL)")
            changes = tar_to_changes((run_dir / row["changes_path"]).read_bytes())
        v = verifier.verify(runtime, image_for(task.get("image_digest") or row.get("image_digest") or ""),
                            task, changes, row.get("answer"), clock)
        out.update(outcome=v.outcome, reward=v.reward, reward_components=json.dumps(v.components),
                   tampered=v.tampered, rescored=True, verify_s=v.verify_s)
    except (verifier.VerifierInfraError, SandboxError, OSError, ValueError) as exc:
        out.update(outcome="infra_error", reward=None, infra_reason=str(exc)[:1000], rescored=True)
    return out


def rescore_run(run_dir: str | os.PathLike, runtime, image_for: Callable[[str], Path], workers: int = 2,
                clock: Callable[[], float] = time.monotonic) -> tuple[Path, list[dict]]:
    """Re-grade every committed rollout of `run_dir`; return (results file, rows)."""
    from nodeagent.verifier import grade as verifier
    run_dir = Path(run_dir)
    tasks_file = run_dir / "tasks.json"
    if not tasks_file.is_file():
        raise RescoreError(f"{tasks_file} is missing: cannot know the tasks of the run")
    tasks = json.loads(tasks_file.read_text())
    rows = stored_rollouts(run_dir)
    if not rows:
        raise RescoreError(f"run {run_dir} has no committed rollouts")
    with ThreadPoolExecutor(max_workers=max(1, workers)) as pool:
        results = list(pool.map(lambda r: rescore_one(r, run_dir, tasks, runtime, image_for, clock), rows))
    out_dir = run_dir / "rescore" / verifier.VERIFIER_VERSION
    out_dir.mkdir(parents=True, exist_ok=True)
    tmp = out_dir / "results.parquet.tmp"
    pq.write_table(pa.Table.from_pylist(results, schema=RESULTS_SCHEMA), tmp)
    os.replace(tmp, out_dir / "results.parquet")
    return out_dir / "results.parquet", results
