"""Tool arguments the sandbox cannot carry are the model's error, named: every tool, every way in
(the built-in loop's `Toolbox.call`, MCP's `tools/call`), on a real sandbox. Before, each of these
raised out of the call (ValueError, UnicodeEncodeError) and the attempt became `agent_crash`, an
infrastructure error."""
from __future__ import annotations

import json

import pytest

from controller.contracts.tools import MAX_ARGV_ARGUMENT_BYTES, argument_error, value_error
from nodeagent.harness.tools import McpServer, Toolbox
from nodeagent.sandbox.runtime import SandboxSpec

pytestmark = pytest.mark.sandbox

# (tool, raw JSON arguments as a model writes them, what the error must name)
UNCARRIED = [
    ("shell", '{"command": "echo a\\u0000b"}', "at command: character 6 is a NUL"),
    ("shell", '{"command": "echo \\ud800"}', "at command: character 5 is a lone surrogate (U+D800)"),
    ("shell", '{"command": "ls", "timeout_s": NaN}', "at timeout_s: nan is not a finite number"),
    ("shell", json.dumps({"command": "#" * (MAX_ARGV_ARGUMENT_BYTES + 1)}), f"at command: {MAX_ARGV_ARGUMENT_BYTES + 1} bytes"),
    ("read_file", '{"path": "a\\u0000.py"}', "at path: character 1 is a NUL"),
    ("write_file", '{"path": "\\udc80.py", "content": "x"}', "at path: character 0 is a lone surrogate"),
    ("write_file", '{"path": "b.py", "content": "\\udfff"}', "at content: character 0 is a lone surrogate"),
    ("edit", '{"path": "a.py", "old": "x = 1", "new": "\\ud83d"}', "at new: character 0 is a lone surrogate"),
    ("list", '{"path": "/work\\u0000"}', "at path: character 5 is a NUL"),
    ("search", '{"pattern": "x\\u0000"}', "at pattern: character 1 is a NUL"),
]


@pytest.fixture(scope="module")
def tb(runtime, busybox_image):
    box = runtime.create(SandboxSpec(image=busybox_image, files={"a.py": b"x = 1\n"},
                                     limits={"memory_mb": 128, "pids": 32, "disk_mb": 16, "nofile": 128}))
    yield Toolbox(box, observation_bytes=256, timeout_s=5.0)
    box.destroy()


@pytest.mark.parametrize("name, raw, named", UNCARRIED, ids=[f"{n}-{i}" for i, (n, *_r) in enumerate(UNCARRIED)])
def test_an_argument_the_sandbox_cannot_carry_is_an_invalid_arguments_observation(tb, name, raw, named):
    out = tb.call(name, raw)
    assert (out.error, out.exit_code) == ("invalid_arguments", None), out
    assert out.observation.startswith(f"error: invalid arguments for {name} {named}"), out.observation
    reply = McpServer(tb).handle({"jsonrpc": "2.0", "id": 1, "method": "tools/call",
                                  "params": {"name": name, "arguments": raw}})
    assert reply["result"]["isError"] is True and named in reply["result"]["content"][0]["text"]


def test_what_the_sandbox_can_carry_still_runs(tb):
    assert tb.call("write_file", json.dumps({"path": "bin.dat", "content": "a\u0000b\U0001f600"})).error is None
    out = tb.call("shell", json.dumps({"command": "od -c /work/bin.dat | head -1; echo caf\u00e9"}))
    assert out.error is None and "a  \\0   b" in out.observation and "café" in out.observation
    assert tb.call("shell", json.dumps({"command": "#" * MAX_ARGV_ARGUMENT_BYTES})).exit_code == 0


def test_value_error_reads_only_schema_valid_arguments():
    assert value_error("shell", ["not", "a", "dict"]) is None
    assert value_error("write_file", {"path": "x", "content": "\u0000"}) is None    # stdin carries a NUL
    assert argument_error("shell", {"command": 3}) == "at command: 3 is not of type 'string'"
