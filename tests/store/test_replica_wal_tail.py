"""The replica ships exactly the frames SQLite counts as committed, whatever the WAL file
holds past them (controller/store/replica.py, `_scan`): a controller killed -9 between
writing a COMMIT's frames and publishing them in the wal-index leaves whole frames, with the
log's salts and a commit frame, past the log's end when another connection keeps the
wal-index alive (no recovery at the next open: SQLite writes over them). Real SQLite files,
real processes ended with `os._exit` (nothing closed, nothing checkpointed)."""
from __future__ import annotations

import sqlite3
import subprocess
import sys
from pathlib import Path

from controller.store import replica as R
from tests.conftest import FakeClock
from tests.store.test_replica import ROOT, commit_some, committed_in, open_queue, replica_dir

__all__ = ["replica_dir"]  # the fixture, used by name

WAL_INDEX_HEADERS = 96  # the wal-index's two copies of its header (sqlite.org/walformat.html)


def _child(script: str) -> None:
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                         timeout=120, cwd=ROOT, env={"PYTHONPATH": str(ROOT)})
    assert out.returncode == 0, out.stderr


def _wal_frames(db: Path) -> int:
    return (db.with_name(db.name + "-wal").stat().st_size - R.WAL_HEADER.size) // (
        R.FRAME_HEADER.size + 4096)


def test_frames_a_killed_writer_never_published_are_not_shipped(tmp_path, replica_dir):
    run = tmp_path / "run"
    run.mkdir()
    db = run / "controller.db"
    # A first controller: some work, then it dies (its WAL stays, nothing checkpointed).
    _child(f"""
import os
from controller.store.queue import RolloutQueue
q = RolloutQueue({str(db)!r}, clock=lambda: 1.7e9)
q.submit_batch("b0", [("t", 1)], 5)
os._exit(0)
""")
    # Another connection (a status probe, an operator's sqlite3 shell) holds the database
    # open across what follows: the wal-index lives on, so no open recovers the log.
    other = sqlite3.connect(db)
    assert other.execute("SELECT COUNT(*) FROM rollouts").fetchone()[0] == 5
    shm = db.with_name(db.name + "-shm")
    published = shm.read_bytes()[:WAL_INDEX_HEADERS]
    before = _wal_frames(db)
    # A second controller writes a large COMMIT's frames (the commit frame last) and is
    # killed before it publishes them: the wal-index still ends where it ended.
    _child(f"""
import os
from controller.store.queue import RolloutQueue
q = RolloutQueue({str(db)!r}, clock=lambda: 1.7e9)
q.submit_batch("lost", [("t", 1)], 400)
os._exit(0)
""")
    assert _wal_frames(db) > before + 20
    with open(shm, "r+b") as f:
        f.write(published)
    assert other.execute("SELECT COUNT(*) FROM rollouts").fetchone()[0] == 5  # never committed
    # The third controller replicates: its commits go where the lost frames were.
    # Its first COMMIT adds rows to a table and its index that no later COMMIT adds to
    # (later ones update the table's rows only): a commit shipped short shows in the index.
    clock = FakeClock()
    q = open_queue(run, replica_dir, clock)
    q.add_counters({f"counter-{i}": i for i in range(8)})
    done = []
    for step in range(4):
        clock.advance(1)
        done += commit_some(q, run, f"b{step + 1}", 3)
        q.add_counters({f"counter-{i}": 1 for i in range(8)})
    q.close()
    other.close()
    with sqlite3.connect(db) as con:
        assert con.execute("SELECT COUNT(*) FROM rollouts WHERE batch_id = 'lost'").fetchone()[0] \
            == 0
        counters = con.execute("SELECT name, value FROM counters ORDER BY name").fetchall()
    R.restore_ledger(replica_dir, tmp_path / "restored.db")  # raises on a failed check
    assert committed_in(tmp_path / "restored.db") == set(done)
    with sqlite3.connect(tmp_path / "restored.db") as con:
        assert con.execute("SELECT COUNT(*) FROM rollouts").fetchone()[0] == 5 + len(done)
        assert con.execute("SELECT name, value FROM counters ORDER BY name").fetchall() \
            == counters


def _counters(db: Path) -> list[tuple]:
    with sqlite3.connect(db) as con:
        return con.execute("SELECT name, value FROM counters ORDER BY name").fetchall()


def test_the_logs_own_restarts_are_shipped_in_one_generation(tmp_path, replica_dir):
    """The queue's connection checkpoints every few pages (the mark made small): SQLite
    starts the log over at the next COMMIT, new salts, from frame 1; every commit is still
    shipped, no new generation is needed, the restore is the primary."""
    clock = FakeClock()
    run = tmp_path / "run"
    q = open_queue(run, replica_dir, clock)
    q._db.execute("PRAGMA wal_autocheckpoint=4")
    done = []
    for step in range(12):
        clock.advance(1)
        done += commit_some(q, run, f"b{step}", 2)
        q.add_counters({f"c{step}": step, "all": 1})
    wal = (run / "controller.db-wal").read_bytes()[:R.WAL_HEADER.size]
    assert R.WAL_HEADER.unpack(wal)[3] >= 3  # the log started over at least three times
    assert len(R.generations(replica_dir)) == 1 and q.replica_status()["failures"] == 0
    q.close()
    R.restore_ledger(replica_dir, tmp_path / "restored.db")
    assert committed_in(tmp_path / "restored.db") == set(done)
    assert _counters(tmp_path / "restored.db") == _counters(run / "controller.db")


