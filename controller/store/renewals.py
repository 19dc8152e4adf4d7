"""The rollout queue's renewals and noted `started`s, kept in memory: `Renewals` is a part of
`RolloutQueue` (queue.py), split out by subject; `self` is the queue (its connection, clock,
config and transaction).

A heartbeat's renewal is one entry per node (its last list of held rollouts); a `started` of
a lease the broker knows live is one entry per rollout, written with the row's next write
(`expire_leases` writes the deadline of a renewed lease when it comes due, and the noted
`started` with it; `_settle` before a read shows the row). docs/protocol.md "Renewal" and
"`started`, noted".

Must not import: zmq, controller.broker, controller.cli, nodeagent.
"""
from __future__ import annotations

from typing import TYPE_CHECKING, Optional, Sequence

from controller.contracts.states import HELD, LEASED, RUNNING
from controller.store import schema
from controller.store.schema import any_of

if TYPE_CHECKING:
    from controller.store.queue import RolloutQueue


class Renewals:
    """Renewals and noted `started`s of `RolloutQueue` (a base class of it)."""

    def note_started(self: "RolloutQueue", rollout_id: str, attempt: int, token: int, node: str) -> None:
        """The holder `node` started the rollout under its live lease (the broker's mirror
        says so; else it calls `mark_running`): noted in memory, renewed as a heartbeat
        renews, and written `running` with the row's next write (`expire_leases`' deadline
        rewrite, `_settle` before a read; never if its result comes first). A crash loses
        only the note: the row stays `leased`, held (docs/protocol.md "`started`, noted")."""
        self._started[rollout_id] = (attempt, token)
        self._renewed[rollout_id] = (node, self.clock())

    def _settle(self: "RolloutQueue", rollout_id: Optional[str] = None) -> None:
        """Write the noted `started` of `rollout_id` (None: all) before a read shows it."""
        if not self._started:
            return
        if rollout_id is None:
            items, self._started = list(self._started.items()), {}
        elif (noted := self._started.pop(rollout_id, None)) is None:
            return
        else:
            items = [(rollout_id, noted)]
        with self._tx():
            now = self.clock()
            self._db.executemany(schema.STARTED_SQL, [(RUNNING, now, rid, attempt, token, LEASED)
                                                      for rid, (attempt, token) in items])

    def renew(self: "RolloutQueue", node: str, rollout_ids: Optional[Sequence[str]] = None) -> int:
        """Extend the deadline of the leases `node` holds (only those of `rollout_ids` when
        given: a lease the node never received must not be kept alive by its heartbeats);
        returns how many it noted.

        With `rollout_ids` the renewal is noted in memory, not written: a lease's row is
        written only when its deadline comes due and a renewal is found for it (see
        `expire_leases`), so heartbeats cost no SQLite write whatever the farm's size (a
        lease is renewed every heartbeat but written about once per TTL). A renewal lost
        with the process is made good at open: every held lease gets a fresh TTL. The
        node's last list renews (one entry per node): a lease it no longer lists, no more."""
        if rollout_ids is None:  # (agents before 0.2 do not list them): written at once
            with self._tx():
                now = self.clock()
                return self._db.execute(
                    f"UPDATE rollouts SET lease_deadline = ?, updated_at = ? WHERE node = ?"
                    f" AND {any_of('state', HELD)}",
                    (now + self.config.lease_ttl_s, now, node, *HELD)).rowcount
        now = self.clock()
        self._renewed_nodes[node] = (now, rollout_ids)
        if now - self._renewed_pruned >= self.config.lease_ttl_s:
            self._prune_renewals(now)
        return len(rollout_ids)

    def _prune_renewals(self: "RolloutQueue", now: float) -> None:
        """Forget renewals older than a TTL (they can keep nothing alive): the map stays the
        size of the held leases."""
        ttl = self.config.lease_ttl_s
        self._renewed = {rid: r for rid, r in self._renewed.items() if r[1] + ttl > now}
        self._renewed_nodes = {n: r for n, r in self._renewed_nodes.items() if r[0] + ttl > now}
        self._renewed_pruned = now
