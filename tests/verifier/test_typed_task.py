"""The typed task the verifier receives: decoded and validated once, never changed, read once."""
from __future__ import annotations

import dataclasses
import json

import pytest

from controller.contracts.checkerspec import CheckerSpec, SpecError
from controller.contracts.tasks import GradedTask, LeaseTask, TaskError
from controller.taskbank.builtin import builtin_taskset
from nodeagent.sandbox.runtime import Change
from nodeagent.verifier import canaries, pytestcheck
from nodeagent.verifier.baseline import Baseline
from nodeagent.verifier.grade import VerifierInfraError, graded_task, verify


def wire(name: str = "python/gcd", **over) -> dict:
    """A built-in task as JSON travels: its canonical form with its id."""
    t = builtin_taskset().by_name()[name]
    return json.loads(json.dumps({**t.canonical(), "task_id": t.task_id, **over}))


def test_a_lease_task_and_its_json_give_the_same_graded_task():
    d = wire()
    from_lease = GradedTask.of(LeaseTask.decode(d))
    assert from_lease == GradedTask.from_json(d)
    assert from_lease.checker == CheckerSpec(kind="pytest", tests=("test_hidden.py", "test_visible.py"))
    assert (from_lease.ident, from_lease.task_id) == (d["task_id"], d["task_id"])


def test_binary_contents_are_bytes_and_the_spec_keeps_the_graders_defaults_open():
    blob = bytes(range(256))
    d = wire()
    d["files"] = {**d["files"], "solution.py": "x = 1\n", "data.bin": {"base64": __import__("base64").b64encode(blob).decode()}}
    task = GradedTask.from_json(d)
    assert task.files["data.bin"] == blob and task.files["solution.py"] == "x = 1\n"
    assert (task.checker.timeout_s, task.checker.strict_eq, task.checker.isolation) == (None, None, "auto")
    assert task.limits == d["limits"]
    assert GradedTask.from_json({k: v for k, v in d.items() if k != "limits"}).limits == {}   # the sandbox's defaults


@pytest.mark.parametrize("checker,field", [
    (None, "has no checker"),
    ({"kind": "pytest", "tests": ["test_hidden.py"], "tset": 1}, "['tset']"),
    ({"kind": "pytest", "tests": ["test_gone.py"]}, "test_gone.py"),
    ({"kind": "command", "argv": []}, "checker.argv"),
])
def test_a_malformed_spec_is_refused_where_the_task_is_built_naming_the_task_and_field(checker, field):
    with pytest.raises(TaskError, match="'python/gcd'") as exc:
        GradedTask.of(LeaseTask.decode(wire(checker=checker)))
    assert field in str(exc.value)
    with pytest.raises(VerifierInfraError, match="'python/gcd'"):
        graded_task(wire(checker=checker))
    with pytest.raises(SpecError):
        CheckerSpec.decode(checker, {"files": {}, "hidden": {"test_hidden.py": ""}})


def test_the_graded_task_cannot_be_changed_by_what_grades_it():
    task = graded_task(wire())
    with pytest.raises(dataclasses.FrozenInstanceError):
        task.name = "other"         # type: ignore[misc]


def test_a_tasks_baseline_is_kept_per_layer_stack():
    task, b = graded_task(wire()), Baseline()
    b.seed(task, "/img", {"reference": "pass", "null": "fail"}, layers=("/layers/a",))
    assert b.clean(task, "/img", lambda *a: pytest.fail("graded again"), ("/layers/a",)) == "reference: pass, null: fail"
    assert b.clean(task, "/img", lambda *a: "infra_error", ("/layers/b",)) is None


def test_a_pytest_check_parses_each_test_file_once(runtime, python_image, monkeypatch):
    seen: list[bytes] = []
    real = canaries.parse

    def counting(source):
        seen.append(source)
        return real(source)
    monkeypatch.setattr(canaries, "parse", counting)
    task = graded_task(wire())
    v = verify(runtime, python_image, task, [Change("/work/solution.py", "modified",
                                                    task.hidden["reference.py"].encode(), 0o644)], None)
    assert v.outcome == "pass"
    assert len(seen) == len(task.checker.tests) == 2          # isolation, expected ids and strict asserts share it
    assert pytestcheck.isolation(task, task.checker, pytestcheck.parse_tests(task, task.checker)) == "call"
