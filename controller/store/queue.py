"""Durable rollout queue: states, leases, fencing tokens, retry with backoff, dead letter.

One SQLite file in WAL mode with synchronous=FULL, one connection, every mutation in one
`BEGIN IMMEDIATE` transaction, so whatever a method returned is on disk. Dropping the object
without `close()` (a crash) loses nothing that was acknowledged: in-flight leases stay leased
until they expire or their holder completes with its still-valid token.

Rollout states and their legal transitions are the table `TRANSITIONS`, asserted on every
change. Every lease takes the next value of one global fencing token; a result is accepted
only with the rollout's current (attempt, token) while it is leased, running or verifying.
Infrastructure failures (infra_error, an expired lease, a lost node) go to retry_wait with
full-jitter exponential backoff, and to dead_letter after `max_attempts`; every attempt's
reason is kept in the attempts table.

Time is injected: `clock()` returns epoch seconds (deadlines are persisted, so wall time).
Must not import zmq. See docs/protocol.md for the state table and the rules.
"""
from __future__ import annotations

import json
import logging
import math
import random
import sqlite3
import time
from collections import Counter
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterator, Optional, Sequence

log = logging.getLogger(__name__)

QUEUED = "queued"
LEASED = "leased"
RUNNING = "running"
VERIFYING = "verifying"
COMMITTED = "committed"
RETRY_WAIT = "retry_wait"
DEAD_LETTER = "dead_letter"
CANCELLED = "cancelled"

# The rollout state table: state -> states it may move to. Nothing else is legal.
TRANSITIONS: dict[str, frozenset[str]] = {
    QUEUED: frozenset({LEASED, CANCELLED}),
    LEASED: frozenset({QUEUED, RUNNING, VERIFYING, COMMITTED, RETRY_WAIT, DEAD_LETTER,
                       CANCELLED}),
    RUNNING: frozenset({QUEUED, VERIFYING, COMMITTED, RETRY_WAIT, DEAD_LETTER, CANCELLED}),
    VERIFYING: frozenset({QUEUED, COMMITTED, RETRY_WAIT, DEAD_LETTER, CANCELLED}),
    RETRY_WAIT: frozenset({LEASED, CANCELLED}),
    COMMITTED: frozenset(),
    DEAD_LETTER: frozenset(),
    CANCELLED: frozenset(),
}
STATES: tuple[str, ...] = tuple(TRANSITIONS)
HELD = (LEASED, RUNNING, VERIFYING)  # a node holds a lease on the rollout
LEASABLE = (QUEUED, RETRY_WAIT)
TERMINAL = (COMMITTED, DEAD_LETTER, CANCELLED)

POLICY_OUTCOMES = ("pass", "fail", "timeout")  # the policy's doing: committed
INFRA_ERROR = "infra_error"  # never the policy's fault: retried, then dead-lettered
OUTCOMES = POLICY_OUTCOMES + (INFRA_ERROR,)

# Rejection reasons (shared with protocol.Reject).
STALE_TOKEN = "stale_token"
UNKNOWN_ROLLOUT = "unknown_rollout"
REJECT_CANCELLED = "cancelled"

LEASE_EXPIRED = "lease_expired"
STALE_POLICY = "stale_policy"
STALE_POLICY_ACTIONS = ("rerun", "drop")


_LEASE_IS_LEGAL = all(LEASED in TRANSITIONS[s] for s in LEASABLE)
assert _LEASE_IS_LEGAL, "every leasable state must be allowed to become leased"
_COMMIT_IS_LEGAL = all(COMMITTED in TRANSITIONS[s] for s in HELD)
assert _COMMIT_IS_LEGAL, "every held state must be allowed to become committed"


def check_transition(rollout_id: str, old: str, new: str) -> None:
    assert new in TRANSITIONS[old], (
        f"illegal rollout transition {old} -> {new} for rollout {rollout_id}")


@dataclass(frozen=True)
class QueueConfig:
    lease_ttl_s: float = 60.0
    max_attempts: int = 4
    backoff_base_s: float = 1.0
    backoff_max_s: float = 30.0
    max_batch_rollouts: int = 100_000
    max_results_per_watch: int = 1000
    max_staleness: Optional[int] = None  # policy versions a queued rollout may lag; None: any
    stale_policy: str = "rerun"  # rerun (with the newest policy) | drop (cancelled, reported)

    def __post_init__(self) -> None:
        if self.max_staleness is not None and not (
                isinstance(self.max_staleness, int) and self.max_staleness >= 0):
            raise ValueError(f"queue.max_staleness must be an integer >= 0 or null, "
                             f"got {self.max_staleness!r}")
        if self.stale_policy not in STALE_POLICY_ACTIONS:
            raise ValueError(f"queue.stale_policy must be one of {STALE_POLICY_ACTIONS}, "
                             f"got {self.stale_policy!r}")
        for key in ("lease_ttl_s", "backoff_base_s", "backoff_max_s"):
            if not getattr(self, key) > 0:
                raise ValueError(f"queue.{key} must be > 0, got {getattr(self, key)!r}")
        for key in ("max_attempts", "max_batch_rollouts", "max_results_per_watch"):
            if not (isinstance(getattr(self, key), int) and getattr(self, key) >= 1):
                raise ValueError(f"queue.{key} must be an integer >= 1, got {getattr(self, key)!r}")


