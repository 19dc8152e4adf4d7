"""The agent loop against real HTTP servers on 127.0.0.1 and a real sandbox.

The model servers here are fakes (the model server is outside Paddock): each answers from a
script of behaviours — a reply, garbage, an HTTP error, silence, a trickle — so every way a
server can misbehave is shown to end as an error observation or a ModelError with its reason,
never a hung rollout.
"""
from __future__ import annotations

import json
import socket
import threading
import time

import pytest

from controller.contracts.tasks import BudgetError, Budgets
from controller.demo.policy_server import PolicyServer
from controller.taskbank.builtin import builtin_taskset
from nodeagent.harness.loop import run_agent
from nodeagent.harness.model import ModelError, ModelTimeout
from nodeagent.harness.tools import MAX_ARGUMENT_BYTES
from nodeagent.sandbox.runtime import SandboxSpec
from tests.conftest import FakeModel, reply  # noqa: F401 - FakeModel: other rooms' tests import it here

pytestmark = pytest.mark.sandbox


@pytest.fixture(scope="module")
def sb(runtime, busybox_image):
    box = runtime.create(SandboxSpec(image=busybox_image, files={"notes.txt": b"hello\n"},
                                     limits={"memory_mb": 128, "pids": 32, "disk_mb": 16, "nofile": 128}))
    yield box
    box.destroy()


def agent(sb, url, budgets=None, **kw):
    return run_agent(sb, "do the thing", url, "m", 7, budgets or {"max_steps": 6, "wall_s": 30}, **kw)


def test_steps_spans_tokens_and_logprobs_are_recorded(sb, fake):
    lp = {"content": [{"token": "x", "logprob": -0.5, "top_logprobs": []}]}
    m = fake(reply("look", [("read_file", '{"path": "notes.txt"}')], (10, 4), lp), reply("all done", usage=(20, 2)))
    res = agent(sb, m.url)
    assert (res.stop_reason, res.answer, len(res.steps)) == ("stop", "all done", 2)
    s0 = res.steps[0]
    assert (s0["tool_name"], s0["observation"], s0["exit_code"]) == ("read_file", "hello\n", 0)
    assert json.loads(s0["tool_args"]) == [{"id": "c0", "name": "read_file", "arguments": '{"path": "notes.txt"}'}]
    assert json.loads(s0["logprobs"]) == lp and res.steps[1]["logprobs"] is None
    assert (res.prompt_tokens, res.completion_tokens) == (30, 6)
    assert [(s["kind"], s["name"], s["step"]) for s in res.spans] == [
        ("model_call", "m", 0), ("tool_call", "read_file", 0), ("model_call", "m", 1)]
    assert all(s["duration_s"] >= 0 and s["start_s"] >= 0 for s in res.spans)
    # the model saw the tool set and the tool result
    assert {t["function"]["name"] for t in m.requests[0]["tools"]} >= {"shell", "edit", "search"}
    assert m.requests[1]["messages"][-1] == {"role": "tool", "tool_call_id": "c0", "content": "hello\n"}


def test_the_task_tool_set_is_what_the_model_sees_and_may_call(sb, fake):
    m = fake(reply(calls=[("shell", '{"command": "id"}')]), reply("ok"))
    res = agent(sb, m.url, tools=["read_file"])
    assert [t["function"]["name"] for t in m.requests[0]["tools"]] == ["read_file"]
    assert res.tool_errors == 1 and "unknown tool 'shell'" in res.steps[0]["observation"]


@pytest.mark.parametrize("name,args,expect", [
    ("shell", '{"command": "echo hi"', "not valid JSON"),
    ("teleport", '{}', "unknown tool 'teleport'"),
    ("write_file", json.dumps({"path": "x", "content": "y" * (MAX_ARGUMENT_BYTES + 1)}), "the limit is"),
    ("edit", '{"path": "notes.txt"}', "invalid arguments for edit"),
])
def test_bad_tool_calls_become_error_observations_and_the_loop_goes_on(sb, fake, name, args, expect):
    m = fake(reply(calls=[(name, args)]), reply("gave up"))
    res = agent(sb, m.url)
    assert res.stop_reason == "stop" and res.tool_errors == 1
    assert expect in res.steps[0]["observation"] and res.steps[0]["exit_code"] is None


def test_step_budget(sb, fake):
    m = fake(reply(calls=[("shell", '{"command": "true"}')]))
    res = agent(sb, m.url, {"max_steps": 3, "wall_s": 30})
    assert (res.stop_reason, len(res.steps), len(m.requests)) == ("max_steps", 3, 3)


