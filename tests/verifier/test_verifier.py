"""The verifier on real sandboxes: fresh sandbox, unforgeable report, typed outcomes, bad input."""
from __future__ import annotations

import io
import json
import tarfile
from pathlib import Path

import pytest

from controller.taskbank.builtin import builtin_taskset
from nodeagent.sandbox.runtime import Change
from nodeagent.verifier import pytestcheck
from nodeagent.verifier.grade import VerifierInfraError, grade_report, graded_task, verify
from nodeagent.verifier.pytestcheck import strict_asserts


def task_dict(name: str = "python/gcd", **over) -> dict:
    t = builtin_taskset().by_name()[name]
    return {**t.canonical(), "task_id": t.task_id, **over}


def solution(code: str | bytes) -> list[Change]:
    return [Change("/work/solution.py", "modified", code.encode() if isinstance(code, str) else code, 0o644)]


@pytest.fixture(scope="module")
def gcd():
    return task_dict()


def test_reference_passes_and_null_fails_with_components(runtime, python_image, gcd):
    ok = verify(runtime, python_image, graded_task(gcd), solution(gcd["hidden"]["reference.py"]), None)
    assert (ok.outcome, ok.reward) == ("pass", 1.0)
    assert ok.components["fail_to_pass"] == 1.0
    null = verify(runtime, python_image, graded_task(gcd), [], None)
    assert (null.outcome, null.reward, null.components["fail_to_pass"]) == ("fail", 0.0, 0.0)


def test_code_under_test_cannot_read_delete_or_forge_anything(runtime, python_image, gcd):
    # At import: try to read the hidden tests, delete them, and write a passing report.
    code = gcd["hidden"]["reference.py"].replace("a, b = abs(a), abs(b)", "return 0") + """
import json, os
seen = []
fake = json.dumps({"events": [{"ev": "start"}, {"ev": "end"}]})
for p, ops in [("/verifier/tests/test_hidden.py", ("read", "remove", "write")), ("/verifier/tests", ("list",)),
               ("/tmp/.paddock-grader/report.json", ("write",)), ("/work/test_visible.py", ("remove", "write"))]:
    for op in ops:
        try:
            {"read": lambda: open(p).read(), "list": lambda: os.listdir(p), "remove": lambda: os.remove(p),
             "write": lambda: open(p, "w").write(fake)}[op]()
            seen.append((p, op))
        except Exception:
            pass
assert not seen, seen
"""
    v = verify(runtime, python_image, graded_task(gcd), solution(code), None)
    assert v.outcome == "fail"
    detail = v.checks[-1]["detail"]
    assert "failed: ['test_hidden.py::test_hidden_1'" in detail and "collection error" not in detail


def test_a_hanging_solution_is_a_timeout_not_a_fail(runtime, python_image):
    task = task_dict(checker={"kind": "pytest", "tests": ["test_hidden.py"], "timeout_s": 3})
    v = verify(runtime, python_image, graded_task(task), solution("import time\ntime.sleep(3600)\n"), None)
    assert (v.outcome, v.reward) == ("timeout", 0.0)


def test_a_solution_that_exits_pytest_fails(runtime, python_image, gcd):
    in_process = {**gcd, "checker": {**gcd["checker"], "isolation": "process"}}
    v = verify(runtime, python_image, graded_task(in_process), solution("import os\nos._exit(0)\n"), None)
    assert v.outcome == "fail" and "ended early" in v.checks[-1]["detail"]


def test_a_solution_that_exits_behind_the_call_boundary_fails_every_test(runtime, python_image, gcd):
    task = graded_task(gcd)
    assert pytestcheck.isolation(task, task.checker, pytestcheck.parse_tests(task, task.checker)) == "call"
    v = verify(runtime, python_image, graded_task(gcd), solution("import os\nos._exit(0)\n"), None)
    assert (v.outcome, v.reward, v.tampered) == ("fail", 0.0, False)
    assert "the solution's process is gone" in v.checks[-1]["detail"]


def test_a_call_that_never_returns_fails_that_test_and_the_others_still_run(runtime, python_image, gcd):
    hang_on_zero = gcd["hidden"]["reference.py"].replace("a, b = abs(a), abs(b)",
                                                         "a, b = abs(a), abs(b)\n    while a == 0: pass")
    task = {**gcd, "checker": {**gcd["checker"], "call_timeout_s": 1}}
    v = verify(runtime, python_image, graded_task(task), solution(hang_on_zero), None)
    assert (v.outcome, v.reward) == ("fail", 0.0)
    detail = v.checks[-1]["detail"]
    assert detail.startswith("5/7 required tests passed") and "test_hidden.py::test_hidden_1" in detail


