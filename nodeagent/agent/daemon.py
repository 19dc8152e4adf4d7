"""The node agent: a ZeroMQ DEALER that registers with the controller, takes leases up to its
free slots, runs each rollout attempt in a worker thread and reports results.

One loop does receive, result sending, heartbeats and drain each pass (the ZeroMQ socket is
touched only by this loop; workers hand results back through a deque and wake it through a
pipe; otherwise it sleeps until its next deadline). Rules:
- Liveness (Paranoid Pirate): a controller silent for `liveness` heartbeat intervals means
  a fresh socket and a new registration, retried with exponential backoff (never blocking
  the loop: finished work keeps being collected).
- A `welcome` the agent did not ask for (the controller restarted, or declared it lost)
  makes it register again, listing the rollouts it still holds so their leases are kept.
- A result stays unacknowledged until the controller answers `ack` or `reject`; it is sent
  again after a re-registration and every liveness period (its idempotency key makes that
  safe).
- Drain (SIGTERM, or a `drain` from the controller): no new leases (credit 0), finish what
  runs until the drain deadline, `release` what is still unfinished, then `disconnect`.
- A malformed frame is counted and dropped.
"""
from __future__ import annotations

import argparse
import collections
import logging
import os
import queue
import random
import signal
import sys
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Optional

import psutil
import zmq

from controller.contracts import protocol as P
from nodeagent.agent.attempt import Attempt, AttemptResult, run_attempt

log = logging.getLogger("nodeagent")
AGENT_VERSION = "0.3.0"  # >= protocol.BATCH_AGENT_VERSION: takes `leases` and `acks`
EXIT_REFUSED = 3  # the controller refused this agent at registration (its version)
STARTED_AFTER_S = 0.05  # a rollout that ends sooner never sends `started`

Runner = Callable[[Attempt], AttemptResult]


class _Workers:
    """The slot threads: each runs one attempt at a time, taken in order from one queue; a
    thread is started when more attempts are in flight than there are threads (never more
    than the agent's slots). What the agent needs of a pool, without a future per call."""

    def __init__(self, name: str):
        self.name = name
        self.jobs: queue.SimpleQueue = queue.SimpleQueue()
        self.threads: list[threading.Thread] = []

    def submit(self, fn: Callable[[Attempt], None], arg: Attempt, in_flight: int) -> None:
        self.jobs.put((fn, arg))
        if len(self.threads) < in_flight:
            t = threading.Thread(target=self._run, name=f"{self.name}-{len(self.threads)}",
                                 daemon=True)
            self.threads.append(t)
            t.start()

    def _run(self) -> None:
        while (job := self.jobs.get()) is not None:
            job[0](job[1])

    def shutdown(self) -> None:
        """Queued attempts are dropped (their leases go back by the drain or expire); the
        threads end after the attempt each may still run."""
        try:
            while True:
                self.jobs.get_nowait()
        except queue.Empty:
            pass
        for _ in self.threads:
            self.jobs.put(None)


@dataclass
class _Pending:
    msg: P.Result
    sent_at: float


