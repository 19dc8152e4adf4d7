"""Broker: the decision logic driven sans-I/O on a real SQLite queue (credit, placement,
liveness, re-registration, bad frames, drain, cancel, long poll, status), then real ZeroMQ
sockets: agents in threads and in processes, SIGTERM drain, and kill -9 of a real controller
process restarted on the same database."""
from __future__ import annotations

import dataclasses
import json
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
import zmq

from controller.broker.core import BrokerCore
from controller.broker.daemon import Controller
from controller.broker.placement import place
from controller.contracts import protocol as P
from controller.ondisk.keys import read_key_file
from controller.store import queue as qm
from controller.store.queue import Due, QueueConfig, RolloutQueue
from nodeagent.agent.attempt import AttemptResult
from nodeagent.agent.core import RECONNECT, WATCH_FIRST_S, AgentCore, EndpointNews
from nodeagent.agent.daemon import EXIT_GAVE_UP, EndpointFile, NodeAgent, noop_runner
from tests.conftest import FakeClock

DEP = "dep-broker-test"
ROOT = Path(__file__).resolve().parents[2]
TASKS = {"t1": {"task_id": "t1", "image_digest": "sha256:aa"},
         "t2": {"task_id": "t2", "image_digest": "sha256:bb"}}


class Harness:
    """A BrokerCore on a real queue file, fed encoded frames, with a fake clock."""

    def __init__(self, path: Path, clock: FakeClock | None = None, **core_kw):
        self.path, self.clock = path, clock or FakeClock()
        self.queue = RolloutQueue(path / "q.db", clock=self.clock,
                                  config=QueueConfig(lease_ttl_s=30, backoff_base_s=1))
        core_kw.setdefault("heartbeat_interval_s", 1.0)
        core_kw.setdefault("liveness", 3)
        self.core = BrokerCore(self.queue, TASKS, DEP, "run", str(path), clock=self.clock,
                               wall=self.clock, **core_kw)

    def frame(self, peer: bytes, data: bytes, tick: bool = True) -> list[tuple[bytes, P.Message]]:
        with self.queue.batch():
            self.core.receive(peer, data)
            if tick:
                self.core.tick()
        return self.core.take_outbox()

    def send(self, peer: bytes | str, msg: P.Message,
             tick: bool = True) -> list[tuple[bytes, P.Message]]:
        peer = peer.encode() if isinstance(peer, str) else peer
        return self.frame(peer, P.encode(msg, DEP), tick)

    def tick(self) -> list[tuple[bytes, P.Message]]:
        with self.queue.batch():
            self.core.tick()
        return self.core.take_outbox()

    def register(self, node: str, slots: int, images=(), held=()) -> list:
        out = self.send(node, P.Register(node=node, slots=slots, images=list(images),
                                         mem_free_mb=1, agent_version="0.2.0", held=list(held)))
        return out + self.send(node, P.Ready(node=node, credit=slots))

    def submit(self, tasks=("t1",), n=1, policy=1) -> str:
        if self.queue.policy(policy) is None:
            self.send(b"client", P.PublishPolicy(idem=f"p{policy}", version=policy,
                                                 endpoint="http://127.0.0.1:9/v1", model="m"))
        out = self.send(b"client", P.Submit(idem=f"s{time.monotonic_ns()}", tasks=list(tasks),
                                            n_per_task=n, policy_version=policy), tick=False)
        return next(m.batch_id for _, m in out if isinstance(m, P.Submitted))


def leases(out, node: str | None = None) -> list[P.Lease]:
    return [m for peer, m in out if isinstance(m, P.Lease) and (node is None or peer == node.encode())]


def of_type(out, cls):
    return [m for _, m in out if isinstance(m, cls)]


def result(lease: P.Lease, outcome="pass", idem=None) -> P.Result:
    return P.Result(rollout_id=lease.rollout_id, attempt=lease.attempt, token=lease.token,
                    outcome=outcome, reward=1.0 if outcome == "pass" else None, shards={},
                    infra_reason="boom" if outcome == "infra_error" else None,
                    idem=idem or f"{lease.rollout_id}:{lease.token}")


@pytest.fixture
def h(tmp_path):
    return Harness(tmp_path)


# ---- placement and credit ---------------------------------------------------------------

def test_place_prefers_a_node_with_the_image_then_the_most_free_slots():
    due = [Due("r1", "t1", 1), Due("r2", "t2", 1), Due("r3", "t2", 1), Due("r4", "t9", 1)]
    images = {"a": {"sha256:aa"}, "b": set(), "c": {"sha256:bb"}}
    image_of = {"t1": "sha256:aa", "t2": "sha256:bb"}.get
    got = place(due, {"a": 1, "b": 3, "c": 1}, images, image_of)
    assert got == [("r1", "a"), ("r2", "c"), ("r3", "b"), ("r4", "b")]


def test_place_never_assigns_more_than_the_free_slots():
    due = [Due(f"r{i}", "t1", 1) for i in range(10)]
    got = place(due, {"a": 2, "b": 1, "c": 0}, {}, lambda _: None)
    assert len(got) == 3 and [n for _, n in got].count("a") == 2


def test_place_is_the_greedy_rule_oldest_first_on_random_farms():
    """The rule, spelled out the slow way: each due rollout in turn goes to the node with the
    most free slots (ties: the larger name) among those holding its image, else among all."""
    import random

    def greedy(due, free, images, image_of):
        free, out = {n: k for n, k in free.items() if k > 0}, []
        for d in due:
            if not free:
                break
            pool = [n for n in free if image_of(d.task_ref) in images.get(n, ())]
            node = max(pool or free, key=lambda n: (free[n], n))
            out.append((d.rollout_id, node))
            free[node] -= 1
            if not free[node]:
                del free[node]
        return out
    rng = random.Random(4)
    image_of = lambda t: None if t == "t4" else "i" + t[1:]
    for _ in range(500):
        nodes = [f"n{i}" for i in range(rng.randint(0, 10))]
        free = {n: rng.randint(0, 3) for n in nodes}
        images = {n: {f"i{j}" for j in range(4) if rng.random() < 0.3} for n in nodes}
        due = [Due(f"r{k}", f"t{rng.randint(0, 4)}", 1) for k in range(rng.randint(0, 25))]
        assert place(due, free, images, image_of) == greedy(due, free, images, image_of)


