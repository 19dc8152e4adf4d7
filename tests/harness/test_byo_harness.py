"""Bring your own harness: a task's harness command runs inside the sandbox, reaches the node's
gateway at http://127.0.0.1:3128/v1 through the sandbox's relay (no network), and is graded on
its final state; ids stored equal ids served; a harness that fails or hangs is bounded and its
exit recorded, never an infra_error -- unless its model server is down."""
from __future__ import annotations

import json
import socket

import pytest

from controller.analysis.query import connect
from controller.contracts.tasks import Budgets, Task
from controller.store.catalog import Catalog
from controller.taskbank.builtin import builtin_taskset
from nodeagent.agent.attempt import Attempt, run_attempt

pytestmark = pytest.mark.sandbox
TASKSET = builtin_taskset()
PY_TASK = TASKSET.by_name()["python/reverse_words"]

# A minimal OpenAI-style harness (stdlib only): chat with the model, run its tool calls.
HARNESS = r'''
import json, os, subprocess, sys, urllib.request
base, key = os.environ["OPENAI_BASE_URL"], os.environ["OPENAI_API_KEY"]
messages = [{"role": "system", "content": "sys"}, {"role": "user", "content": sys.stdin.read()}]
for _ in range(8):
    req = urllib.request.Request(base + "/chat/completions", json.dumps(
        {"model": "whatever", "messages": messages, "seed": 1}).encode(),
        {"Content-Type": "application/json", "Authorization": "Bearer " + key})
    msg = json.load(urllib.request.urlopen(req, timeout=30))["choices"][0]["message"]
    messages.append({k: v for k, v in msg.items() if k in ("role", "content", "tool_calls")})
    if not msg.get("tool_calls"):
        break
    for c in msg["tool_calls"]:
        a = json.loads(c["function"]["arguments"])
        if c["function"]["name"] == "write_file":
            open(a["path"], "w").write(a["content"]); out = "ok"
        else:
            out = subprocess.run(a.get("command", "true"), shell=True, capture_output=True, text=True).stdout
        messages.append({"role": "tool", "tool_call_id": c["id"], "content": out})
print("harness done")
'''


@pytest.fixture(scope="module")
def policy(solving_policy):
    return solving_policy


def harness_task(argv, files=None, **budgets) -> Task:
    fields = {f: getattr(PY_TASK, f) for f in PY_TASK.__dataclass_fields__}
    fields["files"] = {**PY_TASK.files, **(files or {})}
    fields["harness"] = tuple(argv)
    if budgets:
        fields["budgets"] = Budgets(**budgets)
    return Task(**fields)


def run(tmp_path, task, policy, url=None):
    lease = {**task.canonical(), "task_id": task.task_id}
    res = run_attempt(RUNTIME[0], IMAGE[0], "n1", Attempt("run", str(tmp_path), "r1", 1, 1, "b", 1, lease, 7,
                                                    url or policy.url, "scripted-v7"))
    with Catalog(tmp_path) as cat:
        cat.commit("r1", 1, 1, res.shards, 0.0)
    return res, connect(tmp_path)


RUNTIME, IMAGE = [None], [None]


@pytest.fixture(autouse=True)
def _sandbox(runtime, python_image):
    RUNTIME[0], IMAGE[0] = runtime, python_image


def test_a_harness_in_the_sandbox_solves_through_the_gateway_and_ids_match(tmp_path, policy):
    task = harness_task(["python3", "/work/harness.py"], {"harness.py": HARNESS})
    res, con = run(tmp_path, task, policy)
    assert (res.outcome, res.reward) == ("pass", 1.0), res.infra_reason
    rows = con.execute("SELECT response, prompt_token_ids, completion_token_ids, completion_logprobs, source, "
                       "prompt_extends_previous FROM model_calls ORDER BY call_index").fetchall()
    assert len(rows) == 3 and {r[4] for r in rows} == {"harness"}
    for response, prompt, completion, lps, *_ in rows:
        assert policy.policy.served[json.loads(response)["id"]] == (prompt, completion, lps)
    assert [r[5] for r in rows] == [False, True, True]
    (stop, exit_code) = con.execute("SELECT r.stop_reason, s.exit_code FROM rollouts r JOIN steps s "
                                    "USING (rollout_id)").fetchone()
    assert (stop, exit_code) == ("harness_exit", 0)


def test_a_harness_that_fails_is_graded_on_its_final_state_with_its_exit_recorded(tmp_path, policy):
    res, con = run(tmp_path, harness_task(["sh", "-c", "echo flood; exit 3"]), policy)
    assert (res.outcome, res.reward, res.infra_reason) == ("fail", 0.0, None)
    assert con.execute("SELECT stop_reason FROM rollouts").fetchone()[0] == "harness_error"
    assert con.execute("SELECT exit_code FROM steps").fetchone()[0] == 3


def test_a_harness_that_hangs_is_stopped_at_the_wall_budget_and_graded(tmp_path, policy):
    res, con = run(tmp_path, harness_task(["sleep", "600"], wall_s=3.0), policy)
    assert res.outcome == "fail" and res.infra_reason is None
    assert con.execute("SELECT stop_reason FROM rollouts").fetchone()[0] == "harness_timeout"


def test_a_harness_whose_model_server_is_down_is_an_infra_error_never_a_reward_0(tmp_path, policy):
    """Every model call fails (nothing listens at the endpoint), the harness exits non-zero:
    that reproduces without the policy (the server answers no probe), so it is the
    infrastructure's, not a graded failure; a harness that fails on its own stays graded."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        dead = f"http://127.0.0.1:{s.getsockname()[1]}/v1"
    task = harness_task(["python3", "/work/harness.py"], {"harness.py": HARNESS}, wall_s=60.0)
    res, _ = run(tmp_path, task, policy, url=dead)
    assert (res.outcome, res.infra_code) == ("infra_error", "model_server"), res.infra_reason
    assert "does not answer without the policy's output" in res.infra_reason