def test_changing_or_deleting_a_protected_file_is_tampering(runtime, python_image, gcd):
    for change in (Change("/work/test_visible.py", "modified", b"def test_ok():\n    pass\n", 0o644),
                   Change("/work/test_visible.py", "deleted", None, 0),
                   Change("/work/test_visible.py", "symlink", b"/dev/null", 0o777)):
        v = verify(runtime, python_image, graded_task(gcd), [change] + solution(gcd["hidden"]["reference.py"]), None)
        assert (v.outcome, v.reward, v.tampered) == ("fail", 0.0, True), change.kind


def test_missing_hidden_test_file_is_an_infra_error_naming_it(runtime, python_image, gcd):
    task = {**gcd, "hidden": {"reference.py": gcd["hidden"]["reference.py"]}}
    with pytest.raises(VerifierInfraError, match="test_hidden.py"):
        verify(runtime, python_image, graded_task(task), [], None)


@pytest.mark.parametrize("checker,message", [(None, "has no checker"),
                                             ({"kind": "pytest", "tests": ["test_hidden.py"], "x": 1},
                                              "unknown field")])
def test_bad_checker_spec_is_an_infra_error(runtime, python_image, gcd, checker, message):
    with pytest.raises(VerifierInfraError, match=message):
        verify(runtime, python_image, graded_task({**gcd, "checker": checker}), [], None)


def test_an_image_without_python_is_an_infra_error_after_one_retry(runtime, busybox_image, gcd):
    with pytest.raises(VerifierInfraError, match="no report"):
        verify(runtime, busybox_image, graded_task(gcd), [], None)


def test_answer_tasks_are_graded_outside_any_sandbox():
    from nodeagent.verifier.checks import CheckRunner
    task = task_dict("math/fraction_sum")
    with CheckRunner() as r:
        assert verify(None, None, graded_task(task), [], "so \\boxed{\\frac{3}{4}}", runner=r).outcome == "pass"
        v = verify(None, None, graded_task(task), [], "passed", runner=r)
        assert v.outcome == "fail" and "unparseable answer" in v.checks[-1]["detail"]


# -- reading the report (pure) ----------------------------------------------------------------

EXPECTED = ["t.py::test_a", "t.py::test_b"]


def report(*events, exit_code=0) -> bytes:
    return json.dumps({"grader": 1, "exit_code": exit_code, "events": list(events)}).encode()


def test_all_expected_tests_passing_is_a_pass():
    v = grade_report(report({"ev": "start"}, {"ev": "test", "id": "t.py::test_a", "outcome": "passed"},
                            {"ev": "test", "id": "t.py::test_b[1]", "outcome": "passed"}, {"ev": "end"}),
                     EXPECTED, {})
    assert v.outcome == "pass"


def test_a_missing_test_is_a_fail_naming_it():
    v = grade_report(report({"ev": "start"}, {"ev": "test", "id": "t.py::test_a", "outcome": "passed"},
                            {"ev": "end"}), EXPECTED, {})
    assert v.outcome == "fail" and "not run: ['t.py::test_b']" in v.checks[0]["detail"]


def test_fail_to_pass_and_pass_to_pass_sets_are_scored_apart():
    v = grade_report(report({"ev": "start"}, {"ev": "test", "id": "t.py::test_a", "outcome": "passed"},
                            {"ev": "test", "id": "t.py::test_b", "outcome": "failed"}, {"ev": "end"}),
                     EXPECTED, {"fail_to_pass": ["t.py::test_a"], "pass_to_pass": ["t.py::test_b"]})
    assert v.outcome == "fail"
    assert (v.components["fail_to_pass"], v.components["pass_to_pass"]) == (1.0, 0.0)


@pytest.mark.parametrize("raw,message", [(b"", "malformed grader report"), (b"{\"events\": 3}", "malformed"),
                                         (report({"ev": "collected"}), "did not start")])
def test_a_missing_or_malformed_report_is_an_infra_error(raw, message):
    with pytest.raises(VerifierInfraError, match=message):
        grade_report(raw, EXPECTED, {})


def test_tamper_events_fail_the_rollout():
    v = grade_report(report({"ev": "start"}, {"ev": "tamper", "changed": ["__init__"]},
                            *({"ev": "test", "id": t, "outcome": "passed"} for t in EXPECTED), {"ev": "end"}),
                     EXPECTED, {})
    assert (v.outcome, v.tampered) == ("fail", True)


def test_asserts_are_rewritten_to_strict_equality():
    src = strict_asserts('"""doc"""\nfrom __future__ import annotations\nassert f(1) == 2\nassert g() != 3\n', "t.py")
    assert "from paddock_grader import strict_eq as _paddock_strict_eq" in src
    assert "assert _paddock_strict_eq(f(1), 2)" in src and "assert not _paddock_strict_eq(g(), 3)" in src
    assert src.index("__future__") < src.index("paddock_grader")


