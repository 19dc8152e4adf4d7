"""Red team s13m B1/B2: one deeply nested JSON-RPC line or tool argument is a clear error for
that line; `paddock tools mcp` keeps serving and `Toolbox.call` raises only SandboxError."""
from __future__ import annotations

import io
import json

from nodeagent.harness.tools import McpServer, Toolbox

DEEP = "[" * 100_000 + "]" * 100_000


def test_a_deeply_nested_line_gets_a_parse_error_and_the_server_goes_on():
    lines = ['{"jsonrpc": "2.0", "id": 1, "method": "tools/list", "params": ' + DEEP + "}",
             json.dumps({"jsonrpc": "2.0", "id": 2, "method": "tools/call",
                         "params": {"name": "shell", "arguments": "{\"command\": " + "[" * 3000 + "]" * 3000 + "}"}}),
             json.dumps({"jsonrpc": "2.0", "id": 3, "method": "tools/list"})]
    out = io.StringIO()
    McpServer(Toolbox(None, ["read_file"])).serve(io.StringIO("\n".join(lines) + "\n"), out)
    replies = [json.loads(x) for x in out.getvalue().splitlines()]
    assert replies[0]["error"]["code"] == -32700 and "nested too deeply" in replies[0]["error"]["message"]
    assert replies[1]["id"] == 2 and replies[1]["result"]["isError"]
    assert replies[2]["id"] == 3 and [t["name"] for t in replies[2]["result"]["tools"]] == ["read_file"]


def test_toolbox_call_refuses_nested_arguments_instead_of_raising():
    res = Toolbox(None).call("shell", '{"command": ' + "[" * 2000 + "]" * 2000 + "}")
    assert res.error is not None and "nested too deeply" in res.observation
