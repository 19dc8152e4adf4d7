"""Whatever shape a model gives a tool call's arguments, every toolbox (the built-in tools, a
task's mock services, its MCP servers, a web task's browser) answers it as the model's tool error and the conversation
goes on: the agent loop checks every call once (`controller.contracts.tools.call_error`) before
any toolbox sees it. Before, arguments nested deeper than Python's JSON reader goes raised
RecursionError out of every toolbox's parse (the attempt ended `agent_crash`, an infrastructure
error), and NaN, `Infinity`, `1e400` or a lone surrogate below the top level reached the services'
and MCP servers' tools. Odd calls (unknown or NUL-bearing names, 10,000 calls in one message,
repeated or missing ids, duplicate keys) are answered too; a rollout made of them is graded."""
from __future__ import annotations

import dataclasses
import json

import pyarrow.parquet as pq
import pytest

from controller.contracts.tools import MAX_ARGUMENT_DEPTH, call_error
from controller.taskbank.builtin import builtin_taskset
from controller.taskbank.webtasks import web_tasks
from layers.builtin import ensure_browser_image
from nodeagent.agent.attempt import Attempt, run_attempt
from nodeagent.browser.session import BrowserSession
from nodeagent.harness.browser_tools import BrowserToolbox
from nodeagent.harness.loop import MAX_CALLS_PER_STEP, run_agent
from nodeagent.harness.mcptools import McpRollout
from nodeagent.harness.tools import MAX_ARGUMENT_BYTES
from nodeagent.sandbox.runtime import SandboxSpec
from nodeagent.services.host import MAX_ARGUMENT_BYTES as SERVICE_ARGUMENT_BYTES
from nodeagent.services.host import ServiceHost
from tests.conftest import reply
from tests.harness.test_mcp_tools import CALC, CONFIG
from tests.harness.test_mcp_tools import _task as mcp_task


def nested(depth: int) -> str:
    return '{"x": ' + "[" * depth + "]" * depth + "}"


# (label, raw arguments JSON as a model writes them, what the tool error must say)
HOSTILE = [
    ("nested-2000", nested(2000), f"at arguments: nested deeper than {MAX_ARGUMENT_DEPTH} levels"),
    ("nested-40", nested(40), "at x" + "/0" * (MAX_ARGUMENT_DEPTH - 1) + f": nested deeper than {MAX_ARGUMENT_DEPTH} levels"),
    ("nan-inside", '{"x": {"y": [1, NaN]}}', "at x/y/1: nan is not a finite number"),
    ("infinity", '{"x": -Infinity}', "at x: -inf is not a finite number"),
    ("1e400", '{"x": [1e400]}', "at x/0: inf is not a finite number"),
    ("huge-integer", '{"x": 1' + "0" * 400 + "}", "at x: an integer of 1329 bits"),
    ("surrogate-inside", '{"x": {"y": "ok\\udfff"}}', "at x/y: character 2 is a lone surrogate (U+DFFF)"),
    ("surrogate-key", '{"\\ud800": 1}', "at arguments (a key): character 0 is a lone surrogate"),
    ("array", "[1, 2]", "at arguments: must be a JSON object, not an array"),
    ("number", "-0", "at arguments: must be a JSON object, not a number"),
    ("string", '"ls"', "at arguments: must be a JSON object, not a string"),
    ("null", "null", "at arguments: must be a JSON object, not null"),
]

NOTES = {"state_schema": {"type": "object"}, "initial_state": {"notes": []},
         "operations": {"put": {"parameters": {"type": "object", "properties": {"note": {}}},
                                "steps": [{"append": [["notes"], {"arg": "note"}]}, {"return": {"get": ["notes"]}}]}}}

# per toolbox kind: the tool the hostile calls name, a call that runs, what its answer holds
KINDS = {
    "builtin": ("shell", '{"command": "echo still-here"}', "still-here"),
    "service": ("put", '{"note": "still-here"}', '["still-here"]'),
    "mcp": ("mcp__calc__fail", '{"a": 1}', "error: it broke"),        # the server's own answer
    "browser": ("browser_observe", "{}", "RootWebArea \"Paddock Shop\""),   # the shop's start page
}


