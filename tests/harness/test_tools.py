"""The agent's tools on a real sandbox: schemas enforced before anything runs, clear errors."""
from __future__ import annotations

import json

import pytest

from controller.contracts.tools import ALL_TOOLS, ToolSetError, definitions, tool_set
from nodeagent.harness.tools import MAX_ARGUMENT_BYTES, Toolbox
from nodeagent.sandbox.runtime import SandboxSpec

pytestmark = pytest.mark.sandbox

HOSTILE = "we ird; $(touch /work/pwned) 'q\"\n.txt"


@pytest.fixture(scope="module")
def sb(runtime, busybox_image):
    box = runtime.create(SandboxSpec(image=busybox_image, files={"a.py": b"x = 1\ny = 2\nx = 1\n"},
                                     limits={"memory_mb": 128, "pids": 32, "disk_mb": 16, "nofile": 128}))
    yield box
    box.destroy()


@pytest.fixture
def tb(sb):
    return Toolbox(sb, observation_bytes=256, timeout_s=5.0)


def call(tb, name, **args):
    return tb.call(name, json.dumps(args))


def test_every_tool_definition_is_an_openai_function_with_a_schema():
    defs = definitions()
    assert [d["function"]["name"] for d in defs] == list(ALL_TOOLS)
    assert all(d["type"] == "function" and d["function"]["parameters"]["type"] == "object" for d in defs)


def test_tool_set_is_chosen_per_task_and_unknown_names_are_refused(sb):
    assert tool_set(["search", "shell"]) == ("shell", "search")
    with pytest.raises(ToolSetError, match="browser"):
        tool_set(["shell", "browser"])
    only_read = Toolbox(sb, ["read_file"])
    r = call(only_read, "shell", command="id")
    assert r.error == "unknown_tool" and "read_file" in r.observation


def test_malformed_json_arguments_are_an_error_observation(tb):
    r = tb.call("shell", '{"command": "echo hi"')
    assert r.error == "malformed_json" and r.exit_code is None
    assert "not valid JSON" in r.observation


def test_schema_violations_name_the_field(tb):
    r = tb.call("write_file", json.dumps({"path": "x", "content": 3}))
    assert r.error == "invalid_arguments" and "content" in r.observation
    r = tb.call("shell", json.dumps({"command": "id", "sudo": True}))
    assert r.error == "invalid_arguments" and "sudo" in r.observation
    r = tb.call("read_file", "[1, 2]")
    assert r.error == "invalid_arguments"


def test_oversized_arguments_are_refused_before_parsing(tb):
    r = tb.call("write_file", json.dumps({"path": "big", "content": "x" * (MAX_ARGUMENT_BYTES + 1)}))
    assert r.error == "oversized_arguments" and str(MAX_ARGUMENT_BYTES) in r.observation
    assert call(tb, "read_file", path="big").error == "command_failed"


def test_shell_output_is_capped_and_the_cap_is_said(tb):
    r = call(tb, "shell", command="yes | head -c 5000")
    assert r.truncated and "[output truncated at 256 bytes]" in r.observation
    assert len(r.observation.encode()) < 320


def test_shell_timeout_kills_the_command(tb):
    r = call(tb, "shell", command="sleep 30", timeout_s=0.5)
    assert r.error == "timeout" and r.exit_code == 124 and "timed out" in r.observation


def test_write_then_read_a_hostile_path_without_shell_injection(tb):
    assert call(tb, "write_file", path=f"sub/{HOSTILE}", content="hello\n").error is None
    assert call(tb, "read_file", path=f"/work/sub/{HOSTILE}").observation == "hello\n"
    assert call(tb, "shell", command="ls /work/pwned").exit_code != 0


def test_read_file_line_window(tb):
    call(tb, "write_file", path="lines.txt", content="".join(f"{i}\n" for i in range(1, 11)))
    assert call(tb, "read_file", path="lines.txt", start_line=3, max_lines=2).observation == "3\n4\n"


def test_read_missing_file_is_an_error_observation(tb):
    r = call(tb, "read_file", path="nope.txt")
    assert r.error == "command_failed" and "nope.txt" in r.observation


def test_edit_replaces_exactly_one_match(tb):
    call(tb, "write_file", path="e.py", content="a = 1\nb = 2\n")
    r = call(tb, "edit", path="e.py", old="b = 2", new="b = 3")
    assert r.error is None
    assert call(tb, "read_file", path="e.py").observation == "a = 1\nb = 3\n"


def test_edit_refuses_zero_and_multiple_matches_unless_replace_all(tb):
    r = call(tb, "edit", path="a.py", old="z = 9", new="")
    assert r.error == "no_match" and "not found" in r.observation
    r = call(tb, "edit", path="a.py", old="x = 1", new="x = 5")
    assert r.error == "ambiguous_match" and "2 times" in r.observation
    assert call(tb, "edit", path="a.py", old="x = 1", new="x = 5", replace_all=True).error is None
    assert call(tb, "read_file", path="a.py").observation == "x = 5\ny = 2\nx = 5\n"


def test_list_and_search(tb):
    call(tb, "write_file", path="pkg/mod.py", content="def needle():\n    pass\n")
    listing = call(tb, "list", path="/work").observation.splitlines()
    assert "/work/pkg" in listing and "/work/pkg/mod.py" in listing
    r = call(tb, "search", pattern="def need(le)", path="pkg")
    assert r.error is None and r.observation.strip() == "/work/pkg/mod.py:1:def needle():"
    r = call(tb, "search", pattern="absent-text")
    assert r.exit_code == 1 and "no matches" in r.observation


