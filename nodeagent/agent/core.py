"""The node agent's protocol logic, sans-I/O: registration, credit, leases in and attempts out,
`started`, results resent until acknowledged, heartbeats with health, liveness, drain.

`AgentCore` takes frames (`receive_data`: decoded and validated here; a malformed frame is
counted and dropped), finished attempts (`attempts_done`) and the passage of time (`tick`,
reading the injected clock), decides, and leaves what to do in two lists:
- `take_outbox()`: the messages to send, in order; `RECONNECT` among them means "replace the
  socket by a fresh one here, then send the rest on it";
- `take_attempts()`: the attempts to start (each one `Attempt`, built from its lease).
It touches no socket, thread, process or host figure: the daemon (nodeagent/agent/daemon.py)
owns those, and the deterministic simulation (tests/sim) drives this same class over a
simulated network and clock.

Rules:
- Registration: `register` then `ready` (credit = free slots) on start and after every
  reconnect; `refused` (this agent's protocol or agent version) stops the agent with its
  reason (`refused`).
- Liveness (Paranoid Pirate): any frame is a sign of life; a controller silent for
  `liveness` heartbeat intervals (plus the backoff) means `RECONNECT` and a new registration,
  the backoff doubling up to `backoff_max_s` while it stays silent, reset by a `welcome`.
- A `welcome` the agent did not ask for (the controller restarted, or declared it lost)
  makes it register again, listing the rollouts it still holds so their leases are kept.
- Prefetch (`prefetch` N, in the `register`): up to slots + N leases held; those beyond
  the slots wait (in `held`, fenced and cancelled like running ones) and start, oldest
  first, as slots free; a drain releases them at once, unstarted (docs/protocol.md).
- A lease it runs or ran (same token) is ignored; one while draining or full is released at
  once; a newer lease of a rollout it runs makes the old attempt stale (never reported). The
  lease's task is decoded here (`LeaseTask.decode`, once per distinct task: `TaskMemo`,
  nodeagent/agent/leases.py): a malformed task is an `infra_error` result naming the field,
  never a crash.
- `started` goes out once an attempt has run STARTED_AFTER_S (one that ends sooner says so
  in its result only).
- A result stays unacknowledged until `ack` or `reject`; it is sent again after a `welcome`
  and every liveness period (its idempotency key makes that safe); results go as one
  `result_batch` once the controller has sent a batch since the registration.
- Heartbeats every interval, from a random phase, with the health payload and `held`.
- `policy` (and each lease's policy) sets `policy`, the newest version the node knows of (never
  an older one): the attempts' gateways retry a call refused during a weight update under it.
- Finding the controller again: with a `watch` (a callable the owner injects; the daemon's
  looks at the endpoint file), the agent asks it for news each heartbeat while the
  controller has been silent for at least one interval, and -- once the owner says the
  connection dropped (`connection_lost()`: the controller's process died, its TCP session
  ended) -- every WATCH_FIRST_S, doubling up to a heartbeat interval, until the controller
  is heard from again. A new endpoint (a controller started, on any port) means `RECONNECT`
  to it now, the backoff reset, a new registration; `stopped` (the controller stopped on
  purpose since it last started) ends the agent (exit 0).
- `give_up_s`: an agent that has never been welcomed that long after its start stops
  (`gave_up`), rather than retry for ever.
- Drain (`drain()`, or a `drain` from the controller): no new leases (credit 0), finish what
  runs until the deadline, then `release` what is still unfinished and `disconnect`.
- Cancellation: an attempt the agent stops running -- a `reject` of its lease or of a newer
  lease of its rollout (its batch cancelled: `cancelled_by_trainer`; a stale token or unknown
  rollout: `lease_revoked`), a
  newer lease of its rollout (`superseded`), the drain deadline (`drain`), a `shutdown`
  (`shutdown`) -- has its `cancel` signal set with that code (states.CancelReason) and its
  slot freed at once; its result is never reported. The attempt's runner watches the signal
  (nodeagent/agent/guard.py): it kills the attempt's sandboxes and model calls within a
  second. `cancelled` counts the attempts stopped, by code.

The registration is a second table (`LINKS`, checked likewise): new -> registering ->
registered <-> reregistering (`welcomed`: registered or reregistering; `awaiting_welcome`:
registering or reregistering).

Messages are dispatched by one table, type -> handler (`_message_table`, built once); a type
the agent does not take is ignored. Knobs: one `AgentConfig` (nodeagent/agent/config.py).

Phases (`PHASES`, checked on every change): serving -> draining -> done (disconnected). An
end -- `stopped` (a `shutdown`, the controller stopped on purpose, or the owner: `stop()`),
`refused` or `gave_up` -- may follow serving or draining; nothing follows done or an end (the
first end stays: the `stopped`, `refused` and `gave_up` properties read the phase).
`draining` stays true from the start of a drain on, whatever follows; an ended agent takes no
drain.

Must not import: zmq, psutil, threading, os, nodeagent.sandbox, nodeagent.harness, nodeagent.verifier,
nodeagent.egress, nodeagent.store (anything that runs an attempt), controller other than controller.contracts.
"""
from __future__ import annotations

