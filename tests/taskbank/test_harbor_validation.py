"""A Harbor task validates with its own reference: `solution/solve.sh` run as Harbor's oracle
agent runs it (bash, in /work of a fresh sandbox of the task), its changes graded as the
reference; the probe (the reference's scripts behind a prologue that exits where it can read
the hidden tests) refuses a task whose tests execute the agent's file directly (the s11b red
team's H1: a generic oracle script read the tests and earned reward 1)."""
from __future__ import annotations

from controller.taskbank.importers_tools import harbor_task
from nodeagent.verifier import validate
from tests.taskbank.test_harbor_reward import TEST_SH, TESTS, harbor_dir

SOLVE = "#!/bin/bash\ncat > /app/add.sh <<'EOF'\n#!/bin/bash\necho $(( $1 + $2 ))\nEOF\nchmod +x /app/add.sh\n"


def harbor(tmp_path, solve: str = SOLVE, tests: str = TESTS) -> dict:
    d = harbor_dir(tmp_path, TEST_SH)
    (d / "solution" / "solve.sh").write_text(solve)
    (d / "tests" / "test_outputs.py").write_text(tests)
    task = harbor_task(d)
    return {**task.canonical(), "task_id": task.task_id}


def test_a_harbor_task_validates_with_its_solve_sh_as_the_reference(runtime, python_image, tmp_path):
    v = validate.validate_task(runtime, python_image, harbor(tmp_path), workers=1)
    assert v.cases["reference"]["outcome"] == "pass", v.cases["reference"]
    assert v.cases["null"]["outcome"] == "fail"
    assert v.cases[validate.PROBE]["outcome"] == "pass", v.cases[validate.PROBE]
    assert v.ok, v.reasons


def test_a_harbor_task_whose_tests_execute_the_agents_file_directly_is_refused(runtime, python_image, tmp_path):
    direct = TESTS.replace('["bash", "/app/add.sh", ', '["/app/add.sh", ')
    assert direct != TESTS
    v = validate.validate_task(runtime, python_image, harbor(tmp_path, tests=direct), workers=1)
    assert v.cases["reference"]["outcome"] == "pass", v.cases["reference"]
    assert not v.ok and any("with its own rights" in r for r in v.reasons), v.reasons


def test_a_solve_sh_that_fails_is_named(runtime, python_image, tmp_path):
    v = validate.validate_task(runtime, python_image, harbor(tmp_path, solve="#!/bin/bash\nexit 3\n"), workers=1)
    assert not v.ok and any("solution/solve.sh" in r and "exited 3" in r for r in v.reasons), v.reasons

