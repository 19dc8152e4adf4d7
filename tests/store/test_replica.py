"""The trajectory store's second copy (controller/store/replica.py, restore.py): the ledger
shipped frame by frame after each COMMIT and restored as of any point in time, the committed
shards copied, failures counted and caught up, and the replica directory's errors. Real
SQLite files, a replica on another filesystem (/dev/shm) where the test needs one."""
from __future__ import annotations

import json
import os
import sqlite3
import subprocess
import sys
from pathlib import Path

import pytest

from controller.store import replica as R
from controller.store.queue import QueueConfig, RolloutQueue
from controller.store.restore import restore_run
from tests.conftest import FakeClock

ROOT = Path(__file__).resolve().parents[2]
SHM = Path("/dev/shm")


@pytest.fixture
def replica_dir(tmp_path):
    """A replica directory on another filesystem than tmp_path (tmpfs), removed after."""
    import shutil
    import tempfile
    d = Path(tempfile.mkdtemp(prefix="paddock-replica-", dir=SHM))
    yield d
    shutil.rmtree(d, ignore_errors=True)


def open_queue(run: Path, replica: Path, clock: FakeClock, **kw) -> RolloutQueue:
    run.mkdir(exist_ok=True)
    return RolloutQueue(run / "controller.db", clock=clock,
                        config=QueueConfig(replica_dir=str(replica), **kw))


def commit_some(q: RolloutQueue, run: Path, tag: str, n: int) -> list[str]:
    """Submit n rollouts, lease them and commit each with a one-table shard written first
    (as a node agent does); return their ids."""
    q.submit_batch(tag, [("t", 1)], n)
    done = []
    for lease in q.lease_next("n1", n):
        rel = f"rollouts/n1-{lease.rollout_id}-a{lease.attempt}-t{lease.token}.parquet"
        (run / "rollouts").mkdir(parents=True, exist_ok=True)
        (run / rel).write_bytes(f"shard of {lease.rollout_id}".encode())
        c = q.complete(lease.rollout_id, lease.attempt, lease.token, "pass", 1.0,
                       {"rollouts": rel}, None, f"c-{lease.rollout_id}")
        assert c.committed
        done.append(lease.rollout_id)
    return done


def committed_in(db: Path) -> set[str]:
    with sqlite3.connect(db) as con:
        return {r[0] for r in con.execute("SELECT rollout_id FROM rollouts WHERE state = "
                                          "'committed'")}


def test_every_acknowledged_commit_is_on_the_replica_and_restores_as_of_any_time(
        tmp_path, replica_dir):
    clock = FakeClock()
    run = tmp_path / "run"
    q = open_queue(run, replica_dir, clock, replica_keep_generations=10)
    q._db.execute("PRAGMA wal_autocheckpoint=8")  # the WAL restarts many times on the way
    marks = []  # (time, rollouts committed by then)
    done: set[str] = set()
    for step in range(12):
        clock.advance(10)
        done |= set(commit_some(q, run, f"b{step}", 25))
        marks.append((clock.now, set(done)))
        if step == 5:  # a reopen starts a new generation: restore crosses it
            q.close()
            q = open_queue(run, replica_dir, clock, replica_keep_generations=10)
            q._db.execute("PRAGMA wal_autocheckpoint=8")
    assert q.replica_status()["in_sync"] and q.replica_status()["lag_s"] == 0
    q.close()
    assert len(R.generations(replica_dir)) == 2
    for i, (at, expected) in enumerate(marks):
        dest = tmp_path / f"restored-{i}.db"
        R.restore_ledger(replica_dir, dest, at=at + 5)
        assert committed_in(dest) == expected, f"as of mark {i}"
    with pytest.raises(R.ReplicaError, match="no generation .* is as old as"):
        R.restore_ledger(replica_dir, tmp_path / "too-early.db", at=marks[0][0] - 3600)
    newest = R.restore_ledger(replica_dir, tmp_path / "newest.db")
    assert committed_in(tmp_path / "newest.db") == done and newest.records > 0


