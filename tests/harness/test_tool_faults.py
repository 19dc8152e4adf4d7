"""Seeded tool faults: a pure function of the spec's seed, the rollout's seed, the step and the
call; malformed specs are refused naming the key; task ids without faults do not move."""
from __future__ import annotations

import pytest

from controller.contracts.tasks import Task
from controller.taskbank.builtin import builtin_taskset
from nodeagent.harness.faults import FaultSpecError, ToolFaults, faulted_result


def test_the_same_rollout_draws_the_same_faults():
    a = ToolFaults.of({"seed": 1, "error": 0.3, "kill": 0.2}, 5)
    b = ToolFaults.of({"seed": 1, "error": 0.3, "kill": 0.2}, 5)
    draws = [a.draw(s, i) for s in range(20) for i in range(3)]
    assert draws == [b.draw(s, i) for s in range(20) for i in range(3)]
    assert {"error", "kill", None} <= set(draws)


def test_rates_are_honoured_roughly():
    f = ToolFaults.of({"error": 0.25}, 0)
    hits = sum(f.draw(s, 0) == "error" for s in range(4000))
    assert 800 < hits < 1200


def test_no_spec_means_no_faults_and_bad_specs_name_the_key():
    assert ToolFaults.of({}, 1) is None
    with pytest.raises(FaultSpecError, match="'eror'"):
        ToolFaults.of({"eror": 0.1}, 1)
    with pytest.raises(FaultSpecError, match="'kill'"):
        ToolFaults.of({"kill": 2}, 1)
    with pytest.raises(FaultSpecError, match="more than 1"):
        ToolFaults.of({"kill": 0.6, "error": 0.6}, 1)


def test_faulted_results_read_like_a_failed_or_killed_tool():
    assert faulted_result("kill").exit_code == 137
    assert faulted_result("error").error == "injected_fault:error"


def test_new_task_fields_leave_existing_task_ids_unchanged():
    t = builtin_taskset().tasks[0]
    assert "harness" not in t.canonical() and "tool_faults" not in t.canonical()
    assert "max_model_calls" not in t.canonical()["budgets"]
    with_harness = Task(**{**{f: getattr(t, f) for f in t.__dataclass_fields__}, "harness": ("python3", "h.py")})
    assert with_harness.task_id != t.task_id and with_harness.canonical()["harness"] == ["python3", "h.py"]