import collections
import logging
import random
import time
from dataclasses import dataclass
from typing import Any, Callable, Iterable, Optional

from controller.contracts import protocol as P
from controller.contracts.states import (
    CANCEL_DRAIN,
    CANCEL_SHUTDOWN,
    CANCEL_SUPERSEDED,
    TASK,
    InfraReason,
    cancel_reason_of_reject,
)
from controller.contracts.tasks import TaskError
from nodeagent.agent.config import AgentConfig, with_knobs
from nodeagent.agent.leases import (  # re-exported: the owner and the tests take them from here
    Attempt,
    AttemptResult,
    TaskMemo,
)
from nodeagent.agent.leases import (
    CancelSignal as CancelSignal,
)
from nodeagent.agent.phases import (  # re-exported: the owner and the tests take them from here
    ENDED,
    LINKS,
    PHASES,
    RECONNECT,
    Link,
    Outgoing,
    Phase,
    Watch,
)
from nodeagent.agent.phases import (
    EndpointNews as EndpointNews,
)
from nodeagent.agent.version import AGENT_VERSION

log = logging.getLogger("nodeagent")
STARTED_AFTER_S = 0.05  # a rollout that ends sooner never sends `started`
FINISHED_TOKENS_KEPT = 4096  # tokens of attempts run, remembered to ignore their late duplicates
IMAGES_REFRESH_BEATS = 12  # a heartbeat names every image at least this often (once a minute at 5 s)
WATCH_FIRST_S = 0.05  # after the connection dropped: look at the watch this soon, then doubling


@dataclass
class _Pending:
    msg: P.Result
    sent_at: float


