"""Durable rollout queue: state table, leases, fencing, retries, dead letter, crash safety,
and a seeded deterministic simulation with invariants checked every step."""
from __future__ import annotations

import math
import os
import random
import subprocess
import sys
from collections import Counter

import pytest

from controller.store import queue as qm
from controller.store.queue import QueueConfig, RolloutQueue
from tests.conftest import FakeClock

T0 = 1_700_000_000.0

@pytest.fixture
def clock():
    return FakeClock(T0)


@pytest.fixture
def make_queue(tmp_path, clock):
    def make(config: QueueConfig = QueueConfig(lease_ttl_s=60.0), seed: int = 0) -> RolloutQueue:
        return RolloutQueue(tmp_path / "queue.db", clock=clock, rng=random.Random(seed),
                            config=config)
    return make


@pytest.fixture
def q(make_queue):
    return make_queue()


def done(q: RolloutQueue, lease: qm.Lease, outcome: str = "pass", reward=1.0,
         reason=None, idem: str | None = None) -> qm.Completion:
    return q.complete(lease.rollout_id, lease.attempt, lease.token, outcome, reward,
                      {"rollouts": f"shard-{lease.token}"}, reason,
                      idem or f"{lease.rollout_id}/{lease.token}/{outcome}")


# ---- the state table ----

def test_state_table_covers_every_state_and_only_states():
    assert set(qm.TRANSITIONS) == set(qm.STATES)
    assert all(targets <= set(qm.STATES) for targets in qm.TRANSITIONS.values())
    assert all(not qm.TRANSITIONS[s] for s in qm.TERMINAL)


def test_illegal_transition_is_an_assertion_naming_both_states_and_the_rollout():
    with pytest.raises(AssertionError, match="committed -> leased for rollout b000001-00003"):
        qm.check_transition("b000001-00003", qm.COMMITTED, qm.LEASED)


def test_queue_asserts_the_table_on_every_change(q):
    q.submit_batch("s", [("t", 1)], 1)
    row = q._row("b000001-00000")
    with pytest.raises(AssertionError, match="queued -> committed"):
        q._move(row, qm.COMMITTED, 0.0)


def test_database_is_wal_with_full_sync(q):
    assert q._db.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
    assert q._db.execute("PRAGMA synchronous").fetchone()[0] == 2  # FULL


def test_config_errors_name_the_key():
    with pytest.raises(ValueError, match="queue.lease_ttl_s"):
        QueueConfig(lease_ttl_s=0)
    with pytest.raises(ValueError, match="queue.max_attempts"):
        QueueConfig(max_attempts=0)


# ---- submit ----

def test_submit_enqueues_n_per_task_rollouts(q):
    batch_id, n, duplicate = q.submit_batch("s1", [("a", 1), ("b", 1)], 3)
    assert (n, duplicate) == (6, False)
    assert q.counts()[qm.QUEUED] == 6
    assert [r["task_ref"] for r in q.rollouts()] == ["a"] * 3 + ["b"] * 3
    assert not q.batch_done(batch_id)


def test_duplicate_submit_returns_the_stored_reply_and_changes_nothing(q):
    first = q.submit_batch("s1", [("a", 1)], 2)
    again = q.submit_batch("s1", [("z", 9)], 50)
    assert again == (first[0], first[1], True)
    assert q.counts()[qm.QUEUED] == 2


def test_batch_size_is_limited(make_queue):
    q = make_queue(QueueConfig(max_batch_rollouts=5))
    with pytest.raises(ValueError, match="max_batch_rollouts"):
        q.submit_batch("s", [("a", 1), ("b", 1)], 3)


# ---- leases ----

def test_lease_takes_oldest_first_with_increasing_tokens_and_a_deadline(q, clock):
    q.submit_batch("s1", [("a", 1)], 2)
    q.submit_batch("s2", [("b", 1)], 2)
    leases = q.lease_next("n1", 3)
    assert [l.rollout_id for l in leases] == ["b000001-00000", "b000001-00001", "b000002-00000"]
    assert [l.token for l in leases] == [1, 2, 3]
    assert all(l.attempt == 1 for l in leases)
    row = q.rollout("b000001-00000")
    assert (row["state"], row["node"]) == (qm.LEASED, "n1")
    assert row["lease_deadline"] == clock.now + 60.0
    assert q.lease_next("n2", 5)[0].token == 4


def test_lease_of_nothing_due_is_empty(q):
    assert q.lease_next("n1", 4) == []
    q.submit_batch("s", [("a", 1)], 1)
    assert q.lease_next("n1", 0) == []


def test_mark_running_and_renew_extend_the_deadline(q, clock):
    q.submit_batch("s", [("a", 1)], 2)
    a, b = q.lease_next("n1", 2)
    clock.advance(30)
    assert q.mark_running(a.rollout_id, a.attempt, a.token).accepted
    assert q.rollout(a.rollout_id)["state"] == qm.RUNNING
    assert q.rollout(a.rollout_id)["lease_deadline"] == clock.now + 60
    clock.advance(20)
    assert q.renew("n1") == 2
    assert q.rollout(b.rollout_id)["lease_deadline"] == clock.now + 60
    assert q.renew("n2") == 0