@dataclass(frozen=True)
class Lease:
    rollout_id: str
    attempt: int
    token: int
    task_ref: str
    policy_version: int
    seed: int
    batch_id: str
    node: str = ""


@dataclass(frozen=True)
class Completion:
    accepted: bool
    reason: Optional[str]  # why rejected (stale_token, unknown_rollout, cancelled) or None
    committed: bool  # the rollout is now committed (pass/fail/timeout)
    duplicate: bool = field(default=False, compare=False)  # the stored reply of a repeat


@dataclass(frozen=True)
class Due:
    """A rollout that may be leased now (input to placement)."""
    rollout_id: str
    task_ref: str
    policy_version: int


@dataclass(frozen=True)
class Cancellation:
    rollouts: int  # how many moved to cancelled
    revoked: tuple[tuple[str, str, int, int], ...]  # (rollout_id, node, attempt, token) held


@dataclass(frozen=True)
class Policy:
    version: int
    endpoint: str
    model: str
    published_at: float


class PolicyConflict(ValueError):
    """A policy version was published twice with different contents."""


class UnknownBatch(KeyError):
    pass


_SCHEMA = """
CREATE TABLE IF NOT EXISTS meta (key TEXT PRIMARY KEY, value INTEGER NOT NULL);
CREATE TABLE IF NOT EXISTS rollouts (
    rollout_id TEXT PRIMARY KEY, seq INTEGER NOT NULL UNIQUE, batch_id TEXT NOT NULL,
    task_ref TEXT NOT NULL, policy_version INTEGER NOT NULL, seed INTEGER NOT NULL,
    state TEXT NOT NULL, attempt INTEGER NOT NULL DEFAULT 0, token INTEGER,
    node TEXT, lease_deadline REAL, not_before REAL NOT NULL,
    created_at REAL NOT NULL, updated_at REAL NOT NULL,
    outcome TEXT, reward REAL, shards TEXT, infra_reason TEXT, commit_seq INTEGER UNIQUE,
    failures INTEGER NOT NULL DEFAULT 0, leased_at REAL, commit_idem TEXT);
CREATE INDEX IF NOT EXISTS rollouts_state ON rollouts (state, seq);
DROP INDEX IF EXISTS rollouts_node;
CREATE INDEX IF NOT EXISTS rollouts_batch ON rollouts (batch_id, commit_seq);
CREATE INDEX IF NOT EXISTS rollouts_batch_state ON rollouts (batch_id, state);
CREATE TABLE IF NOT EXISTS attempts (
    rollout_id TEXT NOT NULL, attempt INTEGER NOT NULL, token INTEGER NOT NULL,
    node TEXT NOT NULL, outcome TEXT, reason TEXT, started_at REAL NOT NULL,
    finished_at REAL, idem TEXT, reply TEXT, PRIMARY KEY (rollout_id, attempt));
CREATE TABLE IF NOT EXISTS batches (
    batch_id TEXT PRIMARY KEY, idem TEXT NOT NULL UNIQUE, n INTEGER NOT NULL,
    created_at REAL NOT NULL, cancelled INTEGER NOT NULL DEFAULT 0);
CREATE TABLE IF NOT EXISTS idempotency (key TEXT PRIMARY KEY, reply TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS policies (
    version INTEGER PRIMARY KEY, endpoint TEXT NOT NULL, model TEXT NOT NULL,
    published_at REAL NOT NULL);
"""


