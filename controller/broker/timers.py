"""The broker's work driven by time, once per pass (`tick`): dispatch of due rollouts onto
free slots, the sweep (silent nodes lost, expired leases back to the queue, the lease mirror
checked), heartbeats to quiet nodes, and the status counters saved.

A pass costs what happened in it, not what the farm is: it asks no node for its free slots
while the queue knows nothing is due (`RolloutQueue.due`'s idle horizon), and else only the
nodes that may have one (`maybe_free`: a node found full stays out until news about it); an
idle pass (only heartbeats in and out) writes nothing, so its group commit is no fsync: the
counters that every frame moves (`frames_in`, `frames_out`) are saved with a pass that saves
another counter (a rollout leased, committed, released; a frame dropped; a request refused:
each such pass writes, or is an anomaly worth keeping), else once a sweep interval, and in
the pass that stops the broker. A crash loses at most a sweep interval of those two counts.

`Timers` is a part of `BrokerCore` (core.py), split out by subject: it reads and writes the
core's node views, lease mirror and outbox.

Must not import: zmq, sqlite3, controller.cli, nodeagent.
"""
from __future__ import annotations

import logging
import zlib
from collections import Counter
from typing import TYPE_CHECKING, Optional

from controller.broker.placement import place
from controller.contracts import protocol as P
from controller.contracts.states import INFRA_ERROR, LOST

if TYPE_CHECKING:
    from controller.broker.core import BrokerCore

log = logging.getLogger("controller")
RESYNC_EVERY_S = 60.0  # the lease mirror checked against the queue (kept up to date between)