def test_another_writers_commits_in_the_same_log_are_shipped_with_the_queues(
        tmp_path, replica_dir):
    clock = FakeClock()
    run = tmp_path / "run"
    q = open_queue(run, replica_dir, clock)
    other = sqlite3.connect(run / "controller.db", isolation_level=None)
    for step in range(4):
        q.add_counters({f"q{step}": 1})
        other.execute("INSERT INTO counters VALUES (?, 1)", (f"other{step}",))
        other.execute("INSERT INTO counters VALUES (?, 1)", (f"other{step}b",))
    q.add_counters({"last": 1})
    other.close()
    assert len(R.generations(replica_dir)) == 1
    q.close()
    R.restore_ledger(replica_dir, tmp_path / "restored.db")
    assert _counters(tmp_path / "restored.db") == _counters(run / "controller.db")
    assert len(_counters(run / "controller.db")) == 13


def test_a_log_restarted_by_another_writer_before_the_commit_was_shipped_starts_a_generation(
        tmp_path, replica_dir):
    """Between the queue's COMMIT and its shipping, another connection checkpoints the log
    (RESTART) and commits into the new one: the queue's commit is in the database file only
    (the new log has the other's frames): a snapshot, never the new log alone."""
    clock = FakeClock()
    run = tmp_path / "run"
    q = open_queue(run, replica_dir, clock)
    first = commit_some(q, run, "b0", 2)
    real = q.replica._ship

    def restarted_first(now):
        other = sqlite3.connect(run / "controller.db", isolation_level=None)
        assert other.execute("PRAGMA wal_checkpoint(RESTART)").fetchone()[0] == 0
        other.execute("INSERT INTO idempotency VALUES ('other', '{}')")  # other pages
        other.close()
        q.replica._ship = real
        return real(now)
    q.replica._ship = restarted_first
    q.add_counters({"queue": 1})  # rows no later commit rewrites
    second = commit_some(q, run, "b1", 2)
    q.close()
    R.restore_ledger(replica_dir, tmp_path / "restored.db")
    assert committed_in(tmp_path / "restored.db") == set(first + second)
    assert _counters(tmp_path / "restored.db") == [("queue", 1)]
    assert len(R.generations(replica_dir)) == 2


def test_a_generation_left_without_its_snapshot_is_skipped_and_removed(tmp_path, replica_dir):
    """A controller killed while taking a generation's snapshot leaves its directory without
    one: the next start numbers its generation past it (never into it) and removes it."""
    clock = FakeClock()
    run = tmp_path / "run"
    q = open_queue(run, replica_dir, clock)
    done = commit_some(q, run, "b0", 2)
    q.close()
    torn = replica_dir / R.LEDGER_DIR / "gen-000002"
    torn.mkdir()
    (torn / (R.SNAPSHOT + ".tmp")).write_bytes(b"half a snapshot")
    q = open_queue(run, replica_dir, clock)
    done += commit_some(q, run, "b1", 2)
    q.close()
    assert [seq for seq, _ in R.generations(replica_dir)] == [1, 3] and not torn.exists()
    R.restore_ledger(replica_dir, tmp_path / "restored.db")
    assert committed_in(tmp_path / "restored.db") == set(done)


def test_a_log_emptied_by_another_connection_after_a_shipped_commit_stays_in_its_generation(
        tmp_path, replica_dir):
    """An operator's `PRAGMA wal_checkpoint(TRUNCATE)` between two commits, after the first
    was shipped: nothing is lost, the next commits start the emptied log and are shipped in
    the same generation."""
    clock = FakeClock()
    run = tmp_path / "run"
    q = open_queue(run, replica_dir, clock)
    done = commit_some(q, run, "b0", 2)
    for step in range(3):
        other = sqlite3.connect(run / "controller.db")
        assert other.execute("PRAGMA wal_checkpoint(TRUNCATE)").fetchone()[0] == 0
        other.close()
        assert (run / "controller.db-wal").stat().st_size == 0
        q.add_counters({f"c{step}": 1})
        done += commit_some(q, run, f"b{step + 1}", 2)
    assert len(R.generations(replica_dir)) == 1 and q.replica_status()["failures"] == 0
    q.close()
    R.restore_ledger(replica_dir, tmp_path / "restored.db")
    assert committed_in(tmp_path / "restored.db") == set(done)
    assert _counters(tmp_path / "restored.db") == _counters(run / "controller.db")


def test_the_running_checksum_is_sqlites_in_either_word_order(monkeypatch):
    """walformat.frame_checksums (one matrix product) is SQLite's walChecksumBytes run frame
    after frame (the plain loop), for either word order and any seed; and it is what SQLite
    wrote into a real WAL (the first test's frames are checked against it on every ship)."""
    import random

    from controller.store import walformat as W
    monkeypatch.setattr(W, "CHUNK_FRAMES", 2)  # three frames: two chunks chained
    rng = random.Random(7)
    for page_size in (512, 4096):
        frames = bytes(rng.getrandbits(8) for _ in range(3 * (24 + page_size)))
        for big in (False, True):
            seed = (rng.getrandbits(32), rng.getrandbits(32))
            want, s = [], seed
            for i in range(3):
                f = frames[i * (24 + page_size):(i + 1) * (24 + page_size)]
                s = W._checksum(f[24:], big, W._checksum(f[:8], big, s))
                want.append(s)
            assert W.frame_checksums(frames, page_size, big, seed) == want
