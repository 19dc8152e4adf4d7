"""The node's model gateway against the real scripted policy server over HTTP: every call is
recorded with the ids and logprobs the server sent (100%), missing ones are NULL, budgets are
enforced, a weight update is retried, streaming clients get SSE."""
from __future__ import annotations

import json
import urllib.error
import urllib.request

import pytest

from controller.demo import tokenizer
from controller.demo.policy_server import PolicyServer
from controller.taskbank.builtin import builtin_taskset
from nodeagent.gateway import wire
from nodeagent.gateway.server import GatewayServer
from nodeagent.gateway.session import GatewayBudgets, Session, Upstream
from nodeagent.harness.model import BudgetExhausted, ModelError

TASKSET = builtin_taskset()
PY_TASK = TASKSET.by_name()["python/reverse_words"]


@pytest.fixture(scope="module")
def policy():
    with PolicyServer(TASKSET) as srv:
        yield srv


def session(policy, **kw) -> Session:
    budgets = GatewayBudgets(kw.pop("max_calls", 20), kw.pop("max_tokens", 100_000), kw.pop("wall_s", 30.0))
    return Session(Upstream(0, policy.url, "scripted-v0"), budgets, **kw)


def drive(s: Session, turns: int, seed: int = 1) -> list[dict]:
    messages = [{"role": "system", "content": "sys"}, {"role": "user", "content": PY_TASK.instruction}]
    bodies = []
    for _ in range(turns):
        body = s.complete({"model": "anything", "messages": messages, "seed": seed}, 10.0)
        msg = body["choices"][0]["message"]
        messages.append({k: v for k, v in msg.items() if k in ("role", "content", "tool_calls")})
        for c in msg.get("tool_calls") or []:
            messages.append({"role": "tool", "tool_call_id": c["id"], "content": "ok"})
        bodies.append(body)
    return bodies


def test_every_call_records_the_ids_and_logprobs_the_server_served(policy):
    s = session(policy)
    bodies = drive(s, 3)
    assert len(s.rows) == 3
    for row, body in zip(s.rows, bodies):
        prompt, completion, lps = policy.policy.served[body["id"]]
        assert row["prompt_token_ids"] == prompt
        assert row["completion_token_ids"] == completion
        assert row["completion_logprobs"] == lps
        assert row["status"] == "ok" and row["model"] == "scripted-v0" and row["request_model"] == "anything"
        assert row["call_policy_version"] == 0 and row["finish_reason"] in ("stop", "tool_calls")


def test_a_linear_conversation_extends_the_previous_call(policy):
    s = session(policy)
    drive(s, 3)
    assert [r["prompt_extends_previous"] for r in s.rows] == [False, True, True]
    assert [r["parent_call"] for r in s.rows] == [None, 0, 1]


def test_a_branch_names_its_parent_and_does_not_extend_the_previous_call():
    hist = [([1, 2], [3]), ([1, 2, 3, 9], [4]), ([7], [8])]
    assert wire.find_parent(hist, [1, 2, 3, 5]) == (0, False)
    assert wire.find_parent(hist, [7, 8, 1]) == (2, True)
    assert wire.find_parent(hist, [6]) == (None, False)


def test_the_gateway_asks_in_the_forms_vllm_and_sglang_accept():
    p = wire.upstream_payload({"model": "x", "messages": [], "stream": True}, "m")
    assert p["model"] == "m" and "stream" not in p
    assert p["logprobs"] is True and p["return_token_ids"] is True and p["return_tokens_as_token_ids"] is True
    assert p["return_prompt_token_ids"] is True and p["return_meta_info"] is True
    assert "return_meta_info" not in wire.upstream_payload({}, "m", "vllm")
    assert "return_token_ids" not in wire.upstream_payload({}, "m", "sglang")


def test_sglang_meta_info_and_vllm_token_id_strings_are_read_back():
    sg = {"choices": [{"prompt_token_ids": [1, 2], "finish_reason": "stop",
                       "meta_info": {"output_token_logprobs": [[-0.5, 7, "a"], [-0.25, 8, "b"]]}}]}
    assert wire.extract(sg) == wire.Tokens([1, 2], [7, 8], [-0.5, -0.25], "stop")
    vl = {"choices": [{"logprobs": {"content": [{"token": "token_id:42", "logprob": -1.0}]}}]}
    assert wire.extract(vl) == wire.Tokens(None, [42], [-1.0], None)