class Timers:
    """The time-driven part of `BrokerCore` (a base class of it; `self` is the core)."""

    def tick(self: "BrokerCore") -> None:
        """Dispatch; every sweep interval purge, expire and resync; heartbeats; watchers;
        the counters saved (see the module docstring for when)."""
        now = self.clock()
        swept = now - self._last_sweep >= self.sweep_interval_s or now < self._last_sweep
        if swept:
            self._last_sweep = now
            self._sweep(now)
        self.dispatch()
        if now - self._last_hb >= self.hb_s / 4 or now < self._last_hb:
            self._last_hb = now
            self._heartbeat_idle(now)
        if self.watchers and (self._commits or any(d <= now for _, _, d in self.watchers)):
            self._commits = 0
            self.watchers = [(i, w, d) for i, w, d in self.watchers
                             if not self._answer_watch(i, w, final=d <= now)]
        self.ledger.save_counters(all_=swept or self.stopped)

    def _heartbeat_idle(self: "BrokerCore", now: float) -> None:
        """A heartbeat to each node sent nothing for its own fraction (0.5-1) of the interval:
        spread over the interval (nodes that registered together are not all woken at once)
        and none to a node that is being sent work anyway."""
        for n in self.nodes.values():
            if n.state != LOST and (now - n.sent_at >= self.hb_s * _phase(n.node) or now < n.sent_at):
                self._send(n.identity, P.Heartbeat())

    def _heard_since(self: "BrokerCore") -> float:
        """Nodes not heard from since this (monotonic) missed a heartbeat."""
        return self.clock() - self.hb_s * self.config.lease_silence_intervals

    def nothing_due(self: "BrokerCore") -> bool:
        """The queue knows no rollout is due now (no query, no per-node work): it learnt so
        when it last looked, and nothing became leasable since (`RolloutQueue.due`)."""
        # (the queue's own clock: its horizon is a `not_before`, in the queue's time)
        return self.queue.idle()

    def dispatch(self: "BrokerCore") -> int:
        """Place due rollouts on free slots of nodes that missed no heartbeat (a node silent
        for `lease_silence_intervals` keeps its leases until it is declared lost, but gets no
        new one). Nothing due: no node is looked at; else only the nodes in `maybe_free`: a
        node found without a free slot leaves it until news could give it one (a frame from
        it: credit, state, heartbeat; one of its leases ended; a resync)."""
        if self.nothing_due():
            return 0
        heard, nodes, free = self._heard_since(), self.nodes, {}
        for name in self.maybe_free:  # only nodes that may have a free slot: not every node
            view = nodes.get(name)
            k = view.free() if view is not None and view.last_seen >= heard else 0
            if k > 0:
                free[name] = k
        self.maybe_free = set(free)  # the others come back with news (core.py: a frame, a lease ended)
        total = sum(free.values())
        if total <= 0:
            return 0
        due = self.queue.due(min(total, self.max_dispatch))
        if not due:
            return 0
        images = {name: nodes[name].images for name in free}
        leases = self.queue.lease_to(place(due, free, images, self._image_of,
                                           {n: nodes[n].ahead() for n in free}))
        placed: Counter = Counter()
        for lease in leases:
            view = self.nodes[lease.node]
            policy = self._policy(lease.policy_version)
            if policy is None:  # only for rollouts submitted before policies were checked
                self.queue.complete(lease.rollout_id, lease.attempt, lease.token, INFRA_ERROR,
                                    None, {}, f"policy version {lease.policy_version} is not "
                                    "published", f"nopolicy:{lease.rollout_id}:{lease.token}")
                continue
            view.leases.add(lease.rollout_id)
            placed[view.node] += 1
            self.holder[lease.rollout_id] = (view.node, lease.token)
            self._send(view.identity, lease.message(
                task=self.tasks[lease.task_ref], policy=policy,
                lease_ttl_s=self.queue.config.lease_ttl_s, run_id=self.run_id,
                run_dir=self.run_dir))
        self.counters["dispatched"] += len(leases)
        self.maybe_free = {name for name, k in free.items() if k > placed[name]}
        return len(leases)

    def _sweep(self: "BrokerCore", now: float) -> None:
        for n in list(self.nodes.values()):
            silent_s = now - n.last_seen
            if n.state != LOST and silent_s > self.hb_s * self.liveness:
                released = self.queue.release_node(n.node, "no heartbeat")
                self._lose(n, f"silent {silent_s:.1f}s, {len(released)} leases back", released)
            elif n.state == LOST and silent_s > self.lost_keep_s:
                del self.nodes[n.node]
                if self.by_identity.get(n.identity) == n.node:
                    del self.by_identity[n.identity]
        heard = self._heard_since()
        expired = self.queue.expire_leases(live_nodes={
            n.node for n in self.nodes.values() if n.state != LOST and n.last_seen >= heard})
        if expired:
            self.counters["leases_expired"] += len(expired)
            self._commits += 1
            for rid in expired:
                held = self.holder.get(rid)
                if held is not None:
                    self._unhold(rid, held[1])
        if now - self._last_resync >= RESYNC_EVERY_S or now < self._last_resync:
            self._resync()  # the mirror is kept up to date as it goes: this only checks it
        self.welcomed = {i: t for i, t in self.welcomed.items() if now - t < self.hb_s * 10}
        self._committed_old, self._committed_new = self._committed_new, set()
        self.ledger.want_flush()

    def _resync(self: "BrokerCore") -> None:
        """The queue is the truth about who holds what: rebuild the in-memory mirror (at
        start, after a policy revoked leases, and every RESYNC_EVERY_S: a read of every held
        lease, too dear for every sweep at tens of thousands of slots)."""
        self._last_resync = self.clock()
        self.holder = {}
        self.maybe_free = set(self.nodes)
        for n in self.nodes.values():
            n.leases = set()
        for rid, node, _attempt, token in self.queue.held_leases():
            self.holder[rid] = (node, token)
            view = self.nodes.get(node)
            if view is not None and view.state != LOST:
                view.leases.add(rid)

    def _policy(self: "BrokerCore", version: int) -> Optional[P.PolicyRef]:
        ref = self._policies.get(version)
        if ref is None:
            p = self.queue.policy(version)
            if p is None:
                return None
            ref = self._policies[version] = p.ref()
        return ref

    def _image_of(self: "BrokerCore", task_ref: str) -> Optional[str]:
        task = self.tasks.get(task_ref)
        return task.get("image_digest") if task else None


def _phase(node: str) -> float:
    """A node's heartbeat spacing as a fraction of the interval, in [0.5, 1): fixed per name
    (deterministic for the simulation), different across names."""
    return 0.5 + (zlib.crc32(node.encode()) % 1024) / 2048