@pytest.fixture(scope="module")
def mcp_box(runtime, python_image):
    task = mcp_task()
    mcp = McpRollout.of(task)
    sb = runtime.create(SandboxSpec(image=python_image, files=dict(task.files), egress_socket=mcp.relay(None)))
    try:
        yield sb, mcp.toolbox(sb, task)
    finally:
        mcp.close()
        sb.destroy()


@pytest.fixture(scope="module")
def browser_box(runtime, image_store):
    """A web task's sandbox with its browser started (the browser image is built once per store)."""
    image = ensure_browser_image(image_store)[1]
    task = web_tasks()[9]
    bs = BrowserSession()
    sb = runtime.create(SandboxSpec(image=image, limits=dataclasses.asdict(task.limits), egress_socket=bs.path))
    try:
        bs.start(sb, task.hidden["seed.sql"])
        yield sb, BrowserToolbox(bs)
    finally:
        sb.destroy()
        bs.close()


def toolbox_of(kind: str, request) -> tuple:
    """(the sandbox, run_agent's keyword arguments) for a toolbox kind."""
    if kind == "browser":
        sb, browser = request.getfixturevalue("browser_box")
        return sb, {"toolbox": browser}
    sb, mcp = request.getfixturevalue("mcp_box")
    if kind == "mcp":
        return sb, {"toolbox": mcp}
    return sb, {"services": ServiceHost({"n": NOTES}, sb)} if kind == "service" else {}


def converse(sb, fake, calls, **kw):
    """The agent loop over one assistant message of `calls` then "done": (its result, the tool
    messages the model was sent back, in order)."""
    m = fake(reply(calls=calls), reply("done"))
    res = run_agent(sb, "do the thing", m.url, "m", 7, {"max_steps": 4, "wall_s": 60}, **kw)
    return res, m.tool_replies()


@pytest.mark.sandbox
@pytest.mark.parametrize("kind", list(KINDS))
@pytest.mark.parametrize("label, raw, says", HOSTILE, ids=[h[0] for h in HOSTILE])
def test_arguments_no_toolbox_may_take_are_the_models_tool_error_and_the_call_after_runs(
        request, fake, kind, label, raw, says):
    sb, kw = toolbox_of(kind, request)
    tool, good, answer = KINDS[kind]
    res, (refused, ran) = converse(sb, fake, [(tool, raw), (tool, good)], **kw)
    assert res.stop_reason == "stop" and res.answer == "done"
    assert refused.startswith(f"error: invalid arguments for {tool} {says}"), refused
    assert answer in ran, ran
    if kind == "service":
        assert kw["services"].final_state() == {"n": {"notes": ["still-here"]}}    # the refused call changed nothing


@pytest.mark.sandbox
@pytest.mark.parametrize("kind", list(KINDS))
def test_arguments_past_a_toolboxs_size_are_refused_by_it_before_they_are_read(request, fake, kind):
    sb, kw = toolbox_of(kind, request)
    tool, good, answer = KINDS[kind]
    limit = SERVICE_ARGUMENT_BYTES if kind == "service" else MAX_ARGUMENT_BYTES
    res, (refused, ran) = converse(sb, fake, [(tool, '{"x": "' + "a" * limit + '"}'), (tool, good)], **kw)
    assert res.stop_reason == "stop" and refused.startswith(f"error: arguments of {tool}"), refused
    assert str(limit) in refused and answer in ran


@pytest.mark.sandbox
def test_a_nul_is_refused_where_it_would_be_a_command_line_and_carried_where_it_is_json(mcp_box, fake):
    sb, mcp = mcp_box
    host = ServiceHost({"n": NOTES}, sb)
    res, (shell, put) = converse(sb, fake, [("shell", '{"command": "echo a\\u0000b"}'),
                                            ("put", '{"note": "a\\u0000b"}')], services=host)
    assert shell.startswith("error: invalid arguments for shell at command: character 6 is a NUL"), shell
    assert put == '["a\\u0000b"]' and host.final_state() == {"n": {"notes": ["a\x00b"]}}