def test_restore_run_brings_back_the_ledger_the_shards_and_the_catalog(tmp_path, replica_dir):
    from controller.store.catalog import Catalog
    clock = FakeClock()
    run = tmp_path / "run"
    q = open_queue(run, replica_dir, clock)
    done = commit_some(q, run, "b", 30)
    q.close()
    import shutil
    shutil.rmtree(run)  # the primary is lost
    res = restore_run(replica_dir, tmp_path / "restored")
    assert res.committed == 30 and res.shards == 30 and res.missing == ()
    restored = tmp_path / "restored"
    assert committed_in(restored / "controller.db") == set(done)
    assert set(Catalog(restored).keys()) == set(done)
    for p in (restored / "rollouts").iterdir():
        assert p.read_bytes().startswith(b"shard of ")
    with pytest.raises(R.ReplicaError, match="not empty"):
        restore_run(replica_dir, restored)


def test_a_rollout_committed_without_its_record_on_the_replica_is_queued_again_by_the_restore(
        tmp_path, replica_dir):
    """A commit the primary made after its disk was lost can reach the replica's ledger without
    its shard (a real farm run: the run directory deleted, a commit before the controller's
    kill). The restore used to keep it committed without a record (and exit 1); it is queued
    again, named, and the restored run is consistent: its views show only what has a record."""
    from controller.store.catalog import Catalog
    clock = FakeClock()
    run = tmp_path / "run"
    q = open_queue(run, replica_dir, clock)
    done = commit_some(q, run, "b", 10)
    q.close()
    lost_id = done[3]
    [shard] = (replica_dir / R.RUN_DIR / "rollouts").glob(f"n1-{lost_id}-*.parquet")
    shard.unlink()
    res = restore_run(replica_dir, tmp_path / "restored")
    restored = tmp_path / "restored"
    assert res.requeued == (lost_id,) and len(res.missing) == 1 and res.committed == 9
    assert committed_in(restored / "controller.db") == set(done) - {lost_id}
    assert set(Catalog(restored).keys()) == set(done) - {lost_id}
    q = RolloutQueue(restored / "controller.db", clock=clock)
    try:
        assert [lease.rollout_id for lease in q.lease_next("n2", 5)] == [lost_id]
    finally:
        q.close()


def test_a_failing_replica_is_counted_as_lag_and_caught_up_without_losing_a_commit(
        tmp_path, replica_dir):
    clock = FakeClock()
    run = tmp_path / "run"
    q = open_queue(run, replica_dir, clock)
    first = commit_some(q, run, "b0", 5)
    away = replica_dir.with_name(replica_dir.name + "-away")
    os.rename(replica_dir / "run", away)  # the replica's shard directory is gone
    (replica_dir / "run").write_text("not a directory")
    try:
        clock.advance(1)
        second = commit_some(q, run, "b1", 5)  # the farm keeps committing meanwhile
        clock.advance(7)
        status = q.replica_status()
        assert not status["in_sync"] and status["lag_s"] == pytest.approx(7)
        assert status["failures"] == 5 and "Error" in status["last_error"]
        assert status["pending_shards"] == 10  # the replica's shard directory went: all
    finally:
        (replica_dir / "run").unlink()
        os.rename(away, replica_dir / "run")
    from controller.broker.ledger import Ledger
    ledger = Ledger(q, None)
    ledger.save_counters()  # the status counters (and the metrics) show the failures
    assert ledger.counters["replica_failures"] == 5 and q.counters()["replica_failures"] == 5
    third = commit_some(q, run, "b2", 5)  # healed: a new generation, in sync again
    assert q.replica_status()["in_sync"] and q.replica_status()["lag_s"] == 0
    q.close()
    R.restore_ledger(replica_dir, tmp_path / "r.db")
    assert committed_in(tmp_path / "r.db") == set(first + second + third)
    assert len(list((replica_dir / "run" / "rollouts").iterdir())) == 15


def test_a_torn_log_tail_is_ignored_and_a_corrupt_record_ends_the_restore(tmp_path, replica_dir):
    clock = FakeClock()
    run = tmp_path / "run"
    q = open_queue(run, replica_dir, clock)
    done = commit_some(q, run, "b", 10)
    q.close()
    (_, gen), = R.generations(replica_dir)
    with open(gen / R.LOG, "ab") as fh:  # a crash mid-append
        fh.write(R.RECORD.pack(R.RECORD_MAGIC, clock.now, 3, 4096, 0) + b"\0" * 100)
    R.restore_ledger(replica_dir, tmp_path / "a.db")
    assert committed_in(tmp_path / "a.db") == set(done)
    data = bytearray((gen / R.LOG).read_bytes())
    data[R.RECORD.size + 40] ^= 0xFF  # the first record's frames corrupted
    (gen / R.LOG).write_bytes(bytes(data))
    res = R.restore_ledger(replica_dir, tmp_path / "b.db")
    assert res.records == 0 and committed_in(tmp_path / "b.db") == set()