def test_mark_running_with_a_stale_token_is_rejected(q):
    q.submit_batch("s", [("a", 1)], 1)
    (a,) = q.lease_next("n1", 1)
    assert q.mark_running(a.rollout_id, a.attempt, a.token + 1) == qm.Completion(
        False, "stale_token", False)
    assert q.rollout(a.rollout_id)["state"] == qm.LEASED


def test_result_commits_from_leased_running_or_verifying(q):
    q.submit_batch("s", [("a", 1)], 3)
    a, b, c = q.lease_next("n1", 3)
    q.mark_running(b.rollout_id, b.attempt, b.token)
    q.mark_running(c.rollout_id, c.attempt, c.token)
    assert q.mark_verifying(c.rollout_id, c.attempt, c.token).accepted
    for lease in (a, b, c):
        assert done(q, lease) == qm.Completion(True, None, True)
    assert q.counts()[qm.COMMITTED] == 3


# ---- fencing ----

def test_old_token_is_rejected_after_expiry_and_re_lease_and_the_new_one_commits(q, clock):
    q.submit_batch("s", [("a", 1)], 1)
    (old,) = q.lease_next("n1", 1)
    clock.advance(61)
    assert q.expire_leases() == [old.rollout_id]
    clock.advance(31)  # past any backoff
    (new,) = q.lease_next("n2", 1)
    assert (new.rollout_id, new.attempt) == (old.rollout_id, 2)
    assert new.token > old.token
    before = q.rollout(old.rollout_id)
    assert done(q, old) == qm.Completion(False, "stale_token", False)
    assert q.rollout(old.rollout_id) == before
    assert done(q, new) == qm.Completion(True, None, True)
    row = q.rollout(new.rollout_id)
    assert (row["state"], row["token"], row["node"]) == (qm.COMMITTED, new.token, "n2")


def test_result_for_an_unknown_rollout_is_rejected(q):
    assert q.complete("nope", 1, 1, "pass", 1.0, {}, None, "i") == qm.Completion(
        False, "unknown_rollout", False)


def test_a_result_after_commit_is_stale(q):
    q.submit_batch("s", [("a", 1)], 1)
    (a,) = q.lease_next("n1", 1)
    done(q, a, idem="first")
    assert done(q, a, "fail", 0.0, idem="second") == qm.Completion(False, "stale_token", False)
    assert q.rollout(a.rollout_id)["outcome"] == "pass"


# ---- idempotency ----

def test_duplicate_result_returns_the_stored_completion_and_changes_nothing(q):
    q.submit_batch("s", [("a", 1)], 1)
    (a,) = q.lease_next("n1", 1)
    first = done(q, a, idem="k")
    row = q.rollout(a.rollout_id)
    assert done(q, a, idem="k") == first == qm.Completion(True, None, True)
    assert q.rollout(a.rollout_id) == row
    assert q.results_after("b000001", 0)[0] == [qm.result_item(q._row(a.rollout_id))]


def test_duplicate_infra_result_does_not_count_twice(q):
    q.submit_batch("s", [("a", 1)], 1)
    (a,) = q.lease_next("n1", 1)
    done(q, a, "infra_error", None, "oom", idem="k")
    done(q, a, "infra_error", None, "oom", idem="k")
    assert len(q.attempts(a.rollout_id)) == 1
    assert q.rollout(a.rollout_id)["state"] == qm.RETRY_WAIT


# ---- retries and dead letter ----

def test_backoff_is_full_jitter_within_the_capped_exponential(make_queue):
    q = make_queue(QueueConfig(backoff_base_s=1, backoff_max_s=30), seed=3)
    for attempt, cap in [(1, 1), (2, 2), (3, 4), (5, 16), (6, 30), (20, 30)]:
        samples = [q.backoff_s(attempt) for _ in range(500)]
        assert all(0 <= s <= cap for s in samples)
        assert max(samples) > cap * 0.8  # it really spreads over the range


def test_infra_error_waits_out_its_backoff_before_the_next_lease(q, clock):
    q.submit_batch("s", [("a", 1)], 1)
    (a,) = q.lease_next("n1", 1)
    assert done(q, a, "infra_error", None, "sandbox_failed") == qm.Completion(True, None, False)
    row = q.rollout(a.rollout_id)
    assert row["state"] == qm.RETRY_WAIT
    assert clock.now <= row["not_before"] <= clock.now + 1.0
    if row["not_before"] > clock.now:
        assert q.lease_next("n1", 1) == []
    clock.now = row["not_before"]
    (b,) = q.lease_next("n1", 1)
    assert (b.attempt, b.seed) == (2, a.seed)