@pytest.mark.sandbox
def test_a_service_result_past_what_json_text_carries_is_refused_not_an_infrastructure_error(mcp_box, fake):
    """An allowed integer (under 2^64) times a large state: an integer past Python's 4300 digits
    of text. Before, the engine in the sandbox failed to print it: SandboxError, infrastructure."""
    sb, _ = mcp_box
    spec = {"state_schema": {"type": "object"}, "initial_state": {"n": 10 ** 4290},
            "operations": {"times": {"parameters": {"type": "object", "properties": {"by": {"type": "integer"}}},
                                     "steps": [{"set": [["n"], {"mul": [{"get": ["n"]}, {"arg": "by"}]}]},
                                               {"return": {"get": ["n"]}}]}}}
    host = ServiceHost({"s": spec}, sb)
    res, (refused, ran) = converse(sb, fake, [("times", '{"by": 18446744073709551615}'), ("times", '{"by": 1}')],
                                   services=host)
    assert res.stop_reason == "stop" and refused.startswith("error: times would leave s with an integer past 4300 digits (at /result)"), refused
    assert ran == "1" + "0" * 4290 and host.final_state() == {"s": {"n": 10 ** 4290}}


@pytest.mark.sandbox
@pytest.mark.parametrize("kind", list(KINDS))
def test_odd_calls_are_answered_one_by_one_and_the_conversation_goes_on(request, fake, kind):
    sb, kw = toolbox_of(kind, request)
    calls = [("nope", "{}"), ("sh\u0000ell", '{"command": "true"}'), ("\ud800", "{}"), (None, "{}"), (["shell"], "{}"),
             ({"a": 1}, "{}"),
             ("shell", '{"command": "echo first", "command": "echo dup-key-last"}'),
             ("shell", '{"command": {"a": 1}}'),
             ("shell", '{"command": "echo x", "timeout_s": -0}'),
             ("read_file", "[" + ",".join(["0"] * 1_000_000) + "]")]
    res, replies = converse(sb, fake, calls, **kw)
    assert res.stop_reason == "stop" and len(replies) == len(calls)
    assert replies[0].startswith("error: unknown tool 'nope'") and replies[1].startswith("error: unknown tool 'sh\\x00ell'")
    assert replies[2].startswith("error: unknown tool '\\ud800'")
    assert [r.split(";")[0] for r in replies[3:6]] == ["error: unknown tool None", "error: unknown tool ['shell']",
                                                       "error: unknown tool {'a': 1}"]
    if kind == "browser":                         # a web task has no shell: the rest are unknown tools
        assert all(r.startswith("error: unknown tool") for r in replies[6:-1]) and replies[-1].startswith("error:")
        return
    assert replies[6].strip() == "dup-key-last"                                   # JSON's rule: the last one wins
    assert replies[7].startswith("error: invalid arguments for shell at command: {'a': 1} is not of type 'string'")
    assert replies[8].startswith("error: invalid arguments for shell at timeout_s")   # 0 is not > 0
    assert replies[9].startswith("error: invalid arguments for read_file at arguments: must be a JSON object")


@pytest.mark.sandbox
def test_arguments_sent_as_json_values_not_text_are_read_the_same_way(mcp_box, fake):
    """Some servers send `arguments` as the object itself; anything else they send is refused alike."""
    sb, _ = mcp_box
    calls = [{"name": "shell", "arguments": {"command": "echo as-object"}}, {"name": "shell", "arguments": [1]},
             {"name": "shell", "arguments": 3}, {"name": "shell", "arguments": {"command": "x", "timeout_s": 1e400}},
             {"name": "shell"}, {"arguments": "{}"}]
    m = fake({"choices": [{"index": 0, "finish_reason": "tool_calls", "message": {
        "role": "assistant", "content": None, "tool_calls": [{"id": f"k{i}", "type": "function", "function": f}
                                                            for i, f in enumerate(calls)]}}],
        "usage": {"prompt_tokens": 1, "completion_tokens": 1}}, reply("done"))
    res = run_agent(sb, "do the thing", m.url, "m", 7, {"max_steps": 4, "wall_s": 60})
    replies = m.tool_replies()
    assert res.stop_reason == "stop" and replies[0].strip() == "as-object"
    assert replies[1].startswith("error: invalid arguments for shell at arguments: must be a JSON object, not an array")
    assert replies[2].startswith("error: invalid arguments for shell at arguments: must be a JSON object, not a number")
    assert replies[3].startswith("error: invalid arguments for shell at timeout_s: inf is not a finite number")
    assert replies[4].startswith("error: invalid arguments for shell at arguments: must be a JSON object, not null")
    assert replies[5].startswith("error: unknown tool None")