class RolloutQueue:
    def __init__(self, path: str | Path, clock: Callable[[], float] = time.time,
                 rng: random.Random | None = None, config: QueueConfig = QueueConfig()):
        self.path = Path(path)
        self.clock = clock
        self.rng = rng if rng is not None else random.Random()
        self.config = config
        self._db = sqlite3.connect(str(self.path), isolation_level=None,
                                   check_same_thread=False)
        self._db.row_factory = sqlite3.Row
        mode = self._db.execute("PRAGMA journal_mode=WAL").fetchone()[0]
        assert mode == "wal", f"SQLite refused WAL mode for {self.path}: {mode}"
        self._db.execute("PRAGMA synchronous=FULL")
        self._db.execute("PRAGMA busy_timeout=5000")
        self._db.executescript(_SCHEMA)  # idempotent; executescript commits on its own
        cols = {r[1] for r in self._db.execute("PRAGMA table_info(rollouts)")}
        if "failures" not in cols:  # a database from before failures were counted apart
            self._db.execute("ALTER TABLE rollouts ADD COLUMN failures INTEGER NOT NULL"
                             " DEFAULT 0")
            self._db.execute("UPDATE rollouts SET failures = attempt")
        if "leased_at" not in cols:  # from before attempts rows were written when they end
            self._db.execute("ALTER TABLE rollouts ADD COLUMN leased_at REAL")
            self._db.execute("ALTER TABLE rollouts ADD COLUMN commit_idem TEXT")
        if "idem" not in {r[1] for r in self._db.execute("PRAGMA table_info(attempts)")}:
            self._db.execute("ALTER TABLE attempts ADD COLUMN idem TEXT")
            self._db.execute("ALTER TABLE attempts ADD COLUMN reply TEXT")
        self._depth = 0
        self._terminal_delta: Counter = Counter()  # entered in the open transaction
        self._idle_until = -math.inf  # due() is empty before this (see due)
        self._terminal: Counter = Counter({s: n for s, n in self._db.execute(
            f"SELECT state, COUNT(*) FROM rollouts WHERE state IN ({_qs(TERMINAL)})"
            f" GROUP BY state", TERMINAL)})
        with self._tx():
            for key in ("token", "commit_seq", "batch_seq", "rollout_seq"):
                self._db.execute("INSERT OR IGNORE INTO meta VALUES (?, 0)", (key,))
        # Commit sequence numbers live with the rows they order: the next one follows the
        # largest on disk (a rolled-back transaction leaves a gap, never a repeat).
        self._commit_seq = max(
            self._db.execute("SELECT value FROM meta WHERE key = 'commit_seq'").fetchone()[0],
            self._db.execute("SELECT COALESCE(MAX(commit_seq), 0) FROM rollouts").fetchone()[0])

    def close(self) -> None:
        self._db.close()

    # ---- plumbing ----

    @contextmanager
    def _tx(self) -> Iterator[sqlite3.Connection]:
        """One transaction; inside `batch()` it joins the batch's transaction."""
        if self._depth:
            self._depth += 1
            try:
                yield self._db
            finally:
                self._depth -= 1
            return
        self._db.execute("BEGIN IMMEDIATE")
        self._depth = 1
        self._terminal_delta.clear()
        try:
            yield self._db
        except BaseException:
            self._depth = 0
            self._terminal_delta.clear()
            self._idle_until = -math.inf  # what due() learnt inside may be rolled back
            self._db.execute("ROLLBACK")
            raise
        self._depth = 0
        try:
            self._db.execute("COMMIT")
        finally:
            delta, self._terminal_delta = self._terminal_delta, Counter()
        for state, n in delta.items():  # counted only once on disk
            self._terminal[state] += n

    @contextmanager
    def batch(self) -> Iterator[None]:
        """Group commit: every mutation inside is one transaction, durable when this exits.

        The caller must not acknowledge anything done inside before the block has exited.
        Methods that refuse a request (ValueError, UnknownBatch, PolicyConflict) do so before
        writing anything, so a refusal inside a batch leaves the batch's other work intact;
        any other exception rolls back the whole batch.
        """
        with self._tx():
            yield

    def _next(self, key: str, n: int = 1) -> int:
        """Advance a persisted counter by n; returns its new value (the last of the n)."""
        return self._db.execute("UPDATE meta SET value = value + ? WHERE key = ? RETURNING value",
                                (n, key)).fetchone()[0]

    def _next_commit_seq(self) -> int:
        self._commit_seq += 1
        return self._commit_seq

    def _move(self, row: sqlite3.Row, new: str, now: float, **cols: Any) -> None:
        """Change one rollout's state (asserting the table) and any other columns."""
        check_transition(row["rollout_id"], row["state"], new)
        if new in TERMINAL:
            self._terminal_delta[new] += 1
        elif new in LEASABLE:
            self._idle_until = -math.inf  # due() must look again
        cols.update(state=new, updated_at=now)
        sets = ", ".join(f"{k} = ?" for k in cols)
        cur = self._db.execute(f"UPDATE rollouts SET {sets} WHERE rollout_id = ? AND state = ?",
                               (*cols.values(), row["rollout_id"], row["state"]))
        assert cur.rowcount == 1, f"rollout {row['rollout_id']} changed under us"
        log.info("rollout %s attempt %s: %s -> %s", row["rollout_id"], row["attempt"],
                 row["state"], new)

    def _idem_get(self, key: str) -> Optional[Any]:
        r = self._db.execute("SELECT reply FROM idempotency WHERE key = ?", (key,)).fetchone()
        return None if r is None else json.loads(r[0])

    def _idem_put(self, key: str, reply: Any) -> None:
        self._db.execute("INSERT INTO idempotency VALUES (?, ?)", (key, json.dumps(reply)))

    def _row(self, rollout_id: str) -> Optional[sqlite3.Row]:
        return self._db.execute("SELECT * FROM rollouts WHERE rollout_id = ?",
                                (rollout_id,)).fetchone()

    def backoff_s(self, attempt: int) -> float:
        """Full jitter: uniform(0, min(max, base * 2**(attempt-1)))."""
        cap = min(self.config.backoff_max_s, self.config.backoff_base_s * 2 ** (attempt - 1))
        return self.rng.uniform(0.0, cap)

    # ---- submit / cancel ----

    def submit_batch(self, idem: str, items: Sequence[tuple[str, int]],
                     n_per_task: int) -> tuple[str, int, bool]:
        """Enqueue n_per_task rollouts of each (task_ref, policy_version).

        Returns (batch_id, n, duplicate); a repeated idem returns the first reply unchanged.
        """
        with self._tx():
            stored = self._idem_get("submit:" + idem)
            if stored is not None:
                return stored["batch_id"], stored["rollouts"], True
            if n_per_task < 1:
                raise ValueError(f"n_per_task must be >= 1, got {n_per_task}")
            n = len(items) * n_per_task
            if n > self.config.max_batch_rollouts:
                raise ValueError(f"batch of {n} rollouts exceeds queue.max_batch_rollouts="
                                 f"{self.config.max_batch_rollouts}")
            now = self.clock()
            self._idle_until = -math.inf  # due() must look again
            batch_id = f"b{self._next('batch_seq'):06d}"
            self._db.execute("INSERT INTO batches VALUES (?, ?, ?, ?, 0)",
                             (batch_id, idem, n, now))
            seq = self._next("rollout_seq", n) - n  # one block of submission numbers
            rows = []
            for task_ref, policy_version in items:
                for _ in range(n_per_task):
                    rows.append((f"{batch_id}-{len(rows):05d}", seq + len(rows) + 1, batch_id,
                                 task_ref, int(policy_version), self.rng.getrandbits(31), QUEUED,
                                 now, now, now))
            self._db.executemany(
                "INSERT INTO rollouts (rollout_id, seq, batch_id, task_ref, policy_version, seed,"
                " state, not_before, created_at, updated_at) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
                rows)
            self._idem_put("submit:" + idem, {"batch_id": batch_id, "rollouts": n})
        log.info("batch %s submitted: %d rollouts (idem %s)", batch_id, n, idem)
        return batch_id, n, False

    def submitted(self, idem: str) -> bool:
        """Whether a submit with this idempotency key was accepted (its reply is stored)."""
        return self._idem_get("submit:" + idem) is not None

    def cancel_batch(self, batch_id: str) -> int:
        """Cancel every rollout of the batch not yet terminal; returns how many."""
        return self.cancel(batch_id).rollouts

    def cancel(self, batch_id: str, idem: Optional[str] = None) -> Cancellation:
        """Cancel a batch (idempotent with `idem`: a duplicate gets the first reply).

        Returns how many rollouts were cancelled and the leases that were held, so the
        broker can tell their nodes. Raises UnknownBatch.
        """
        with self._tx():
            if idem is not None:
                stored = self._idem_get("cancel:" + idem)
                if stored is not None:
                    return Cancellation(stored["rollouts"], ())
            if self._db.execute("SELECT 1 FROM batches WHERE batch_id = ?",
                                (batch_id,)).fetchone() is None:
                raise UnknownBatch(batch_id)
            now = self.clock()
            self._db.execute("UPDATE batches SET cancelled = 1 WHERE batch_id = ?", (batch_id,))
            rows = self._db.execute(
                f"SELECT * FROM rollouts WHERE batch_id = ? AND state NOT IN "
                f"({_qs(TERMINAL)})", (batch_id, *TERMINAL)).fetchall()
            revoked = []
            for row in rows:
                if row["state"] in HELD:
                    self._finish_attempt(row, now, "cancelled", "batch cancelled")
                    revoked.append((row["rollout_id"], row["node"], row["attempt"], row["token"]))
                self._move(row, CANCELLED, now, lease_deadline=None)
            if idem is not None:
                self._idem_put("cancel:" + idem, {"rollouts": len(rows)})
        log.info("batch %s cancelled: %d rollouts", batch_id, len(rows))
        return Cancellation(len(rows), tuple(revoked))

    # ---- leases ----

    def lease_next(self, node: str, n: int) -> list[Lease]:
        """Lease up to n due rollouts (oldest first) to `node`, each with a fresh token."""
        if n <= 0:
            return []
        return self.lease_to([(d.rollout_id, node) for d in self.due(n)])

    def due(self, limit: int) -> list[Due]:
        """Up to `limit` rollouts that may be leased now, oldest submission first (read only).

        When none is due, the earliest `not_before` of the leasable rollouts is remembered:
        until then (or until a rollout becomes leasable: a submit, a hand-back, a failure)
        the answer is empty without a query (the broker asks on every pass)."""
        now = self.clock()
        if limit <= 0 or now < self._idle_until:
            return []
        rows = [Due(r[0], r[1], r[2]) for r in self._db.execute(
            "SELECT rollout_id, task_ref, policy_version FROM rollouts WHERE state IN"
            f" ({_qs(LEASABLE)}) AND not_before <= ? ORDER BY seq LIMIT ?",
            (*LEASABLE, now, limit))]
        if not rows:
            nxt = self._db.execute(f"SELECT MIN(not_before) FROM rollouts WHERE state IN"
                                   f" ({_qs(LEASABLE)})", LEASABLE).fetchone()[0]
            self._idle_until = float("inf") if nxt is None else nxt
        return rows

    def lease_to(self, assignments: Sequence[tuple[str, str]]) -> list[Lease]:
        """Lease each (rollout_id, node), each with a fresh token; a rollout that is no longer
        due (leased meanwhile, cancelled) is skipped."""
        leases = []
        if not assignments:
            return leases
        with self._tx():
            now = self.clock()
            # One block of fencing tokens for the whole call (unused ones are a gap).
            token = self._next("token", len(assignments)) - len(assignments)
            tokens = {rid: (token + i + 1, node) for i, (rid, node) in enumerate(assignments)}
            got: dict[str, tuple] = {}
            items = list(tokens.items())
            for i in range(0, len(items), _LEASE_CHUNK):
                chunk = items[i:i + _LEASE_CHUNK]
                # One statement per chunk; the WHERE clause admits only LEASABLE states, all
                # of which may become LEASED (asserted on the table at import).
                for r in self._db.execute(
                        f"UPDATE rollouts SET state = ?, attempt = attempt + 1, token = v.tok,"
                        f" node = v.node, lease_deadline = ?, updated_at = ?, leased_at = ?"
                        f" FROM (SELECT"
                        f" column1 AS rid, column2 AS tok, column3 AS node FROM (VALUES"
                        f" {', '.join('(?, ?, ?)' for _ in chunk)})) AS v WHERE"
                        f" rollouts.rollout_id = v.rid AND rollouts.state IN ({_qs(LEASABLE)})"
                        f" AND rollouts.not_before <= ? RETURNING rollouts.rollout_id,"
                        f" rollouts.attempt, task_ref, policy_version, seed, batch_id",
                        (LEASED, now + self.config.lease_ttl_s, now, now,
                         *(x for rid, (tok, node) in chunk for x in (rid, tok, node)),
                         *LEASABLE, now)):
                    got[r[0]] = r
            for rollout_id, (tok, node) in tokens.items():  # in the order asked
                r = got.get(rollout_id)
                if r is None:
                    continue
                leases.append(Lease(rollout_id, r[1], tok, r[2], r[3], r[4], r[5], node))
            # The attempt's row is written when it ends (`_finish_attempt`); until then
            # `attempts()` shows it from the rollout's row.
            log.debug("%d rollouts leased", len(leases))
        return leases

    def _held(self, rollout_id: str, attempt: int, token: int) -> tuple[Optional[sqlite3.Row],
                                                                        Optional[str]]:
        """The rollout row if (attempt, token) is its live lease, else a rejection reason."""
        row = self._row(rollout_id)
        if row is None:
            return None, UNKNOWN_ROLLOUT
        if row["state"] == CANCELLED:
            return None, REJECT_CANCELLED
        if row["state"] not in HELD or row["attempt"] != attempt or row["token"] != token:
            return None, STALE_TOKEN
        return row, None

    def mark_running(self, rollout_id: str, attempt: int, token: int) -> Completion:
        """The holder started the rollout: leased -> running, deadline renewed."""
        with self._tx():
            now = self.clock()
            check_transition(rollout_id, LEASED, RUNNING)
            cur = self._db.execute(
                "UPDATE rollouts SET state = ?, lease_deadline = ?, updated_at = ? WHERE"
                " rollout_id = ? AND attempt = ? AND token = ? AND state = ?",
                (RUNNING, now + self.config.lease_ttl_s, now, rollout_id, attempt, token, LEASED))
            if cur.rowcount == 1:
                log.debug("rollout %s attempt %s: leased -> running", rollout_id, attempt)
                return Completion(True, None, False)
            row, reason = self._held(rollout_id, attempt, token)  # already running, or stale
        return Completion(row is not None, reason, False)

    def mark_verifying(self, rollout_id: str, attempt: int, token: int) -> Completion:
        with self._tx():
            row, reason = self._held(rollout_id, attempt, token)
            if row is None:
                return Completion(False, reason, False)
            if row["state"] != VERIFYING:
                now = self.clock()
                self._move(row, VERIFYING, now, lease_deadline=now + self.config.lease_ttl_s)
        return Completion(True, None, False)

    def renew(self, node: str, rollout_ids: Optional[Sequence[str]] = None) -> int:
        """Extend the deadline of the leases `node` holds (only those of `rollout_ids` when
        given: a lease the node never received must not be kept alive by its heartbeats);
        returns how many."""
        with self._tx():
            now = self.clock()
            sql = (f"UPDATE rollouts SET lease_deadline = ?, updated_at = ? WHERE node = ?"
                   f" AND {_any_of('state', HELD)}")
            args = [now + self.config.lease_ttl_s, now, node, *HELD]
            if rollout_ids is not None:
                if not rollout_ids:
                    return 0
                sql += f" AND rollout_id IN ({_qs(rollout_ids)})"
                args += list(rollout_ids)
            return self._db.execute(sql, args).rowcount

    def complete(self, rollout_id: str, attempt: int, token: int, outcome: str,
                 reward: Optional[float], shards: dict[str, str], infra_reason: Optional[str],
                 idem: str) -> Completion:
        """Record a result. Stale tokens are rejected and change nothing; duplicates of an
        accepted result (same idem) get the stored completion."""
        if outcome not in OUTCOMES:
            raise ValueError(f"outcome must be one of {OUTCOMES}, got {outcome!r}")
        with self._tx():
            if outcome in POLICY_OUTCOMES and self._commit_held(
                    rollout_id, attempt, token, outcome, reward, shards, idem):
                return _COMMITTED
            row, reason = self._held(rollout_id, attempt, token)
            if row is None:
                stored = self._stored_completion(rollout_id, attempt, token, idem)
                if stored is not None:
                    return stored
                log.info("rollout %s attempt %d: result rejected (%s, token %d)", rollout_id,
                         attempt, reason, token)
                return Completion(False, reason, False)
            now = self.clock()
            # The reply is stored with the attempt it ends (the idempotency record).
            if outcome in POLICY_OUTCOMES:
                if reward is None and outcome != "pass":
                    reward = 0.0
                result = Completion(True, None, True)
                self._move(row, COMMITTED, now, outcome=outcome, reward=reward, commit_idem=idem,
                           shards=json.dumps(shards, sort_keys=True), lease_deadline=None,
                           commit_seq=self._next_commit_seq())
            else:
                result = Completion(True, None, False)
                self._fail_attempt(row, now, infra_reason or INFRA_ERROR, retry_now=False,
                                   idem=idem, reply=result)
        return result

    def _commit_held(self, rollout_id: str, attempt: int, token: int, outcome: str,
                     reward: Optional[float], shards: dict[str, str], idem: str) -> bool:
        """The common case of `complete` in one statement: if (attempt, token) is the live
        lease, commit it (any held state may become committed: _COMMIT_IS_LEGAL); False
        (nothing changed) otherwise. The committed attempt is the rollout's row itself (no
        attempts row: `attempts()` shows it from there, and a repeat of its result is
        answered from there)."""
        now = self.clock()
        if reward is None and outcome != "pass":
            reward = 0.0
        seq = self._commit_seq + 1
        cur = self._db.execute(
            _COMMIT_HELD_SQL,
            (COMMITTED, outcome, reward, json.dumps(shards, sort_keys=True) if shards else "{}",
             seq, now, idem, rollout_id, attempt, token, *HELD))
        if cur.rowcount != 1:
            return False
        self._commit_seq = seq
        self._terminal_delta[COMMITTED] += 1
        log.debug("rollout %s attempt %d: committed (%s)", rollout_id, attempt, outcome)
        return True

    def _stored_completion(self, rollout_id: str, attempt: int, token: int,
                           idem: str) -> Optional[Completion]:
        """The stored reply of a result already accepted under this idempotency key: the
        rollout committed with it (its row keeps the key), or an attempt row keeps it."""
        if self._db.execute(_IS_COMMITTED_SQL, (rollout_id, attempt, token, idem)).fetchone():
            return Completion(True, None, True, duplicate=True)
        r = self._db.execute("SELECT reply FROM attempts WHERE rollout_id = ? AND attempt = ?"
                             " AND idem = ?", (rollout_id, attempt, idem)).fetchone()
        stored = json.loads(r[0]) if r is not None else self._idem_get("complete:" + idem)
        return None if stored is None else Completion(**{**stored, "duplicate": True})

    def _finish_attempt(self, row: sqlite3.Row, now: float, outcome: str,
                        reason: Optional[str], idem: Optional[str] = None,
                        reply: Optional[Completion] = None) -> None:
        """Write the ended attempt's row (`row` is the rollout's row while it was held)."""
        started = row["leased_at"] if row["leased_at"] is not None else row["updated_at"]
        self._db.execute(_ATTEMPT_UPSERT_SQL, (
            row["rollout_id"], row["attempt"], row["token"], row["node"], started, outcome,
            reason, now, idem, None if reply is None else json.dumps(
                {"accepted": reply.accepted, "reason": reply.reason,
                 "committed": reply.committed})))

    def _fail_attempt(self, row: sqlite3.Row, now: float, reason: str, retry_now: bool,
                      idem: Optional[str] = None, reply: Optional[Completion] = None) -> str:
        """An infrastructure failure of the current attempt: retry_wait or dead_letter."""
        self._finish_attempt(row, now, INFRA_ERROR, reason, idem, reply)
        failures = row["failures"] + 1
        if failures >= self.config.max_attempts:
            self._move(row, DEAD_LETTER, now, outcome=INFRA_ERROR, reward=None,
                       infra_reason=reason, lease_deadline=None, failures=failures,
                       commit_seq=self._next_commit_seq())
            log.warning("rollout %s dead-lettered after %d attempts (last: %s)",
                        row["rollout_id"], row["attempt"], reason)
            return DEAD_LETTER
        delay_s = 0.0 if retry_now else self.backoff_s(failures)
        self._move(row, RETRY_WAIT, now, infra_reason=reason, lease_deadline=None,
                   not_before=now + delay_s, failures=failures)
        return RETRY_WAIT

    def release(self, rollout_id: str, attempt: int, token: int, reason: str) -> Completion:
        """The holder hands the lease back unfinished (drain): queued again at once, and the
        attempt does not count as a failure. Fenced like a result."""
        with self._tx():
            row, why = self._held(rollout_id, attempt, token)
            if row is None:
                return Completion(False, why, False)
            now = self.clock()
            self._finish_attempt(row, now, "released", reason)
            self._move(row, QUEUED, now, lease_deadline=None, not_before=now)
        return Completion(True, None, False)

    def expire_leases(self) -> list[str]:
        """Leases past their deadline become infrastructure failures ("lease_expired")."""
        with self._tx():
            now = self.clock()
            rows = self._db.execute(
                f"SELECT * FROM rollouts WHERE state IN ({_qs(HELD)}) AND lease_deadline <= ?"
                f" ORDER BY seq", (*HELD, now)).fetchall()
            for row in rows:
                self._fail_attempt(row, now, LEASE_EXPIRED, retry_now=False)
        return [row["rollout_id"] for row in rows]

    def release_node(self, node: str, reason: str, failure: bool = True,
                     keep: frozenset[str] | set[str] = frozenset()) -> list[str]:
        """Every lease `node` holds (except the rollout ids in `keep`) ends now.

        failure=True (a dead node): an infrastructure failure, retryable at once.
        failure=False (a drained node): handed back, not counted as a failed attempt.
        """
        with self._tx():
            now = self.clock()
            rows = [r for r in self._db.execute(
                f"SELECT * FROM rollouts WHERE node = ? AND state IN ({_qs(HELD)}) ORDER BY seq",
                (node, *HELD)).fetchall() if r["rollout_id"] not in keep]
            for row in rows:
                if failure:
                    self._fail_attempt(row, now, f"node_lost: {reason}", retry_now=True)
                else:
                    self._finish_attempt(row, now, "released", reason)
                    self._move(row, QUEUED, now, lease_deadline=None, not_before=now)
        return [row["rollout_id"] for row in rows]

    # ---- reads ----

    def results_after(self, batch_id: str, cursor: int,
                      limit: Optional[int] = None) -> tuple[list[dict], int]:
        """Committed and dead-lettered rollouts of the batch after `cursor`, in commit order."""
        limit = min(limit or self.config.max_results_per_watch,
                    self.config.max_results_per_watch)
        cur = self._db.execute(_RESULTS_SQL, (batch_id, cursor, limit))
        cur.row_factory = None  # plain tuples, in _RESULT_KEYS order
        items = [_result_dict(r) for r in cur]
        return items, (items[-1]["commit_seq"] if items else cursor)

    def batch_done(self, batch_id: str) -> bool:
        if self._db.execute("SELECT 1 FROM batches WHERE batch_id = ?",
                            (batch_id,)).fetchone() is None:
            raise UnknownBatch(batch_id)
        live = tuple(s for s in STATES if s not in TERMINAL)
        r = self._db.execute(f"SELECT 1 FROM rollouts WHERE batch_id = ? AND state IN"
                             f" ({_qs(live)}) LIMIT 1", (batch_id, *live)).fetchone()
        return r is None

    def counts(self) -> dict[str, int]:
        """Rollouts per state. The terminal states (only ever entered, never left) are
        counted in memory as transactions commit; the others are read (an index range of
        the rollouts in flight, not a scan of the whole history)."""
        out = dict.fromkeys(STATES, 0)
        out.update(self._terminal)
        for state, n in self._db.execute(_LIVE_COUNTS_SQL, _LIVE):
            out[state] = n
        return out

    def rollout(self, rollout_id: str) -> Optional[dict]:
        row = self._row(rollout_id)
        return None if row is None else dict(row)

    def rollouts(self) -> list[dict]:
        return [dict(r) for r in self._db.execute("SELECT * FROM rollouts ORDER BY seq")]

    def attempts(self, rollout_id: str) -> list[dict]:
        """Every attempt of the rollout, oldest first. Rows are written for attempts that
        ended without committing; the attempt held now (outcome None) and the committed one
        are read from the rollout's own row."""
        out = [dict(r) for r in self._db.execute(
            "SELECT * FROM attempts WHERE rollout_id = ? ORDER BY attempt", (rollout_id,))]
        row = self._row(rollout_id)
        started = row["leased_at"] if row is not None else None
        if out and row is not None and out[-1]["attempt"] == row["attempt"] and \
                out[-1]["outcome"] is None:  # written at lease time by an older queue
            started = out.pop()["started_at"]
        if row is not None and row["state"] in (*HELD, COMMITTED) and row["attempt"] and (
                not out or out[-1]["attempt"] < row["attempt"]):
            ended = row["state"] == COMMITTED
            out.append({"rollout_id": rollout_id, "attempt": row["attempt"],
                        "token": row["token"], "node": row["node"],
                        "outcome": row["outcome"] if ended else None, "reason": None,
                        "started_at": started,
                        "finished_at": row["updated_at"] if ended else None,
                        "idem": row["commit_idem"] if ended else None,
                        "reply": _COMMITTED_REPLY if ended else None})
        return out

    def committed_rows(self) -> list[dict]:
        """Every committed rollout's catalog key (rollout_id, attempt, token, shards, time)."""
        return [{"rollout_id": r[0], "attempt": r[1], "token": r[2],
                 "shards": json.loads(r[3]) if r[3] else {}, "at": r[4]}
                for r in self._db.execute("SELECT rollout_id, attempt, token, shards, updated_at"
                                          " FROM rollouts WHERE state = ?", (COMMITTED,))]

    def held_leases(self) -> list[tuple[str, str, int, int]]:
        """(rollout_id, node, attempt, token) of every held lease."""
        return [tuple(r) for r in self._db.execute(
            f"SELECT rollout_id, node, attempt, token FROM rollouts WHERE state IN ({_qs(HELD)})"
            " ORDER BY seq", HELD)]

    def leases_of(self, node: str) -> list[str]:
        return [r[0] for r in self._db.execute(
            f"SELECT rollout_id FROM rollouts WHERE node = ? AND state IN ({_qs(HELD)})"
            f" ORDER BY seq", (node, *HELD))]

    # ---- policies ----

    def publish_policy(self, version: int, endpoint: str, model: str, idem: str) -> bool:
        """Record a policy version; returns True if this was a duplicate (nothing changed)."""
        with self._tx():
            if self._idem_get("policy:" + idem) is not None:
                return True
            old = self._db.execute("SELECT * FROM policies WHERE version = ?",
                                   (version,)).fetchone()
            if old is not None:
                if (old["endpoint"], old["model"]) != (endpoint, model):
                    raise PolicyConflict(f"policy version {version} already published as "
                                         f"{old['endpoint']} {old['model']}")
                return True
            self._db.execute("INSERT INTO policies VALUES (?, ?, ?, ?)",
                             (version, endpoint, model, self.clock()))
            self._idem_put("policy:" + idem, {"version": version})
            self._apply_staleness()
        log.info("policy version %d published: %s %s", version, endpoint, model)
        return False

    def _apply_staleness(self) -> None:
        """Rollouts not yet finished whose policy is more than max_staleness versions behind
        the newest: re-run with the newest policy (a held lease is revoked: its result will be
        stale) or dropped (cancelled, reported in the batch's results with infra_reason
        stale_policy), by config."""
        latest = self.latest_policy()
        if self.config.max_staleness is None or latest is None:
            return
        now = self.clock()
        rows = self._db.execute(
            f"SELECT * FROM rollouts WHERE state NOT IN ({_qs(TERMINAL)}) AND policy_version < ?",
            (*TERMINAL, latest.version - self.config.max_staleness)).fetchall()
        for row in rows:
            if row["state"] in HELD:
                self._finish_attempt(row, now, "revoked", STALE_POLICY)
            if self.config.stale_policy == "drop":
                self._move(row, CANCELLED, now, lease_deadline=None, infra_reason=STALE_POLICY,
                           commit_seq=self._next_commit_seq())
            else:
                self._db.execute("UPDATE rollouts SET policy_version = ? WHERE rollout_id = ?",
                                 (latest.version, row["rollout_id"]))
                if row["state"] in HELD:
                    self._move(row, QUEUED, now, lease_deadline=None, not_before=now)
        if rows:
            log.info("%d rollouts more than %d policy versions old: %s", len(rows),
                     self.config.max_staleness, self.config.stale_policy)

    def policy(self, version: int) -> Optional[Policy]:
        r = self._db.execute("SELECT * FROM policies WHERE version = ?", (version,)).fetchone()
        return None if r is None else Policy(**dict(r))

    def latest_policy(self) -> Optional[Policy]:
        r = self._db.execute("SELECT * FROM policies ORDER BY version DESC LIMIT 1").fetchone()
        return None if r is None else Policy(**dict(r))