def test_token_budget(sb, fake):
    m = fake(reply(calls=[("shell", '{"command": "true"}')], usage=(600, 500)))
    res = agent(sb, m.url, {"max_steps": 10, "wall_s": 30, "max_tokens": 2000})
    assert (res.stop_reason, len(res.steps)) == ("tokens", 2)
    assert m.requests[1]["max_tokens"] == 2000 - 1100


def test_observation_budget_caps_each_observation(sb, fake):
    m = fake(reply(calls=[("shell", '{"command": "yes | head -c 10000"}')]), reply("ok"))
    res = agent(sb, m.url, {"max_steps": 4, "wall_s": 30, "observation_bytes": 100})
    assert res.steps[0]["observation_truncated"] is True
    assert len(res.steps[0]["observation"]) < 160


def test_wall_budget_interrupts_a_model_call(sb, fake):
    m = fake(("hang",))
    t0 = time.monotonic()
    res = agent(sb, m.url, {"max_steps": 4, "wall_s": 0.5})
    assert res.stop_reason == "wall_time" and time.monotonic() - t0 < 5
    assert res.spans[0]["kind"] == "model_call" and res.spans[0]["duration_s"] >= 0.45


def test_wall_budget_interrupts_a_tool_call(sb, fake):
    m = fake(reply(calls=[("shell", '{"command": "sleep 20", "timeout_s": 60}')]))
    t0 = time.monotonic()
    res = agent(sb, m.url, {"max_steps": 4, "wall_s": 1.0})
    assert res.stop_reason == "wall_time" and time.monotonic() - t0 < 5
    assert "timed out" in res.steps[0]["observation"]


def test_a_server_that_never_answers_is_a_model_error_not_a_hang(sb, fake):
    m = fake(("hang",), get=("hang",))       # nor its liveness probe: a hung server
    t0 = time.monotonic()
    with pytest.raises(ModelTimeout, match="did not answer within 0.5s"):
        agent(sb, m.url, model_timeout_s=0.5)
    assert time.monotonic() - t0 < 5


def test_a_server_that_trickles_is_cut_at_the_deadline(sb, fake):
    m = fake(("trickle",), get=("hang",))
    t0 = time.monotonic()
    with pytest.raises(ModelTimeout):
        agent(sb, m.url, model_timeout_s=0.5)
    assert time.monotonic() - t0 < 5


def test_a_server_that_is_down_is_a_model_error():
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()   # nothing listens on the port now
    with pytest.raises(ModelError, match="failed"):
        run_agent(None, "x", f"http://127.0.0.1:{port}/v1", "m", 0, {})


@pytest.mark.parametrize("behaviour,reason", [
    (("raw", 200, b"<html>oops</html>"), "not JSON"),
    (("raw", 500, b"internal error"), "HTTP 500"),
    (("raw", 200, b'{"choices": []}'), "no choices"),
    (("raw", 200, b'{"choices": [{"message": "hi"}]}'), "message is not an object"),
    (("raw", 200, b'{"choices": [{"message": {"content": "x", "tool_calls": "rm -rf"}}]}'), "tool_calls"),
    (("raw", 200, b'{"choices": [{"message": {"content": 5}}]}'), "content"),
    (("raw", 200, b'{"choices": [{"message": {"content": "x"}}], "usage": {"prompt_tokens": -1}}'), "usage"),
])
def test_garbage_replies_are_model_errors_with_the_reason(sb, fake, behaviour, reason):
    m = fake(behaviour)
    with pytest.raises(ModelError, match=reason):
        agent(sb, m.url)


def test_bad_budgets_name_the_key():
    with pytest.raises(BudgetError, match="max_stepz"):
        Budgets.from_dict({"max_stepz": 3})
    with pytest.raises(BudgetError, match="wall_s"):
        Budgets.from_dict({"wall_s": -1})


def test_the_scripted_policy_solves_a_python_task_through_the_harness(runtime, python_image):
    ts = builtin_taskset()
    task = next(t for t in ts.tasks if t.family == "python")
    with PolicyServer(ts) as policy:
        policy.set_policy(1, {f: {s: (10.0 if s == "solve" else 0.0) for s in strats}
                              for f, strats in policy.policy.params(0).items()})
        box = runtime.create(SandboxSpec(image=python_image, files={k: v.encode() for k, v in task.files.items()}))
        try:
            res = run_agent(box, task.instruction, policy.url, "scripted-v1", 3, {"max_steps": 6, "wall_s": 60})
        finally:
            box.destroy()
    assert res.stop_reason == "stop" and res.steps[0]["content"].startswith("plan: solve")
    assert "passed" in res.steps[1]["observation"] and res.tool_errors == 0