# --- the same tools over MCP ---------------------------------------------------------------

def test_mcp_lists_the_task_tools_and_runs_calls_over_line_streams(sb):
    import io

    from nodeagent.harness.tools import McpServer
    lines = [{"jsonrpc": "2.0", "id": 1, "method": "initialize",
              "params": {"protocolVersion": "2024-11-05", "capabilities": {}, "clientInfo": {"name": "t"}}},
             {"jsonrpc": "2.0", "method": "notifications/initialized"},
             {"jsonrpc": "2.0", "id": 2, "method": "tools/list"},
             {"jsonrpc": "2.0", "id": 3, "method": "tools/call",
              "params": {"name": "read_file", "arguments": {"path": "mcp.txt", "max_lines": 1}}},
             {"jsonrpc": "2.0", "id": 4, "method": "tools/call", "params": {"name": "shell", "arguments": {}}},
             {"jsonrpc": "2.0", "id": 5, "method": "resources/list"}]
    inp = io.StringIO("\n".join(json.dumps(m) for m in lines) + "\n{not json\n")
    out = io.StringIO()
    Toolbox(sb).call("write_file", json.dumps({"path": "mcp.txt", "content": "one\ntwo\n"}))
    McpServer(Toolbox(sb, ["read_file", "search"])).serve(inp, out)
    replies = [json.loads(x) for x in out.getvalue().splitlines()]
    assert [r.get("id") for r in replies] == [1, 2, 3, 4, 5, None]     # no reply to the notification
    assert replies[0]["result"]["protocolVersion"] == "2024-11-05"
    assert [t["name"] for t in replies[1]["result"]["tools"]] == ["read_file", "search"]
    assert replies[2]["result"] == {"content": [{"type": "text", "text": "one\n"}], "isError": False}
    assert replies[3]["result"]["isError"] and "unknown tool 'shell'" in replies[3]["result"]["content"][0]["text"]
    assert replies[4]["error"]["code"] == -32601 and replies[5]["error"]["code"] == -32700


def test_paddock_tools_mcp_serves_a_fresh_sandbox_over_stdio(busybox_image):
    import subprocess
    import sys
    msgs = [{"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {"protocolVersion": "2025-06-18"}},
            {"jsonrpc": "2.0", "id": 2, "method": "tools/call",
             "params": {"name": "shell", "arguments": {"command": "hostname; ls /work | wc -l"}}}]
    r = subprocess.run([sys.executable, "-c", "import sys; from controller.cli.main import main; sys.exit(main())",
                        "tools", "mcp", "--image", str(busybox_image), "--tools", "shell"],
                       input="".join(json.dumps(m) + "\n" for m in msgs), capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    replies = [json.loads(x) for x in r.stdout.splitlines()]
    assert replies[1]["result"] == {"content": [{"type": "text", "text": "sandbox\n0\n"}], "isError": False}


def test_seeded_garbage_arguments_are_always_refused_or_parsed_never_raised(sb):
    import random
    rng = random.Random(8)
    tb = Toolbox(sb)
    atoms = [None, True, 0, -1, 10**40, 1.5, float("inf"), "", "x", "ü\x00", [], {}, [1, "a"], {"path": 3}]

    def value(depth=0):
        if depth > 2 or rng.random() < 0.5:
            return rng.choice(atoms)
        if rng.random() < 0.5:
            return [value(depth + 1) for _ in range(rng.randint(0, 3))]
        return {rng.choice(["path", "command", "old", "new", "pattern", "depth", "zzz"]): value(depth + 1)
                for _ in range(rng.randint(0, 4))}
    for _ in range(400):
        name = rng.choice(list(ALL_TOOLS) + ["", None, 7, "Shell"])
        raw = rng.choice([json.dumps(value(), allow_nan=True), "{", "[]", "null", '"str"', "\ud800", 5, None])
        args, refused = tb.parse(name, raw)
        assert (args is None) != (refused is None)
        if refused is not None:
            assert refused.observation.startswith("error: ") and refused.error


# -- files of any size: never a silent truncation ----------------------------------------------

def _megabyte_text() -> str:
    return "".join(f"line {i:07d} of a large source file\n" for i in range(30000))   # ~1 MB


def test_write_file_stores_a_1mb_file_whole(sb):
    data = _megabyte_text()
    r = call(Toolbox(sb), "write_file", path="big/write.txt", content=data)
    assert r.error is None and f"wrote {len(data)} bytes" in r.observation
    assert sb.read_file("/work/big/write.txt", max_bytes=4 << 20) == data.encode()


def test_edit_of_a_1mb_file_changes_one_line_and_keeps_the_rest(sb):
    data = _megabyte_text()
    sb.write_files({"/work/big/edit.txt": data.encode()})
    r = call(Toolbox(sb), "edit", path="big/edit.txt", old="line 0029999 of", new="LAST LINE of")
    assert r.error is None
    stored = sb.read_file("/work/big/edit.txt", max_bytes=4 << 20)
    assert stored == data.replace("line 0029999 of", "LAST LINE of").encode()


def test_a_write_past_the_disk_cap_is_an_error_not_a_truncation(runtime, busybox_image):
    box = runtime.create(SandboxSpec(image=busybox_image, limits={"memory_mb": 128, "pids": 32, "disk_mb": 1,
                                                                  "nofile": 128}))
    try:
        data = "y" * (3 << 20)
        r = call(Toolbox(box, max_argument_bytes=8 << 20), "write_file", path="full.txt", content=data)
        assert r.error == "command_failed" and "cannot write" in r.observation
    finally:
        box.destroy()
