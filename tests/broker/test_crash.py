"""Kill the controller at each fault point of its commit path, restart it on the same files,
and check the one commit point: the catalog shows exactly what the queue committed.

The controller runs in a child process (this file run as `python -m tests.broker.test_crash`) whose
fault hook (controller/store/faults.py) calls `os._exit` at the chosen point, once two
results and a watch of their (then finished) batch are in the pass: so every point is reached
with committed work in flight, deterministically (no sockets are read: frames are handed to
`Controller.step`). The parent then restarts the controller in-process, checks catalog =
queue, loses the agent (its leases go back), commits every rollout under new tokens, and
checks again: no controller exit, nothing committed twice.
"""
from __future__ import annotations

import os
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from controller.broker import daemon
from controller.broker.daemon import Controller
from controller.contracts import protocol as P
from controller.store import faults
from controller.store.catalog import Catalog

DEP = "dep-crash-test"
ROOT = Path(__file__).resolve().parents[2]
TASKS = {"t1": {"task_id": "t1", "image_digest": "sha256:aa"}}
KILLED = 77  # the child's exit code when its fault hook fired
CLIENT, AGENT = b"client-1", b"agent-n1"


def controller(tmp: Path, fault=faults.no_fault) -> Controller:
    return Controller("tcp://127.0.0.1:0", DEP, str(tmp / "run"), "run", TASKS,
                      str(tmp / "q.db"), fault=fault, heartbeat_interval_s=60.0)


def frame(identity: bytes, msg: P.Message) -> list[bytes]:
    return [identity, P.encode(msg, DEP)]


def register(node: str = "n1", held=()) -> P.Register:
    return P.Register(node=node, slots=4, images=[], mem_free_mb=1000, agent_version="0.3.0",
                      held=list(held))


def results_of(ctl: Controller) -> list[list[bytes]]:
    return [frame(AGENT, P.Result(rollout_id=h.rollout_id, attempt=h.attempt, token=h.token,
                                  outcome="pass", reward=1.0, shards={}, infra_reason=None,
                                  idem=f"r:{h.rollout_id}:{h.token}"))
            for h in ctl.queue.held_leases()]


def child(point: str, tmp: Path) -> None:
    """Run up to the fault point and die there (exit KILLED); exit 0 if it was never hit."""
    armed = [False]

    def hook(name: str) -> None:
        if armed[0] and name == point:
            os._exit(KILLED)
    ctl = controller(tmp, hook)
    ctl.step([frame(CLIENT, P.PublishPolicy(idem="p1", version=1, endpoint="http://x/v1",
                                            model="m")),
              frame(CLIENT, P.Submit(idem="s1", tasks=["t1"], n_per_task=2, policy_version=1)),
              frame(AGENT, register())])
    assert len(ctl.queue.held_leases()) == 2, "both rollouts leased to n1"
    armed[0] = True
    ctl.step(results_of(ctl) + [frame(CLIENT, P.Watch(batch_id="b000001", after=0))])
    os._exit(0)


def committed_keys(ctl: Controller) -> dict:
    return {r["rollout_id"]: (r["attempt"], r["token"]) for r in ctl.queue.committed_rows()}


def assert_one_commit_point(ctl: Controller, tmp: Path) -> None:
    assert ctl.catalog.keys() == committed_keys(ctl), "catalog = queue (in memory)"
    ctl.catalog.flush()
    assert Catalog(tmp / "run").keys() == committed_keys(ctl), "catalog = queue (on disk)"


