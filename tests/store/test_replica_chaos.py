"""The black-box chaos run of tests/broker/test_chaos.py (a controller, three node agents and a
resumable trainer in separate processes, each killed -9 and restarted on a seeded schedule,
agents frozen past their lease TTL) with the controller replicating to another filesystem.
After the run: the ledger restored from the replica holds exactly the rollouts the queue
ended with, in the same final state, attempt and fencing token: every controller restart
started a generation, and no commit was lost across the kills."""
from __future__ import annotations

import shutil
import sqlite3
import tempfile
from pathlib import Path

import pytest

from controller.store import replica as R
from tests.broker import test_chaos

FINAL = "SELECT rollout_id, state, attempt, token FROM rollouts ORDER BY rollout_id"


@pytest.mark.parametrize("seed", [1])
def test_a_chaos_run_with_kills_restores_to_exactly_the_queue_it_ended_with(
        tmp_path, monkeypatch, seed):
    replica = Path(tempfile.mkdtemp(prefix="paddock-replica-chaos-", dir="/dev/shm"))
    monkeypatch.setenv("PADDOCK_REPLICA_DIR", str(replica))
    try:
        test_chaos.run_seed(tmp_path, seed)  # its own checks: each rollout ends once, ...
        gens = R.generations(replica)
        assert len(gens) >= 2, "every controller start begins a generation"
        R.restore_ledger(replica, tmp_path / "restored.db")
        with sqlite3.connect(f"file:{tmp_path / 'run' / 'controller.db'}?mode=ro",
                             uri=True) as db:
            primary = db.execute(FINAL).fetchall()
        with sqlite3.connect(tmp_path / "restored.db") as db:
            restored = db.execute(FINAL).fetchall()
        assert restored == primary and len(primary) == test_chaos.TOTAL
        status = R.read_status(replica)
        assert status is not None and status["failures"] == 0, status
        print(f"seed {seed}: {len(gens)} generations, {len(primary)} rollouts restored equal")
    finally:
        shutil.rmtree(replica, ignore_errors=True)
