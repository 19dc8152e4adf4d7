"""Infrastructure escapes: a wrong solution that crashes grading in a way that looks like the
environment's fault is `fail` (reward 0), never an infra error, while a task that cannot be
graded without the agent either (an image without python, a checker file missing, a sandbox that
cannot start) is still a VerifierInfraError. Every grading here runs in a real sandbox."""
from __future__ import annotations

import pytest

from nodeagent.sandbox.runtime import Change, SandboxSpec
from nodeagent.verifier import grade
from nodeagent.verifier.grade import VerifierInfraError, graded_task, verify

STUB = "def double(x):\n    raise NotImplementedError\n"
REFERENCE = "def double(x):\n    return 2 * x\n"
TESTS = "from pkg import double\n\n\ndef test_two():\n    assert double(2) == 4\n\n\ndef test_zero():\n    assert double(0) == 0\n"


def pkg_task(conftest: bool = False) -> dict:
    """A process-isolated task: the agent edits a package (`pkg/__init__.py`) that the hidden
    tests import in pytest's own process. With `conftest`, a repository task (the swe family:
    tests under /work) whose own conftest.py imports the package before pytest's session starts."""
    limits = {"memory_mb": 256, "pids": 64, "disk_mb": 64, "nofile": 256}
    if conftest:
        return {"name": "infra/repo-conftest", "family": "swe", "image": "builtin:python",
                "instruction": "Implement double in pkg.", "limits": limits, "protected": [],
                "files": {"pkg/__init__.py": STUB, "conftest.py": "import pkg  # the task's own conftest\n"},
                "hidden": {"tests/test_pkg.py": TESTS, "gold.patch": "(post-images under gold/)\n",
                           "gold/pkg/__init__.py": REFERENCE},
                "checker": {"kind": "pytest", "tests": ["tests/test_pkg.py"]}}
    return {"name": "infra/pkg", "family": "python", "image": "builtin:python", "limits": limits,
            "instruction": "Implement double in pkg.", "files": {"pkg/__init__.py": STUB},
            "hidden": {"test_pkg.py": TESTS, "reference.py": REFERENCE}, "protected": [],
            "checker": {"kind": "pytest", "tests": ["test_pkg.py"], "isolation": "process"}}


def pkg(code: str) -> list[Change]:
    return [Change("/work/pkg/__init__.py", "modified", code.encode(), 0o644)]


# Each: a wrong solution that, on the verifier before this change, came out as infra_error.
ATTACKS = {
    # 1. the test's import becomes a "missing dependency": importlib's own frames raise it
    "getattr_import_module": (False, "import importlib\n__getattr__ = importlib.import_module\n"),
    # 3. anything failing while the task's conftest imports the package: pytest "did not start"
    "conftest_syntax_error": (True, "def double(x)\n    return x\n"),
    "conftest_os_exit": (True, "import os\nos._exit(0)\n"),
    "conftest_raises_padded": (True, "raise RuntimeError('x' * 100000)\n"),
    "conftest_caught_tamper": (True, "import sys\ntry:\n    sys._getframe(1)\nexcept Exception:\n    pass\n"
                                     "raise SystemExit(0)\n"),
    # 4. padding: the agent's file name pushed out of the error text
    "padded_missing_module": (False, "import sys\nsys.stderr.write('y' * 200000)\n"
                                     "import importlib\n__getattr__ = importlib.import_module\n"),
    # siblings: the code under test breaks the grader's channel or its process
    "close_fds_in_conftest": (True, "import os\nos.closerange(3, 65536)\n" + STUB),
    "fork_bomb_then_exit": (True, "import os\nfor _ in range(200):\n    try:\n        if os.fork() == 0:\n"
                                  "            import time; time.sleep(30)\n    except OSError:\n        break\n"
                                  "os._exit(0)\n"),
    "fill_tmp_then_exit": (True, "import os\ntry:\n    with open('/tmp/fill', 'wb') as f:\n        while True:\n"
                                 "            f.write(b'x' * (1 << 20))\nexcept OSError:\n    pass\nos._exit(0)\n"),
    "flood_output_then_exit": (True, "import os\nfor _ in range(2000):\n    os.write(2, b'z' * 65536)\nos._exit(0)\n"),
}


