"""The controller process: the ZeroMQ ROUTER loop around a `BrokerCore`, the automatic
compaction hook, and `run`, the daemon's entry point (called by controller/cli/controller.py
with plain arguments and one `BrokerConfig`).

`Controller` owns the socket: each pass it reads up to `max_frames_per_pass` frames, hands
them all to the core inside ONE queue transaction (group commit), commits, and only then
sends the replies, so nothing is acknowledged before it is durable. The socket is a CURVE
server (controller/broker/curve.py) with the run's keys (`RUN/controller.key`, made at the
first start, 0600; the run directory is made 0700): only peers holding that file get an
answer. `insecure=True` (`paddock controller --insecure`, for benchmarks) serves in plain text.

Start-up is short so that a restarted controller commits again within a second: the daemon
(`run`) opens the catalog in a thread (`catalog_in_background`: pyarrow's import and the
commit files' read, most of a start) while the loop already serves; keys committed meanwhile
are held back by the ledger and handed over once the catalog is reconciled with the queue.

Must not import: sqlite3 (everything goes through controller.store.queue), controller.cli,
nodeagent.
"""
from __future__ import annotations

import logging
import subprocess
import sys
import threading
import time
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from typing import Callable, Optional

import zmq

from controller.broker import gcpolicy
from controller.broker.config import BrokerConfig, with_knobs
from controller.broker.core import MULTIPART, BrokerCore
from controller.broker.curve import Gate, ensure_run_keys
from controller.contracts import protocol as P
from controller.ondisk.fileio import atomic_write
from controller.ondisk.keys import key_file_of, private_dir
from controller.store.catalog import Catalog
from controller.store.faults import AFTER_REPLY, BEFORE_REPLY, FaultHook, no_fault
from controller.store.queue import RolloutQueue
from controller.store.taskindex import TaskIndex, open_index
from controller.taskbank.curriculum import Curriculum

log = logging.getLogger("controller")

_NOBLOCK = int(zmq.NOBLOCK)
_EVENTS, _POLLIN = int(zmq.EVENTS), int(zmq.POLLIN)
_SNDMORE_NOBLOCK = int(zmq.NOBLOCK | zmq.SNDMORE)


