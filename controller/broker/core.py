"""The broker's logic, sans-I/O: `BrokerCore` over the durable queue.

It takes decoded frames (`receive`) and the passage of time (`tick`), decides, and leaves the
messages to send in `outbox`. It registers node agents, dispatches leases by credit (a node
never holds more leases than its free slots, and a task goes preferably to a node that
already has its image mounted: placement.py), renews leases on heartbeats, declares silent
nodes lost (Paranoid Pirate liveness) and gives their leases back to the queue (the work
of each pass, `tick`, is timers.py's: a base class of `BrokerCore`), answers trainer
clients (submit, watch with long poll, cancel, publish, drain, status) and counts every
dropped frame by reason; the catalog and the counters it keeps through its `Ledger`
(ledger.py: written after the queue's COMMIT). Its knobs are one `BrokerConfig` (config.py). The
deterministic simulation (tests/sim) drives this class directly with a simulated transport
and clock; daemon.py runs it on the ZeroMQ socket. Tasks travel by reference: the tasks file
holds each task's id, small metadata and blob digest (controller/ondisk/taskblobs.py); an
entry that is not a small well-formed reference is refused at load, naming the task
(`admit_tasks`), and a submit naming it is refused; the other tasks run.

Everything durable goes through controller.store.queue (sqlite3 only for its error type).
Must not import: zmq, controller.cli, nodeagent.
"""
from __future__ import annotations

import logging
import random
import sqlite3
import time
import uuid
from collections import Counter
from typing import Callable, ClassVar, Iterable, Mapping, Optional

from controller.broker.config import BrokerConfig, with_knobs
from controller.broker.fencing import stale_leases
from controller.broker.ledger import Ledger
from controller.broker.placement import NodeView
from controller.broker.timers import Timers
from controller.contracts import protocol as P
from controller.contracts.shardnames import SHARD_TABLES
from controller.contracts.states import (
    BAD_REQUEST,
    DEAD_LETTER,
    DRAINING,
    LEASE_REVOKED,
    LIVE,
    LOST,
    POLICY_CONFLICT,
    REFUSED_AGENT_VERSION,
    REFUSED_PROTOCOL_VERSION,
    REJECT_BAD_REQUEST,
    REJECT_CANCELLED,
    STALE_TOKEN,
    UNEXPECTED,
    UNKNOWN_BATCH,
    UNKNOWN_NODE,
    UNKNOWN_POLICY,
    UNKNOWN_TASK,
)
from controller.ondisk.taskblobs import check_reference
from controller.store.catalog import Catalog
from controller.store.queue import PolicyConflict, RolloutQueue, UnknownBatch
from controller.store.taskindex import TaskIndex
from controller.taskbank.curriculum import Curriculum, CurriculumError

log = logging.getLogger("controller")
DRAINED_VIEW = "drained"   # status/top/metrics: a LOST node that drained and said goodbye

_SHARD_TABLES = frozenset(SHARD_TABLES)
# Why a frame was dropped, besides the protocol's error reasons (P.ERROR_REASONS).
UNEXPECTED_TYPE = "unexpected_type"  # a valid message the controller never receives
MULTIPART = "multipart"  # not exactly one frame after the identity
BAD_SHARDS = "bad_shards"  # a result naming unknown shard tables
# An agent's messages but register and disconnect, from a peer not (or no longer) registered: welcomed to register
_GREET_STRANGERS = frozenset({P.Heartbeat, P.Ready, P.Started, P.Result, P.ResultBatch, P.Release})


