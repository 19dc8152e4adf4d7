"""Egress: the per-task network policy and the node-local proxy that enforces it.

A sandbox has no network device and no DNS. When its task allows egress, the sandbox gets a
relay on 127.0.0.1:3128 to one Unix socket of this proxy (one socket per sandbox, so the proxy
knows who asks). The proxy speaks HTTP CONNECT and absolute-URI HTTP and, for every request:
normalises the host (case, trailing dot, IDNA), refuses IP literals, userinfo and ports outside
the policy, matches the host against the allowlist by registrable domain (Public Suffix List,
private section included), resolves it itself (injectable resolver), refuses addresses that are
not public (loopback, private, link-local incl. 169.254.169.254, the node's own), connects to
the vetted address and no other, and for CONNECT checks that the TLS ClientHello's SNI equals
the CONNECT host. Every decision is recorded per sandbox (`decisions(sandbox)`), and the harness
puts them in the trajectory.

What a task's `network` field means is `controller.contracts.network` (`parse_policy`); the
decision itself is pure and lives in `nodeagent.egress.policy`; this module is the I/O:
sockets, the resolver, the node's addresses, the per-process socket directory (swept when its
owner died). Must not import zmq, controller.* outside contracts, nodeagent.agent.
"""
from __future__ import annotations

import atexit
import fcntl
import ipaddress
import logging
import os
import re
import selectors
import shutil
import socket
import tempfile
import threading
import time
import urllib.parse
from dataclasses import dataclass, field
from typing import Callable, Sequence

import psutil

from controller.contracts.clock import utc_now
from controller.contracts.network import HostError, Policy, normalize_host, parse_policy
from nodeagent.egress.policy import (
    PUBLIC,
    ClientHelloError,
    Decision,
    Network,
    Resolver,
    client_hello_length,
    decide,
    parse_sni,
    split_authority,
)
from nodeagent.sandbox.runtime import SandboxError

log = logging.getLogger(__name__)


class EgressError(SandboxError):
    """The proxy could not serve a sandbox (its socket could not be made): infrastructure, so the
    attempt is an infra_error like any sandbox that fails to start."""


MAX_HEAD_BYTES = 16 * 1024
MAX_CLIENT_HELLO_BYTES = 64 * 1024
HEAD_TIMEOUT_S = 10.0
CONNECT_TIMEOUT_S = 10.0
IDLE_TIMEOUT_S = 300.0
MAX_CONNECTIONS_PER_SANDBOX = 64
MAX_DECISIONS_PER_SANDBOX = 10_000


def system_resolver(host: str, port: int) -> list[str]:
    return [ai[4][0] for ai in socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)]


_OWN_CACHE: tuple[float, frozenset[str]] = (-1e18, frozenset())
OWN_ADDRESSES_TTL_S = 1.0


def node_addresses(clock: Callable[[], float] = time.monotonic) -> frozenset[str]:
    """Every address of this node's interfaces (re-read at most once per OWN_ADDRESSES_TTL_S)."""
    global _OWN_CACHE
    now = clock()
    if now - _OWN_CACHE[0] < OWN_ADDRESSES_TTL_S:
        return _OWN_CACHE[1]
    out = set()
    for addrs in psutil.net_if_addrs().values():
        for a in addrs:
            if a.family in (socket.AF_INET, socket.AF_INET6):
                out.add(str(ipaddress.ip_address(a.address.split("%")[0])))
    _OWN_CACHE = (now, frozenset(out))
    return _OWN_CACHE[1]


# ---------------------------------------------------------------------------------------------
# The proxy (I/O).

class _BadRequest(Exception):
    pass


def _read_head(conn: socket.socket) -> tuple[bytes, bytes]:
    """(request head up to the blank line, bytes after it)."""
    buf = b""
    while b"\r\n\r\n" not in buf:
        chunk = conn.recv(4096)
        if not chunk:
            raise _BadRequest("client closed before the request head ended")
        buf += chunk
        if len(buf) > MAX_HEAD_BYTES:
            raise _BadRequest(f"request head exceeds {MAX_HEAD_BYTES} bytes")
    head, rest = buf.split(b"\r\n\r\n", 1)
    return head, rest


@dataclass
class _Sandbox:
    policy: Policy
    path: str
    listener: socket.socket
    decisions: list[dict] = field(default_factory=list)
    dropped: int = 0
    active: int = 0


