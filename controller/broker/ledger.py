"""What the broker derives from the queue's committed state: the catalog of committed keys,
written only once the queue's COMMIT is durable, and the status counters, persisted with
the passes' transactions (the per-frame counts of a pass that writes nothing else: once a
sweep interval, see timers.py).

`Ledger.commit` and `Ledger.want_flush` hand their work to `RolloutQueue.on_commit`: it runs
after the open transaction commits (never if it rolls back), so the catalog can never show a
key the queue has not committed (docs/protocol.md, "One commit point"). A catalog conflict or
a failed flush is a logged, counted anomaly: never an exception out of the broker.

The replica's failures (controller/store/replica.py) are counted here too
(`replica_failures`, `replica_uncopyable_shards`), with the other status counters.

The catalog may come later (`expect_catalog()`, then `attach(catalog)`: the daemon opens it
in a thread while it already serves): until then the keys committed are held back, and
`attach` first reconciles the catalog with the queue's committed rows (which include them),
then hands them over (each then a no-op).

Must not import: zmq, sqlite3, controller.cli, nodeagent.
"""
from __future__ import annotations

import logging
from collections import Counter
from functools import partial
from typing import Optional

from controller.store.catalog import Catalog, CatalogConflict, CatalogError, reconcile
from controller.store.queue import RolloutQueue

log = logging.getLogger("controller")

DROPPED = "dropped."  # the persisted name of a dropped-frames counter: dropped.<reason>
TRAFFIC = frozenset(("frames_in", "frames_out"))  # moved by every frame, heartbeats included


class Ledger:
    """The catalog and counters of one BrokerCore (`counters`, `dropped`: the core's)."""

    def __init__(self, queue: RolloutQueue, catalog: Optional[Catalog]):
        self.queue, self.catalog = queue, catalog
        saved = queue.counters()
        self.counters: Counter = Counter({k: v for k, v in saved.items() if "." not in k})
        self.dropped: Counter = Counter({k[len(DROPPED):]: v for k, v in saved.items()
                                         if k.startswith(DROPPED)})
        self._saved = Counter(saved)
        self._flush_wanted = False
        self.catalog_expected = False  # a catalog is being opened: hold its keys back
        self._held: list[tuple] = []  # keys committed before the catalog was attached
        self._replica_seen: Counter = Counter()  # the replicator's counts already added

    def expect_catalog(self) -> None:
        """The catalog comes later (`attach`): hold back the keys committed until then."""
        assert self.catalog is None, "a catalog is attached already"
        self.catalog_expected = True

    def attach(self, catalog: Catalog) -> tuple[list[str], list[str]]:
        """The catalog, opened: reconciled with the queue's committed rows (`reconcile`;
        outside a transaction), then the keys held back are handed over. Returns reconcile's
        (ahead, behind)."""
        ahead, behind = reconcile(catalog, self.queue.committed_rows())
        self.catalog, self.catalog_expected = catalog, False
        held, self._held = self._held, []
        for key in held:
            self._catalog_commit(*key)
        return ahead, behind

    def commit(self, rollout_id: str, attempt: int, token: int, shards: dict,
               at: float) -> None:
        """A key the open transaction commits: into the catalog once it has."""
        if self.catalog is not None or self.catalog_expected:
            self.queue.on_commit(partial(self._catalog_commit, rollout_id, attempt, token,
                                         shards, at))

    def _catalog_commit(self, rollout_id: str, attempt: int, token: int, shards: dict,
                        at: float) -> None:
        """A conflict (the catalog holds another key of the rollout) is an anomaly of that
        rollout, counted and logged; the queue stays the truth."""
        if self.catalog is None:  # not attached yet
            self._held.append((rollout_id, attempt, token, shards, at))
            return
        try:
            self.catalog.commit(rollout_id, attempt, token, shards, at)
        except CatalogConflict as exc:
            self.counters["catalog_conflicts"] += 1
            log.error("catalog anomaly (%d so far): %s", self.counters["catalog_conflicts"],
                      exc)

    def want_flush(self) -> None:
        """Flush the catalog once the open transaction has committed (once per pass)."""
        if self.catalog is not None and not self._flush_wanted:
            self._flush_wanted = True
            self.queue.on_commit(self._flush)

    def _flush(self) -> None:
        self._flush_wanted = False
        try:
            self.catalog.flush()
        except CatalogError as exc:  # the keys stay buffered: the next sweep tries again
            self.counters["catalog_flush_failed"] += 1
            log.error("catalog flush failed (%d so far): %s",
                      self.counters["catalog_flush_failed"], exc)

    def save_counters(self, all_: bool = True) -> None:
        """What the counters gained since last saved, into the queue (the open
        transaction: they survive a controller restart). With `all_` False, only when a
        counter other than the per-frame ones (TRAFFIC) moved: a pass of heartbeats alone
        then writes nothing (its commit is no fsync); the caller saves all once a sweep
        interval."""
        self._replica_counters()
        saved = self._saved
        delta = {k: v - saved[k] for k, v in self.counters.items() if v != saved[k]}
        delta.update((DROPPED + k, v - saved[DROPPED + k]) for k, v in self.dropped.items()
                     if v != saved[DROPPED + k])
        if delta and (all_ or not delta.keys() <= TRAFFIC):
            self.queue.add_counters(delta)
            saved.update(delta)

    def _replica_counters(self) -> None:
        """The replica's failures and uncopyable shards (store/replica.py) as counters, so
        `status`, `paddock top` and the metrics (paddock_controller_events_total) show them."""
        replica = self.queue.replica
        if replica is None:
            return
        for name, value in (("replica_failures", replica.state.failures),
                            ("replica_uncopyable_shards", replica.state.uncopyable_shards)):
            if value > self._replica_seen[name]:
                self.counters[name] += value - self._replica_seen[name]
                self._replica_seen[name] = value
