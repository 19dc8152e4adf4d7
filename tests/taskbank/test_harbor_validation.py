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



def test_the_files_the_dockerfile_copies_into_app_are_the_tasks_files(tmp_path):
    """A public Harbor task (NotJerwee/dynamo-log-report) ships its input as
    `environment/access.log` and `COPY access.log /app/access.log`: without it the agent and
    solve.sh had no input. COPY/ADD into /app (absolute or after `WORKDIR /app`) become task
    files; a copy from another stage or outside /app is not the agent's; a source outside the
    build context is an import error naming it."""
    import pytest

    from controller.taskbank.importers_tools import ImportSourceError
    d = harbor_dir(tmp_path, TEST_SH)
    env = d / "environment"
    (env / "data").mkdir()
    (env / "data" / "rows.csv").write_text("a,b\n1,2\n")
    (env / "access.log").write_text("1.2.3.4 GET /\n")
    (env / "a.txt").write_text("A")
    (env / "b.txt").write_text("B")
    (env / "Dockerfile").write_text(
        "FROM python:3.13-slim\nRUN pip install pytest\nWORKDIR /app\nCOPY access.log /app/access.log\n"
        "COPY data/ ./data/\nCOPY a.txt \\\n     b.txt /app/in/\nCOPY --from=build /x /app/x\nCOPY a.txt /etc/a.txt\n")
    files = harbor_task(d).files
    assert files["access.log"] == "1.2.3.4 GET /\n" and files["data/rows.csv"] == "a,b\n1,2\n"
    assert files["in/a.txt"] == "A" and files["in/b.txt"] == "B"
    assert "x" not in files and "a.txt" not in files and files["add.sh"] == "#!/bin/bash\necho 0\n"
    (env / "Dockerfile").write_text("FROM x\nCOPY ../secret /app/s\n")
    with pytest.raises(ImportSourceError, match="COPY ../secret: not in the build context"):
        harbor_task(d)