def _any_of(column: str, values: Sequence[Any]) -> str:
    """`(column = ? OR ...)`: a filter on a row found by another index. (`column IN (?, ...)`
    would make SQLite build an ephemeral b-tree of the list on every execution.)"""
    return "(" + " OR ".join(f"{column} = ?" for _ in values) + ")"


_LIVE = tuple(s for s in STATES if s not in TERMINAL)
_LIVE_COUNTS_SQL = (f"SELECT state, COUNT(*) FROM rollouts WHERE state IN"
                    f" ({', '.join('?' for _ in _LIVE)}) GROUP BY state")
_LEASE_CHUNK = 500  # (rollout, token, node) triples per UPDATE of lease_to
_COMMIT_HELD_SQL = (
    f"UPDATE rollouts SET state = ?, outcome = ?, reward = ?, shards = ?, lease_deadline = NULL,"
    f" commit_seq = ?, updated_at = ?, commit_idem = ? WHERE rollout_id = ? AND attempt = ? AND"
    f" token = ? AND {_any_of('state', HELD)}")
_IS_COMMITTED_SQL = (f"SELECT 1 FROM rollouts WHERE rollout_id = ? AND attempt = ? AND token = ?"
                     f" AND commit_idem = ? AND state = '{COMMITTED}'")