def test_a_node_never_holds_more_leases_than_its_slots(h):
    h.register("n1", 2)
    h.submit(n=5)
    got = leases(h.tick(), "n1")
    assert len(got) == 2
    assert leases(h.tick()) == [] and h.queue.counts()[qm.LEASED] == 2
    out = h.send("n1", result(got[0]))
    assert len(leases(out, "n1")) == 1, "a finished lease frees exactly one slot"
    assert len(h.queue.leases_of("n1")) == 2


def test_credit_zero_means_no_leases(h):
    h.register("n1", 4)
    h.send("n1", P.Ready(node="n1", credit=0))
    h.submit(n=3)
    assert leases(h.tick()) == []
    assert len(leases(h.send("n1", P.Ready(node="n1", credit=1)))) == 1


def test_dispatch_prefers_the_node_that_holds_the_image(h):
    h.register("plain", 4)
    h.register("cached", 4, images=["sha256:bb"])
    h.submit(tasks=("t2",), n=3)
    out = h.tick()
    assert len(leases(out, "cached")) == 3 and leases(out, "plain") == []


def test_submit_needs_known_tasks_and_a_published_policy(h):
    out = h.send(b"c", P.Submit(idem="x", tasks=["nope"], n_per_task=1, policy_version=1))
    assert [(a.ok, a.code) for a in of_type(out, P.Ack)] == [(False, "unknown_task")]
    out = h.send(b"c", P.Submit(idem="x", tasks=["t1"], n_per_task=1, policy_version=7))
    assert [(a.ok, a.code) for a in of_type(out, P.Ack)] == [(False, "unknown_policy")]
    assert sum(h.queue.counts().values()) == 0


def test_a_policy_republished_at_a_new_endpoint_is_what_the_next_leases_name(h):
    """A restarted trainer (a requeued job) serves its policy again on another port: the version
    moves, leases made from then on carry the new endpoint; other weights under it are refused."""
    h.register("n1", 1)
    h.submit(n=2)
    [first] = leases(h.tick(), "n1")
    assert first.policy.endpoint == "http://127.0.0.1:9/v1"
    out = h.send(b"client", P.PublishPolicy(idem="moved", version=1, endpoint="http://127.0.0.1:10/v1",
                                            model="m"))
    assert [a.ok for a in of_type(out, P.Ack)] == [True]
    [second] = leases(h.send("n1", result(first)), "n1")
    assert second.policy.endpoint == "http://127.0.0.1:10/v1"
    out = h.send(b"client", P.PublishPolicy(idem="other", version=1, endpoint="http://127.0.0.1:10/v1",
                                            model="other-weights"))
    assert [(a.ok, a.code) for a in of_type(out, P.Ack)] == [(False, "policy_conflict")]
    assert h.queue.policy(1).model == "m"


# ---- liveness and re-registration -------------------------------------------------------

def test_a_silent_node_is_declared_lost_and_its_leases_go_to_a_live_one(h):
    h.register("n1", 2)
    h.submit(n=2)
    assert len(leases(h.tick(), "n1")) == 2
    h.register("n2", 2)
    h.clock.advance(2.0)
    h.send("n2", P.Heartbeat(node="n2", slots_free=2, active=0, health={}))
    h.clock.advance(1.5)  # n1 silent 3.5 s > 3 x 1 s; n2 silent 1.5 s
    out = h.tick()
    assert len(leases(out, "n2")) == 2
    nodes = {n["node"]: n for n in h.core.snapshot()["nodes"]}
    assert nodes["n1"]["state"] == "lost" and nodes["n2"]["state"] == "live"
    assert nodes["n1"]["last_seen"] == pytest.approx(h.clock.now - 3.5)
    reasons = [a["reason"] for a in h.queue.attempts("b000001-00000")]
    assert reasons[0].startswith("node_lost")


def test_a_node_that_missed_a_heartbeat_gets_no_new_lease(h):
    h.register("n1", 4)
    h.register("n2", 4)
    h.clock.advance(2.5)  # n1 silent 2.5 intervals: missed a heartbeat, not yet lost (3)
    h.send("n2", P.Heartbeat(node="n2", slots_free=4, active=0, health={}))
    h.submit(n=3)
    out = h.tick()
    assert len(leases(out, "n2")) == 3 and not leases(out, "n1")
    h.send("n1", P.Heartbeat(node="n1", slots_free=4, active=0, health={}))
    h.submit(n=1)
    assert len(leases(h.tick(), "n1")) == 1, "heard from again: leases again"


def test_status_counters_survive_a_controller_restart(h, tmp_path):
    h.register("n1", 2)
    h.submit(n=2)
    for lease in leases(h.tick(), "n1"):
        h.send("n1", result(lease))
    h.frame(b"peer", b"\x00 not json")
    before = h.core.snapshot()["counters"]
    assert before["committed"] == 2 and before["dropped"]
    h.queue.close()
    again = Harness(tmp_path, h.clock)
    after = again.core.snapshot()["counters"]
    assert after["committed"] == 2 and after["dispatched"] == before["dispatched"]
    assert after["dropped"] == before["dropped"]


def test_shutdown_reaches_an_agent_told_to_register_that_has_not_yet(h):
    h.register("n1", 1)
    out = h.send("ghost", P.Heartbeat(node="ghost", slots_free=1, active=0, health={}))
    assert of_type(out, P.Welcome), "a stranger is told to register"
    out = h.send(b"client", P.Shutdown(reason="done"))
    told = {peer for peer, m in out if isinstance(m, P.Shutdown)}
    assert told == {b"n1", b"ghost"} and h.core.stopped


def test_a_lost_node_stays_listed_for_a_while_then_is_forgotten(tmp_path):
    h = Harness(tmp_path, lost_keep_s=100)
    h.register("n1", 1)
    h.clock.advance(10)
    h.tick()
    assert [n["state"] for n in h.core.snapshot()["nodes"]] == ["lost"]
    h.clock.advance(100)
    h.tick()
    assert h.core.snapshot()["nodes"] == []


