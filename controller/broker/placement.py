"""Placement: the broker's view of each node agent, and the pure choice of which node gets
which due rollout.

`NodeView` is what the broker knows of one node (slots, credit, held leases, mounted images,
liveness, state); its state changes go through `move`, which asserts the node state table
(controller.contracts.states.NODE_TRANSITIONS). `place` is a pure function of (due work, free
slots per node, images per node).

Must not import: zmq, sqlite3, controller.store other than controller.store.records (its typed
records), controller.cli, nodeagent.
"""
from __future__ import annotations

import heapq
import logging
from dataclasses import dataclass, field
from typing import Callable, Optional, Sequence

from controller.contracts.states import LIVE, check_node_transition
from controller.store.records import Due

log = logging.getLogger(__name__)


@dataclass
class NodeView:
    """The broker's view of one node agent (mirrors the queue for its leases)."""
    node: str
    identity: bytes
    slots: int
    agent_version: str
    credit: int = 0
    leases: set = field(default_factory=set)  # rollout ids it holds (mirror of the queue)
    active: int = 0
    slots_free: Optional[int] = None  # as the agent last reported
    images: set = field(default_factory=set)
    last_seen: float = 0.0  # monotonic
    last_seen_wall: float = 0.0  # unix seconds
    health: dict = field(default_factory=dict)
    state: str = LIVE
    drain_requested: bool = False  # by a client (drain_node), not by the agent itself
    left_drained: bool = False  # lost because it said goodbye after draining (shown as "drained")
    drain_deadline_s: Optional[float] = None
    batches: bool = False  # takes `leases` and `acks` frames (protocol.speaks_batches)
    sent_at: float = -1e18  # monotonic: when the controller last sent it anything
    prefetch: int = 0  # leases it takes beyond its slots, waiting for one (its register)

    def move(self, new: str) -> None:
        """Change the node's state (asserting the node state table)."""
        check_node_transition(self.node, self.state, new)
        if new != self.state:
            log.debug("node %s: %s -> %s", self.node, self.state, new)
        self.state = new

    def free(self) -> int:
        """Leases it may take now: its free slots, plus its prefetch (leases it holds waiting
        for a slot). `place` grants the prefetch only to work beyond the free slots."""
        if self.state != LIVE:
            return 0
        if not self.prefetch:
            return max(min(self.slots - len(self.leases), self.credit), 0)
        return max(min(self.slots + self.prefetch - len(self.leases), self.credit + self.prefetch), 0)

    def ahead(self) -> int:
        """The part of `free()` that would wait on the node (prefetch), not run at once."""
        if not self.prefetch or self.state != LIVE:
            return 0
        return self.free() - max(min(self.slots - len(self.leases), self.credit), 0)


def place(due: Sequence[Due], free: dict[str, int], images: dict[str, set],
          image_of: Callable[[str], Optional[str]],
          ahead: Optional[dict[str, int]] = None) -> list[tuple[str, str]]:
    """Placement: (rollout_id, node) for as many due rollouts as there are free slots.

    Oldest first; each goes to a node that already has its image if one has a free slot,
    else to the node with the most free slots (ties: node name). `ahead`: the part of a
    node's `free` that is prefetch (a lease that waits on the node for a slot): placed only
    once every free slot that runs at once has a rollout, so work never waits on one node
    while another's slot is idle. Pure function.
    """
    if ahead and any(ahead.values()):
        wait = {n: min(max(ahead.get(n, 0), 0), k) for n, k in free.items()}
        first = _place(due, {n: k - wait[n] for n, k in free.items()}, images, image_of)
        if len(first) == len(due):
            return first
        # more due than free slots: every slot has one, the rest may wait on the nodes
        return first + _place(due[len(first):], wait, images, image_of)
    return _place(due, free, images, image_of)


def _place(due: Sequence[Due], free: dict[str, int], images: dict[str, set],
           image_of: Callable[[str], Optional[str]]) -> list[tuple[str, str]]:
    free = {n: k for n, k in free.items() if k > 0}
    left = sum(free.values())
    rank = {n: i for i, n in enumerate(sorted(free))}
    wanted = [image_of(d.task_ref) for d in due[:left]]
    # the free nodes holding each image wanted: one pass over the free nodes' image sets,
    # not one over every free node per image (a pass of distinct images on a large farm)
    holders: dict[str, list[str]] = {}
    wanted_set = {i for i in wanted if i}
    for n in free:
        for image in wanted_set.intersection(images.get(n, ())):
            holders.setdefault(image, []).append(n)
    heaps: dict[Optional[str], list] = {}  # per image (None: every node): a max-heap by
    # (free, name) with lazy updates -- an entry whose count is stale is fixed when on top

    def best(image: Optional[str]) -> Optional[str]:
        h = heaps.get(image)
        if h is None:
            pool = free if image is None else holders.get(image, ())
            h = heaps[image] = [(-free[n], -rank[n], n) for n in pool if free[n]]
            heapq.heapify(h)
        while h:
            k, r, n = h[0]
            if free[n] == -k:
                return n
            heapq.heappop(h)  # the node took leases meanwhile (counts only go down)
            if free[n]:
                heapq.heappush(h, (-free[n], r, n))
        return None

    out = []
    for d, image in zip(due, wanted):
        if not left:
            break
        node = (best(image) if image else None) or best(None)
        out.append((d.rollout_id, node))
        free[node] -= 1
        left -= 1
    return out