def test_dead_letter_after_max_attempts_keeps_every_reason(make_queue, clock):
    q = make_queue(QueueConfig(max_attempts=3))
    q.submit_batch("s", [("a", 1)], 1)
    reasons = ["image_pull", "sandbox_failed", "oom"]
    for i, reason in enumerate(reasons, start=1):
        clock.advance(100)
        (lease,) = q.lease_next("n1", 1)
        assert lease.attempt == i
        done(q, lease, "infra_error", None, reason)
    row = q.rollout(lease.rollout_id)
    assert (row["state"], row["outcome"], row["reward"]) == (qm.DEAD_LETTER, "infra_error", None)
    assert [a["reason"] for a in q.attempts(lease.rollout_id)] == reasons
    assert q.lease_next("n1", 1) == []
    items, cursor = q.results_after("b000001", 0)
    assert [i["state"] for i in items] == [qm.DEAD_LETTER]
    assert q.batch_done("b000001")


def test_expired_lease_is_an_infra_failure_not_a_policy_failure(q, clock):
    q.submit_batch("s", [("a", 1)], 2)
    a, b = q.lease_next("n1", 2)
    clock.advance(30)
    q.renew("n1")
    q.mark_running(b.rollout_id, b.attempt, b.token)
    clock.advance(59)
    assert q.expire_leases() == []
    clock.advance(1)
    assert q.expire_leases() == [a.rollout_id, b.rollout_id]
    row = q.rollout(a.rollout_id)
    assert (row["state"], row["outcome"], row["infra_reason"]) == (
        qm.RETRY_WAIT, None, "lease_expired")
    assert q.attempts(a.rollout_id)[0]["outcome"] == "infra_error"


def test_a_lost_node_releases_its_leases_for_immediate_retry(q, clock):
    q.submit_batch("s", [("a", 1)], 3)
    a, b = q.lease_next("n1", 2)
    (c,) = q.lease_next("n2", 1)
    assert q.release_node("n1", "liveness") == [a.rollout_id, b.rollout_id]
    assert q.leases_of("n1") == [] and q.leases_of("n2") == [c.rollout_id]
    assert q.rollout(a.rollout_id)["infra_reason"] == "node_lost: liveness"
    again = q.lease_next("n3", 5)
    assert [l.rollout_id for l in again] == [a.rollout_id, b.rollout_id]
    assert done(q, a).reason == "stale_token"


# ---- cancel, results, counts ----

def test_cancel_batch_cancels_what_is_not_finished_and_rejects_late_results(q):
    batch_id, _, _ = q.submit_batch("s", [("a", 1)], 3)
    a, b = q.lease_next("n1", 2)
    done(q, a)
    assert q.cancel_batch(batch_id) == 2
    assert q.counts()[qm.CANCELLED] == 2
    assert done(q, b) == qm.Completion(False, "cancelled", False)
    assert q.batch_done(batch_id)
    assert q.lease_next("n1", 5) == []


def test_results_come_in_commit_order_after_the_cursor(q):
    batch_id, _, _ = q.submit_batch("s", [("a", 1)], 3)
    q.submit_batch("other", [("a", 1)], 1)
    a, b, c, d = q.lease_next("n1", 4)
    done(q, c, "fail", None)
    done(q, d)  # another batch
    done(q, a)
    items, cursor = q.results_after(batch_id, 0)
    assert [(i["rollout_id"], i["outcome"], i["reward"]) for i in items] == [
        (c.rollout_id, "fail", 0.0), (a.rollout_id, "pass", 1.0)]
    assert items[1]["shards"] == {"rollouts": f"shard-{a.token}"}
    assert q.results_after(batch_id, cursor) == ([], cursor)
    done(q, b, "timeout", None)
    items, cursor2 = q.results_after(batch_id, cursor)
    assert [i["rollout_id"] for i in items] == [b.rollout_id] and cursor2 > cursor
    assert q.batch_done(batch_id)


def test_unknown_batch_is_an_error(q):
    with pytest.raises(qm.UnknownBatch):
        q.batch_done("b999")


def test_policies_are_idempotent_and_conflicts_refused(q):
    assert q.latest_policy() is None
    assert q.publish_policy(1, "http://a/v1", "m", "p1") is False
    assert q.publish_policy(1, "http://a/v1", "m", "p1") is True
    assert q.publish_policy(2, "http://b/v1", "m", "p2") is False
    assert q.publish_policy(2, "http://b/v1", "m", "p2-again") is True     # same contents
    with pytest.raises(qm.PolicyConflict, match="policy version 2 already published as http://b/v1 m"):
        q.publish_policy(2, "http://b/v1", "other-weights", "p3")
    assert q.policy(1).endpoint == "http://a/v1"
    assert q.latest_policy().version == 2
    assert q.policy(7) is None


def test_the_same_policy_at_a_new_endpoint_is_a_move_and_survives_a_reopen(make_queue):
    """A restarted trainer serves the version it published before on a new port."""
    q = make_queue()
    q.publish_policy(1, "http://head:4001/v1", "m", "p1")
    assert q.publish_policy(1, "http://head:4999/v1", "m", "p1-restarted") is False
    assert q.policy(1).endpoint == "http://head:4999/v1"
    assert q.publish_policy(1, "http://head:4999/v1", "m", "p1-restarted") is True   # a retried request
    with pytest.raises(qm.PolicyConflict):
        q.publish_policy(1, "http://head:4999/v1", "m2", "p1-other")   # other weights: never
    q.close()
    assert make_queue().policy(1).endpoint == "http://head:4999/v1"


# ---- crash safety ----