def test_heartbeats_renew_the_leases_of_the_node(h):
    h.register("n1", 1)
    h.submit(n=1)
    (lease,) = leases(h.tick())
    for _ in range(40):  # 40 s > the 30 s lease TTL, heartbeats every second
        h.clock.advance(1.0)
        h.send("n1", P.Heartbeat(node="n1", slots_free=0, active=1, health={}))
    assert h.queue.rollout(lease.rollout_id)["state"] == qm.LEASED
    assert of_type(h.send("n1", result(lease)), P.Ack)[0].ok


def test_controller_heartbeats_go_to_idle_nodes_spread_over_the_interval(h):
    nodes = [f"n{i}" for i in range(8)]
    for n in nodes:
        h.register(n, 1)
    sent: dict[str, list[float]] = {n: [] for n in nodes}
    for _ in range(40):  # 4 s in steps of 0.1 s; n0 is sent something every step
        h.clock.advance(0.1)
        out = h.send("n0", P.Heartbeat(node="n0", slots_free=1, active=0, health={}))
        out += h.send("client", P.Status())
        h.core._send(b"n0", P.Ack(ref="x", ok=True))
        out += h.core.take_outbox()
        for peer, m in out:
            if isinstance(m, P.Heartbeat) and peer.decode() in sent:
                sent[peer.decode()].append(h.clock.now)
    assert sent["n0"] == [], "a node sent frames anyway needs no heartbeat"
    for n in nodes[1:]:
        gaps = [b - a for a, b in zip(sent[n], sent[n][1:])]
        assert len(sent[n]) >= 3 and all(0.45 <= g <= 1.0 * 1.25 + 0.11 for g in gaps), (n, gaps)
    assert len({round(sent[n][0], 1) for n in nodes[1:]}) > 1, "not all at the same instant"


def test_re_registration_keeps_the_leases_the_agent_still_holds_and_releases_the_rest(h):
    h.register("n1", 3)
    h.submit(n=3)
    a, b, c = leases(h.tick())
    h.register("n1", 3, held=[a.rollout_id])
    assert h.queue.rollout(a.rollout_id)["token"] == a.token, "the held lease is kept"
    assert h.queue.rollout(b.rollout_id)["token"] != b.token, "the others were released"
    assert of_type(h.send("n1", result(a)), P.Ack)[0].ok


def test_after_a_controller_restart_a_stranger_gets_a_welcome_and_its_result_still_counts(tmp_path):
    h = Harness(tmp_path)
    h.register("n1", 1)
    h.submit(n=1)
    (lease,) = leases(h.tick())
    del h.core  # the controller dies; the queue file stays
    h2 = Harness(tmp_path, clock=h.clock)
    out = h2.send("n1", result(lease))
    assert of_type(out, P.Ack)[0].ok, "the still-valid token commits"
    (welcome,) = of_type(out, P.Welcome)
    assert welcome.session == h2.core.session
    assert h2.queue.counts()[qm.COMMITTED] == 1


# ---- infrastructure failures: whose fault ------------------------------------------------

def _fail_with(h: Harness, reason: str, times: int) -> list[str]:
    """Lease the one rollout to n1 and fail it `times` times with `reason` (each time past
    its backoff, n1 heard from); the rollout's state after each."""
    states = []
    for _ in range(times):
        h.clock.advance(31.0)  # past any backoff (backoff_max_s 30)
        got = leases(h.send("n1", P.Heartbeat(node="n1", slots_free=1, active=0, health={})),
                     "n1")
        if not got:
            break
        msg = result(got[0], "infra_error")
        h.send("n1", dataclasses.replace(msg, infra_reason=reason))
        states.append(h.queue.rollout(got[0].rollout_id)["state"])
    return states


def test_an_unreachable_model_server_never_counts_toward_the_tasks_max_attempts(h):
    """The model server down (`model_server: ...`, what a node reports when it refuses
    connections): the attempts are infrastructure losses, counted toward max_node_losses
    (10), never the task's max_attempts (4) -- six in a row do not dead-letter the task."""
    h.register("n1", 1)
    h.submit(n=1)
    states = _fail_with(h, "model_server: model server http://127.0.0.1:9/v1 "
                                    "unreachable: [Errno 111] Connection refused", 6)
    assert states == [qm.RETRY_WAIT] * 6
    (row,) = h.queue.rollouts()
    assert (row["failures"], row["losses"]) == (0, 6)
    assert _fail_with(h, "sandbox_start: cannot mount the image", 1) == [qm.RETRY_WAIT]


def test_a_task_that_fails_its_own_set_up_is_dead_lettered_at_max_attempts(h):
    """Task-caused infrastructure failures (a malformed task, its set-up failing) stay on
    the task's limit: the fourth one dead-letters it."""
    h.register("n1", 1)
    h.submit(n=1)
    assert _fail_with(h, "task: the lease task has no 'instruction'", 2) == \
        [qm.RETRY_WAIT] * 2
    assert _fail_with(h, "setup: pip install exited 1", 3) == \
        [qm.RETRY_WAIT, qm.DEAD_LETTER]


# ---- bad input ----------------------------------------------------------------------------

def test_bad_frames_are_counted_by_reason_and_dropped(h):
    good = json.loads(P.encode(P.Status(), DEP))
    frames = {
        "bad_json": b"\xff{not json",
        "wrong_version": json.dumps({**good, "v": 99}).encode(),
        "foreign_deployment": json.dumps({**good, "dep": "other"}).encode(),
        "unknown_type": json.dumps({**good, "type": "hello"}).encode(),
        "bad_field": json.dumps({**good, "type": "ready", "body": {"node": 1}}).encode(),
        "too_large": b"x" * (P.MAX_FRAME_BYTES + 1),
    }
    for data in frames.values():
        assert h.frame(b"evil", data) == []
    out = h.send(b"evil", P.Welcome(node="x", heartbeat_interval_s=1, liveness=1))
    assert of_type(out, P.Ack)[0].code == "unexpected"
    dropped = h.core.snapshot()["counters"]["dropped"]
    assert dropped == {**dict.fromkeys(frames, 1), "unexpected_type": 1}
    assert of_type(h.send(b"c", P.Status()), P.StatusReply)


