"""The node agent daemon: the ZeroMQ DEALER socket, the slot threads and the worker plumbing
around `AgentCore` (nodeagent/agent/core.py), which holds every protocol rule.

One loop does receive, result collection, timers and drain each pass (the ZeroMQ socket is
touched only by this loop; workers hand results back through a deque and wake it through a
pipe; otherwise it sleeps until the core's next deadline). Each pass: frames in -> the core;
finished attempts -> the core; `core.tick()`; then the core's outbox goes out (a `RECONNECT`
in it: a fresh socket, Paranoid Pirate) and its new attempts go to the slot threads.

The socket is a CURVE client with the run's keys (`keys=`, read from `RUN/controller.key` by
the command line; controller/ondisk/keys.py); only `insecure=True` connects in plain text.
With an `endpoint_file`, `EndpointFile` is the core's watch: while the controller is silent it
looks at the file's (inode, mtime) each heartbeat, and a monitor of the socket tells the core
the moment the controller's connection drops (`AgentCore.connection_lost`: a killed
controller's TCP session ends at once), from when on it looks every few tens of
milliseconds: a controller restarted on any port is found within about 0.1 s of writing the
file (two heartbeats when its host vanished without closing the connection), and
`<endpoint_file>.stopped` newer than the endpoint ends the agent.

`serve(...)` is the entry point (`paddock agent`, controller/cli/agent.py, builds its
`AgentConfig` and `RuntimeConfig` from the flags): it starts the sandbox runtime (or a no-op
runner), runs the agent, and turns SIGTERM into a drain. Must not import: controller.* other
than controller.contracts and controller.ondisk (not controller.cli).
"""
from __future__ import annotations

import collections
import logging
import os
import queue
import signal
import threading
import time
from pathlib import Path
from typing import Callable, Optional

import psutil
import zmq

from controller.contracts import protocol as P
from controller.contracts.states import AGENT_CRASH, CANCEL_SHUTDOWN, TASK, InfraReason
from controller.ondisk.keys import RunKeys
from nodeagent.agent.attempt import run_attempt
from nodeagent.agent.config import AgentConfig, with_knobs
from nodeagent.agent.core import RECONNECT, AgentCore, Attempt, AttemptResult, EndpointNews
from nodeagent.agent.health import sampler_for
from nodeagent.agent.version import AGENT_VERSION
from nodeagent.agent.warmpools import default_pool_size, start_warm_pools
from nodeagent.sandbox.apptainer import ApptainerRuntime
from nodeagent.sandbox.config import RuntimeConfig
from nodeagent.sandbox.runtime import SandboxError, SandboxRuntime

log = logging.getLogger("nodeagent")
# plain ints: pyzmq's enum flags cost an enum operation per use (twice per frame in the loop)
_NOBLOCK, _EVENTS, _POLLIN = int(zmq.NOBLOCK), int(zmq.EVENTS), int(zmq.POLLIN)
EXIT_REFUSED = 3  # the controller refused this agent at registration (its version)
EXIT_NO_RUNTIME = 2  # the sandbox runtime could not start
EXIT_GAVE_UP = 4  # no controller welcomed this agent within give_up_s
STOPPED_SUFFIX = ".stopped"  # `<endpoint_file>.stopped`: the controller stopped on purpose

Runner = Callable[[Attempt], AttemptResult]


class EndpointFile:
    """The controller's endpoint file as the core's watch: `read()` takes the endpoint and
    notes the file's (inode, mtime); a call returns news only when the file was written since
    (a controller started) or `<file>.stopped` is newer than it (stopped on purpose)."""

    def __init__(self, path: str | os.PathLike):
        self.path = Path(path)
        self.stopped_path = self.path.with_name(self.path.name + STOPPED_SUFFIX)
        self.stamp: Optional[tuple[int, int]] = None

    def read(self) -> Optional[str]:
        try:
            st = os.stat(self.path)
            text = self.path.read_text().strip()
        except OSError:  # not written yet, or being replaced
            return None
        self.stamp = (st.st_ino, st.st_mtime_ns)
        return text or None

    def __call__(self) -> Optional[EndpointNews]:
        st, stopped = _stat(self.path), _stat(self.stopped_path)
        if st is None:
            return None
        if stopped is not None and stopped.st_mtime_ns >= st.st_mtime_ns:
            return EndpointNews(stopped=True)
        if (st.st_ino, st.st_mtime_ns) == self.stamp:
            return None
        endpoint = self.read()
        return EndpointNews(endpoint=endpoint) if endpoint else None


