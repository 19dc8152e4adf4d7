"""Phase deadlines, the end-to-end deadline and cancellation of one rollout attempt, on real
sandboxes (`run_attempt`, what the node agent's slot threads run), against a tool-calling model
server (the model server is outside Paddock). An infrastructure phase past its deadline is
`infra_error` with reason `deadline: <phase>`, never a reward; the agent phase's is the policy's
(`timeout`, reward 0, stop reason `deadline`); a cancelled attempt stops within a second,
writes nothing and leaves no sandbox."""
from __future__ import annotations

import threading
import time
import uuid

import pyarrow.parquet as pq
import pytest

from controller.taskbank.builtin import builtin_taskset
from nodeagent.agent.attempt import Attempt, run_attempt
from tests.agent.toolpolicy import ToolPolicy

pytestmark = pytest.mark.sandbox


@pytest.fixture
def policy():
    p = ToolPolicy()
    yield p
    p.close()


def task(**budgets) -> dict:
    t = next(t for t in builtin_taskset().tasks if t.family == "python")
    d = {**t.canonical(), "task_id": t.task_id}
    d["budgets"] = {**d["budgets"], **budgets}
    return d


def attempt(tmp_path, policy, t: dict) -> Attempt:
    return Attempt("run", str(tmp_path), "r1", 1, 1, "b", 0, t, 0, policy.url, "m")


def row_of(tmp_path, res) -> dict:
    (row,) = pq.read_table(tmp_path / res.shards["rollouts"]).to_pylist()
    return row


def test_the_end_to_end_deadline_in_the_agent_phase_is_the_policys_timeout(runtime, python_image, policy, tmp_path):
    t0 = time.monotonic()
    res = run_attempt(runtime, python_image, "n1", attempt(tmp_path, policy, task(total_s=2.0)))
    took = time.monotonic() - t0
    assert (res.outcome, res.reward, res.infra_reason) == ("timeout", 0.0, None)
    assert row_of(tmp_path, res)["stop_reason"] == "deadline"
    assert took < 8, f"the attempt ran {took:.1f}s past a 2s deadline"
    assert runtime.active_sandboxes() == 0


def test_a_create_phase_past_its_deadline_is_an_infra_error(runtime, python_image, policy, tmp_path):
    res = run_attempt(runtime, python_image, "n1", attempt(tmp_path, policy, task(create_s=0.001)))
    assert (res.outcome, res.reward) == ("infra_error", None)
    assert res.infra_reason.startswith("deadline: create: "), res.infra_reason
    assert policy.requests == 0 and runtime.active_sandboxes() == 0


def test_a_setup_phase_past_its_deadline_is_an_infra_error(runtime, python_image, policy, tmp_path):
    t = task(setup_s=1.0)
    t["setup"] = [f"sleep 30 # {uuid.uuid4().hex}"]      # a recipe of its own: never a cached layer
    t0 = time.monotonic()
    res = run_attempt(runtime, python_image, "n1", attempt(tmp_path, policy, t))
    took = time.monotonic() - t0
    assert (res.outcome, res.reward) == ("infra_error", None)
    assert res.infra_reason.startswith("deadline: setup: "), res.infra_reason
    assert took < 8 and policy.requests == 0
    assert runtime.active_sandboxes() == 0


def test_a_verify_phase_past_its_deadline_is_an_infra_error_not_a_fail(runtime, python_image, policy, tmp_path):
    policy.command = None              # answers at once: the verifier grades the untouched stub
    res = run_attempt(runtime, python_image, "n1", attempt(tmp_path, policy, task(verify_s=0.001)))
    assert (res.outcome, res.reward) == ("infra_error", None)
    assert res.infra_reason.startswith("deadline: verify: "), res.infra_reason
    assert row_of(tmp_path, res)["infra_reason"] == res.infra_reason


def test_the_same_attempt_without_deadlines_is_graded(runtime, python_image, policy, tmp_path):
    policy.command = None
    res = run_attempt(runtime, python_image, "n1", attempt(tmp_path, policy, task()))
    assert (res.outcome, res.reward, res.infra_reason) == ("fail", 0.0, None)   # the stub fails its tests