def test_reopen_after_a_crash_keeps_everything(make_queue, clock):
    q = make_queue()
    batch_id, _, _ = q.submit_batch("s", [("a", 1)], 3)
    q.publish_policy(1, "http://a/v1", "m", "p1")
    a, b = q.lease_next("n1", 2)
    done(q, a, idem="ka")
    del q  # a crash: no close()

    q = make_queue()
    assert q.counts() == {**dict.fromkeys(qm.STATES, 0), qm.QUEUED: 1, qm.LEASED: 1,
                          qm.COMMITTED: 1}
    assert done(q, a, idem="ka") == qm.Completion(True, None, True)  # stored reply survived
    assert q.submit_batch("s", [("a", 1)], 3) == (batch_id, 3, True)
    assert q.latest_policy().version == 1
    (c,) = q.lease_next("n2", 5)
    assert c.token > b.token  # the fencing token never goes back
    assert done(q, b) == qm.Completion(True, None, True)  # still-valid token from before
    clock.advance(61)
    assert q.expire_leases() == [c.rollout_id]


def test_a_killed_process_loses_only_its_uncommitted_transaction(make_queue, tmp_path):
    script = f"""
import os, random, sqlite3
from controller.store.queue import RolloutQueue
q = RolloutQueue({str(tmp_path / "queue.db")!r}, clock=lambda: {T0!r}, rng=random.Random(0))
q.submit_batch("s", [("a", 1)], 2)
(lease,) = q.lease_next("n1", 1)
print(lease.token, flush=True)
other = sqlite3.connect({str(tmp_path / "queue.db")!r}, isolation_level=None)
other.execute("BEGIN IMMEDIATE")
other.execute("UPDATE rollouts SET state = 'committed'")
os._exit(0)  # dies mid-transaction, nothing closed
"""
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                         timeout=60)
    assert out.returncode == 0, out.stderr
    q = make_queue()
    assert q.counts() == {**dict.fromkeys(qm.STATES, 0), qm.QUEUED: 1, qm.LEASED: 1}
    leased = q.rollout("b000001-00000")
    assert leased["token"] == int(out.stdout)
    assert done(q, qm.Lease("b000001-00000", 1, leased["token"], "a", 1, 0, "b000001")).committed


# ---- handback, failures, group commit, staleness ----

def test_a_released_lease_is_queued_again_and_is_not_a_failure(q):
    q.submit_batch("s", [("a", 1)], 1)
    (a,) = q.lease_next("n1", 1)
    assert q.release(a.rollout_id, a.attempt, a.token, "drain deadline").accepted
    row = q.rollout(a.rollout_id)
    assert (row["state"], row["failures"], row["node"]) == (qm.QUEUED, 0, "n1")
    assert q.release(a.rollout_id, a.attempt, a.token, "again").reason == "stale_token"
    (b,) = q.lease_next("n2", 1)
    assert (b.attempt, b.token > a.token) == (2, True)
    assert [x["outcome"] for x in q.attempts(a.rollout_id)] == ["released", None]


def test_dead_letter_counts_failures_not_handbacks(make_queue, clock):
    q = make_queue(QueueConfig(max_attempts=2, backoff_base_s=0.001, backoff_max_s=0.001))
    q.submit_batch("s", [("a", 1)], 1)
    for _ in range(3):  # three drains in a row: never dead-lettered
        (a,) = q.lease_next("n1", 1)
        q.release(a.rollout_id, a.attempt, a.token, "drain")
    (a,) = q.lease_next("n1", 1)
    q.release_node("n1", "drained", failure=False)
    assert q.rollout(a.rollout_id)["state"] == qm.QUEUED
    (a,) = q.lease_next("n1", 1)
    q.release_node("n1", "gone")  # lost with its node: a loss, not the task's failure
    (a,) = q.lease_next("n1", 1)
    done(q, a, "infra_error", None, "boom")
    row = q.rollout(a.rollout_id)
    assert (row["state"], row["failures"], row["losses"]) == (qm.RETRY_WAIT, 1, 1)
    clock.advance(1)  # past the (1 ms) backoff
    (a,) = q.lease_next("n1", 1)
    done(q, a, "infra_error", None, "boom")
    row = q.rollout(a.rollout_id)
    assert (row["state"], row["failures"], row["attempt"]) == (qm.DEAD_LETTER, 2, 7)


def test_attempts_lost_with_their_node_count_toward_their_own_limit(make_queue):
    """A flapping node does not dead-letter a good task: node losses have their own limit."""
    q = make_queue(QueueConfig(max_attempts=2, max_node_losses=5))
    q.submit_batch("s", [("a", 1)], 1)
    for i in range(1, 5):
        (a,) = q.lease_next("n1", 1)
        q.release_node("n1", "no heartbeat")
        row = q.rollout(a.rollout_id)
        assert (row["state"], row["failures"], row["losses"]) == (qm.RETRY_WAIT, 0, i)
    (a,) = q.lease_next("n1", 1)
    q.release_node("n1", "no heartbeat")
    row = q.rollout(a.rollout_id)
    assert (row["state"], row["losses"], row["attempt"]) == (qm.DEAD_LETTER, 5, 5)