@pytest.mark.sandbox
def test_ten_thousand_calls_in_one_message_run_the_first_ones_and_answer_every_one(mcp_box, fake):
    """The refused copies are one call answered alike again and again: the no-progress rule ends
    the episode, the policy's failure (scored 0), never an infrastructure error."""
    sb, _ = mcp_box
    m = fake({"choices": [{"index": 0, "finish_reason": "tool_calls", "message": {
        "role": "assistant", "content": None, "tool_calls": [
            {"type": "function", "function": {"name": "shell", "arguments": '{"command": "echo ran >> /tmp/n"}'}}
            | ({"id": "same"} if i % 2 else {})                # ids repeated, and missing
            for i in range(10_000)]}}], "usage": {"prompt_tokens": 1, "completion_tokens": 1}}, reply("done"))
    res = run_agent(sb, "do the thing", m.url, "m", 7, {"max_steps": 4, "wall_s": 60})
    assert res.stop_reason == "no_progress" and len(res.steps) == 1
    answers = res.steps[0]["observation"].split("\n")
    assert len(answers) == 10_000 and answers.count("") == MAX_CALLS_PER_STEP     # echo's output went to the file
    assert [c["id"] for c in json.loads(res.steps[0]["tool_args"])[:3]] == ["call_0", "same", "call_2"]
    assert sb.exec(["sh", "-c", "wc -l < /tmp/n"]).stdout.decode().strip() == str(MAX_CALLS_PER_STEP)


def test_call_error_leaves_to_each_toolbox_what_it_answers_itself():
    assert call_error("shell", "not json", MAX_ARGUMENT_BYTES) is None        # malformed_json: the toolbox's
    assert call_error("shell", nested(10_000), 100) is None                   # oversized: the toolbox's
    assert call_error("shell", "", MAX_ARGUMENT_BYTES) is None                 # no arguments: {}
    assert call_error("shell", '{"command": "ls"}', MAX_ARGUMENT_BYTES) is None
    assert call_error("x", nested(MAX_ARGUMENT_DEPTH - 1), MAX_ARGUMENT_BYTES) is None
    assert call_error("x", '{"n": 18446744073709551616, "m": -18446744073709551616}', MAX_ARGUMENT_BYTES) is None


# -- a rollout made of such calls is graded ------------------------------------------------------

def python_task() -> dict:
    t = next(t for t in builtin_taskset().tasks if t.family == "python")
    return {**t.canonical(), "task_id": t.task_id}


@pytest.mark.sandbox
@pytest.mark.parametrize("tool", ["shell", "mcp__calc__fail"])
def test_a_rollout_of_hostile_arguments_is_graded_never_an_infrastructure_error(runtime, python_image, tmp_path,
                                                                                 fake, tool):
    task = python_task()
    if tool.startswith("mcp"):
        task["files"] = dict(task["files"], **{".paddock/mcp.json": json.dumps({"servers": {"calc": CONFIG["servers"]["calc"]}}),
                                              "mcp/calc.py": CALC})
    m = fake(reply(calls=[(tool, raw) for _, raw, _ in HOSTILE]), reply(calls=[("shell", '{"command": "echo on"}')]),
             reply("done"))
    res = run_attempt(runtime, python_image, "n1", Attempt("run", str(tmp_path), "r1", 1, 1, "b", 0, task, 0, m.url, "m"))
    assert (res.outcome, res.reward, res.infra_reason) == ("fail", 0.0, None)    # graded: the stub
    steps = pq.read_table(tmp_path / res.shards["steps"]).to_pylist()
    first = steps[0]["observation"].split("\n")
    assert len(first) == len(HOSTILE) and all(o.startswith(f"error: invalid arguments for {tool} at ") for o in first)
    assert steps[1]["observation"].strip() == "on"