def test_replica_directory_errors_name_the_path(tmp_path, replica_dir):
    with pytest.raises(R.ReplicaError, match=f"replica directory {tmp_path / 'nope'} does not "
                       "exist"):
        R.check_replica_dir(tmp_path / "nope", tmp_path)
    (tmp_path / "file").write_text("")
    with pytest.raises(R.ReplicaError, match="is not a directory"):
        R.check_replica_dir(tmp_path / "file", tmp_path)
    with pytest.raises(R.ReplicaError, match="/sys is not writable"):
        R.check_replica_dir("/sys", tmp_path)
    with pytest.raises(R.ReplicaError, match="inside the run directory"):
        (tmp_path / "inside").mkdir()
        R.check_replica_dir(tmp_path / "inside", tmp_path)
    (tmp_path / "same").mkdir()
    (tmp_path / "run").mkdir()
    [warning] = R.check_replica_dir(tmp_path / "same", tmp_path / "run")
    assert "same filesystem" in warning and "not a lost disk" in warning
    assert R.check_replica_dir(replica_dir, tmp_path / "run") == []
    with pytest.raises(R.ReplicaError, match="does not exist"):  # the controller refuses at start
        RolloutQueue(tmp_path / "run" / "controller.db",
                     config=QueueConfig(replica_dir=str(tmp_path / "nope")))
    with pytest.raises(ValueError, match="queue.replica_dir"):
        QueueConfig(replica_dir="")
    RolloutQueue(tmp_path / "run" / "controller.db",
                 config=QueueConfig(replica_dir=str(replica_dir))).close()
    (tmp_path / "other-run").mkdir()
    with pytest.raises(R.ReplicaError, match="holds the replica of run .*run .not .*other-run"):
        RolloutQueue(tmp_path / "other-run" / "controller.db",
                     config=QueueConfig(replica_dir=str(replica_dir)))


def test_paddock_store_commands(tmp_path, replica_dir):
    clock = FakeClock(now=1_800_000_000.0)
    run = tmp_path / "run"
    q = open_queue(run, replica_dir, clock)
    first = commit_some(q, run, "b0", 4)
    clock.advance(100)
    commit_some(q, run, "b1", 4)
    q.close()

    def paddock(*args):
        return subprocess.run([sys.executable, "-m", "controller.cli", "store", *args],
                              capture_output=True, text=True, cwd=ROOT,
                              env={**os.environ, "PYTHONPATH": str(ROOT)})
    out = paddock("restore", "--replica", str(replica_dir), "--to", str(tmp_path / "r1"),
                  "--at", "2027-01-15T08:00:50Z")  # 1_800_000_050: between the two batches
    assert out.returncode == 0, out.stderr
    assert committed_in(tmp_path / "r1" / "controller.db") == set(first)
    assert "4 committed rollouts, 4 shards copied" in out.stdout
    out = paddock("restore", "--replica", str(replica_dir), "--to", str(tmp_path / "r2"),
                  "--at", "yesterday")
    assert out.returncode == 2 and "'yesterday' is not a time" in out.stderr
    out = paddock("restore", "--replica", str(tmp_path), "--to", str(tmp_path / "r3"))
    assert out.returncode == 2 and "is not a Paddock replica" in out.stderr
    out = paddock("status", "--replica", str(replica_dir), "--json", "--max-lag-s", "1e12")
    assert out.returncode == 0, out.stderr
    assert json.loads(out.stdout)["in_sync"] is True
    out = paddock("status", "--replica", str(replica_dir), "--max-age-s", "1")
    assert out.returncode == 1  # the status was written by a clock far from now (the future): stale
    out = paddock("check", "--replica", str(tmp_path / "nope"), "--run", str(run))
    assert out.returncode == 2 and "does not exist" in out.stderr