def test_results_for_unknown_rollouts_and_stale_tokens_are_rejected_and_change_nothing(h):
    h.register("n1", 1)
    h.submit(n=1)
    (lease,) = leases(h.tick())
    fake = P.Lease(**{**lease.__dict__, "rollout_id": "b999999-00000"})
    assert of_type(h.send("n1", result(fake)), P.Reject)[0].reason == "unknown_rollout"
    stale = P.Lease(**{**lease.__dict__, "token": lease.token + 5})
    assert of_type(h.send("n1", result(stale, idem="z")), P.Reject)[0].reason == "stale_token"
    before = h.queue.rollouts()
    assert before[0]["state"] == qm.LEASED


def test_a_duplicate_completion_gets_the_same_answer_and_never_changes_the_commit(h):
    h.register("n1", 1)
    h.submit(n=1)
    (lease,) = leases(h.tick())
    assert of_type(h.send("n1", result(lease)), P.Ack)[0].ok
    committed = h.queue.rollouts()
    assert of_type(h.send("n1", result(lease)), P.Ack)[0].ok, "same idem: the stored reply"
    other = result(lease, outcome="fail", idem="different")
    assert of_type(h.send("n1", other), P.Reject)[0].reason == "stale_token"
    assert h.queue.rollouts() == committed
    assert h.core.counters["committed"] == 1


def test_an_agent_that_speaks_batches_gets_one_leases_and_one_acks_frame_per_pass(h):
    for node, version in (("new", "0.3.0"), ("old", "0.2.0")):
        h.send(node, P.Register(node=node, slots=3, images=[], mem_free_mb=1,
                                agent_version=version))
        h.send(node, P.Ready(node=node, credit=3))
    h.submit(n=6)
    out = h.tick()
    (batch,) = [m for peer, m in out if peer == b"new"]
    assert isinstance(batch, P.LeaseBatch) and len(batch.items) == 3
    old = [m for peer, m in out if peer == b"old"]
    assert len(old) == 3 and all(isinstance(m, P.Lease) for m in old)
    stale = P.Result(**{**result(batch.items[2]).__dict__, "token": 999, "idem": "z"})
    results = [result(lease) for lease in batch.items[:2]] + [stale]
    out = h.send("new", P.ResultBatch(items=results))
    acks = of_type(out, P.AckBatch)
    assert [a.refs for a in acks] == [[results[0].id, results[1].id]]
    assert [(r.rollout_id, r.reason) for r in of_type(out, P.Reject)] == [
        (stale.rollout_id, "stale_token")]
    assert h.core.counters["committed"] == 2
    again = h.send("new", P.ResultBatch(items=results[:2]))  # a duplicated batch: same answer
    assert [a.refs for a in of_type(again, P.AckBatch)] == [[results[0].id, results[1].id]]
    assert h.core.counters["committed"] == 2


def test_batched_messages_keep_their_order_around_other_messages(h):
    h.send("n1", P.Register(node="n1", slots=4, images=[], mem_free_mb=1,
                            agent_version="0.3.0"))
    core = h.core
    lease = lambda i: P.Lease(rollout_id=f"r{i}", attempt=1, token=i, lease_ttl_s=1.0,
                              task={}, policy=P.PolicyRef(1, "e", "m"), seed=0, run_id="r",
                              run_dir="/", batch_id="b")
    core.outbox = [(b"n1", lease(1)), (b"c", P.Ack(ref="x", ok=True)), (b"n1", lease(2)),
                   (b"n1", P.Drain()), (b"n1", lease(3)), (b"n1", P.Ack(ref="y", ok=True)),
                   (b"n1", P.Ack(ref="z", ok=False, code="bad_request"))]
    out = core.take_outbox()
    kinds = [(peer, m.TYPE) for peer, m in out]
    assert kinds == [(b"n1", "leases"), (b"c", "ack"), (b"n1", "drain"), (b"n1", "leases"),
                     (b"n1", "ack")]
    assert [x.rollout_id for x in out[0][1].items] == ["r1", "r2"] and not out[0][1].acks
    assert [x.rollout_id for x in out[3][1].items] == ["r3"] and out[3][1].acks == ["y"]
    assert out[4][1].code == "bad_request"  # a refusal is never folded into a batch


def test_a_result_naming_unknown_shard_tables_is_rejected_before_the_queue(h):
    h.register("n1", 1)
    h.submit(n=1)
    (lease,) = leases(h.tick())
    bad = P.Result(**{**result(lease).__dict__, "shards": {"../../etc": "x"}})
    assert of_type(h.send("n1", bad), P.Reject)[0].reason == "bad_request"
    assert h.queue.rollout(lease.rollout_id)["state"] == qm.LEASED


# ---- drain, cancel, watch, status -------------------------------------------------------

def test_drain_node_stops_dispatch_and_a_release_is_not_a_failure(h):
    h.register("n1", 2)
    h.submit(n=3)
    a, b = leases(h.tick())
    out = h.send(b"c", P.DrainNode(node="n1", deadline_s=5.0))
    assert of_type(out, P.Drain)[0].deadline_s == 5.0 and of_type(out, P.Ack)[0].ok
    assert of_type(h.send("n1", result(a)), P.Ack)[0].ok
    assert leases(h.tick()) == [], "a draining node gets nothing new"
    out = h.send("n1", P.Release(rollout_id=b.rollout_id, attempt=b.attempt, token=b.token,
                                 reason="drain deadline"))
    assert of_type(out, P.Ack)[0].ok
    row = h.queue.rollout(b.rollout_id)
    assert (row["state"], row["failures"]) == (qm.QUEUED, 0)
    h.send("n1", P.Disconnect(node="n1", reason="drained"))
    node = h.core.snapshot()["nodes"][0]
    assert (node["state"], node["active"], node["slots_free"], node["leases"]) == ("drained", 0, 0, 0)
    out = h.send(b"c", P.DrainNode(node="ghost"))
    assert of_type(out, P.Ack)[0].code == "unknown_node"


def test_cancel_tells_the_holder_and_finishes_the_batch(h):
    h.register("n1", 1)
    batch = h.submit(n=3)
    (lease,) = leases(h.tick())
    out = h.send(b"c", P.Cancel(idem="k", batch_id=batch))
    assert of_type(out, P.Cancelled)[0].rollouts == 3
    rejects = [(p, m.reason) for p, m in out if isinstance(m, P.Reject)]
    assert rejects == [(b"n1", "cancelled")]
    again = h.send(b"c", P.Cancel(idem="k", batch_id=batch))
    assert of_type(again, P.Cancelled)[0].rollouts == 3, "a duplicate gets the first reply"
    assert of_type(h.send(b"c", P.Cancel(idem="q", batch_id="nope")), P.Ack)[0].code == \
        "unknown_batch"


