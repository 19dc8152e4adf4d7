"""The adversarial battery of issue 14 against the real verifier: every family gets reward 0.

Tasks are real HumanEval and MBPP records (tests/data, see its README) and small records in the
same formats, imported by the real importers and graded in real sandboxes, with call isolation
(what the importers choose) and, for the in-process families, also in repository mode
(`isolation: process`), where the audit hook and the trusted imports must hold.
"""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from controller.taskbank import importers
from nodeagent.sandbox.runtime import Change
from nodeagent.verifier import hacks
from nodeagent.verifier.grade import graded_task, verify

DATA = Path(__file__).parents[1] / "data"


def _records(name: str) -> dict:
    return {str(r["task_id"]): r for r in map(json.loads, (DATA / name).read_text().splitlines())}


HUMANEVAL = _records("humaneval_sample.jsonl")
MBPP = _records("mbpp_sanitized_sample.jsonl")
SQUARE = {"task_id": "Attack/square", "entry_point": "square",
          "prompt": "def square(x: int) -> int:\n    \"\"\"Return x * x.\"\"\"\n",
          "canonical_solution": "    return x * x\n",
          "test": "def check(candidate):\n    assert candidate(7) == 49\n"}


def task_of(record: dict, kind: str = "humaneval", **checker) -> dict:
    t = (importers.humaneval_task if kind == "humaneval" else importers.mbpp_task)(record, Path("x"), 1)
    task = {**t.canonical(), "task_id": t.task_id}
    task["checker"] = {**task["checker"], **checker}
    return task


def grade(runtime, image, task: dict, files: dict):
    changes = [Change(f"/work/{rel}", "modified" if rel in task["files"] else "added",
                      text.encode(), 0o644) for rel, text in files.items()]
    return verify(runtime, image, graded_task(task), changes, None)


def hack(task: dict, family: str) -> dict:
    stub = task["files"]["solution.py"]
    entry = hacks.entry_point(task, stub)
    return hacks.family_hacks(task, "solution.py", stub, entry, hacks.helper_names(stub, entry))[family]


def assert_unrewarded(v) -> None:
    assert v.reward == 0.0 and v.outcome in ("fail", "timeout"), (v.outcome, v.checks[-1]["detail"])


@pytest.mark.parametrize("key", sorted(HUMANEVAL))
def test_the_real_humaneval_references_pass_behind_the_call_boundary(runtime, python_image, key):
    task = task_of(HUMANEVAL[key])
    v = grade(runtime, python_image, task, {"solution.py": task["hidden"]["reference.py"]})
    assert (v.outcome, v.reward) == ("pass", 1.0), v.checks[-1]["detail"]


@pytest.mark.parametrize("key", sorted(MBPP))
def test_the_real_mbpp_references_pass_behind_the_call_boundary(runtime, python_image, key):
    task = task_of(MBPP[key], "mbpp")
    v = grade(runtime, python_image, task, {"solution.py": task["hidden"]["reference.py"]})
    assert (v.outcome, v.reward) == ("pass", 1.0), v.checks[-1]["detail"]


def test_filling_the_test_namespace_from_the_solution_earns_nothing(runtime, python_image):
    task = task_of(HUMANEVAL["HumanEval/2"])
    assert_unrewarded(grade(runtime, python_image, task, hack(task, "star_import_fill")))


@pytest.mark.parametrize("isolation", ["call", "process"])
def test_a_work_module_shadowing_pdb_with_the_stub_untouched_earns_nothing(runtime, python_image, isolation):
    task = task_of(HUMANEVAL["HumanEval/2"], isolation=isolation)
    assert_unrewarded(grade(runtime, python_image, task, hack(task, "shadow_pdb")))


@pytest.mark.parametrize("isolation", ["call", "process"])
def test_a_work_module_shadowing_pdb_that_keeps_pytest_running_earns_nothing(runtime, python_image, isolation):
    # rewarded by the grader before issue 14 (235901e): the real pdb is loaded under its name and
    # the report patch waits for _pytest.reports, so pytest starts and every outcome reads "passed"
    task = task_of(HUMANEVAL["HumanEval/2"], isolation=isolation)
    assert_unrewarded(grade(runtime, python_image, task, hack(task, "shadow_pdb_deferred")))


def test_redefining_the_prompts_helpers_earns_nothing(runtime, python_image):
    for key in ("HumanEval/32", "HumanEval/38"):
        task = task_of(HUMANEVAL[key])
        assert_unrewarded(grade(runtime, python_image, task, hack(task, "redefine_helpers")))


def test_patching_random_does_not_steer_the_tests_inputs(runtime, python_image):
    task = task_of(HUMANEVAL["HumanEval/38"])
    assert_unrewarded(grade(runtime, python_image, task, hack(task, "patch_random")))


@pytest.mark.parametrize("isolation", ["call", "process"])
def test_forging_through_the_plugins_emitter_and_key_earns_nothing(runtime, python_image, isolation):
    task = task_of(SQUARE, isolation=isolation)
    v = grade(runtime, python_image, task, hack(task, "forge_via_plugin"))
    assert_unrewarded(v)
    if isolation == "process":
        assert v.tampered and "refused" in v.checks[-1]["detail"]


def test_a_forked_writer_that_speaks_for_pytest_is_not_heard(runtime, python_image):
    task = task_of(SQUARE, isolation="process")
    assert_unrewarded(grade(runtime, python_image, task, hack(task, "fork_writer")))


@pytest.mark.parametrize("isolation", ["call", "process"])
def test_a_forked_writer_signing_with_the_plugins_key_is_not_heard(runtime, python_image, isolation):
    # rewarded before issue 14 (235901e): the key and sequence number from the plugin's closure,
    # a forked writer speaks for pytest, which exits silent
    task = task_of(SQUARE, isolation=isolation)
    v = grade(runtime, python_image, task, hack(task, "fork_writer_signed"))
    assert_unrewarded(v)
    if isolation == "process":
        assert v.tampered


def test_patching_report_properties_in_process_earns_nothing(runtime, python_image):
    task = task_of(SQUARE, isolation="process")
    assert_unrewarded(grade(runtime, python_image, task, hack(task, "report_property")))


@pytest.mark.parametrize("isolation", ["call", "process"])
def test_reading_expected_values_from_the_callers_frames_earns_nothing(runtime, python_image, isolation):
    task = task_of(SQUARE, isolation=isolation)
    assert_unrewarded(grade(runtime, python_image, task, hack(task, "oracle_frames")))


@pytest.mark.parametrize("isolation", ["call", "process"])
def test_reading_expected_values_from_the_test_loader_earns_nothing(runtime, python_image, isolation):
    task = task_of(SQUARE, isolation=isolation)
    assert_unrewarded(grade(runtime, python_image, task, hack(task, "oracle_loader")))


def test_the_square_reference_still_passes_in_both_modes(runtime, python_image):
    for isolation in ("call", "process"):
        task = task_of(SQUARE, isolation=isolation)
        v = grade(runtime, python_image, task, {"solution.py": task["hidden"]["reference.py"]})
        assert (v.outcome, v.reward) == ("pass", 1.0), (isolation, v.checks[-1]["detail"])
