"""Stream links into a sandbox through its relay: the harness's end of `nodeagent.harness.sbxlink`.

A sandbox's only stream to the outside is its relay: 127.0.0.1:3128 inside it reaches one Unix
socket on the node (`SandboxSpec.egress_socket`), the way the browser family reaches Chromium's
DevTools (`nodeagent.browser.session`). `SandboxLink(fallback)` listens on such a socket (mode
0666 in a 0711 directory: the relay runs as a subordinate uid). A connection whose first line is
`<nonce> <tag>` (the nonce is this link's, 32 random hex digits) is a link the harness asked
for; any other connection is the task's own egress: spliced to `fallback` (the egress proxy's
socket for this sandbox) unchanged, or closed when the task has no network — so a task keeps
the network policy a rollout of it gets.

- `open(sandbox, mode, tag, argv, ...)` starts `sbxlink` in the sandbox (mode `pty`, `stdio`
  or `tcp`) and returns the connected socket (for `tcp`: the control channel);
- `portal(mode, tag, sock)` serves a link on a private host Unix socket (0600 in a 0700
  directory): for `tcp`, each client connection there becomes one connection to the in-sandbox
  port (an HTTP client such as httpx connects with `uds=`); for `stdio`, the first client is
  joined to the program. `pipe_argv(path)` is a host command that joins its stdin and stdout to
  such a socket (what an MCP stdio client spawns).

`close()` ends every link (the in-sandbox processes see EOF and exit) and removes the
directories. Must not import: zmq, controller (all of it), nodeagent.agent, nodeagent.verifier.
"""
from __future__ import annotations

import json
import os
import queue
import secrets
import shutil
import socket
import sys
import tempfile
import threading
from pathlib import Path
from typing import Callable

HEADER_MAX_BYTES = 256
HEADER_TIMEOUT_S = 5.0
SBXLINK_SOURCE = (Path(__file__).parent / "sbxlink.py").read_text()
# The environment variables a sandbox with a relay gets for its proxy (sbxinit); a link of a
# task without network removes them, so the program sees the environment of such a rollout.
PROXY_VARS = ("HTTP_PROXY", "HTTPS_PROXY", "http_proxy", "https_proxy")

PIPE_SOURCE = r"""
import os, socket, sys, threading
s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM); s.connect(sys.argv[1])
def up():
    while True:
        d = os.read(0, 65536)
        if not d: break
        s.sendall(d)
    try: s.shutdown(socket.SHUT_WR)
    except OSError: pass
threading.Thread(target=up, daemon=True).start()
while True:
    d = s.recv(65536)
    if not d: break
    os.write(1, d)
"""


class LinkError(Exception):
    """A link could not be made (no python3 in the image, the program did not start, the link
    did not connect back in time): an infrastructure failure, or the task's when its program is
    at fault; the message names which and carries the program's words."""


def _splice(a: socket.socket, b: socket.socket, first: bytes = b"") -> list[threading.Thread]:
    def one_way(src: socket.socket, dst: socket.socket, head: bytes) -> None:
        try:
            if head:
                dst.sendall(head)
            while data := src.recv(65536):
                dst.sendall(data)
            dst.shutdown(socket.SHUT_WR)    # pass the end on; the other direction stays open
        except OSError:                     # a reset or a dead peer: both directions end
            for s in (dst, src):
                try:
                    s.shutdown(socket.SHUT_RDWR)
                except OSError:
                    pass
    threads = [threading.Thread(target=one_way, args=(a, b, first), daemon=True),
               threading.Thread(target=one_way, args=(b, a, b""), daemon=True)]
    for t in threads:
        t.start()
    return threads


