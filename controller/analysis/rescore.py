"""`paddock rescore --run DIR`: grade a run's committed rollouts again with this verifier.

No agent runs again: each committed rollout's stored changes (`changes_path`, the tar written
by the attempt) and its stored answer are graded again by the node side's `regrade`
(`nodeagent.verifier.rescore`, handed in by the CLI) in fresh sandboxes. Results form a new result set, `<run>/rescore/<verifier_version>/results.parquet`
(written to a temporary name and renamed), next to the original rows, which are never
modified: one row per rollout with the stored and the new outcome, reward and verifier
version. Rollouts that were never verified (`infra_error`, or an agent that ran out of wall
time) are carried over as they are, marked `rescored = false` with the reason.

Must not import: zmq, nodeagent.
"""
from __future__ import annotations

import json
import logging
import os
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Callable

import pyarrow as pa
import pyarrow.parquet as pq

from controller.analysis.query import connect
from controller.ondisk.fileio import atomic_write_with

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
    con = connect(run_dir)
    try:
        have = {r[0] for r in con.execute("SELECT column_name FROM (DESCRIBE rollouts)").fetchall()}
        cols = [c if c in have else f"NULL AS {c}" for c in _COLUMNS]
        rows = con.execute(f"SELECT {', '.join(cols)} FROM rollouts ORDER BY rollout_id").fetchall()
    finally:
        con.close()
    return [dict(zip(_COLUMNS, r)) for r in rows]


def rescore_run(run_dir: str | os.PathLike, regrade: Callable[..., dict], verifier_version: str,
                runtime, image_for: Callable[[str], Path], workers: int = 2,
                clock: Callable[[], float] = time.monotonic) -> tuple[Path, list[dict]]:
    """Re-grade every committed rollout of `run_dir`; return (results file, rows).

    `regrade(row, run_dir, tasks, runtime, image_for, clock) -> result row` is the node side
    (`nodeagent.verifier.rescore.regrade`, handed in by the CLI with its `VERIFIER_VERSION`)."""
    run_dir = Path(run_dir)
    tasks_file = run_dir / "tasks.json"
    if not tasks_file.is_file():
        raise RescoreError(f"{tasks_file} is missing: cannot know the tasks of the run")
    tasks = json.loads(tasks_file.read_text())
    rows = stored_rollouts(run_dir)
    if not rows:
        raise RescoreError(f"run {run_dir} has no committed rollouts")
    with ThreadPoolExecutor(max_workers=max(1, workers)) as pool:
        results = list(pool.map(lambda r: regrade(r, run_dir, tasks, runtime, image_for, clock), rows))
    out_dir = run_dir / "rescore" / verifier_version
    out_dir.mkdir(parents=True, exist_ok=True)
    table = pa.Table.from_pylist(results, schema=RESULTS_SCHEMA)
    path = atomic_write_with(out_dir / "results.parquet", lambda tmp: pq.write_table(table, str(tmp)))
    return path, results
