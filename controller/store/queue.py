"""Durable rollout queue: leases, fencing tokens, retry with backoff, dead letter.

One SQLite file in WAL mode with synchronous=FULL (schema.py), one connection, every mutation
in one `BEGIN IMMEDIATE` transaction (queuetx.py), so whatever a method returned is on disk. Dropping the
object without `close()` (a crash) loses nothing that was acknowledged: in-flight leases stay
leased until they expire or their holder completes with its still-valid token.

Rollout states and their legal transitions are the table `controller.contracts.states.
TRANSITIONS`, asserted here on every change. Every lease takes the next value of one global
fencing token; a result is accepted only with the rollout's current (attempt, token) while
it is leased, running or verifying. Infrastructure failures (infra_error, an expired lease,
a lost node) go to retry_wait with full-jitter exponential backoff, and to dead_letter after
`max_attempts` failures, or `max_node_losses` attempts lost with their node or to an
infrastructure fault that is not the task's (a reason whose code is of class `loss`,
`states.INFRA_CLASS`: the model server unreachable, a sandbox that would not start; counted
apart: a flapping node or an outage must not dead-letter good tasks); every attempt's reason
(`states.InfraReason`: its code and its text) is kept in the attempts table. `on_commit`
hooks run once the open transaction has committed (what is derived from the queue, the
catalog, is written there); `fault` is called at the commit path's fault points (faults.py).
With `config.replica_dir` every COMMIT is shipped to the replica (replica.py) before anything
derived from it runs. Its records and config are records.py; its reads are reads.py.

Time is injected: `clock()` returns epoch seconds (deadlines are persisted, so wall time).
Must not import: zmq, controller.broker, controller.cli, nodeagent. See docs/protocol.md for
the state table and the rules.
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
from pathlib import Path
from typing import Any, Callable, Iterator, Optional, Sequence

from controller.contracts.states import (  # noqa: F401 - the state names, re-exported
    ATTEMPT_CANCELLED,
    CANCELLED,
    CANCELLED_BY_TRAINER,
    COMMITTED,
    COMMITTED_OUTCOMES,
    DEAD_LETTER,
    HELD,
    INFRA_CANCELLED,
    INFRA_ERROR,
    LEASABLE,
    LEASE_EXPIRED,
    LEASED,
    NODE_LOST,
    OUTCOMES,
    POLICY_OUTCOMES,
    QUEUED,
    REJECT_CANCELLED,
    RELEASED,
    RETRY_WAIT,
    REVOKED,
    RUNNING,
    STALE_POLICY,
    STALE_TOKEN,
    STATES,
    TERMINAL,
    TRANSITIONS,
    UNFINISHED,
    UNKNOWN_REASON,
    UNKNOWN_ROLLOUT,
    VERIFYING,
    InfraReason,
    as_infra_reason,
    check_transition,
)
from controller.store import schema
from controller.store.faults import FaultHook, no_fault
from controller.store.queuetx import Transaction
from controller.store.reads import QueueReads, result_item  # noqa: F401 - result_item: tests
from controller.store.records import (  # noqa: F401 - re-exported: the queue's records
    STALE_POLICY_ACTIONS,
    Cancellation,
    Completion,
    Due,
    HeldLease,
    Lease,
    Policy,
    PolicyConflict,
    QueueConfig,
    UnknownBatch,
)
from controller.store.renewals import Renewals
from controller.store.replica import Replica
from controller.store.schema import qs

log = logging.getLogger(__name__)

# The reasons the queue records itself (text as before the codes: the code alone).
_EXPIRED = InfraReason(LEASE_EXPIRED, LEASE_EXPIRED)
_STALE = InfraReason(STALE_POLICY, STALE_POLICY)


class RolloutQueue(Renewals, QueueReads):
    """The durable rollout queue (the reads are QueueReads', the renewals and noted
    `started` Renewals'); one connection, one writer."""

    def __init__(self, path: str | Path, clock: Callable[[], float] = time.time,
                 rng: random.Random | None = None, config: QueueConfig = QueueConfig(),
                 fault: FaultHook = no_fault):
        self.path = Path(path)
        self.fault = fault  # called at the commit path's fault points (store/faults.py)
        self._on_commit: list[Callable[[], None]] = []  # run once the open transaction commits
        self._replica_shards: list[dict] = []  # shards the open transaction commits
        self.replica: Optional[Replica] = None  # opened below, once the file is ready
        self.clock = clock
        self.rng = rng if rng is not None else random.Random()
        self.config = config
        self._db = schema.connect(self.path)
        self._depth = 0
        self._txn = Transaction(self)
        self._terminal_delta: Counter = Counter()  # entered in the open transaction
        self._idle_until = -math.inf  # due() is empty before this (see due)
        self._renewed: dict[str, tuple[str, float]] = {}  # rollout id -> (node, last renewal)
        # node -> (its last heartbeat's time, the rollout ids it listed): see renew
        self._renewed_nodes: dict[str, tuple[float, Sequence[str]]] = {}
        self._renewed_pruned = -math.inf
        # `started` noted, not yet written: rollout id -> (attempt, token) (see note_started)
        self._started: dict[str, tuple[int, int]] = {}
        self._terminal: Counter = Counter({s: n for s, n in self._db.execute(
            f"SELECT state, COUNT(*) FROM rollouts WHERE state IN ({qs(TERMINAL)})"
            f" GROUP BY state", TERMINAL)})
        with self._tx():
            for key in schema.COUNTERS:
                self._db.execute("INSERT OR IGNORE INTO meta VALUES (?, 0)", (key,))
            # Renewals live in memory (see renew): those a previous process noted are gone, so
            # every held lease gets a fresh TTL from now; a lease whose node is gone for good
            # still expires, one TTL after this open.
            self._db.execute("UPDATE rollouts SET lease_deadline = MAX(lease_deadline, ?)"
                             " WHERE lease_deadline IS NOT NULL",
                             (self.clock() + self.config.lease_ttl_s,))
        # Commit sequence numbers live with the rows they order: the next one follows the
        # largest on disk (a rolled-back transaction leaves a gap, never a repeat).
        self._commit_seq = max(
            self._db.execute("SELECT value FROM meta WHERE key = 'commit_seq'").fetchone()[0],
            self._db.execute("SELECT COALESCE(MAX(commit_seq), 0) FROM rollouts").fetchone()[0])
        # The second copy (store/replica.py): every COMMIT is shipped there before the caller
        # can acknowledge it; a replica directory that is missing or read-only fails here.
        if config.replica_dir is not None:
            self.replica = Replica(self._db, self.path, config.replica_dir, clock=self.clock,
                                   snapshot_bytes=config.replica_snapshot_mb << 20,
                                   keep_generations=config.replica_keep_generations)

    def close(self) -> None:
        self._settle()  # the `started` noted: their rows show them running (not needed: tidy)
        if self.replica is not None:
            self.replica.close()
        self._db.close()

    def replica_status(self) -> Optional[dict]:
        """The replica's health (lag_s, in_sync, failures, ...; None without a replica)."""
        return None if self.replica is None else self.replica.status()

    # ---- plumbing ----

    def _tx(self) -> Transaction:
        """One transaction; inside `batch()` it joins the batch's transaction (queuetx.py)."""
        return self._txn

    def on_commit(self, hook: Callable[[], None]) -> None:
        """Run `hook` once the open transaction has committed (at once when none is open);
        never if it rolls back. What is derived from the queue (the catalog) is written from
        here, so it can never be ahead of the queue."""
        if self._depth:
            self._on_commit.append(hook)
        else:
            hook()

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
        self._started.pop(row["rollout_id"], None)  # the row is written now: no longer pending
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

    def add_counters(self, delta: dict[str, int]) -> None:
        """Add to the broker's persisted status counters (so they survive a restart)."""
        if delta:
            with self._tx():
                self._db.executemany(schema.COUNTER_ADD_SQL, delta.items())

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

    def cancel(self, batch_id: str, idem: Optional[str] = None,
               reason: str = CANCELLED_BY_TRAINER) -> Cancellation:
        """Cancel a batch (idempotent with `idem`: a duplicate gets the first reply). `reason`
        (a TRAINER_CANCEL_REASONS code) is recorded as the cancelled rollouts' `infra_reason`
        and their held attempts' reason, with the code `cancelled`.

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
                f"({qs(TERMINAL)})", (batch_id, *TERMINAL)).fetchall()
            revoked = []
            why = InfraReason(INFRA_CANCELLED, reason)
            for row in rows:
                if row["state"] in HELD:
                    self._finish_attempt(row, now, ATTEMPT_CANCELLED, why)
                    revoked.append(HeldLease(row["rollout_id"], row["node"], row["attempt"],
                                           row["token"]))
                self._move(row, CANCELLED, now, lease_deadline=None, infra_reason=why.text,
                           infra_code=why.code)
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

    def idle(self) -> bool:  # nothing is due now, known without a query (see `due`)
        return self.clock() < self._idle_until

    def due(self, limit: int) -> list[Due]:
        """Up to `limit` rollouts that may be leased now, oldest submission first (read only).

        When none is due, the earliest `not_before` of the leasable rollouts is remembered: until
        then (or a submit, hand-back or failure) the answer is empty without a query (`idle`)."""
        now = self.clock()
        if limit <= 0 or now < self._idle_until:
            return []
        rows = [Due(r[0], r[1], r[2]) for r in self._db.execute(
            "SELECT rollout_id, task_ref, policy_version FROM rollouts WHERE state IN"
            f" ({qs(LEASABLE)}) AND not_before <= ? ORDER BY seq LIMIT ?",
            (*LEASABLE, now, limit))]
        if not rows:
            nxt = self._db.execute(f"SELECT MIN(not_before) FROM rollouts WHERE state IN"
                                   f" ({qs(LEASABLE)})", LEASABLE).fetchone()[0]
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
                # One statement per chunk (see schema.lease_sql).
                for r in self._db.execute(
                        schema.lease_sql(len(chunk)),
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
        """The holder started the rollout: leased -> running, deadline renewed, written now
        (the fenced check; `note_started` is the broker's path for a lease it knows live)."""
        with self._tx():  # (leased -> running: checked once, at import, below)
            self._started.pop(rollout_id, None)
            now = self.clock()
            cur = self._db.execute(
                "UPDATE rollouts SET state = ?, lease_deadline = ?, updated_at = ? WHERE"
                " rollout_id = ? AND attempt = ? AND token = ? AND state = ?",
                (RUNNING, now + self.config.lease_ttl_s, now, rollout_id, attempt, token, LEASED))
            if cur.rowcount == 1:
                log.debug("rollout %s attempt %s: leased -> running", rollout_id, attempt)
                return _ACCEPTED
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

    def complete(self, rollout_id: str, attempt: int, token: int, outcome: str,
                 reward: Optional[float], shards: dict[str, str],
                 infra_reason: InfraReason | str | None, idem: str) -> Completion:
        """Record a result. Stale tokens are rejected and change nothing; duplicates of an
        accepted result (same idem) get the stored completion. An `infra_error`'s
        `infra_reason` is typed (`P.Result.reason`); its code decides whether the attempt is a
        loss (a reason given as text only is parsed, `states.InfraReason.parse`)."""
        if outcome not in OUTCOMES:
            raise ValueError(f"outcome must be one of {OUTCOMES}, got {outcome!r}")
        with self._tx():
            if outcome in COMMITTED_OUTCOMES and self._commit_held(
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
            if outcome in COMMITTED_OUTCOMES:
                if reward is None and outcome in POLICY_OUTCOMES and outcome != "pass":
                    reward = 0.0
                result = Completion(True, None, True)
                if self.replica is not None and shards:
                    self._replica_shards.append(shards)
                self._move(row, COMMITTED, now, outcome=outcome, reward=reward, commit_idem=idem,
                           shards=_sorted_json(shards), lease_deadline=None,
                           commit_seq=self._next_commit_seq())
            else:
                result = Completion(True, None, False)
                why = as_infra_reason(infra_reason) or InfraReason(UNKNOWN_REASON, INFRA_ERROR)
                self._fail_attempt(row, now, why, retry_now=False, idem=idem, reply=result,
                                   lost=why.is_loss)
        return result

    def _commit_held(self, rollout_id: str, attempt: int, token: int, outcome: str,
                     reward: Optional[float], shards: dict[str, str], idem: str) -> bool:
        """The common case of `complete` in one statement: if (attempt, token) is the live
        lease, commit it (any held state may become committed: _COMMIT_IS_LEGAL); False
        (nothing changed) otherwise. The committed attempt is the rollout's row itself (no
        attempts row: `attempts()` shows it from there, and a repeat of its result is
        answered from there)."""
        now = self.clock()
        if reward is None and outcome in POLICY_OUTCOMES and outcome != "pass":
            reward = 0.0
        seq = self._commit_seq + 1
        cur = self._db.execute(
            schema.COMMIT_HELD_SQL,
            (COMMITTED, outcome, reward, _sorted_json(shards) if shards else "{}",
             seq, now, idem, rollout_id, attempt, token, *HELD))
        if cur.rowcount != 1:
            return False
        self._started.pop(rollout_id, None)  # a `started` noted for it is never written
        self._commit_seq = seq
        self._terminal_delta[COMMITTED] += 1
        if self.replica is not None and shards:
            self._replica_shards.append(shards)
        log.debug("rollout %s attempt %d: committed (%s)", rollout_id, attempt, outcome)
        return True

    def _stored_completion(self, rollout_id: str, attempt: int, token: int,
                           idem: str) -> Optional[Completion]:
        """The stored reply of a result already accepted under this idempotency key: the
        rollout committed with it (its row keeps the key), or an attempt row keeps it."""
        if self._db.execute(schema.IS_COMMITTED_SQL, (rollout_id, attempt, token, idem)).fetchone():
            return Completion(True, None, True, duplicate=True)
        r = self._db.execute("SELECT reply FROM attempts WHERE rollout_id = ? AND attempt = ?"
                             " AND idem = ?", (rollout_id, attempt, idem)).fetchone()
        stored = json.loads(r[0]) if r is not None else self._idem_get("complete:" + idem)
        return None if stored is None else Completion(**{**stored, "duplicate": True})

    def _finish_attempt(self, row: sqlite3.Row, now: float, outcome: str,
                        reason: InfraReason | str | None, idem: Optional[str] = None,
                        reply: Optional[Completion] = None) -> None:
        """Write the ended attempt's row (`row` is the rollout's row while it was held).
        `reason`: typed for a failure, a cancel or a revocation; a handback's free text."""
        started = row["leased_at"] if row["leased_at"] is not None else row["updated_at"]
        text, code = (reason.text, reason.code) if isinstance(reason, InfraReason) else (reason, None)
        self._db.execute(schema.ATTEMPT_UPSERT_SQL, (
            row["rollout_id"], row["attempt"], row["token"], row["node"], started, outcome,
            text, now, idem, None if reply is None else json.dumps(
                {"accepted": reply.accepted, "reason": reply.reason,
                 "committed": reply.committed}), code))

    def _fail_attempt(self, row: sqlite3.Row, now: float, reason: InfraReason, retry_now: bool,
                      idem: Optional[str] = None, reply: Optional[Completion] = None,
                      lost: bool = False) -> str:
        """An infrastructure failure of the current attempt: retry_wait or dead_letter.
        `lost`: the attempt was lost with its node or to the infrastructure (not the
        task's fault: a `loss` code, or an expired lease of a silent node): it counts toward
        `max_node_losses`, not toward `max_attempts`, so a flapping node cannot dead-letter
        good tasks."""
        self._finish_attempt(row, now, INFRA_ERROR, reason, idem, reply)
        failures, losses = row["failures"] + (not lost), row["losses"] + lost
        counts = {"failures": failures, "losses": losses}
        if failures >= self.config.max_attempts or losses >= self.config.max_node_losses:
            self._move(row, DEAD_LETTER, now, outcome=INFRA_ERROR, reward=None,
                       infra_reason=reason.text, infra_code=reason.code, lease_deadline=None,
                       commit_seq=self._next_commit_seq(), **counts)
            log.warning("rollout %s dead-lettered after %d attempts, %d failed, %d lost with "
                        "their node (last: %s)", row["rollout_id"], row["attempt"], failures,
                        losses, reason.text)
            return DEAD_LETTER
        delay_s = 0.0 if retry_now else self.backoff_s(failures if not lost else losses)
        self._move(row, RETRY_WAIT, now, infra_reason=reason.text, infra_code=reason.code,
                   lease_deadline=None, not_before=now + delay_s, **counts)
        return RETRY_WAIT

    def release(self, rollout_id: str, attempt: int, token: int, reason: str) -> Completion:
        """The holder hands the lease back unfinished (drain): queued again at once, and the
        attempt does not count as a failure. Fenced like a result."""
        with self._tx():
            row, why = self._held(rollout_id, attempt, token)
            if row is None:
                return Completion(False, why, False)
            now = self.clock()
            self._finish_attempt(row, now, RELEASED, reason)
            self._move(row, QUEUED, now, lease_deadline=None, not_before=now)
        return Completion(True, None, False)

    def expire_leases(self, live_nodes: Optional[frozenset[str] | set[str]] = None
                      ) -> list[str]:
        """Leases past their deadline become infrastructure failures ("lease_expired"),
        unless their node renewed them since (`renew`): then the renewal is written now.
        Given `live_nodes` (the nodes heard from lately), an expired lease of any other node
        was lost with its node: counted as a loss, not as the task's failure."""
        ttl = self.config.lease_ttl_s
        with self._tx():
            now = self.clock()
            # By the deadline index (O(due), not O(held)); ordered by seq here, since an
            # ORDER BY would make SQLite walk the seq index over every row instead. Most of
            # them were renewed (their deadline is only rewritten): four columns as tuples,
            # the whole row read only for a lease that did expire.
            cur = self._db.execute(schema.DUE_DEADLINES_SQL, (now, *HELD))
            cur.row_factory = None
            renewed, never, expired, kept = self._renewed.get, (None, -math.inf), [], []
            started, noted, ran = self._started, self._started.pop, []
            by_node = self._renewed_nodes.get
            for _seq, rid, holder, leased_at in sorted(cur.fetchall()):
                node, at = renewed(rid, never)  # a `started` (note_started)
                if node != holder:
                    at = -math.inf
                listed = by_node(holder)  # its holder's last heartbeat, if it lists it
                if listed is not None and listed[0] > at and rid in listed[1]:
                    at = listed[0]
                if at >= (leased_at or -math.inf) and at + ttl > now:
                    if rid in started:  # its `started` is written with its deadline
                        attempt, token = noted(rid)
                        ran.append((RUNNING, at + ttl, now, rid, attempt, token, LEASED))
                    else:
                        kept.append((at + ttl, rid))
                    continue
                lost = live_nodes is not None and holder not in live_nodes
                self._fail_attempt(self._row(rid), now, _EXPIRED, retry_now=False, lost=lost)
                expired.append(rid)
            if kept:
                self._db.executemany("UPDATE rollouts SET lease_deadline = ? WHERE rollout_id = ?",
                                     kept)
            if ran:
                self._db.executemany(schema.STARTED_DEADLINE_SQL, ran)
        return expired

    def release_node(self, node: str, reason: str, failure: bool = True,
                     keep: frozenset[str] | set[str] = frozenset()) -> list[str]:
        """Every lease `node` holds (except the rollout ids in `keep`) ends now.

        failure=True (a dead node): an attempt lost with its node (`max_node_losses`, not
        the task's `max_attempts`), retryable at once.
        failure=False (a drained node): handed back, not counted as a failed attempt.
        """
        with self._tx():
            now = self.clock()
            rows = [r for r in self._db.execute(
                f"SELECT * FROM rollouts WHERE node = ? AND state IN ({qs(HELD)}) ORDER BY seq",
                (node, *HELD)).fetchall() if r["rollout_id"] not in keep]
            for row in rows:
                if failure:
                    self._fail_attempt(row, now, InfraReason.of(NODE_LOST, reason),
                                       retry_now=True, lost=True)
                else:
                    self._finish_attempt(row, now, RELEASED, reason)
                    self._move(row, QUEUED, now, lease_deadline=None, not_before=now)
        return [row["rollout_id"] for row in rows]

    # ---- policies ----

    def publish_policy(self, version: int, endpoint: str, model: str, idem: str) -> bool:
        """Record a policy version; returns True if this was a duplicate (nothing changed).
        The same version and model at another endpoint is an endpoint move (a restarted trainer
        serves its policy on a new port): the new endpoint is recorded, and every lease made from
        now on names it. Another model under a published version is refused (PolicyConflict)."""
        with self._tx():
            if self._idem_get("policy:" + idem) is not None:
                return True
            old = self._db.execute("SELECT * FROM policies WHERE version = ?",
                                   (version,)).fetchone()
            if old is not None:
                if old["model"] != model:
                    raise PolicyConflict(f"policy version {version} already published as "
                                         f"{old['endpoint']} {old['model']}")
                if old["endpoint"] == endpoint:
                    return True
                self._db.execute("UPDATE policies SET endpoint = ? WHERE version = ?",
                                 (endpoint, version))
                self._idem_put("policy:" + idem, {"version": version})
                log.info("policy version %d moved: %s -> %s", version, old["endpoint"], endpoint)
                return False
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
            f"SELECT * FROM rollouts WHERE state NOT IN ({qs(TERMINAL)}) AND policy_version < ?",
            (*TERMINAL, latest.version - self.config.max_staleness)).fetchall()
        for row in rows:
            if row["state"] in HELD:
                self._finish_attempt(row, now, REVOKED, _STALE)
            if self.config.stale_policy == "drop":
                self._move(row, CANCELLED, now, lease_deadline=None, infra_reason=_STALE.text,
                           infra_code=_STALE.code, commit_seq=self._next_commit_seq())
            else:
                self._db.execute("UPDATE rollouts SET policy_version = ? WHERE rollout_id = ?",
                                 (latest.version, row["rollout_id"]))
                if row["state"] in HELD:
                    self._move(row, QUEUED, now, lease_deadline=None, not_before=now)
        if rows:
            log.info("%d rollouts more than %d policy versions old: %s", len(rows),
                     self.config.max_staleness, self.config.stale_policy)


_LEASE_CHUNK = 500  # (rollout, token, node) triples per UPDATE of lease_to
_sorted_json = json.JSONEncoder(sort_keys=True).encode  # json.dumps(.., sort_keys=True), made once
_COMMITTED = Completion(True, None, True)
_ACCEPTED = Completion(True, None, False)
check_transition("(mark_running)", LEASED, RUNNING)  # the one transition mark_running makes
