"""A failed model call is infrastructure only when it reproduces without the policy's output
(nodeagent/harness/modelfault.py): a long generation on a live server, the policy's own
transcript overflowing the context (in every server's wording) and a 4xx that the same request
without the policy's output does not get are graded as the policy's; a dead, hung or unhealthy
server stays an infrastructure error. Each case runs against a scripted server speaking the
OpenAI wire format, through the harness's own client and through the node's gateway session.
"""
from __future__ import annotations

import functools
import json
import socket

import pytest

from controller.taskbank.builtin import builtin_taskset
from nodeagent.gateway.session import GatewayBudgets, Session, Upstream
from nodeagent.harness.loop import run_agent
from nodeagent.harness.model import ModelError, ModelTimeout
from tests.conftest import reply

pytestmark = pytest.mark.sandbox

STEP = reply(calls=[("shell", '{"command": "true"}')])     # one step of the policy's own output


@pytest.fixture(scope="module")
def sb(runtime, busybox_image):
    from nodeagent.sandbox.runtime import SandboxSpec
    box = runtime.create(SandboxSpec(image=busybox_image, limits={"memory_mb": 128, "pids": 32, "disk_mb": 16}))
    yield box
    box.destroy()


def direct(url):
    return url


def gateway(url):
    """The production path: the node's gateway session (kept connections, records, budgets);
    its backoff between reload retries (a 503) does not wait."""
    return Session(Upstream(1, url, "m"), GatewayBudgets(max_calls=20, max_tokens=100_000, wall_s=30),
                   sleep=lambda s: None)


CLIENTS = pytest.mark.parametrize("via", [direct, gateway], ids=["harness_client", "gateway_session"])


def agent(sb, endpoint, **kw):
    return run_agent(sb, "do the thing", endpoint, "m", 7, {"max_steps": 6, "wall_s": 30}, **kw)


# ---- a long generation ------------------------------------------------------------------------

@CLIENTS
def test_a_generation_longer_than_the_request_timeout_on_a_serving_server_is_the_policys(sb, fake, via):
    # the second completion outlasts the timeout; GET answers (501: no such route, but a live
    # server), and one token for the task's own prompt comes at once
    m = fake(STEP, ("hang",), reply("pong"))
    res = agent(sb, via(m.url), model_timeout_s=0.5)
    assert (res.stop_reason, len(res.steps)) == ("model_timeout", 1)
    assert "did not answer within 0.5s" in res.model_fault
    assert m.probes == ["/health", "/v1/models"]
    probe = m.requests[2]              # the probe carries nothing of the policy
    assert probe["max_tokens"] == 1 and [x["role"] for x in probe["messages"]] == ["system", "user"]


@CLIENTS
def test_a_first_call_that_generates_too_long_is_the_policys_too(sb, fake, via):
    m = fake(("hang",), reply("pong"))
    res = agent(sb, via(m.url), model_timeout_s=0.5)
    assert (res.stop_reason, len(res.steps)) == ("model_timeout", 0)


@CLIENTS
def test_a_timeout_on_a_server_that_cannot_give_one_token_without_the_policy_stays_infra(sb, fake, via):
    m = fake(STEP, ("hang",))          # alive (GET answers) but every completion hangs: hung or queued
    with pytest.raises(ModelTimeout, match="without the policy's output fails too"):
        agent(sb, via(m.url), model_timeout_s=0.5)


@CLIENTS
@pytest.mark.parametrize("health", [("hang",), ("raw", 503, b'{"status": "loading"}'), ("raw", 502, b"")],
                         ids=["hung", "unavailable", "bad_gateway"])
def test_a_timeout_on_a_server_that_fails_its_liveness_probe_stays_infra(sb, fake, via, health):
    m = fake(STEP, ("hang",), reply("pong"), get=health)
    with pytest.raises(ModelTimeout, match="liveness probe GET /health") as e:
        agent(sb, via(m.url), model_timeout_s=0.5)
    assert e.value.result.stop_reason == "model_error"


class DiesAfterOneCall:
    """A model client whose server stops (nothing listens any more) after its first answer."""

    def __init__(self, inner, server):
        self.inner, self.server, self.calls = inner, server, 0

    def complete(self, payload, timeout_s):
        self.calls += 1
        if self.calls == 2:
            self.server.close()
            getattr(self.inner, "close", lambda: None)()      # and the connection it kept
        return self.inner.complete(payload, timeout_s)

    def __getattr__(self, name):
        if name not in ("probe", "unrecorded", "close"):
            raise AttributeError(name)
        return getattr(self.inner, name)