def test_watch_long_poll_answers_on_commit_or_at_its_deadline(h):
    h.register("n1", 1)
    batch = h.submit(n=2)
    (lease,) = leases(h.tick())
    assert h.send(b"w", P.Watch(batch_id=batch, after=0, wait_s=10)) == []
    out = h.send("n1", result(lease))
    (res,) = of_type(out, P.Results)
    assert [i["rollout_id"] for i in res.items] == [lease.rollout_id] and not res.done
    assert of_type(h.send(b"w", P.Watch(batch_id=batch, after=res.cursor, wait_s=5)),
                   P.Results) == []
    h.clock.advance(5)
    (empty,) = of_type(h.tick(), P.Results)
    assert empty.items == [] and empty.cursor == res.cursor


def test_status_reply_is_the_ops_contract(h):
    h.register("n1", 2)
    h.send("n1", P.Heartbeat(node="n1", slots_free=2, active=0, health={"cpu_percent": 3.0}))
    h.submit(n=1)
    h.tick()
    (reply,) = of_type(h.send(b"c", P.Status()), P.StatusReply)
    (node,) = reply.nodes
    assert set(node) == {"node", "state", "last_seen", "slots", "slots_free", "leases", "active",
                         "agent_version", "health"}
    assert (node["state"], node["leases"], node["health"]) == ("live", 1, {"cpu_percent": 3.0})
    assert reply.counts[qm.LEASED] == 1
    assert reply.counters["dispatched"] == 1 and reply.counters["dropped"] == {}


# ---- real sockets -------------------------------------------------------------------------

class Farm:
    """A real Controller (thread) and real NodeAgents (threads) over ZeroMQ on 127.0.0.1."""

    def __init__(self, tmp: Path, bind="tcp://127.0.0.1:0", hb_s=0.1, **ctl_kw):
        self.tmp = tmp
        self.ctl = Controller(bind, DEP, str(tmp / "run"), "run", TASKS, str(tmp / "q.db"),
                              heartbeat_interval_s=hb_s, liveness=5, **ctl_kw)
        self.endpoint, self.key_file = self.ctl.endpoint, self.ctl.key_file
        self.keys = read_key_file(self.key_file)  # what every peer of the run loads
        self.hb_s = hb_s
        self.threads = [threading.Thread(target=self.ctl.serve, daemon=True)]
        self.threads[0].start()
        self.agents: list[NodeAgent] = []

    def agent(self, node: str, slots: int = 2, runner=None, **kw) -> NodeAgent:
        kw.setdefault("keys", self.keys)
        a = NodeAgent(node, self.endpoint, DEP, slots, runner=runner or noop_runner(),
                      heartbeat_interval_s=self.hb_s, **kw)
        t = threading.Thread(target=a.run, daemon=True)
        t.start()
        self.agents.append(a)
        self.threads.append(t)
        return a

    def stop(self) -> None:
        for a in self.agents:
            a.stopped = True
        self.ctl.core.stopped = True
        for t in self.threads:
            t.join(10)


@pytest.fixture
def farm(tmp_path):
    f = Farm(tmp_path)
    yield f
    f.stop()


def client(endpoint, key_file, **kw):
    """A client of the controller at `endpoint` with the run's keys (`key_file`)."""
    from controller.client.api import Client
    kw["key_file"] = key_file
    kw.setdefault("timeout_s", 2.0)
    kw.setdefault("give_up_s", 20.0)
    kw.setdefault("watch_wait_s", 0.5)
    return Client(endpoint, DEP, **kw)


def test_rollouts_flow_through_real_sockets_each_committed_once(farm):
    farm.agent("n1", 3)
    farm.agent("n2", 3)
    with client(farm.endpoint, farm.key_file) as c:
        c.publish_policy(1, "http://127.0.0.1:9/v1")
        batch = c.submit(["t1", "t2"], 50, 1)
        items = c.wait(batch)
    assert len(items) == 100 and len({i["rollout_id"] for i in items}) == 100
    assert {i["state"] for i in items} == {"committed"}
    assert {i["node"] for i in items} == {"n1", "n2"}


def stuck_runner():
    """(runner, started, gate): the runner signals `started`, then holds its slot until `gate`."""
    gate, started = threading.Event(), threading.Event()

    def stuck(a):
        started.set()
        gate.wait(30)
        return AttemptResult("pass", 1.0, {}, None)
    return stuck, started, gate


def test_drain_hands_back_unfinished_work_which_another_node_finishes(farm):
    stuck, started, gate = stuck_runner()
    stuck_agent = farm.agent("stuck", 1, runner=stuck)
    with client(farm.endpoint, farm.key_file) as c:
        c.publish_policy(1, "http://127.0.0.1:9/v1")
        batch = c.submit(["t1"], 1, 1)
        assert started.wait(10)
        c.drain("stuck", deadline_s=0.2)
        farm.agent("fresh", 1)
        items = c.wait(batch)
    gate.set()
    assert [i["node"] for i in items] == ["fresh"]
    q = RolloutQueue(farm.tmp / "q.db")
    (row,) = q.rollouts()
    assert (row["state"], row["failures"]) == ("committed", 0), "a handback is no failure"
    assert [a["outcome"] for a in q.attempts(row["rollout_id"])] == ["released", "pass"]
    assert stuck_agent.draining


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def spawn_controller(tmp: Path, endpoint: str, lease_ttl_s: float = 2.0) -> subprocess.Popen:
    (tmp / "tasks.json").write_text(json.dumps(TASKS))
    ep_file = tmp / f"endpoint-{time.monotonic_ns()}"
    proc = subprocess.Popen(
        [sys.executable, "-m", "controller.broker", "--bind", endpoint, "--deployment", DEP,
         "--run-dir", str(tmp / "run"), "--tasks-json", str(tmp / "tasks.json"),
         "--endpoint-file", str(ep_file), "--heartbeat-interval-s", "0.1",
         "--db", str(tmp / "q.db"),
         "--lease-ttl-s", str(lease_ttl_s), "--log-level", "WARNING"],
        cwd=ROOT, stdout=subprocess.DEVNULL, stderr=open(tmp / "controller.log", "ab"))
    deadline = time.monotonic() + 20
    while not ep_file.exists():  # poll for the file the controller publishes when bound
        assert proc.poll() is None, (tmp / "controller.log").read_text()
        assert time.monotonic() < deadline, "controller did not start"
        time.sleep(0.02)
    return proc


