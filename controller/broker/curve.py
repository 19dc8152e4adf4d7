"""CURVE on the controller's ROUTER socket: the run's keys made (or loaded) at start, the ZAP
handler that lets in only the run's client key, and the count of every peer turned away.

- `ensure_run_keys(path)`: the run's key file (controller/ondisk/keys.py has its format and
  the permission checks): loaded if it exists (a restarted controller keeps the keys its agents
  and clients hold), else two fresh key pairs written 0600.
- `Gate(ctx, sock, keys)`: makes `sock` a CURVE server, answers ZAP requests (RFC 27) on the
  context's `inproc://zeromq.zap.01` -- 200 for the run's client public key, 400 for any
  other -- and watches the socket's monitor for failed handshakes (a peer without CURVE, with
  the wrong server key, or denied by ZAP). A refused peer gets no answer at all (libzmq closes
  the connection during the handshake). Both sockets are read by the controller's own loop
  (`Gate.sockets()` are polled with the ROUTER; `Gate.service()` when one is readable), so
  there is no thread; every failure is counted in the controller's counters
  (`denied_handshakes` and one per kind, shown by `status` and the metrics) and logged, at
  most once a second with the number since the last line.

Must not import: sqlite3, controller.store, controller.cli, nodeagent.
"""
from __future__ import annotations

import logging
import struct
import time
from collections import Counter
from pathlib import Path

import zmq
from zmq.utils import z85

from controller.ondisk.keys import RunKeys, read_key_file, write_key_file

log = logging.getLogger("controller.curve")

ZAP_ENDPOINT = "inproc://zeromq.zap.01"  # where libzmq asks (fixed by RFC 27)
_FAILED = {int(zmq.EVENT_HANDSHAKE_FAILED_NO_DETAIL): "no_detail",
           int(zmq.EVENT_HANDSHAKE_FAILED_PROTOCOL): "protocol",
           int(zmq.EVENT_HANDSHAKE_FAILED_AUTH): "auth"}
_MONITORED = int(zmq.EVENT_HANDSHAKE_FAILED_NO_DETAIL | zmq.EVENT_HANDSHAKE_FAILED_PROTOCOL
                 | zmq.EVENT_HANDSHAKE_FAILED_AUTH)
MAX_EVENTS_PER_PASS = 256  # monitor events and ZAP requests read per loop pass (a flood waits)
LOG_EVERY_S = 1.0


def new_run_keys() -> RunKeys:
    """Two fresh Curve25519 key pairs (libzmq's generator)."""
    server_public, server_secret = zmq.curve_keypair()
    client_public, client_secret = zmq.curve_keypair()
    return RunKeys(server_public.decode(), server_secret.decode(), client_public.decode(),
                   client_secret.decode())


def ensure_run_keys(path: str | Path) -> RunKeys:
    """The key file at `path`, made (0600) if there is none. KeyFileError (naming the path and
    the fix) if the existing one has the wrong owner or permissions."""
    if not Path(path).exists() and not Path(path).is_symlink():
        if write_key_file(path, new_run_keys()):
            log.info("made the run's CURVE keys in %s", path)
    return read_key_file(path)


class Gate:
    """CURVE server setup, the ZAP handler and the handshake-failure monitor of one ROUTER."""

    def __init__(self, ctx: zmq.Context, sock: zmq.Socket, keys: RunKeys, counters: Counter,
                 clock=time.monotonic):
        self.allowed = {z85.decode(keys.client_public.encode())}
        self.counters, self.clock = counters, clock
        self.zap = ctx.socket(zmq.REP)
        self.zap.setsockopt(zmq.LINGER, 0)
        self.zap.bind(ZAP_ENDPOINT)  # before the first handshake can ask
        sock.setsockopt(zmq.CURVE_SERVER, 1)
        sock.setsockopt(zmq.CURVE_SECRETKEY, keys.server_secret.encode())
        sock.setsockopt(zmq.CURVE_PUBLICKEY, keys.server_public.encode())
        sock.setsockopt(zmq.ZAP_DOMAIN, b"paddock")
        self.sock = sock
        self.monitor = sock.get_monitor_socket(_MONITORED)
        self._unlogged: Counter = Counter()  # failure kind -> count since the last log line
        self._denied_from: set[str] = set()  # addresses ZAP turned away since the last line
        self._last_log = float("-inf")

    def sockets(self) -> tuple[zmq.Socket, zmq.Socket]:
        return self.zap, self.monitor

    def service(self) -> None:
        """Answer the waiting ZAP requests and count the failed handshakes (bounded)."""
        for _ in range(MAX_EVENTS_PER_PASS):
            try:
                self._answer(self.zap.recv_multipart(zmq.NOBLOCK))
            except zmq.Again:
                break
        for _ in range(MAX_EVENTS_PER_PASS):
            try:
                event = self.monitor.recv_multipart(zmq.NOBLOCK)
            except zmq.Again:
                break
            self._failed(event)
        self._log()

    def _answer(self, req: list[bytes]) -> None:
        """RFC 27: version, request id, domain, address, identity, mechanism, credentials."""
        if len(req) < 6:
            log.warning("malformed ZAP request (%d frames)", len(req))
            return  # a REP socket must answer before the next request: cannot happen here
        version, request_id, _domain, address, _identity, mechanism = req[:6]
        key = req[6] if len(req) > 6 else b""
        ok = mechanism == b"CURVE" and key in self.allowed
        if not ok:
            if len(self._denied_from) < 16:
                self._denied_from.add(address.decode(errors="replace"))
            log.debug("ZAP: denied %s key %s", address, z85.encode(key) if len(key) == 32 else key)
        self.zap.send_multipart([version, request_id, b"200" if ok else b"400",
                                 b"OK" if ok else b"unknown key", b"run" if ok else b"", b""])

    def _failed(self, event: list[bytes]) -> None:
        if len(event) != 2 or len(event[0]) != 6:
            return
        event_id, value = struct.unpack("=hi", event[0])
        kind = _FAILED.get(event_id & 0xFFFF)
        if kind is None:
            return
        self.counters["denied_handshakes"] += 1
        self.counters[f"denied_handshakes_{kind}"] += 1
        self._unlogged[f"{kind} (error {value:#x})"] += 1

    def _log(self) -> None:
        if not self._unlogged or self.clock() - self._last_log < LOG_EVERY_S:
            return
        self._last_log = self.clock()
        what = ", ".join(f"{n} x {k}" for k, n in sorted(self._unlogged.items()))
        where = f"; unknown keys from {', '.join(sorted(self._denied_from))}" \
            if self._denied_from else ""
        log.warning("refused peers without the run's key: %s%s (total %d)", what, where,
                    self.counters["denied_handshakes"])
        self._unlogged.clear()
        self._denied_from.clear()

    def close(self) -> None:
        """Stop monitoring and close the gate's sockets (before the ROUTER is closed)."""
        self.sock.disable_monitor()
        self.monitor.close(linger=0)
        self.zap.close(linger=0)