@pytest.mark.parametrize("path", ["harness_client", "gateway_session"])
def test_a_server_that_went_down_after_the_policys_output_stays_infra(sb, fake, path):
    from nodeagent.gateway.upstream import KeepAliveModel
    from nodeagent.harness.model import HTTPModel
    m = fake(STEP)
    if path == "harness_client":
        endpoint = DiesAfterOneCall(HTTPModel(m.url), m)
    else:
        endpoint = Session(Upstream(1, m.url, "m"), GatewayBudgets(max_calls=20, max_tokens=100_000, wall_s=30),
                           client=lambda ep: DiesAfterOneCall(KeepAliveModel(ep), m), sleep=lambda s: None)
    with pytest.raises(ModelError, match="failed|refused") as e:
        agent(sb, endpoint)
    assert len(e.value.result.steps) == 1


# ---- context overflow, in each server's words ---------------------------------------------------
# Sources (public; found with the code/issues search):
# - vLLM: "This model's maximum context length is 4097 tokens, however you requested 4226 tokens"
#   (langchain-ai/langchain#11001) and "The decoder prompt (length 21535) is longer than the
#   maximum model length of 16384" (xorbitsai/inference#3785, unslothai/unsloth#2666), HTTP 400.
# - SGLang: {"object":"error","message":"The input (61709 tokens) is longer than the model's
#   context length (40960 tokens).","type":"BadRequestError","code":400} (QwenLM/Qwen3#1321).
# - llama.cpp llama-server: 400 {"error": {"code": 400, "message": "request (4476 tokens) exceeds
#   the available context size (4096 tokens)", "type": "exceed_context_size_error", "n_prompt_tokens":
#   4476, "n_ctx": 4096}} (jshawtime/saywhatwant docs/228-LLAMACPP-CONTEXT-SIZE-DEBUGGING.md).
# - TGI: 422 "Input validation error: `inputs` tokens + `max_new_tokens` must be <= 1512. Given:
#   1000 `inputs` tokens and 1024 `max_new_tokens`" (huggingface/chat-ui#340,
#   text-generation-inference#628) and "`inputs` must have less than 1024 tokens. Given: 1872"
#   (text-generation-inference#937).
# - Ollama: 400 {"error":"the input length exceeds the context length"} (nano-step/nano-brain#208).
# - OpenAI API: 400 code `context_length_exceeded`, "This model's maximum context length is ...".
OVERFLOWS = {
    "vllm": (400, {"object": "error", "type": "BadRequestError", "code": 400, "message":
                   "This model's maximum context length is 4096 tokens. However, you requested 5000 tokens."}),
    "vllm_decoder_prompt": (400, {"object": "error", "type": "BadRequestError", "code": 400, "message":
                                  "The decoder prompt (length 5000) is longer than the maximum model length of 4096."}),
    "sglang": (400, {"object": "error", "type": "BadRequestError", "param": None, "code": 400, "message":
                     "The input (61709 tokens) is longer than the model's context length (40960 tokens)."}),
    "llamacpp": (400, {"error": {"code": 400, "type": "exceed_context_size_error", "n_prompt_tokens": 4476,
                                 "n_ctx": 4096, "message":
                                 "request (4476 tokens) exceeds the available context size (4096 tokens)"}}),
    "tgi_total": (422, {"error_type": "validation", "error": "Input validation error: `inputs` tokens + "
                        "`max_new_tokens` must be <= 1512. Given: 1000 `inputs` tokens and 1024 `max_new_tokens`"}),
    "tgi_inputs": (422, {"error_type": "validation",
                         "error": "Input validation error: `inputs` must have less than 1024 tokens. Given: 1872"}),
    "ollama": (400, {"error": "the input length exceeds the context length"}),
    "openai": (400, {"error": {"message": "This model's maximum context length is 8192 tokens. However, your "
                               "messages resulted in 9000 tokens.", "type": "invalid_request_error",
                               "param": "messages", "code": "context_length_exceeded"}}),
}


@CLIENTS
@pytest.mark.parametrize("server", sorted(OVERFLOWS))
def test_the_policys_transcript_overflowing_the_context_is_graded_in_every_servers_words(sb, fake, via, server):
    status, body = OVERFLOWS[server]
    m = fake(STEP, ("raw", status, json.dumps(body).encode()))
    res = agent(sb, via(m.url))
    assert (res.stop_reason, len(res.steps)) == ("context_length", 1)


