"""MCP for rollouts: a task's MCP servers run inside its sandbox (stdio and streamable HTTP),
the harness offers their tools through the official MCP SDK's client, checked, capped and
bounded like the built-in tools, and nothing of them outlives the rollout."""
from __future__ import annotations

import json

import pytest

from controller.contracts.tasks import LeaseTask
from nodeagent.agent.replay import ReplayModel
from nodeagent.harness.loop import run_agent
from nodeagent.harness.mcptools import McpConfigError, McpRollout, McpStartError, mcp_servers
from nodeagent.sandbox.runtime import SandboxSpec
from tests.conftest import wait_for

# A minimal MCP server over stdio (JSON-RPC lines), standard library only: the image has no `mcp`.
CALC = r'''
import json, sys, time
TOOLS = [
  {"name": "add", "description": "Add two integers.", "inputSchema": {"type": "object",
   "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}}, "required": ["a", "b"],
   "additionalProperties": False}},
  {"name": "big", "inputSchema": {"type": "object", "properties": {"n": {"type": "integer", "minimum": 0}}}},
  {"name": "fail", "inputSchema": {"type": "object"}},
  {"name": "slow", "inputSchema": {"type": "object", "properties": {"s": {"type": "number"}}}},
]
def result(name, a):
    with open("/tmp/calc-calls", "a") as f:
        f.write(name + "\n")
    if name == "add":
        return {"content": [{"type": "text", "text": str(a["a"] + a["b"])}], "isError": False}
    if name == "big":
        return {"content": [{"type": "text", "text": "x" * a["n"]}], "isError": False}
    if name == "slow":
        time.sleep(a["s"])
        return {"content": [{"type": "text", "text": "late"}], "isError": False}
    return {"content": [{"type": "text", "text": "it broke"}], "isError": True}
for line in sys.stdin:
    msg = json.loads(line)
    if "id" not in msg:
        continue
    m, p = msg["method"], msg.get("params") or {}
    if m == "initialize":
        res = {"protocolVersion": p.get("protocolVersion"), "capabilities": {"tools": {}},
               "serverInfo": {"name": "calc", "version": "1"}}
    elif m == "tools/list":
        res = {"tools": TOOLS}
    elif m == "tools/call":
        res = result(p["name"], p.get("arguments") or {})
    elif m == "ping":
        res = {}
    else:
        print(json.dumps({"jsonrpc": "2.0", "id": msg["id"], "error": {"code": -32601, "message": m}}), flush=True)
        continue
    print(json.dumps({"jsonrpc": "2.0", "id": msg["id"], "result": res}), flush=True)
'''

# A minimal streamable-HTTP MCP server (JSON responses), standard library only.
NOTES = r'''
import json, sys
from http.server import BaseHTTPRequestHandler, HTTPServer
TOOLS = [{"name": "echo", "description": "Echo a text.", "inputSchema": {"type": "object",
          "properties": {"text": {"type": "string", "maxLength": 50}}, "required": ["text"]}}]
class H(BaseHTTPRequestHandler):
    def log_message(self, *a):
        pass
    def do_GET(self):
        self.send_response(405); self.send_header("Content-Length", "0"); self.end_headers()
    do_DELETE = do_GET
    def do_POST(self):
        if self.path != "/mcp":
            self.send_response(404); self.send_header("Content-Length", "0"); self.end_headers(); return
        msg = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        if "id" not in msg:
            self.send_response(202); self.send_header("Content-Length", "0"); self.end_headers(); return
        m, p = msg["method"], msg.get("params") or {}
        if m == "initialize":
            res = {"protocolVersion": p.get("protocolVersion"), "capabilities": {"tools": {}},
                   "serverInfo": {"name": "notes", "version": "1"}}
        elif m == "tools/list":
            res = {"tools": TOOLS}
        elif m == "tools/call":
            res = {"content": [{"type": "text", "text": "echo: " + p["arguments"]["text"]}], "isError": False}
        else:
            res = {}
        body = json.dumps({"jsonrpc": "2.0", "id": msg["id"], "result": res}).encode()
        self.send_response(200); self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body))); self.end_headers(); self.wfile.write(body)
HTTPServer(("127.0.0.1", int(sys.argv[1])), H).serve_forever()
'''

# Processes in the sandbox that are a server or a link (the brackets keep grep from counting itself).
COUNT = "grep -l -e '/work/mcp/[c]alc' -e '/work/mcp/[n]otes' -e '[s]bxlink' /proc/[0-9]*/cmdline 2>/dev/null | wc -l"