class Controller:
    """The controller process: a ROUTER socket around a BrokerCore."""

    def __init__(self, bind: str, deployment: str, run_dir: str, run_id: str,
                 tasks: dict[str, dict], db_path: str, *, config: BrokerConfig = BrokerConfig(),
                 clock=time.monotonic, catalog: bool = True,
                 curriculum: Optional[Curriculum] = None, fault: FaultHook = no_fault,
                 key_file: Optional[str] = None, insecure: bool = False,
                 catalog_in_background: bool = False, **knobs):
        """`knobs` override single fields of `config` (`heartbeat_interval_s=...`,
        `queue=QueueConfig(...)`); `fault` is called at the commit path's fault points
        (controller/store/faults.py; tests kill the process there). `key_file` (default
        RUN_DIR/controller.key, made if absent) holds the run's CURVE keys; a key file with
        the wrong owner or mode raises KeyFileError before anything is opened.
        `catalog_in_background`: open the catalog in a thread, attached by the first pass
        after it is open (`self.catalog` is None until then); else here."""
        self.config = config = with_knobs(config, knobs)
        private_dir(run_dir)
        self.key_file = None if insecure else str(key_file or key_file_of(run_dir))
        keys = None if insecure else ensure_run_keys(self.key_file)
        self.fault = fault
        self.queue = RolloutQueue(db_path, config=config.queue, fault=fault)
        self.catalog: Optional[Catalog] = None
        self._opening: Optional[Future] = None  # the catalog, being opened in a thread
        self.core = BrokerCore(self.queue, tasks, deployment, run_id, run_dir, config=config,
                               clock=clock, catalog=None, curriculum=curriculum)
        if catalog and catalog_in_background:
            self.core.ledger.expect_catalog()
            pool = ThreadPoolExecutor(1, thread_name_prefix="catalog-open")
            self._opening = pool.submit(Catalog, run_dir, fault=fault)
            pool.shutdown(wait=False)  # the thread ends with its one task
        elif catalog:
            self._attach(Catalog(run_dir, fault=fault))
        self.max_batch = config.max_frames_per_pass
        self.poll_timeout_ms = config.poll_timeout_ms
        self.deployment = deployment
        self.ctx = zmq.Context()  # its own: the ZAP endpoint is one per context
        self.sock = self.ctx.socket(zmq.ROUTER)
        self.gate = None if keys is None else Gate(self.ctx, self.sock, keys, self.core.counters)
        self.sock.setsockopt(zmq.ROUTER_MANDATORY, 1)
        self.sock.setsockopt(zmq.ROUTER_HANDOVER, 1)  # a reconnecting agent takes its name
        self.sock.setsockopt(zmq.LINGER, 0)
        self.sock.setsockopt(zmq.MAXMSGSIZE, 4 * P.MAX_FRAME_BYTES)  # bigger: peer cut off
        self.sock.bind(bind)
        self.endpoint = self.sock.getsockopt(zmq.LAST_ENDPOINT).decode()
        self._poller = zmq.Poller()
        for s in (self.sock, *(self.gate.sockets() if self.gate else ())):
            self._poller.register(s, zmq.POLLIN)
        self._thread = threading.get_ident()
        self._snapshot = self.core.snapshot()
        self.hooks: list[Callable[["Controller"], None]] = []  # run once per sweep interval

    def _attach(self, catalog: Catalog) -> None:
        """The catalog, open: reconciled with the queue; the anomalies of the last
        incarnation counted for `status`."""
        ahead, behind = self.core.ledger.attach(catalog)
        self.catalog = self.core.catalog = catalog
        if ahead or behind:
            self.core.counters["catalog_ahead_at_start"] += len(ahead)
            self.core.counters["catalog_behind_at_start"] += len(behind)

    def wait_catalog(self) -> None:
        """Attach the catalog being opened in the background, waiting for it (a catalog
        that cannot be read raises its CatalogError here)."""
        if self._opening is not None:
            opening, self._opening = self._opening, None
            self._attach(opening.result())

    @property
    def stopped(self) -> bool:
        return self.core.stopped

    def snapshot(self) -> dict:
        """Status as a dict. From the loop's thread: fresh; from another: as of the last
        sweep (the queue's connection belongs to the loop)."""
        if threading.get_ident() == self._thread:
            self._snapshot = self.core.snapshot()
        return self._snapshot

    def serve(self) -> None:
        self._thread = threading.get_ident()
        last_hook = time.monotonic()
        while not self.core.stopped:
            frames = []
            if self._poll():
                # EVENTS before each read: cheaper than the exception of an empty recv
                while len(frames) < self.max_batch and self.sock.getsockopt(_EVENTS) & _POLLIN:
                    try:
                        frames.append(self.sock.recv_multipart(_NOBLOCK))
                    except zmq.Again:
                        break
            self.step(frames)
            if time.monotonic() - last_hook >= self.core.sweep_interval_s:
                last_hook = time.monotonic()
                self._snapshot = self.core.snapshot()
                for hook in self.hooks:
                    hook(self)
        self.wait_catalog()
        if self.catalog is not None:
            self.catalog.flush()
        self.close()

    def close(self) -> None:
        """Close the sockets, the context and the queue (serve does it when it returns)."""
        if self._opening is not None:  # never attached: let the thread finish first
            self._opening.exception()
        if self.gate is not None:
            self.gate.close()
        self.sock.close(linger=0)
        self.ctx.term()
        self.queue.close()

    def _poll(self) -> bool:
        """Wait up to poll_timeout_ms for a frame; serve the gate (ZAP requests, failed
        handshakes) on the way. True when the ROUTER has frames."""
        if self.gate is None:
            return bool(self.sock.poll(timeout=self.poll_timeout_ms))
        ready = dict(self._poller.poll(self.poll_timeout_ms))
        if len(ready) > (self.sock in ready):
            self.gate.service()
        return self.sock in ready

    def step(self, frames: list[list[bytes]]) -> None:
        """One pass over the frames read: decide, COMMIT (group commit; the catalog is
        written from the committed state, by the queue's on-commit hooks), then reply. So
        nothing is acknowledged or shown as committed before the queue has it on disk."""
        if self._opening is not None and self._opening.done():
            self.wait_catalog()
        with self.queue.batch():
            for parts in frames:
                if len(parts) != 2:
                    self.core.drop(MULTIPART, f"{len(parts)} frames")
                    continue
                self.core.receive(parts[0], parts[1])
            self.core.tick()
        self.fault(BEFORE_REPLY)
        self._flush_outbox()
        self.fault(AFTER_REPLY)

    def _flush_outbox(self) -> None:
        for identity, msg in self.core.take_outbox():
            try:
                for frame in P.encode_frames(msg, self.deployment):
                    # send_multipart's enum flag arithmetic costs more than the send itself
                    self.sock.send(identity, _SNDMORE_NOBLOCK)
                    self.sock.send(frame, _NOBLOCK)
            except zmq.ZMQError as exc:  # peer gone (ROUTER_MANDATORY) or its queue full
                self.core.counters["send_failed"] += 1
                log.debug("cannot send %s to %r: %s", msg.TYPE, identity, exc)


COMPACT_TERM_WAIT_S = 5.0   # a compaction stopped at shutdown: SIGTERM, then SIGKILL after this