@CLIENTS
def test_an_overflow_of_the_tasks_own_prompt_is_not_the_policys(sb, fake, via):
    status, body = OVERFLOWS["llamacpp"]
    m = fake(("raw", status, json.dumps(body).encode()))
    with pytest.raises(ModelError, match="before any output of the policy"):
        agent(sb, via(m.url))


# ---- other refusals: reproduced without the policy's output ------------------------------------

@CLIENTS
def test_a_4xx_the_request_without_the_policys_output_does_not_get_is_the_policys(sb, fake, via):
    odd = json.dumps({"error": {"message": "invalid tool call syntax in assistant message", "code": 400}})
    m = fake(STEP, ("raw", 400, odd.encode()), reply("pong"))
    endpoint = via(m.url)
    res = agent(sb, endpoint)
    assert (res.stop_reason, len(res.steps)) == ("model_refused", 1)
    probe = m.requests[2]          # the same request, without anything the policy wrote
    assert probe["max_tokens"] == 1 and [x["role"] for x in probe["messages"]] == ["system", "user"]
    assert probe["tools"] == m.requests[1]["tools"]
    if isinstance(endpoint, Session):       # off the record: two calls recorded, the probe is not
        assert [r["status"] for r in endpoint.rows] == ["ok", "error"]


@CLIENTS
def test_a_4xx_that_reproduces_without_the_policys_output_stays_infra(sb, fake, via):
    m = fake(STEP, ("raw", 400, b'{"error": {"message": "unknown field: logprobs"}}'))
    with pytest.raises(ModelError, match="without the policy's output fails too"):
        agent(sb, via(m.url))


@CLIENTS
@pytest.mark.parametrize("status", [502, 503, 504, 429])
def test_server_side_statuses_stay_infra_without_a_probe(sb, fake, via, status):
    m = fake(STEP, ("raw", status, b'{"error": {"message": "overloaded"}}'))
    with pytest.raises(ModelError, match=f"HTTP {status}"):
        agent(sb, via(m.url))
    assert m.probes == []


# ---- end to end: one attempt as a node agent's slot runs it ------------------------------------

def _math_task():
    t = next(t for t in builtin_taskset().tasks if t.family == "math")
    return {**t.canonical(), "task_id": t.task_id}


def test_an_attempt_whose_policy_generates_too_long_is_graded_and_a_dead_server_is_infra(
        runtime, python_image, fake, tmp_path, monkeypatch):
    import nodeagent.agent.agentphase as agentphase
    import nodeagent.agent.attempt as attempt
    monkeypatch.setattr(agentphase, "run_agent", functools.partial(run_agent, model_timeout_s=0.5))
    m = fake(STEP, ("hang",), reply("pong"))
    res = attempt.run_attempt(runtime, python_image, "n1", attempt.Attempt(
        "run", str(tmp_path / "a"), "r1", 1, 1, "b", 0, _math_task(), 0, m.url, "m"))
    assert (res.outcome, res.reward, res.infra_reason) == ("fail", 0.0, None)
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()        # nothing listens there
    res = attempt.run_attempt(runtime, python_image, "n1", attempt.Attempt(
        "run", str(tmp_path / "b"), "r2", 1, 1, "b", 0, _math_task(), 0, f"http://127.0.0.1:{port}/v1", "m"))
    assert (res.outcome, res.reward) == ("infra_error", None) and res.infra_reason.startswith("model_server:")


# ---- a harness inside the sandbox: the gateway's HTTP front says it as OpenAI does ----------------

@pytest.mark.parametrize("server", ["llamacpp", "tgi_total"])
def test_the_gateway_front_passes_an_overflow_on_as_openais_context_length_exceeded(fake, server):
    import urllib.error
    import urllib.request

    from nodeagent.gateway.server import GatewayServer
    status, body = OVERFLOWS[server]
    m = fake(("raw", status, json.dumps(body).encode()))
    s = gateway(m.url)
    with GatewayServer(s, tcp=("127.0.0.1", 0)) as gw:
        req = urllib.request.Request(gw.url + "/chat/completions", json.dumps(
            {"model": "x", "messages": [{"role": "user", "content": "hi"}]}).encode(),
            headers={"Content-Type": "application/json", "Authorization": f"Bearer {s.key}"}, method="POST")
        with pytest.raises(urllib.error.HTTPError) as e:
            urllib.request.urlopen(req, timeout=10)
    assert e.value.code == 400
    assert json.loads(e.value.read())["error"]["code"] == "context_length_exceeded"