def test_an_expired_lease_of_a_silent_node_is_a_loss_of_a_live_one_a_failure(q, clock):
    q.submit_batch("s", [("a", 1)], 2)
    a, b = q.lease_next("n1", 1) + q.lease_next("n2", 1)
    clock.advance(q.config.lease_ttl_s + 1)
    assert sorted(q.expire_leases(live_nodes={"n2"})) == [a.rollout_id, b.rollout_id]
    lost, failed = q.rollout(a.rollout_id), q.rollout(b.rollout_id)
    assert (lost["failures"], lost["losses"]) == (0, 1)
    assert (failed["failures"], failed["losses"]) == (1, 0)


def test_renew_with_ids_keeps_only_the_leases_the_node_reports(q, clock):
    q.submit_batch("s", [("a", 1)], 2)
    a, b = q.lease_next("n1", 2)
    clock.advance(50)
    assert q.renew("n1", [a.rollout_id]) == 1
    clock.advance(20)
    assert q.expire_leases() == [b.rollout_id], "the lease the node never got expires"


def test_a_batch_is_one_transaction_and_a_crash_inside_loses_all_of_it(make_queue):
    q = make_queue()
    q.submit_batch("s", [("a", 1)], 2)
    try:
        with q.batch():
            (a,) = q.lease_next("n1", 1)
            done(q, a)
            raise KeyboardInterrupt  # dies before the batch commits: nothing was acked
    except KeyboardInterrupt:
        pass
    assert q.counts()[qm.QUEUED] == 2 and q.attempts(a.rollout_id) == []
    assert q.counts()[qm.COMMITTED] == 0, "a rolled-back commit is not counted"
    with q.batch():
        (a,) = q.lease_next("n1", 1)
        with pytest.raises(qm.UnknownBatch):
            q.cancel("nope")  # a refusal inside a batch leaves the rest of it alone
        done(q, a)
    assert q.counts()[qm.COMMITTED] == 1


def test_counters_continue_after_a_reopen(make_queue):
    q = make_queue()
    q.submit_batch("s", [("a", 1)], 2)
    a, b = q.lease_next("n1", 2)
    done(q, a)
    del q
    q = make_queue()
    (c,) = q.lease_next("n2", 1) or [None]
    assert c is None  # b is still leased
    q.release(b.rollout_id, b.attempt, b.token, "x")
    (c,) = q.lease_next("n2", 1)
    assert c.token > b.token
    done(q, c)
    seqs = [r["commit_seq"] for r in q.rollouts()]
    assert seqs[1] > seqs[0]


def test_cancel_with_a_key_answers_a_repeat_with_the_first_reply(q):
    batch_id, _, _ = q.submit_batch("s", [("a", 1)], 3)
    (a,) = q.lease_next("n1", 1)
    first = q.cancel(batch_id, "k")
    assert (first.rollouts, first.revoked) == (3, ((a.rollout_id, "n1", 1, a.token),))
    assert q.cancel(batch_id, "k").rollouts == 3
    assert q.cancel(batch_id, "other").rollouts == 0


@pytest.mark.parametrize("action", ["rerun", "drop"])
def test_rollouts_too_many_policy_versions_behind_are_rerun_or_dropped(make_queue, action):
    q = make_queue(QueueConfig(max_staleness=1, stale_policy=action))
    q.publish_policy(1, "http://p/v1", "m", "p1")
    batch_id, _, _ = q.submit_batch("s", [("a", 1)], 3)
    (held,) = q.lease_next("n1", 1)
    q.publish_policy(2, "http://p/v1", "m", "p2")
    assert q.counts()[qm.QUEUED] == 2, "one version behind is within the bound"
    q.publish_policy(3, "http://p/v1", "m", "p3")
    rows = q.rollouts()
    if action == "rerun":
        assert [(r["state"], r["policy_version"]) for r in rows] == [(qm.QUEUED, 3)] * 3
        assert done(q, held).reason == "stale_token", "the revoked attempt's result is stale"
    else:
        assert {(r["state"], r["infra_reason"]) for r in rows} == {(qm.CANCELLED, "stale_policy")}
        items, _ = q.results_after(batch_id, 0)
        assert len(items) == 3 and q.batch_done(batch_id)


def test_staleness_config_errors_name_the_key():
    with pytest.raises(ValueError, match="queue.max_staleness"):
        QueueConfig(max_staleness=-1)
    with pytest.raises(ValueError, match="queue.stale_policy"):
        QueueConfig(stale_policy="maybe")


# ---- deterministic simulation ----

SIM_SEEDS = [int(s) for s in os.environ.get("PADDOCK_SIM_SEEDS", "1,2,3,4,5").split(",")]
SIM_STEPS = int(os.environ.get("PADDOCK_SIM_STEPS", "2000"))
NODES = ("n1", "n2", "n3")