# An attempt's row, written when it ends (a database from before that wrote it at lease
# time: the row is there, its end is filled in).
_ATTEMPT_UPSERT_SQL = (
    "INSERT INTO attempts (rollout_id, attempt, token, node, started_at, outcome, reason,"
    " finished_at, idem, reply) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?) ON CONFLICT"
    " (rollout_id, attempt) DO UPDATE SET outcome = excluded.outcome, reason = excluded.reason,"
    " finished_at = excluded.finished_at, idem = excluded.idem, reply = excluded.reply")
_RESULT_KEYS = ("rollout_id", "batch_id", "task_ref", "policy_version", "seed", "state",
                "attempt", "token", "node", "outcome", "reward", "shards", "infra_reason",
                "commit_seq")  # a result item (watch): these columns, in this order
_RESULTS_SQL = (f"SELECT {', '.join(_RESULT_KEYS)} FROM rollouts WHERE batch_id = ? AND"
                f" commit_seq > ? ORDER BY commit_seq LIMIT ?")
_COMMITTED = Completion(True, None, True)
_COMMITTED_REPLY = json.dumps({"accepted": True, "reason": None, "committed": True})


def _qs(values: Sequence[Any]) -> str:
    return ", ".join("?" for _ in values)


def _result_dict(r: tuple) -> dict:
    d = dict(zip(_RESULT_KEYS, r))
    shards = d["shards"]
    d["shards"] = json.loads(shards) if shards and shards != "{}" else {}
    return d


def _result_item(r: sqlite3.Row) -> dict:
    return _result_dict(tuple(r[k] for k in _RESULT_KEYS))
