"""The queue's write-ahead log checkpointed every `schema.WAL_AUTOCHECKPOINT_PAGES` pages
(not SQLite's 1,000): a WAL longer than SQLite's default mark still holds every acknowledged
commit through a killed process and on the replica. Real SQLite files, a real process killed
with `os._exit` (nothing closed: SQLite checkpoints and removes the WAL on a clean close)."""
from __future__ import annotations

import shutil
import sqlite3
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

from controller.store import replica as R
from controller.store import schema
from controller.store.queue import RolloutQueue
from tests.conftest import FakeClock
from tests.store.test_replica import commit_some, committed_in, open_queue

ROOT = Path(__file__).resolve().parents[2]
SQLITE_DEFAULT_PAGES = 1000  # SQLite's own wal_autocheckpoint


def wal_pages(db: Path) -> int:
    """Pages the WAL file holds (its frames: a 24-byte header and the page each)."""
    page = 4096
    return (db.with_name(db.name + "-wal").stat().st_size - 32) // (24 + page)


def wal_restarts(db: Path) -> int:
    """The WAL header's checkpoint sequence: how often the log started over (after a
    checkpoint) since the file was made."""
    return R.WAL_HEADER.unpack(db.with_name(db.name + "-wal").read_bytes()[:32])[3]


@pytest.fixture
def shm_replica():
    """A replica directory on another filesystem than tmp_path (tmpfs), removed after."""
    d = Path(tempfile.mkdtemp(prefix="paddock-replica-", dir="/dev/shm"))
    yield d
    shutil.rmtree(d, ignore_errors=True)


def test_the_queue_checkpoints_at_its_own_mark(tmp_path):
    q = RolloutQueue(tmp_path / "queue.db", clock=FakeClock())
    assert q._db.execute("PRAGMA wal_autocheckpoint").fetchone()[0] == \
        schema.WAL_AUTOCHECKPOINT_PAGES > SQLITE_DEFAULT_PAGES
    q.close()


def test_a_killed_process_with_a_long_wal_loses_no_acknowledged_commit(tmp_path):
    """Commits (each acknowledged once its group commit returned: printed) until the WAL is
    past SQLite's default mark without a checkpoint, then the process dies: a reopen reads
    them all back from the WAL."""
    db = tmp_path / "queue.db"
    script = f"""
import os, random
from controller.store.queue import RolloutQueue
q = RolloutQueue({str(db)!r}, clock=lambda: 1.7e9, rng=random.Random(0))
pages = lambda: (os.stat({str(db) + "-wal"!r}).st_size - 32) // (24 + 4096)
step = 0
while pages() < {SQLITE_DEFAULT_PAGES + 200} and step < 200:  # (the old mark: never)
    step += 1
    q.submit_batch(f"s{{step}}", [(f"t{{step}}-{{i}}", 1) for i in range(40)], 1)
    leases = q.lease_next("n1", 40)
    with q.batch():
        for l in leases:
            assert q.complete(l.rollout_id, l.attempt, l.token, "pass", 1.0, {{}}, None,
                              f"c-{{l.rollout_id}}").committed
    print(*(l.rollout_id for l in leases), flush=True)  # acknowledged: the batch is durable
os._exit(0)
"""
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                         timeout=300, cwd=ROOT, env={"PYTHONPATH": str(ROOT)})
    assert out.returncode == 0, out.stderr
    acknowledged = set(out.stdout.split())
    assert len(acknowledged) > 1000
    assert wal_pages(db) > SQLITE_DEFAULT_PAGES and wal_restarts(db) == 0  # all in the WAL
    assert committed_in(db) == acknowledged
    with sqlite3.connect(db) as con:
        assert con.execute("PRAGMA integrity_check").fetchone()[0] == "ok"


def test_the_replica_holds_every_commit_of_a_wal_past_the_default_mark(tmp_path, shm_replica):
    clock = FakeClock()
    replica_dir = shm_replica
    run = tmp_path / "run"
    q = open_queue(run, replica_dir, clock)
    done: list[str] = []
    step = 0
    while wal_pages(run / "controller.db") < SQLITE_DEFAULT_PAGES + 200 and step < 100:
        step += 1
        clock.advance(1)
        done += commit_some(q, run, f"b{step}", 40)
    assert wal_pages(run / "controller.db") > SQLITE_DEFAULT_PAGES
    assert wal_restarts(run / "controller.db") == 0  # every commit since the open is in the WAL
    assert q.replica_status()["in_sync"]
    R.restore_ledger(replica_dir, tmp_path / "restored.db")
    assert committed_in(tmp_path / "restored.db") == set(done)
    q.close()
