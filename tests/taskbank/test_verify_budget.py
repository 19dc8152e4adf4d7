"""A task whose own `budgets.verify_s` is below what its checker may take is refused at
validation, naming the task, its `verify_s` and the checker's need (`grade.verify_time_s`).
Before, it validated and a rollout whose solution stalled grading ended `deadline: verify`:
an infrastructure error charged to the task."""
from __future__ import annotations

import pytest

from controller.contracts.checkerspec import CheckerSpec
from controller.taskbank.builtin import builtin_taskset
from nodeagent.verifier.grade import graded_task, verify_time_s
from nodeagent.verifier.validate import validate_task, verify_budget_error


def task_dict(name: str, **budgets) -> dict:
    t = builtin_taskset().by_name()[name]
    d = {**t.canonical(), "task_id": t.task_id}
    d["budgets"] = {**d["budgets"], **budgets}
    return d


@pytest.mark.sandbox
@pytest.mark.parametrize("name, timeout_s", [("python/gcd", 10.0), ("python/gcd", None), ("math/square_diagonal", None)])
def test_a_verify_budget_below_the_checkers_need_is_refused_naming_both(runtime, python_image, name, timeout_s):
    task = task_dict(name, verify_s=14.0)
    if timeout_s is not None:
        task["checker"] = dict(task["checker"], timeout_s=timeout_s)
    need = verify_time_s(graded_task(task).checker)
    v = validate_task(runtime, python_image, task, quick=True)
    assert not v.ok and v.cases == {}                                  # refused before anything is graded
    (reason,) = v.reasons
    assert reason.startswith(f"task {name!r}: budgets.verify_s is 14 s, below the {need:g} s its "), reason
    assert f"raise verify_s to at least {need:g} s" in reason


def test_a_verify_budget_that_covers_the_checker_or_none_at_all_is_not_refused():
    task = task_dict("python/gcd")
    graded = graded_task(task)
    need = verify_time_s(graded.checker)
    assert verify_budget_error(graded, {"verify_s": need}) is None
    assert verify_budget_error(graded, {"verify_s": need + 1}) is None
    assert verify_budget_error(graded, {}) is None and verify_budget_error(graded, None) is None   # the node's default
    assert verify_budget_error(graded, {"verify_s": need - 0.5}) is not None


def test_the_need_grows_with_the_checkers_time_limit():
    assert verify_time_s(CheckerSpec(kind="pytest", timeout_s=900)) > verify_time_s(CheckerSpec(kind="pytest", timeout_s=10))