class AgentCore:
    """The agent's protocol state and rules (see the module docstring). `config` holds the
    knobs (nodeagent/agent/config.py); `slots` and keyword knobs (`heartbeat_interval_s=...`)
    replace single fields of it."""

    def __init__(self, node: str, slots: Optional[int], deployment: str, *,
                 config: AgentConfig = AgentConfig(), agent_version: str = AGENT_VERSION,
                 clock: Callable[[], float] = time.monotonic,
                 health: Callable[[], dict] = dict, mem_free_mb: Callable[[], int] = lambda: 0,
                 rng: Any = random, endpoint: str = "?", watch: Optional[Watch] = None, **knobs: Any):
        self.config = config = with_knobs(config, knobs if slots is None else {**knobs, "slots": slots})
        self.node, self.slots, self.deployment = node, config.slots, deployment
        self.prefetch = config.prefetch  # leases taken beyond the slots: they wait in `_waiting`
        # the controller's endpoint: the owner connects a RECONNECT's fresh socket to it
        self.agent_version, self.endpoint = agent_version, endpoint
        self.watch, self.give_up_s = watch, config.give_up_s
        self.moves = 0  # endpoints taken from the watch
        self.hb_s, self.liveness = config.heartbeat_interval_s, config.liveness
        self.drain_deadline_s, self.backoff_max_s = config.drain_deadline_s, config.backoff_max_s
        self.clock, self.health, self.mem_free_mb, self.rng = clock, health, mem_free_mb, rng
        self.phase = Phase.SERVING
        self.refused: Optional[str] = None  # why the controller refused this agent (Phase.REFUSED)
        self.active: dict[str, Attempt] = {}
        self.abandoned: set[tuple[str, int]] = set()  # (rollout, token) not to report
        self.finished: set[int] = set()  # tokens of attempts run (the last FINISHED_TOKENS_KEPT)
        self._finished_order: collections.deque = collections.deque()
        self.unacked: dict[str, _Pending] = {}  # result message id -> pending
        # `started` not sent yet, with when the lease came
        self.starting: list[tuple[Attempt, float]] = []
        self.images: set[str] = set()  # digests the runner has used on this node
        # how many of them the controller was last told, and heartbeats since: a heartbeat
        # names the images only when the set grew, and every IMAGES_REFRESH_BEATS-th one
        self._images_told, self._beats_since_images = -1, 0
        # the newest policy the controller told of (`policy`, leases): a gateway call refused
        # during a weight update is retried under it (nodeagent.gateway.session.Follow)
        self.policy: Optional[P.PolicyRef] = None
        self.drain_by: Optional[float] = None  # set once, when a drain starts
        self.session: Optional[str] = None
        self.peer_batches = False  # the controller sent a batch since we registered
        self.link = Link.NEW  # the registration's state (LINKS)
        self.bad_frames = self.completed = self.infra_errors = self.registrations = 0
        self.cancelled: collections.Counter = collections.Counter()  # attempts stopped, by code
        self.last_rx = self.last_hb = 0.0
        self.watch_due: Optional[float] = None  # connection dropped: the next look at the watch
        self._watch_every_s = WATCH_FIRST_S
        self.backoff_s = config.heartbeat_interval_s
        self.started_at: Optional[float] = None
        self._outbox: list[Outgoing] = []
        self._to_run: list[Attempt] = []
        # prefetched leases (in `active`, so renewed and fenced like running ones) waiting
        # for a slot, oldest first; `_promote` starts them as slots free
        self._waiting: collections.deque[Attempt] = collections.deque()
        self.tasks = TaskMemo()  # each distinct task decoded once (nodeagent/agent/leases.py)
        self._handlers = self._message_table()

    # -- phases -----------------------------------------------------------------------------
    def _enter(self, phase: Phase) -> None:
        assert phase in PHASES[self.phase], f"agent {self.node}: illegal phase {self.phase} -> {phase}"
        self.phase = phase

    def _link(self, link: Link) -> None:
        assert link in LINKS[self.link], f"agent {self.node}: illegal registration {self.link} -> {link}"
        self.link = link

    @property
    def welcomed(self) -> bool:
        """A welcome came at least once."""
        return self.link in (Link.REGISTERED, Link.REREGISTERING)

    @property
    def awaiting_welcome(self) -> bool:
        return self.link in (Link.REGISTERING, Link.REREGISTERING)

    def _end(self, phase: Phase) -> None:
        """The agent ends (`phase` one of ENDED); an agent already ended, or done, stays so
        (the first end is the one it reports)."""
        if not (self.stopped or self.done):
            self._enter(phase)

    def stop(self) -> None:
        """The owner ends the agent (it stops reading and ticking)."""
        self._end(Phase.STOPPED)

    @property
    def draining(self) -> bool:
        """A drain started (it stays so once the agent is done or ended)."""
        return self.drain_by is not None

    @property
    def done(self) -> bool:
        """Drained and disconnected."""
        return self.phase is Phase.DONE

    @property
    def stopped(self) -> bool:
        """Ended: stopped, refused or gave up (the owner stops driving it)."""
        return self.phase in ENDED

    @property
    def gave_up(self) -> bool:
        return self.phase is Phase.GAVE_UP

    # -- outputs ----------------------------------------------------------------------------
    def take_outbox(self) -> list[Outgoing]:
        out, self._outbox = self._outbox, []
        return out

    def take_attempts(self) -> list[Attempt]:
        out, self._to_run = self._to_run, []
        return out

    def held(self) -> list[str]:
        """The rollouts this agent runs or has unacknowledged results for."""
        return sorted(set(self.active) | {p.msg.rollout_id for p in self.unacked.values()})

    def free(self) -> int:
        return 0 if self.draining else max(self.slots - len(self.active), 0)

    def poll_timeout_ms(self) -> int:
        """How long the owner may wait for a frame: until the next heartbeat, liveness check,
        `started` or drain deadline (at most a heartbeat interval, at least 1 ms)."""
        now = self.clock()
        silent_by = self.last_rx + self.hb_s * (self.liveness - 1) + self.backoff_s
        next_due = min(self.last_hb + self.hb_s, silent_by)
        if self.starting:
            next_due = min(next_due, self.starting[0][1] + STARTED_AFTER_S)
        if self.draining and self.drain_by is not None:
            next_due = min(next_due, self.drain_by)
        if self.watch_due is not None:
            next_due = min(next_due, self.watch_due)
        return max(1, min(int((next_due - now) * 1000) + 1, int(self.hb_s * 1000) + 1))

    # -- inputs -----------------------------------------------------------------------------
    def start(self) -> None:
        """A fresh connection: register, and start the liveness and heartbeat clocks (the
        heartbeat from a random phase: agents started together do not beat at once)."""
        self._register()
        self.last_rx = self.clock()
        if self.started_at is None:
            self.started_at = self.last_rx
        self.last_hb = self.last_rx - self.rng.uniform(0.0, self.hb_s)
        self.backoff_s = self.hb_s

    def connection_lost(self) -> None:
        """The owner saw the connection to the controller drop (a restarted controller is
        about to publish itself): look at the watch soon and often until a frame comes."""
        if self.watch is not None and self.watch_due is None:
            self._watch_every_s = WATCH_FIRST_S
            self.watch_due = self.clock() + WATCH_FIRST_S

    def _heard(self) -> None:
        self.last_rx = self.clock()
        self.watch_due = None

    def receive_data(self, data: bytes) -> bool:
        """One frame from the controller. False: stop reading (the controller refused us)."""
        self._heard()
        try:
            msg = P.decode(data, self.deployment)
        except P.ProtocolError as exc:
            refused = P.refusal(data, self.deployment) if exc.reason == P.WRONG_VERSION else None
            if refused is not None:  # a controller of another protocol version
                self._refused(refused)
                return False
            self.bad_frames += 1
            log.warning("dropped a malformed frame from the controller: %s", exc)
            return True
        self._handle(msg)
        return True

    def receive(self, msg: P.Message) -> None:
        """One decoded message from the controller (any message is a sign of life)."""
        self._heard()
        self._handle(msg)

    def attempts_done(self, items: Iterable[tuple[Attempt, AttemptResult]]) -> None:
        """Attempts that ended: their results go out (one batch), unless abandoned."""
        out: list[P.Result] = []
        for a, res in items:
            if (a.rollout_id, a.token) in self.abandoned:
                self.abandoned.discard((a.rollout_id, a.token))
                continue
            if self.active.get(a.rollout_id) is a:
                del self.active[a.rollout_id]
            out.append(self._record(a.rollout_id, a.attempt, a.token, res))
        self._promote()
        self._send_results(out)

    def drain(self, deadline_s: Optional[float] = None) -> None:
        """Take no new leases; finish what runs within deadline_s, then hand the rest back."""
        if self.draining or self.stopped:
            return
        self._enter(Phase.DRAINING)
        self.drain_by = self.clock() + (deadline_s if deadline_s is not None else self.drain_deadline_s)
        log.info("draining: %d attempts running, deadline in %.1fs", self.running(),
                 self.drain_by - self.clock())
        self._send(P.Ready(node=self.node, credit=0, draining=True))
        self._hand_back_waiting()  # after the ready: the controller leases them elsewhere

    def tick(self) -> None:
        """The passage of time: `started`, heartbeats and resends, liveness, the drain's end."""
        self._flush_started()
        now = self.clock()
        if now - self.last_hb >= self.hb_s:
            self._heartbeat()
            self._resend_unacked(now)
            self.last_hb = now
            if now - self.last_rx >= self.hb_s and self._look_for_controller(now):
                return
        if self.watch_due is not None and now >= self.watch_due:
            self._watch_every_s = min(self._watch_every_s * 2, self.hb_s)
            self.watch_due = now + self._watch_every_s
            if self._look_for_controller(now):
                return
        if self._give_up(now):
            return
        if now - self.last_rx > self.hb_s * self.liveness + self.backoff_s - self.hb_s:
            log.warning("controller silent for %.1fs: reconnecting", now - self.last_rx)
            self.backoff_s = min(self.backoff_s * 2, self.backoff_max_s)
            self._outbox.append(RECONNECT)
            self._register()
            self.last_rx = now
        if self.phase is Phase.DRAINING and self._drain_over(now):
            self._enter(Phase.DONE)

    def _look_for_controller(self, now: float) -> bool:
        """The controller is silent: ask the watch. True when the agent stopped."""
        news = self.watch() if self.watch is not None else None
        if news is None:
            return False
        if news.stopped:
            log.info("the controller stopped on purpose while this agent waited: exiting")
            self._end(Phase.STOPPED)
            return True
        if news.endpoint:
            log.info("controller silent for %.1fs and published at %s: reconnecting there",
                     now - self.last_rx, news.endpoint)
            self.endpoint, self.backoff_s = news.endpoint, self.hb_s
            self.moves += 1
            self._outbox.append(RECONNECT)
            self._register()
            self.last_rx = now
        return False

    def _give_up(self, now: float) -> bool:
        """Never welcomed within give_up_s of the start: stop (True)."""
        if self.welcomed or self.give_up_s is None or self.started_at is None \
                or now - self.started_at < self.give_up_s:
            return False
        log.error("no controller answered at %s within %.0fs of the start: giving up",
                  self.endpoint, self.give_up_s)
        self._end(Phase.GAVE_UP)
        return True

    # -- messages ---------------------------------------------------------------------------
    def _send(self, msg: P.Message) -> None:
        self._outbox.append(msg)

    def _register(self, welcomed: bool = False) -> None:
        """Register (again); `welcomed`: a welcome has just come (an unsolicited one)."""
        self.registrations += 1
        self._link(Link.REREGISTERING if welcomed or self.welcomed else Link.REGISTERING)
        self.peer_batches = False
        self._send(P.Register(node=self.node, slots=self.slots, images=sorted(self.images),
                              mem_free_mb=self.mem_free_mb(), agent_version=self.agent_version,
                              held=self.held(), prefetch=self.prefetch))
        self._images_told, self._beats_since_images = len(self.images), 0
        self._send(P.Ready(node=self.node, credit=self.free(), draining=self.draining))

    def _message_table(self) -> dict[type, Callable[[Any], None]]:
        """What the agent does with each message type the controller sends (built once); a
        type not in it is ignored (the frame was still a sign of life)."""
        return {P.Lease: self._on_lease, P.LeaseBatch: self._on_lease_batch,
                P.AckBatch: self._on_ack_batch, P.Welcome: self._on_welcome, P.Ack: self._on_ack,
                P.Reject: self._on_reject, P.Drain: self._on_drain, P.Shutdown: self._on_shutdown,
                P.PolicyUpdate: self._on_policy, P.Refused: self._on_refused,
                P.Heartbeat: self._on_heartbeat}

    def _handle(self, msg: P.Message) -> None:
        handler = self._handlers.get(type(msg))
        if handler is None:
            log.debug("ignored a %s from the controller", msg.TYPE)
            return
        handler(msg)

    def _on_heartbeat(self, msg: P.Heartbeat) -> None:
        """A controller heartbeat only proves the controller is alive."""

    def _on_lease_batch(self, msg: P.LeaseBatch) -> None:
        self.peer_batches = True
        for ref in msg.acks:
            self.unacked.pop(ref, None)
        for lease in msg.items:
            self._on_lease(lease)

    def _on_ack_batch(self, msg: P.AckBatch) -> None:
        self.peer_batches = True
        for ref in msg.refs:
            self.unacked.pop(ref, None)

    def _on_ack(self, msg: P.Ack) -> None:
        self.unacked.pop(msg.ref, None)

    def _on_drain(self, msg: P.Drain) -> None:
        log.info("drain: %s", msg.reason)
        self.drain(msg.deadline_s)

    def _on_shutdown(self, msg: P.Shutdown) -> None:
        log.info("shutdown: %s", msg.reason)
        self.stop_all(CANCEL_SHUTDOWN)
        self._end(Phase.STOPPED)

    def _on_policy(self, msg: P.PolicyUpdate) -> None:
        self._newer_policy(msg.policy)

    def _on_refused(self, msg: P.Refused) -> None:
        self._refused(f"{msg.detail} (controller speaks protocol {msg.protocol_versions}, "
                      f"agents from version {msg.min_agent_version})")

    def _on_welcome(self, msg: P.Welcome) -> None:
        self.backoff_s = self.hb_s
        if self.awaiting_welcome:
            self._link(Link.REGISTERED)
            self.session = msg.session
            self._resend_unacked(None)
        else:  # the controller does not know us (it restarted, or we were lost)
            log.info("unsolicited welcome (session %s): registering again", msg.session)
            self._register(welcomed=True)

    def _on_reject(self, msg: P.Reject) -> None:
        log.info("rejected: %s attempt %d token %d: %s", msg.rollout_id, msg.attempt,
                 msg.token, msg.reason)
        for key, p in list(self.unacked.items()):
            if (p.msg.rollout_id, p.msg.token) == (msg.rollout_id, msg.token):
                del self.unacked[key]
        a = self.active.get(msg.rollout_id)
        # cancelled or stale: stop it, never report it. A newer token means the rollout was
        # leased again since (the controller revokes a fenced lease it hears of): ours is stale.
        if a is not None and msg.token >= a.token:
            self._stop(a, cancel_reason_of_reject(msg.reason))

    def _stop(self, a: Attempt, reason: str) -> None:
        """Stop a running attempt (never reported): its slot is free now, and its runner is told
        through its cancel signal to kill its sandboxes and model calls."""
        self.abandoned.add((a.rollout_id, a.token))
        if self.active.get(a.rollout_id) is a:
            del self.active[a.rollout_id]
        if self._unwait(a):
            self.abandoned.discard((a.rollout_id, a.token))  # never given to a runner
        else:
            self._promote()
        if a.cancel.set(reason):
            self.cancelled[reason] += 1
            log.info("rollout %s attempt %d token %d cancelled: %s", a.rollout_id, a.attempt,
                     a.token, reason)

    def stop_all(self, reason: str) -> None:
        """Stop every running attempt (a `shutdown`, or the owner ending the agent); the
        waiting ones first, so that none is started by a slot freed meanwhile."""
        for a in list(self._waiting) + list(self.active.values()):
            self._stop(a, reason)

    def _refused(self, detail: str) -> None:
        """The controller will not take this agent (its version): say why and stop."""
        log.error("the controller at %s refused this agent (version %s, protocol %d): %s",
                  self.endpoint, self.agent_version, P.PROTOCOL_VERSION, detail)
        if not (self.stopped or self.done):
            self.refused = detail
            self._end(Phase.REFUSED)

    def _newer_policy(self, ref: P.PolicyRef) -> None:
        if self.policy is None or ref.version > self.policy.version:
            self.policy = ref

    def _on_lease(self, msg: P.Lease) -> None:
        self._newer_policy(msg.policy)
        a = self.active.get(msg.rollout_id)
        if (a is not None and a.token == msg.token) or msg.token in self.finished:
            return  # a duplicate delivery of a lease we run or ran
        if self.draining or len(self.active) >= self.slots + self.prefetch:
            self._send(P.Release(rollout_id=msg.rollout_id, attempt=msg.attempt, token=msg.token,
                                 reason="draining" if self.draining else "no free slot"))
            return
        if a is not None:  # a newer lease of the same rollout: the old attempt is stale
            self._stop(a, CANCEL_SUPERSEDED)
        try:
            new = Attempt.from_lease(msg, self.tasks)
        except TaskError as exc:
            log.warning("rollout %s attempt %d infra_error: malformed task: %s", msg.rollout_id,
                        msg.attempt, exc)
            res = AttemptResult("infra_error", None, {}, InfraReason.of(TASK, exc))
            self._send_results([self._record(msg.rollout_id, msg.attempt, msg.token, res)])
            return
        if self.running() >= self.slots:  # a prefetched lease: it waits for a slot
            self.active[msg.rollout_id] = new
            self._waiting.append(new)
            return
        self.active[msg.rollout_id] = new
        self.starting.append((new, self.clock()))
        self._to_run.append(new)

    def running(self) -> int:
        """Attempts given to the runner and not ended (`active` less the waiting ones)."""
        return len(self.active) - len(self._waiting)

    def _promote(self) -> None:
        """Start waiting (prefetched) leases, oldest first, while a slot is free."""
        while self._waiting and self.phase is Phase.SERVING and self.running() < self.slots:
            a = self._waiting.popleft()
            self.starting.append((a, self.clock()))
            self._to_run.append(a)

    def _unwait(self, a: Attempt) -> bool:
        """Take `a` out of the waiting leases; True if it was one (never started)."""
        for i, w in enumerate(self._waiting):
            if w is a:
                del self._waiting[i]
                return True
        return False

    def _hand_back_waiting(self) -> None:
        """A drain: the waiting leases go back to the controller at once, never started (a
        `release`: queued again, not counted as a failure)."""
        while self._waiting:
            a = self._waiting.popleft()
            if self.active.get(a.rollout_id) is a:
                del self.active[a.rollout_id]
            self._send(P.Release(rollout_id=a.rollout_id, attempt=a.attempt, token=a.token,
                                 reason="draining: not started"))

    # -- results ----------------------------------------------------------------------------
    def _record(self, rollout_id: str, attempt: int, token: int, res: AttemptResult) -> P.Result:
        """An attempt ended: count it, remember its token, keep its result until acked."""
        self.completed += 1
        self.finished.add(token)
        self._finished_order.append(token)
        if len(self._finished_order) > FINISHED_TOKENS_KEPT:
            self.finished.discard(self._finished_order.popleft())
        self.infra_errors += res.outcome == "infra_error"
        msg = P.Result(rollout_id=rollout_id, attempt=attempt, token=token, outcome=res.outcome,
                       reward=res.reward, shards=res.shards,
                       infra_reason=None if res.infra_reason is None else str(res.infra_reason),
                       infra_code=res.infra_code,
                       idem=f"{rollout_id}:{attempt}:{token}")
        self.unacked[msg.id] = _Pending(msg, self.clock())
        return msg

    def _send_results(self, msgs: list[P.Result]) -> None:
        """Results as one `result_batch` frame if the controller speaks batches."""
        if not msgs:
            return
        for m in (P.batched(msgs) if self.peer_batches else msgs):
            self._send(m)

    def _resend_unacked(self, now: Optional[float]) -> None:
        """Results not acknowledged: resend (all of them after a welcome, else the old)."""
        out = []
        for p in self.unacked.values():
            if now is None or now - p.sent_at >= self.hb_s * self.liveness:
                p.sent_at = self.clock()
                out.append(p.msg)
        self._send_results(out)

    def _flush_started(self) -> None:
        """`started` for attempts still running STARTED_AFTER_S after their lease came."""
        if not self.starting:
            return
        now, keep = self.clock(), []
        for a, t in self.starting:
            if self.active.get(a.rollout_id) is not a:
                continue  # ended (its result went out) or dropped
            if now - t >= STARTED_AFTER_S:
                self._send(P.Started(rollout_id=a.rollout_id, attempt=a.attempt, token=a.token))
            else:
                keep.append((a, t))
        self.starting = keep

    def _heartbeat(self) -> None:
        """A heartbeat; it names the node's images only when they changed since the controller
        was last told (the set only grows) or once every IMAGES_REFRESH_BEATS: a node that ran
        hundreds of task images would otherwise send tens of KB every few seconds."""
        self._beats_since_images += 1
        images = None
        if len(self.images) != self._images_told or self._beats_since_images >= IMAGES_REFRESH_BEATS:
            images = sorted(self.images)
            self._images_told, self._beats_since_images = len(images), 0
        self._send(P.Heartbeat(node=self.node, slots_free=self.free(), active=self.running(),
                               health=self.health(), images=images, held=self.held()))

    def _drain_over(self, now: float) -> bool:
        """True when the drain is over: `release` what still runs, then `disconnect`."""
        if (self.active or self.unacked) and now < self.drain_by:
            return False
        handed = len(self.active)
        for a in list(self.active.values()):
            self._send(P.Release(rollout_id=a.rollout_id, attempt=a.attempt, token=a.token,
                                 reason="drain deadline"))
            self._stop(a, CANCEL_DRAIN)
        log.info("drained: %d attempts handed back, %d results unacknowledged",
                 handed, len(self.unacked))
        self._send(P.Disconnect(node=self.node, reason="drained"))
        return True
