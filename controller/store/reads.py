"""The rollout queue's reads: results after a cursor, counts by state, rollouts and their
attempts, held leases, published policies. Read-only: nothing here writes or opens a
transaction (queue.py's `RolloutQueue` inherits these and owns the connection), but for
`_settle`, the queue's hook that writes the `started` it noted in memory before a read shows
the rows (`RolloutQueue.note_started`); `counts` shows them as running without writing.

Must not import: zmq, controller.broker, controller.cli, nodeagent.
"""
from __future__ import annotations

import json
import sqlite3
from collections import Counter
from typing import Optional

from controller.contracts.states import COMMITTED, HELD, LEASED, RUNNING, STATES, UNFINISHED
from controller.store import schema
from controller.store.records import HeldLease, Policy, QueueConfig, UnknownBatch
from controller.store.schema import qs

# The stored reply of a committed attempt (its own row keeps no reply column).
COMMITTED_REPLY = json.dumps({"accepted": True, "reason": None, "committed": True})


class QueueReads:
    """Read-only queries over the queue's connection."""

    _db: sqlite3.Connection
    _terminal: Counter  # rollouts per terminal state, kept by RolloutQueue
    config: QueueConfig

    _started: dict  # rollout id -> (attempt, token): `started` noted, not written (queue.py)

    def _settle(self, rollout_id: Optional[str] = None) -> None:
        """Write the noted `started` of a rollout (None: all) before its row is read."""

    def _row(self, rollout_id: str) -> Optional[sqlite3.Row]:
        return self._db.execute("SELECT * FROM rollouts WHERE rollout_id = ?",
                                (rollout_id,)).fetchone()

    def results_after(self, batch_id: str, cursor: int,
                      limit: Optional[int] = None) -> tuple[list[dict], int]:
        """Committed and dead-lettered rollouts of the batch after `cursor`, in commit order."""
        limit = min(limit or self.config.max_results_per_watch,
                    self.config.max_results_per_watch)
        cur = self._db.execute(schema.RESULTS_SQL, (batch_id, cursor, limit))
        cur.row_factory = None  # plain tuples, in schema.RESULT_KEYS order
        items = [result_dict(r) for r in cur]
        return items, (items[-1]["commit_seq"] if items else cursor)

    def batch_done(self, batch_id: str) -> bool:
        if self._db.execute("SELECT 1 FROM batches WHERE batch_id = ?",
                            (batch_id,)).fetchone() is None:
            raise UnknownBatch(batch_id)
        r = self._db.execute(schema.BATCH_UNFINISHED_SQL, (batch_id, *UNFINISHED)).fetchone()
        return r is None

    def counts(self) -> dict[str, int]:
        """Rollouts per state. The terminal states (only ever entered, never left) are
        counted in memory as transactions commit; the others are read (an index range of
        the rollouts in flight, not a scan of the whole history)."""
        out = dict.fromkeys(STATES, 0)
        out.update(self._terminal)
        for state, n in self._db.execute(schema.LIVE_COUNTS_SQL, UNFINISHED):
            out[state] = n
        noted = min(len(self._started), out[LEASED])  # started, still `leased` on disk
        out[LEASED] -= noted
        out[RUNNING] += noted
        return out

    def rollout(self, rollout_id: str) -> Optional[dict]:
        self._settle(rollout_id)
        row = self._row(rollout_id)
        return None if row is None else dict(row)

    def rollouts(self) -> list[dict]:
        self._settle()
        return [dict(r) for r in self._db.execute("SELECT * FROM rollouts ORDER BY seq")]

    def attempts(self, rollout_id: str) -> list[dict]:
        """Every attempt of the rollout, oldest first. Rows are written for attempts that
        ended without committing; the attempt held now (outcome None) and the committed one
        are read from the rollout's own row."""
        self._settle(rollout_id)
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
                        "outcome": row["outcome"] if ended else None, "reason": None, "code": None,
                        "started_at": started,
                        "finished_at": row["updated_at"] if ended else None,
                        "idem": row["commit_idem"] if ended else None,
                        "reply": COMMITTED_REPLY if ended else None})
        return out

    def committed_rows(self) -> list[dict]:
        """Every committed rollout's catalog key (rollout_id, attempt, token, shards, time)."""
        return [{"rollout_id": r[0], "attempt": r[1], "token": r[2],
                 "shards": json.loads(r[3]) if r[3] else {}, "at": r[4]}
                for r in self._db.execute("SELECT rollout_id, attempt, token, shards, updated_at"
                                          " FROM rollouts WHERE state = ?", (COMMITTED,))]

    def counters(self) -> dict[str, int]:
        """The broker's persisted status counters (`add_counters`), by name."""
        return dict(self._db.execute("SELECT name, value FROM counters").fetchall())

    def held_leases(self) -> list[HeldLease]:
        """(rollout_id, node, attempt, token) of every held lease."""
        return [HeldLease(*r) for r in self._db.execute(
            f"SELECT rollout_id, node, attempt, token FROM rollouts WHERE state IN ({qs(HELD)})"
            " ORDER BY seq", HELD)]

    def leases_of(self, node: str) -> list[str]:
        return [r[0] for r in self._db.execute(
            f"SELECT rollout_id FROM rollouts WHERE node = ? AND state IN ({qs(HELD)})"
            f" ORDER BY seq", (node, *HELD))]

    def policy(self, version: int) -> Optional[Policy]:
        r = self._db.execute("SELECT * FROM policies WHERE version = ?", (version,)).fetchone()
        return None if r is None else Policy(**dict(r))

    def latest_policy(self) -> Optional[Policy]:
        r = self._db.execute("SELECT * FROM policies ORDER BY version DESC LIMIT 1").fetchone()
        return None if r is None else Policy(**dict(r))




def result_dict(r: tuple) -> dict:
    """A `results` item from a row of schema.RESULTS_SQL."""
    d = dict(zip(schema.RESULT_KEYS, r))
    shards = d["shards"]
    d["shards"] = json.loads(shards) if shards and shards != "{}" else {}
    return d


def result_item(r: sqlite3.Row) -> dict:
    """A `results` item from a whole rollouts row."""
    return result_dict(tuple(r[k] for k in schema.RESULT_KEYS))
