"""A lost disk in the middle of a real farm run (`paddock run`: the controller, two node agents
running rollouts in real sandboxes, Parquet shards, the scripted policy server), with the
controller replicating to another filesystem ($PADDOCK_REPLICA_DIR on /dev/shm). A second
trainer-side client watches every batch: what it is told is committed is what the trainer
is told. Mid-run the primary run directory is deleted (ledger, WAL, shards, catalog, keys) and
the controller dies with it (kill -9); `paddock store restore` writes a new run directory from
the replica, and every rollout the watcher was told is committed is there exactly once: in
the restored ledger and in the DuckDB views over the restored shards and catalog."""
from __future__ import annotations

import os
import shutil
import signal
import sqlite3
import subprocess
import sys
import tempfile
import threading
from pathlib import Path

import pytest

from controller.analysis.query import connect
from controller.client import Client
from controller.client.api import UnknownBatch
from controller.store.replica import read_status
from tests.conftest import sandbox_prerequisites, wait_for
from tests.farmprocs import descendants, snapshot

pytestmark = [pytest.mark.slow, pytest.mark.sandbox]
ROOT = Path(__file__).resolve().parents[2]
VERSIONS, TASKS = 3, 8


class Watcher(threading.Thread):
    """Follows batches b000001.. as a trainer does (`Client.results`); `told` is every result
    it was handed, in order."""

    def __init__(self, endpoint: str, deployment: str, key_file: Path):
        super().__init__(daemon=True)
        self.client = Client(endpoint, deployment, key_file=key_file, timeout_s=1.0,
                             give_up_s=3.0)
        self.told: list[dict] = []
        self.stop = threading.Event()
        self.error: BaseException | None = None

    def run(self) -> None:
        try:
            for n in range(1, VERSIONS + 1):
                batch = f"b{n:06d}"
                while not self.stop.is_set():
                    try:
                        for item in self.client.results(batch):
                            self.told.append(item)
                        break
                    except UnknownBatch:  # not submitted yet
                        self.stop.wait(0.2)
        except BaseException as exc:  # noqa: BLE001 - the controller died: that is the test
            self.error = exc

    def committed(self) -> list[str]:
        return [i["rollout_id"] for i in list(self.told) if i["state"] == "committed"]


def test_a_primary_deleted_mid_run_restores_with_every_told_commit_once(tmp_path, python_image):
    why = sandbox_prerequisites()
    if why:
        pytest.skip(why)
    replica = Path(tempfile.mkdtemp(prefix="paddock-replica-farm-", dir="/dev/shm"))
    runs = tmp_path / "runs"
    env = {**os.environ, "PYTHONPATH": str(ROOT), "PADDOCK_REPLICA_DIR": str(replica)}
    log = open(tmp_path / "run.log", "wb")
    proc = subprocess.Popen([sys.executable, "-m", "controller.cli", "run", "--versions",
                             str(VERSIONS), "--tasks-limit", str(TASKS), "--runs-dir", str(runs)],
                            env=env, cwd=tmp_path, stdout=log, stderr=subprocess.STDOUT,
                            stdin=subprocess.DEVNULL, start_new_session=True)
    watcher, agents = None, []
    try:
        endpoint_file = wait_for(lambda: next(runs.glob("*/controller.endpoint"), None)
                                 if proc.poll() is None else pytest.fail(
                                     (tmp_path / "run.log").read_text()[-3000:]),
                                 240, "the controller's endpoint")
        run_dir = endpoint_file.parent
        keys = tmp_path / "controller.key"  # the watcher's copy: the primary will be gone
        shutil.copy(run_dir / "controller.key", keys)
        watcher = Watcher(endpoint_file.read_text().strip(), f"local-{run_dir.name}", keys)
        watcher.start()
        wait_for(lambda: len(watcher.committed()) >= 6 or proc.poll() is not None
                 or watcher.error, 300, "six commits told")
        assert watcher.error is None, repr(watcher.error)
        assert proc.poll() is None, "the run ended before the primary was deleted"
        procs = snapshot()
        farm = [procs[pid] for pid in descendants(procs, {proc.pid}) if pid in procs]
        ctl = [p for p in farm if " controller " in f" {p.cmdline} "]
        agents += [p.pid for p in farm if " agent " in f" {p.cmdline} "]
        assert len(ctl) == 1 and len(agents) == 2, farm

        # The lost disk: ledger, WAL, shards, catalog, keys gone from under the running farm
        # (renamed away at once, then deleted while the agents may still write into it).
        lost = tmp_path / "lost"
        os.rename(run_dir, lost)
        shutil.rmtree(lost, ignore_errors=True)
        os.kill(ctl[0].pid, signal.SIGKILL)  # and the controller dies with it
        watcher.stop.set()
        watcher.join(30)
        told = watcher.committed()
        assert len(told) == len(set(told)) >= 6
        status = read_status(replica)
        # a commit between the loss and the kill may fail to ship (its files went with the disk)
        assert status["uncopyable_shards"] == 0, status
        assert status["failures"] == 0 or "No such file" in str(status["last_error"]), status

        restored = tmp_path / "restored"
        out = subprocess.run([sys.executable, "-m", "controller.cli", "store", "restore",
                              "--replica", str(replica), "--to", str(restored)],
                             capture_output=True, text=True, env=env, cwd=tmp_path)
        assert out.returncode == 0, out.stderr
        print(out.stdout.strip(), f"(told before the loss: {len(told)})")
        with sqlite3.connect(restored / "controller.db") as db:
            ledger = dict(db.execute("SELECT rollout_id, state FROM rollouts").fetchall())
        assert all(ledger.get(r) == "committed" for r in told), \
            [r for r in told if ledger.get(r) != "committed"]
        con = connect(restored)
        rows = dict(con.execute("SELECT rollout_id, count(*) FROM rollouts GROUP BY 1").fetchall())
        steps = dict(con.execute("SELECT rollout_id, count(*) FROM steps GROUP BY 1").fetchall())
        assert {r: rows.get(r) for r in told} == {r: 1 for r in told}  # each exactly once
        assert all(steps.get(r, 0) >= 1 for r in told)  # with its record, not just its key
        assert sum(1 for s in ledger.values() if s == "committed") == len(rows)
        assert con.execute("SELECT count(*) FROM bad_shards").fetchone()[0] == 0
    finally:
        if watcher is not None:
            watcher.stop.set()
        for pid in agents:  # SIGTERM: an agent drains and tidies its sandboxes
            os.kill(pid, signal.SIGTERM)
        wait_for(lambda: not any(Path(f"/proc/{pid}").exists() and
                                 "zombie" not in Path(f"/proc/{pid}/status").read_text().lower()
                                 for pid in agents), 120, "the agents to stop")
        if proc.poll() is None:
            proc.send_signal(signal.SIGINT)
            try:
                proc.wait(120)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
        shutil.rmtree(replica, ignore_errors=True)
