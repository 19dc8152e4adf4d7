"""A model server outside Paddock for the agent tests: chat completions over the OpenAI wire
format whose every reply is the tool call `command` says now (a shell command), a final answer
when `command` is None, or no answer for `hang_s` seconds when `command` is HANG. The tests
switch `command` while it serves; `requests` counts calls."""
from __future__ import annotations

import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Optional

HANG = "<hang>"


class ToolPolicy:
    def __init__(self, command: Optional[str] = "sleep 30") -> None:
        self.command, self.requests, self.hang_s = command, 0, 30.0
        self.released = threading.Event()
        outer = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *a):
                pass

            def do_POST(self):
                self.rfile.read(int(self.headers["Content-Length"]))
                outer.requests += 1
                cmd = outer.command
                if cmd == HANG:
                    outer.released.wait(outer.hang_s)
                    cmd = None
                msg: dict = {"role": "assistant", "content": "done" if cmd is None else ""}
                if cmd is not None:
                    msg["tool_calls"] = [{"id": f"c{outer.requests}", "type": "function",
                                          "function": {"name": "shell",
                                                       "arguments": json.dumps({"command": cmd, "timeout_s": 60})}}]
                body = json.dumps({"choices": [{"index": 0, "message": msg, "finish_reason": "stop"}],
                                   "usage": {"prompt_tokens": 5, "completion_tokens": 5}}).encode()
                try:
                    self.send_response(200)
                    self.send_header("Content-Type", "application/json")
                    self.send_header("Content-Length", str(len(body)))
                    self.end_headers()
                    self.wfile.write(body)
                except OSError:     # the client gave up (a cancelled attempt shut its connection)
                    self.close_connection = True

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.httpd.daemon_threads = True
        threading.Thread(target=self.httpd.serve_forever, daemon=True).start()
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}/v1"

    def close(self) -> None:
        self.released.set()
        self.httpd.shutdown()
        self.httpd.server_close()