def _stat(path: Path) -> Optional[os.stat_result]:
    try:
        return os.stat(path)
    except OSError:
        return None


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

    def busy(self, join_s: float) -> bool:
        """After `shutdown`: is a slot thread still running an attempt (once the idle ones,
        which end at once, have had `join_s` in all to finish)?"""
        deadline = time.monotonic() + join_s
        for t in self.threads:
            t.join(max(0.0, deadline - time.monotonic()))
        return any(t.is_alive() for t in self.threads)


class NodeAgent:
    def __init__(self, node: str, endpoint: str, deployment: str, slots: Optional[int] = None,
                 image_store: str | None = None, runtime=None, *, config: AgentConfig = AgentConfig(),
                 clock=time.monotonic, runner: Optional[Runner] = None,
                 health: Optional[Callable[[], dict]] = None, keys: Optional[RunKeys] = None,
                 insecure: bool = False, endpoint_file: Optional[str] = None, **knobs):
        """`config`: the agent's knobs (nodeagent/agent/config.py); `slots`, `image_store` (when
        given) and keyword knobs (`heartbeat_interval_s=...`) replace single fields of it (a bad
        knob raises ValueError naming it, a bad run budget default BudgetError naming it).
        `keys`: the run's CURVE keys (required unless `insecure`); `endpoint_file`: watched
        while the controller is silent."""
        given = {k: v for k, v in (("slots", slots), ("image_store", image_store)) if v is not None}
        self.config = config = with_knobs(config, {**knobs, **given})
        self.run_budgets = dict(config.run_budgets)
        self.node, self.endpoint, self.deployment = node, endpoint, deployment
        self.keys, self.insecure = keys, insecure
        self.endpoint_watch = EndpointFile(endpoint_file) if endpoint_file else None
        if self.endpoint_watch is not None:
            self.endpoint_watch.read()  # the version of the file `endpoint` came from
        self.image_store = Path(config.image_store) if config.image_store else None
        self.runtime, self.clock = runtime, clock
        self.runner: Runner = runner or self._run_attempt
        # None: nodeagent.agent.health's sampler (the heartbeat's payload, JSON lines)
        self.health = health or (lambda: sampler_for(self).sample())
        self.core = AgentCore(node, config.slots, deployment, config=config, agent_version=AGENT_VERSION,
                              clock=clock, health=self.health, mem_free_mb=_mem_free_mb,
                              endpoint=endpoint, watch=self.endpoint_watch)
        self.done: collections.deque = collections.deque()  # workers append, the loop pops
        self.pool = _Workers(f"{node}-slot")
        self._drain_requested: Optional[float] = None
        self._stop_requested = False  # the owner's stop (any thread); the loop tells the core
        self.ctx = zmq.Context.instance()
        self.sock: Optional[zmq.Socket] = None
        self.monitor: Optional[zmq.Socket] = None  # the socket's disconnects (with a watch)
        # A worker finished: wake the loop at once. File objects, never closed by hand: a
        # worker still running after the loop ended can never write into a reused fd.
        self._woken = False  # a wake-up byte is in the pipe, not yet read by the loop
        r, w = os.pipe()
        os.set_blocking(r, False)
        os.set_blocking(w, False)
        self._wake_r, self._wake_w = os.fdopen(r, "rb", buffering=0), os.fdopen(w, "wb", buffering=0)

    # The core's state, as the health sampler and the tests read it.
    slots = property(lambda self: self.core.slots)
    active = property(lambda self: self.core.active)
    images = property(lambda self: self.core.images)
    unacked = property(lambda self: self.core.unacked)
    refused = property(lambda self: self.core.refused)
    session = property(lambda self: self.core.session)
    bad_frames = property(lambda self: self.core.bad_frames)
    infra_errors = property(lambda self: self.core.infra_errors)
    registrations = property(lambda self: self.core.registrations)

    @property
    def completed(self) -> int:
        return self.core.completed

    @completed.setter
    def completed(self, n: int) -> None:
        self.core.completed = n

    @property
    def draining(self) -> bool:
        return self.core.draining

    @draining.setter
    def draining(self, value: bool) -> None:
        assert value, "a drain cannot be undone"
        self.core.drain()

    # Set from other threads or a signal handler: each wakes the loop, which otherwise sleeps
    # until its next deadline (heartbeat, `started`, liveness, drain).
    @property
    def stopped(self) -> bool:
        return self._stop_requested or self.core.stopped

    @stopped.setter
    def stopped(self, value: bool) -> None:
        assert value, "a stop cannot be undone"
        self._stop_requested = True  # the core's phase changes on the loop's thread only
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
    def _new_socket(self) -> None:
        if self.sock is not None:
            self._close_monitor()
            self.sock.close(linger=0)
        if self.keys is None and not self.insecure:
            raise ValueError("NodeAgent: give keys= (the run's controller.key) or insecure=True")
        self.sock = self.ctx.socket(zmq.DEALER)
        self.sock.setsockopt(zmq.IDENTITY, self.node.encode())
        self.sock.setsockopt(zmq.LINGER, 0)
        if self.keys is not None:  # before connect: the handshake uses them
            self.sock.setsockopt(zmq.CURVE_SERVERKEY, self.keys.server_public.encode())
            self.sock.setsockopt(zmq.CURVE_PUBLICKEY, self.keys.client_public.encode())
            self.sock.setsockopt(zmq.CURVE_SECRETKEY, self.keys.client_secret.encode())
        self.endpoint = self.core.endpoint  # where the core says the controller is now
        if self.endpoint_watch is not None:
            self.monitor = self.sock.get_monitor_socket(zmq.EVENT_DISCONNECTED)
        self.sock.connect(self.endpoint)

    def _close_monitor(self) -> None:
        if self.monitor is not None:
            self.sock.disable_monitor()
            self.monitor.close(linger=0)
            self.monitor = None

    def _disconnects(self) -> None:
        """The monitor's events: a dropped connection tells the core to look for the
        controller (its endpoint file) now."""
        lost = False
        while True:
            try:
                self.monitor.recv_multipart(zmq.NOBLOCK)  # (event, endpoint): only DISCONNECTED
            except zmq.Again:
                break
            lost = True
        if lost:
            log.info("the connection to the controller at %s dropped", self.endpoint)
            self.core.connection_lost()

    def _flush(self) -> None:
        """Carry out the core's decisions: send its outbox (a fresh socket where it says
        RECONNECT), start its new attempts on the slot threads."""
        for msg in self.core.take_outbox():
            if msg is RECONNECT:
                self._new_socket()
                continue
            try:
                for frame in P.encode_frames(msg, self.deployment):
                    self.sock.send(frame, _NOBLOCK)
            except zmq.Again:  # the pipe is full while the controller is away: liveness handles it
                log.debug("send buffer full, %s not sent", msg.TYPE)
        for a in self.core.take_attempts():
            self.pool.submit(self._work, a, self.core.running())  # not the waiting (prefetched)

    def _receive(self) -> None:
        """Up to 256 frames waiting on the socket, into the core (called once the poll said
        one is: the first is read without asking the socket again)."""
        sock = self.sock
        for _ in range(256):
            try:
                data = sock.recv(_NOBLOCK)
            except zmq.Again:
                break
            if not self.core.receive_data(data):
                break
            if not sock.getsockopt(_EVENTS) & _POLLIN:
                break  # (cheaper than the exception recv raises on an empty queue)

    # -- loop -------------------------------------------------------------------------------
    def _last_health(self) -> None:
        """One health sample at the end: the node's last state is on record even for a run
        shorter than one heartbeat (health is a report; its failure never fails the stop)."""
        try:
            self.health()
        except Exception as exc:  # noqa: BLE001 - a report, not the agent's work
            log.warning("final health sample failed: %s", exc)

    def run(self) -> int:
        self._new_socket()
        self.core.start()
        self._flush()
        poller, poller_of = None, None
        timeout_ms = 0
        while not self.stopped:
            if poller_of is not self.sock:  # a new socket after a reconnect
                poller, poller_of = zmq.Poller(), self.sock
                poller.register(self.sock, zmq.POLLIN)
                poller.register(self._wake_r.fileno(), zmq.POLLIN)
                if self.monitor is not None:
                    poller.register(self.monitor, zmq.POLLIN)
            ready = dict(poller.poll(timeout=timeout_ms))
            if self._wake_r.fileno() in ready:
                self._take_wakeup()  # `done` is drained below, after this
            if self.monitor is not None and self.monitor in ready:
                self._disconnects()
            if self.sock in ready:
                self._receive()
            if self.drain_requested is not None:
                self.drain(self.drain_requested)
            finished = []
            while self.done:  # only this thread pops: not empty here means popleft succeeds
                finished.append(self.done.popleft())
            self.core.attempts_done(finished)
            self.core.tick()
            self._flush()
            if self.core.done:
                break
            timeout_ms = self.core.poll_timeout_ms()
        if not self.core.done:
            self.core.stop()               # the owner's stop, now in the core (a first end stays)
        self.core.stop_all(CANCEL_SHUTDOWN)  # an agent that ends kills what still runs at once
        self.pool.shutdown()
        self._last_health()
        self._close_monitor()
        self.sock.close(linger=100)
        if self.refused is not None:
            return EXIT_REFUSED
        return EXIT_GAVE_UP if self.core.gave_up else 0

    def drain(self, deadline_s: Optional[float] = None) -> None:
        """Take no new leases; finish what runs within deadline_s, then hand the rest back."""
        self._drain_requested = None
        self.core.drain(deadline_s)

    # -- attempts (worker threads) ----------------------------------------------------------
    def _run_attempt(self, a: Attempt) -> AttemptResult:
        digest = a.task.image_digest
        if not digest:
            return AttemptResult("infra_error", None, {},
                                 InfraReason.of(TASK, "the lease task has no 'image_digest'"))
        image = self.image_store / "sha256" / (digest.split(":", 1)[1] + ".sif")
        self.core.images.add(digest)
        return run_attempt(self.runtime, image, self.node, a, self.clock, current_policy=lambda: self.core.policy,
                           run_budgets=self.run_budgets)

    def _work(self, a: Attempt) -> None:
        try:
            res = self.runner(a)
        except Exception as exc:  # a bug in one attempt must not take the node down
            log.exception("rollout %s crashed", a.rollout_id)
            res = AttemptResult("infra_error", None, {},
                                InfraReason.of(AGENT_CRASH, f"{type(exc).__name__}: {exc}"))
        self.done.append((a, res))
        self._wake()  # the loop drains `done`


