"""Restore a run directory from its replica (controller/store/replica.py): the ledger as of a
point in time, the committed shards it names, and a catalog rebuilt from it.

`restore_run(replica, to, at)` writes a new run directory `to` (it must not exist, or be
empty): `to/controller.db` is the ledger restored as of `at` (epoch seconds; None: the
newest commit the replica holds); every shard a committed rollout of that ledger names is
copied from the replica; the catalog is made equal to the ledger's committed rows
(`catalog.reconcile`, as a controller start does). A committed rollout whose shard the
replica lacks is listed in the result, never silently dropped. The controller can then be
started on `to` (`paddock controller --run-dir TO ...`): node agents and trainers carry on.

Must not import: zmq, controller.broker, controller.cli, nodeagent.
"""
from __future__ import annotations

import logging
import os
import sqlite3
from dataclasses import dataclass
from pathlib import Path
from typing import Optional

from controller.contracts.states import COMMITTED, QUEUED
from controller.store.catalog import Catalog, reconcile
from controller.store.queue import RolloutQueue
from controller.store.replica import (
    META_FILE,
    ReplicaError,
    copy_shards,
    restore_ledger,
)

log = logging.getLogger(__name__)

DB_NAME = "controller.db"


@dataclass(frozen=True)
class RestoreResult:
    run_dir: Path
    generation: int  # the ledger generation restored from
    records: int  # its log records applied
    until: Optional[float]  # the time of the newest commit restored (None: the snapshot)
    committed: int  # committed rollouts in the restored ledger
    shards: int  # shard files copied
    missing: tuple[str, ...]  # shards a committed rollout names that the replica lacks
    requeued: tuple[str, ...] = ()  # those rollouts: queued again, their record lost


def restore_run(replica_dir: str | os.PathLike, to: str | os.PathLike,
                at: Optional[float] = None) -> RestoreResult:
    """Restore the run replicated in `replica_dir` into the new directory `to`."""
    replica, to = Path(replica_dir), Path(to)
    if not (replica / META_FILE).exists():
        raise ReplicaError(f"{replica} is not a Paddock replica (no {META_FILE})")
    if to.exists() and any(to.iterdir()):
        raise ReplicaError(f"restore target {to} is not empty: restore into a new directory")
    to.mkdir(parents=True, exist_ok=True)
    os.chmod(to, 0o700)  # a run directory is the owner's (controller/ondisk/keys.py)
    ledger = restore_ledger(replica, to / DB_NAME, at)
    queue = RolloutQueue(to / DB_NAME)
    try:
        committed = queue.committed_rows()
    finally:
        queue.close()
    rels = [rel for row in committed for rel in (row["shards"] or {}).values()]
    missing = copy_shards(replica, to, rels)
    gone = set(missing)
    lost = tuple(row["rollout_id"] for row in committed if gone & set((row["shards"] or {}).values()))
    if lost:     # committed on the primary after its disk was lost: no record to restore
        _requeue(to / DB_NAME, lost)
        committed = [row for row in committed if row["rollout_id"] not in set(lost)]
    with Catalog(to) as catalog:
        reconcile(catalog, committed)
    for rel in missing[:20]:
        log.error("restore: committed shard %s is not on the replica %s", rel, replica)
    if lost:
        log.error("restore: %d rollouts committed without their record on the replica are queued again: %s",
                  len(lost), ", ".join(lost[:10]))
    log.info("restored %s from %s: generation %d, %d records, %d committed rollouts, %d shards"
             " (%d missing)", to, replica, ledger.generation, ledger.records, len(committed),
             len(rels) - len(missing), len(missing))
    return RestoreResult(to, ledger.generation, ledger.records, ledger.until, len(committed),
                         len(rels) - len(missing), tuple(missing), lost)


def _requeue(db_path: Path, rollout_ids: tuple[str, ...]) -> None:
    """Put rollouts whose committed record the replica lacks back in the queue (a new attempt
    runs them): a restored run never shows a committed rollout without its record."""
    with sqlite3.connect(db_path) as db:
        db.executemany(
            "UPDATE rollouts SET state = ?, token = NULL, node = NULL, lease_deadline = NULL, leased_at = NULL,"
            " outcome = NULL, reward = NULL, shards = NULL, infra_reason = NULL, infra_code = NULL,"
            " commit_seq = NULL, commit_idem = NULL, not_before = 0 WHERE rollout_id = ? AND state = ?",
            [(QUEUED, rid, COMMITTED) for rid in rollout_ids])
    db.close()