CONFIG = {"servers": {"calc": {"transport": "stdio", "command": ["python3", "/work/mcp/calc.py"]},
                      "notes": {"transport": "http", "command": ["python3", "/work/mcp/notes.py", "8765"],
                                "port": 8765, "path": "/mcp"}},
          "call_timeout_s": 1.5}


def _task(config=CONFIG, **over) -> LeaseTask:
    d = {"task_id": "sha256:" + "ab" * 32, "name": "mcp/demo", "instruction": "use the tools",
         "files": {".paddock/mcp.json": json.dumps(config), "mcp/calc.py": CALC, "mcp/notes.py": NOTES},
         "budgets": {"max_steps": 10, "wall_s": 60, "observation_bytes": 2000}}
    d.update(over)
    return LeaseTask.decode(d)


class Recording:
    """The recorded-messages policy, keeping what the harness offered it."""

    def __init__(self, steps):
        self.inner, self.payloads = ReplayModel(steps), []

    def complete(self, payload, timeout_s):
        self.payloads.append(json.loads(json.dumps(payload)))
        return self.inner.complete(payload, timeout_s)


def _step(i, *calls, content=""):
    return {"step": i, "role": "assistant", "content": content, "prompt_tokens": 1, "completion_tokens": 1,
            "tool_name": ",".join(c[0] for c in calls) or None, "logprobs": None,
            "tool_args": json.dumps([{"id": f"c{i}.{j}", "name": n, "arguments": a}
                                     for j, (n, a) in enumerate(calls)]) if calls else None}


@pytest.mark.sandbox
def test_run_agent_offers_and_calls_the_tasks_mcp_servers_inside_its_sandbox(runtime, python_image):
    task = _task()
    mcp = McpRollout.of(task)
    sb = runtime.create(SandboxSpec(image=python_image, files=dict(task.files), egress_socket=mcp.relay(None)))
    try:
        toolbox = mcp.toolbox(sb, task)
        steps = [_step(0, ("mcp__calc__add", '{"a": 2, "b": 3}'), ("mcp__notes__echo", '{"text": "hi"}')),
                 _step(1, ("mcp__calc__add", '{"a": "two", "b": 3}'), ("mcp__calc__big", '{"n": 50000}'),
                       ("mcp__calc__fail", "{}"), ("mcp__notes__echo", '{"text": "' + "y" * 60 + '"}')),
                 _step(2, ("mcp__calc__slow", '{"s": 4}'), ("mcp__notes__echo", '{"text": "still here"}')),
                 _step(3, ("shell", json.dumps({"command": "cat /tmp/calc-calls; " + COUNT}))),
                 _step(4, content="done")]
        model = Recording(steps)
        res = run_agent(sb, task.instruction, model, "m", 0, task.budgets, toolbox=toolbox)
        offered = {t["function"]["name"]: t["function"] for t in model.payloads[0]["tools"]}
        assert {"shell", "read_file", "mcp__calc__add", "mcp__calc__big", "mcp__notes__echo"} <= set(offered)
        assert offered["mcp__calc__add"]["parameters"]["required"] == ["a", "b"]       # the schema, passed through
        assert offered["mcp__notes__echo"]["description"] == "Echo a text."
        assert res.steps[0]["observation"].split("\n") == ["5", "echo: hi"]                                             # stdio and streamable HTTP
        one = res.steps[1]["observation"]
        assert "error: invalid arguments for mcp__calc__add at a: 'two' is not of type 'integer'" in one
        assert "[output truncated at 2000 bytes]" in one and res.steps[1]["observation_truncated"]
        assert "error: it broke" in one
        assert "invalid arguments for mcp__notes__echo at text" in one                  # maxLength: not sent
        two = res.steps[2]["observation"]
        assert "error: mcp__calc__slow did not answer within 1.5 s" in two and two.endswith("\necho: still here")
        calls, running = res.steps[3]["observation"].rsplit("\n", 2)[0], res.steps[3]["observation"].split()[-1]
        assert calls.split() == ["add", "big", "fail", "slow"]                   # refused calls never ran
        assert int(running) == 4       # in the sandbox: the two servers and their two links
        assert res.stop_reason == "stop" and res.tool_errors == 4
        mcp.close()
        wait_for(lambda: sb.exec(["sh", "-c", COUNT]).stdout.decode().split() == ["0"], 10,
                 "the servers and their links to end")                                  # closing ends them
    finally:
        mcp.close()
        sb.destroy()


