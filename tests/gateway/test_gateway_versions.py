"""Weight updates do not kill rollouts: the controller tells agents its newest policy (the
`policy` message, from the real broker core through the real codec into the real agent
core, and on a real farm over ZeroMQ); a rollout's gateway session, refused by the real
scripted policy server because it swapped to that version mid-rollout, retries the call
under it, and each call's row records the version that answered."""
from __future__ import annotations

import json
import threading

from controller.contracts import protocol as P
from controller.demo.policy_server import PolicyServer
from controller.taskbank.builtin import builtin_taskset
from nodeagent.agent.core import AgentCore, AttemptResult
from nodeagent.gateway.session import Follow, GatewayBudgets, Session, Upstream
from tests.broker.test_broker import DEP, Farm, Harness, client

TASKSET = builtin_taskset()
PY_TASK = TASKSET.by_name()["python/reverse_words"]


def turn(s: Session, messages: list) -> dict:
    body = s.complete({"model": "x", "messages": messages, "seed": 5}, 10.0)
    msg = body["choices"][0]["message"]
    messages.append({k: v for k, v in msg.items() if k in ("role", "content", "tool_calls")})
    for c in msg.get("tool_calls") or []:
        messages.append({"role": "tool", "tool_call_id": c["id"], "content": "ok"})
    return body


def test_the_controller_tells_agents_its_newest_policy_on_publish_and_on_registration(tmp_path):
    h = Harness(tmp_path)
    h.send("new", P.Register(node="new", slots=1, images=[], mem_free_mb=1, agent_version="0.4.0"))
    h.send("old", P.Register(node="old", slots=1, images=[], mem_free_mb=1, agent_version="0.3.0"))
    out = h.send(b"client", P.PublishPolicy(idem="p2", version=2, endpoint="http://127.0.0.1:9/v1",
                                            model="m2"))
    told = [(peer, m.policy) for peer, m in out if isinstance(m, P.PolicyUpdate)]
    assert told == [(b"new", P.PolicyRef(2, "http://127.0.0.1:9/v1", "m2"))]     # not the 0.3 agent
    out = h.send("late", P.Register(node="late", slots=1, images=[], mem_free_mb=1, agent_version="0.4.0"))
    assert [type(m).TYPE for peer, m in out if peer == b"late"] == ["welcome", "policy"]


def test_a_call_refused_by_a_weight_swap_is_retried_under_the_version_the_controller_told(tmp_path):
    h = Harness(tmp_path)
    core = AgentCore("n1", 1, DEP, clock=h.clock)
    with PolicyServer(TASKSET) as srv:
        srv.set_policy(1, srv.policy.params(0))
        srv.set_policy(2, srv.policy.params(0))
        session = Session(Follow(Upstream(1, srv.url, "scripted-v1"), lambda: core.policy),
                          GatewayBudgets(10, 100_000, 60.0), sleep=lambda _s: None)
        messages = [{"role": "system", "content": "sys"}, {"role": "user", "content": PY_TASK.instruction}]
        turn(session, messages)                    # answered by version 1
        srv.policy.swap_after(0, 2)                # the server now holds version 2 only
        # The trainer publishes version 2; the broker tells the agent (real frames, real codec).
        h.send("n1", P.Register(node="n1", slots=1, images=[], mem_free_mb=1, agent_version="0.4.0"))
        out = h.send(b"client", P.PublishPolicy(idem="p2", version=2, endpoint=srv.url, model="scripted-v2"))
        for peer, m in out:
            if peer == b"n1":
                core.receive_data(P.encode(m, DEP))
        assert core.policy == P.PolicyRef(2, srv.url, "scripted-v2") and core.bad_frames == 0
        refused = srv.policy.refused_loading
        body = turn(session, messages)             # refused (503 model_loading), retried under v2
        assert srv.policy.refused_loading == refused + 1 and body["model"] == "scripted-v2"
        turn(session, messages)                    # the rollout stays on version 2
        session.close()
    rows = session.rows
    assert [(r["call_policy_version"], r["retries"], r["status"]) for r in rows] == [
        (1, 0, "ok"), (2, 1, "ok"), (2, 0, "ok")]
    for r in rows:                                 # recorded exactly, whichever version answered
        assert srv.policy.served[json.loads(r["response"])["id"]] == (
            r["prompt_token_ids"], r["completion_token_ids"], r["completion_logprobs"])
    # the environment was kept: the retried call continues the same conversation
    assert [r["prompt_extends_previous"] for r in rows] == [False, True, True]


def test_without_news_of_a_newer_version_the_call_fails_after_its_retries(tmp_path):
    with PolicyServer(TASKSET) as srv:
        srv.set_policy(1, srv.policy.params(0))
        srv.policy.serve(1)                        # the server moved on; the node never heard
        slept = []
        session = Session(Follow(Upstream(0, srv.url, "scripted-v0"), lambda: None),
                          GatewayBudgets(10, 100_000, 60.0), sleep=slept.append, max_version_retries=3)
        try:
            turn(session, [{"role": "user", "content": PY_TASK.instruction}])
        except Exception as exc:                   # noqa: BLE001 - the ModelError is the point
            err = exc
        session.close()
    assert type(err).__name__ == "ModelError" and getattr(err, "status", None) == 503
    assert len(slept) == 3 and slept == sorted(slept)          # exponential backoff
    assert session.rows[0]["status"] == "error" and session.rows[0]["retries"] == 3


def test_a_rollout_on_a_real_farm_survives_a_weight_update(tmp_path):
    """A real controller and node agent over ZeroMQ (tests/broker/test_broker.py `Farm`), a real
    scripted policy server: the rollout's first call is answered by version 1; the server
    swaps to version 2 and the trainer publishes it; the rollout's next call, refused by the
    server, is retried under version 2 once the agent has heard of it, and the rollout ends."""
    first, gate, rows = threading.Event(), threading.Event(), []
    farm = Farm(tmp_path)
    try:
        with PolicyServer(TASKSET) as srv:
            for v in (1, 2):
                srv.set_policy(v, srv.policy.params(0))
            srv.policy.serve(1)

            def runner(a):              # the gateway part of an attempt, the environment kept
                s = Session(Follow(Upstream(a.policy_version, a.endpoint, a.model), lambda: agent.core.policy),
                            GatewayBudgets(10, 100_000, 60.0))
                messages = [{"role": "user", "content": PY_TASK.instruction}]
                turn(s, messages)
                first.set()
                gate.wait(30)
                turn(s, messages)
                s.close()
                rows.extend(s.rows)
                return AttemptResult("pass", 1.0, {}, None)
            agent = farm.agent("n1", 1, runner=runner)
            with client(farm.endpoint, farm.key_file) as c:
                c.publish_policy(1, srv.url, "scripted-v1")
                batch = c.submit(["t1"], 1, 1)
                assert first.wait(30)
                srv.policy.serve(2)     # the weight update: the server holds version 2 only
                c.publish_policy(2, srv.url, "scripted-v2")
                gate.set()
                (item,) = c.wait(batch)
    finally:
        gate.set()
        farm.stop()
    assert item["state"] == "committed"
    assert [(r["call_policy_version"], r["status"]) for r in rows] == [(1, "ok"), (2, "ok")]
    assert rows[1]["retries"] >= 1 and srv.policy.refused_loading >= 1
    assert agent.core.policy.version == 2