def test_the_grader_shipped_into_the_sandbox_is_the_grader_plugin_source_file():
    from nodeagent.verifier import grader_plugin
    task = graded_task(task_dict())
    system, _tests = pytestcheck._checker_files(task, task.checker, pytestcheck.parse_tests(task, task.checker), "call")
    assert system[pytestcheck.GRADER_PATH] == Path(grader_plugin.__file__).read_bytes()


def test_strict_eq_refuses_objects_that_equal_everything():
    from nodeagent.verifier.grader_plugin import strict_eq  # the grader's strict_eq, as shipped

    class Any_:
        def __eq__(self, other):
            return True
    assert strict_eq([1, (2, "x")], [1, (2, "x")]) and strict_eq(1, 1.0) and strict_eq({"a": [1]}, {"a": [1]})
    assert not strict_eq(Any_(), 3) and not strict_eq([Any_()], [3]) and not strict_eq(True, 1)


def test_changes_artifact_round_trips(tmp_path):
    from nodeagent.agent.attempt import Attempt, write_changes
    a = Attempt("run", str(tmp_path), "r1", 2, 7, "b", 0, {}, 0, "", "")
    changes = solution("x = 1\n") + [Change("/work/old.py", "deleted", None, 0)]
    rel = write_changes(str(tmp_path), "node-1", a, changes)
    assert rel.startswith("changes/") and rel.endswith("-a2-t7.tar")
    with tarfile.open(fileobj=io.BytesIO((tmp_path / rel).read_bytes())) as tar:
        names = tar.getnames()
    assert any(n.endswith("solution.py") for n in names) and any("old.py" in n for n in names)
    assert not list((tmp_path / "changes").glob("*.tmp"))


# -- paddock verify -----------------------------------------------------------------------------

def test_verify_command_grades_a_patch(tmp_path, capsys, python_image):
    import difflib

    from tests.verifier.test_checkers import paddock as main
    t = builtin_taskset().by_name()["python/gcd"]
    patch = tmp_path / "fix.patch"
    patch.write_text("".join(difflib.unified_diff(t.files["solution.py"].splitlines(True),
                                                  t.hidden["reference.py"].splitlines(True),
                                                  "a/solution.py", "b/solution.py")))
    assert main(["verify", "--task", "python/gcd", "--solution", str(patch)]) == 0
    out = json.loads(capsys.readouterr().out)
    assert (out["outcome"], out["reward"], out["components"]["fail_to_pass"]) == ("pass", 1.0, 1.0)


def test_verify_command_names_bad_input(tmp_path, capsys):
    from tests.verifier.test_checkers import paddock as main
    assert main(["verify", "--task", "python/gcd", "--solution", str(tmp_path / "nope.py")]) == 2
    assert "does not exist" in capsys.readouterr().err
    bad = tmp_path / "bad.patch"
    bad.write_text("--- a/other.py\n+++ b/other.py\n@@ -1 +1 @@\n-x\n+y\n")
    assert main(["verify", "--task", "python/gcd", "--solution", str(bad)]) == 2
    assert "does not apply" in capsys.readouterr().err
    assert main(["verify", "--task", "python/nope", "--solution", str(bad)]) == 2


def test_binary_task_files_arrive_as_base64_and_are_graded_as_bytes(runtime, python_image):
    # A task with a non-UTF-8 visible file (a repository's .git objects, a data blob) travels
    # in its canonical JSON as {"base64": ...}; the verifier decodes it before any sandbox.
    from controller.contracts.tasks import Task
    blob = bytes(range(256))
    t = Task(name="python/blob", family="python", instruction="leave data.bin alone",
             files={"solution.py": "x = 1\n", "data.bin": blob}, protected=("data.bin",),
             hidden={"test_hidden.py": "def test_blob():\n    assert open('/work/data.bin', 'rb').read() "
                                       "== bytes(range(256))\n"},
             checker={"kind": "pytest", "tests": ["test_hidden.py"]})
    wire = json.loads(json.dumps({**t.canonical(), "task_id": t.task_id}))
    assert wire["files"]["data.bin"] == {"base64": __import__("base64").b64encode(blob).decode()}
    v = verify(runtime, python_image, graded_task(wire), [], None)
    assert (v.outcome, v.tampered) == ("pass", False)
    bad = verify(runtime, python_image, graded_task(wire), [Change("/work/data.bin", "modified", b"x", 0o644)], None)
    assert (bad.outcome, bad.tampered) == ("fail", True)
