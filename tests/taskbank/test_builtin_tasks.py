"""The built-in task bank is well formed: reference solutions pass, stubs fail, math gold is right.

Runs each task's pytest files in a temporary directory with the host interpreter: this tests
the task bank itself, not the sandbox.
"""
from __future__ import annotations

import re
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
import sympy
from sympy.parsing.sympy_parser import implicit_multiplication_application, parse_expr, standard_transformations

from controller.taskbank.builtin import MATH_DERIVATIONS, TASKSET_NAME, builtin_taskset

PYTEST_TIMEOUT_S = 60.0

TASKSET = builtin_taskset()
PYTHON_TASKS = [t for t in TASKSET.tasks if t.family == "python"]
MATH_TASKS = [t for t in TASKSET.tasks if t.family == "math"]


def run_pytest(workdir: Path, files: dict[str, str], test_files: list[str]) -> tuple[int, str]:
    for rel, text in files.items():
        (workdir / rel).write_text(text)
    proc = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", *test_files],
        cwd=workdir, capture_output=True, text=True, timeout=PYTEST_TIMEOUT_S)
    return proc.returncode, proc.stdout + proc.stderr


def run_each(tmp_path: Path, jobs: dict[str, tuple[dict[str, str], list[str]]]) -> dict[str, tuple[int, str]]:
    def one(item):
        name, (files, tests) = item
        workdir = tmp_path / name.replace("/", "_")
        workdir.mkdir()
        return name, run_pytest(workdir, files, tests)
    with ThreadPoolExecutor(max_workers=4) as pool:
        return dict(pool.map(one, jobs.items()))


def latex_to_sympy(answer: str) -> sympy.Expr:
    text = re.sub(r"\\sqrt\{([^{}]*)\}", r"sqrt(\1)", answer)
    text = re.sub(r"\\frac\{([^{}]*)\}\{([^{}]*)\}", r"((\1)/(\2))", text)
    return parse_expr(text, transformations=standard_transformations + (implicit_multiplication_application,))


def test_task_set_is_named_builtin_v1_and_holds_at_least_44_tasks_in_both_families():
    assert TASKSET.name == TASKSET_NAME == "builtin-v1"
    assert len(TASKSET.tasks) >= 44
    assert len(PYTHON_TASKS) >= 26
    assert len(MATH_TASKS) >= 18


def test_names_instructions_and_ids_are_unique():
    for key in (lambda t: t.name, lambda t: t.instruction, lambda t: t.task_id):
        values = [key(t) for t in TASKSET.tasks]
        assert len(set(values)) == len(values)


def test_task_set_is_deterministic_so_its_manifest_hash_is_stable():
    assert builtin_taskset().manifest_hash == TASKSET.manifest_hash


def test_python_tasks_have_stub_visible_tests_hidden_tests_and_reference():
    for t in PYTHON_TASKS:
        assert set(t.files) == {"solution.py", "test_visible.py"}, t.name
        assert set(t.hidden) == {"test_hidden.py", "reference.py"}, t.name
        assert t.checker == {"kind": "pytest", "tests": ["test_hidden.py", "test_visible.py"]}
        assert t.protected == ("test_visible.py",)
        assert t.files["test_visible.py"].count("def test_") == 2, t.name
        assert t.hidden["test_hidden.py"].count("def test_") >= 4, t.name
        assert "/work/solution.py" in t.instruction


def test_math_tasks_ask_for_a_boxed_answer_and_keep_the_gold_hidden():
    for t in MATH_TASKS:
        assert "\\boxed{" in t.instruction
        assert t.checker["kind"] == "math"
        assert t.hidden == {"answer.txt": t.checker["answer"]}
        assert t.files == {}


def test_some_math_answers_are_fractions_or_radicals():
    answers = [t.checker["answer"] for t in MATH_TASKS]
    assert any("/" in a for a in answers)
    assert any("\\sqrt" in a for a in answers)


def test_every_math_gold_answer_parses_and_equals_its_independent_derivation():
    namespace = {name: getattr(sympy, name) for name in dir(sympy) if not name.startswith("_")}
    namespace.update(x=sympy.Symbol("x"), k=sympy.Symbol("k"))
    assert set(MATH_DERIVATIONS) == {t.name for t in MATH_TASKS}
    for t in MATH_TASKS:
        gold = latex_to_sympy(t.checker["answer"])
        derived = sympy.sympify(eval(MATH_DERIVATIONS[t.name], namespace))
        assert sympy.simplify(gold - derived) == 0, (t.name, gold, derived)


def test_every_reference_solution_passes_its_hidden_and_visible_tests(tmp_path):
    jobs = {t.name: ({"solution.py": t.hidden["reference.py"], "test_visible.py": t.files["test_visible.py"],
                      "test_hidden.py": t.hidden["test_hidden.py"]}, list(t.checker["tests"]))
            for t in PYTHON_TASKS}
    results = run_each(tmp_path, jobs)
    failures = {name: out for name, (code, out) in results.items() if code != 0}
    assert not failures, failures


def test_every_stub_fails_every_hidden_test(tmp_path):
    jobs = {t.name: ({"solution.py": t.files["solution.py"], "test_hidden.py": t.hidden["test_hidden.py"]},
                     ["test_hidden.py"]) for t in PYTHON_TASKS}
    results = run_each(tmp_path, jobs)
    for t in PYTHON_TASKS:
        code, out = results[t.name]
        n_hidden = t.hidden["test_hidden.py"].count("def test_")
        assert code == 1, (t.name, out)
        assert re.search(rf"\b{n_hidden} failed\b", out), (t.name, out)


@pytest.mark.parametrize("task", PYTHON_TASKS[:3], ids=lambda t: t.name)
def test_stub_keeps_the_signature_the_instruction_names(task):
    signature = task.instruction.split("Signature: def ", 1)[1].split("\n", 1)[0]
    assert task.files["solution.py"].startswith(f"def {signature}:")
