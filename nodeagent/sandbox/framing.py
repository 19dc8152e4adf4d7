"""Length-prefixed JSON messages over a stream socket, with bytes carried as base64.

Used between the node agent, its namespace holder (zygote), each sandbox's builder and the
sandbox's init. Every read is bounded by `max_bytes`; a peer that sends more, or garbage, gets
a FramingError, never an unbounded allocation. No Paddock imports.
"""
from __future__ import annotations

import base64
import json
import os
import socket
import struct
from typing import Any

_HDR = struct.Struct("!I")
DEFAULT_MAX_BYTES = 64 * 1024 * 1024


class FramingError(Exception):
    """The peer closed the stream or sent a malformed or oversized message."""


def _default(obj: Any) -> Any:
    if isinstance(obj, (bytes, bytearray)):
        return {"__b64__": base64.b64encode(bytes(obj)).decode()}
    raise TypeError(f"cannot encode {type(obj).__name__}")


def _hook(d: dict) -> Any:
    if len(d) == 1 and "__b64__" in d:
        return base64.b64decode(d["__b64__"])
    return d


def send_msg(sock: socket.socket, obj: Any, fds: list[int] | None = None) -> None:
    payload = json.dumps(obj, default=_default, separators=(",", ":")).encode()
    data = _HDR.pack(len(payload)) + payload
    if fds:   # the whole frame in the same message as the fds: the peer wakes once
        data = data[socket.send_fds(sock, [data], fds):]
    if data:
        sock.sendall(data)


def _recv_exact(sock: socket.socket, n: int) -> bytes:
    chunks, got = [], 0
    while got < n:
        chunk = sock.recv(min(n - got, 1 << 20))
        if not chunk:
            raise FramingError("peer closed the connection")
        chunks.append(chunk)
        got += len(chunk)
    return b"".join(chunks)


def _recv_frame(sock: socket.socket, max_bytes: int, with_fds: bool) -> tuple[bytes, list[int]]:
    """One length-prefixed frame's body, and the fds that came with its header. An oversized
    frame closes those fds and raises FramingError."""
    fds: list[int] = []
    if with_fds:
        hdr, fds, _flags, _addr = socket.recv_fds(sock, _HDR.size, 4)
        if not hdr:
            raise FramingError("peer closed the connection")
        if len(hdr) < _HDR.size:
            hdr += _recv_exact(sock, _HDR.size - len(hdr))
    else:
        hdr = _recv_exact(sock, _HDR.size)
    (size,) = _HDR.unpack(hdr)
    if size > max_bytes:
        for fd in fds:
            os.close(fd)
        raise FramingError(f"message of {size} bytes exceeds the limit of {max_bytes}")
    return _recv_exact(sock, size), fds


def recv_msg(sock: socket.socket, max_bytes: int = DEFAULT_MAX_BYTES, with_fds: bool = False):
    body, fds = _recv_frame(sock, max_bytes, with_fds)
    try:
        obj = json.loads(body, object_hook=_hook)
    except ValueError as exc:
        raise FramingError(f"malformed message: {exc}") from None
    return (obj, fds) if with_fds else obj


# -- records: the native sandbox init's wire format (nodeagent/sandbox/native/sbxinit.c) -------------
# A frame is the same u32 length followed by records: a one-byte tag, a u32 length, the bytes.
# Exec request tags: a (argv, repeated), e (env "K=V", repeated), c (cwd), i (stdin),
# t (timeout ms), o (output cap), u (uid). Reply: x (exit code), T (timed out), r (truncated),
# w (wall µs), 1 (stdout), 2 (stderr). Setup stages: s (stage name), m (error message).
_REC = struct.Struct("!cI")


def encode_records(records: list[tuple[str, bytes]]) -> bytes:
    body = b"".join(_REC.pack(tag.encode(), len(val)) + val for tag, val in records)
    return _HDR.pack(len(body)) + body


def decode_records(body: bytes) -> dict[str, list[bytes]]:
    out: dict[str, list[bytes]] = {}
    off = 0
    while off < len(body):
        if len(body) - off < _REC.size:
            raise FramingError("truncated record header")
        tag, n = _REC.unpack_from(body, off)
        off += _REC.size
        if n > len(body) - off:
            raise FramingError("record runs past its frame")
        out.setdefault(tag.decode("latin-1"), []).append(body[off:off + n])
        off += n
    return out


def send_records(sock: socket.socket, records: list[tuple[str, bytes]], fds: list[int] | None = None) -> None:
    data = encode_records(records)
    if fds:   # the whole frame in the same message as the fds (a reader may be non-blocking)
        data = data[socket.send_fds(sock, [data], fds):]
    if data:
        sock.sendall(data)


def recv_records(sock: socket.socket, max_bytes: int = DEFAULT_MAX_BYTES, with_fds: bool = False):
    """One frame of records as {tag: [values]} (and the fds that came with it)."""
    body, fds = _recv_frame(sock, max_bytes, with_fds)
    recs = decode_records(body)
    return (recs, fds) if with_fds else recs


def recv_waiting_fds(sock: socket.socket, max_bytes: int = 4096) -> list[int]:
    """The fds of every frame waiting on non-blocking `sock` (each sent whole, with its fds, in
    one message), until none is left or the peer closed."""
    fds: list[int] = []
    while True:
        try:
            fds += recv_records(sock, max_bytes=max_bytes, with_fds=True)[1]
        except (BlockingIOError, FramingError):
            return fds