@pytest.mark.parametrize("point", faults.COMMIT_PATH)
def test_a_kill_at_each_commit_path_fault_point_leaves_catalog_equal_to_queue(tmp_path, point):
    proc = subprocess.run([sys.executable, "-m", "tests.broker.test_crash", point, str(tmp_path)],
                          cwd=ROOT, env={**os.environ, "PYTHONPATH": str(ROOT)},
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == KILLED, f"fault point {point} not reached: {proc.stderr[-2000:]}"
    ctl = controller(tmp_path)
    committed = committed_keys(ctl)
    assert len(committed) == (0 if point == faults.QUEUE_BEFORE_COMMIT else 2)
    assert_one_commit_point(ctl, tmp_path)
    # The agent is gone: a new one under the same name registers holding nothing, its
    # leases go back to the queue and are leased again under new tokens.
    ctl.step([frame(b"agent-n1-again", register())])
    ctl.step(results_of(ctl))
    assert ctl.core.counters["catalog_conflicts"] == 0
    assert len(committed_keys(ctl)) == 2 and ctl.queue.counts()["committed"] == 2
    assert_one_commit_point(ctl, tmp_path)
    ctl.sock.close(linger=0)
    ctl.queue.close()
    again = controller(tmp_path)  # a third incarnation: nothing to reconcile
    assert again.core.counters["catalog_ahead_at_start"] == 0
    assert_one_commit_point(again, tmp_path)


def test_a_catalog_ahead_of_the_queue_is_rebuilt_at_start_and_counted(tmp_path):
    """What an older controller left (the catalog flushed inside the open transaction): a key
    the queue never committed. The restart rebuilds the catalog from the queue, counts the
    anomaly, and the rollout then commits under its new token without a conflict."""
    ctl = controller(tmp_path)
    ctl.step([frame(CLIENT, P.PublishPolicy(idem="p1", version=1, endpoint="http://x/v1",
                                            model="m")),
              frame(CLIENT, P.Submit(idem="s1", tasks=["t1"], n_per_task=1, policy_version=1)),
              frame(AGENT, register())])
    (held,) = ctl.queue.held_leases()
    ctl.sock.close(linger=0)
    ctl.queue.close()
    stale = Catalog(tmp_path / "run")
    stale.commit(held.rollout_id, held.attempt, held.token, {}, 1.7e9)
    stale.flush()
    ctl = controller(tmp_path)
    assert ctl.core.counters["catalog_ahead_at_start"] == 1
    assert ctl.catalog.keys() == {}
    ctl.step([frame(b"agent-n1-again", register())])
    ctl.step(results_of(ctl))
    assert ctl.core.counters["catalog_conflicts"] == 0
    (key,) = committed_keys(ctl).values()
    assert key[1] != held.token, "committed under the new token"
    assert_one_commit_point(ctl, tmp_path)
    assert list((tmp_path / "run" / "catalog").glob("retired-commit-*.parquet"))


def test_a_catalog_conflict_is_a_counted_anomaly_not_a_controller_exit(tmp_path):
    ctl = controller(tmp_path)
    ctl.step([frame(CLIENT, P.PublishPolicy(idem="p1", version=1, endpoint="http://x/v1",
                                            model="m")),
              frame(CLIENT, P.Submit(idem="s1", tasks=["t1"], n_per_task=1, policy_version=1)),
              frame(AGENT, register())])
    (held,) = ctl.queue.held_leases()
    ctl.catalog.commit(held.rollout_id, held.attempt, held.token + 1000, {}, 1.7e9)
    ctl.step(results_of(ctl))
    assert ctl.core.counters["catalog_conflicts"] == 1
    assert ctl.queue.counts()["committed"] == 1, "the queue is the truth"
    ctl.step([frame(CLIENT, P.Status())])  # and the controller serves on


def test_keys_committed_while_the_catalog_opens_in_the_background_reach_it_once(
        tmp_path, monkeypatch):
    """The daemon serves before its catalog is open (a thread reads it). A catalog ahead of
    the queue, still opening while a rollout commits under its new token: the commit is
    held back, and once the catalog is open it is rebuilt from the queue (the anomaly
    counted), the held key handed over -- catalog = queue, no conflict."""
    ctl = controller(tmp_path)
    ctl.step([frame(CLIENT, P.PublishPolicy(idem="p1", version=1, endpoint="http://x/v1",
                                            model="m")),
              frame(CLIENT, P.Submit(idem="s1", tasks=["t1"], n_per_task=2, policy_version=1)),
              frame(AGENT, register())])
    held = ctl.queue.held_leases()
    ctl.sock.close(linger=0)
    ctl.queue.close()
    stale = Catalog(tmp_path / "run")
    stale.commit(held[0].rollout_id, held[0].attempt, held[0].token, {}, 1.7e9)
    stale.flush()
    gate = threading.Event()

    def opening(*args, **kw):
        assert gate.wait(30), "the test never let the catalog open"
        return Catalog(*args, **kw)
    monkeypatch.setattr(daemon, "Catalog", opening)
    ctl = Controller("tcp://127.0.0.1:0", DEP, str(tmp_path / "run"), "run", TASKS,
                     str(tmp_path / "q.db"), heartbeat_interval_s=60.0,
                     catalog_in_background=True)
    assert ctl.catalog is None
    ctl.step([frame(b"agent-n1-again", register())])
    ctl.step(results_of(ctl))
    assert ctl.queue.counts()["committed"] == 2 and ctl.catalog is None
    gate.set()
    ctl.wait_catalog()
    assert ctl.core.counters["catalog_ahead_at_start"] == 1
    assert ctl.core.counters["catalog_conflicts"] == 0
    assert_one_commit_point(ctl, tmp_path)


if __name__ == "__main__":
    child(sys.argv[1], Path(sys.argv[2]))