def spawn_agent(tmp: Path, endpoint: str, node: str, noop_s: float, slots: int = 2,
                drain_s: float = 30.0) -> subprocess.Popen:
    return subprocess.Popen(
        [sys.executable, "-m", "controller.cli", "agent", "--node", node, "--controller", endpoint,
         "--key-file", str(tmp / "run" / "controller.key"), "--deployment", DEP, "--slots", str(slots), "--noop-s", str(noop_s),
         "--heartbeat-interval-s", "0.1", "--drain-deadline-s", str(drain_s),
         "--log-level", "WARNING"],
        cwd=ROOT, stdout=subprocess.DEVNULL, stderr=open(tmp / f"{node}.log", "ab"))


def test_kill_9_of_the_controller_mid_run_then_restart_on_the_same_db(tmp_path):
    endpoint = f"tcp://127.0.0.1:{free_port()}"
    ctl = spawn_controller(tmp_path, endpoint)
    agents = [spawn_agent(tmp_path, endpoint, f"a{i}", noop_s=0.01) for i in range(2)]
    try:
        with client(endpoint, tmp_path / "run" / "controller.key") as c:
            c.publish_policy(1, "http://127.0.0.1:9/v1")
            batch = c.submit(["t1"], 120, 1)
            seen = []
            deadline = time.monotonic() + 120
            for item in c.results(batch):
                assert time.monotonic() < deadline, f"only {len(seen)} results in 120 s"
                seen.append(item)
                if len(seen) == 30:
                    ctl.send_signal(signal.SIGKILL)
                    ctl.wait()
                    ctl = spawn_controller(tmp_path, endpoint)
        ids = [i["rollout_id"] for i in seen]
        assert len(ids) == 120 and len(set(ids)) == 120, "none lost, none twice"
        q = RolloutQueue(tmp_path / "q.db")
        assert q.counts()[qm.COMMITTED] == 120
        from controller.store.catalog import Catalog
        assert Catalog(tmp_path / "run").committed_count() == 120
        for a in agents:
            assert a.poll() is None, "agents carry on by themselves"
    finally:
        for p in agents + [ctl]:
            p.kill()
            p.wait()


def test_sigterm_drains_a_real_agent_process_and_nothing_is_lost(tmp_path):
    endpoint = f"tcp://127.0.0.1:{free_port()}"
    ctl = spawn_controller(tmp_path, endpoint, lease_ttl_s=30)
    agent = spawn_agent(tmp_path, endpoint, "slow", noop_s=0.3, slots=2, drain_s=0.1)
    try:
        with client(endpoint, tmp_path / "run" / "controller.key") as c:
            c.publish_policy(1, "http://127.0.0.1:9/v1")
            batch = c.submit(["t1"], 6, 1)
            deadline = time.monotonic() + 60
            while not any(n["node"] == "slow" and n["leases"] for n in c.status().nodes):
                assert time.monotonic() < deadline, "the agent never got work"
            agent.send_signal(signal.SIGTERM)
            assert agent.wait(20) == 0
            state = {n["node"]: n["state"] for n in c.status().nodes}
            assert state["slow"] == "drained"      # it left cleanly: not LOST
            spawn = spawn_agent(tmp_path, endpoint, "other", noop_s=0.0)
            try:
                items = c.wait(batch)
            finally:
                spawn.kill()
                spawn.wait()
        assert len({i["rollout_id"] for i in items}) == 6
        q = RolloutQueue(tmp_path / "q.db")
        assert all(r["failures"] == 0 for r in q.rollouts()), "a drain is no failure"
    finally:
        for p in (agent, ctl):
            p.kill()
            p.wait()


def curve_dealer(keys) -> zmq.Socket:
    """A raw DEALER holding the run's keys (a peer of the run, speaking garbage)."""
    sock = zmq.Context.instance().socket(zmq.DEALER)
    sock.setsockopt(zmq.LINGER, 0)
    sock.curve_serverkey = keys.server_public.encode()
    sock.curve_publickey = keys.client_public.encode()
    sock.curve_secretkey = keys.client_secret.encode()
    return sock


def test_garbage_over_a_real_socket_is_counted_and_the_controller_keeps_serving(farm):
    sock = curve_dealer(farm.keys)
    sock.connect(farm.endpoint)
    try:
        good = json.loads(P.encode(P.Status(), DEP))
        sock.send(b"\x00\x01 not json")
        sock.send(json.dumps({**good, "v": 2}).encode())
        sock.send(json.dumps({**good, "dep": "someone-else"}).encode())
        sock.send(json.dumps({**good, "type": "launch_missiles"}).encode())
        sock.send_multipart([b"two", b"frames"])
        sock.send(b"{" + b" " * (2 * P.MAX_FRAME_BYTES) + b"}")  # over 1 MiB, under 4 MiB
        sock.send(P.encode(P.Result(rollout_id="b999-00000", attempt=1, token=1, outcome="pass",
                                    reward=1.0, shards={}, infra_reason=None, idem="x"), DEP))
        replies = []
        while not any(isinstance(m, P.Reject) for m in replies):
            assert sock.poll(10_000)
            replies.append(P.decode(sock.recv(), DEP))
        assert [type(m) for m in replies] == [P.Welcome, P.Reject], "a stranger: register!"
        assert replies[1].reason == "unknown_rollout"
        with client(farm.endpoint, farm.key_file) as c:
            counters = c.status().counters
    finally:
        sock.close(linger=0)
    assert counters["dropped"] == {"bad_json": 1, "wrong_version": 1, "foreign_deployment": 1,
                                   "unknown_type": 1, "multipart": 1, "too_large": 1}
    assert counters["rejected_unknown_rollout"] == 1


