"""The broker's passes cost what happens in them (controller/broker/timers.py): with nothing
due no node is asked for its free slots, and a pass of heartbeats alone writes nothing to the
queue's file (its commit is no fsync) while the per-frame counters still reach the disk once
a sweep interval, at once with a pass that writes anyway, and at a shutdown. A real queue
file and BrokerCore, driven with a fake clock."""
from __future__ import annotations

from pathlib import Path

import pytest

from controller.broker.placement import NodeView
from controller.contracts import protocol as P
from tests.broker.test_broker import Harness, leases, result


@pytest.fixture
def h(tmp_path):
    return Harness(tmp_path)


def heartbeat(h: Harness, node: str) -> None:
    h.send(node, P.Heartbeat(node=node, slots_free=1, active=0, health={}, held=[]))


def wal_state(h: Harness) -> tuple[int, int]:
    st = Path(str(h.queue.path) + "-wal").stat()
    return st.st_size, st.st_mtime_ns


def asked(monkeypatch) -> list[str]:
    """The nodes whose free slots dispatch computes, in order."""
    calls: list[str] = []
    free = NodeView.free
    monkeypatch.setattr(NodeView, "free", lambda self: calls.append(self.node) or free(self))
    return calls


def test_a_pass_with_nothing_due_asks_no_node(h, monkeypatch):
    for i in range(4):
        h.register(f"n{i}", 1)
    h.submit(n=1)
    (lease,) = leases(h.tick())
    h.send(lease_holder(h, lease), result(lease))
    h.tick()  # the queue has looked: nothing leasable is left
    calls = asked(monkeypatch)
    for _ in range(5):
        h.clock.advance(0.1)
        assert not leases(h.tick())
    assert calls == [], "an idle pass computed the nodes' free slots"
    h.submit(n=2)  # work again: the next pass looks at the nodes, and places it
    assert len(leases(h.tick())) == 2
    assert sorted(set(calls)) == ["n0", "n1", "n2", "n3"]


def test_a_rollout_backing_off_is_placed_once_its_time_comes(h, monkeypatch):
    h.register("n1", 1)
    h.submit(n=1)
    (lease,) = leases(h.tick())
    h.send("n1", result(lease, outcome="infra_error"))  # retried after a backoff (base 1 s)
    not_before = h.queue.rollout(lease.rollout_id)["not_before"]
    calls = asked(monkeypatch)
    while h.clock() < not_before - 0.05:
        assert not leases(h.tick())
        h.clock.advance(0.05)
    calls.clear()
    assert not leases(h.tick()) and calls == []
    h.clock.advance(0.1)
    assert len(leases(h.tick())) == 1 and calls == ["n1"]


def test_a_busy_farm_asks_only_the_nodes_with_news(h, monkeypatch):
    for i in range(20):
        h.register(f"n{i:02d}", 1)
    h.submit(n=30)  # 20 leased, 10 wait: something is due on every pass
    out = h.tick()
    assert len(leases(out)) == 20
    calls = asked(monkeypatch)
    h.tick()
    assert calls == [], "a pass without news looked at full nodes"
    first = leases(out, "n07")[0]
    out = h.send("n07", result(first))  # n07's slot is free again: only n07 is asked
    assert calls == ["n07"]
    assert [m.rollout_id != first.rollout_id for m in leases(out, "n07")] == [True]


def test_heartbeats_alone_write_nothing_and_their_counts_are_saved_once_a_sweep(h):
    h.register("n1", 1)
    h.clock.advance(h.core.sweep_interval_s)
    h.tick()  # everything so far saved
    saved, wal = h.queue.counters()["frames_in"], wal_state(h)
    for _ in range(5):
        heartbeat(h, "n1")
        h.clock.advance(h.core.sweep_interval_s / 10)
    assert h.core.counters["frames_in"] == saved + 5
    assert h.queue.counters()["frames_in"] == saved, "a heartbeat pass saved the counters"
    assert wal_state(h) == wal, "a pass of heartbeats alone wrote to the queue's file"
    h.clock.advance(h.core.sweep_interval_s)
    h.tick()
    assert h.queue.counters()["frames_in"] == saved + 5 == h.core.counters["frames_in"]