def test_a_hung_server_at_the_end_of_the_wall_budget_stays_infra_not_a_deadline_zero(
        runtime, python_image, fake, tmp_path, monkeypatch):
    # wall 3 s, request timeout 2.5 s: the probes get what is left (at least 1 s each), well
    # inside the attempt guard's grace, so the hung server is found out before the guard stops
    import nodeagent.agent.agentphase as agentphase
    import nodeagent.agent.attempt as attempt
    monkeypatch.setattr(agentphase, "run_agent", functools.partial(run_agent, model_timeout_s=2.5))
    m = fake(("hang",), get=("hang",))
    task = _math_task()
    task["budgets"] = {**task["budgets"], "wall_s": 3.0}
    res = attempt.run_attempt(runtime, python_image, "n1", attempt.Attempt(
        "run", str(tmp_path), "r1", 1, 1, "b", 0, task, 0, m.url, "m"))
    assert (res.outcome, res.reward) == ("infra_error", None)
    assert "liveness probe" in res.infra_reason


# ---- the policy's malformed tool call, as real servers answer it ----------------------------------
# vLLM: 400 {"error": {"message": "Expecting ',' delimiter: line 1 column 54 (char 53)", "type":
# "BadRequestError", "code": 400}} for a tool call of the history whose arguments are not JSON,
# on every later turn (vllm-project/vllm#43995, #48922). llama.cpp (through litellm): 500 "Failed to
# parse tool call arguments as JSON: [json.exception.parse_error.101] parse error at line 1, column
# 131: syntax error while parsing value - unexpected end of input" (vxcontrol/pentagi#313).
VLLM_BAD_ARGS = json.dumps({"error": {"message": "Expecting ',' delimiter: line 1 column 54 (char 53)",
                                      "type": "BadRequestError", "param": None, "code": 400}}).encode()
LLAMACPP_BAD_ARGS = json.dumps({"error": {"code": 500, "type": "server_error", "message":
                                          "Failed to parse tool call arguments as JSON: [json.exception.parse_error"
                                          ".101] parse error at line 1, column 131: syntax error while parsing value"
                                          " - unexpected end of input"}}).encode()


@CLIENTS
def test_a_malformed_tool_call_the_server_refuses_on_every_turn_is_the_policys(sb, fake, via):
    m = fake(STEP, ("raw", 400, VLLM_BAD_ARGS), reply("pong"))
    assert agent(sb, via(m.url)).stop_reason == "model_refused"
    m = fake(STEP, ("raw", 500, LLAMACPP_BAD_ARGS), ("raw", 500, LLAMACPP_BAD_ARGS), reply("pong"))
    assert agent(sb, via(m.url)).stop_reason == "model_refused"
    assert m.requests[2]["messages"] == m.requests[1]["messages"] and m.requests[2]["max_tokens"] == 1


@CLIENTS
def test_a_500_that_passes_when_sent_again_stays_infra(sb, fake, via):
    m = fake(STEP, ("raw", 500, b'{"error": {"message": "CUDA error: an illegal memory access"}}'), reply("pong"))
    with pytest.raises(ModelError, match="a passing failure"):
        agent(sb, via(m.url))


# ---- max_tokens beyond what the context leaves: the harness asked too much ---------------------------

@CLIENTS
@pytest.mark.parametrize("body", [
    # vLLM: prompt + max_tokens over max_model_len (the prompt fits)
    {"object": "error", "code": 400, "message": "This model's maximum context length is 4096 tokens. However, you "
     "requested 33768 tokens (1000 in the messages, 32768 in the completion). Please reduce the length of the "
     "messages or completion."},
    # vLLM (newer wording)
    {"object": "error", "code": 400, "message": "'max_tokens' or 'max_completion_tokens' is too large: 32768. This "
     "model's maximum context length is 4096 tokens and your request has 1000 input tokens (32768 > 4096 - 1000)."},
], ids=["vllm", "vllm_new"])
def test_max_tokens_beyond_the_context_left_is_lowered_and_sent_again_not_a_zero(sb, fake, via, body):
    m = fake(("raw", 400, json.dumps(body).encode()), reply("done"))
    res = agent(sb, via(m.url))
    assert (res.stop_reason, res.answer) == ("stop", "done")
    assert m.requests[1]["max_tokens"] == 3096
