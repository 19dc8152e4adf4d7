"""The gateway's OpenAI-compatible HTTP front for one rollout's `Session`.

`GatewayServer(session).start()` listens on a fresh Unix socket (`path`, mode 0666 so that
the sandbox's relay, running as a subordinate uid, can connect) or, for benchmarks and tests,
on TCP (`tcp=("127.0.0.1", 0)`). A sandbox given the socket as its relay target
(`SandboxSpec.egress_socket`) reaches it as `IN_SANDBOX_BASE_URL` (http://127.0.0.1:3128/v1):
no network is opened.

Routes: `POST /v1/chat/completions` (the reply forwarded as the model server sent its bytes;
with `stream: true` answered as one SSE stream of the
finished reply: `wire.sse`), `GET /v1/models` (the rollout's model). A request must carry the
session's key (`Authorization: Bearer <key>`) when `require_key` is set. Errors are OpenAI error
bodies: 400 bad request, 401 wrong key, 429 `budget_exhausted` (with the budget's kind), 502 the
model server failed, 504 it timed out. Must not import: zmq, nodeagent.agent.
"""
from __future__ import annotations

import json
import logging
import os
import socket
import socketserver
import tempfile
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from nodeagent.gateway import wire
from nodeagent.gateway.session import BudgetExhausted, Session
from nodeagent.harness.model import MODEL_TIMEOUT_S, ModelError, ModelTimeout

log = logging.getLogger(__name__)

IN_SANDBOX_BASE_URL = "http://127.0.0.1:3128/v1"
MAX_REQUEST_BYTES = 16 * 1024 * 1024


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"          # keep-alive: one thread per client connection
    server: "_Server"

    def log_message(self, fmt: str, *args: Any) -> None:
        if log.isEnabledFor(logging.DEBUG):
            log.debug("gateway %s", fmt % args)

    def address_string(self) -> str:          # AF_UNIX peers have no (host, port)
        return "sandbox"

    def _send(self, status: int, blob: bytes, ctype: str = "application/json") -> None:
        """Status line, headers and body in one write."""
        self.log_request(status)
        head = (f"HTTP/1.1 {status} {self.responses.get(status, ('',))[0]}\r\nContent-Type: {ctype}\r\n"
                f"Content-Length: {len(blob)}\r\n")
        if self.close_connection:
            head += "Connection: close\r\n"
        self.wfile.write(head.encode("latin-1") + b"\r\n" + blob)

    def _error(self, status: int, message: str, code: str | None = None, kind: str = "invalid_request_error") -> None:
        self._send(status, json.dumps({"error": {"message": message, "type": kind, "param": None,
                                                 "code": code}}).encode())

    def _route(self) -> str:
        """The request's path; an absolute URI (a client that used the relay as its proxy) is
        reduced to its path."""
        path = self.path
        if path.startswith("http://"):
            path = "/" + path.split("/", 3)[3] if path.count("/") >= 3 else "/"
        return path.split("?", 1)[0].rstrip("/")

    def do_GET(self) -> None:
        if self._route() in ("/v1/models", "/models"):
            up = self.server.session._upstream()
            self._send(200, json.dumps({"object": "list", "data": [
                {"id": up.model, "object": "model", "created": 0, "owned_by": "paddock"}]}).encode())
        else:
            self._error(404, f"no route GET {self.path}", "not_found")

    def do_POST(self) -> None:
        if self._route() not in ("/v1/chat/completions", "/chat/completions"):
            return self._error(404, f"no route POST {self.path}", "not_found")
        session = self.server.session
        if self.server.require_key and self.headers.get("Authorization", "") != f"Bearer {session.key}":
            return self._error(401, "wrong or missing API key", "invalid_api_key", "authentication_error")
        try:
            length = int(self.headers.get("Content-Length", ""))
        except ValueError:
            return self._error(411, "a Content-Length header is required")
        if length > MAX_REQUEST_BYTES:
            self.close_connection = True
            return self._error(413, f"request body of {length} bytes exceeds {MAX_REQUEST_BYTES}")
        try:
            payload = json.loads(self.rfile.read(length))
            wire.check_request(payload)
        except (ValueError, wire.WireError) as exc:
            return self._error(400, f"bad request: {exc}")
        try:
            body, raw = session.complete_raw(payload, MODEL_TIMEOUT_S)
        except BudgetExhausted as exc:
            return self._error(429, str(exc), f"budget_exhausted:{exc.kind}", "budget_exhausted")
        except ModelTimeout as exc:
            return self._error(504, str(exc), "model_timeout", "server_error")
        except ModelError as exc:
            return self._error(502, str(exc), "model_server_error", "server_error")
        if payload.get("stream"):
            usage = bool((payload.get("stream_options") or {}).get("include_usage"))
            return self._send(200, wire.sse(body, usage), "text/event-stream")
        self._send(200, raw if raw is not None else json.dumps(body).encode())    # as the server sent it


class _Server(ThreadingHTTPServer):
    daemon_threads = True
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

    def get_request(self):                  # http.server wants a (host, port) client address
        conn, _ = self.socket.accept()
        return conn, ("sandbox", 0)


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
