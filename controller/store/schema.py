"""The rollout queue's SQLite layout: the tables, opening a database (WAL, synchronous=FULL)
with the migrations of older files, and the statements the queue runs on its hot paths.

The queue (queue.py) is the only code that runs these. Tables and indexes are described in
docs/protocol.md ("Durability").

Must not import: zmq, controller.broker, controller.cli, nodeagent.
"""
from __future__ import annotations

import contextlib
import sqlite3
from pathlib import Path
from typing import Any, Iterator, Sequence

from controller.contracts.states import (
    ATTEMPT_CANCELLED,
    CANCELLED,
    COMMITTED,
    HELD,
    INFRA_CANCELLED,
    INFRA_ERROR,
    LEASABLE,
    REVOKED,
    STALE_POLICY,
    UNFINISHED,
    InfraReason,
)

SCHEMA = """
CREATE TABLE IF NOT EXISTS meta (key TEXT PRIMARY KEY, value INTEGER NOT NULL);
CREATE TABLE IF NOT EXISTS rollouts (
    rollout_id TEXT PRIMARY KEY, seq INTEGER NOT NULL UNIQUE, batch_id TEXT NOT NULL,
    task_ref TEXT NOT NULL, policy_version INTEGER NOT NULL, seed INTEGER NOT NULL,
    state TEXT NOT NULL, attempt INTEGER NOT NULL DEFAULT 0, token INTEGER,
    node TEXT, lease_deadline REAL, not_before REAL NOT NULL,
    created_at REAL NOT NULL, updated_at REAL NOT NULL,
    outcome TEXT, reward REAL, shards TEXT, infra_reason TEXT, commit_seq INTEGER UNIQUE,
    failures INTEGER NOT NULL DEFAULT 0, leased_at REAL, commit_idem TEXT,
    losses INTEGER NOT NULL DEFAULT 0, infra_code TEXT);
CREATE INDEX IF NOT EXISTS rollouts_state ON rollouts (state, seq);
DROP INDEX IF EXISTS rollouts_node;
-- a batch's results in commit order, and its unfinished rollouts: those have no commit_seq
-- (BATCH_UNFINISHED_SQL; an index on (batch_id, state) would be rewritten by every state change)
CREATE INDEX IF NOT EXISTS rollouts_batch ON rollouts (batch_id, commit_seq);
DROP INDEX IF EXISTS rollouts_batch_state;
-- lease expiry reads only the leases past their deadline (lease_deadline is NULL off HELD)
CREATE INDEX IF NOT EXISTS rollouts_deadline ON rollouts (lease_deadline) WHERE lease_deadline IS NOT NULL;
CREATE TABLE IF NOT EXISTS attempts (
    rollout_id TEXT NOT NULL, attempt INTEGER NOT NULL, token INTEGER NOT NULL,
    node TEXT NOT NULL, outcome TEXT, reason TEXT, started_at REAL NOT NULL,
    finished_at REAL, idem TEXT, reply TEXT, code TEXT, PRIMARY KEY (rollout_id, attempt));
CREATE TABLE IF NOT EXISTS batches (
    batch_id TEXT PRIMARY KEY, idem TEXT NOT NULL UNIQUE, n INTEGER NOT NULL,
    created_at REAL NOT NULL, cancelled INTEGER NOT NULL DEFAULT 0);
CREATE TABLE IF NOT EXISTS idempotency (key TEXT PRIMARY KEY, reply TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS counters (name TEXT PRIMARY KEY, value INTEGER NOT NULL);
CREATE TABLE IF NOT EXISTS policies (
    version INTEGER PRIMARY KEY, endpoint TEXT NOT NULL, model TEXT NOT NULL,
    published_at REAL NOT NULL);
"""
COUNTERS = ("token", "commit_seq", "batch_seq", "rollout_seq")  # rows of `meta`


CACHE_KIB = 64 * 1024  # the queue connection's page cache
# The WAL is copied into the database file (a checkpoint, run by the COMMIT that passes the
# mark) every this many pages (SQLite's default: 1,000 pages, 4 MB): a farm's hot pages
# (the rows in flight, their indexes, `meta`) are rewritten by every pass, and a checkpoint
# writes each page once however often the WAL holds it. Durability is the same (every COMMIT
# fsyncs the WAL: synchronous=FULL); a reopen after a crash reads up to this many pages of
# WAL (40 MB) back; the replica ships every frame whenever the WAL restarts (replica.py).
WAL_AUTOCHECKPOINT_PAGES = 10_000