@pytest.mark.sandbox
def test_a_server_that_does_not_start_is_an_infrastructure_error_naming_it(runtime, python_image):
    task = _task({"servers": {"dead": {"transport": "stdio", "command": ["python3", "-c", "import sys; sys.exit(3)"],
                                       "start_timeout_s": 5}}})
    mcp = McpRollout.of(task)
    sb = runtime.create(SandboxSpec(image=python_image, files=dict(task.files), egress_socket=mcp.relay(None)))
    try:
        with pytest.raises(McpStartError, match="MCP server 'dead'"):
            mcp.toolbox(sb, task)
    finally:
        mcp.close()
        sb.destroy()


@pytest.mark.parametrize("config, message", [
    ("{not json", "is not JSON"),
    ({"servers": {}}, "'servers' must be a non-empty object"),
    ({"servers": {"a b": {"transport": "stdio", "command": ["x"]}}}, "server name 'a b'"),
    ({"servers": {"a": {"transport": "sse", "command": ["x"]}}}, "servers.a.transport must be 'stdio' or 'http'"),
    ({"servers": {"a": {"transport": "stdio", "command": "python3 x.py"}}}, "servers.a.command must be a non-empty list"),
    ({"servers": {"a": {"transport": "http", "command": ["x"]}}}, "servers.a.port must be a number"),
    ({"servers": {"a": {"transport": "http", "command": ["x"], "port": 3128}}}, "other than 3128"),
    ({"servers": {"a": {"transport": "stdio", "command": ["x"], "port": 80}}}, "port and path are for transport 'http'"),
    ({"servers": {"a": {"transport": "stdio", "command": ["x"], "cmd": 1}}}, "unknown key(s) ['cmd']"),
    ({"servers": {"a": {"transport": "stdio", "command": ["x"]}}, "call_timeout_s": 0}, "call_timeout_s must be"),
])
def test_a_malformed_declaration_is_a_task_error_naming_the_key(config, message):
    files = {".paddock/mcp.json": config if isinstance(config, str) else json.dumps(config)}
    with pytest.raises(McpConfigError) as err:
        mcp_servers(files)
    assert message in str(err.value) and ".paddock/mcp.json" in str(err.value)


def test_a_task_without_the_declaration_gets_no_mcp():
    assert McpRollout.of(_task(files={"a.py": "x"})) is None
    assert mcp_servers({}) == ((), 30.0)


@pytest.mark.sandbox
def test_a_rollout_of_a_task_with_mcp_servers_calls_them_and_is_graded(runtime, python_image, tmp_path):
    from controller.taskbank.builtin import builtin_taskset
    from nodeagent.agent.attempt import Attempt, run_attempt
    t = builtin_taskset().by_name()["python/gcd"]
    task = dict(t.canonical(), task_id=t.task_id, image_digest="sha256:" + python_image.stem)
    task["files"] = dict(task["files"], **{".paddock/mcp.json": json.dumps({"servers": {"calc": CONFIG["servers"]["calc"]}}),
                                          "mcp/calc.py": CALC})
    steps = [_step(0, ("mcp__calc__add", '{"a": 20, "b": 22}')), _step(1, content="done")]
    a = Attempt("r", str(tmp_path), "ro-mcp", 1, 1, "b", 0, task, 0, ReplayModel(steps), "m")  # type: ignore[arg-type]
    result = run_attempt(runtime, python_image, "node-a", a)
    assert result.infra_reason is None and result.outcome in ("pass", "fail")
    import pyarrow.parquet as pq
    rows = pq.read_table(tmp_path / result.shards["steps"]).to_pylist()
    assert rows[0]["tool_name"] == "mcp__calc__add" and rows[0]["observation"] == "42"
    bad = dict(task, files=dict(task["files"], **{".paddock/mcp.json": '{"servers": {"x": {"transport": "sse"}}}'}))
    a = Attempt("r", str(tmp_path), "ro-bad", 1, 1, "b", 0, bad, 0, ReplayModel(steps), "m")  # type: ignore[arg-type]
    result = run_attempt(runtime, python_image, "node-a", a)
    assert result.outcome == "infra_error"
    assert result.infra_reason.startswith("task: .paddock/mcp.json: servers.x.transport must be 'stdio' or 'http'")