def test_a_pass_that_writes_saves_the_frame_counts_with_it(h):
    h.register("n1", 1)
    h.submit(n=1)
    (lease,) = leases(h.tick())
    heartbeat(h, "n1")
    h.send("n1", result(lease))  # no sweep interval has passed: saved with the commit
    persisted = h.queue.counters()
    assert persisted["committed"] == 1
    assert persisted["frames_in"] == h.core.counters["frames_in"]


def test_the_stopping_pass_saves_every_counter(h, tmp_path):
    h.register("n1", 1)
    for _ in range(3):
        heartbeat(h, "n1")
    h.send(b"client", P.Shutdown(reason="test"))
    assert h.core.stopped
    frames_in = h.core.counters["frames_in"]
    h.queue.close()
    again = Harness(tmp_path, h.clock)
    assert again.core.counters["frames_in"] == frames_in


def lease_holder(h: Harness, lease: P.Lease) -> str:
    return h.core.holder[lease.rollout_id][0]


def test_dispatch_stays_work_conserving_under_random_farm_events(tmp_path):
    """Whatever happens to the nodes (registrations, results, releases, credit, drains,
    cancels, silence and loss, expiry), after every pass no node that missed no heartbeat
    has a free slot while a rollout is due: asking only `maybe_free` loses no node."""
    import random
    for seed in range(8):
        rng = random.Random(seed)
        (tmp_path / f"s{seed}").mkdir()
        h = Harness(tmp_path / f"s{seed}")
        batches: list[str] = []
        names = [f"n{i}" for i in range(5)]
        for step in range(80):
            node = rng.choice(names)
            held = [rid for rid, (n, _) in h.core.holder.items() if n == node]
            view = h.core.nodes.get(node)
            roll = rng.random()
            if view is None or roll < 0.05:
                h.register(node, rng.randint(1, 3), held=held if rng.random() < 0.5 else ())
            elif roll < 0.2:
                batches.append(h.submit(n=rng.randint(1, 6)))
            elif roll < 0.45 and held:
                row = h.queue.rollout(rng.choice(held))
                lease = P.Lease(rollout_id=row["rollout_id"], attempt=row["attempt"],
                                token=row["token"], lease_ttl_s=30.0, task={}, seed=0,
                                policy=P.PolicyRef(1, "http://127.0.0.1:9/v1", "m"),
                                run_id="run", run_dir="d", batch_id="b")
                if rng.random() < 0.7:
                    h.send(node, result(lease, rng.choice(["pass", "fail", "infra_error"])))
                else:
                    h.send(node, P.Release(rollout_id=lease.rollout_id, attempt=lease.attempt,
                                           token=lease.token, reason="test"))
            elif roll < 0.6:
                h.send(node, P.Heartbeat(node=node, slots_free=rng.randint(0, view.slots),
                                         active=len(held), health={}, held=held))
            elif roll < 0.7:
                h.send(node, P.Ready(node=node, credit=rng.randint(0, view.slots),
                                     draining=rng.random() < 0.1))
            elif roll < 0.75:
                h.send(b"c", P.DrainNode(node=node, deadline_s=5.0))
            elif roll < 0.8 and batches:
                h.send(b"c", P.Cancel(idem=f"c{step}", batch_id=rng.choice(batches)))
            elif roll < 0.85:
                h.send(node, P.Disconnect(node=node, reason="test"))
            else:
                h.clock.advance(rng.choice([0.3, 1.0, 2.5, 4.0, 31.0]))
            h.tick()
            heard = h.core._heard_since()
            idle = [n.node for n in h.core.nodes.values() if n.last_seen >= heard and n.free() > 0]
            assert not (idle and h.queue.due(1)), (seed, step, idle)
        h.queue.close()