class Sim:
    """Simulated node agents, trainer and clock around a real queue; a model of what the
    queue must hold, compared with the database after every step."""

    def __init__(self, seed: int, path):
        self.rng = random.Random(seed)
        self.path = path
        self.clock = FakeClock()
        self.config = QueueConfig(lease_ttl_s=10, max_attempts=4, backoff_base_s=1,
                                  backoff_max_s=8)
        self.q = self.open()
        self.trace: list[str] = []
        self.held: dict[str, list[qm.Lease]] = {n: [] for n in NODES}  # what nodes believe
        self.live: dict[str, tuple[int, int, str, float]] = {}  # rid -> attempt, token, node, deadline
        self.leased_at: dict[str, float] = {}  # rid -> when its current lease was made
        # node -> (when, rids) of its last renewal in memory: it renews the leases it lists
        self.noted: dict[str, tuple[float, set[str]]] = {}
        self.attempts: dict[str, int] = {}
        self.committed: dict[str, int] = {}  # rid -> token that committed
        self.dead: set[str] = set()
        self.failures: Counter = Counter()  # per rollout: the task's own failed attempts
        self.losses: Counter = Counter()  # per rollout: attempts lost with their node
        self.max_token = 0
        self.submits: list[tuple[str, tuple]] = []  # (idem, reply)
        self.sent: list[tuple[tuple, qm.Completion]] = []  # (complete args, first reply)
        self.cursors: dict[str, int] = {}
        self.watched: set[str] = set()
        self.n_idem = 0

    def open(self) -> RolloutQueue:
        return RolloutQueue(self.path, clock=self.clock, rng=random.Random(self.rng.random()),
                            config=self.config)

    # ---- actions ----

    def submit(self) -> None:
        if self.submits and self.rng.random() < 0.3:
            idem, reply = self.rng.choice(self.submits)
            assert self.q.submit_batch(idem, [("x", 1)], 9) == (*reply[:2], True)
            return
        if len(self.attempts) >= 60:
            return
        idem = f"s{len(self.submits)}"
        tasks = [(f"t{i}", 1) for i in range(self.rng.randint(1, 3))]
        reply = self.q.submit_batch(idem, tasks, self.rng.randint(1, 4))
        assert reply[2] is False
        self.submits.append((idem, reply))
        self.cursors[reply[0]] = 0
        for i in range(reply[1]):
            self.attempts[f"{reply[0]}-{i:05d}"] = 0

    def lease(self, node: str) -> None:
        for lease in self.q.lease_next(node, self.rng.randint(1, 3)):
            rid = lease.rollout_id
            assert lease.token > self.max_token, "fencing tokens must strictly increase"
            assert rid not in self.live and rid not in self.committed and rid not in self.dead
            self.max_token = lease.token
            self.attempts[rid] += 1
            assert lease.attempt == self.attempts[rid]
            self.live[rid] = (lease.attempt, lease.token, node,
                              self.clock.now + self.config.lease_ttl_s)
            self.leased_at[rid] = self.clock.now
            self.held[node].append(lease)

    def is_live(self, lease: qm.Lease) -> bool:
        live = self.live.get(lease.rollout_id)
        return live is not None and live[:2] == (lease.attempt, lease.token)

    def start(self, node: str) -> None:
        if not self.held[node]:
            return
        lease = self.rng.choice(self.held[node])
        was = self.q.rollout(lease.rollout_id)["state"]
        r = self.q.mark_running(lease.rollout_id, lease.attempt, lease.token)
        assert r.accepted == self.is_live(lease)
        if r.accepted and was == qm.LEASED:  # a repeated `started` renews nothing
            a, t, n, _ = self.live[lease.rollout_id]
            self.live[lease.rollout_id] = (a, t, n, self.clock.now + self.config.lease_ttl_s)

    def complete(self, node: str) -> None:
        if not self.held[node]:
            return
        lease = self.held[node].pop(self.rng.randrange(len(self.held[node])))
        outcome = self.rng.choices(["pass", "fail", "timeout", "infra_error"], [3, 2, 1, 3])[0]
        self.n_idem += 1
        args = (lease.rollout_id, lease.attempt, lease.token, outcome,
                None if outcome == "infra_error" else float(outcome == "pass"),
                {"rollouts": f"s{lease.token}"},
                "sim_infra" if outcome == "infra_error" else None, f"r{self.n_idem}")
        live = self.is_live(lease)
        r = self.q.complete(*args)
        self.sent.append((args, r))
        rid = lease.rollout_id
        if not live:
            assert not r.accepted and r.reason == "stale_token", (lease, r)
            return
        assert r.accepted
        del self.live[rid]
        if outcome != "infra_error":
            assert r.committed and rid not in self.committed, "committed exactly once"
            self.committed[rid] = lease.token
        else:
            assert not r.committed
            self.failed(rid)

    def failed(self, rid: str, lost: bool = False) -> None:
        """An attempt failed (the task's failure) or was lost with its node (its own limit)."""
        kind = self.losses if lost else self.failures
        kind[rid] += 1
        if self.failures[rid] >= self.config.max_attempts or \
                self.losses[rid] >= self.config.max_node_losses:
            self.dead.add(rid)

    def duplicate(self) -> None:
        if not self.sent:
            return
        args, first = self.rng.choice(self.sent)
        before = self.q.rollouts()
        r = self.q.complete(*args)
        if first.accepted:
            assert r == first
            assert self.q.rollouts() == before, "a duplicate result changed the queue"
        else:
            assert not r.accepted

    def expire(self) -> None:
        now, ttl = self.clock.now, self.config.lease_ttl_s
        due = sorted(rid for rid, (_, _, _, deadline) in self.live.items() if deadline <= now)
        kept = {}  # a renewal noted since the lease keeps it: its deadline is written now
        for rid in due:
            at, listed = self.noted.get(self.live[rid][2], (-math.inf, set()))
            if rid in listed and at >= self.leased_at[rid] and at + ttl > now:
                kept[rid] = at + ttl
        assert sorted(self.q.expire_leases()) == [rid for rid in due if rid not in kept]
        for rid in due:
            if rid in kept:
                a, t, n, _ = self.live[rid]
                self.live[rid] = (a, t, n, kept[rid])
            else:
                del self.live[rid]
                self.failed(rid)

    def renew(self, node: str) -> None:
        self.q.renew(node)
        for rid, (a, t, n, _) in list(self.live.items()):
            if n == node:
                self.live[rid] = (a, t, n, self.clock.now + self.config.lease_ttl_s)

    def renew_ids(self, node: str) -> None:
        """The heartbeat of agents that list what they hold (a zombie lists stale leases too):
        noted in memory, nothing written."""
        rids = [lease.rollout_id for lease in self.held[node]]
        before = self.q.rollouts()
        assert self.q.renew(node, rids) == len(rids)
        assert self.q.rollouts() == before, "a renewal with ids wrote to the queue"
        self.noted[node] = (self.clock.now, set(rids))

    def lose_node(self, node: str) -> None:
        expected = sorted(rid for rid, live in self.live.items() if live[2] == node)
        assert sorted(self.q.release_node(node, "liveness")) == expected
        for rid in expected:
            del self.live[rid]
            self.failed(rid, lost=True)
        if self.rng.random() < 0.5:
            self.held[node] = []  # restarted clean; otherwise a zombie still holding old leases

    def crash(self) -> None:
        del self.q  # no close(): whatever was committed must survive
        self.q = self.open()
        # Renewals noted in memory are gone; the reopened queue gives every held lease a
        # fresh TTL instead.
        self.noted.clear()
        for rid, (a, t, n, deadline) in list(self.live.items()):
            self.live[rid] = (a, t, n, max(deadline, self.clock.now + self.config.lease_ttl_s))

    def watch(self) -> None:
        for batch_id in self.cursors:
            items, cursor = self.q.results_after(batch_id, self.cursors[batch_id])
            assert cursor >= self.cursors[batch_id]
            self.cursors[batch_id] = cursor
            for item in items:
                rid = item["rollout_id"]
                assert rid not in self.watched, f"{rid} delivered twice"
                self.watched.add(rid)
                assert rid in self.committed or rid in self.dead

    def step(self, faults: bool) -> None:
        node = self.rng.choice(NODES)
        actions = [("submit", 1, self.submit), ("lease", 6, lambda: self.lease(node)),
                   ("start", 3, lambda: self.start(node)),
                   ("complete", 6, lambda: self.complete(node)),
                   ("tick", 4, lambda: self.clock.advance(self.rng.uniform(0, 4))),
                   ("expire", 2, self.expire), ("renew", 1, lambda: self.renew(node)),
                   ("renew_ids", 2, lambda: self.renew_ids(node)),
                   ("watch", 1, self.watch)]
        if faults:
            actions += [("duplicate", 2, self.duplicate), ("lose_node", 0.3,
                                                           lambda: self.lose_node(node)),
                        ("crash", 0.3, self.crash)]
        name, _, action = self.rng.choices(actions, [a[1] for a in actions])[0]
        self.trace.append(f"{name}({node}) t={self.clock.now - T0:.2f}")
        action()

    # ---- invariants ----

    def check(self) -> None:
        rows = {r["rollout_id"]: r for r in self.q.rollouts()}
        assert set(rows) == set(self.attempts), "every submitted rollout exists exactly once"
        assert sum(self.q.counts().values()) == len(rows)
        for rid, row in rows.items():
            state = row["state"]
            assert state in qm.STATES
            assert row["attempt"] == self.attempts[rid]
            assert (state == qm.COMMITTED) == (rid in self.committed), (rid, state)
            assert (state == qm.DEAD_LETTER) == (rid in self.dead), (rid, state)
            assert (state in qm.HELD) == (rid in self.live), (rid, state)
            if state == qm.COMMITTED:
                assert row["token"] == self.committed[rid], "a stale token was committed"
            if state in qm.HELD:
                a, t, n, deadline = self.live[rid]
                assert (row["attempt"], row["token"], row["node"]) == (a, t, n)
                assert row["lease_deadline"] == deadline
            if row["token"] is not None:
                assert row["token"] <= self.max_token

    def heal(self) -> None:
        """Faults stop: a healthy node drains the queue; everything must finish."""
        for _ in range(200):
            self.clock.advance(self.config.backoff_max_s + self.config.lease_ttl_s + 1)
            self.expire()
            self.lease("healer")
            while self.held["healer"]:
                self.complete("healer")
                self.check()
            self.check()
            if all(rid in self.committed or rid in self.dead for rid in self.attempts):
                break
        self.watch()
        counts = self.q.counts()
        assert counts[qm.COMMITTED] + counts[qm.DEAD_LETTER] == len(self.attempts), counts
        assert self.watched == set(self.attempts)


