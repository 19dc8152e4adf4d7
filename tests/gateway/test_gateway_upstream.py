"""The gateway's kept upstream connection (nodeagent/gateway/upstream.py) and the scripted
policy's bash dialect (controller/demo/bash_dialect.py, what a bash-only harness is sent)."""
from __future__ import annotations

import json
import socket
import subprocess
import threading

import pytest

from controller.demo import bash_dialect
from controller.demo.policy_server import PolicyServer
from controller.taskbank.builtin import builtin_taskset
from nodeagent.gateway.server import GatewayServer
from nodeagent.gateway.session import GatewayBudgets, Session, Upstream
from nodeagent.gateway.upstream import KeepAliveModel
from nodeagent.harness.model import ModelError, ModelTimeout

TASKSET = builtin_taskset()
PY_TASK = TASKSET.by_name()["python/reverse_words"]
REPLY = {"id": "x", "object": "chat.completion", "choices": [
    {"index": 0, "message": {"role": "assistant", "content": "hi"}, "finish_reason": "stop"}]}
PAYLOAD = {"model": "scripted-v0", "messages": [{"role": "user", "content": PY_TASK.instruction}]}


class OneShotServer:
    """Answers each connection's first request, then closes it with no `Connection: close`
    (a keep-alive timeout on the server); `answer=False` never answers. Counts connections."""

    def __init__(self, answer: bool = True) -> None:
        self.sock = socket.create_server(("127.0.0.1", 0))
        self.answer, self.accepted = answer, 0
        self.url = f"http://127.0.0.1:{self.sock.getsockname()[1]}/v1"
        threading.Thread(target=self._serve, daemon=True).start()

    def _serve(self) -> None:
        while True:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            self.accepted += 1
            with conn:
                data = b""
                while b"\r\n\r\n" not in data:
                    data += conn.recv(65536)
                if not self.answer:
                    while conn.recv(65536):
                        pass
                    continue
                blob = json.dumps(REPLY).encode()
                conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: "
                             + str(len(blob)).encode() + b"\r\n\r\n" + blob)

    def close(self) -> None:
        self.sock.close()


def test_calls_to_one_endpoint_share_one_connection():
    with PolicyServer(TASKSET) as policy:
        client = KeepAliveModel(policy.url)
        client.complete(PAYLOAD, 10)
        sock = client._sock
        client.complete(PAYLOAD, 10)
        assert client._sock is sock and sock is not None
        client.close()


def test_a_connection_the_server_closed_while_idle_is_reopened_and_the_call_sent_again():
    srv = OneShotServer()
    try:
        client = KeepAliveModel(srv.url)
        assert client.complete(PAYLOAD, 10)["id"] == "x"
        assert client.complete(PAYLOAD, 10)["id"] == "x"
        assert srv.accepted == 2
    finally:
        srv.close()


def test_a_server_that_does_not_answer_is_cut_at_the_deadline():
    srv = OneShotServer(answer=False)
    try:
        with pytest.raises(ModelTimeout):
            KeepAliveModel(srv.url).complete(PAYLOAD, 0.3)
    finally:
        srv.close()


def test_an_error_reply_carries_its_status_and_body():
    with PolicyServer(TASKSET) as policy:
        with pytest.raises(ModelError) as exc:
            KeepAliveModel(policy.url).complete(dict(PAYLOAD, model="no-such-model"), 10)
    assert exc.value.status == 404 and exc.value.body["error"]["code"] == "model_not_found"


def test_the_bash_dialect_is_for_a_request_whose_one_tool_is_bash():
    bash = {"type": "function", "function": {"name": "bash", "parameters": {}}}
    assert bash_dialect.wants_bash([bash])
    assert not bash_dialect.wants_bash([bash, {"type": "function", "function": {"name": "shell"}}])
    assert not bash_dialect.wants_bash(None)


def test_the_bash_dialect_finds_the_task_inside_the_harness_template():
    tasks = {t.instruction: t for t in TASKSET.tasks}
    text = f"Please solve this issue: {PY_TASK.instruction}\n\nYou can execute bash commands."
    assert bash_dialect.find_task(tasks, text) is PY_TASK
    assert bash_dialect.find_task(tasks, "nothing of the kind") is None


def test_a_file_written_in_the_bash_dialect_has_exactly_its_bytes(tmp_path):
    content = "a 'quoted' $HOME `x` \\n;\n\nno final newline"
    path = tmp_path / "we ird;name.py"
    cmd = bash_dialect.command_of("write_file", {"path": str(path), "content": content})
    subprocess.run(["sh", "-c", cmd], check=True)
    assert path.read_text() == content
    assert bash_dialect.command_of(None, {}) == "echo COMPLETE_TASK_AND_SUBMIT_FINAL_OUTPUT"


def test_a_server_that_ignores_stream_is_read_as_one_stream():
    srv = OneShotServer()
    try:
        events = list(KeepAliveModel(srv.url).stream(dict(PAYLOAD, stream=True), 10))
    finally:
        srv.close()
    assert events[-1] == b"[DONE]"
    assert json.loads(events[0])["choices"][0]["delta"]["content"] == "hi"
    assert [c["choices"][0]["finish_reason"] for c in map(json.loads, events[:-1]) if c["choices"]] == [None, "stop"]


def test_the_gateway_front_answers_malformed_http_with_400_and_keeps_serving():
    s = Session(Upstream(0, "http://127.0.0.1:9/v1", "m"), GatewayBudgets(5, 1000, 5.0))
    with GatewayServer(s, tcp=("127.0.0.1", 0), require_key=False) as gw:
        port = int(gw.url.rsplit(":", 1)[1].split("/")[0])
        for bad in (b"GARBAGE\r\n\r\n", b"POST /v1/chat/completions HTTP/1.1\r\nNo colon here\r\n\r\n",
                    b"POST /v1/chat/completions HTTP/1.1\r\nContent-Length: 2\r\n\r\n{]"):
            with socket.create_connection(("127.0.0.1", port), timeout=5) as c:
                c.sendall(bad)
                assert c.recv(65536).split(b" ", 2)[1] == b"400", bad
        with socket.create_connection(("127.0.0.1", port), timeout=5) as c:
            c.sendall(b"GET /v1/models HTTP/1.1\r\nHost: x\r\n\r\n")
            assert c.recv(65536).startswith(b"HTTP/1.1 200 OK\r\n")
    assert s.calls == 0


def test_streamed_calls_share_one_connection():
    with PolicyServer(TASKSET) as policy:
        client = KeepAliveModel(policy.url)
        for _ in range(3):
            events = client.stream(dict(PAYLOAD, stream=True), 10)
            for data in events:
                if data == b"[DONE]":
                    break                 # a consumer that stops at [DONE]
            events.close()
            if _ == 0:
                sock = client._sock
        assert client._sock is sock and sock is not None
        client.close()
