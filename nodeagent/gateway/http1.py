"""The gateway's HTTP/1.1 framing, both sides: a request's or a reply's head, a body by
Content-Length, chunked or (replies only) to the connection's close, and server-sent events.

Small on purpose: `http.server` and `http.client` parse headers through the `email` package
(~80 µs a message) and write the head and the body separately; the gateway does neither on
its per-call path. Heads are limited (MAX_HEAD_BYTES, MAX_HEADERS); a malformed one raises
`FramingError` naming what is wrong (the server answers 400). Must not import: zmq,
nodeagent.agent.
"""
from __future__ import annotations

from typing import BinaryIO, Iterator

MAX_HEAD_BYTES = 64 * 1024
MAX_HEADERS = 100
MAX_CHUNK_LINE = 1024
REASONS = {100: "Continue", 200: "OK", 400: "Bad Request", 401: "Unauthorized", 404: "Not Found", 405: "Method Not Allowed",
           411: "Length Required", 413: "Payload Too Large", 429: "Too Many Requests",
           500: "Internal Server Error", 502: "Bad Gateway", 503: "Service Unavailable",
           504: "Gateway Timeout"}


class FramingError(ValueError):
    """A message that is not HTTP/1.1 as the gateway accepts it."""


def read_head(rfile: BinaryIO) -> tuple[str, dict[str, str]] | None:
    """(start line, headers with lower-case names), or None when the peer closed before a
    request began. Repeated headers are joined with ', '."""
    line = rfile.readline(MAX_HEAD_BYTES + 1)
    while line in (b"\r\n", b"\n"):            # RFC 9112 2.2: ignore empty lines before a request
        line = rfile.readline(MAX_HEAD_BYTES + 1)
    if not line:
        return None
    if len(line) > MAX_HEAD_BYTES or not line.endswith(b"\n"):
        raise FramingError("start line too long or cut off")
    headers: dict[str, str] = {}
    size = len(line)
    while True:
        h = rfile.readline(MAX_HEAD_BYTES + 1)
        size += len(h)
        if size > MAX_HEAD_BYTES:
            raise FramingError(f"head longer than {MAX_HEAD_BYTES} bytes")
        if h in (b"\r\n", b"\n"):
            break
        if not h.endswith(b"\n"):
            raise FramingError("connection closed inside the head")
        name, sep, value = h.partition(b":")
        if not sep or not name or name != name.strip():
            raise FramingError(f"malformed header line {h[:80]!r}")
        key, val = name.decode("latin-1").lower(), value.strip().decode("latin-1")
        headers[key] = f"{headers[key]}, {val}" if key in headers else val
        if len(headers) > MAX_HEADERS:
            raise FramingError(f"more than {MAX_HEADERS} headers")
    return line.decode("latin-1").rstrip("\r\n"), headers


def content_length(headers: dict[str, str]) -> int | None:
    v = headers.get("content-length")
    if v is None:
        return None
    if not v.isdigit():
        raise FramingError(f"Content-Length {v[:40]!r} is not a number")
    return int(v)


def iter_chunked(rfile: BinaryIO, limit: int) -> Iterator[bytes]:
    """A chunked body's data, chunk by chunk (trailers skipped); at most `limit` bytes."""
    total = 0
    while True:
        line = rfile.readline(MAX_CHUNK_LINE)
        if not line.endswith(b"\n"):
            raise FramingError("chunk size line cut off")
        try:
            size = int(line.split(b";", 1)[0].strip(), 16)
        except ValueError:
            raise FramingError(f"bad chunk size {line[:40]!r}") from None
        if size == 0:
            while rfile.readline(MAX_HEAD_BYTES) not in (b"\r\n", b"\n", b""):
                pass
            return
        total += size
        if total > limit:
            raise FramingError(f"body longer than {limit} bytes")
        data = rfile.read(size)
        if len(data) < size or rfile.readline(3) not in (b"\r\n", b"\n"):
            raise FramingError("chunk cut off")
        yield data


def iter_body(rfile: BinaryIO, headers: dict[str, str], limit: int, reply: bool = True) -> Iterator[bytes]:
    """A body's bytes as they arrive: chunked, by Content-Length, or (a reply without either)
    until the peer closes."""
    if "chunked" in headers.get("transfer-encoding", "").lower():
        yield from iter_chunked(rfile, limit)
        return
    n = content_length(headers)
    if n is None and not reply:
        return
    if n is not None and n > limit:
        raise FramingError(f"body of {n} bytes exceeds {limit}")
    left = limit + 1 if n is None else n
    while left > 0:
        data = rfile.read1(min(left, 65536)) if hasattr(rfile, "read1") else rfile.read(min(left, 65536))
        if not data:
            if n is not None:
                raise FramingError(f"body cut off {left} bytes short")
            return
        left -= len(data)
        if n is None and left <= 0:
            raise FramingError(f"body longer than {limit} bytes")
        yield data


def read_body(rfile: BinaryIO, headers: dict[str, str], limit: int, reply: bool = True) -> bytes:
    n = content_length(headers)
    if n is not None and "chunked" not in headers.get("transfer-encoding", "").lower():
        if n > limit:
            raise FramingError(f"body of {n} bytes exceeds {limit}")
        data = rfile.read(n)
        if len(data) < n:
            raise FramingError(f"body cut off {n - len(data)} bytes short")
        return data
    return b"".join(iter_body(rfile, headers, limit, reply))


def iter_sse(pieces: Iterator[bytes]) -> Iterator[bytes]:
    """The `data` of each server-sent event (its `data:` lines joined by newlines), in order;
    comments and other fields are skipped."""
    buf = b""
    for piece in pieces:
        buf += piece
        while True:
            cut = _event_end(buf)
            if cut is None:
                break
            event, buf = buf[:cut[0]], buf[cut[1]:]
            data = [ln[5:].lstrip(b" ") if ln.startswith(b"data:") else None
                    for ln in event.replace(b"\r\n", b"\n").split(b"\n")]
            data = [d for d in data if d is not None]
            if data:
                yield b"\n".join(data)
    if buf.strip():
        data = [ln[5:].lstrip(b" ") for ln in buf.replace(b"\r\n", b"\n").split(b"\n") if ln.startswith(b"data:")]
        if data:
            yield b"\n".join(data)


def _event_end(buf: bytes) -> tuple[int, int] | None:
    """(end of the first event, start of the next) if `buf` holds a whole event."""
    best = None
    for sep in (b"\n\n", b"\r\n\r\n"):
        i = buf.find(sep)
        if i >= 0 and (best is None or i < best[0]):
            best = (i, i + len(sep))
    return best


def head_bytes(status: int, headers: dict[str, str]) -> bytes:
    """A reply's status line and headers, ending with the blank line."""
    lines = [f"HTTP/1.1 {status} {REASONS.get(status, 'Unknown')}"]
    lines += [f"{k}: {v}" for k, v in headers.items()]
    return ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1")


def chunk(data: bytes) -> bytes:
    """One chunk of a chunked body (b"" is the last chunk)."""
    return b"%X\r\n%s\r\n" % (len(data), data) if data else b"0\r\n\r\n"


__all__ = ["FramingError", "chunk", "content_length", "head_bytes", "iter_body", "iter_chunked",
           "iter_sse", "read_body", "read_head"]
