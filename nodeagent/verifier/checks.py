"""Isolated host-side check runner, client side: every check in its own process, killed at a deadline.

A `CheckRunner` starts one long-lived server process (`nodeagent.verifier.checkserver`, an
internal entry point) that imports the checker modules once and keeps pre-forked spares. The
server hands the client each spare as two descriptors: the write end of its request pipe and
the client's end of its reply socket (SOCK_SEQPACKET). A check is a `start` notice to the
server (which owns the deadline) and one JSON request written straight to a spare; the calling
thread then waits on that spare's reply socket, where the spare itself, or the server
(timeout, crash, command), writes exactly one record. Checks run concurrently: `run` blocks
its thread, `submit` returns a Future. A spare that died idle is skipped (EPIPE); a server
that is gone, or silent `REPLY_MARGIN_S` past a deadline, is `CheckInfraError`.

Outcomes (`CheckResult.outcome`): `ok` (the function returned / the command ran; see `value`
and `exit_code`), `error` (the function raised: detail says what), `timeout` (killed at the
deadline), `crashed` (died without a result, e.g. a signal or an rlimit), `output_cap` (wrote
more than its output cap: killed). `CheckInfraError` means the runner itself failed (server
gone): never a verdict on the policy.

`default_runner()` is the process-wide runner the verifier uses. Standard library,
nodeagent.sandbox.framing and the server's wire limits only; Must not import: zmq,
controller other than controller.contracts.
"""
from __future__ import annotations

import base64
import collections
import itertools
import json
import logging
import os
import socket
import subprocess
import sys
import threading
import time
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

from nodeagent.sandbox import framing
from nodeagent.verifier.checkserver import DEFAULT_LIMITS, MAX_OUTPUT_CAP, MAX_REPLY_BYTES

log = logging.getLogger(__name__)

DEFAULT_TIMEOUT_S = 10.0
DEFAULT_OUTPUT_CAP = 64 * 1024
SPARE_WAIT_S = 30.0             # a client waits at most this long for a spare
MAX_DEAD_SPARES = 8
REPLY_MARGIN_S = 30.0           # past its deadline, a silent check is an infra error
SUBMIT_THREADS = 64             # `submit` runs checks on this many threads at most
SERVER_MODULE = "nodeagent.verifier.checkserver"


class CheckInfraError(Exception):
    """The check runner itself failed (server died, could not start): not the policy's fault."""


@dataclass(frozen=True)
class CheckResult:
    outcome: str                    # ok | error | timeout | crashed | output_cap
    value: object = None            # the function's JSON result (fn checks)
    exit_code: int | None = None    # the command's exit code (argv checks)
    stdout: bytes = b""
    detail: str = ""
    wall_s: float = 0.0