class EgressProxy:
    """The node-local egress proxy: one Unix socket per sandbox, decisions recorded per sandbox.

    `resolver` and `allowed_networks` are injectable (tests map names to their own network
    namespaces and treat those addresses as public; production uses the system resolver and
    PUBLIC). The node's own addresses are always refused."""

    def __init__(self, socket_dir: str, resolver: Resolver = system_resolver,
                 allowed_networks: Sequence[Network] | str = PUBLIC,
                 own_addresses: Callable[[], frozenset[str]] = node_addresses,
                 connect_timeout_s: float = CONNECT_TIMEOUT_S, idle_timeout_s: float = IDLE_TIMEOUT_S) -> None:
        self.socket_dir = socket_dir
        self.resolver, self.allowed_networks, self.own_addresses = resolver, allowed_networks, own_addresses
        self.connect_timeout_s, self.idle_timeout_s = connect_timeout_s, idle_timeout_s
        self._lock = threading.Lock()
        self._boxes: dict[str, _Sandbox] = {}
        os.makedirs(socket_dir, exist_ok=True)
        os.chmod(socket_dir, 0o711)   # sandbox monitors (subordinate uids) open sockets by path

    # -- per-sandbox sockets ----------------------------------------------------------------
    def open(self, sandbox: str, policy: Policy) -> str:
        """Create the sandbox's Unix socket and start serving it; returns its path."""
        path = os.path.join(self.socket_dir, f"{re.sub(r'[^A-Za-z0-9._-]', '_', sandbox)}.sock")
        with self._lock:
            if sandbox in self._boxes:
                raise ValueError(f"sandbox {sandbox!r} already has an egress socket")
        listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            if os.path.exists(path):
                os.unlink(path)
            listener.bind(path)
            os.chmod(path, 0o666)   # the sandbox's relay runs as a subordinate uid
            listener.listen(64)
        except OSError as exc:
            listener.close()
            raise EgressError(f"egress socket {path} for sandbox {sandbox}: {exc}") from None
        box = _Sandbox(policy, path, listener)
        with self._lock:
            self._boxes[sandbox] = box
        threading.Thread(target=self._accept_loop, args=(sandbox, box), daemon=True,
                         name=f"egress-{sandbox}").start()
        log.info("egress socket open sandbox=%s policy=%s path=%s", sandbox, policy.describe(), path)
        return path

    def close(self, sandbox: str) -> list[dict]:
        """Stop serving the sandbox; returns its decisions."""
        with self._lock:
            box = self._boxes.pop(sandbox, None)
        if box is None:
            return []
        try:
            box.listener.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass
        box.listener.close()
        try:
            os.unlink(box.path)
        except FileNotFoundError:
            pass
        return list(box.decisions)

    def decisions(self, sandbox: str) -> list[dict]:
        with self._lock:
            box = self._boxes.get(sandbox)
            return list(box.decisions) if box else []

    def close_all(self) -> None:
        for sid in list(self._boxes):
            self.close(sid)

    # -- serving ----------------------------------------------------------------------------
    def _accept_loop(self, sandbox: str, box: _Sandbox) -> None:
        while True:
            try:
                conn, _ = box.listener.accept()
            except OSError:
                return
            with self._lock:
                full = box.active >= MAX_CONNECTIONS_PER_SANDBOX
                box.active += not full
            if full:
                self._record(sandbox, box, Decision("deny", "too_many_connections", "", 0))
                _reply(conn, 403, "too_many_connections")
                conn.close()
                continue
            threading.Thread(target=self._serve, args=(sandbox, box, conn), daemon=True).start()

    def _record(self, sandbox: str, box: _Sandbox, d: Decision, reason: str | None = None) -> None:
        row = {"sandbox": sandbox, "host": d.host, "port": d.port, "address": d.address,
               "verdict": d.verdict if reason is None else "deny", "reason": reason or d.reason, "ts": utc_now()}
        log.info("egress %s sandbox=%s host=%s port=%s address=%s reason=%s", row["verdict"], sandbox,
                 d.host, d.port, d.address, row["reason"])
        with self._lock:
            if len(box.decisions) < MAX_DECISIONS_PER_SANDBOX:
                box.decisions.append(row)
            else:
                box.dropped += 1

    def _decide(self, box: _Sandbox, host: str, port: int) -> Decision:
        return decide(box.policy, host, port, self.resolver, self.allowed_networks, self.own_addresses())

    def _serve(self, sandbox: str, box: _Sandbox, conn: socket.socket) -> None:
        upstream = None
        try:
            conn.settimeout(HEAD_TIMEOUT_S)
            try:
                head, rest = _read_head(conn)
                lines = head.decode("latin-1").split("\r\n")
                method, target, version = lines[0].split(" ")
            except (_BadRequest, ValueError, OSError) as exc:
                self._record(sandbox, box, Decision("deny", "bad_request", "", 0))
                log.info("egress bad request sandbox=%s: %s", sandbox, exc)
                _reply(conn, 400, "bad request")
                return
            if method.upper() == "CONNECT":
                upstream = self._connect(sandbox, box, conn, target, rest)
            else:
                upstream = self._forward(sandbox, box, conn, method, target, version, lines[1:], rest)
            if upstream is not None:
                _relay(conn, upstream, self.idle_timeout_s)
        except OSError as exc:
            log.info("egress connection ended sandbox=%s: %s", sandbox, exc)
        finally:
            for s in (conn, upstream):
                if s is not None:
                    s.close()
            with self._lock:
                box.active -= 1

    def _target(self, sandbox, box, conn, authority: str, default_port: int | None) -> Decision | None:
        try:
            host, port = split_authority(authority, default_port)
        except HostError as exc:
            d = Decision("deny", exc.args[0], authority, 0)
            self._record(sandbox, box, d)
            _reply(conn, 403, d.reason)
            return None
        d = self._decide(box, host, port)
        if not d.allowed:
            self._record(sandbox, box, d)
            _reply(conn, 403, d.reason)
            return None
        return d

    def _dial(self, sandbox, box, conn, d: Decision) -> socket.socket | None:
        try:
            return socket.create_connection((d.address, d.port), timeout=self.connect_timeout_s)
        except OSError as exc:
            log.info("egress upstream failed sandbox=%s %s:%s: %s", sandbox, d.address, d.port, exc)
            self._record(sandbox, box, d, reason="upstream_failed")
            return None

    def _connect(self, sandbox, box, conn, target: str, rest: bytes) -> socket.socket | None:
        d = self._target(sandbox, box, conn, target, None)
        if d is None:
            return None
        conn.sendall(b"HTTP/1.1 200 Connection established\r\n\r\n")
        hello = rest
        try:
            while (need := client_hello_length(hello)) is None or len(hello) < need:
                if len(hello) > MAX_CLIENT_HELLO_BYTES:
                    raise ClientHelloError("ClientHello too large")
                chunk = conn.recv(16384)
                if not chunk:
                    raise ClientHelloError("client closed before its ClientHello")
                hello += chunk
            sni = parse_sni(hello[:need])
        except (ClientHelloError, OSError) as exc:
            log.info("egress CONNECT without a TLS ClientHello sandbox=%s host=%s: %s", sandbox, d.host, exc)
            self._record(sandbox, box, d, reason="not_tls")
            return None
        if sni is None:
            self._record(sandbox, box, d, reason="no_sni")
            return None
        try:
            sni_host = normalize_host(sni)
        except HostError:
            sni_host = sni
        if sni_host != d.host:
            self._record(sandbox, box, Decision("deny", "sni_mismatch", d.host, d.port, d.address))
            return None
        upstream = self._dial(sandbox, box, conn, d)
        if upstream is None:
            return None
        self._record(sandbox, box, d)
        upstream.sendall(hello)
        return upstream

    def _forward(self, sandbox, box, conn, method, target, version, headers, rest) -> socket.socket | None:
        try:
            u = urllib.parse.urlsplit(target)
        except ValueError:            # e.g. an unbalanced IPv6 bracket
            u = urllib.parse.SplitResult("", "", "", "", "")
        if u.scheme != "http" or not u.netloc:
            d = Decision("deny", "bad_request", target[:200], 0)
            self._record(sandbox, box, d)
            _reply(conn, 400, "only CONNECT and absolute http:// URIs are proxied")
            return None
        d = self._target(sandbox, box, conn, u.netloc, 80)
        if d is None:
            return None
        kept = []
        for h in headers:
            name = h.split(":", 1)[0].strip().lower()
            if name == "host":
                try:
                    hh, hp = split_authority(h.split(":", 1)[1].strip(), 80)
                    same = normalize_host(hh) == d.host and hp == d.port
                except (HostError, IndexError):
                    same = False
                if not same:
                    self._record(sandbox, box, d, reason="host_header_mismatch")
                    _reply(conn, 403, "host_header_mismatch")
                    return None
            if name in ("host", "connection", "proxy-connection", "proxy-authorization", "keep-alive"):
                continue
            kept.append(h)
        upstream = self._dial(sandbox, box, conn, d)
        if upstream is None:
            _reply(conn, 502, "upstream_failed")
            return None
        self._record(sandbox, box, d)
        path = (u.path or "/") + (f"?{u.query}" if u.query else "")
        host_header = d.host if d.port == 80 else f"{d.host}:{d.port}"
        head = [f"{method} {path} {version}", f"Host: {host_header}", *kept, "Connection: close"]
        upstream.sendall("\r\n".join(head).encode("latin-1") + b"\r\n\r\n" + rest)
        return upstream


