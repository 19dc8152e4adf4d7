"""Harness step latency: Paddock's agent loop vs a bare loop, one run, same model server.

The model server is a local stand-in on 127.0.0.1 answering every request with one `shell`
tool call (`echo ok`), so the figures are the harness's own cost per step:
- paddock: `run_agent` in a sandbox of the busybox image — request with the tool set, reply
  checked, call validated against its JSON Schema, command run in the sandbox (exec through the
  monitor), observation capped, step row and spans recorded;
- bare: the same HTTP request with `urllib`, `json.loads`, and `subprocess.run(["sh", "-c",
  "echo ok"])` on the host (no validation, no sandbox, no record).
Prints p50 and p99 per step (ms) and the ratio of the p50s.

    .venv/bin/python benchmarks/harness_step.py [--steps 200]
"""
from __future__ import annotations

import argparse
import json
import subprocess
import threading
import time
import urllib.request
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from layers.builtin import default_store_root, ensure_busybox_image
from layers.store import ImageStore
from nodeagent.harness.loop import run_agent
from nodeagent.sandbox.runtime import SandboxRuntime, SandboxSpec

REPLY = json.dumps({"choices": [{"index": 0, "finish_reason": "tool_calls", "message": {
    "role": "assistant", "content": "", "tool_calls": [{"id": "c0", "type": "function", "function": {
        "name": "shell", "arguments": json.dumps({"command": "echo ok"})}}]}}],
    "usage": {"prompt_tokens": 1, "completion_tokens": 1}}).encode()


class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def log_message(self, *a):
        pass

    def do_POST(self):
        self.rfile.read(int(self.headers["Content-Length"]))
        self.send_response(200)
        self.send_header("Content-Length", str(len(REPLY)))
        self.end_headers()
        self.wfile.write(REPLY)


def pct(xs, q):
    xs = sorted(xs)
    return xs[min(int(q * len(xs)), len(xs) - 1)]


def bare_step(url: str) -> None:
    req = urllib.request.Request(url + "/chat/completions", data=json.dumps({"messages": []}).encode(),
                                 headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=30) as resp:
        body = json.loads(resp.read())
    call = body["choices"][0]["message"]["tool_calls"][0]["function"]
    subprocess.run(["sh", "-c", json.loads(call["arguments"])["command"]], capture_output=True, timeout=30)


def main(argv=None):
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, default=200)
    n = ap.parse_args(argv).steps
    httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    url = f"http://127.0.0.1:{httpd.server_address[1]}/v1"
    image = ensure_busybox_image(ImageStore(default_store_root()))[1]
    try:
        with SandboxRuntime() as rt:
            sb = rt.create(SandboxSpec(image=image))
            try:
                res = run_agent(sb, "bench", url, "m", 0, {"max_steps": n, "wall_s": 3600})
            finally:
                sb.destroy()
        assert res.stop_reason == "max_steps" and res.tool_errors == 0, res.stop_reason
        paddock = [s["wall_s"] * 1000 for s in res.steps]
        model = [s["model_s"] * 1000 for s in res.steps]
        tool = [s["tool_s"] * 1000 for s in res.steps]
        bare = []
        for _ in range(n):
            t = time.perf_counter()
            bare_step(url)
            bare.append((time.perf_counter() - t) * 1000)
    finally:
        httpd.shutdown()
        httpd.server_close()
    print(f"harness step latency, {n} steps (ms)")
    print(f"  bare loop (urllib + host subprocess)  p50 {pct(bare, .5):7.3f}  p99 {pct(bare, .99):7.3f}  1.00x")
    print(f"  paddock run_agent (sandboxed)         p50 {pct(paddock, .5):7.3f}  p99 {pct(paddock, .99):7.3f}  "
          f"{pct(paddock, .5) / pct(bare, .5):.2f}x")
    print(f"    of which model call                 p50 {pct(model, .5):7.3f}  p99 {pct(model, .99):7.3f}")
    print(f"    of which tool call (sandbox exec)   p50 {pct(tool, .5):7.3f}  p99 {pct(tool, .99):7.3f}")


if __name__ == "__main__":
    main()