def test_a_server_without_token_ids_or_logprobs_is_recorded_as_missing_never_invented(policy):
    plain = {"choices": [{"index": 0, "message": {"role": "assistant", "content": "hi"}, "finish_reason": "stop"}],
             "usage": {"prompt_tokens": 3, "completion_tokens": 1}}

    class Plain:
        def complete(self, payload, timeout_s):
            return plain
    s = Session(Upstream(0, Plain(), "m"), GatewayBudgets(5, 1000, 10.0))
    s.complete({"messages": [{"role": "user", "content": "x"}]}, 5.0)
    row = s.rows[0]
    assert row["prompt_token_ids"] is None and row["completion_token_ids"] is None
    assert row["completion_logprobs"] is None and row["prompt_extends_previous"] is None


def test_budgets_of_calls_and_tokens_are_enforced_at_the_gateway(policy):
    s = session(policy, max_calls=2)
    drive(s, 2)
    with pytest.raises(BudgetExhausted) as exc:
        drive(s, 1)
    assert exc.value.kind == "calls" and s.rows[-1]["status"] == "budget"
    s = session(policy, max_tokens=10)
    drive(s, 1)
    with pytest.raises(BudgetExhausted) as exc:
        drive(s, 1)
    assert exc.value.kind == "tokens"


def test_a_weight_update_is_retried_under_the_then_current_version(policy):
    policy.set_policy(1, policy.policy.params(0))
    current = {"v": 0}

    def upstream():
        return Upstream(current["v"], policy.url, f"scripted-v{current['v']}")

    def sleep(_s):               # the backoff: the new version is loaded meanwhile
        policy.policy.loading = False
        current["v"] = 1
    s = Session(upstream, GatewayBudgets(5, 100_000, 30.0), sleep=sleep)
    policy.policy.loading = True
    try:
        drive(s, 1)
    finally:
        policy.policy.loading = False
    assert s.rows[0]["retries"] == 1 and s.rows[0]["call_policy_version"] == 1
    assert s.rows[0]["model"] == "scripted-v1"


def test_a_server_that_keeps_failing_is_a_model_error_recorded_as_such(policy):
    s = Session(Upstream(0, "http://127.0.0.1:9/v1", "m"), GatewayBudgets(5, 1000, 5.0))
    with pytest.raises(ModelError):
        s.complete({"messages": [{"role": "user", "content": "x"}]}, 2.0)
    assert s.rows[0]["status"] == "error" and s.rows[0]["error"]


def post(url, body, key=None):
    headers = {"Content-Type": "application/json"}
    if key:
        headers["Authorization"] = f"Bearer {key}"
    req = urllib.request.Request(url, json.dumps(body).encode(), headers=headers, method="POST")
    try:
        with urllib.request.urlopen(req, timeout=10) as r:
            return r.status, r.headers.get("Content-Type"), r.read()
    except urllib.error.HTTPError as e:
        return e.code, e.headers.get("Content-Type"), e.read()


def test_the_http_front_serves_json_and_sse_and_refuses_a_wrong_key(policy):
    s = session(policy)
    with GatewayServer(s, tcp=("127.0.0.1", 0)) as gw:
        body = {"model": "x", "messages": [{"role": "user", "content": PY_TASK.instruction}], "seed": 2}
        assert post(gw.url + "/chat/completions", body)[0] == 401
        status, ctype, raw = post(gw.url + "/chat/completions", body, s.key)
        assert status == 200 and json.loads(raw)["choices"][0]["message"]
        status, ctype, raw = post(gw.url + "/chat/completions", dict(body, stream=True), s.key)
        assert status == 200 and ctype == "text/event-stream" and raw.endswith(b"data: [DONE]\n\n")
        chunks = [json.loads(l[6:]) for l in raw.decode().split("\n\n") if l.startswith("data: {")]
        assert chunks[0]["choices"][0]["delta"]["role"] == "assistant"
    assert len(s.rows) == 2


def test_the_http_front_answers_429_when_the_budget_is_spent(policy):
    s = session(policy, max_calls=1)
    with GatewayServer(s, tcp=("127.0.0.1", 0)) as gw:
        body = {"model": "x", "messages": [{"role": "user", "content": "hello"}]}
        assert post(gw.url + "/chat/completions", body, s.key)[0] == 200
        status, _, raw = post(gw.url + "/chat/completions", body, s.key)
    assert status == 429 and json.loads(raw)["error"]["code"] == "budget_exhausted:calls"


def test_the_scripted_tokenizer_is_deterministic():
    assert tokenizer.encode("plan: solve") == tokenizer.encode("plan: solve")
    assert tokenizer.token_id("solve") == 256 + int.from_bytes(
        __import__("hashlib").blake2b(b"solve", digest_size=8).digest(), "big") % 65000
