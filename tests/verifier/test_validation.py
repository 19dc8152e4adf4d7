"""Task validation on real sandboxes: the reference passes, null and every known hack score 0."""
from __future__ import annotations

import argparse
import json

from controller.cli import tasks as tasks_cli
from controller.taskbank.builtin import builtin_taskset
from nodeagent.verifier import validate as validation
from nodeagent.verifier.grade import graded_task
from nodeagent.verifier.validate import ValidationStore, validate_task, validate_tasks


def task_dict(name: str, **over) -> dict:
    t = builtin_taskset().by_name()[name]
    return {**t.canonical(), "task_id": t.task_id, **over}


def test_a_python_task_passes_the_whole_hack_battery(runtime, python_image):
    v = validate_task(runtime, python_image, task_dict("python/rle_encode"), workers=2)
    assert v.ok, v.reasons
    assert v.cases["reference"]["outcome"] == "pass"
    hacks = {k: r for k, r in v.cases.items() if k.startswith("hack:")}
    assert set(hacks) == {f"hack:{h}" for h in validation._pytest_hacks(graded_task(task_dict("python/rle_encode")))}
    assert len(hacks) >= 13 and all(r["reward"] == 0.0 for r in hacks.values()), hacks
    assert "tampered" in hacks["hack:monkeypatch_framework"]["detail"]


def test_a_math_task_passes_the_answer_battery(runtime, python_image):
    v = validate_task(runtime, python_image, task_dict("math/square_diagonal"))
    assert v.ok, v.reasons
    assert v.cases["hack:pathological"]["reward"] == 0.0


def test_a_task_whose_reference_fails_is_quarantined_with_the_reason(runtime, python_image, tmp_path):
    good = task_dict("python/gcd")
    broken = {**good, "name": "python/gcd-broken", "task_id": "sha256:broken",
              "hidden": {**good["hidden"], "reference.py": "def gcd(a, b):\n    return 1\n"}}
    store = ValidationStore(tmp_path)
    [v] = validate_tasks(runtime, python_image, [broken], store, quick=True)
    assert not v.ok and "reference solution does not pass" in v.reasons[0]
    q = json.loads((tmp_path / "quarantine.json").read_text())
    assert "reference solution does not pass" in q["sha256:broken"]["reasons"][0]


def test_a_task_that_passes_with_no_change_is_quarantined(runtime, python_image, tmp_path):
    good = task_dict("python/gcd")
    trivial = {**good, "name": "python/trivial", "task_id": "sha256:trivial",
               "hidden": {**good["hidden"], "test_hidden.py": "def test_nothing():\n    assert 1 == 1\n"},
               "checker": {"kind": "pytest", "tests": ["test_hidden.py"]}}
    v = validate_task(runtime, python_image, trivial, quick=True)
    assert not v.ok and any("null solution" in r for r in v.reasons)


def test_results_are_cached_by_task_and_verifier_version(runtime, python_image, tmp_path):
    store = ValidationStore(tmp_path)
    task = task_dict("math/gcd_84_126")
    seen = []
    validate_tasks(runtime, python_image, [task], store, quick=True, progress=lambda v, c: seen.append(c))
    validate_tasks(runtime, python_image, [task], store, quick=True, progress=lambda v, c: seen.append(c))
    assert seen == [False, True]
    cache = json.loads((tmp_path / "validation-cache.json").read_text())
    assert list(cache) == [f"{task['task_id']}|{validation.verifier_version(quick=True)}"]


def test_a_task_without_a_reference_is_not_valid(runtime, python_image):
    task = task_dict("python/gcd")
    task = {**task, "hidden": {"test_hidden.py": task["hidden"]["test_hidden.py"]}}
    v = validate_task(runtime, python_image, task, quick=True)
    assert not v.ok and "no reference solution" in v.reasons[0]


def test_validate_is_a_subcommand_of_the_tasks_group():
    ap = argparse.ArgumentParser()
    sub = ap.add_subparsers(dest="cmd")
    tasks_cli.add_validate_command(sub)
    args = ap.parse_args(["validate", "myset", "--workers", "3"])
    assert (args.set_name, args.workers, args.func) == ("myset", 3, tasks_cli.cmd_validate)


def test_the_local_run_keeps_only_valid_tasks_and_writes_the_quarantine(python_image, tmp_path):
    from controller.contracts.tasks import Task, TaskSet
    good = builtin_taskset().by_name()["math/lcm_12_18"]
    broken = Task(name="math/broken", family="math", instruction="What is 2+2?",
                  hidden={"answer.txt": "5"}, checker={"kind": "math", "answer": "4"})
    ts = TaskSet("t", (good, broken))
    kept = validation.validate_for_run(ts, [good.name, broken.name], python_image, tmp_path / "cache",
                                       tmp_path, mode="quick")
    assert kept == [good.name]
    q = json.loads((tmp_path / "quarantine.json").read_text())
    assert list(q) == ["math/broken"] and "reference solution does not pass" in q["math/broken"]["reasons"][0]
    assert validation.validate_for_run(ts, [broken.name], python_image, tmp_path, tmp_path, "off") == [broken.name]