def connect(path: Path) -> sqlite3.Connection:
    """The queue's one connection: WAL, synchronous=FULL, the tables made or migrated."""
    db = sqlite3.connect(str(path), isolation_level=None, check_same_thread=False)
    db.row_factory = sqlite3.Row
    mode = db.execute("PRAGMA journal_mode=WAL").fetchone()[0]
    assert mode == "wal", f"SQLite refused WAL mode for {path}: {mode}"
    db.execute("PRAGMA synchronous=FULL")
    db.execute("PRAGMA busy_timeout=5000")
    db.execute(f"PRAGMA wal_autocheckpoint={WAL_AUTOCHECKPOINT_PAGES}")
    # The rows in flight (every held lease, tens of thousands on a large farm) and the
    # indexes stay in memory: with SQLite's default 2 MB cache each heartbeat's and result's
    # row is read again from the file.
    db.execute(f"PRAGMA cache_size=-{CACHE_KIB}")
    db.executescript(SCHEMA)  # idempotent; executescript commits on its own
    _migrate(db)
    return db


def _migrate(db: sqlite3.Connection) -> None:
    """Columns added since the first layout (each an ALTER TABLE of an older file)."""
    cols = {r[1] for r in db.execute("PRAGMA table_info(rollouts)")}
    if "failures" not in cols:  # a database from before failures were counted apart
        db.execute("ALTER TABLE rollouts ADD COLUMN failures INTEGER NOT NULL DEFAULT 0")
        db.execute("UPDATE rollouts SET failures = attempt")
    if "leased_at" not in cols:  # from before attempts rows were written when they end
        db.execute("ALTER TABLE rollouts ADD COLUMN leased_at REAL")
        db.execute("ALTER TABLE rollouts ADD COLUMN commit_idem TEXT")
    if "losses" not in cols:  # from before attempts lost with a node were counted apart
        db.execute("ALTER TABLE rollouts ADD COLUMN losses INTEGER NOT NULL DEFAULT 0")
    attempt_cols = {r[1] for r in db.execute("PRAGMA table_info(attempts)")}
    if "idem" not in attempt_cols:
        db.execute("ALTER TABLE attempts ADD COLUMN idem TEXT")
        db.execute("ALTER TABLE attempts ADD COLUMN reply TEXT")
    if "infra_code" not in cols:  # from before reasons had codes: the codes of the old text
        with _atomic(db):
            db.execute("ALTER TABLE rollouts ADD COLUMN infra_code TEXT")
            db.executemany("UPDATE rollouts SET infra_code = ? WHERE rollout_id = ?", [
                (stored_code(r[1], r[2]), r[0]) for r in db.execute(
                    "SELECT rollout_id, state, infra_reason FROM rollouts"
                    " WHERE infra_reason IS NOT NULL")])
    if "code" not in attempt_cols:
        with _atomic(db):
            db.execute("ALTER TABLE attempts ADD COLUMN code TEXT")
            db.executemany("UPDATE attempts SET code = ? WHERE rollout_id = ? AND attempt = ?", [
                (stored_code(r[2], r[3]), r[0], r[1]) for r in db.execute(
                    "SELECT rollout_id, attempt, outcome, reason FROM attempts"
                    f" WHERE reason IS NOT NULL AND outcome IN ({qs(_CODED_ATTEMPTS)})",
                    _CODED_ATTEMPTS)])


@contextlib.contextmanager
def _atomic(db: sqlite3.Connection) -> Iterator[None]:
    """One transaction (the connection is in autocommit mode): a column and its values."""
    db.execute("BEGIN IMMEDIATE")
    try:
        yield
    except BaseException:
        db.execute("ROLLBACK")
        raise
    db.execute("COMMIT")


# The attempts whose reason has a code: failed, cancelled, revoked (a handback's reason is
# the agent's free text, no failure).
_CODED_ATTEMPTS = (INFRA_ERROR, ATTEMPT_CANCELLED, REVOKED)


def stored_code(state: str, text: str) -> str:
    """The code of a reason stored as text only (a file from before the codes), by the row's
    state (a rollout's) or outcome (an attempt's): a cancel's text is its cancel code."""
    if text == STALE_POLICY:
        return STALE_POLICY
    if state in (CANCELLED, ATTEMPT_CANCELLED):
        return INFRA_CANCELLED
    return InfraReason.parse(text).code


def qs(values: Sequence[Any]) -> str:
    """`?, ?, ...`: one placeholder per value."""
    return ", ".join("?" for _ in values)


def any_of(column: str, values: Sequence[Any]) -> str:
    """`(column = ? OR ...)`: a filter on a row found by another index. (`column IN (?, ...)`
    would make SQLite build an ephemeral b-tree of the list on every execution.)"""
    return "(" + " OR ".join(f"{column} = ?" for _ in values) + ")"