def test_a_deleted_run_directory_keeps_replicating_from_the_open_files(tmp_path, replica_dir):
    """The run directory's names are gone (the queue file, its WAL, the shards), the queue
    process goes on committing: the replicator reads the WAL through its open descriptor."""
    import shutil
    clock = FakeClock()
    run = tmp_path / "run"
    q = open_queue(run, replica_dir, clock)
    before = commit_some(q, run, "b0", 5)
    shutil.rmtree(run)
    after = commit_some(q, run, "b1", 5)  # the agents' shards land in a directory made anew
    assert q.replica_status()["in_sync"]
    q.close()
    res = restore_run(replica_dir, tmp_path / "restored")
    assert res.committed == 10 and res.missing == ()
    assert committed_in(tmp_path / "restored" / "controller.db") == set(before + after)


def test_the_controller_takes_the_replica_directory_from_its_environment(tmp_path):
    from controller.broker.config import REPLICA_ENV, load
    assert load({}, {REPLICA_ENV: "/mnt/other"}).queue.replica_dir == "/mnt/other"
    assert load({"replica_dir": "/given"}, {REPLICA_ENV: "/mnt/other"}).queue.replica_dir == \
        "/given"
    assert load({}, {}).queue.replica_dir is None


def test_a_shard_that_cannot_be_copied_is_counted_and_does_not_stall_replication(
        tmp_path, replica_dir):
    clock = FakeClock()
    run = tmp_path / "run"
    q = open_queue(run, replica_dir, clock)
    q.submit_batch("b", [("t", 1)], 3)
    bad = {"rollouts": "/etc/passwd", "steps": "steps/never-written.parquet",
           "checks": "../../escape.parquet"}
    for lease, shards in zip(q.lease_next("n1", 3), [bad, {}, {}]):
        q.complete(lease.rollout_id, lease.attempt, lease.token, "pass", 1.0, shards, None,
                   f"c{lease.rollout_id}")
    later = commit_some(q, run, "b2", 3)
    status = q.replica_status()
    assert status["in_sync"] and status["failures"] == 0
    assert status["uncopyable_shards"] == 3 and status["shards_copied"] == 3
    assert not (replica_dir / "run" / "escape.parquet").exists()
    q.close()
    R.restore_ledger(replica_dir, tmp_path / "r.db")
    assert set(later) <= committed_in(tmp_path / "r.db")


def test_a_wal_truncated_by_another_connection_between_commits_starts_a_generation(
        tmp_path, replica_dir):
    """An operator's `PRAGMA wal_checkpoint(TRUNCATE)` right after a COMMIT, before the
    replicator read its frames: they are only in the database file now, so a new snapshot."""
    clock = FakeClock()
    run = tmp_path / "run"
    q = open_queue(run, replica_dir, clock)
    first = commit_some(q, run, "b0", 3)
    real = q.replica._ship

    def truncated_first(now):
        other = sqlite3.connect(run / "controller.db")
        other.execute("PRAGMA wal_checkpoint(TRUNCATE)")
        other.close()
        q.replica._ship = real
        return real(now)
    q.replica._ship = truncated_first
    second = commit_some(q, run, "b1", 1)
    assert len(R.generations(replica_dir)) == 2
    third = commit_some(q, run, "b2", 3)
    q.close()
    R.restore_ledger(replica_dir, tmp_path / "r.db")
    assert committed_in(tmp_path / "r.db") == set(first + second + third)


def test_a_replica_wiped_mid_run_is_rebuilt_by_the_next_commit_but_never_recreated_itself(
        tmp_path, replica_dir):
    import shutil
    clock = FakeClock()
    run = tmp_path / "run"
    q = open_queue(run, replica_dir, clock)
    first = commit_some(q, run, "b0", 3)
    for child in replica_dir.iterdir():  # someone cleared it: its contents are gone
        shutil.rmtree(child) if child.is_dir() else child.unlink()
    second = commit_some(q, run, "b1", 3)
    assert q.replica_status()["in_sync"]  # a new generation, with every shard copied again
    shutil.rmtree(replica_dir)  # the replica's mount went: its root is not made again
    commit_some(q, run, "b2", 1)
    assert not replica_dir.exists() and not q.replica_status()["in_sync"]
    replica_dir.mkdir()
    third = commit_some(q, run, "b3", 2)
    assert q.replica_status()["in_sync"]
    q.close()
    res = restore_run(replica_dir, tmp_path / "restored")
    assert committed_in(tmp_path / "restored" / "controller.db") >= set(first + second + third)
    assert res.missing == ()
