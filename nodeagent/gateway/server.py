"""The gateway's OpenAI-compatible HTTP front for one rollout's `Session`.

`GatewayServer(session).start()` listens on a fresh Unix socket (`path`, mode 0666 so that
the sandbox's relay, running as a subordinate uid, can connect) or, for benchmarks and tests,
on TCP (`tcp=("127.0.0.1", 0)`). A sandbox given the socket as its relay target
(`SandboxSpec.egress_socket`) reaches it as `IN_SANDBOX_BASE_URL` (http://127.0.0.1:3128/v1):
no network is opened.

Routes: `POST /v1/chat/completions` (the reply forwarded as the model server sent its bytes;
with `stream: true` streamed from the model server and forwarded event by event as SSE:
`Session.stream`), `GET /v1/models` (the rollout's model). A request must carry the
session's key (`Authorization: Bearer <key>`) when `require_key` is set. Errors are OpenAI error
bodies: 400 bad request, 401 wrong key, 429 `budget_exhausted` (with the budget's kind), 502 the
model server failed, 504 it timed out; a context overflow (any server's wording) is a 400 with
code `context_length_exceeded`, as OpenAI says it, and another 4xx of the model server (not 401
or 403: the node's credentials) is passed on with its status (`model_server_refused`), so a
harness sees the refusal of what it sent. Must not import: zmq, nodeagent.agent.
"""
from __future__ import annotations

import json
import logging
import os
import socket
import socketserver
import tempfile
import threading
from typing import Any

from nodeagent.gateway import http1, wire
from nodeagent.gateway.session import BudgetExhausted, Session
from nodeagent.harness.model import MODEL_TIMEOUT_S, ContextLengthExceeded, ModelError, ModelTimeout

log = logging.getLogger(__name__)

IN_SANDBOX_BASE_URL = "http://127.0.0.1:3128/v1"
MAX_REQUEST_BYTES = 16 * 1024 * 1024


class _Handler(socketserver.StreamRequestHandler):
    """HTTP/1.1 with keep-alive, one thread per client connection; heads read by `http1`
    (no `email` parsing), every reply written in one send."""
    server: "_Server"
    rbufsize = 65536

    def handle(self) -> None:
        while True:
            try:
                head = http1.read_head(self.rfile)
            except http1.FramingError as exc:
                self.closing = True
                return self._error(400, f"bad request: {exc}")
            except OSError:
                return
            if head is None:
                return
            line, headers = head
            parts = line.split(" ")
            if len(parts) != 3 or not parts[2].startswith("HTTP/1."):
                self.closing = True
                return self._error(400, f"bad request line {line[:80]!r}")
            method, self.target, proto = parts
            conn = headers.get("connection", "").lower()
            self.closing = "close" in conn or (proto == "HTTP/1.0" and "keep-alive" not in conn)
            try:
                if method == "GET":
                    self._get()
                elif method == "POST":
                    self._post(headers)
                else:
                    self.closing = True
                    self._error(405 if method.isalpha() else 400, f"method {method[:20]} not allowed", "not_found")
            except OSError:
                return                  # the client went away
            if self.closing:
                return

    def _send(self, status: int, blob: bytes, ctype: str = "application/json") -> None:
        """Status line, headers and body in one write."""
        hdrs = {"Content-Type": ctype, "Content-Length": str(len(blob))}
        if self.closing:
            hdrs["Connection"] = "close"
        self.wfile.write(http1.head_bytes(status, hdrs) + blob)
        if log.isEnabledFor(logging.DEBUG):
            log.debug("gateway %s %d", self.target, status)

    def _error(self, status: int, message: str, code: str | None = None, kind: str = "invalid_request_error") -> None:
        self._send(status, json.dumps({"error": {"message": message, "type": kind, "param": None,
                                                 "code": code}}).encode())

    def _route(self) -> str:
        """The request's path; an absolute URI (a client that used the relay as its proxy) is
        reduced to its path."""
        path = self.target
        if path.startswith("http://"):
            path = "/" + path.split("/", 3)[3] if path.count("/") >= 3 else "/"
        return path.split("?", 1)[0].rstrip("/")

    def _get(self) -> None:
        if self._route() in ("/v1/models", "/models"):
            up = self.server.session._upstream()
            self._send(200, json.dumps({"object": "list", "data": [
                {"id": up.model, "object": "model", "created": 0, "owned_by": "paddock"}]}).encode())
        else:
            self._error(404, f"no route GET {self.target}", "not_found")

    def _post(self, headers: dict[str, str]) -> None:
        try:
            length = http1.content_length(headers)
        except http1.FramingError:
            length = None
        if length is None:
            self.closing = True
            return self._error(411, "a Content-Length header is required")
        if length > MAX_REQUEST_BYTES:
            self.closing = True
            return self._error(413, f"request body of {length} bytes exceeds {MAX_REQUEST_BYTES}")
        if headers.get("expect", "").lower() == "100-continue":
            self.wfile.write(b"HTTP/1.1 100 Continue\r\n\r\n")
        blob = self.rfile.read(length)
        if len(blob) < length:
            self.closing = True
            return
        if self._route() not in ("/v1/chat/completions", "/chat/completions"):
            return self._error(404, f"no route POST {self.target}", "not_found")
        session = self.server.session
        if self.server.require_key and headers.get("authorization", "") != f"Bearer {session.key}":
            return self._error(401, "wrong or missing API key", "invalid_api_key", "authentication_error")
        try:
            payload = json.loads(blob)
            wire.check_request(payload)
        except (ValueError, wire.WireError) as exc:
            return self._error(400, f"bad request: {exc}")
        if payload.get("stream"):
            return self._stream(session, payload)
        try:
            session.forward(payload, MODEL_TIMEOUT_S, lambda raw: self._send(200, raw))  # as the server sent it
        except (BudgetExhausted, ModelError) as exc:
            if not getattr(exc, "forwarded", False):       # else the client has the reply already
                self._error(*_refusal(exc))

    def _stream(self, session: Session, payload: dict) -> None:
        """SSE over a chunked body, each event written as it comes from the model server; the
        head goes out with the first event, so a call refused before any event is a plain
        error reply. A failure after the first event ends the stream with an error event."""
        started, done = [False], [False]

        def emit(data: bytes) -> None:
            out = http1.chunk(b"data: " + data + b"\n\n")
            if data == b"[DONE]":           # the last chunk with it: the client is done now
                out += http1.chunk(b"")
                done[0] = True
            if not started[0]:
                started[0] = True
                hdrs = {"Content-Type": "text/event-stream", "Cache-Control": "no-cache",
                        "Transfer-Encoding": "chunked"}
                if self.closing:
                    hdrs["Connection"] = "close"
                out = http1.head_bytes(200, hdrs) + out
            self.wfile.write(out)
        try:
            session.stream(payload, MODEL_TIMEOUT_S, emit)
        except (BudgetExhausted, ModelError) as exc:
            if not started[0]:
                return self._error(*_refusal(exc))
            if done[0]:
                return                        # the stream was whole; the record says what failed
            status, message, code, kind = _refusal(exc)
            event = {"error": {"message": message, "type": kind, "param": None, "code": code}}
            self.wfile.write(http1.chunk(b"data: " + json.dumps(event).encode() + b"\n\n") + http1.chunk(b""))


