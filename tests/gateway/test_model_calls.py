"""A built-in run through the node's gateway: one `model_calls` row per call, committed with its
rollout, ids and logprobs equal to what the scripted policy served for 100% of calls; a
server that sends none is counted in the run summary; seeded tool faults are recorded and
never make an infra_error."""
from __future__ import annotations

import json

import pytest

from controller.analysis.query import connect, summary
from controller.contracts.protocol import PolicyRef
from controller.contracts.tasks import Task
from controller.demo.policy_server import STRATEGIES, default_params
from controller.store.catalog import Catalog
from controller.taskbank.builtin import builtin_taskset
from nodeagent.agent.attempt import Attempt, run_attempt

pytestmark = pytest.mark.sandbox
TASKSET = builtin_taskset()
PY_TASK = TASKSET.by_name()["python/reverse_words"]


@pytest.fixture(scope="module")
def policy(solving_policy):
    return solving_policy


def attempt(run_dir, rid, task, policy, version=7, seed=1):
    lease_task = {**task.canonical(), "task_id": task.task_id}
    return Attempt("run", str(run_dir), rid, 1, 1, "b", seed, lease_task, version, policy.url,
                   f"scripted-v{version}")


def commit(run_dir, rid, res):
    with Catalog(run_dir) as cat:
        cat.commit(rid, 1, 1, res.shards, 0.0)


def test_a_builtin_run_stores_exactly_the_ids_and_logprobs_served(runtime, python_image, policy, tmp_path):
    res = run_attempt(runtime, python_image, "n1", attempt(tmp_path, "r1", PY_TASK, policy))
    assert res.outcome == "pass", res.infra_reason
    commit(tmp_path, "r1", res)
    con = connect(tmp_path)
    rows = con.execute("SELECT response, prompt_token_ids, completion_token_ids, completion_logprobs, "
                       "prompt_extends_previous, step, source, call_policy_version FROM model_calls "
                       "ORDER BY call_index").fetchall()
    steps = con.execute("SELECT count(*) FROM steps").fetchone()[0]
    assert len(rows) == steps == 3
    for response, prompt, completion, lps, *_ in rows:
        assert policy.policy.served[json.loads(response)["id"]] == (prompt, completion, lps)
    assert [r[4] for r in rows] == [False, True, True]
    assert [r[5] for r in rows] == [0, 1, 2] and {r[6] for r in rows} == {"builtin"} and rows[0][7] == 7
    s = summary(tmp_path)["model_calls"]
    assert s["calls"] == 3 and s["missing_prompt_token_ids"] == s["missing_logprobs"] == 0


def test_model_calls_of_an_uncommitted_attempt_never_appear(runtime, python_image, policy, tmp_path):
    run_attempt(runtime, python_image, "n1", attempt(tmp_path, "r1", PY_TASK, policy))
    assert (tmp_path / "model_calls").is_dir()
    assert connect(tmp_path).execute("SELECT count(*) FROM model_calls").fetchone()[0] == 0


def test_seeded_tool_faults_are_recorded_and_never_an_infra_error(runtime, python_image, policy, tmp_path):
    task = Task(**{**{f: getattr(PY_TASK, f) for f in PY_TASK.__dataclass_fields__},
                   "tool_faults": {"seed": 3, "error": 1.0}})
    assert task.task_id != PY_TASK.task_id
    res = run_attempt(runtime, python_image, "n1", attempt(tmp_path, "r1", task, policy))
    assert res.outcome == "fail" and res.infra_reason is None      # the reference was never written
    commit(tmp_path, "r1", res)
    faults = connect(tmp_path).execute("SELECT tool_faults FROM steps WHERE tool_faults IS NOT NULL "
                                       "ORDER BY step").fetchall()
    assert faults and all(json.loads(f)[0]["kind"] == "error" for (f,) in faults)


def test_a_weight_swap_mid_rollout_is_retried_under_the_nodes_newest_policy(runtime, python_image, policy, tmp_path):
    """The server swaps to version 8 after the rollout's first call; the node has heard of 8
    (the agent core's newest `policy`): the refused call is retried under it in the same
    sandbox, the rollout passes, and each call records its version."""
    params = default_params()
    params["python"] = {s: (60.0 if s == "solve" else 0.0) for s in STRATEGIES["python"]}
    policy.set_policy(8, params)
    policy.policy.swap_after(1, 8)
    try:
        res = run_attempt(runtime, python_image, "n1", attempt(tmp_path, "r9", PY_TASK, policy),
                          current_policy=lambda: PolicyRef(8, policy.url, "scripted-v8"))
    finally:
        policy.policy.serve(None)
    assert res.outcome == "pass", res.infra_reason
    commit(tmp_path, "r9", res)
    con = connect(tmp_path)
    rows = con.execute("SELECT call_policy_version, retries, response, prompt_token_ids, completion_token_ids, "
                       "completion_logprobs FROM model_calls ORDER BY call_index").fetchall()
    assert [(v, n) for v, n, *_ in rows] == [(7, 0), (8, 1), (8, 0)]
    for *_, response, prompt, completion, lps in rows:
        assert policy.policy.served[json.loads(response)["id"]] == (prompt, completion, lps)
    assert con.execute("SELECT policy_version FROM rollouts").fetchone()[0] == 7
