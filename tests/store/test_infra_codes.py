"""The queue decides by a failure's code and keeps it beside the text: `rollouts.infra_code`,
`attempts.code`, the `results` items; a queue file from before the codes opens and gets the
codes of its old text. The trajectory's rollouts rows carry the code too."""
from __future__ import annotations

import random
import sqlite3

import pyarrow.parquet as pq
import pytest

from controller.analysis.query import connect
from controller.contracts.states import InfraReason
from controller.store import schema
from controller.store.catalog import Catalog
from controller.store.queue import QueueConfig, RolloutQueue
from nodeagent.store.writer import SchemaError, write_attempt
from tests.conftest import FakeClock
from tests.store.test_store import rollout_row

T0 = 1_700_000_000.0


def queue(path, **config) -> RolloutQueue:
    return RolloutQueue(path, clock=FakeClock(T0), rng=random.Random(0),
                        config=QueueConfig(lease_ttl_s=60.0, **config))


def fail(q: RolloutQueue, reason, n: int = 1) -> str:
    """Lease the rollout and end each attempt with an infra_error of `reason`; its state."""
    for _ in range(n):
        (lease,) = q.lease_next("n1", 1)
        c = q.complete(lease.rollout_id, lease.attempt, lease.token, "infra_error", None, {},
                       reason, f"i{lease.token}")
        assert c.accepted
        q.clock.advance(3600)
    return q.rollout(lease.rollout_id)["state"]


def test_a_typed_reason_is_charged_by_its_code_whatever_its_text_says(tmp_path):
    q = queue(tmp_path / "q.db", max_attempts=2, max_node_losses=5)
    q.submit_batch("s", [("t", 0)], 1)
    why = InfraReason("task", "model_server: the task's fixture says so")
    assert fail(q, why, 2) == "dead_letter"          # charged: max_attempts, not a loss
    row = q.rollout("b000001-00000")
    assert (row["failures"], row["losses"]) == (2, 0)
    assert (row["infra_code"], row["infra_reason"]) == ("task", why.text)
    assert [(a["code"], a["reason"]) for a in q.attempts("b000001-00000")] == [("task", why.text)] * 2
    (item,) = q.results_after(row["batch_id"], 0)[0]
    assert (item["state"], item["infra_code"], item["infra_reason"]) == ("dead_letter", "task", why.text)


def test_a_loss_code_counts_toward_node_losses_not_attempts(tmp_path):
    q = queue(tmp_path / "q.db", max_attempts=2, max_node_losses=5)
    q.submit_batch("s", [("t", 0)], 1)
    assert fail(q, InfraReason.of("model_server", "task: 500 from upstream"), 3) == "retry_wait"
    row = q.rollout("b000001-00000")
    assert (row["failures"], row["losses"], row["infra_code"]) == (0, 3, "model_server")


def test_the_queue_records_its_own_reasons_with_their_codes(tmp_path):
    q = queue(tmp_path / "q.db")
    batch, _, _ = q.submit_batch("s", [("t", 0), ("u", 0)], 1)
    (a, b) = q.lease_next("n1", 2)
    q.release_node("n1", "went silent", keep={b.rollout_id})
    assert q.rollout(a.rollout_id)["infra_code"] == "node_lost"
    assert q.rollout(a.rollout_id)["infra_reason"] == "node_lost: went silent"
    q.clock.advance(61)
    q.expire_leases()
    assert (q.rollout(b.rollout_id)["infra_code"], q.rollout(b.rollout_id)["infra_reason"]) == (
        "lease_expired", "lease_expired")
    q.lease_next("n1", 1)
    q.cancel(batch, reason="deadline")                   # a trainer's cancel code, not a deadline
    for rid in (a.rollout_id, b.rollout_id):
        row = q.rollout(rid)
        assert (row["state"], row["infra_code"], row["infra_reason"]) == ("cancelled", "cancelled", "deadline")
    assert {x["code"] for x in q.attempts(a.rollout_id) + q.attempts(b.rollout_id)} == {
        "node_lost", "lease_expired", "cancelled"}


def test_prose_from_an_older_broker_is_parsed_once_at_the_queue(tmp_path):
    q = queue(tmp_path / "q.db")
    q.submit_batch("s", [("t", 0)], 1)
    fail(q, "deadline: create: the create phase ran past its 300s deadline")
    row = q.rollout("b000001-00000")
    assert (row["infra_code"], row["losses"], row["failures"]) == ("deadline_create", 1, 0)


OLD_LAYOUT = [  # the tables of a queue file from before the codes
    "CREATE TABLE rollouts (rollout_id TEXT PRIMARY KEY, seq INTEGER NOT NULL UNIQUE,"
    " batch_id TEXT NOT NULL, task_ref TEXT NOT NULL, policy_version INTEGER NOT NULL,"
    " seed INTEGER NOT NULL, state TEXT NOT NULL, attempt INTEGER NOT NULL DEFAULT 0, token INTEGER,"
    " node TEXT, lease_deadline REAL, not_before REAL NOT NULL, created_at REAL NOT NULL,"
    " updated_at REAL NOT NULL, outcome TEXT, reward REAL, shards TEXT, infra_reason TEXT,"
    " commit_seq INTEGER UNIQUE, failures INTEGER NOT NULL DEFAULT 0, leased_at REAL,"
    " commit_idem TEXT, losses INTEGER NOT NULL DEFAULT 0)",
    "CREATE TABLE attempts (rollout_id TEXT NOT NULL, attempt INTEGER NOT NULL, token INTEGER NOT NULL,"
    " node TEXT NOT NULL, outcome TEXT, reason TEXT, started_at REAL NOT NULL, finished_at REAL,"
    " idem TEXT, reply TEXT, PRIMARY KEY (rollout_id, attempt))",
]