def test_a_worker_waking_the_agent_during_its_read_is_not_lost(tmp_path):
    """The loop reads the wake-up pipe, then clears the flag: a worker finishing in between
    either sees the flag set (its result is drained after the clear) or writes a new byte.
    The invariant that makes results wake the loop: flag set => a byte is in the pipe."""
    agent = NodeAgent("n1", "tcp://127.0.0.1:1", DEP, 2, runner=noop_runner(), insecure=True)
    real = agent._wake_r

    class WorkerFinishesDuringRead:
        def read(self, n):
            agent._wake()  # a worker thread's result, at the worst moment
            return real.read(n)

        def fileno(self):
            return real.fileno()

    agent._wake()
    agent._wake_r = WorkerFinishesDuringRead()
    agent._take_wakeup()
    agent._wake_r = real
    assert not agent._woken or real.read(4096), "flag set with no byte: the loop sleeps on"
    agent._wake()
    assert agent._woken and real.read(4096) == b"!", "the next result wakes the loop"


# ---- versions ----------------------------------------------------------------------------

def test_an_agent_version_the_controller_does_not_take_is_refused_at_registration(h):
    out = h.send("n1", P.Register(node="n1", slots=2, images=[], mem_free_mb=1,
                                  agent_version="0.0.9"))
    (refused,) = of_type(out, P.Refused)
    assert refused.reason == "agent_version" and "0.0.9" in refused.detail
    assert "n1" not in h.core.nodes and h.core.counters["refused_agents_agent_version"] == 1


def test_a_register_of_another_protocol_version_gets_a_refusal_every_version_reads(h):
    reg = json.loads(P.encode(P.Register(node="n2", slots=2, images=[], mem_free_mb=1,
                                         agent_version="9.0"), DEP))
    out = h.frame(b"n2", json.dumps({**reg, "v": 2}).encode())
    (peer, refused), = out
    assert peer == b"n2" and refused.reason == "protocol_version" and "2" in refused.detail
    assert h.core.dropped[P.WRONG_VERSION] == 1 and "n2" not in h.core.nodes
    frame = json.loads(P.encode(refused, DEP))
    frame["v"] = 7  # what an agent of another protocol version still reads
    assert P.refusal(json.dumps(frame).encode(), DEP) == refused.detail
    garbage = h.frame(b"n3", json.dumps({**reg, "v": 2, "type": "heartbeat"}).encode())
    assert garbage == [], "only a register is answered; other frames are just dropped"


def test_a_refused_agent_logs_why_and_exits(farm, monkeypatch, caplog):
    import nodeagent.agent.daemon as agent_mod
    monkeypatch.setattr(agent_mod, "AGENT_VERSION", "0.0.1")
    a = NodeAgent("old", farm.endpoint, DEP, 1, runner=noop_runner(), heartbeat_interval_s=0.2,
                  keys=farm.keys)
    with caplog.at_level("ERROR", logger="nodeagent"):
        assert a.run() == agent_mod.EXIT_REFUSED
    assert "0.0.1" in a.refused and "refused this agent" in caplog.text
    assert farm.ctl.core.counters["refused_agents_agent_version"] == 1


# ---- finding the controller again (agent side) ---------------------------------------------


def welcomed_core(watch, clock: FakeClock, **kw) -> AgentCore:
    core = AgentCore("n1", 2, DEP, heartbeat_interval_s=1.0, liveness=5, clock=clock,
                     endpoint="tcp://old:1", watch=watch, **kw)
    core.start()
    core.receive(P.Welcome(node="n1", heartbeat_interval_s=1.0, liveness=5, session="s1"))
    core.take_outbox()
    return core


def test_a_silent_controller_published_elsewhere_means_reconnect_there_now():
    clock, asked = FakeClock(), []
    news = [None]
    core = welcomed_core(lambda: asked.append(clock()) or news[0], clock)
    for _ in range(3):  # the controller talks: the file is never looked at
        clock.advance(1.0)
        core.receive(P.Heartbeat(node="controller"))
        core.tick()
    assert asked == []
    clock.advance(1.0)
    core.tick()  # silent for one interval: look at the file, nothing new
    assert len(asked) == 1 and RECONNECT not in core.take_outbox()
    news[0] = EndpointNews(endpoint="tcp://new:2")
    clock.advance(1.0)
    core.tick()
    out = core.take_outbox()
    assert out.index(RECONNECT) < next(i for i, m in enumerate(out) if isinstance(m, P.Register))
    assert core.endpoint == "tcp://new:2" and core.backoff_s == 1.0 and core.moves == 1


def test_a_dropped_connection_means_look_for_the_controller_within_tens_of_ms():
    """The controller's process died (its TCP session ended): the agent need not wait a
    heartbeat of silence; it looks at the file every few tens of ms (backing off to a
    heartbeat), finds the new endpoint, and stops looking once the controller talks."""
    clock, asked = FakeClock(), []
    news = [None]
    core = welcomed_core(lambda: asked.append(clock()) or news[0], clock)
    t0 = clock()
    clock.advance(0.2)
    core.connection_lost()
    assert core.poll_timeout_ms() <= int(WATCH_FIRST_S * 1000) + 1
    for _ in range(3):
        clock.advance(WATCH_FIRST_S)
        core.tick()
    assert len(asked) == 2 and RECONNECT not in core.take_outbox()  # 0.05 then 0.1 apart
    news[0] = EndpointNews(endpoint="tcp://new:2")
    while RECONNECT not in core.take_outbox():
        clock.advance(0.01)
        core.tick()
    assert core.endpoint == "tcp://new:2"
    assert clock() - t0 <= 0.56  # the next look (0.2 s later): well within a heartbeat
    core.receive(P.Heartbeat(node="controller"))
    n = len(asked)
    clock.advance(0.5)
    core.tick()
    assert len(asked) == n and core.watch_due is None


def test_a_controller_stopped_on_purpose_ends_a_waiting_agent():
    clock = FakeClock()
    core = welcomed_core(lambda: EndpointNews(stopped=True), clock)
    clock.advance(1.0)
    core.tick()
    assert core.stopped and not core.gave_up


def test_an_agent_never_welcomed_gives_up_after_give_up_s():
    clock = FakeClock()
    core = AgentCore("n1", 2, DEP, heartbeat_interval_s=1.0, clock=clock, give_up_s=5.0)
    core.start()
    for _ in range(4):
        clock.advance(1.0)
        core.tick()
    assert not core.stopped
    clock.advance(1.0)
    core.tick()
    assert core.stopped and core.gave_up