def test_a_cancelled_attempt_stops_within_a_second_and_writes_nothing(runtime, python_image, policy, tmp_path):
    a = attempt(tmp_path, policy, task())
    out: list = []
    th = threading.Thread(target=lambda: out.append(run_attempt(runtime, python_image, "n1", a)))
    th.start()
    from tests.conftest import wait_for
    wait_for(lambda: policy.requests >= 1 and runtime.active_sandboxes() >= 1, 60, "the agent runs its tool call")
    time.sleep(0.3)                   # the tool call (sleep 30) is under way in the sandbox
    t0 = time.monotonic()
    a.cancel.set("cancelled_by_trainer")
    th.join(10)
    took = time.monotonic() - t0
    assert not th.is_alive()
    (res,) = out
    assert (res.outcome, res.infra_reason, res.shards) == ("infra_error", "cancelled: cancelled_by_trainer", {})
    assert took < 1.0, f"the cancelled attempt ended {took:.2f}s after its cancel"
    assert runtime.active_sandboxes() == 0
    assert not (tmp_path / "changes").exists() and not list(tmp_path.rglob("*.parquet"))


def test_a_runs_end_to_end_deadline_applies_to_a_task_without_one(runtime, python_image, policy, tmp_path):
    t0 = time.monotonic()
    res = run_attempt(runtime, python_image, "n1", attempt(tmp_path, policy, task()), run_budgets={"total_s": 1.5})
    assert (res.outcome, res.reward) == ("timeout", 0.0) and time.monotonic() - t0 < 8
    assert row_of(tmp_path, res)["stop_reason"] == "deadline"


def slow_grading(t: dict) -> dict:
    """The task with a hidden test that sleeps: grading takes 30 s."""
    t = dict(t)
    t["hidden"] = {**t["hidden"], "test_hidden.py": "import time\n\ndef test_slow():\n    time.sleep(30)\n"}
    return t


@pytest.mark.parametrize("phase", ["setup", "model call", "tool call", "verify"])
def test_a_cancel_in_any_phase_ends_the_attempt_within_a_second(runtime, python_image, policy, tmp_path, phase):
    from tests.agent.toolpolicy import HANG
    from tests.conftest import wait_for
    t = task()
    if phase == "setup":
        t["setup"] = [f"sleep 30 # {uuid.uuid4().hex}"]
    elif phase == "model call":
        policy.command = HANG
    elif phase == "verify":
        policy.command, t = None, slow_grading(t)
    a = attempt(tmp_path, policy, t)
    out: list = []
    th = threading.Thread(target=lambda: out.append(run_attempt(runtime, python_image, "n1", a)))
    th.start()
    if phase in ("setup", "verify"):
        wait_for(lambda: runtime.active_sandboxes() >= 1 and policy.requests == (phase == "verify"), 60,
                 f"the {phase} sandbox at work")
    else:
        wait_for(lambda: policy.requests >= 1 and runtime.active_sandboxes() >= 1, 60, "the agent at work")
    time.sleep(0.5)
    t0 = time.monotonic()
    a.cancel.set("cancelled_by_trainer")
    th.join(10)
    took = time.monotonic() - t0
    assert not th.is_alive()
    print(f"\ncancelled in its {phase}: the attempt ended {took:.3f}s later")
    assert out[0].infra_reason == "cancelled: cancelled_by_trainer" and out[0].shards == {}
    assert took < 1.0, f"cancelled in its {phase}, the attempt ended {took:.2f}s later"
    assert runtime.active_sandboxes() == 0


def test_grading_past_its_deadline_is_cut_and_is_an_infra_error(runtime, python_image, policy, tmp_path):
    policy.command = None
    t0 = time.monotonic()
    res = run_attempt(runtime, python_image, "n1", attempt(tmp_path, policy, slow_grading(task(verify_s=2.0))))
    assert (res.outcome, res.reward) == ("infra_error", None) and res.infra_reason.startswith("deadline: verify: ")
    assert time.monotonic() - t0 < 10


def test_an_attempt_cancelled_before_it_starts_makes_no_sandbox_and_no_model_call(runtime, python_image, policy,
                                                                                   tmp_path):
    a = attempt(tmp_path, policy, task())
    a.cancel.set("shutdown")
    res = run_attempt(runtime, python_image, "n1", a)
    assert (res.infra_reason, res.shards) == ("cancelled: shutdown", {})
    assert policy.requests == 0 and runtime.active_sandboxes() == 0 and not list(tmp_path.iterdir())