def _reply(conn: socket.socket, status: int, reason: str) -> None:
    body = f"paddock egress: {reason}\n".encode()
    text = {400: "Bad Request", 403: "Forbidden", 502: "Bad Gateway"}.get(status, "Error")
    try:
        conn.sendall(f"HTTP/1.1 {status} {text}\r\nContent-Type: text/plain\r\nContent-Length: {len(body)}\r\n"
                     f"X-Paddock-Egress: {reason}\r\nConnection: close\r\n\r\n".encode() + body)
    except OSError:
        pass


def _relay(a: socket.socket, b: socket.socket, idle_timeout_s: float) -> None:
    """Copy bytes both ways until both sides have closed or nothing moves for idle_timeout_s."""
    a.settimeout(None)
    b.settimeout(None)
    open_ends = {a: b, b: a}
    with selectors.DefaultSelector() as sel:   # epoll: no FD_SETSIZE limit on a busy node
        for sock in open_ends:
            sel.register(sock, selectors.EVENT_READ)
        while open_ends:
            ready = sel.select(idle_timeout_s)
            if not ready:
                return
            for key, _ in ready:
                src = key.fileobj
                dst = open_ends[src]
                try:
                    data = src.recv(65536)
                except OSError:
                    data = b""
                if data:
                    try:
                        dst.sendall(data)
                        continue
                    except OSError:
                        return
                open_ends.pop(src, None)
                sel.unregister(src)
                try:
                    dst.shutdown(socket.SHUT_WR)
                except OSError:
                    pass