def _refusal(exc: ModelError) -> tuple[int, str, str, str]:
    """(status, message, code, type) of the OpenAI error body for a failed call."""
    if isinstance(exc, BudgetExhausted):
        return 429, str(exc), f"budget_exhausted:{exc.kind}", "budget_exhausted"
    if isinstance(exc, ModelTimeout):
        return 504, str(exc), "model_timeout", "server_error"
    if isinstance(exc, ContextLengthExceeded):    # in OpenAI's words, whatever the server said
        return 400, str(exc), "context_length_exceeded", "invalid_request_error"
    if exc.status is not None and 400 <= exc.status < 500 and exc.status not in (401, 403):
        return exc.status, str(exc), "model_server_refused", "invalid_request_error"   # the request's content
    return 502, str(exc), "model_server_error", "server_error"


class _Server(socketserver.ThreadingTCPServer):
    daemon_threads = True
    allow_reuse_address = True
    session: Session
    require_key: bool

    def get_request(self):                  # TCP: a reply is one write, sent at once (no Nagle)
        conn, addr = self.socket.accept()
        conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        return conn, addr


class _UnixServer(socketserver.ThreadingMixIn, socketserver.UnixStreamServer):
    daemon_threads = True
    session: Session
    require_key: bool


class GatewayServer:
    """Serve one Session over HTTP until `stop()`."""

    def __init__(self, session: Session, socket_dir: str | None = None,
                 tcp: tuple[str, int] | None = None, require_key: bool = True) -> None:
        self.session, self._tcp, self._require_key = session, tcp, require_key
        self._dir = socket_dir
        self._own_dir: str | None = None
        self.path: str | None = None
        self._httpd: Any = None
        self._thread: threading.Thread | None = None

    @property
    def url(self) -> str:
        """The base URL from the host (TCP only)."""
        host, port = self._httpd.server_address[:2]
        return f"http://{host}:{port}/v1"

    def start(self) -> "GatewayServer":
        if self._tcp is not None:
            httpd: Any = _Server(self._tcp, _Handler)
        else:
            if self._dir is None:
                self._own_dir = self._dir = tempfile.mkdtemp(prefix="paddock-gw-")
                os.chmod(self._dir, 0o711)
            self.path = os.path.join(self._dir, f"gw-{os.getpid()}-{id(self):x}.sock")
            httpd = _UnixServer(self.path, _Handler)
            os.chmod(self.path, 0o666)      # the sandbox's relay runs as a subordinate uid
        httpd.session, httpd.require_key = self.session, self._require_key
        self._httpd = httpd
        self._thread = threading.Thread(target=httpd.serve_forever, name="model-gateway", daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        if self._httpd is None:
            return
        self._httpd.shutdown()
        self._httpd.server_close()
        if self._thread is not None:
            self._thread.join()
        if self.path:
            try:
                os.unlink(self.path)
            except FileNotFoundError:
                pass
        if self._own_dir:
            os.rmdir(self._own_dir)
        self._httpd = self._thread = None

    def __enter__(self) -> "GatewayServer":
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


__all__ = ["GatewayServer", "IN_SANDBOX_BASE_URL"]