@pytest.mark.parametrize("seed", SIM_SEEDS)
def test_simulation_keeps_invariants_under_faults_and_finishes_after(seed, tmp_path):
    sim = Sim(seed, tmp_path / "sim.db")
    sim.held["healer"] = []
    sim.submit()
    try:
        for _ in range(SIM_STEPS):
            sim.step(faults=True)
            sim.check()
        sim.heal()
    except BaseException as e:
        raise AssertionError(
            f"simulation failed at step {len(sim.trace)}; replay with "
            f"PADDOCK_SIM_SEEDS={seed} pytest tests/store/test_queue.py -k simulation\n"
            f"last actions: {sim.trace[-15:]}\n{type(e).__name__}: {e}") from e
    assert len(sim.committed) > 0 and len(sim.attempts) > 10


def test_the_documented_state_table_is_the_code_table():
    import pathlib
    import re
    doc = (pathlib.Path(__file__).parents[2] / "docs" / "protocol.md").read_text()
    table = {}
    for state, targets in re.findall(r"^\| `(\w+)` \| (.+) \|$", doc, re.M):
        if state in qm.TRANSITIONS:
            table[state] = frozenset(re.findall(r"`(\w+)`", targets))
    assert table == qm.TRANSITIONS


def test_counts_match_the_table_across_terminal_moves_and_a_reopen(make_queue, clock):
    q = make_queue(QueueConfig(max_attempts=1))
    batch, _, _ = q.submit_batch("s", [("a", 1)], 5)
    a, b, c = q.lease_next("n1", 3)
    done(q, a)
    done(q, b, "infra_error", None, "boom")  # max_attempts 1: dead letter
    q.cancel(batch)

    def table(queue):
        out = dict.fromkeys(qm.STATES, 0)
        out.update(queue._db.execute("SELECT state, COUNT(*) FROM rollouts GROUP BY state"))
        return out
    assert q.counts() == table(q)
    assert (q.counts()[qm.COMMITTED], q.counts()[qm.DEAD_LETTER], q.counts()[qm.CANCELLED]) \
        == (1, 1, 3)
    q.close()
    again = make_queue(QueueConfig(max_attempts=1))
    assert again.counts() == table(again)