def lease_sql(n: int) -> str:
    """Lease n (rollout_id, token, node) triples in one statement. The WHERE clause admits
    only LEASABLE states, all of which may become LEASED (asserted on the table at import).
    Parameters: LEASED, deadline, now, now, the triples, *LEASABLE, now."""
    return (f"UPDATE rollouts SET state = ?, attempt = attempt + 1, token = v.tok,"
            f" node = v.node, lease_deadline = ?, updated_at = ?, leased_at = ?"
            f" FROM (SELECT"
            f" column1 AS rid, column2 AS tok, column3 AS node FROM (VALUES"
            f" {', '.join('(?, ?, ?)' for _ in range(n))})) AS v WHERE"
            f" rollouts.rollout_id = v.rid AND rollouts.state IN ({qs(LEASABLE)})"
            f" AND rollouts.not_before <= ? RETURNING rollouts.rollout_id,"
            f" rollouts.attempt, task_ref, policy_version, seed, batch_id")


LIVE_COUNTS_SQL = (f"SELECT state, COUNT(*) FROM rollouts WHERE state IN ({qs(UNFINISHED)})"
                   f" GROUP BY state")
COMMIT_HELD_SQL = (
    f"UPDATE rollouts SET state = ?, outcome = ?, reward = ?, shards = ?, lease_deadline = NULL,"
    f" commit_seq = ?, updated_at = ?, commit_idem = ? WHERE rollout_id = ? AND attempt = ? AND"
    f" token = ? AND {any_of('state', HELD)}")
# The leases past their deadline (expire_leases: most were renewed, only their deadline is
# rewritten), by the deadline index; the parameters: now, then HELD.
DUE_DEADLINES_SQL = ("SELECT seq, rollout_id, node, leased_at FROM rollouts INDEXED BY rollouts_deadline"
                     f" WHERE lease_deadline <= ? AND +state IN ({qs(HELD)})")
# A `started` noted in memory (RolloutQueue.note_started) written: leased -> running where the
# row still holds that attempt and token (a no-op otherwise); parameters: RUNNING, now,
# rollout_id, attempt, token, LEASED. With its renewed deadline (expire_leases): RUNNING,
# deadline, now, rollout_id, attempt, token, LEASED.
STARTED_SQL = ("UPDATE rollouts SET state = ?, updated_at = ? WHERE rollout_id = ? AND attempt = ?"
               " AND token = ? AND state = ?")
STARTED_DEADLINE_SQL = ("UPDATE rollouts SET state = ?, lease_deadline = ?, updated_at = ? WHERE"
                        " rollout_id = ? AND attempt = ? AND token = ? AND state = ?")
# Whether a batch has an unfinished rollout: an unfinished one has no commit_seq (only the
# terminal states are given one; a cancelled rollout may have none), so the batch's entries
# with a NULL commit_seq are the only ones read.
BATCH_UNFINISHED_SQL = (f"SELECT 1 FROM rollouts INDEXED BY rollouts_batch WHERE batch_id = ? AND"
                        f" commit_seq IS NULL AND state IN ({qs(UNFINISHED)}) LIMIT 1")
IS_COMMITTED_SQL = (f"SELECT 1 FROM rollouts WHERE rollout_id = ? AND attempt = ? AND token = ?"
                    f" AND commit_idem = ? AND state = '{COMMITTED}'")
# An attempt's row, written when it ends (a database from before that wrote it at lease
# time: the row is there, its end is filled in).
ATTEMPT_UPSERT_SQL = (
    "INSERT INTO attempts (rollout_id, attempt, token, node, started_at, outcome, reason,"
    " finished_at, idem, reply, code) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?) ON CONFLICT"
    " (rollout_id, attempt) DO UPDATE SET outcome = excluded.outcome, reason = excluded.reason,"
    " finished_at = excluded.finished_at, idem = excluded.idem, reply = excluded.reply,"
    " code = excluded.code")
RESULT_KEYS = ("rollout_id", "batch_id", "task_ref", "policy_version", "seed", "state",
               "attempt", "token", "node", "outcome", "reward", "shards", "infra_reason",
               "commit_seq", "infra_code")  # a result item (watch): these columns, in this order
RESULTS_SQL = (f"SELECT {', '.join(RESULT_KEYS)} FROM rollouts WHERE batch_id = ? AND"
               f" commit_seq > ? ORDER BY commit_seq LIMIT ?")
COUNTER_ADD_SQL = ("INSERT INTO counters VALUES (?, ?) ON CONFLICT (name) DO UPDATE SET"
                   " value = value + excluded.value")  # the broker's status counters
