"""Black-box chaos: a controller (`python -m controller.broker`), three node agents
(`paddock agent --noop-s`, following the run's endpoint file, with the run's CURVE key) and a
trainer (docs/examples/resumable_trainer.py,
the documented client API only) in separate processes, under a seeded schedule of `kill -9`
of each of them (each restarted at once: the controller on the same port and database) and
agents frozen with SIGSTOP past the lease TTL.

The checks are the user's: every submitted rollout ends exactly once (the trainer's
checkpoint folded each one in once, none twice, and no orphan batch), none was committed
twice, the catalog lists exactly what the queue committed, and the controller never exited
on its own. The time from each controller kill to the next commit is measured, also when
the controller comes back on another port (agents and clients find it through the endpoint
file).

A few seeds run by default (well under a minute); `PADDOCK_CHAOS_SEEDS=N` runs seeds 0..N-1.
"""
from __future__ import annotations

import json
import os
import random
import signal
import sqlite3
import statistics
import subprocess
import sys
import time
from pathlib import Path

import pytest

from controller.store.catalog import Catalog
from tests.broker.test_broker import free_port
from tests.conftest import wait_for

DEP = "dep-chaos"
ROOT = Path(__file__).resolve().parents[2]
TASKS = [f"t{i}" for i in range(20)]
STEPS = 2  # the trainer's steps: one batch of 4 rollouts of each task per step
TOTAL = STEPS * len(TASKS) * 4
HB_S, LEASE_TTL_S = 0.1, 1.0
SEEDS = range(int(os.environ["PADDOCK_CHAOS_SEEDS"])) if os.environ.get(
    "PADDOCK_CHAOS_SEEDS") else (1, 2, 3)
EVENTS = 12  # chaos events per seed, then the faults heal
LATENCIES: list[float] = []  # controller kill -> next commit, over every seed


class Farm:
    """The processes of one seed, each restartable; every PID is one this test started."""

    def __init__(self, tmp: Path, trainer: bool = True):
        self.tmp, self.run_dir = tmp, tmp / "run"
        self.endpoint = f"tcp://127.0.0.1:{free_port()}"
        (tmp / "tasks.json").write_text(json.dumps(
            {t: {"task_id": t, "image_digest": "sha256:aa"} for t in TASKS}))
        self.env = {**os.environ, "PYTHONPATH": str(ROOT), "PADDOCK_RUN_DIR": str(self.run_dir),
                    "PADDOCK_DEPLOYMENT": DEP, "PADDOCK_TASKS": ",".join(TASKS),
                    "TRAINER_CHECKPOINT": str(tmp / "trainer.json"), "TRAINER_STEPS": str(STEPS)}
        self.controller = self.start_controller()
        self.agents = {f"a{i}": self.start_agent(f"a{i}") for i in range(3)}
        self.trainer = self.start_trainer() if trainer else None
        self.frozen: dict[str, float] = {}  # agent -> when to SIGCONT it

    def _spawn(self, args: list[str], log: str) -> subprocess.Popen:
        return subprocess.Popen([sys.executable, *args], cwd=self.tmp, env=self.env,
                                stdout=subprocess.DEVNULL, stderr=open(self.tmp / log, "ab"))

    def start_controller(self, endpoint: str | None = None) -> subprocess.Popen:
        """The controller on the same database; on `endpoint` if given (another port)."""
        self.endpoint = endpoint or self.endpoint
        ep_file = self.run_dir / "controller.endpoint"
        old = ep_file.stat().st_mtime_ns if ep_file.exists() else None
        proc = self._spawn(["-m", "controller.broker", "--bind", self.endpoint, "--deployment", DEP,
                            "--run-dir", str(self.run_dir), "--tasks-json",
                            str(self.tmp / "tasks.json"), "--endpoint-file", str(ep_file),
                            "--heartbeat-interval-s", str(HB_S), "--lease-ttl-s",
                            str(LEASE_TTL_S), "--log-level", "WARNING"], "controller.log")
        wait_for(lambda: (ep_file.exists() and ep_file.stat().st_mtime_ns != old)
                 or proc.poll() is not None, 30, "controller up")
        assert proc.poll() is None, (self.tmp / "controller.log").read_text()[-3000:]
        return proc

    def start_agent(self, node: str) -> subprocess.Popen:
        return self._spawn(["-m", "controller.cli", "agent", "--node", node, "--endpoint-file",
                            str(self.run_dir / "controller.endpoint"), "--deployment", DEP,
                            "--slots", "2", "--noop-s", "0.02",
                            "--heartbeat-interval-s", str(HB_S), "--log-level", "WARNING"],
                           f"{node}.log")

    def start_trainer(self) -> subprocess.Popen:
        return self._spawn([str(ROOT / "docs" / "examples" / "resumable_trainer.py")],
                           "trainer.log")

    def progress(self) -> tuple[int, int]:
        """(the last commit sequence number, rollouts not finished), from the queue file."""
        try:
            with sqlite3.connect(f"file:{self.tmp / 'run' / 'controller.db'}?mode=ro",
                                 uri=True, timeout=5) as db:
                return db.execute(
                    "SELECT COALESCE(MAX(commit_seq), 0), SUM(state NOT IN ('committed',"
                    " 'dead_letter', 'cancelled')) FROM rollouts").fetchone()
        except sqlite3.Error:  # not made yet
            return 0, 0

    def chaos(self, rng: random.Random) -> str:
        """One seeded fault; returns what it was."""
        kind = rng.choices(["controller", "agent", "trainer", "freeze"], [3, 3, 2, 2])[0]
        if kind == "controller":
            assert self.controller.poll() is None, "the controller exited on its own"
            self.controller.kill()
            self.controller.wait()
            self.controller = self.start_controller()
        elif kind == "agent":
            node = rng.choice(sorted(set(self.agents) - set(self.frozen)) or ["a0"])
            self.thaw(node)
            self.agents[node].kill()
            self.agents[node].wait()
            self.agents[node] = self.start_agent(node)
        elif kind == "trainer" and self.trainer.poll() is None:
            self.trainer.kill()
            self.trainer.wait()
            self.trainer = self.start_trainer()
        elif kind == "freeze":
            node = rng.choice(sorted(self.agents))
            if node not in self.frozen:
                self.agents[node].send_signal(signal.SIGSTOP)
                self.frozen[node] = time.monotonic() + LEASE_TTL_S * 1.5
        return kind

    def thaw(self, node: str, now: float | None = None) -> None:
        if node in self.frozen and (now is None or now >= self.frozen[node]):
            del self.frozen[node]
            self.agents[node].send_signal(signal.SIGCONT)

    def stop(self) -> None:
        for node in list(self.frozen):
            self.thaw(node)
        for proc in [self.trainer, *self.agents.values(), self.controller]:
            if proc is None:
                continue
            if proc.poll() is None:
                proc.kill()
            proc.wait()


