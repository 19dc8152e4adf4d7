"""Shared test utilities, the one copy of each: `wait_for` (a condition with a deadline, never a
bare sleep), `FakeClock` (an injectable monotonic clock), `alive`, `FakeChatServer`, the
scripted policy server `FakeModel` (`reply(...)` builds its replies; the `fake` fixture closes
them), `codec_round_trip` (a frame through both codec paths), and the fixtures: the image store, the built-in images and a node's sandbox runtime. Tests live in
tests/<room>/ (docs/internals.md, "Tests: one folder per room")."""
from __future__ import annotations

import json
import os
import shutil
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

pytest_plugins = ["tests.slurm_fixture"]


def wait_for(cond, timeout_s: float, what: str, interval_s: float = 0.05):
    """Poll `cond()` until it returns something true (returned), or fail after `timeout_s`
    naming `what`. For conditions another process or thread makes true."""
    deadline = time.monotonic() + timeout_s
    while True:
        value = cond()
        if value:
            return value
        if time.monotonic() >= deadline:
            raise AssertionError(f"timed out after {timeout_s}s waiting for {what}")
        time.sleep(interval_s)


def alive(pid: int) -> bool:
    """Whether process `pid` runs: false once it has exited, whether still a zombie (Z) or being
    reaped at this moment (X: its parent's wait has begun and /proc still shows it)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] not in ("Z", "X", "x")
    except (FileNotFoundError, ProcessLookupError):
        return False


class FakeClock:
    """A clock the test moves: `clock()` reads `now`, `advance(dt_s)` moves it forward."""

    def __init__(self, now: float = 1_700_000_000.0) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now

    def advance(self, dt_s: float) -> None:
        self.now += dt_s


def wire_frame(msg_type: str, body: dict, dep: str, **envelope) -> bytes:
    """A protocol frame as a peer would send it (envelope fields overridable)."""
    f = {"v": 1, "dep": dep, "type": msg_type, "id": "m1", "body": body}
    f.update(envelope)
    return json.dumps(f).encode()


def codec_round_trip(msg, dep: str, monkeypatch) -> None:
    """`msg` through both codec paths: the hand-built frame and the generic encoder's each decode
    to `msg`, and both frames hold the same JSON."""
    from controller.contracts import codec
    from controller.contracts import protocol as p
    fast = p.encode(msg, dep)
    assert p.decode(fast, dep) == msg
    with monkeypatch.context() as m:
        m.setattr(codec, "_FAST_BODY", {})
        m.setattr(codec, "_FAST_BUILD", {})
        generic = p.encode(msg, dep)
        assert p.decode(fast, dep) == p.decode(generic, dep) == msg
    assert json.loads(fast) == json.loads(generic)


def sandbox_prerequisites() -> str | None:
    """Why real sandboxes cannot run here, or None when they can."""
    if not shutil.which("squashfuse"):
        return "squashfuse is not installed (run `make setup`)"
    if not os.access("/dev/fuse", os.R_OK | os.W_OK) or (os.stat("/dev/fuse").st_mode & 0o006) != 0o006:
        return "/dev/fuse is not usable by unprivileged users (run `make setup`)"
    try:
        from nodeagent.sandbox.runtime import subid_range
        subid_range()
    except Exception as exc:  # noqa: BLE001 - reported as the skip reason
        return str(exc)
    return None


@pytest.fixture(scope="session")
def image_store():
    from layers.builtin import default_store_root
    from layers.store import ImageStore
    return ImageStore(default_store_root())


@pytest.fixture(scope="session")
def busybox_image(image_store):
    from layers.builtin import ensure_busybox_image
    return ensure_busybox_image(image_store)[1]


@pytest.fixture(scope="session")
def python_image(image_store):
    from layers.builtin import ensure_builtin_image
    return ensure_builtin_image(image_store)[1]


@pytest.fixture(scope="module")
def solving_policy():
    """The scripted policy server over the built-in task set, whose version 7 solves every
    python task (the other strategies weigh nothing): a run through it passes by construction."""
    from controller.demo.policy_server import STRATEGIES, PolicyServer, default_params
    from controller.taskbank.builtin import builtin_taskset
    with PolicyServer(builtin_taskset()) as srv:
        params = default_params()
        params["python"] = {s: (60.0 if s == "solve" else 0.0) for s in STRATEGIES["python"]}
        srv.set_policy(7, params)
        yield srv


@pytest.fixture(scope="session")
def runtime():
    reason = sandbox_prerequisites()
    if reason:
        pytest.fail(f"sandbox prerequisites missing: {reason}")
    from nodeagent.sandbox.runtime import SandboxRuntime
    rt = SandboxRuntime().start()
    yield rt
    rt.close()


def reply(content="", calls=(), usage=(10, 5), logprobs=None):
    msg = {"role": "assistant", "content": content}
    if calls:
        msg["tool_calls"] = [{"id": f"c{i}", "type": "function", "function": {"name": n, "arguments": a}}
                             for i, (n, a) in enumerate(calls)]
    return {"choices": [{"index": 0, "message": msg, "logprobs": logprobs,
                         "finish_reason": "tool_calls" if calls else "stop"}],
            "usage": {"prompt_tokens": usage[0], "completion_tokens": usage[1]}}


class FakeModel:
    """The policy's model server (outside Paddock), scripted: a chat-completions server answering
    each request with the next behaviour of a script (the last one repeats). Behaviours: a dict
    (the JSON reply, e.g. `reply(...)`), ("raw", status, bytes), ("hang",) — never answers until
    the test ends —, ("trickle",) — headers, then one byte. Every request body is kept in
    `requests`; `tool_replies()` are the tool messages of the last one."""

    def __init__(self, script, get=None):
        self.script, self.requests, self.release = list(script), [], threading.Event()
        self.get, self.probes = get, []     # GET (health, models): None = no route (501), ("raw", ...), ("hang",)
        outer = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *a):
                pass

            def send(self, status: int, data: bytes) -> None:
                self.send_response(status)
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def do_GET(self):
                outer.probes.append(self.path)
                b = outer.get
                if b is None:
                    self.send_error(501)
                    return
                if b[0] == "hang":
                    outer.release.wait(30)
                    return
                self.send(b[1], b[2])

            def do_POST(self):
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                outer.requests.append(body)
                b = outer.script[min(len(outer.requests), len(outer.script)) - 1]
                if isinstance(b, dict):
                    b = ("raw", 200, json.dumps(b).encode())
                if b[0] == "hang":
                    outer.release.wait(30)
                    return
                if b[0] == "trickle":
                    self.send_response(200)
                    self.send_header("Content-Length", "1000")
                    self.end_headers()
                    self.wfile.write(b"{")
                    self.wfile.flush()
                    outer.release.wait(30)
                    return
                self.send(b[1], b[2])

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.httpd.daemon_threads = True
        threading.Thread(target=self.httpd.serve_forever, daemon=True).start()
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}/v1"

    def tool_replies(self) -> list[str]:
        return [m["content"] for m in self.requests[-1]["messages"] if m.get("role") == "tool"]

    def close(self):
        self.release.set()
        self.httpd.shutdown()
        self.httpd.server_close()


@pytest.fixture
def fake():
    """fake(*script, get=None) -> a FakeModel, closed at the end of the test."""
    servers = []

    def make(*script, get=None):
        servers.append(FakeModel(script, get))
        return servers[-1]
    yield make
    for s in servers:
        s.close()


class FakeChatServer:
    """A chat-completions server on loopback for the model servers outside Paddock (a judge, a
    user simulator): `answer(request) -> (HTTP status, reply text)` decides each reply; every
    request body is kept in `requests`. Close it with `close()`."""

    def __init__(self, answer, model: str = "fake", usage=(1, 1)):
        import json
        import threading
        from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
        self.requests: list[dict] = []
        outer = self

        class H(BaseHTTPRequestHandler):
            def do_POST(self):
                req = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                outer.requests.append(req)
                status, text = answer(req)
                body = json.dumps({"id": "x", "object": "chat.completion", "model": req.get("model", model),
                                   "choices": [{"index": 0, "finish_reason": "stop",
                                                "message": {"role": "assistant", "content": text}}],
                                   "usage": {"prompt_tokens": usage[0], "completion_tokens": usage[1]}}).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *a):
                pass
        self.server = ThreadingHTTPServer(("127.0.0.1", 0), H)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/v1"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def close(self):
        self.server.shutdown()
        self.server.server_close()
