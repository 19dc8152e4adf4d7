"""The grading host reads the agent's files before any sandbox exists (repository mode: which
functions the agent wrote, `canaries.agent_functions`). Nothing the agent writes may make that
code raise out of `verify`: an exception there left `run_attempt` as `agent_crash`, a masked
infrastructure error charged to the task, for the gold patch too (a 250-branch `elif` made
`ast.dump` exceed the recursion limit; 200,000 unary minus signs made the parser raise
`MemoryError`). And whatever else on the host raises on the rollout's input is graded as the
baseline says: `fail` when the task grades cleanly without the agent.
"""
from __future__ import annotations

import ast
import inspect
import json
import unittest

from nodeagent.verifier import canaries, grade
from tests.verifier.test_repo_attacks import GOLD, UNITTEST_TESTS, WRONG, assert_passes, repo_task

ELIF = "def label(x):\n    if x == 0:\n        return 'zero'\n" + "".join(
    f"    elif x == {i}:\n        return '{i}'\n" for i in range(1, 600)) + "    return 'many'\n"
UNARY = "x = " + "-" * 200000 + "1\n\n\ndef helper():\n    return x\n"
TASK_FILES = {"calc/__init__.py": WRONG}


def _task():
    return repo_task(UNITTEST_TESTS, TASK_FILES, f2p=("tests/test_calc.py::TestCalc::test_add_negative",),
                     p2p=("tests/test_calc.py::TestCalc::test_add",))


def _verify(runtime, image, task, files):
    changes = [grade.Change(f"/work/{rel}", "modified" if rel in task["files"] else "added", data.encode(), 0o644)
               for rel, data in files.items()]
    return grade.verify(runtime, image, grade.graded_task(task), changes, None)


def test_which_functions_the_agent_wrote_is_read_without_recursion_and_past_the_parsers_limits():
    changed = canaries.agent_functions({"calc/__init__.py": GOLD}, {"calc/__init__.py": (GOLD + "\n\n" + ELIF).encode(),
                                                                   "scratch.py": UNARY.encode()}, added={"scratch.py"})
    assert ["calc/__init__.py", 5] in changed and ["calc/__init__.py", 1] not in changed     # `label`, not `add`
    assert ["scratch.py", 4] in changed      # the parser gave up: every line that may start a function


def test_the_function_key_tells_apart_exactly_what_ast_dump_does_on_the_standard_library():
    for module in (ast, inspect, json.decoder, unittest.case):
        fns = [n for n in ast.walk(ast.parse(inspect.getsource(module)))
               if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda))]
        pairs = {(ast.dump(n), canaries._shape(n)) for n in fns}
        assert len({d for d, _ in pairs}) == len(pairs) == len({s for _, s in pairs}), module.__name__


def test_a_gold_patch_with_a_long_elif_chain_passes_and_a_wrong_one_with_an_unparseable_file_fails(runtime, python_image):
    task = _task()
    assert_passes(_verify(runtime, python_image, task, {"calc/__init__.py": GOLD + "\n\n" + ELIF}))
    v = _verify(runtime, python_image, task, {"calc/__init__.py": WRONG + "\n\n" + ELIF, "scratch.py": UNARY})
    assert (v.outcome, v.reward) == ("fail", 0.0), v.checks


def test_anything_else_the_host_raises_on_the_rollouts_input_is_the_rollouts_fail_when_the_task_grades_cleanly(
        runtime, python_image, monkeypatch):
    real = canaries.agent_functions

    def reader(originals, changed, added=()):       # a host-side reader with a limit the agent's file meets
        if "calc/boom.py" in changed:
            raise MemoryError("the host's parser gave up")
        return real(originals, changed, added)

    monkeypatch.setattr(canaries, "agent_functions", reader)
    task = _task()
    v = _verify(runtime, python_image, task, {"calc/__init__.py": GOLD, "calc/boom.py": "x = 1\n"})
    assert (v.outcome, v.reward) == ("fail", 0.0), v.checks
    assert "MemoryError" in v.checks[-1]["detail"] and "grades cleanly without them" in v.checks[-1]["detail"]