def run_seed(tmp: Path, seed: int) -> None:
    rng = random.Random(seed)
    farm = Farm(tmp)
    try:
        events, next_at = 0, time.monotonic() + rng.uniform(0.2, 0.8)
        kill: tuple[float, int] | None = None  # a controller kill's time and commit seq
        deadline = time.monotonic() + 90
        while farm.trainer.poll() != 0:
            now = time.monotonic()
            assert now < deadline, f"seed {seed}: the trainer did not finish in 90 s"
            assert farm.trainer.poll() in (None, 0), (tmp / "trainer.log").read_text()[-3000:]
            for node in list(farm.frozen):
                farm.thaw(node, now)
            if kill is not None and farm.progress()[0] > kill[1]:
                LATENCIES.append(now - kill[0])
                kill = None
            if events < EVENTS and now >= next_at:
                events += 1
                seq, unfinished = farm.progress()
                if farm.chaos(rng) == "controller" and unfinished and kill is None:
                    kill = (now, seq)  # work was waiting: how soon does it commit again?
                next_at = time.monotonic() + rng.uniform(0.2, 0.8)
            time.sleep(0.01)
        check(farm, seed)
    finally:
        farm.stop()


def check(farm: Farm, seed: int) -> None:
    assert farm.controller.poll() is None, f"seed {seed}: the controller exited on its own"
    state = json.loads((farm.tmp / "trainer.json").read_text())
    assert len(state["seen"]) == TOTAL, f"seed {seed}: {len(state['seen'])} of {TOTAL} results"
    assert len(set(state["seen"])) == TOTAL, f"seed {seed}: a result was yielded twice"
    with sqlite3.connect(f"file:{farm.run_dir / 'controller.db'}?mode=ro", uri=True) as db:
        rows = db.execute("SELECT rollout_id, state, attempt, token FROM rollouts").fetchall()
        batches = db.execute("SELECT COUNT(*) FROM batches").fetchone()[0]
    assert batches == STEPS, f"seed {seed}: {batches} batches for {STEPS} steps (an orphan)"
    assert sorted(r[0] for r in rows) == sorted(state["seen"]), "every rollout ends once"
    assert {r[1] for r in rows} <= {"committed", "dead_letter"}
    committed = {r[0]: (r[2], r[3]) for r in rows if r[1] == "committed"}
    log = (farm.tmp / "controller.log").read_text(errors="replace")
    assert "Traceback" not in log and "catalog anomaly" not in log, log[-3000:]
    farm.controller.kill()  # the catalog as a restart finds it (no clean-stop flush)
    farm.controller.wait()
    assert Catalog(farm.run_dir).keys() == committed or _flushed_later(farm, committed), \
        f"seed {seed}: catalog != queue"


