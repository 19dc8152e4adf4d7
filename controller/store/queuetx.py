"""The rollout queue's transaction: `RolloutQueue._tx`, one `BEGIN IMMEDIATE ... COMMIT`.

A context manager object made once per queue and entered for every mutation (no generator
per call: the broker enters it several times per frame). Entered inside an open transaction
(`RolloutQueue.batch`, the group commit) it only joins it: nothing is written until the
outermost exits. On an exception the outermost rolls back, and what the transaction would
have published (commit hooks, replica shards, terminal counts) is dropped; on success it
commits (synchronous=FULL: durable when COMMIT returns; schema.py), ships the commit to the
replica when there is one, then adds the terminal counts and runs the commit hooks (they
publish only what is durable). The fault points (`QUEUE_BEFORE_COMMIT`,
`QUEUE_AFTER_COMMIT`, faults.py) are called where they were.

Must not import: zmq, controller.broker, controller.cli, nodeagent.
"""
from __future__ import annotations

import math
from collections import Counter
from typing import TYPE_CHECKING, Any

from controller.store.faults import QUEUE_AFTER_COMMIT, QUEUE_BEFORE_COMMIT

if TYPE_CHECKING:
    import sqlite3

    from controller.store.queue import RolloutQueue


class Transaction:
    """`with queue._tx():` (this object, reused; the nesting depth is the queue's `_depth`)."""

    __slots__ = ("q",)

    def __init__(self, queue: "RolloutQueue"):
        self.q = queue

    def __enter__(self) -> "sqlite3.Connection":
        q = self.q
        if q._depth:
            q._depth += 1
            return q._db
        q._db.execute("BEGIN IMMEDIATE")
        q._depth = 1
        q._terminal_delta.clear()
        return q._db

    def __exit__(self, exc_type: Any, exc: Any, tb: Any) -> bool:
        q = self.q
        if q._depth > 1:  # a nested one: the outermost commits or rolls back
            q._depth -= 1
            return False
        q._depth = 0
        if exc_type is not None:
            q._terminal_delta.clear()
            q._on_commit.clear()  # what they would publish never happened
            q._replica_shards.clear()
            q._idle_until = -math.inf  # what due() learnt inside may be rolled back
            q._db.execute("ROLLBACK")
            return False
        q.fault(QUEUE_BEFORE_COMMIT)
        try:
            q._db.execute("COMMIT")
        finally:
            delta, q._terminal_delta = q._terminal_delta, Counter()
            hooks, q._on_commit = q._on_commit, []
            shards, q._replica_shards = q._replica_shards, []
        if q.replica is not None:  # before anything derived from this commit is published
            q.replica.after_commit(shards)
        q.fault(QUEUE_AFTER_COMMIT)
        for state, n in delta.items():  # counted only once on disk
            q._terminal[state] += n
        for hook in hooks:  # after the COMMIT: they publish only what is durable
            hook()
        return False