class NodeAgent:
    def __init__(self, node: str, endpoint: str, deployment: str, slots: int,
                 image_store: str | None = None, runtime=None,
                 heartbeat_interval_s: float = 1.0, liveness: int = 5,
                 clock=time.monotonic, runner: Optional[Runner] = None,
                 drain_deadline_s: float = 60.0, backoff_max_s: float = 30.0,
                 health: Optional[Callable[[], dict]] = None):
        self.node, self.endpoint, self.deployment = node, endpoint, deployment
        self.slots = slots
        self.image_store = Path(image_store) if image_store else None
        self.runtime, self.clock = runtime, clock
        self.runner: Runner = runner or self._run_attempt
        self.hb_s, self.liveness = heartbeat_interval_s, liveness
        self.drain_deadline_s, self.backoff_max_s = drain_deadline_s, backoff_max_s
        self.health = health  # None: nodeagent.agent.health's sampler (the heartbeat's payload)
        self.active: dict[str, Attempt] = {}
        self.abandoned: set[tuple[str, int]] = set()  # (rollout, token) not to report
        self.finished: set[int] = set()  # tokens of attempts run (the last 4096)
        self._finished_order: collections.deque = collections.deque()
        self.unacked: dict[str, _Pending] = {}  # result message id -> pending
        self.done: collections.deque = collections.deque()  # workers append, the loop pops
        # `started` not sent yet, with when the lease came: sent once the attempt has run for
        # STARTED_AFTER_S, skipped if it ended before (its result says it ran: one message less)
        self.starting: list[tuple[Attempt, float]] = []
        self.pool = _Workers(f"{node}-slot")
        self.images: set[str] = set()
        self.draining = False
        self._drain_requested: Optional[float] = None
        self.drain_by: Optional[float] = None
        self._stopped = False
        self.session: Optional[str] = None
        self.peer_batches = False  # the controller sent a batch since we registered
        self.awaiting_welcome = False
        self.bad_frames = 0
        self.completed = 0
        self.infra_errors = 0
        self.registrations = 0
        self.refused: Optional[str] = None  # why the controller refused this agent
        self.ctx = zmq.Context.instance()
        self.sock: Optional[zmq.Socket] = None
        # A worker finished: wake the loop at once. File objects, never closed by hand: a
        # worker still running after the loop ended can never write into a reused fd.
        self._woken = False  # a wake-up byte is in the pipe, not yet read by the loop
        r, w = os.pipe()
        os.set_blocking(r, False)
        os.set_blocking(w, False)
        self._wake_r, self._wake_w = os.fdopen(r, "rb", buffering=0), os.fdopen(w, "wb", buffering=0)

    # Set from other threads or a signal handler: each wakes the loop, which otherwise sleeps
    # until its next deadline (heartbeat, `started`, liveness, drain).
    @property
    def stopped(self) -> bool:
        return self._stopped

    @stopped.setter
    def stopped(self, value: bool) -> None:
        self._stopped = value
        self._wake()

    @property
    def drain_requested(self) -> Optional[float]:
        """A drain asked for from outside the loop (SIGTERM): its deadline_s (signal-safe)."""
        return self._drain_requested

    @drain_requested.setter
    def drain_requested(self, deadline_s: Optional[float]) -> None:
        self._drain_requested = deadline_s
        if deadline_s is not None:
            self._wake()

    def _take_wakeup(self) -> None:
        """Consume the wake-up bytes, THEN clear the flag. (Cleared first, a worker's byte
        written between the two would be consumed here with the flag left set: no worker
        would write again and every later result would wait for the loop's next timeout.)
        Invariant: the flag set means a byte is in the pipe."""
        self._wake_r.read(4096)  # None when empty (non-blocking)
        self._woken = False

    def _wake(self) -> None:
        if self._woken:  # the loop has a wake-up pending and will look at everything
            return
        self._woken = True
        try:
            self._wake_w.write(b"!")  # None when the pipe is full: the loop wakes anyway
        except (OSError, ValueError):
            pass

    # -- socket -----------------------------------------------------------------------------
    def _connect(self) -> None:
        if self.sock is not None:
            self.sock.close(linger=0)
        self.sock = self.ctx.socket(zmq.DEALER)
        self.sock.setsockopt(zmq.IDENTITY, self.node.encode())
        self.sock.setsockopt(zmq.LINGER, 0)
        self.sock.connect(self.endpoint)
        self._register()

    def _register(self) -> None:
        self.registrations += 1
        self.awaiting_welcome = True
        self.peer_batches = False
        held = sorted(set(self.active) | {p.msg.rollout_id for p in self.unacked.values()})
        self._send(P.Register(node=self.node, slots=self.slots, images=sorted(self.images),
                              mem_free_mb=int(psutil.virtual_memory().available / 2**20),
                              agent_version=AGENT_VERSION, held=held))
        self._send(P.Ready(node=self.node, credit=self._free(), draining=self.draining))

    def _send(self, msg) -> None:
        try:
            for frame in P.encode_frames(msg, self.deployment):
                self.sock.send(frame, zmq.NOBLOCK)
        except zmq.Again:  # the pipe is full while the controller is away: liveness handles it
            log.debug("send buffer full, %s not sent", msg.TYPE)

    def _free(self) -> int:
        return 0 if self.draining else max(self.slots - len(self.active), 0)

    # -- loop -------------------------------------------------------------------------------
    def run(self) -> int:
        self._connect()
        last_rx = self.clock()
        # A random phase: agents started together do not all send heartbeats at once.
        last_hb = last_rx - random.uniform(0.0, self.hb_s)
        backoff_s = self.hb_s
        poller, poller_of = None, None
        timeout_ms = 0
        while not self.stopped:
            if poller_of is not self.sock:  # a new socket after a reconnect
                poller, poller_of = zmq.Poller(), self.sock
                poller.register(self.sock, zmq.POLLIN)
                poller.register(self._wake_r.fileno(), zmq.POLLIN)
            ready = dict(poller.poll(timeout=timeout_ms))
            if self._wake_r.fileno() in ready:
                self._take_wakeup()  # `done` is drained below, after this
            if self.sock in ready:
                for _ in range(256):
                    if not self.sock.getsockopt(zmq.EVENTS) & zmq.POLLIN:
                        break  # (cheaper than the exception recv raises on an empty queue)
                    try:
                        data = self.sock.recv(zmq.NOBLOCK)
                    except zmq.Again:
                        break
                    last_rx = self.clock()
                    try:
                        msg = P.decode(data, self.deployment)
                    except P.ProtocolError as exc:
                        refused = P.refusal(data, self.deployment) \
                            if exc.reason == P.WRONG_VERSION else None
                        if refused is not None:  # a controller of another protocol version
                            self._refused(refused)
                            break
                        self.bad_frames += 1
                        log.warning("dropped a malformed frame from the controller: %s", exc)
                        continue
                    if isinstance(msg, P.Welcome):
                        backoff_s = self.hb_s
                    self._handle(msg)
            if self.drain_requested is not None:
                self.drain(self.drain_requested)
            self._flush_results()
            self._flush_started()
            now = self.clock()
            if now - last_hb >= self.hb_s:
                self._heartbeat()
                self._resend_unacked(now)
                last_hb = now
            if now - last_rx > self.hb_s * self.liveness + backoff_s - self.hb_s:
                log.warning("controller silent for %.1fs: reconnecting", now - last_rx)
                backoff_s = min(backoff_s * 2, self.backoff_max_s)
                self._connect()
                last_rx = now
            if self.draining and self._drain_step(now):
                break
            silent_by = last_rx + self.hb_s * (self.liveness - 1) + backoff_s
            timeout_ms = self._poll_timeout_ms(now, min(last_hb + self.hb_s, silent_by))
        self.pool.shutdown()
        self.sock.close(linger=100)
        return EXIT_REFUSED if self.refused is not None else 0

    def _poll_timeout_ms(self, now: float, next_due: float) -> int:
        """How long the loop may sleep: until the first of `next_due`, the next `started`
        and the drain deadline (at most a heartbeat interval, at least 1 ms)."""
        if self.starting:
            next_due = min(next_due, self.starting[0][1] + STARTED_AFTER_S)
        if self.draining and self.drain_by is not None:
            next_due = min(next_due, self.drain_by)
        return max(1, min(int((next_due - now) * 1000) + 1, int(self.hb_s * 1000) + 1))

    def drain(self, deadline_s: Optional[float] = None) -> None:
        """Take no new leases; finish what runs within deadline_s, then hand the rest back."""
        self._drain_requested = None
        if self.draining:
            return
        self.draining = True
        self.drain_by = self.clock() + (deadline_s if deadline_s is not None
                                        else self.drain_deadline_s)
        log.info("draining: %d attempts running, deadline in %.1fs", len(self.active),
                 self.drain_by - self.clock())
        self._send(P.Ready(node=self.node, credit=0, draining=True))

    def _drain_step(self, now: float) -> bool:
        """True when the drain is over (the agent has disconnected)."""
        if self.active and now < self.drain_by:
            return False
        if self.unacked and now < self.drain_by:
            return False
        for a in list(self.active.values()):
            self._send(P.Release(rollout_id=a.rollout_id, attempt=a.attempt, token=a.token,
                                 reason="drain deadline"))
            self.abandoned.add((a.rollout_id, a.token))
        log.info("drained: %d attempts handed back, %d results unacknowledged",
                 len(self.active), len(self.unacked))
        self.active.clear()
        self._send(P.Disconnect(node=self.node, reason="drained"))
        return True

    def _handle(self, msg) -> None:
        if isinstance(msg, P.Lease):
            self._on_lease(msg)
        elif isinstance(msg, P.LeaseBatch):
            self.peer_batches = True
            for ref in msg.acks:
                self.unacked.pop(ref, None)
            for lease in msg.items:
                self._on_lease(lease)
        elif isinstance(msg, P.AckBatch):
            self.peer_batches = True
            for ref in msg.refs:
                self.unacked.pop(ref, None)
        elif isinstance(msg, P.Welcome):
            if self.awaiting_welcome:
                self.awaiting_welcome, self.session = False, msg.session
                self._resend_unacked(None)
            else:  # the controller does not know us (it restarted, or we were lost)
                log.info("unsolicited welcome (session %s): registering again", msg.session)
                self._register()
        elif isinstance(msg, P.Ack):
            self.unacked.pop(msg.ref, None)
        elif isinstance(msg, P.Reject):
            log.info("rejected: %s attempt %d token %d: %s", msg.rollout_id, msg.attempt,
                     msg.token, msg.reason)
            for key, p in list(self.unacked.items()):
                if (p.msg.rollout_id, p.msg.token) == (msg.rollout_id, msg.token):
                    del self.unacked[key]
            a = self.active.get(msg.rollout_id)
            if a is not None and a.token == msg.token:  # cancelled or stale: don't report it
                self.abandoned.add((a.rollout_id, a.token))
                del self.active[a.rollout_id]
        elif isinstance(msg, P.Drain):
            log.info("drain: %s", msg.reason)
            self.drain(msg.deadline_s)
        elif isinstance(msg, P.Shutdown):
            log.info("shutdown: %s", msg.reason)
            self.stopped = True
        elif isinstance(msg, P.Refused):
            self._refused(f"{msg.detail} (controller speaks protocol {msg.protocol_versions}, "
                          f"agents from version {msg.min_agent_version})")
        # a controller heartbeat only proves the controller is alive

    def _refused(self, detail: str) -> None:
        """The controller will not take this agent (its version): say why and stop; run()
        returns EXIT_REFUSED."""
        log.error("the controller at %s refused this agent (version %s, protocol %d): %s",
                  self.endpoint, AGENT_VERSION, P.PROTOCOL_VERSION, detail)
        self.refused = detail
        self.stopped = True

    def _on_lease(self, msg: P.Lease) -> None:
        a = self.active.get(msg.rollout_id)
        if (a is not None and a.token == msg.token) or msg.token in self.finished:
            return  # a duplicate delivery of a lease we run or ran
        if self.draining or len(self.active) >= self.slots:
            self._send(P.Release(rollout_id=msg.rollout_id, attempt=msg.attempt,
                                 token=msg.token, reason="draining" if self.draining
                                 else "no free slot"))
            return
        if a is not None:  # a newer lease of the same rollout: the old attempt is stale
            self.abandoned.add((a.rollout_id, a.token))
        a = Attempt(msg.run_id, msg.run_dir, msg.rollout_id, msg.attempt, msg.token, msg.batch_id,
                    msg.seed, msg.task, msg.policy.version, msg.policy.endpoint, msg.policy.model)
        self.active[msg.rollout_id] = a
        self.starting.append((a, self.clock()))
        self.pool.submit(self._work, a, len(self.active))

    def _run_attempt(self, a: Attempt) -> AttemptResult:
        image = self.image_store / "sha256" / (a.task["image_digest"].split(":", 1)[1] + ".sif")
        self.images.add(a.task["image_digest"])
        return run_attempt(self.runtime, image, self.node, a, self.clock)

    def _work(self, a: Attempt) -> None:
        try:
            res = self.runner(a)
            self.done.append((a, res.outcome, res.reward, res.shards, res.infra_reason))
        except Exception as exc:  # a bug in one attempt must not take the node down
            log.exception("rollout %s crashed", a.rollout_id)
            self.done.append((a, "infra_error", None, {},
                              f"agent_crash: {type(exc).__name__}: {exc}"))
        self._wake()  # the loop drains `done`

    def _send_results(self, msgs: list[P.Result]) -> None:
        """Results as one `result_batch` frame if the controller speaks batches."""
        if not msgs:
            return
        for m in (P.batched(msgs) if self.peer_batches else msgs):
            self._send(m)

    def _flush_results(self) -> None:
        out: list[P.Result] = []
        while self.done:  # only this thread pops: not empty here means popleft succeeds
            a, outcome, reward, shards, infra = self.done.popleft()
            if (a.rollout_id, a.token) in self.abandoned:
                self.abandoned.discard((a.rollout_id, a.token))
                continue
            if self.active.get(a.rollout_id) is a:
                del self.active[a.rollout_id]
            self.completed += 1
            self.finished.add(a.token)
            self._finished_order.append(a.token)
            if len(self._finished_order) > 4096:
                self.finished.discard(self._finished_order.popleft())
            self.infra_errors += outcome == "infra_error"
            msg = P.Result(rollout_id=a.rollout_id, attempt=a.attempt, token=a.token,
                           outcome=outcome, reward=reward, shards=shards, infra_reason=infra,
                           idem=f"{a.rollout_id}:{a.attempt}:{a.token}")
            self.unacked[msg.id] = _Pending(msg, self.clock())
            out.append(msg)
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

    def _resend_unacked(self, now: Optional[float]) -> None:
        """Results not acknowledged: resend (all of them after a welcome, else the old)."""
        out = []
        for p in self.unacked.values():
            if now is None or now - p.sent_at >= self.hb_s * self.liveness:
                p.sent_at = self.clock()
                out.append(p.msg)
        self._send_results(out)

    def _heartbeat(self) -> None:
        if self.health is not None:
            health = self.health()
        else:
            from nodeagent.agent.health import sampler_for   # health figures + JSON-lines stream (docs/operations.md)
            health = sampler_for(self).sample()
        held = sorted(set(self.active) | {p.msg.rollout_id for p in self.unacked.values()})
        self._send(P.Heartbeat(node=self.node, slots_free=self._free(), active=len(self.active),
                               health=health, images=sorted(self.images), held=held))


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="paddock agent", description="Run a node agent.")
    ap.add_argument("--node", default=os.uname().nodename)
    ap.add_argument("--controller", required=True, help="ZeroMQ endpoint, e.g. tcp://10.0.0.1:5555")
    ap.add_argument("--deployment", required=True)
    ap.add_argument("--slots", type=int, default=2)
    ap.add_argument("--image-store", default="")
    ap.add_argument("--subid-base", type=int)
    ap.add_argument("--subid-count", type=int)
    ap.add_argument("--heartbeat-interval-s", type=float, default=1.0)
    ap.add_argument("--drain-deadline-s", type=float, default=60.0,
                    help="on SIGTERM or drain: how long running attempts may take to finish")
    ap.add_argument("--noop-s", type=float, default=None,
                    help="no sandbox: every rollout passes after this many seconds (benchmarks)")
    ap.add_argument("--degrade", action="store_true",
                    help="start even where a sandbox cap (memory, pids, cpu) cannot be enforced by a "
                         "cgroup: fall back to rlimits for it and say so in the log (default: refuse)")
    ap.add_argument("--log-level", default="INFO")
    args = ap.parse_args(argv)
    logging.basicConfig(level=args.log_level.upper(),
                        format=f"%(asctime)s {args.node} %(name)s %(levelname)s %(message)s")
    runtime, runner = None, None
    if args.noop_s is None and not args.image_store:
        ap.error("--image-store is required (unless --noop-s)")
    if args.noop_s is not None:
        runner = noop_runner(args.noop_s)
    else:
        from nodeagent.sandbox.runtime import SandboxRuntime
        subids = (args.subid_base, args.subid_count) if args.subid_base is not None else None
        from nodeagent.sandbox.runtime import SandboxError
        try:
            runtime = SandboxRuntime(subids=subids, degrade=args.degrade).start()
        except SandboxError as exc:
            log.error("cannot start the sandbox runtime: %s", exc)
            return 2
        log.info("sandbox caps: %s", runtime.caps_report())
    agent = NodeAgent(args.node, args.controller, args.deployment, args.slots, args.image_store, runtime,
                      heartbeat_interval_s=args.heartbeat_interval_s,
                      drain_deadline_s=args.drain_deadline_s, runner=runner)
    # The handler only sets a flag: the loop drains (a signal handler must not touch the socket).
    signal.signal(signal.SIGTERM, lambda *_: setattr(agent, "drain_requested", args.drain_deadline_s))
    try:
        rc = agent.run()
    finally:
        if runtime is not None:
            try:
                runtime.close()
            except Exception:  # noqa: BLE001 - attempts handed back may still hold sandboxes
                log.exception("closing the sandbox runtime failed")
    agent.ctx.term()  # delivers the last frames (release, disconnect) within their linger
    if threading.active_count() > 1:
        # Attempts handed back at the drain deadline may still run in worker threads; their
        # leases are back in the queue, so the agent leaves now rather than wait for them.
        logging.shutdown()
        os._exit(rc)
    return rc


def noop_runner(delay_s: float = 0.0) -> Runner:
    """A runner without sandboxes: every attempt passes (reward 1) after delay_s."""
    def run(a: Attempt) -> AttemptResult:
        if delay_s > 0:
            time.sleep(delay_s)  # stands for the rollout's work
        return AttemptResult("pass", 1.0, {}, None)
    return run


if __name__ == "__main__":
    sys.exit(main())
