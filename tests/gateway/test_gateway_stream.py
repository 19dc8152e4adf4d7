"""Streaming through the node's model gateway: a harness's `stream: true` call is streamed
from the real scripted policy server (vLLM's chunk format) and forwarded event by event; the
model_calls row holds the ids and logprobs the server sent, assembled from the chunks; an
abort or a refusal before any output is retried unseen by the client."""
from __future__ import annotations

import http.client
import json
import urllib.parse

import pytest

from controller.demo import streaming
from controller.demo.policy_server import PolicyServer
from controller.taskbank.builtin import builtin_taskset
from nodeagent.gateway.server import GatewayServer
from nodeagent.gateway.session import GatewayBudgets, Session, Upstream

TASKSET = builtin_taskset()
PY_TASK = TASKSET.by_name()["python/reverse_words"]


@pytest.fixture(scope="module")
def policy():
    with PolicyServer(TASKSET) as srv:
        yield srv


def stream_call(conn: http.client.HTTPConnection, key: str, payload: dict) -> tuple[int, list[bytes]]:
    """POST a streaming call on a kept connection; (status, the data of each event)."""
    conn.request("POST", "/v1/chat/completions", json.dumps(payload),
                 {"Content-Type": "application/json", "Authorization": f"Bearer {key}"})
    resp = conn.getresponse()
    raw = resp.read()
    if resp.status != 200:
        return resp.status, [raw]
    assert resp.getheader("Content-Type") == "text/event-stream"
    return 200, [e[6:] for e in raw.split(b"\n\n") if e.startswith(b"data: ")]


def assemble(events: list[bytes]) -> dict:
    """What an OpenAI client makes of the stream: the message, the finish reason."""
    content, calls, finish = "", {}, None
    for e in events[:-1]:
        c = json.loads(e)["choices"]
        if not c:
            continue
        d = c[0]["delta"]
        content += d.get("content") or ""
        for tc in d.get("tool_calls") or []:
            call = calls.setdefault(tc["index"], {"id": None, "name": "", "arguments": ""})
            call["id"] = tc.get("id") or call["id"]
            call["name"] += tc["function"].get("name") or ""
            call["arguments"] += tc["function"].get("arguments") or ""
        finish = c[0].get("finish_reason") or finish
    return {"content": content, "calls": [calls[i] for i in sorted(calls)], "finish": finish}


@pytest.mark.parametrize("flavor", ["both", "vllm", "sglang"])
def test_a_streamed_call_is_streamed_from_the_server_and_recorded_exactly(policy, flavor):
    s = Session(Upstream(0, policy.url, "scripted-v0"), GatewayBudgets(20, 100_000, 30.0), flavor=flavor)
    messages = [{"role": "system", "content": "sys"}, {"role": "user", "content": PY_TASK.instruction}]
    with GatewayServer(s, tcp=("127.0.0.1", 0)) as gw:
        u = urllib.parse.urlsplit(gw.url)
        conn = http.client.HTTPConnection(u.hostname, u.port, timeout=10)
        seen = []
        for turn in range(3):
            status, events = stream_call(conn, s.key, {"model": "x", "messages": messages, "seed": 3,
                                                       "stream": True})
            assert status == 200 and events[-1] == b"[DONE]"
            first = json.loads(events[0])
            # the server's chunks, forwarded one by one (role, STREAM_PIECES slices, finish)
            assert len(events) - 1 == streaming.STREAM_PIECES + 2
            assert all(json.loads(e)["id"] == first["id"] for e in events[:-1])
            msg = assemble(events)
            seen.append((first["id"], msg))
            turn_msg = {"role": "assistant", "content": msg["content"]}
            if msg["calls"]:
                assert msg["finish"] == "tool_calls"
                turn_msg["tool_calls"] = [{"id": c["id"], "type": "function",
                                           "function": {"name": c["name"], "arguments": c["arguments"]}}
                                          for c in msg["calls"]]
            messages = messages + [turn_msg] + [{"role": "tool", "tool_call_id": c["id"], "content": "ok"}
                                                for c in msg["calls"]]
        conn.close()
    assert any(m["calls"] for _, m in seen), "the script makes tool calls: their deltas are assembled"
    assert len(s.rows) == 3
    for row, (rid, msg) in zip(s.rows, seen):
        prompt, completion, lps = policy.policy.served[rid]
        assert row["status"] == "ok" and row["retries"] == 0
        assert row["prompt_token_ids"] == prompt
        assert row["completion_token_ids"] == completion
        assert row["completion_logprobs"] == lps
        stored = json.loads(row["response"])["choices"][0]
        assert stored["message"]["content"] == msg["content"]
        assert [c["function"]["arguments"] for c in stored["message"].get("tool_calls", [])] == \
            [c["arguments"] for c in msg["calls"]]
        assert row["finish_reason"] == msg["finish"]
    assert [r["prompt_extends_previous"] for r in s.rows] == [False, True, True]