# Siblings that already came out `fail` before (kept so they stay so): an import-time error
# raised from the agent's own file, closing pytest's descriptors once the session runs, signals
# to the grader (another uid: refused).
ALREADY_FAIL = {
    "getattr_raises_missing_numpy": (False, "def __getattr__(name):\n    raise ModuleNotFoundError(\"No module "
                                            "named 'numpy'\", name='numpy')\n"),
    "close_every_fd": (False, "import os\nos.closerange(3, 65536)\n" + STUB),
    "delete_verifier_files": (True, "import shutil\nfor d in ('/verifier', '/tmp/.paddock-grader', '/work/tests'):\n"
                                    "    shutil.rmtree(d, ignore_errors=True)\n" + STUB),
    "kill_grader_and_self": (True, "import os, signal\nfor p in (os.getppid(), 1, -1):\n    try:\n"
                                   "        os.kill(p, signal.SIGKILL)\n    except OSError:\n        pass\n"),
}


@pytest.fixture(scope="module")
def baseline():
    """A baseline of this module's own (no validation cache: graded once per task here)."""
    return grade.Baseline()


@pytest.mark.parametrize("name", sorted(ATTACKS) + sorted(ALREADY_FAIL))
def test_an_agent_that_crashes_grading_fails_never_infra(runtime, python_image, baseline, name):
    conftest, code = ATTACKS.get(name) or ALREADY_FAIL[name]
    v = verify(runtime, python_image, graded_task(pkg_task(conftest)), pkg(code), None, baseline=baseline)
    assert (v.outcome, v.reward) == ("fail", 0.0), v.checks
    assert any("grades cleanly without them" in c["detail"] or c["verdict"] == "fail" for c in v.checks)


def test_the_reference_still_passes_and_the_stub_fails(runtime, python_image, baseline):
    for conftest in (False, True):
        task = pkg_task(conftest)
        assert verify(runtime, python_image, graded_task(task), pkg(REFERENCE), None, baseline=baseline).outcome == "pass"
        assert verify(runtime, python_image, graded_task(task), pkg(STUB), None, baseline=baseline).outcome == "fail"


def test_a_crash_is_named_with_both_reasons_in_the_checks(runtime, python_image, baseline):
    v = verify(runtime, python_image, graded_task(pkg_task(True)), pkg("import os\nos._exit(0)\n"), None, baseline=baseline)
    detail = v.checks[-1]["detail"]
    assert "grading failed with the agent's changes" in detail and "reference: pass" in detail
    assert [c["verdict"] for c in v.checks[:-1]] == ["infra_error"]   # compared before any retry


# -- real infrastructure failures stay infra errors ------------------------------------------

def test_an_image_without_python_is_still_an_infra_error(runtime, busybox_image, baseline):
    with pytest.raises(VerifierInfraError, match="no report"):
        verify(runtime, busybox_image, graded_task(pkg_task()), pkg("import os\nos._exit(0)\n"), None, baseline=baseline)


def test_a_missing_checker_file_is_still_an_infra_error(runtime, python_image, baseline):
    task = pkg_task()
    task["checker"] = {**task["checker"], "tests": ["test_pkg.py", "test_gone.py"]}
    with pytest.raises(VerifierInfraError, match="test_gone.py"):
        verify(runtime, python_image, graded_task(task), pkg(REFERENCE), None, baseline=baseline)


def test_a_sandbox_that_cannot_start_is_still_an_infra_error(runtime, python_image, baseline, tmp_path):
    missing = tmp_path / "no-such-image.sif"
    with pytest.raises(VerifierInfraError, match="failed to start"):
        verify(runtime, missing, graded_task(pkg_task()), pkg("import os\nos._exit(0)\n"), None, baseline=baseline)


def test_a_failure_without_any_agent_change_is_infra_not_compared(runtime, busybox_image):
    class Never(grade.Baseline):
        def clean(self, *a, **k):
            raise AssertionError("no agent change: nothing to compare")
    with pytest.raises(VerifierInfraError):
        verify(runtime, busybox_image, graded_task(pkg_task()), [], None, baseline=Never())