def _mem_free_mb() -> int:
    return int(psutil.virtual_memory().available / 2**20)


def serve(node: str, controller: str, deployment: str, config: AgentConfig = AgentConfig(), *,
          runtime_config: RuntimeConfig = RuntimeConfig(), keys: Optional[RunKeys] = None,
          insecure: bool = False, endpoint_file: Optional[str] = None) -> int:
    """Run a node agent until it drains, is shut down, refused or gives up; return its exit
    status. `config` holds the agent's knobs (nodeagent/agent/config.py). Without
    `config.noop_s`, attempts run in sandboxes of images from `config.image_store` (required),
    made by the `config.sandbox` backend: "native" (SandboxRuntime, with `runtime_config`) or
    "apptainer" (nodeagent.sandbox.apptainer, for sites whose policy requires it); at most
    `config.warm_pool` of them wait ready (nodeagent.agent.warmpools; None: two per slot; 0:
    off). `keys` (unless `insecure`), `endpoint_file`: see NodeAgent."""
    if keys is None and not insecure:
        raise ValueError("serve: the run's keys are required (unless insecure)")
    runtime, runner = None, None
    if config.noop_s is not None:
        runner = noop_runner(config.noop_s)
    else:
        if not config.image_store:
            raise ValueError("agent.image_store is required (unless agent.noop_s)")
        try:
            runtime = (ApptainerRuntime().start() if config.sandbox == "apptainer"
                       else SandboxRuntime(runtime_config).start())
        except SandboxError as exc:
            log.error("cannot start the %s sandbox runtime: %s", config.sandbox, exc)
            return EXIT_NO_RUNTIME
        if hasattr(runtime, "caps_report"):
            log.info("sandbox caps: %s", runtime.caps_report())
    agent = NodeAgent(node, controller, deployment, runtime=runtime, config=config, runner=runner,
                      keys=keys, insecure=insecure, endpoint_file=endpoint_file)
    pooled = default_pool_size(config.slots) if config.warm_pool is None else config.warm_pool
    if runtime is not None and pooled > 0:
        start_warm_pools(runtime, agent, pooled)
    # The handler only sets a flag: the loop drains (a signal handler must not touch the socket).
    signal.signal(signal.SIGTERM, lambda *_: setattr(agent, "drain_requested", config.drain_deadline_s))
    try:
        rc = agent.run()
    finally:
        if runtime is not None:
            try:
                runtime.close()
            except Exception:  # noqa: BLE001 - attempts handed back may still hold sandboxes
                log.exception("closing the sandbox runtime failed")
    agent.ctx.term()  # delivers the last frames (release, disconnect) within their linger
    if agent.pool.busy(join_s=1.0):
        # Attempts handed back at the drain deadline may still run in slot threads; their
        # leases are back in the queue, so the agent leaves now rather than wait for them.
        # (Only the slot threads count: daemon helpers such as the memory monitor or the
        # gateway's watchdog end with the process and must not turn a clean exit into this.)
        logging.shutdown()
        os._exit(rc)
    return rc


def noop_runner(delay_s: float = 0.0) -> Runner:
    """A runner without sandboxes: every attempt passes (reward 1) after delay_s."""
    passed = AttemptResult("pass", 1.0, {}, None)  # frozen, its shards never written: one for all

    def run(a: Attempt) -> AttemptResult:
        if delay_s > 0:
            time.sleep(delay_s)  # stands for the rollout's work
        return passed
    return run
