"""The gateway's client to a model server: one persistent HTTP/1.1 connection per endpoint of a
session, so a call costs one request on a warm socket (no connect, no new server thread).

`KeepAliveModel(endpoint).complete(payload, timeout_s)` is the `nodeagent.harness.model.Model`
seam, with `HTTPModel`'s contract: the whole call must finish within `timeout_s` (one watchdog
thread for the process, started once, shuts the socket at the deadline, so a server that
trickles bytes cannot hold a rollout past its budget), the reply is capped at
MAX_RESPONSE_BYTES, a non-200 reply raises ModelError with `status` and the decoded `body`,
no answer in time raises ModelTimeout. A connection the server closed while idle (keep-alive
timeout) is reopened and the request sent once more, only when nothing of the reply was read.

Calls on one client are serialised (the session serialises them anyway). Must not import:
zmq, nodeagent.agent, nodeagent.gateway.session.
"""
from __future__ import annotations

import http.client
import json
import socket
import threading
import time
import urllib.parse
from typing import Callable

from nodeagent.harness.model import MAX_RESPONSE_BYTES, ModelError, ModelTimeout, decode_reply

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
        self._path = u.path.rstrip("/") + "/chat/completions"
        self._conn: http.client.HTTPConnection | None = None
        self._lock = threading.Lock()
        self.fired = False

    def _connect(self, timeout_s: float) -> http.client.HTTPConnection:
        cls = http.client.HTTPSConnection if self._u.scheme == "https" else http.client.HTTPConnection
        conn = cls(self._u.hostname, self._u.port, timeout=timeout_s)
        conn.connect()
        conn.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        return conn

    def _exchange(self, blob: bytes, deadline: float) -> tuple[int, bytes]:
        """One request on the kept connection (a fresh one if there is none or it went stale)."""
        for attempt in (0, 1):
            fresh = self._conn is None
            if fresh:
                self._conn = self._connect(max(deadline - self._clock(), 0.001))
            conn = self._conn
            conn.sock.settimeout(max(deadline - self._clock(), 0.001))
            token = WATCHDOG.arm(conn.sock, deadline)
            try:
                conn.request("POST", self._path, body=blob, headers={"Content-Type": "application/json"})
                resp = conn.getresponse()
                raw = resp.read(MAX_RESPONSE_BYTES + 1)
            except BaseException as exc:
                self.fired = WATCHDOG.disarm(token)
                self.close()
                if isinstance(exc, _STALE) and not (fresh or attempt or self.fired):
                    continue          # the server closed the idle connection: send it once more
                raise
            self.fired = WATCHDOG.disarm(token)
            if resp.will_close or len(raw) > MAX_RESPONSE_BYTES:
                self.close()
            return resp.status, raw
        raise AssertionError("unreachable")

    def complete(self, payload: dict, timeout_s: float) -> dict:
        return self.complete_raw(payload, timeout_s)[0]

    def complete_raw(self, payload: dict, timeout_s: float) -> tuple[dict, bytes]:
        """(the decoded reply, its bytes as the server sent them: forwarded without re-encoding)."""
        if timeout_s <= 0:
            raise ModelTimeout(f"no time left for a request to {self.endpoint}")
        deadline = self._clock() + timeout_s
        blob = json.dumps(payload).encode()
        with self._lock:
            self.fired = False
            try:
                status, raw = self._exchange(blob, deadline)
            except (OSError, http.client.HTTPException) as exc:
                if self.fired or isinstance(exc, TimeoutError):
                    raise ModelTimeout(f"model server {self.endpoint} did not answer within {timeout_s:.1f}s") from None
                raise ModelError(f"model server {self.endpoint} failed: {exc!r}") from None
        return decode_reply(self.endpoint, status, raw), raw

    def close(self) -> None:
        """Close the kept connection (the next call opens a new one)."""
        if self._conn is not None:
            self._conn.close()
            self._conn = None





__all__ = ["KeepAliveModel"]