class AutoCompact:
    """A Controller hook: once `every` rollouts have committed since the last compaction, merge
    the run's small shards in a separate, niced process (`paddock compact`, crash-safe, one at
    a time), so a long run's store stays fast to query. `wait()` at shutdown lets a running
    compaction finish, for up to `wait_s`, then stops it: the controller never leaves one
    running behind it (the run's assembler, controller/farm/assemble.py, waits that long)."""

    def __init__(self, run_dir: str, every: int, wait_s: float = BrokerConfig.compact_wait_s):
        self.run_dir, self.every, self.wait_s = run_dir, every, wait_s
        self.proc: Optional[subprocess.Popen] = None
        self.last = 0
        self.runs = 0

    def __call__(self, ctl: "Controller") -> None:
        if self.proc is not None and self.proc.poll() is not None:
            log.info("compaction exited with %s (see logs/compact.log)", self.proc.returncode)
            self.proc = None
        committed = ctl.core.counters["committed"]
        if self.proc is None and committed - self.last >= self.every:
            self.last = committed
            self.runs += 1
            logs = Path(self.run_dir) / "logs"
            logs.mkdir(parents=True, exist_ok=True)
            with open(logs / "compact.log", "ab") as out:
                # nice(1), not a preexec_fn: the controller has threads (metrics), and code run
                # between fork and exec in a threaded process may deadlock
                self.proc = subprocess.Popen(
                    ["nice", "-n", "10", sys.executable, "-m", "controller.cli", "compact",
                     "--run", self.run_dir],
                    stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)

    def wait(self) -> None:
        if self.proc is None:
            return
        try:
            self.proc.wait(timeout=self.wait_s)
        except subprocess.TimeoutExpired:      # it is crash-safe: the next one finishes it
            log.warning("compaction still running after %.0fs at shutdown: stopping it (the "
                        "next compaction finishes it)", self.wait_s)
            self.proc.terminate()
            try:
                self.proc.wait(timeout=COMPACT_TERM_WAIT_S)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()


STOPPED_SUFFIX = ".stopped"  # `<endpoint_file>.stopped`: the controller stopped on purpose


def run(config: BrokerConfig, *, bind: str, deployment: str, run_dir: Path, tasks: dict,
        endpoint_file: str, db_path: Optional[str] = None,
        curriculum_db: Optional[str] = None, key_file: Optional[str] = None,
        insecure: bool = False) -> int:
    """Serve until a `shutdown`: the queue at `db_path` (default RUN_DIR/controller.db), the
    run's catalog, the bound endpoint published (atomically) in `endpoint_file` -- and the
    metrics URL in `<endpoint_file>.metrics` first, when `config.metrics_port` is set. On a
    clean stop `<endpoint_file>.stopped` is written (removed again at the next start). The
    run directory is made 0700 and the keys checked (or made) before anything else."""
    private_dir(run_dir)
    if not insecure:
        ensure_run_keys(key_file or key_file_of(run_dir))  # KeyFileError before the queue opens
    else:
        log.warning("--insecure: the control plane is NOT authenticated or encrypted; anyone "
                    "who can reach %s can drive this controller", bind)
    curriculum = Curriculum(curriculum_db, tasks.ids if isinstance(tasks, TaskIndex)
                            else {d["task_id"] for d in tasks.values()}) if curriculum_db else None
    ctl = Controller(bind, deployment, str(run_dir), run_dir.name, tasks,
                     db_path or str(run_dir / "controller.db"), config=config,
                     curriculum=curriculum, key_file=key_file, insecure=insecure,
                     catalog_in_background=True)
    if config.metrics_port is not None:   # published before the endpoint: a reader of one finds both
        # prometheus_client is loaded only when metrics are served
        from controller.broker.metrics import serve_metrics
        server, _ = serve_metrics(ctl.snapshot, config.metrics_port, config.metrics_addr)
        atomic_write(endpoint_file + ".metrics",
                     f"http://{config.metrics_addr}:{server.server_address[1]}/metrics",
                     fsync=False)
    stopped = Path(endpoint_file + STOPPED_SUFFIX)
    stopped.unlink(missing_ok=True)
    atomic_write(endpoint_file, ctl.endpoint, fsync=False)
    compactor = AutoCompact(str(run_dir), config.compact_every, config.compact_wait_s) \
        if config.compact_every > 0 else None
    if compactor is not None:
        ctl.hooks.append(compactor)
    log.info("controller listening on %s (session %s)", ctl.endpoint, ctl.core.session)
    gcpolicy.settle()   # the start-up state (task set, core) is not walked by the collector again
    ctl.serve()
    # A clean stop is said next to the endpoint: a peer that never heard the `shutdown`
    # (an agent that had not registered yet) finds it there instead of retrying for ever.
    atomic_write(str(stopped), f"{ctl.endpoint}\n", fsync=False)
    if compactor is not None:
        compactor.wait()
    return 0


def load_tasks(path: str | Path) -> TaskIndex:
    """The tasks file: task ref -> the task's lease form (JSON), from its index on disk
    (controller/store/taskindex.py: built beside the file at the first start, then opened
    without reading an entry)."""
    return open_index(path)
