"""`command` checkers, graded through the real sandbox: the task's own command decides by its
exit status (pass, fail), a hang is a timeout, a command the image cannot run is an infra error.
And the lint that would have caught the command checker's crash (an undefined name)."""
from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from nodeagent.sandbox.runtime import Change
from nodeagent.verifier import grade
from nodeagent.verifier.grade import VerifierInfraError, graded_task, verify

STUB = "def double(x):\n    raise NotImplementedError\n"
REFERENCE = "def double(x):\n    return 2 * x\n"
CHECK = "from solution import double\nassert double(2) == 4 and double(-3) == -6\nprint('checked')\n"


def command_task(**checker) -> dict:
    """The check is a protected script in /work (written back from the task's original before
    the command runs, so the agent's edits to it do not count)."""
    return {"name": "command/double", "family": "python", "image": "builtin:python",
            "instruction": "Implement double in /work/solution.py.",
            "files": {"solution.py": STUB, "check.py": CHECK}, "hidden": {"reference.py": REFERENCE},
            "protected": ["check.py"], "limits": {"memory_mb": 256, "pids": 64, "disk_mb": 64, "nofile": 256},
            "checker": {"kind": "command", "argv": ["python3", "check.py"], "timeout_s": 10, **checker}}


def solution(code: str) -> list[Change]:
    return [Change("/work/solution.py", "modified", code.encode(), 0o644)]


@pytest.fixture(scope="module")
def baseline():
    return grade.Baseline()


def test_a_command_check_passes_the_reference(runtime, python_image, baseline):
    v = verify(runtime, python_image, graded_task(command_task()), solution(REFERENCE), None, baseline=baseline)
    assert (v.outcome, v.reward) == ("pass", 1.0)
    assert v.checks[-1]["check"] == "command" and "exit 0" in v.checks[-1]["detail"]
    assert "checked" in v.checks[-1]["detail"]


def test_a_command_check_fails_a_wrong_solution_with_its_exit_status(runtime, python_image, baseline):
    v = verify(runtime, python_image, graded_task(command_task()), solution("def double(x):\n    return x\n"), None,
               baseline=baseline)
    assert (v.outcome, v.reward) == ("fail", 0.0)
    assert "exit 1" in v.checks[-1]["detail"] and "AssertionError" in v.checks[-1]["detail"]


def test_pass_exit_codes_decide(runtime, python_image, baseline):
    task = command_task(argv=["sh", "-c", "python3 check.py || exit 3"], pass_exit_codes=[3])
    v = verify(runtime, python_image, graded_task(task), solution(STUB), None, baseline=baseline)
    assert v.outcome == "pass"


def test_the_agent_cannot_rewrite_the_protected_check(runtime, python_image, baseline):
    changes = solution(STUB) + [Change("/work/check.py", "modified", b"print('ok')\n", 0o644)]
    v = verify(runtime, python_image, graded_task(command_task()), changes, None, baseline=baseline)
    assert (v.outcome, v.reward, v.tampered) == ("fail", 0.0, True)


def test_a_hanging_solution_is_a_timeout(runtime, python_image, baseline):
    hang = "import time\ntime.sleep(600)\n" + REFERENCE
    v = verify(runtime, python_image, graded_task(command_task(timeout_s=2)), solution(hang), None, baseline=baseline)
    assert (v.outcome, v.reward) == ("timeout", 0.0)


def test_a_command_the_image_cannot_run_is_an_infra_error(runtime, python_image, baseline):
    task = command_task(argv=["no-such-checker", "--run"])
    with pytest.raises(VerifierInfraError, match="cannot run no-such-checker"):
        verify(runtime, python_image, graded_task(task), solution(REFERENCE), None, baseline=baseline)


def test_an_image_without_the_interpreter_is_an_infra_error(runtime, busybox_image, baseline):
    with pytest.raises(VerifierInfraError, match="cannot run python3"):
        verify(runtime, busybox_image, graded_task(command_task()), solution(REFERENCE), None, baseline=baseline)


def test_the_verifier_package_has_no_undefined_names():
    """ruff's pyflakes rules for names (F821 undefined, F822 undefined in __all__, F823 local
    used before assignment): the check that would have caught `NameError: repo`."""
    ruff = shutil.which("ruff", path=str(Path(sys.executable).parent)) or shutil.which("ruff")
    if ruff is None:
        pytest.fail("ruff is not installed (pip install ruff): it is a test dependency")
    root = Path(__file__).resolve().parents[2]
    r = subprocess.run([ruff, "check", "--no-cache", "--isolated", "--select", "F821,F822,F823",
                        "nodeagent/verifier", "nodeagent/sandbox"], cwd=root, capture_output=True, text=True)
    assert r.returncode == 0, r.stdout + r.stderr