class SandboxLink:
    """The relay socket of one sandbox, with links into it on demand (see the module doc)."""

    def __init__(self, fallback: str | None = None, socket_dir: str | None = None) -> None:
        self.fallback = fallback
        self.nonce = secrets.token_hex(16)
        self._dir = tempfile.mkdtemp(prefix="paddock-link-", dir=socket_dir)
        os.chmod(self._dir, 0o711)
        self.path = os.path.join(self._dir, "relay.sock")
        self._listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self._listener.bind(self.path)
        os.chmod(self.path, 0o666)
        self._listener.listen(64)
        self._lock = threading.Lock()
        self._waiting: dict[str, queue.Queue] = {}
        self._socks: list[socket.socket] = []
        self._portals: list[Portal] = []
        self.refused = 0          # connections without the nonce and no egress to pass them to
        self._closed = False
        self._thread = threading.Thread(target=self._accept_loop, name="sandbox-link", daemon=True)
        self._thread.start()

    # -- the relay's side -------------------------------------------------------------------
    def _accept_loop(self) -> None:
        while not self._closed:
            try:
                conn, _ = self._listener.accept()
            except OSError:
                return
            threading.Thread(target=self._route, args=(conn,), daemon=True).start()

    def _route(self, conn: socket.socket) -> None:
        conn.settimeout(HEADER_TIMEOUT_S)
        head = b""
        try:
            while not head.endswith(b"\n") and len(head) < HEADER_MAX_BYTES:
                chunk = conn.recv(1)
                if not chunk:
                    break
                head += chunk
        except OSError:
            pass
        nonce, _, tag = head.decode(errors="replace").strip().partition(" ")
        if secrets.compare_digest(nonce.encode(), self.nonce.encode()) and tag:
            conn.settimeout(None)
            self._remember(conn)
            self._queue(tag).put(conn)
            return
        if self.fallback is None:
            self.refused += 1
            conn.close()
            return
        try:
            upstream = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            upstream.connect(self.fallback)
        except OSError:
            conn.close()
            return
        conn.settimeout(None)
        _splice(conn, upstream, head)

    def _queue(self, tag: str) -> queue.Queue:
        with self._lock:
            return self._waiting.setdefault(tag, queue.Queue())

    def _remember(self, sock: socket.socket) -> None:
        with self._lock:
            self._socks.append(sock)

    def wait(self, tag: str, timeout_s: float) -> socket.socket:
        """The next link connection presenting `tag`; LinkError after `timeout_s`."""
        try:
            return self._queue(tag).get(timeout=timeout_s)
        except queue.Empty:
            raise LinkError(f"link {tag!r} did not connect back within {timeout_s:g} s") from None

    # -- links --------------------------------------------------------------------------------
    def open(self, sandbox, mode: str, tag: str, argv: list[str], *, cwd: str = "/work",
             env: dict | None = None, network: bool = False, port: int = 0, rows: int = 24, cols: int = 80,
             log: str | None = None, timeout_s: float = 30.0, how: list | None = None,
             framed: bool = False) -> socket.socket:
        """Start `argv` in `sandbox` behind a link (`mode`: pty | stdio | tcp) and return the
        connected socket (`framed`: what is sent must be `frame()`d; `frame(b"")` ends the
        program's input). `network`: the task has egress (else the proxy variables the relay
        brings are removed from the program's environment). Raises LinkError."""
        if mode not in ("pty", "stdio", "tcp"):
            raise ValueError(f"link mode must be pty, stdio or tcp, not {mode!r}")
        cfg = {"nonce": self.nonce, "tag": tag, "mode": mode, "argv": list(argv), "cwd": cwd, "env": env,
               "unset": [] if network else list(PROXY_VARS), "port": port, "rows": rows, "cols": cols,
               "log": log, "framed": framed}
        r = sandbox.exec(["python3", "-c", SBXLINK_SOURCE], stdin=json.dumps(cfg).encode(), timeout_s=timeout_s,
                         cwd="/")
        if r.exit_code != 0:
            words = (r.stderr or r.stdout).decode(errors="replace").strip()[-2000:]
            if r.exit_code == 127 or "python3" in words and "not found" in words:
                raise LinkError(f"cannot link {argv[0]!r}: the image has no python3 ({words})")
            raise LinkError(f"{argv[0]!r} ({mode}) did not start: exit {r.exit_code}: {words}")
        if how is not None:           # what the launcher said: "ok pty", "ok pipes", "ok"
            how.append(r.stdout.decode(errors="replace").strip())
        return self.wait(tag, timeout_s)

    def portal(self, mode: str, tag: str, sock: socket.socket, timeout_s: float = 20.0) -> "Portal":
        """A host socket into the link `sock` opened by `open(..., mode, tag)`: for `tcp`, each
        connection to the portal asks the control channel for one more connection to the port;
        for `stdio`, the first connection is joined to the link (later ones are refused)."""
        if mode == "tcp":
            def inner() -> socket.socket:
                sock.sendall(b"n")
                return self.wait(tag + ".conn", timeout_s)
        else:
            once = [sock]

            def inner() -> socket.socket:
                if not once:
                    raise LinkError(f"link {tag!r} is already joined")
                return once.pop()
        p = Portal(inner, name=f"portal-{tag}")
        with self._lock:
            self._portals.append(p)
        return p

    def close(self) -> None:
        """End every link and remove the sockets. Idempotent."""
        self._closed = True
        try:
            self._listener.close()
        except OSError:
            pass
        with self._lock:
            socks, portals = list(self._socks), list(self._portals)
        for p in portals:
            p.close()
        for s in socks:
            try:
                s.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
            s.close()
        shutil.rmtree(self._dir, ignore_errors=True)


class Portal:
    """A host Unix socket (private to this user) whose connections each become one stream into
    the sandbox: `inner()` gives that stream's socket (for a `tcp` link: a new connection to the
    in-sandbox port; for a `stdio` link: the one link, once)."""

    def __init__(self, inner: Callable[[], socket.socket], name: str = "portal") -> None:
        self.inner = inner
        self._dir = tempfile.mkdtemp(prefix="paddock-portal-")      # 0700
        self.path = os.path.join(self._dir, "portal.sock")
        self._listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self._listener.bind(self.path)
        os.chmod(self.path, 0o600)
        self._listener.listen(16)
        self._lock = threading.Lock()
        self._closed = False
        threading.Thread(target=self._accept_loop, name=name, daemon=True).start()

    def _accept_loop(self) -> None:
        while not self._closed:
            try:
                client, _ = self._listener.accept()
            except OSError:
                return
            threading.Thread(target=self._connect, args=(client,), daemon=True).start()

    def _connect(self, client: socket.socket) -> None:
        try:
            with self._lock:           # one request, one connection back, in order
                inner = self.inner()
        except (OSError, LinkError):
            client.close()
            return
        _splice(client, inner)

    def close(self) -> None:
        self._closed = True
        try:
            self._listener.close()
        except OSError:
            pass
        shutil.rmtree(self._dir, ignore_errors=True)


def frame(data: bytes) -> bytes:
    """One frame of a `framed` link; `frame(b"")` is the end of the input."""
    return len(data).to_bytes(4, "big") + data


def pipe_argv(path: str) -> list[str]:
    """A host command joining its stdin/stdout to the Unix socket `path` (for a stdio client)."""
    return [sys.executable, "-c", PIPE_SOURCE, path]


__all__ = ["LinkError", "frame", "PIPE_SOURCE", "PROXY_VARS", "Portal", "SandboxLink", "pipe_argv"]