def test_an_attempt_in_flight_is_listed_and_written_when_it_ends(q):
    q.submit_batch("s", [("a", 1)], 1)
    (a,) = q.lease_next("n1", 1)
    (live,) = q.attempts(a.rollout_id)
    assert (live["token"], live["node"], live["outcome"], live["finished_at"]) == \
        (a.token, "n1", None, None)
    assert q._db.execute("SELECT COUNT(*) FROM attempts").fetchone()[0] == 0
    done(q, a)
    (ended,) = q.attempts(a.rollout_id)
    assert (ended["token"], ended["outcome"], ended["started_at"]) == \
        (a.token, "pass", live["started_at"])


def test_a_lease_taken_by_an_older_queue_completes_after_the_upgrade(make_queue):
    """Older databases: no leased_at/commit_idem columns, attempt rows written at lease."""
    q = make_queue()
    q.submit_batch("s", [("a", 1)], 1)
    (a,) = q.lease_next("n1", 1)
    q._db.execute("ALTER TABLE rollouts DROP COLUMN leased_at")
    q._db.execute("ALTER TABLE rollouts DROP COLUMN commit_idem")
    q._db.execute("INSERT INTO attempts (rollout_id, attempt, token, node, started_at) VALUES"
                  " (?, ?, ?, ?, 5.0)", (a.rollout_id, a.attempt, a.token, "n1"))
    q.close()
    q = make_queue()
    assert done(q, a, idem="k").committed and done(q, a, idem="k").duplicate
    (att,) = q.attempts(a.rollout_id)
    assert (att["token"], att["outcome"]) == (a.token, "pass")


def test_due_is_empty_until_a_retry_wait_ends_or_a_rollout_becomes_leasable(make_queue, clock):
    q = make_queue(QueueConfig(backoff_base_s=10, backoff_max_s=10))
    q.submit_batch("s", [("a", 1)], 2)
    a, b = q.lease_next("n1", 2)
    done(q, a, "infra_error", None, "boom")  # retry_wait, not before now + up to 10 s
    not_before = q.rollout(a.rollout_id)["not_before"]
    assert q.due(5) == [] and q.due(5) == []
    q.release(b.rollout_id, b.attempt, b.token, "drain")  # leasable at once
    assert [d.rollout_id for d in q.due(5)] == [b.rollout_id]
    q.lease_next("n1", 1)
    clock.advance(not_before - clock() + 0.001)
    assert [d.rollout_id for d in q.due(5)] == [a.rollout_id]
    q.lease_next("n1", 1)
    assert q.due(5) == []
    q.submit_batch("s2", [("a", 1)], 1)
    assert len(q.due(5)) == 1, "a submit is seen at once"