def _flushed_later(farm: Farm, committed: dict) -> bool:
    """The last commits may still be buffered (the catalog is flushed every sweep, after the
    COMMIT): the catalog is then behind, never ahead, and a restart writes the rest."""
    keys = Catalog(farm.run_dir).keys()
    if any(committed.get(rid) != key for rid, key in keys.items()):
        return False  # a key the queue did not commit: never allowed
    farm.controller = farm.start_controller()
    # It serves before its catalog is open: the catalog is reconciled (the rest written)
    # shortly after. Read without a Catalog, which as a second writer would tidy up files.
    try:
        wait_for(lambda: catalog_keys(farm.run_dir) == committed, 30, "the catalog reconciled")
    except AssertionError:
        return False
    return True


def catalog_keys(run_dir: Path) -> dict:
    """The committed keys the catalog's files list (as Catalog reads them), read only."""
    import pyarrow.parquet as pq
    keys: dict = {}
    for path in sorted((run_dir / "catalog").glob("commit-*.parquet")):
        for row in pq.read_table(path, columns=["rollout_id", "attempt",
                                                "fencing_token"]).to_pylist():
            keys.setdefault(row["rollout_id"], (row["attempt"], row["fencing_token"]))
    return keys


@pytest.mark.parametrize("seed", SEEDS)
def test_chaos_every_rollout_ends_once_and_catalog_equals_queue(tmp_path, seed):
    run_seed(tmp_path, seed)


def test_chaos_controller_kill_to_next_commit_latency_is_recorded():
    """Over the seeds run above, with the other faults going on (printed for the record)."""
    if not LATENCIES:
        pytest.skip("no controller kill with work waiting in the seeds run")
    print(f"under chaos, controller kill -> next commit: n={len(LATENCIES)} median="
          f"{statistics.median(LATENCIES):.2f}s max={max(LATENCIES):.2f}s")


def kill_and_restart(farm, restart, what: str, times: int = 5) -> tuple[list[float], list[float]]:
    """kill -9 the controller while work commits, `restart()` it, `times` times: for each, the
    seconds from the kill to the first new commit, and from the new controller being up."""
    latencies, after_up = [], []
    for _ in range(times):
        seq0 = farm.progress()[0]
        wait_for(lambda: farm.progress()[0] > seq0 + 50, 30, "work committing")
        seq0 = farm.progress()[0]
        t0 = time.monotonic()
        farm.controller.kill()
        farm.controller.wait()
        farm.controller = restart()
        up = time.monotonic()
        wait_for(lambda: farm.progress()[0] > seq0, 10, what)
        latencies.append(time.monotonic() - t0)
        after_up.append(time.monotonic() - up)
    return latencies, after_up


KILLS = 10  # controller kills per port case


@pytest.mark.parametrize("port", ["same", "other"])
def test_controller_kill_to_first_new_commit_median_1s_max_3s(tmp_path, port):
    """Work queued, three live agents and a client that know only the run directory: kill -9
    the controller while work commits and start it again on the same database -- on the same
    port, or on ANOTHER one (agents and the client find it through the endpoint file: the
    agents look the moment the controller's connection drops) -- ten times. The first new
    commit follows the kill within 1 s (median) and 3 s (max), the new process's start
    included (it serves before its catalog, and pyarrow, are loaded). Asserted on a machine
    up to twice as busy as its cores (measured: median 0.65 s, max 1.2 s at a load of 6 on
    2 cores); beyond that only the recovery once the new controller is up (median <= 0.5 s)
    is, the rest reported."""
    load0 = os.getloadavg()[0]
    farm = Farm(tmp_path, trainer=False)
    try:
        from controller.client.api import Client
        with Client.for_run(farm.run_dir, DEP) as c:
            c.publish_policy(1, "http://127.0.0.1:9/v1")
            c.submit(TASKS, 5000, 1)
            endpoints = []

            def restart():
                endpoints.append(farm.endpoint)
                if port == "same":
                    return farm.start_controller()
                ctl = farm.start_controller(f"tcp://127.0.0.1:{free_port()}")
                assert farm.endpoint != endpoints[-1]
                return ctl
            latencies, after_up = kill_and_restart(farm, restart, f"a commit ({port} port)",
                                                   times=KILLS)
            assert c.status().counts["queued"] >= 0  # the client followed too
            assert c.endpoint == farm.endpoint
        print(f"controller kill -> first new commit, {port} port: median "
              f"{statistics.median(latencies):.2f}s max {max(latencies):.2f}s "
              f"{[round(x, 2) for x in latencies]}; after the new one was up: "
              f"{[round(x, 2) for x in after_up]} (load {os.getloadavg()[0]:.1f})")
        assert statistics.median(after_up) <= 0.5, after_up
        if max(load0, os.getloadavg()[0]) <= 2 * (os.cpu_count() or 1):
            assert statistics.median(latencies) <= 1.0, latencies
            assert max(latencies) <= 3.0, latencies
    finally:
        farm.stop()
