"""The gateway's client to a model server: one persistent HTTP/1.1 connection per endpoint of a
session, so a call costs one request on a warm socket (no connect, no new server thread).

`KeepAliveModel(endpoint).complete(payload, timeout_s)` is the `nodeagent.harness.model.Model`
seam (`exchange` gives the reply's bytes undecoded, `stream` a `stream: true` call's events
as they arrive), with `HTTPModel`'s contract: the whole call must finish within `timeout_s` (one watchdog
thread for the process, started once, shuts the socket at the deadline, so a server that
trickles bytes cannot hold a rollout past its budget), the reply is capped at
MAX_RESPONSE_BYTES, a non-200 reply raises ModelError with `status` and the decoded `body`,
no answer in time raises ModelTimeout (`probe` then asks whether the server is alive:
`nodeagent.harness.modelfault`). A connection the server closed while idle (keep-alive
timeout) is reopened and the request sent once more, only when nothing of the reply was read.
Requests go out in one write (TCP_NODELAY), replies are read by `nodeagent.gateway.http1`.

Calls on one client are serialised (the session serialises them anyway). Must not import:
zmq, nodeagent.agent, nodeagent.gateway.session.
"""
from __future__ import annotations

import http.client
import json
import socket
import ssl
import threading
import time
import urllib.parse
from typing import BinaryIO, Callable, Iterator

from nodeagent.gateway import http1, wire
from nodeagent.harness.model import (
    MAX_RESPONSE_BYTES,
    PROBE_TIMEOUT_S,
    ModelError,
    ModelTimeout,
    decode_reply,
    liveness,
)
from nodeagent.store import tracing

_STALE = (http.client.RemoteDisconnected, BrokenPipeError, ConnectionResetError)


class _Watchdog:
    """One thread for the whole process: it shuts each armed socket when its deadline passes.
    `arm` returns a token; `disarm(token)` tells whether the deadline fired."""

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self._clock = clock
        self._cv = threading.Condition()
        self._armed: dict[int, tuple[float, socket.socket]] = {}
        self._fired: set[int] = set()
        self._next = 0
        self._thread: threading.Thread | None = None

    def arm(self, sock: socket.socket, deadline: float) -> int:
        with self._cv:
            if self._thread is None:
                self._thread = threading.Thread(target=self._run, name="gateway-upstream-watchdog", daemon=True)
                self._thread.start()
            self._next += 1
            self._armed[self._next] = (deadline, sock)
            self._cv.notify()
            return self._next

    def disarm(self, token: int) -> bool:
        with self._cv:
            self._armed.pop(token, None)
            if token in self._fired:
                self._fired.discard(token)
                return True
            return False

    def _run(self) -> None:
        with self._cv:
            while True:
                if not self._armed:
                    self._cv.wait()
                    continue
                token, (deadline, sock) = min(self._armed.items(), key=lambda kv: kv[1][0])
                left = deadline - self._clock()
                if left > 0:
                    self._cv.wait(left)
                    continue
                del self._armed[token]
                self._fired.add(token)
                try:
                    sock.shutdown(socket.SHUT_RDWR)
                except OSError:
                    pass


WATCHDOG = _Watchdog()


