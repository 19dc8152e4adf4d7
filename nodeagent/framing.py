"""Length-prefixed JSON messages over a stream socket, with bytes carried as base64.

Used between the node agent, its namespace holder (zygote), each sandbox's builder and the
sandbox's init. Every read is bounded by `max_bytes`; a peer that sends more, or garbage, gets
a FramingError, never an unbounded allocation. No Paddock imports.
"""
from __future__ import annotations

import base64
import json
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
    if fds:
        socket.send_fds(sock, [data[:_HDR.size]], fds)
        sock.sendall(data[_HDR.size:])
    else:
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


def recv_msg(sock: socket.socket, max_bytes: int = DEFAULT_MAX_BYTES, with_fds: bool = False):
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
        raise FramingError(f"message of {size} bytes exceeds the limit of {max_bytes}")
    try:
        obj = json.loads(_recv_exact(sock, size), object_hook=_hook)
    except ValueError as exc:
        raise FramingError(f"malformed message: {exc}") from None
    return (obj, fds) if with_fds else obj