# ---------------------------------------------------------------------------------------------
# The node's proxy, created on first use.

_node_proxy: EgressProxy | None = None
_node_lock = threading.Lock()
SOCKET_DIR_PREFIX = "paddock-egress-"
OWNER_LOCK = ".owner.lock"


def _own_socket_dir(parent: str | None = None) -> tuple[str, int]:
    """A fresh socket directory under `parent` (default: the temp dir) and the fd of its owner
    lock, held for the life of this process. Directories left by a node agent that died without
    cleaning up (SIGKILL, node reboot of a shared /tmp) are swept first: their lock is free."""
    parent = parent or tempfile.gettempdir()
    sweep_socket_dirs(parent)
    socket_dir = tempfile.mkdtemp(prefix=SOCKET_DIR_PREFIX, dir=parent)
    fd = os.open(os.path.join(socket_dir, OWNER_LOCK), os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    return socket_dir, fd


def sweep_socket_dirs(parent: str) -> list[str]:
    """Remove the socket directories under `parent` whose owner lock no process holds; returns
    their paths. A directory without an owner lock (another tool's, or one being created) is
    left alone."""
    swept = []
    try:
        names = [n for n in os.listdir(parent) if n.startswith(SOCKET_DIR_PREFIX)]
    except OSError:
        return swept
    for name in names:
        path = os.path.join(parent, name)
        try:
            fd = os.open(os.path.join(path, OWNER_LOCK), os.O_RDWR | os.O_CLOEXEC | os.O_NOFOLLOW)
        except OSError:
            continue
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            os.close(fd)
            continue                      # its owner is alive
        try:
            shutil.rmtree(path, ignore_errors=True)
            swept.append(path)
        finally:
            os.close(fd)
    if swept:
        log.info("egress: swept %d socket dir(s) left by dead node agents", len(swept))
    return swept


def node_proxy(socket_dir: str | None = None) -> EgressProxy:
    """This process's egress proxy (one per node agent), created on first use."""
    global _node_proxy
    with _node_lock:
        if _node_proxy is None:
            own_dir = socket_dir is None
            if own_dir:
                socket_dir, lock_fd = _own_socket_dir()
            _node_proxy = proxy = EgressProxy(socket_dir)

            def _cleanup() -> None:
                proxy.close_all()
                if own_dir:
                    shutil.rmtree(socket_dir, ignore_errors=True)
                    os.close(lock_fd)
            atexit.register(_cleanup)
        return _node_proxy


def set_node_proxy(proxy: EgressProxy | None) -> EgressProxy | None:
    """Install `proxy` as this process's node proxy (the agent's config, or a test's); returns
    the previous one."""
    global _node_proxy
    with _node_lock:
        previous, _node_proxy = _node_proxy, proxy
    return previous


def open_for_task(network: object, sandbox: str) -> str | None:
    """The egress socket for a task's sandbox: None for network "none" (no socket, no route);
    else the node proxy's socket for `sandbox`. `controller.contracts.network.PolicyError` names a
    malformed policy."""
    policy = parse_policy(network)
    return None if policy.none else node_proxy().open(sandbox, policy)


def decisions_for(sandbox: str) -> list[dict]:
    return _node_proxy.decisions(sandbox) if _node_proxy is not None else []


def close_for_task(sandbox: str) -> list[dict]:
    return _node_proxy.close(sandbox) if _node_proxy is not None else []


__all__ = ["EgressError", "EgressProxy", "close_for_task", "decisions_for", "node_addresses", "node_proxy",
           "open_for_task", "set_node_proxy", "sweep_socket_dirs", "system_resolver"]