def test_the_usage_chunk_goes_to_a_client_only_if_it_asked(policy):
    s = Session(Upstream(0, policy.url, "scripted-v0"), GatewayBudgets(20, 100_000, 30.0))
    body = {"model": "x", "messages": [{"role": "user", "content": PY_TASK.instruction}], "stream": True}
    with GatewayServer(s, tcp=("127.0.0.1", 0)) as gw:
        u = urllib.parse.urlsplit(gw.url)
        conn = http.client.HTTPConnection(u.hostname, u.port, timeout=10)
        _, plain = stream_call(conn, s.key, body)
        _, usage = stream_call(conn, s.key, dict(body, stream_options={"include_usage": True}))
        conn.close()
    assert not any(json.loads(e).get("usage") for e in plain[:-1])
    assert json.loads(usage[-2])["usage"]["completion_tokens"] == len(s.rows[1]["completion_token_ids"])
    assert s.rows[0]["completion_tokens"] == len(s.rows[0]["completion_token_ids"])    # recorded anyway


def test_an_abort_or_refusal_before_any_output_is_retried_unseen(policy):
    policy.set_policy(1, policy.policy.params(0))
    current = {"v": 0}
    slept = []

    def upstream():
        return Upstream(current["v"], policy.url, f"scripted-v{current['v']}")

    def sleep(s):                # the backoff: the node learns of version 1 meanwhile
        slept.append(s)
        policy.policy.loading = False
        current["v"] = 1
    s = Session(upstream, GatewayBudgets(5, 100_000, 30.0), sleep=sleep)
    body = {"model": "x", "messages": [{"role": "user", "content": PY_TASK.instruction}], "stream": True}
    try:
        with GatewayServer(s, tcp=("127.0.0.1", 0)) as gw:
            u = urllib.parse.urlsplit(gw.url)
            conn = http.client.HTTPConnection(u.hostname, u.port, timeout=10)
            policy.policy.abort_next = 1          # in flight, finish_reason "abort"
            status, aborted = stream_call(conn, s.key, body)
            current["v"] = 0
            policy.policy.loading = True          # refused: 503 model_loading
            status2, refused = stream_call(conn, s.key, body)
            conn.close()
    finally:
        policy.policy.loading, policy.policy.abort_next = False, 0
    for st, events in ((status, aborted), (status2, refused)):
        assert st == 200 and assemble(events)["finish"] in ("stop", "tool_calls")
        assert json.loads(events[0])["model"] == "scripted-v1"
    assert len(slept) == 2
    assert [(r["retries"], r["call_policy_version"]) for r in s.rows] == [(1, 1), (1, 1)]
    for r in s.rows:
        served = policy.policy.served[json.loads(r["response"])["id"]]
        assert (r["prompt_token_ids"], r["completion_token_ids"], r["completion_logprobs"]) == served