class BrokerCore(Timers):
    """The broker: frames and time in, decisions on the queue, messages out (`outbox`).

    `config` holds the knobs (its `queue` part is the queue's: the queue was opened with it);
    keyword knobs (`heartbeat_interval_s=...`) override single fields of it.
    """

    def __init__(self, queue: RolloutQueue, tasks: dict[str, dict], deployment: str,
                 run_id: str, run_dir: str, *, config: BrokerConfig = BrokerConfig(),
                 session: str | None = None, clock: Callable[[], float] = time.monotonic,
                 wall: Callable[[], float] = time.time, catalog: Catalog | None = None,
                 curriculum: Optional[Curriculum] = None, **knobs):
        self.config = config = with_knobs(config, knobs)
        self.tasks, self.refused_tasks = admit_tasks(tasks)
        self.queue, self.deployment = queue, deployment
        self.run_id, self.run_dir = run_id, run_dir
        self.session = session or uuid.uuid4().hex[:12]
        self.hb_s, self.liveness = config.heartbeat_interval_s, config.liveness
        self.clock, self.wall, self.catalog = clock, wall, catalog
        self.sweep_interval_s, self.lost_keep_s = config.sweep_interval_s, config.lost_keep_s
        self.max_dispatch, self.max_watchers = config.max_dispatch, config.max_watchers
        self.curriculum = curriculum  # resolves a submit's sampler request (None: refused)
        self._ref_of_id = self.tasks.ref_of_id if isinstance(self.tasks, TaskIndex) else \
            {d["task_id"]: ref for ref, d in self.tasks.items()}.get
        self.nodes: dict[str, NodeView] = {}
        self.by_identity: dict[bytes, str] = {}
        self.holder: dict[str, tuple[str, int]] = {}  # rollout id -> (node, token)
        # nodes whose free slots may have grown since dispatch last found none (timers.py)
        self.maybe_free: set[str] = set()
        self.outbox: list[tuple[bytes, P.Message]] = []
        self.watchers: list[tuple[bytes, P.Watch, float]] = []  # (peer, watch, deadline)
        self.welcomed: dict[bytes, float] = {}  # unknown peers sent a welcome, and when
        # rollouts committed in this sweep interval and the one before (timers.py rotates
        # them): a heartbeat that still lists one (its ack in flight) needs no row read
        self._committed_new: set[str] = set()
        self._committed_old: set[str] = set()
        # The catalog (written after each COMMIT) and the status counters (persisted with
        # the passes, timers.py says when: they survive a restart).
        self.ledger = Ledger(queue, catalog)
        self.counters: Counter = self.ledger.counters
        self.dropped: Counter = self.ledger.dropped
        self.stopped = False
        now = clock()
        self._last_sweep = self._last_hb = now
        self._commits = 0  # commits since the watchers were last looked at
        self._policies: dict[int, P.PolicyRef] = {}
        self._last_resync = now
        self._resync()

    # ---- input ----------------------------------------------------------------------------

    def receive(self, identity: bytes, data: bytes) -> None:
        """One frame from a peer: decode (a bad frame is counted and dropped), then handle."""
        self.counters["frames_in"] += 1
        try:
            msg = P.decode(data, self.deployment)
        except P.RemoteProtocolError as exc:
            self.drop(exc.reason, f"from {identity[:32]!r}: {exc}")
            if exc.reason == P.WRONG_VERSION:
                self._refuse_other_version(identity, data)
            return
        self.handle(identity, msg)

    def _refuse_other_version(self, identity: bytes, data: bytes) -> None:
        """A `register` of another protocol version: told so (in the frame layout every
        version reads), so the agent stops instead of retrying forever."""
        peeked = P.peek(data)
        if peeked is None or peeked[1] != self.deployment or peeked[2] != P.Register.TYPE:
            return
        self._refuse_agent(identity, REFUSED_PROTOCOL_VERSION,
                           f"the controller speaks protocol version(s) {list(P.PROTOCOL_VERSIONS)}"
                           f", the agent sent {peeked[0]!r}")

    def _refuse_agent(self, identity: bytes, reason: str, detail: str) -> None:
        key = f"refused_agents_{reason}"
        self.counters[key] += 1
        n = self.counters[key]
        if n <= 10 or n & (n - 1) == 0:  # a stream of such agents must not flood the log
            log.warning("refused agent %r (%d so far): %s", identity[:32], n, detail)
        self._send(identity, P.Refused(
            reason=reason, detail=detail, protocol_versions=list(P.PROTOCOL_VERSIONS),
            min_agent_version=".".join(map(str, P.MIN_AGENT_VERSION))))

    def drop(self, reason: str, detail: str = "") -> None:
        self.dropped[reason] += 1
        n = self.dropped[reason]
        if n <= 10 or n & (n - 1) == 0:  # a flood of garbage must not flood the log
            log.warning("dropped a frame (%s, %d so far) %s", reason, n, detail)

    def handle(self, identity: bytes, msg: P.Message) -> None:
        name = self.by_identity.get(identity)
        view = self.nodes.get(name) if name else None
        if view is not None:
            view.last_seen, view.last_seen_wall = self.clock(), self.wall()
            if view.state == LOST and not isinstance(msg, P.Register):
                view = None  # a node declared lost must register again
        handler = self.HANDLERS.get(type(msg))
        if handler is None:
            self.drop(UNEXPECTED_TYPE, f"{msg.TYPE} from {identity[:32]!r}")
            self._send(identity, P.Ack(ref=msg.id, ok=False, code=UNEXPECTED,
                                       error=f"the controller does not take {msg.TYPE}"))
            return
        if view is None and type(msg) in _GREET_STRANGERS:
            self._welcome_stranger(identity)
        handler(self, identity, msg, view)
        name = self.by_identity.get(identity)
        if name is not None:  # heard from (again): its credit, slots or state may have changed
            self.maybe_free.add(name)

    def _send(self, identity: bytes, msg: P.Message) -> None:
        self.outbox.append((identity, msg))

    def _ok(self, identity: bytes, ref: str) -> None:
        """A plain ack (ok) of message `ref`: kept as its ref until `take_outbox`, which
        makes it an `ack` only for an agent that does not take batches (the others get the
        ref in their `leases` or `acks` frame: one message object fewer per result)."""
        self.outbox.append((identity, ref))  # type: ignore[arg-type]

    def take_outbox(self) -> list[tuple[bytes, P.Message]]:
        """The messages to send, in order; to an agent that takes batches, its leases and its
        plain acks of one pass go in one `leases` frame (or `acks` without leases) where the
        first of them was (a later message of another kind to that agent starts a new
        batch; acks and leases commute). Any frame is a heartbeat: a node sent something
        now needs none for a while (`sent_at`)."""
        out, self.outbox = self._coalesce(self.outbox), []
        self.counters["frames_out"] += len(out)
        return out

    def _coalesce(self, outbox: list) -> list[tuple[bytes, P.Message]]:
        if not outbox:
            return outbox
        # the peers of this outbox (not every node: a pass costs what it sends, not the
        # farm's size), and which of them take batches
        now, names, nodes, batching = self.clock(), self.by_identity, self.nodes, set()
        for identity in {identity for identity, _ in outbox}:
            view = nodes.get(names.get(identity))  # type: ignore[arg-type]
            if view is not None:
                view.sent_at = now
                if view.batches and view.state != LOST and view.identity == identity:
                    batching.add(identity)
        slots: list = []  # (identity, message) or (identity, ([lease...], [ack ref...]))
        open_: dict[bytes, tuple[list, list]] = {}
        lease_t, ack_t = P.Lease, P.Ack
        for identity, msg in outbox:
            kind = type(msg)
            if identity in batching and (kind is lease_t or kind is str or (
                    kind is ack_t and msg.ok and msg.code is None and msg.error is None)):
                group = open_.get(identity)
                if group is None:
                    group = open_[identity] = ([], [])
                    slots.append((identity, group))
                if kind is lease_t:
                    group[0].append(msg)
                else:
                    group[1].append(msg if kind is str else msg.ref)
            else:
                open_.pop(identity, None)
                slots.append((identity, ack_t(ref=msg, ok=True) if kind is str else msg))
        out = []
        for identity, item in slots:
            if type(item) is tuple:
                out.extend((identity, m) for m in P.for_agent(*item))
            else:
                out.append((identity, item))
        return out

    def _welcome_stranger(self, identity: bytes) -> None:
        """An agent we do not know (we restarted, or it was declared lost) talks to us:
        an unsolicited welcome tells it to register again (at most once per interval)."""
        now = self.clock()
        if now - self.welcomed.get(identity, -1e18) >= self.hb_s:
            self.welcomed[identity] = now
            self._send(identity, P.Welcome(node=identity.decode(errors="replace"),
                                           heartbeat_interval_s=self.hb_s,
                                           liveness=self.liveness, session=self.session))

    # ---- node agents ----------------------------------------------------------------------

    def _on_register(self, identity, msg: P.Register, _view) -> None:
        if not P.agent_version_ok(msg.agent_version):
            return self._refuse_agent(identity, REFUSED_AGENT_VERSION, (
                f"agent version {msg.agent_version!r} is not one the controller takes (at "
                f"least {'.'.join(map(str, P.MIN_AGENT_VERSION))}, dotted integers)"))
        held = set(self.queue.leases_of(msg.node))
        keep = held & set(msg.held)
        released = self.queue.release_node(msg.node, "agent registered without them", keep=keep)
        old = self.nodes.get(msg.node)
        if old is not None and old.identity != identity:
            self.by_identity.pop(old.identity, None)
        view = NodeView(msg.node, identity, msg.slots, msg.agent_version, credit=msg.slots,
                        leases=set(keep), images=set(msg.images),
                        last_seen=self.clock(), last_seen_wall=self.wall(),
                        batches=P.speaks_batches(msg.agent_version), prefetch=msg.prefetch)
        self.nodes[msg.node] = view
        self.by_identity[identity] = msg.node
        self.welcomed.pop(identity, None)
        for rid in released:
            self.holder.pop(rid, None)
        self._revoke_stale(identity, msg.node, set(msg.held) - held)
        log.info("node %s registered: %d slots, agent %s, kept %d leases, released %d",
                 msg.node, msg.slots, msg.agent_version, len(keep), len(released))
        self._send(identity, P.Welcome(node=msg.node, heartbeat_interval_s=self.hb_s,
                                       liveness=self.liveness, session=self.session))
        self._tell_policy((view,))

    def _on_ready(self, identity, msg: P.Ready, view) -> None:
        if view is None:
            return
        view.credit = min(msg.credit, view.slots)
        if msg.draining and view.state == LIVE:
            view.move(DRAINING)
            log.info("node %s is draining", view.node)

    def _on_heartbeat(self, identity, msg: P.Heartbeat, view) -> None:
        if view is None or msg.node is None:
            return  # a controller-style heartbeat from a peer: only proves it is alive
        view.active, view.slots_free, view.health = msg.active, msg.slots_free, msg.health
        if msg.slots_free > 0:  # the agent takes work: a drain it never got, or a stale ready
            if view.drain_requested:
                self._send(identity, P.Drain(reason="drain requested", deadline_s=view.drain_deadline_s))
            else:
                view.move(LIVE)
                view.credit = view.slots
        if msg.images is not None:
            view.images = set(msg.images)
        held = msg.held
        self.queue.renew(view.node, held)
        # Fenced leases it runs (fencing.py): only the rollouts it lists that its mirror does
        # not hold can be; a node holding what it lists (the common case) costs one set test.
        # One whose result was committed lately (its ack was on its way) is no one's: skipped
        # without reading its row (fencing.stale_leases would skip it there).
        if held and not view.leases.issuperset(held):
            leases, new, old = view.leases, self._committed_new, self._committed_old
            others = [r for r in held if r not in leases and r not in new and r not in old]
            if others:
                self._revoke_stale(identity, view.node, others)

    def _revoke_stale(self, identity: bytes, node: str, rollout_ids: Iterable[str]) -> None:
        for reject in stale_leases(node, rollout_ids, self.holder, self.queue.rollout):
            self.counters["revoked_" + LEASE_REVOKED] += 1
            log.info("node %s still runs rollout %s (token %d now): revoked", node, reject.rollout_id, reject.token)
            self._send(identity, reject)

    def _on_started(self, identity, msg: P.Started, view) -> None:
        # A lease the mirror shows this node holding with this token: noted, written with
        # the row's next write (RolloutQueue.note_started); anything else is checked on the row.
        if view is not None and self.holder.get(msg.rollout_id) == (view.node, msg.token):
            self.queue.note_started(msg.rollout_id, msg.attempt, msg.token, view.node)
            return
        c = self.queue.mark_running(msg.rollout_id, msg.attempt, msg.token)
        if not c.accepted:
            self._reject(identity, msg, c.reason)

    def _on_result(self, identity, msg: P.Result, view) -> None:
        if msg.shards and not _SHARD_TABLES.issuperset(msg.shards):
            unknown = sorted(set(msg.shards) - _SHARD_TABLES)
            self.drop(BAD_SHARDS, f"result of {msg.rollout_id}: tables {unknown}")
            self._reject(identity, msg, REJECT_BAD_REQUEST)
            return
        c = self.queue.complete(msg.rollout_id, msg.attempt, msg.token, msg.outcome, msg.reward,
                                msg.shards, msg.reason, msg.idem)
        if not c.accepted:
            self._reject(identity, msg, c.reason)
            return
        if c.duplicate:  # a resend after a lost ack: answered, counted once
            self._ok(identity, msg.id)
            return
        self._unhold(msg.rollout_id, msg.token)
        if c.committed:
            self.counters["committed"] += 1
            self._committed_new.add(msg.rollout_id)
            # into the catalog once the queue's COMMIT is durable
            self.ledger.commit(msg.rollout_id, msg.attempt, msg.token, msg.shards, self.wall())
        else:
            self.counters["infra_failures"] += 1
        if self.curriculum is not None:
            self._teach_curriculum(msg, c.committed)
        self._commits += 1
        self._ok(identity, msg.id)

    def _teach_curriculum(self, msg: P.Result, committed: bool) -> None:
        """Feed the curriculum this controller samples from: a committed verdict counts for its
        task and policy version (once per rollout); a dead-lettered rollout counts as an
        infrastructure failure of its task (repeated ones quarantine it)."""
        row = self.queue.rollout(msg.rollout_id)
        task = self.tasks.get(row["task_ref"]) if row else None
        if task is None:
            return
        try:
            if committed:
                self.curriculum.record(task["task_id"], row["policy_version"], msg.outcome,
                                       rollout_id=msg.rollout_id)
            elif row["state"] == DEAD_LETTER:
                self.curriculum.record_infra_failure(task["task_id"], msg.reason or "?")
        except (sqlite3.Error, ValueError) as exc:     # estimates, not the ledger: log and go on
            log.warning("curriculum: cannot record %s: %s", msg.rollout_id, exc)

    def _on_result_batch(self, identity, msg: P.ResultBatch, view) -> None:
        for item in msg.items:
            self._on_result(identity, item, view)

    def _on_release(self, identity, msg: P.Release, view) -> None:
        c = self.queue.release(msg.rollout_id, msg.attempt, msg.token, msg.reason)
        if c.accepted:
            self.counters["released"] += 1
            self._unhold(msg.rollout_id, msg.token)
            self._ok(identity, msg.id)
        else:
            self._reject(identity, msg, c.reason)

    def _on_disconnect(self, identity, msg: P.Disconnect, view) -> None:
        if view is None or view.node != msg.node:
            return
        drained = msg.reason == "drained"
        released = self.queue.release_node(view.node, f"disconnected: {msg.reason}", failure=not drained)
        view.left_drained = drained
        self._lose(view, f"disconnected: {msg.reason}", released)

    def _reject(self, identity: bytes, msg, reason: Optional[str]) -> None:
        reason = reason or STALE_TOKEN
        self.counters[f"rejected_{reason}"] += 1
        self._unhold(msg.rollout_id, msg.token)
        self._send(identity, P.Reject(rollout_id=msg.rollout_id, attempt=msg.attempt,
                                      token=msg.token, reason=reason))

    def _unhold(self, rollout_id: str, token: int) -> None:
        held = self.holder.get(rollout_id)
        if held is not None and held[1] == token:
            del self.holder[rollout_id]
            view = self.nodes.get(held[0])
            if view is not None:
                view.leases.discard(rollout_id)
                self.maybe_free.add(view.node)

    def _lose(self, view: NodeView, why: str, released: Iterable[str]) -> None:
        view.move(LOST)
        view.leases.clear()
        view.active, view.slots_free = 0, 0     # a gone node holds no slot: none shown busy
        for rid in released:
            self.holder.pop(rid, None)
        self.counters["nodes_lost"] += 1
        if view.left_drained:
            log.info("node %s drained and left (%s)", view.node, why)
        else:
            log.warning("node %s lost (%s)", view.node, why)

    # ---- trainer clients ------------------------------------------------------------------

    def _refuse(self, identity: bytes, msg: P.Message, code: str, error: str) -> None:
        self.counters[f"refused_{code}"] += 1
        self._send(identity, P.Ack(ref=msg.id, ok=False, code=code, error=error))

    def _on_submit(self, identity, msg: P.Submit, _view) -> None:
        refused = [t for t in msg.tasks if t in self.refused_tasks]
        if refused:
            return self._refuse(identity, msg, UNKNOWN_TASK, f"task refused when the task set was loaded: "
                                f"{self.refused_tasks[refused[0]]}")
        unknown = [t for t in msg.tasks if t not in self.tasks]
        if unknown:
            return self._refuse(identity, msg, UNKNOWN_TASK, f"unknown tasks: {unknown[:5]}")
        if not msg.tasks and msg.sampler is None:
            return self._refuse(identity, msg, BAD_REQUEST, "submit needs at least one task")
        if self._policy(msg.policy_version) is None:
            return self._refuse(identity, msg, UNKNOWN_POLICY,
                                f"policy version {msg.policy_version} is not published")
        tasks = msg.tasks
        if msg.sampler is not None:
            if self.queue.submitted(msg.idem):
                tasks = []  # a resend: the stored reply, without sampling again
            else:
                tasks = self._sample(identity, msg)
                if tasks is None:
                    return
        items = [(self.tasks[t]["task_id"], msg.policy_version) for t in tasks]
        try:
            batch_id, n, _dup = self.queue.submit_batch(msg.idem, items, msg.n_per_task)
        except ValueError as exc:
            return self._refuse(identity, msg, BAD_REQUEST, str(exc))
        self._send(identity, P.Submitted(batch_id=batch_id, rollouts=n, ref=msg.id))

    def _sample(self, identity: bytes, msg: P.Submit) -> Optional[list[str]]:
        """The task refs a sampler request picks (None: refused, the reply is sent)."""
        s = msg.sampler
        if self.curriculum is None:
            self._refuse(identity, msg, BAD_REQUEST, "this controller has no curriculum to "
                         "sample from (start it with --curriculum-db)")
            return None
        try:
            ids = self.curriculum.sample(s.n_tasks, random.Random(s.seed), msg.policy_version,
                                         within=(s.band[0], s.band[1]))
        except (CurriculumError, ValueError) as exc:
            self._refuse(identity, msg, BAD_REQUEST, f"sampler: {exc}")
            return None
        refs = [self._ref_of_id(t) for t in ids]
        unknown = [t for t, ref in zip(ids, refs) if ref is None]
        if unknown:
            self._refuse(identity, msg, UNKNOWN_TASK, f"the curriculum picked tasks this "
                         f"controller does not serve: {unknown[:5]}")
            return None
        return refs

    def _on_publish_policy(self, identity, msg: P.PublishPolicy, _view) -> None:
        try:
            self.queue.publish_policy(msg.version, msg.endpoint, msg.model, msg.idem)
        except PolicyConflict as exc:
            return self._refuse(identity, msg, POLICY_CONFLICT, str(exc))
        self._policies.pop(msg.version, None)  # an endpoint move: leases from now on name the new one
        self._resync()  # a newer policy may have revoked stale leases
        self._ok(identity, msg.id)
        self._tell_policy(self.nodes.values())

    def _tell_policy(self, views: Iterable[NodeView]) -> None:
        """The newest policy to live agents that take `policy` (their gateways retry a call
        refused during a weight update under it)."""
        latest = self.queue.latest_policy()
        if latest is None:
            return
        ref = P.PolicyRef(latest.version, latest.endpoint, latest.model)
        for v in views:
            if v.state != LOST and P.speaks_policy_updates(v.agent_version):
                self._send(v.identity, P.PolicyUpdate(policy=ref))

    def _on_cancel(self, identity, msg: P.Cancel, _view) -> None:
        try:
            c = self.queue.cancel(msg.batch_id, msg.idem, reason=msg.reason)
        except UnknownBatch:
            return self._refuse(identity, msg, UNKNOWN_BATCH, f"no batch {msg.batch_id!r}")
        for rid, node, attempt, token in c.revoked:
            view = self.nodes.get(node)
            self._unhold(rid, token)
            if view is not None and view.state != LOST:  # it stops the attempt now (agent/guard.py)
                self._send(view.identity, P.Reject(rollout_id=rid, attempt=attempt,
                                                   token=token, reason=REJECT_CANCELLED))
        self.counters["revoked_" + msg.reason] += len(c.revoked)
        self._commits += 1  # watchers of the batch: it may be done now
        self._send(identity, P.Cancelled(batch_id=msg.batch_id, rollouts=c.rollouts, ref=msg.id, reason=msg.reason))

    def _on_drain_node(self, identity, msg: P.DrainNode, _view) -> None:
        view = self.nodes.get(msg.node)
        if view is None or view.state == LOST:
            return self._refuse(identity, msg, UNKNOWN_NODE, f"no live node {msg.node!r}")
        view.move(DRAINING)
        view.drain_requested, view.drain_deadline_s = True, msg.deadline_s
        log.info("node %s: drain requested (deadline %s s)", msg.node, msg.deadline_s)
        self._send(view.identity, P.Drain(reason="drain requested", deadline_s=msg.deadline_s))
        self._ok(identity, msg.id)

    def _on_watch(self, identity, msg: P.Watch, _view) -> None:
        try:
            self.queue.batch_done(msg.batch_id)
        except UnknownBatch:
            return self._refuse(identity, msg, UNKNOWN_BATCH, f"no batch {msg.batch_id!r}")
        if not self._answer_watch(identity, msg, final=msg.wait_s <= 0):
            if len(self.watchers) >= self.max_watchers:
                self._answer_watch(identity, msg, final=True)
            else:
                wait_s = min(msg.wait_s, self.config.max_watch_wait_s)
                self.watchers.append((identity, msg, self.clock() + wait_s))

    def _answer_watch(self, identity: bytes, msg: P.Watch, final: bool) -> bool:
        items, cursor = self.queue.results_after(msg.batch_id, msg.after)
        full = len(items) >= self.queue.config.max_results_per_watch
        done = not full and self.queue.batch_done(msg.batch_id) and not self.queue.results_after(
            msg.batch_id, cursor)[0]
        if not (items or done or final):
            return False
        if done:
            self.ledger.want_flush()  # the trainer reads DuckDB once the batch is done
        self._send(identity, P.Results(batch_id=msg.batch_id, items=items, cursor=cursor, done=done, ref=msg.id))
        return True

    def _on_status(self, identity, msg: P.Status, _view) -> None:
        snap = self.snapshot()
        self._send(identity, P.StatusReply(counts=snap["counts"], nodes=snap["nodes"],
                                           counters=snap["counters"], ref=msg.id))

    def _on_shutdown(self, identity, msg: P.Shutdown, _view) -> None:
        reason = msg.reason or "controller stopping"
        for n in self.nodes.values():
            if n.state != LOST:
                self._send(n.identity, P.Shutdown(reason=reason))
        for stranger in self.welcomed:  # agents told to register that have not yet
            self._send(stranger, P.Shutdown(reason=reason))
        self._ok(identity, msg.id)
        self.stopped = True

    # ---- status ---------------------------------------------------------------------------

    def snapshot(self) -> dict:
        """What `status` answers and the ops endpoint exports (see docs/protocol.md)."""
        # A node that drained and said goodbye is LOST to the state table (it never comes
        # back as itself) but shown as "drained": it left cleanly, nothing to investigate.
        nodes = [{"node": n.node, "state": DRAINED_VIEW if n.state == LOST and n.left_drained else n.state,
                  "last_seen": n.last_seen_wall,
                  "slots": n.slots,
                  "slots_free": n.slots_free if n.slots_free is not None else n.free(),
                  "leases": len(n.leases), "active": n.active,
                  "agent_version": n.agent_version, "health": n.health}
                 for n in self.nodes.values()]
        counters = dict(self.counters)
        counters["dropped"] = dict(self.dropped)
        counters["watchers"] = len(self.watchers)
        return {"session": self.session, "time": self.wall(), "counts": self.queue.counts(),
                "nodes": nodes, "counters": counters}


    # The message table, type -> handler (built once); a type not in it is refused (unexpected_type).
    HANDLERS: ClassVar[dict[type, Callable]] = {
        P.Register: _on_register, P.Ready: _on_ready, P.Heartbeat: _on_heartbeat, P.Started: _on_started,
        P.Result: _on_result, P.ResultBatch: _on_result_batch, P.Release: _on_release, P.Disconnect: _on_disconnect,
        P.Submit: _on_submit, P.PublishPolicy: _on_publish_policy, P.Cancel: _on_cancel,
        P.DrainNode: _on_drain_node, P.Watch: _on_watch, P.Status: _on_status, P.Shutdown: _on_shutdown}


def admit_tasks(tasks: Mapping) -> tuple[Mapping[str, dict], dict[str, str]]:
    """(the tasks file's entries a lease may carry, ref -> why each other entry was refused).
    An entry is refused, logged with its name, when it is not a small well-formed reference
    (`taskblobs.check_reference`: a task inlined whole would not fit a frame); the others run.
    A task listed by id alone (the tasks file of `taskblobs.write_tasks_file`) is also known by
    its name: the same entry, not a copy."""
    if isinstance(tasks, TaskIndex):  # admitted when the index was built (store/taskindex.py)
        return tasks, tasks.refused
    admitted, refused = {}, {}
    tasks = tasks or {}
    for ref, entry in tasks.items():
        why = check_reference(str(ref), entry)
        if why is not None:
            log.error("refused when loading the task set: %s", why)
        name = entry.get("name") if isinstance(entry, dict) else None
        keys = [ref]
        if isinstance(name, str) and name and ref == entry.get("task_id") and name not in tasks:
            keys.append(name)
        for key in keys:
            if why is None:
                admitted[key] = entry
            else:
                refused[key] = why
    return admitted, refused
