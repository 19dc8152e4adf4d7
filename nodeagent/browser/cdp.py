"""A Chrome DevTools Protocol client over one stream socket (the harness side).

Messages are JSON objects ended by a NUL byte, as chromium's `--remote-debugging-pipe` speaks
them; the sandbox's bridge (`nodeagent.browser.bridge`) carries them unchanged. `Cdp.call`
sends one command (with an optional flat-mode `sessionId`) and waits for its reply until a
deadline; events that arrive meanwhile are queued (`events`, bounded). A reply with `error`
raises `CdpError` (the page's fault or a bad argument: the tool turns it into an observation);
a closed or silent channel raises `CdpClosed` / `CdpTimeout` (infrastructure).
Standard library only; no sandbox, no harness import.
"""
from __future__ import annotations

import collections
import json
import socket
import time
from typing import Any, Callable

MAX_MESSAGE_BYTES = 64 * 1024 * 1024    # a full-page screenshot's base64 fits
MAX_QUEUED_EVENTS = 1000


class CdpError(Exception):
    """The browser answered a command with an error."""


class CdpClosed(Exception):
    """The DevTools channel closed (the browser or its bridge died)."""


class CdpTimeout(CdpClosed):
    """No reply before the deadline."""


class Cdp:
    def __init__(self, sock: socket.socket, clock: Callable[[], float] = time.monotonic) -> None:
        self.sock, self.clock = sock, clock
        self._buf = bytearray()
        self._next_id = 0
        self.events: collections.deque = collections.deque(maxlen=MAX_QUEUED_EVENTS)

    def close(self) -> None:
        try:
            self.sock.close()
        except OSError:
            pass

    def call(self, method: str, params: dict | None = None, session: str | None = None,
             timeout_s: float = 10.0) -> dict:
        self._next_id += 1
        msg: dict[str, Any] = {"id": self._next_id, "method": method, "params": params or {}}
        if session:
            msg["sessionId"] = session
        try:
            self.sock.sendall(json.dumps(msg).encode() + b"\0")
        except OSError as exc:
            raise CdpClosed(f"sending {method}: {exc}") from None
        deadline = self.clock() + timeout_s
        while True:
            reply = self._read(deadline, method)
            if reply.get("id") == self._next_id:
                if "error" in reply:
                    raise CdpError(f"{method}: {reply['error'].get('message', reply['error'])}")
                return reply.get("result") or {}
            if "method" in reply:
                self.events.append(reply)

    def wait_event(self, name: str, timeout_s: float, session: str | None = None) -> dict | None:
        """The first queued or arriving event `name` (of `session`), or None at the deadline."""
        deadline = self.clock() + timeout_s
        while True:
            for ev in list(self.events):
                if ev.get("method") == name and (session is None or ev.get("sessionId") == session):
                    self.events.remove(ev)
                    return ev
            try:
                msg = self._read(deadline, name)
            except CdpTimeout:
                return None
            if "method" in msg:
                self.events.append(msg)

    def _read(self, deadline: float, what: str) -> dict:
        while True:
            end = self._buf.find(b"\0")
            if end >= 0:
                raw = bytes(self._buf[:end])
                del self._buf[:end + 1]
                try:
                    return json.loads(raw)
                except ValueError:
                    raise CdpClosed(f"the browser sent a malformed message ({raw[:80]!r})") from None
            left = deadline - self.clock()
            if left <= 0:
                raise CdpTimeout(f"no reply to {what} within the deadline")
            self.sock.settimeout(left)
            try:
                chunk = self.sock.recv(1 << 20)
            except socket.timeout:
                raise CdpTimeout(f"no reply to {what} within the deadline") from None
            except OSError as exc:
                raise CdpClosed(f"reading the reply to {what}: {exc}") from None
            if not chunk:
                raise CdpClosed(f"the DevTools channel closed while waiting for {what}")
            self._buf += chunk
            if len(self._buf) > MAX_MESSAGE_BYTES:
                raise CdpClosed(f"a DevTools message exceeds {MAX_MESSAGE_BYTES} bytes")


__all__ = ["Cdp", "CdpClosed", "CdpError", "CdpTimeout"]