def test_the_endpoint_file_has_news_only_when_rewritten_or_stopped_after_it(tmp_path):
    ep = tmp_path / "controller.endpoint"
    ep.write_text("tcp://a:1")
    watch = EndpointFile(ep)
    assert watch.read() == "tcp://a:1" and watch() is None
    tmp = tmp_path / "new"
    tmp.write_text("tcp://b:2")
    tmp.replace(ep)  # how the controller publishes it (atomic_write): a new inode
    assert watch() == EndpointNews(endpoint="tcp://b:2") and watch() is None
    (tmp_path / "controller.endpoint.stopped").write_text("tcp://b:2\n")
    assert watch() == EndpointNews(stopped=True)


def test_an_agent_that_never_registered_exits_when_the_controller_stops(tmp_path):
    """A real agent whose controller never answers (nothing listens): the `.stopped` file
    the controller writes on a clean stop ends it with 0; with nothing at all, give_up_s."""
    ep = tmp_path / "controller.endpoint"
    ep.write_text(f"tcp://127.0.0.1:{free_port()}")
    agent = NodeAgent("n1", ep.read_text(), DEP, 1, runner=noop_runner(), insecure=True,
                      heartbeat_interval_s=0.05, endpoint_file=str(ep))
    result = []
    t = threading.Thread(target=lambda: result.append(agent.run()), daemon=True)
    t.start()
    (tmp_path / "controller.endpoint.stopped").write_text(ep.read_text())
    t.join(10)
    assert result == [0]
    lonely = NodeAgent("n2", ep.read_text(), DEP, 1, runner=noop_runner(), insecure=True,
                       heartbeat_interval_s=0.05, give_up_s=0.3)
    t0 = time.monotonic()
    assert lonely.run() == EXIT_GAVE_UP and time.monotonic() - t0 < 5


def test_a_cancel_carries_its_typed_reason_and_only_a_trainers_reasons_are_taken(h):
    h.register("n1", 1)
    batch = h.submit(n=2)
    (lease,) = leases(h.tick())
    out = h.send(b"c", P.Cancel(idem="k", batch_id=batch, reason="shutdown"))
    assert of_type(out, P.Cancelled)[0].reason == "shutdown"
    assert [(p, m.rollout_id) for p, m in out if isinstance(m, P.Reject)] == [(b"n1", lease.rollout_id)]
    assert h.core.counters["revoked_shutdown"] == 1
    with pytest.raises(P.ProtocolError, match="reason must be one of"):
        P.Cancel(idem="k2", batch_id=batch, reason="lease_revoked").check()
    raw = json.dumps({"v": P.PROTOCOL_VERSION, "dep": DEP, "type": "cancel", "id": "x" * 32,
                      "body": {"idem": "k3", "batch_id": batch, "reason": "because"}}).encode()
    assert h.frame(b"c", raw) == [] and h.core.dropped["bad_field"] == 1


def test_cancelled_work_never_feeds_the_curriculum(tmp_path):
    from controller.taskbank.curriculum import Curriculum
    cur = Curriculum(tmp_path / "c.sqlite", ["t1"])
    h = Harness(tmp_path, curriculum=cur)
    h.register("n1", 2)
    batch = h.submit(n=2)
    first, second = leases(h.tick())
    h.send("n1", result(first, "fail"))          # committed before the cancel: counts
    h.send(b"c", P.Cancel(idem="k", batch_id=batch))
    late = h.send("n1", result(second, "pass"))  # the cancelled one's late result
    assert [m.reason for m in of_type(late, P.Reject)] == ["cancelled"]
    est = cur.estimates(1)["t1"]
    assert (est.evidence, est.mean < 0.5) == (1.0, True), "one fail counted, the cancelled pass not"


def test_a_node_still_running_a_fenced_lease_is_told_at_its_next_heartbeat(h):
    h.register("n1", 1)
    h.submit(n=1)
    (old,) = leases(h.tick(), "n1")
    h.register("n2", 1)
    h.clock.advance(2.0)
    h.send("n2", P.Heartbeat(node="n2", slots_free=1, active=0, health={}))
    h.clock.advance(1.5)                                 # n1 silent: lost, its lease goes to n2
    (new,) = leases(h.tick(), "n2")
    assert new.rollout_id == old.rollout_id and new.token > old.token
    # n1 comes back, still running its attempt: its registration is told the lease is gone
    out = h.register("n1", 1, held=[old.rollout_id])
    (rej,) = of_type(out, P.Reject)
    assert (rej.rollout_id, rej.token, rej.reason) == (old.rollout_id, new.token, "stale_token")
    out = h.send("n1", P.Heartbeat(node="n1", slots_free=0, active=1, health={}, held=[old.rollout_id]))
    assert [m.token for m in of_type(out, P.Reject)] == [new.token], "and again at each heartbeat that lists it"
    assert h.core.counters["revoked_lease_revoked"] == 2
    # the holder's own heartbeat is never told so
    out = h.send("n2", P.Heartbeat(node="n2", slots_free=0, active=1, health={}, held=[new.rollout_id]))
    assert of_type(out, P.Reject) == []


def test_an_agent_stops_an_attempt_whose_rollout_was_leased_again_never_an_older_one():
    clock = FakeClock()
    core = AgentCore("n1", 2, DEP, clock=clock)
    core.start()
    policy = P.PolicyRef(1, "http://x/v1", "m")
    for rid, token in (("r1", 5), ("r2", 5)):
        core.receive(P.Lease(rollout_id=rid, attempt=1, token=token, lease_ttl_s=30, task={"task_id": "t"},
                             policy=policy, seed=0, run_id="run", run_dir="/tmp", batch_id="b"))
    r1, r2 = core.take_attempts()
    core.receive(P.Reject(rollout_id="r1", attempt=2, token=9, reason="stale_token"))     # leased again since
    core.receive(P.Reject(rollout_id="r2", attempt=1, token=3, reason="stale_token"))     # an older lease's
    assert (r1.cancel.reason, r2.cancel.reason) == ("lease_revoked", None)
    assert set(core.active) == {"r2"} and dict(core.cancelled) == {"lease_revoked": 1}