class KeepAliveModel:
    """An OpenAI-compatible endpoint (`.../v1`) over one reused connection."""

    def __init__(self, endpoint: str, clock: Callable[[], float] = time.monotonic) -> None:
        u = urllib.parse.urlsplit(endpoint)
        if u.scheme not in ("http", "https") or not u.hostname:
            raise ModelError(f"model endpoint {endpoint!r} is not an http(s) URL")
        self.endpoint, self._u, self._clock = endpoint, u, clock
        port = u.port or (443 if u.scheme == "https" else 80)
        self._addr = (u.hostname, port)
        host = u.hostname if u.port is None else f"{u.hostname}:{port}"
        self._prefix = (f"POST {u.path.rstrip('/')}/chat/completions HTTP/1.1\r\nHost: {host}\r\n"
                        "Content-Type: application/json\r\nAccept-Encoding: identity\r\n").encode("latin-1")
        self._sock: socket.socket | None = None
        self._rfile: BinaryIO | None = None
        self._lock = threading.Lock()
        self.fired = False
        self.traceparent: str | None = None   # a W3C traceparent sent with each request (the session sets it)

    def _connect(self, timeout_s: float) -> None:
        sock = socket.create_connection(self._addr, timeout=timeout_s)
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        if self._u.scheme == "https":
            sock = ssl.create_default_context().wrap_socket(sock, server_hostname=self._u.hostname)
        self._sock, self._rfile = sock, sock.makefile("rb", buffering=65536)

    def _open(self, blob: bytes, deadline: float, accept: str) -> tuple[int, dict[str, str], int]:
        """Send the request (one write) on the kept connection, a fresh one if there is none or
        it went stale; (status, reply headers, watchdog token). The reply's body is unread."""
        ctx = tracing.parse_traceparent(self.traceparent)       # re-written: never raw text in a header
        trace = f"traceparent: {ctx.header()}\r\n" if ctx is not None else ""
        req = self._prefix + f"Accept: {accept}\r\n{trace}Content-Length: {len(blob)}\r\n\r\n".encode() + blob
        for attempt in (0, 1):
            fresh = self._sock is None
            if fresh:
                self._connect(max(deadline - self._clock(), 0.001))
            sock, rfile = self._sock, self._rfile
            assert sock is not None and rfile is not None
            sock.settimeout(max(deadline - self._clock(), 0.001))
            token = WATCHDOG.arm(sock, deadline)
            try:
                sock.sendall(req)
                head = http1.read_head(rfile)
                if head is None:
                    raise http.client.RemoteDisconnected("the server closed the connection")
                line, headers = head
                parts = line.split(" ", 2)
                if len(parts) < 2 or not parts[0].startswith("HTTP/1.") or not parts[1].isdigit():
                    raise http1.FramingError(f"bad status line {line[:80]!r}")
                status = int(parts[1])
                if status == 100:          # a stray 100 Continue: the real head follows
                    head = http1.read_head(rfile)
                    if head is None:
                        raise http.client.RemoteDisconnected("the server closed the connection")
                    line, headers = head
                    status = int(line.split(" ", 2)[1])
                if parts[0] == "HTTP/1.0" or "close" in headers.get("connection", "").lower():
                    headers["connection"] = "close"
                return status, headers, token
            except BaseException as exc:
                self.fired = WATCHDOG.disarm(token)
                self.close()
                if isinstance(exc, _STALE) and not (fresh or attempt or self.fired):
                    continue          # the server closed the idle connection: send it once more
                raise
        raise AssertionError("unreachable")

    def _finish(self, token: int, headers: dict[str, str], ok: bool) -> None:
        self.fired = WATCHDOG.disarm(token)
        if not ok or headers.get("connection") == "close":
            self.close()

    def _failure(self, exc: BaseException, timeout_s: float) -> ModelError:
        if self.fired or isinstance(exc, TimeoutError):
            return ModelTimeout(f"model server {self.endpoint} did not answer within {timeout_s:.1f}s")
        err = ModelError(f"model server {self.endpoint} failed: {exc!r}")
        err.refused = isinstance(exc, ConnectionRefusedError)     # a server restarting to load weights
        return err

    def complete(self, payload: dict, timeout_s: float) -> dict:
        return self.complete_raw(payload, timeout_s)[0]

    def complete_raw(self, payload: dict, timeout_s: float) -> tuple[dict, bytes]:
        """(the decoded reply, its bytes as the server sent them: forwarded without re-encoding)."""
        status, raw = self.exchange(payload, timeout_s)
        return decode_reply(self.endpoint, status, raw), raw

    def _request(self, payload: dict, timeout_s: float) -> tuple[float, bytes]:
        """(the call's deadline, its body); ModelTimeout when no time is left."""
        if timeout_s <= 0:
            raise ModelTimeout(f"no time left for a request to {self.endpoint}")
        return self._clock() + timeout_s, json.dumps(payload).encode()

    def exchange(self, payload: dict, timeout_s: float) -> tuple[int, bytes]:
        """(status, the reply's bytes), not decoded: the gateway forwards a 200 reply first and
        reads it afterwards. Transport failures raise ModelError / ModelTimeout."""
        deadline, blob = self._request(payload, timeout_s)
        with self._lock:
            self.fired = False
            try:
                status, headers, token = self._open(blob, deadline, "application/json")
                ok = False
                try:
                    raw = http1.read_body(self._rfile, headers, MAX_RESPONSE_BYTES)   # type: ignore[arg-type]
                    ok = True
                finally:
                    self._finish(token, headers, ok)
            except (OSError, ValueError, http.client.HTTPException) as exc:
                raise self._failure(exc, timeout_s) from None
        if len(raw) > MAX_RESPONSE_BYTES:
            raise ModelError(f"model server {self.endpoint} sent more than {MAX_RESPONSE_BYTES} bytes")
        return status, raw

    def stream(self, payload: dict, timeout_s: float) -> Iterator[bytes]:
        """A `stream: true` call: the `data` of each server-sent event as it arrives (`[DONE]`
        included). A reply that is not 200 raises ModelError (with `status` and `body`) before
        the first event; a 200 that is not a stream (a server that ignored `stream`) is given
        as the events of that one reply (`wire.sse`). The whole stream must end within
        `timeout_s`; closing the iterator early closes the connection."""
        deadline, blob = self._request(payload, timeout_s)
        with self._lock:
            self.fired = False
            try:
                status, headers, token = self._open(blob, deadline, "text/event-stream")
            except (OSError, ValueError, http.client.HTTPException) as exc:
                raise self._failure(exc, timeout_s) from None
            ok = False
            try:
                if status != 200 or "text/event-stream" not in headers.get("content-type", ""):
                    raw = http1.read_body(self._rfile, headers, MAX_RESPONSE_BYTES)    # type: ignore[arg-type]
                    ok = True
                    body = decode_reply(self.endpoint, status, raw)     # raises unless a 200
                    # a server that ignored `stream`: its whole reply as one stream
                    yield from (e[6:] for e in wire.sse(body, True).split(b"\n\n")[:-1])
                    return
                body = http1.iter_body(self._rfile, headers, MAX_RESPONSE_BYTES)    # type: ignore[arg-type]
                for data in http1.iter_sse(body):
                    if data == b"[DONE]":
                        for _ in body:           # the rest (the last chunk): the connection stays usable
                            pass
                        ok = True                # a consumer may stop here without closing it
                    yield data
                ok = True
            except (OSError, ValueError, http.client.HTTPException) as exc:
                ok = False
                raise self._failure(exc, timeout_s) from None
            finally:
                self._finish(token, headers, ok)

    def probe(self, timeout_s: float = PROBE_TIMEOUT_S) -> str | None:
        """None when the server is alive (`nodeagent.harness.model.liveness`), else what is wrong."""
        return liveness(self.endpoint, timeout_s)

    def unrecorded(self, payload: dict, timeout_s: float) -> dict:
        """A call made to decide whose a failure is (`nodeagent.harness.modelfault`)."""
        return self.complete(payload, timeout_s)

    def close(self) -> None:
        """Close the kept connection (the next call opens a new one)."""
        if self._sock is not None:
            try:
                self._rfile.close()       # type: ignore[union-attr]
                self._sock.close()
            except OSError:
                pass
            self._sock = self._rfile = None


__all__ = ["KeepAliveModel"]