def test_a_stopped_pytest_is_a_timeout_never_infra(runtime, python_image, baseline):
    task = pkg_task()
    task["checker"]["timeout_s"] = 4
    v = verify(runtime, python_image, graded_task(task), pkg("import os, signal\nos.kill(os.getpid(), signal.SIGSTOP)\n"), None,
               baseline=baseline)
    assert (v.outcome, v.reward) == ("timeout", 0.0)


# -- memory: files count, and the OOM killer takes the workload before the grader -------------

MEMFD_HOLDERS = r'''
import subprocess, sys, time
# memory through memfds written by small processes that hold nothing else (no process's RSS
# shows it) and that first lower their own oom_score_adj to 0 (the minimum they inherited):
# the processes left for the OOM killer are pytest, then the grader
HOLD = "import os, time\nopen('/proc/self/oom_score_adj', 'w').write('0')\nfd = os.memfd_create('x', 0)\nfor _ in range(200):\n    os.write(fd, b'1' * (1 << 20))\ntime.sleep(120)\n"
for _i in range(4):
    subprocess.Popen([sys.executable, "-S", "-c", HOLD], start_new_session=True)
time.sleep(6)
def double(x):
    raise NotImplementedError
'''


def test_memory_filled_through_memfds_kills_the_workload_not_the_grader(runtime, python_image):
    """Before: every process at oom_score_adj 1000, the grader (bigger than the memfd writers)
    was killed and no report was written. Now the grader runs at 0, the OOM killer takes the
    memfd writers (or pytest) and the grader's report decides: a fail on its own evidence, with
    the comparison against the reference turned off."""
    v = verify(runtime, python_image, graded_task(pkg_task()), pkg(MEMFD_HOLDERS), None, baseline=grade.NO_BASELINE)
    assert (v.outcome, v.reward) == ("fail", 0.0)
    assert "required tests passed" in v.checks[-1]["detail"]


LOWER_AND_LOOK = r'''
import os, sys, time
os.setresgid(1000, 1000, 1000)
os.setresuid(1000, 1000, 1000)
os.execv(sys.executable, [sys.executable, "-c",
    "import time\nopen('/proc/self/oom_score_adj', 'w').write('0')\nlow = open('/proc/self/oom_score_adj').read().strip()"
    "\ntime.sleep(0.3)\nprint(low, open('/proc/self/oom_score_adj').read().strip())"])
'''


def test_the_grader_stays_below_its_unprivileged_workload_in_the_oom_order(runtime, python_image):
    """A command run at oom_score_adj 0 (the grader) keeps 0; a process it starts under another
    uid that lowers itself to 0 (allowed: 0 is the minimum it inherited) is raised back to 1000
    by the sandbox init within its sweep period."""
    sb = runtime.acquire(SandboxSpec(image=python_image, limits={"memory_mb": 128, "pids": 32, "disk_mb": 32}))
    try:
        r = sb.exec(["sh", "-c", "cat /proc/self/oom_score_adj"], oom_score_adj=0)
        assert r.stdout.strip() == b"0"
        r = sb.exec(["python3", "-c", LOWER_AND_LOOK], cwd="/tmp", oom_score_adj=0)
        assert r.stdout.split() == [b"0", b"1000"], r
        r = sb.exec(["sh", "-c", "cat /proc/self/oom_score_adj"])
        assert r.stdout.strip() == b"1000"      # every other command: the OOM killer's first choice
    finally:
        sb.destroy()