class CheckRunner:
    """Thread-safe client of one check server. `run` blocks; `submit` returns a Future.

    The server hands the client pre-forked spares over the control socket: for each, the write
    end of its request pipe and the client's end of its reply socket (SOCK_SEQPACKET). A check
    is a `start` notice to the server (which owns the deadline) and one request written
    straight to a spare; the calling thread then waits on that spare's reply socket, where
    the spare itself, or the server (timeout, crash, command), writes exactly one record."""

    def __init__(self, preload: tuple[str, ...] = ("nodeagent.verifier.checkers",),
                 limits: dict | None = None) -> None:
        self.preload = preload
        self.limits = {**DEFAULT_LIMITS, **(limits or {})}
        self._lock = threading.Lock()
        self._spare_ready = threading.Condition(self._lock)
        # (spare id, request pipe fd, reply socket)
        self._spares: collections.deque[tuple[int, int, socket.socket]] = collections.deque()
        self._pool: ThreadPoolExecutor | None = None
        self._ids = itertools.count(1)
        self._alive = False
        self._proc: subprocess.Popen | None = None
        self._sock: socket.socket | None = None
        self._reader: threading.Thread | None = None

    def start(self) -> "CheckRunner":
        ours, theirs = socket.socketpair()
        env = {k: v for k, v in os.environ.items() if k in ("PATH", "LANG", "PYTHONPATH", "VIRTUAL_ENV")}
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [_project_root(), env.get("PYTHONPATH")]))
        self._proc = subprocess.Popen(
            [sys.executable, "-m", SERVER_MODULE, "--ctl-fd", str(theirs.fileno()),
             "--preload", ",".join(self.preload)],
            pass_fds=(theirs.fileno(),), stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, env=env, cwd="/")
        theirs.close()
        self._sock = ours
        try:
            hello = framing.recv_msg(ours, max_bytes=65536)
        except (framing.FramingError, OSError) as exc:
            err = self._proc.stderr.read().decode(errors="replace")[-2000:] if self._proc.stderr else ""
            self.close()
            raise CheckInfraError(f"check server failed to start: {exc}; {err}") from None
        if not hello.get("ready"):
            self.close()
            raise CheckInfraError(f"check server failed to start: {hello.get('error', hello)}")
        self._alive = True
        self._reader = threading.Thread(target=self._read_loop, name="check-runner-reader", daemon=True)
        self._reader.start()
        return self

    def close(self) -> None:
        with self._lock:
            self._alive = False
            self._spare_ready.notify_all()
        if self._sock:
            try:
                self._sock.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
        if self._proc:
            if self._proc.poll() is None:
                self._proc.kill()
            self._proc.wait()
            if self._proc.stderr:
                self._proc.stderr.close()
            self._proc = None
        if self._reader and self._reader is not threading.current_thread():
            self._reader.join(timeout=5)
        if self._sock:
            self._sock.close()
            self._sock = None
        if self._pool:
            self._pool.shutdown(wait=False, cancel_futures=True)
            self._pool = None

    def __enter__(self) -> "CheckRunner":
        return self.start()

    def __exit__(self, *exc) -> None:
        self.close()

    @property
    def server_pid(self) -> int | None:
        return self._proc.pid if self._proc else None

    def submit(self, fn: str | None = None, args: list | tuple = (), argv: list[str] | None = None,
               timeout_s: float = DEFAULT_TIMEOUT_S, **kw) -> Future:
        """`run` on a thread of a small pool; the Future holds its CheckResult."""
        with self._lock:
            if self._pool is None:
                self._pool = ThreadPoolExecutor(max_workers=SUBMIT_THREADS, thread_name_prefix="check")
            pool = self._pool
        return pool.submit(self.run, fn, args, argv, timeout_s, **kw)

    def run(self, fn: str | None = None, args: list | tuple = (), argv: list[str] | None = None,
            timeout_s: float = DEFAULT_TIMEOUT_S, output_cap: int = DEFAULT_OUTPUT_CAP,
            limits: dict | None = None, stdin: bytes = b"") -> CheckResult:
        """One check, isolated; blocks until its result, its deadline or a runner failure."""
        if (fn is None) == (argv is None):
            raise ValueError("give exactly one of fn='module:name' or argv=[...]")
        cap = min(int(output_cap), MAX_OUTPUT_CAP)
        for _attempt in range(MAX_DEAD_SPARES):
            sid, req_w, reply = self._take_spare()
            with reply:
                rid, t0 = next(self._ids), time.monotonic()
                try:
                    with self._lock:
                        framing.send_msg(self._sock, {  # type: ignore[arg-type]  # closed (None): AttributeError, caught
                            "start": sid, "id": rid, "timeout_s": float(timeout_s), "output_cap": cap,
                            "kind": "argv" if argv else "fn", "t0": t0})
                except (OSError, AttributeError) as exc:
                    os.close(req_w)
                    raise CheckInfraError(f"check server is gone: {exc}") from None
                req = {"id": rid, "fn": fn, "args": list(args), "argv": argv, "timeout_s": float(timeout_s),
                       "output_cap": cap, "limits": {**self.limits, **(limits or {})}, "t0": t0,
                       "stdin": bytes(stdin).decode("latin-1")}
                try:
                    view = memoryview(json.dumps(req).encode() + b"\n")
                    while view:
                        view = view[os.write(req_w, view):]
                except BrokenPipeError:       # that spare died idle: take another
                    continue
                finally:
                    os.close(req_w)
                msg = self._wait_reply(reply, t0 + float(timeout_s) + REPLY_MARGIN_S)
                return CheckResult(msg["outcome"], msg.get("value"), msg.get("exit_code"),
                                   base64.b64decode(msg.get("stdout") or ""), msg.get("detail", ""),
                                   msg.get("wall_s", 0.0))
        raise CheckInfraError(f"{MAX_DEAD_SPARES} spare check processes in a row were dead")

    def _wait_reply(self, reply: socket.socket, give_up: float) -> dict:
        """The check's one reply record. The server enforces the deadline; this gives up only
        if the server is gone (checked every second) or silent far past the deadline."""
        while True:
            reply.settimeout(max(min(give_up - time.monotonic(), 1.0), 0.001))
            try:
                data = reply.recv(MAX_REPLY_BYTES)
            except TimeoutError:
                if not self._alive:
                    raise CheckInfraError("the check server exited during the check") from None
                if time.monotonic() >= give_up:
                    raise CheckInfraError("the check server did not answer past the deadline") from None
                continue
            except OSError as exc:
                raise CheckInfraError(f"no reply from the check server: {exc}") from None
            if not data:
                raise CheckInfraError("the check server closed the check without a reply")
            return json.loads(data)

    def _take_spare(self) -> tuple[int, int, socket.socket]:
        with self._lock:
            deadline = time.monotonic() + SPARE_WAIT_S
            while self._alive and not self._spares and time.monotonic() < deadline:
                self._spare_ready.wait(timeout=deadline - time.monotonic())
            if not self._alive:
                raise CheckInfraError("check runner is not running (its server exited)")
            if not self._spares:
                raise CheckInfraError(f"no spare check process within {SPARE_WAIT_S}s")
            return self._spares.popleft()

    def _read_loop(self) -> None:
        """Receive spares from the server; when it goes, the runner is down."""
        try:
            while True:
                msg, fds = framing.recv_msg(self._sock,  # type: ignore[arg-type]  # closed (None): AttributeError, caught
                                            max_bytes=65536, with_fds=True)
                if "spare" in msg and len(fds) == 2:
                    with self._lock:
                        self._spares.append((int(msg["spare"]), fds[0], socket.socket(fileno=fds[1])))
                        self._spare_ready.notify()
                else:
                    for fd in fds:
                        os.close(fd)
        except (framing.FramingError, OSError, AttributeError, ValueError):
            pass
        finally:
            with self._lock:
                self._alive = False
                spares, self._spares = list(self._spares), collections.deque()
                self._spare_ready.notify_all()
            for _sid, fd, sock in spares:
                os.close(fd)
                sock.close()