def test_a_model_error_carries_the_steps_recorded_before_it(sb, fake):
    m = fake(reply(calls=[("shell", '{"command": "echo one"}')]), ("raw", 502, b"bad gateway"))
    with pytest.raises(ModelError, match="HTTP 502") as e:
        agent(sb, m.url)
    res = e.value.result
    assert res.stop_reason == "model_error" and len(res.steps) == 1 and res.steps[0]["observation"] == "one\n"
    assert [s["kind"] for s in res.spans] == ["model_call", "tool_call"]


def test_a_rollout_whose_model_server_fails_is_an_infra_error_never_a_zero(runtime, python_image, fake, tmp_path):
    from nodeagent.agent.attempt import Attempt, run_attempt
    t = next(t for t in builtin_taskset().tasks if t.family == "math")
    task = {**t.canonical(), "task_id": t.task_id}
    m = fake(reply(calls=[("shell", '{"command": "echo 1"}')]), ("raw", 200, b"not json"))
    res = run_attempt(runtime, python_image, "n1", Attempt("run", str(tmp_path), "r1", 1, 1, "b", 0, task, 0,
                                                           m.url, "m"))
    assert (res.outcome, res.reward) == ("infra_error", None)
    assert res.infra_reason.startswith("model_server:") and "not JSON" in res.infra_reason


def test_tool_calls_beyond_the_per_message_cap_are_answered_but_not_run(sb, fake):
    from nodeagent.harness.loop import MAX_CALLS_PER_STEP
    calls = [("shell", json.dumps({"command": f"echo {i} >> /tmp/ran"})) for i in range(MAX_CALLS_PER_STEP + 3)]
    m = fake(reply(calls=calls), reply(calls=[("shell", '{"command": "wc -l < /tmp/ran"}')]), reply("ok"))
    res = agent(sb, m.url)
    assert res.steps[1]["observation"].strip() == str(MAX_CALLS_PER_STEP)
    assert res.tool_errors == 3
    answered = [msg for msg in m.requests[1]["messages"] if msg["role"] == "tool"]
    assert len(answered) == MAX_CALLS_PER_STEP + 3 and "not run" in answered[-1]["content"]


def test_a_conversation_longer_than_the_models_context_ends_the_run_not_an_infra_error(sb, fake):
    vllm_400 = json.dumps({"object": "error", "type": "BadRequestError", "code": 400,
                           "message": "This model's maximum context length is 4096 tokens. However, you "
                                      "requested 5000 tokens (4000 in the messages, 1000 in the completion)."})
    m = fake(reply(calls=[("shell", '{"command": "true"}')]), ("raw", 400, vllm_400.encode()))
    res = agent(sb, m.url)
    assert (res.stop_reason, len(res.steps), res.answer) == ("context_length", 1, None)
    assert [s["kind"] for s in res.spans] == ["model_call", "tool_call", "model_call"]


def test_other_http_400s_stay_model_errors(sb, fake):
    m = fake(("raw", 400, b'{"error": {"message": "unknown field tools"}}'))
    with pytest.raises(ModelError, match="HTTP 400"):
        agent(sb, m.url)


# ---- no progress ---------------------------------------------------------------------------

def test_a_policy_repeating_one_call_is_stopped_by_the_detector(sb, fake):
    m = fake(reply(calls=[("shell", '{"command": "echo same"}')]))     # for ever
    res = agent(sb, m.url, {"max_steps": 100, "wall_s": 60, "no_progress_repeats": 5})
    assert (res.stop_reason, len(res.steps), len(m.requests)) == ("no_progress", 5, 5)
    assert {s["observation"] for s in res.steps} == {"same\n"}


def test_the_same_call_is_the_same_whatever_its_json_spacing_and_key_order(sb, fake):
    spellings = ['{"command": "echo x", "timeout_s": 5}', '{"timeout_s":5,"command":"echo x"}',
                 '{ "command" : "echo x" , "timeout_s" : 5 }']
    m = fake(*[reply(calls=[("shell", spellings[i % 3])]) for i in range(30)])
    res = agent(sb, m.url, {"max_steps": 30, "wall_s": 60, "no_progress_repeats": 4})
    assert (res.stop_reason, len(res.steps)) == ("no_progress", 4)