@pytest.mark.parametrize("how", ["memfd", "tmpfs"])
def test_memory_written_to_files_counts_against_the_sandbox(runtime, python_image, how):
    """Pages of a memfd or of the sandbox's own tmpfs are charged to its memory cgroup: 200 MB
    written by a 64 MB sandbox is killed there (the writer, exit 137), however it is held."""
    write = {"memfd": "fd = os.memfd_create('x', 0)", "tmpfs": "fd = os.open('/tmp/f', os.O_WRONLY | os.O_CREAT)"}[how]
    sb = runtime.acquire(SandboxSpec(image=python_image, limits={"memory_mb": 64, "pids": 32, "disk_mb": 256}))
    try:
        r = sb.exec(["python3", "-c", f"import os\n{write}\nfor _ in range(200):\n    os.write(fd, b'1' * (1 << 20))\n"
                     "print('all written')"], cwd="/tmp", timeout_s=30)
        assert r.exit_code == 137 and b"all written" not in r.stdout, r
        stat = sb.cgroup_stat()
        if "memory.oom_control" in stat:
            assert "oom_kill 0" not in stat["memory.oom_control"]
    finally:
        sb.destroy()


def test_a_check_process_is_the_oom_killers_first_choice_not_the_check_server():
    from nodeagent.verifier.checks import CheckRunner
    with CheckRunner() as runner:
        r = runner.run(argv=["sh", "-c", "cat /proc/self/oom_score_adj; cat /proc/$PPID/oom_score_adj"])
        server = int(open(f"/proc/{runner._proc.pid}/oom_score_adj").read())
    check, _spare_parent = r.stdout.split()
    assert int(check) == 1000 and server < 1000, (r, server)


# -- the curriculum: a policy cannot quarantine a task ----------------------------------------

ROLLOUT_REASONS = ("model_server: 502 bad gateway", "store: changes artifact: [Errno 27] File too large",
                   "agent_crash: RecursionError: maximum recursion depth exceeded", "lease_expired", "?")


def test_dead_letters_of_the_rollouts_own_making_never_quarantine_the_task(tmp_path):
    from controller.taskbank.curriculum import Curriculum
    cur = Curriculum(tmp_path / "c.sqlite", ["t-hard", "t-broken"])
    for _ in range(4):
        for reason in ROLLOUT_REASONS:
            cur.record_infra_failure("t-hard", reason)
    assert cur.quarantined() == {}
    for _ in range(3):
        cur.record_infra_failure("t-broken", "verifier: grader wrote no report (exit 127): no python3")
    assert list(cur.quarantined()) == ["t-broken"]


class CountingRuntime:
    """The real runtime, counting the sandboxes the verifier asks for."""

    def __init__(self, runtime) -> None:
        self.runtime, self.acquired = runtime, 0

    def __getattr__(self, name):
        return getattr(self.runtime, name)

    def acquire(self, *a, **k):
        self.acquired += 1
        return self.runtime.acquire(*a, **k)


def test_validations_outcomes_are_reused_and_decide(runtime, python_image):
    """Seeded (as validation does) the baseline is not graded again: a crash costs its own one
    attempt (compared before any retry). A seeded reference that was an infra error keeps the
    crash an infra error."""
    crash = pkg("import importlib\n__getattr__ = importlib.import_module\n")
    seeded, counting = grade.Baseline(), CountingRuntime(runtime)
    seeded.seed(graded_task(pkg_task()), python_image, {"reference": "pass", "null": "fail"})
    assert verify(counting, python_image, graded_task(pkg_task()), crash, None, baseline=seeded).outcome == "fail"
    assert counting.acquired == 1
    fresh, counting = grade.Baseline(), CountingRuntime(runtime)
    assert verify(counting, python_image, graded_task(pkg_task()), crash, None, baseline=fresh).outcome == "fail"
    assert counting.acquired == 3          # and the reference and null, once
    broken = grade.Baseline()
    broken.seed(graded_task(pkg_task()), python_image, {"reference": "infra_error", "null": "infra_error"})
    with pytest.raises(VerifierInfraError, match="cannot import a dependency"):
        verify(runtime, python_image, graded_task(pkg_task()), crash, None, baseline=broken)


def test_validation_seeds_the_baseline_before_the_hacks(runtime, python_image):
    from nodeagent.verifier import validate
    task = {**pkg_task(), "task_id": "infra-escapes-seed-test"}
    v = validate.validate_task(runtime, python_image, task, workers=1, quick=True)
    assert v.ok, v.reasons
    assert grade.BASELINE.clean(graded_task(task), python_image, lambda *a: pytest.fail("graded again")) == \
        "reference: pass, null: fail"