def test_a_queue_file_from_before_the_codes_opens_with_the_codes_of_its_text(tmp_path):
    path = tmp_path / "old.db"
    db = sqlite3.connect(path)
    for sql in OLD_LAYOUT:
        db.execute(sql)
    rows = [("r1", "dead_letter", "deadline: create: ran past"), ("r2", "cancelled", "deadline"),
            ("r3", "cancelled", "stale_policy"), ("r4", "retry_wait", "sandbox: x: y"),
            ("r5", "committed", None), ("r6", "dead_letter", "something new: z")]
    for i, (rid, state, why) in enumerate(rows):
        db.execute("INSERT INTO rollouts (rollout_id, seq, batch_id, task_ref, policy_version, seed,"
                   " state, not_before, created_at, updated_at, infra_reason) VALUES"
                   " (?, ?, 'b', 't', 0, 0, ?, 0, 0, 0, ?)", (rid, i, state, why))
    db.executemany("INSERT INTO attempts VALUES (?, ?, 1, 'n1', ?, ?, 0, 1, NULL, NULL)", [
        ("r1", 1, "infra_error", "node_lost: silent"), ("r1", 2, "released", "drain deadline"),
        ("r2", 1, "cancelled", "deadline"), ("r3", 1, "revoked", "stale_policy")])
    db.commit()
    db.close()
    q = queue(path)
    assert {rid: q.rollout(rid)["infra_code"] for rid, _, _ in rows} == {
        "r1": "deadline_create", "r2": "cancelled", "r3": "stale_policy", "r4": "sandbox",
        "r5": None, "r6": "unknown"}
    assert [(a["attempt"], a["code"]) for a in q.attempts("r1")] == [(1, "node_lost"), (2, None)]
    assert [a["code"] for a in q.attempts("r2") + q.attempts("r3")] == ["cancelled", "stale_policy"]
    q.close()
    again = sqlite3.connect(path)               # migrated once: the columns are there for good
    assert "infra_code" in {r[1] for r in again.execute("PRAGMA table_info(rollouts)")}
    again.close()
    queue(path).close()


def test_stored_code_reads_a_cancel_by_its_state():
    assert schema.stored_code("cancelled", "shutdown") == "cancelled"
    assert schema.stored_code("dead_letter", "shutdown: x") == "unknown"


def _rollouts_shard(run, shards) -> dict:
    return pq.read_table(run / shards["rollouts"]).to_pylist()[0]


def test_a_trajectory_row_carries_the_code_beside_the_text(tmp_path):
    why = InfraReason("verifier", "sandbox_start: the grader's own sandbox: no space")
    shards = write_attempt(tmp_path, "n1", rollout_row("r1", outcome="infra_error", infra_reason=why), [], [])
    row = _rollouts_shard(tmp_path, shards)
    assert (row["infra_code"], row["infra_reason"]) == ("verifier", why.text)
    text_only = rollout_row("r2", outcome="infra_error", infra_reason="store: disk: full")
    assert _rollouts_shard(tmp_path, write_attempt(tmp_path, "n1", text_only, [], []))["infra_code"] == "store"
    verdict = _rollouts_shard(tmp_path, write_attempt(tmp_path, "n1", rollout_row("r3"), [], []))
    assert (verdict["infra_code"], verdict["infra_reason"]) == (None, None)


@pytest.mark.parametrize("extra", [{"infra_code": "flaky_disk"},
                                   {"infra_code": "store", "infra_reason": InfraReason.of("task", "x")}])
def test_a_trajectory_row_with_a_bad_code_is_a_schema_error_naming_the_column(tmp_path, extra):
    with pytest.raises(SchemaError, match="rollouts.infra_code"):
        write_attempt(tmp_path, "n1", rollout_row("r1", outcome="infra_error", **extra), [], [])


def test_a_run_with_shards_from_before_the_codes_still_reads_its_reasons(tmp_path):
    cat = Catalog(tmp_path)
    old = write_attempt(tmp_path, "n1", rollout_row("r1", outcome="infra_error", infra_reason="sandbox: died"),
                        [], [])
    path = tmp_path / old["rollouts"]
    pq.write_table(pq.read_table(path).drop_columns(["infra_code"]), path)   # a shard of an older node
    new = write_attempt(tmp_path, "n1", rollout_row("r2", outcome="infra_error",
                                                    infra_reason=InfraReason.of("store", "full")), [], [])
    for rid, shards in (("r1", old), ("r2", new)):
        cat.commit(rid, 1, 1, shards, committed_at=T0)
    cat.flush()
    con = connect(tmp_path)
    try:
        rows = con.execute("SELECT rollout_id, infra_code, infra_reason FROM rollouts ORDER BY 1").fetchall()
        assert con.execute("SELECT count(*) FROM bad_shards").fetchone()[0] == 0
    finally:
        con.close()
    assert rows == [("r1", None, "sandbox: died"), ("r2", "store", "store: full")]