def test_a_loop_of_two_calls_is_caught_too(sb, fake):
    a, b = ("shell", '{"command": "echo a"}'), ("shell", '{"command": "echo b"}')
    m = fake(*[reply(calls=[a if i % 2 == 0 else b]) for i in range(40)])
    res = agent(sb, m.url, {"max_steps": 40, "wall_s": 60, "no_progress_repeats": 3})
    assert (res.stop_reason, len(res.steps)) == ("no_progress", 5)     # a, b, a, b, a: `a` a third time


def test_the_same_call_with_a_new_observation_is_progress(sb, fake):
    m = fake(reply(calls=[("shell", '{"command": "echo x >> /tmp/grow; wc -c < /tmp/grow"}')]))
    res = agent(sb, m.url, {"max_steps": 10, "wall_s": 60, "no_progress_repeats": 3})
    assert (res.stop_reason, len(res.steps)) == ("max_steps", 10)


def test_turns_without_output_end_the_episode_as_no_output(sb, fake):
    # every call differs (no repeat rule), none prints anything
    m = fake(reply(calls=[("shell", '{"command": "echo start"}')]),
             *[reply(calls=[("shell", json.dumps({"command": f"true {i}"}))]) for i in range(40)])
    res = agent(sb, m.url, {"max_steps": 40, "wall_s": 60, "no_output_turns": 6, "no_progress_repeats": 99})
    assert (res.stop_reason, len(res.steps)) == ("no_output", 7)          # "start", then 6 silent turns


def test_the_same_output_after_different_calls_is_work_not_silence(sb, fake):
    # many edits that each answer the same line ("replaced 1 occurrence(s) in f.py" in the edit tool)
    m = fake(*[reply(calls=[("shell", json.dumps({"command": f"echo ok # edit {i}"}))]) for i in range(30)])
    res = agent(sb, m.url, {"max_steps": 20, "wall_s": 60, "no_output_turns": 4, "no_progress_repeats": 4})
    assert (res.stop_reason, len(res.steps)) == ("max_steps", 20)


def test_the_detector_is_off_for_what_a_budget_sets_beyond_the_steps(sb, fake):
    m = fake(reply(calls=[("shell", '{"command": "true"}')]))
    res = agent(sb, m.url, {"max_steps": 12, "wall_s": 60, "no_progress_repeats": 1000, "no_output_turns": 1000})
    assert res.stop_reason == "max_steps"


def test_a_looping_rollout_is_the_policys_failure_scored_0_never_graded(runtime, python_image, fake, tmp_path):
    import pyarrow.parquet as pq

    from nodeagent.agent.attempt import Attempt, run_attempt
    t = next(t for t in builtin_taskset().tasks if t.family == "python")
    task = {**t.canonical(), "task_id": t.task_id}
    task["budgets"] = {**task["budgets"], "max_steps": 50, "no_progress_repeats": 4}
    m = fake(reply(calls=[("shell", '{"command": "cat solution.py"}')]))
    res = run_attempt(runtime, python_image, "n1", Attempt("run", str(tmp_path), "r1", 1, 1, "b", 0, task, 0,
                                                           m.url, "m"))
    assert (res.outcome, res.reward, res.infra_reason) == ("fail", 0.0, None)
    (row,) = pq.read_table(tmp_path / res.shards["rollouts"]).to_pylist()
    assert (row["stop_reason"], row["steps"], row["verify_s"]) == ("no_progress", 4, 0.0)
    assert len(m.requests) == 4


def test_a_stop_from_outside_kills_a_running_tool_call_and_ends_the_loop(runtime, busybox_image, fake):
    from nodeagent.agent.guard import AttemptGuard
    m = fake(reply(calls=[("shell", '{"command": "sleep 30", "timeout_s": 60}')]))
    with AttemptGuard() as guard:
        box = guard.runtime(runtime).create(SandboxSpec(image=busybox_image))
        try:
            timer = threading.Timer(0.5, guard.fire, ("cancel", "cancelled_by_trainer"))
            timer.start()
            t0 = time.monotonic()
            res = run_agent(box, "x", m.url, "m", 1, {"max_steps": 5, "wall_s": 60}, stop=lambda: guard.stopped)
            took = time.monotonic() - t0
        finally:
            box.destroy()
    assert res.stop_reason == "stopped" and len(m.requests) == 1
    assert took < 1.5, f"the killed tool call returned after {took:.2f}s"
    assert guard.cancelled() == "cancelled_by_trainer"