def _project_root() -> str:
    return str(Path(__file__).resolve().parents[2])


_default_runner: CheckRunner | None = None
_default_lock = threading.Lock()


def default_runner() -> CheckRunner:
    """The process-wide runner (started on first use, restarted if its server died). It is
    started from a thread that lives as long as the process: the server's PDEATHSIG follows
    the thread that spawned it, and slot threads come and go."""
    global _default_runner
    with _default_lock:
        r = _default_runner
        if r is None or r._proc is None or r._proc.poll() is not None:
            if r is not None:
                r.close()
            started: dict = {}
            ready = threading.Event()

            def keeper() -> None:
                try:
                    started["runner"] = CheckRunner(preload=("nodeagent.verifier.checkers", "sympy", "math_verify")).start()
                except CheckInfraError as exc:
                    started["error"] = exc
                ready.set()
                threading.Event().wait()        # keep this thread (and so the server) alive
            threading.Thread(target=keeper, name="check-runner-keeper", daemon=True).start()
            ready.wait()
            if "error" in started:
                raise started["error"]
            _default_runner = started["runner"]
        assert _default_runner is not None  # set above, or it was r, alive (under _default_lock)
        return _default_runner


__all__ = ["CheckInfraError", "CheckResult", "CheckRunner", "default_runner"]
