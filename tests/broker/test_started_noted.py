"""A `started` of a lease the broker's mirror shows live is noted in memory and written with
the row's next write (RolloutQueue.note_started): in order with the frames around it, shown
as running, and nothing committed is lost when the process dies before it is written."""
from __future__ import annotations

from pathlib import Path

import pytest

from controller.contracts import protocol as P
from controller.store import queue as qm
from tests.broker.test_broker import Harness, leases, of_type, result


def started(lease: P.Lease, token: int | None = None) -> P.Started:
    return P.Started(rollout_id=lease.rollout_id, attempt=lease.attempt,
                     token=lease.token if token is None else token)


def pass_of(h: Harness, frames: list[tuple[str, P.Message]]) -> list:
    """One pass of the daemon: these frames, in order, in one group commit, then a tick."""
    with h.queue.batch():
        for peer, msg in frames:
            h.core.receive(peer.encode(), P.encode(msg, "dep-broker-test"))
        h.core.tick()
    return h.core.take_outbox()


def one_lease(h: Harness, n: int = 1) -> list[P.Lease]:
    h.register("n1", n)
    h.submit(n=n)
    got = leases(h.tick(), "n1")
    assert len(got) == n
    return got


@pytest.fixture
def h(tmp_path):
    return Harness(tmp_path, heartbeat_interval_s=100.0)  # no node goes silent here


def disk_state(path: Path, rollout_id: str) -> str:
    """The row's state as the file holds it (another connection: no settling)."""
    import sqlite3
    db = sqlite3.connect(str(path / "q.db"))
    try:
        return db.execute("SELECT state FROM rollouts WHERE rollout_id = ?", (rollout_id,)).fetchone()[0]
    finally:
        db.close()


def test_a_started_is_shown_running_without_a_write(h, tmp_path):
    (lease,) = one_lease(h)
    assert pass_of(h, [("n1", started(lease))]) == []  # no reply, nothing rejected
    assert disk_state(tmp_path, lease.rollout_id) == qm.LEASED  # not written
    counts = h.queue.counts()
    assert (counts[qm.LEASED], counts[qm.RUNNING]) == (0, 1)
    assert h.queue.rollout(lease.rollout_id)["state"] == qm.RUNNING  # a read of the row settles it
    assert disk_state(tmp_path, lease.rollout_id) == qm.RUNNING
    assert h.queue.counts()[qm.RUNNING] == 1


def test_started_then_result_in_one_pass_commit_in_order(h, tmp_path):
    a, b = one_lease(h, 2)
    out = pass_of(h, [("n1", started(a)), ("n1", result(a)), ("n1", started(b))])
    assert not of_type(out, P.Reject)
    assert h.queue.rollout(a.rollout_id)["state"] == qm.COMMITTED
    counts = h.queue.counts()
    assert (counts[qm.COMMITTED], counts[qm.RUNNING], counts[qm.LEASED]) == (1, 1, 0)
    # the result's ack went out; the started of `a` is never written over its commit
    assert disk_state(tmp_path, a.rollout_id) == qm.COMMITTED


def test_a_started_after_a_failed_attempt_never_marks_the_next_attempt(h, tmp_path):
    (a,) = one_lease(h)
    pass_of(h, [("n1", started(a)), ("n1", result(a, "infra_error"))])
    row = h.queue.rollout(a.rollout_id)
    assert row["state"] == qm.RETRY_WAIT
    h.clock.advance(5)  # past the backoff: leased again, a new token
    (again,) = leases(pass_of(h, [("n1", P.Ready(node="n1", credit=1))]), "n1")
    assert again.token > a.token
    # the old attempt's started (a late duplicate) is refused, the new lease stays leased
    out = pass_of(h, [("n1", started(a))])
    assert [(r.token, r.reason) for r in of_type(out, P.Reject)] == [(a.token, "stale_token")]
    assert h.queue.counts()[qm.LEASED] == 1
    assert disk_state(tmp_path, a.rollout_id) == qm.LEASED


def test_a_started_the_mirror_does_not_show_is_checked_on_the_row(h, tmp_path):
    (lease,) = one_lease(h)
    out = pass_of(h, [("n1", started(lease, token=lease.token + 100))])  # a token never issued
    assert [r.reason for r in of_type(out, P.Reject)] == ["stale_token"]
    assert h.queue.counts()[qm.RUNNING] == 0
    h.register("n2", 1)
    # another node naming n1's live token (the token is the fence): the row's check, written now
    assert not of_type(pass_of(h, [("n2", started(lease))]), P.Reject)
    assert disk_state(tmp_path, lease.rollout_id) == qm.RUNNING


def test_the_deadline_write_carries_the_started(h, tmp_path):
    (lease,) = one_lease(h)
    h.clock.advance(10)
    pass_of(h, [("n1", started(lease))])
    h.clock.advance(21)  # the stored deadline (lease + 30 s) comes due; the started renewed it
    with h.queue.batch():
        assert h.queue.expire_leases() == []
    assert disk_state(tmp_path, lease.rollout_id) == qm.RUNNING
    row = h.queue.rollout(lease.rollout_id)
    assert row["lease_deadline"] == h.clock() - 21 + 30  # the started's time + the TTL


def test_a_crash_between_a_noted_started_and_the_result_loses_nothing_committed(tmp_path):
    h = Harness(tmp_path, heartbeat_interval_s=100.0)
    a, b = one_lease(h, 2)
    # one pass: a's started then its result (committed and acked), b's started noted only
    res = result(a)
    out = pass_of(h, [("n1", started(a)), ("n1", res), ("n1", started(b))])
    assert [m.ref for m in of_type(out, P.Ack)] == [res.id]  # told: committed
    del h  # the process dies: no close, b's started was never written
    h2 = Harness(tmp_path, heartbeat_interval_s=100.0)
    assert h2.queue.rollout(a.rollout_id)["state"] == qm.COMMITTED  # what was acknowledged
    assert disk_state(tmp_path, b.rollout_id) == qm.LEASED  # held: still b's lease
    counts = h2.queue.counts()
    assert (counts[qm.COMMITTED], counts[qm.LEASED], counts[qm.RUNNING]) == (1, 1, 0)
    # the agent comes back holding b, and its result commits from `leased`
    h2.register("n1", 2, held=[b.rollout_id])
    pass_of(h2, [("n1", result(b))])
    assert h2.queue.rollout(b.rollout_id)["state"] == qm.COMMITTED
