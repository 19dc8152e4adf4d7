"""Lease prefetch on the controller side: a node that registered with `prefetch` may hold
slots + prefetch leases, but the leases beyond its free slots go out only while due work
outnumbers the farm's free slots (an idle slot elsewhere gets the work first). Placement is
checked as the pure function, then through a real BrokerCore on a real queue file."""
from __future__ import annotations

import random

from controller.broker.placement import NodeView, place
from controller.contracts import protocol as P
from controller.store import queue as qm
from controller.store.queue import Due
from tests.broker.test_broker import Harness, result


def leases(out, node: str) -> list[P.Lease]:
    """The leases sent to `node`, out of their `leases` frames (a 0.3 agent takes batches)."""
    return [m for peer, msg in out if peer == node.encode() for m in P.unbatched(msg)
            if isinstance(m, P.Lease)]


def view(slots: int, prefetch: int, held: int = 0, credit: int | None = None) -> NodeView:
    return NodeView("n", b"n", slots, "0.3.0", credit=slots if credit is None else credit,
                    leases={f"r{i}" for i in range(held)}, prefetch=prefetch)


def test_free_counts_the_prefetch_and_ahead_is_the_part_that_would_wait():
    assert (view(1, 0).free(), view(1, 0).ahead()) == (1, 0)
    assert (view(1, 2).free(), view(1, 2).ahead()) == (3, 2)
    assert (view(1, 2, held=1).free(), view(1, 2, held=1).ahead()) == (2, 2)
    assert (view(2, 2, held=3).free(), view(2, 2, held=3).ahead()) == (1, 1)
    assert view(1, 2, held=3).free() == 0
    assert (view(4, 2, credit=0).free(), view(4, 2, credit=0).ahead()) == (2, 2)


def test_prefetch_goes_only_to_work_beyond_the_free_slots():
    """Node a holds the image and could prefetch; b is idle without it. Two due rollouts of
    a's image: one runs on a, the other on b's idle slot, not waiting on a."""
    image_of = {"t1": "sha256:aa"}.get
    images = {"a": {"sha256:aa"}, "b": set()}
    due = [Due("r1", "t1", 1), Due("r2", "t1", 1)]
    free, ahead = {"a": 3, "b": 3}, {"a": 2, "b": 2}
    assert place(due, free, images, image_of) == [("r1", "a"), ("r2", "a")], "the rule without it"
    assert place(due, free, images, image_of, ahead) == [("r1", "a"), ("r2", "b")]
    more = due + [Due(f"r{i}", "t1", 1) for i in range(3, 7)]
    got = place(more, free, images, image_of, ahead)
    assert got[:2] == [("r1", "a"), ("r2", "b")], "the slots first, oldest first"
    assert sorted(n for _, n in got) == ["a"] * 3 + ["b"] * 3, "then up to the prefetch"


def test_place_with_prefetch_never_exceeds_free_and_fills_slots_first_on_random_farms():
    rng = random.Random(7)
    image_of = lambda t: None if t == "t4" else "i" + t[1:]
    for _ in range(500):
        nodes = [f"n{i}" for i in range(rng.randint(0, 8))]
        ahead = {n: rng.randint(0, 2) for n in nodes}
        free = {n: ahead[n] + rng.randint(0, 2) for n in nodes}
        images = {n: {f"i{j}" for j in range(4) if rng.random() < 0.3} for n in nodes}
        due = [Due(f"r{k}", f"t{rng.randint(0, 4)}", 1) for k in range(rng.randint(0, 20))]
        got = place(due, free, images, image_of, ahead)
        per = {n: [m for _, m in got].count(n) for n in nodes}
        assert [r for r, _ in got] == [d.rollout_id for d in due[:len(got)]], "oldest first"
        assert len(got) == min(len(due), sum(free.values()))
        assert all(per[n] <= free[n] for n in nodes)
        running_free = sum(free[n] - ahead[n] for n in nodes)
        waiting = sum(max(per[n] - (free[n] - ahead[n]), 0) for n in nodes)
        assert waiting == max(len(got) - running_free, 0), "a lease waited while a slot idled"


def register(h: Harness, node: str, slots: int, prefetch: int) -> list:
    out = h.send(node, P.Register(node=node, slots=slots, images=[], mem_free_mb=1,
                                  agent_version="0.3.0", prefetch=prefetch))
    return out + h.send(node, P.Ready(node=node, credit=slots))


def test_a_node_with_prefetch_gets_slots_plus_prefetch_leases_only_under_backlog(tmp_path):
    h = Harness(tmp_path)
    register(h, "a", 1, 2)
    register(h, "b", 1, 2)
    h.submit(n=2)
    out = h.tick()
    assert (len(leases(out, "a")), len(leases(out, "b"))) == (1, 1), "idle slots first"
    h.submit(n=10)
    out = h.tick()
    assert (len(leases(out, "a")), len(leases(out, "b"))) == (2, 2), "then the prefetch"
    assert len(h.queue.leases_of("a")) == 3 and h.queue.counts()[qm.QUEUED] == 6
    got = sorted(leases(out, "a"), key=lambda m: m.token)
    out = h.send("a", result(got[0]))
    assert len(leases(out, "a")) == 1, "a lease ended frees one place"
    assert len(h.queue.leases_of("a")) == 3


def test_a_lease_handed_back_unstarted_is_queued_again_and_not_a_failure(tmp_path):
    h = Harness(tmp_path)
    register(h, "a", 1, 1)
    h.submit(n=2)
    waiting = max(leases(h.tick(), "a"), key=lambda m: m.token)
    h.send("a", P.Ready(node="a", credit=0, draining=True), tick=False)
    h.send("a", P.Release(rollout_id=waiting.rollout_id, attempt=waiting.attempt,
                          token=waiting.token, reason="draining: not started"))
    row = h.queue.rollout(waiting.rollout_id)
    assert row["state"] == qm.QUEUED and h.core.counters["released"] == 1
    assert (row["failures"], row["losses"]) == (0, 0), "a hand-back is not a failed attempt"
    again = leases(register(h, "b", 1, 0) + h.tick(), "b")
    assert [m.rollout_id for m in again] == [waiting.rollout_id]
    assert again[0].token > waiting.token
    assert h.queue.rollout(waiting.rollout_id)["attempt"] == again[0].attempt
    h.send("b", result(again[0]))
    assert h.queue.rollout(waiting.rollout_id)["state"] == qm.COMMITTED


def test_a_register_without_prefetch_is_todays_node(tmp_path):
    h = Harness(tmp_path)
    h.register("a", 2)
    h.submit(n=5)
    assert len(leases(h.tick(), "a")) == 2 and h.core.nodes["a"].prefetch == 0
