"""The gateway carries the rollout's trace to the model server: each request has a W3C
`traceparent` whose parent is the call's model_call span, the id the trajectory writer gives
that span. Real sockets: the gateway's upstream client against an HTTP server on 127.0.0.1."""
from __future__ import annotations

import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from nodeagent.gateway.session import GatewayBudgets, Session, Upstream
from nodeagent.store import tracing

SPANS = [{"kind": "sandbox_start", "name": "native", "step": 0, "start_s": 0.0, "duration_s": 0.1},
         {"kind": "model_call", "name": "m", "step": 0, "start_s": 0.1, "duration_s": 0.1},
         {"kind": "tool_call", "name": "bash", "step": 0, "start_s": 0.2, "duration_s": 0.1},
         {"kind": "model_call", "name": "m", "step": 1, "start_s": 0.3, "duration_s": 0.1}]


class RecordingServer:
    """Chat completions on loopback; the first `refuse` requests get a 503 (a weight update);
    every request's `traceparent` header (or None) is kept in order."""

    def __init__(self, refuse: int = 0) -> None:
        self.traceparents: list[str | None] = []
        outer, left = self, [refuse]

        class H(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def do_POST(self):
                self.rfile.read(int(self.headers["Content-Length"]))
                outer.traceparents.append(self.headers.get("traceparent"))
                if left[0] > 0:
                    left[0] -= 1
                    status, body = 503, json.dumps({"error": {"message": "loading", "code": "model_loading"}})
                else:
                    status, body = 200, json.dumps({
                        "id": "x", "object": "chat.completion", "model": "m",
                        "choices": [{"index": 0, "finish_reason": "stop",
                                     "message": {"role": "assistant", "content": "ok"}}],
                        "usage": {"prompt_tokens": 1, "completion_tokens": 1}})
                blob = body.encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(blob)))
                self.end_headers()
                self.wfile.write(blob)

            def log_message(self, *a):
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), H)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/v1"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


def _session(url: str, trace=None) -> Session:
    return Session(Upstream(7, url, "m"), GatewayBudgets(max_calls=10, max_tokens=10_000, wall_s=30.0),
                   sleep=lambda s: None, trace=trace)


def test_each_model_call_carries_the_traceparent_of_its_model_call_span():
    srv = RecordingServer(refuse=1)
    ctx = tracing.attempt_context("run-a", "r1", 1, 4)
    s = _session(srv.url, ctx)
    try:
        for _ in range(2):
            s.complete({"model": "m", "messages": [{"role": "user", "content": "hi"}]}, 10.0)
    finally:
        s.close()
        srv.close()
    assert [r["retries"] for r in s.rows] == [1, 0]
    got = [tracing.parse_traceparent(tp) for tp in srv.traceparents]
    assert all(g is not None for g in got), srv.traceparents
    assert {g.trace_id for g in got} == {tracing.trace_id("run-a", "r1")}
    # the retried call is one call: one span id for both of its requests
    tree = tracing.with_ids(SPANS, "run-a", "r1", 1, 4)
    model_spans = [r["span_id"] for r in tree if r["kind"] == "model_call"]
    assert [g.span_id for g in got] == [model_spans[0], model_spans[0], model_spans[1]]
    assert {r["parent_span_id"] for r in tree} == {ctx.span_id}


def test_a_session_without_a_trace_sends_no_traceparent():
    srv = RecordingServer()
    s = _session(srv.url)
    try:
        s.complete({"model": "m", "messages": [{"role": "user", "content": "hi"}]}, 10.0)
    finally:
        s.close()
        srv.close()
    assert srv.traceparents == [None]
