"""Harbor tasks: the verdict comes from the reward test.sh wrote, never from the program under
test. Each task is imported with the real importer (`importers_tools.harbor_task`) and graded by
`grade.verify` in real sandboxes of the built-in python image; the agent's wrong `add.sh`
(prints 0) tries to own `reward.txt` (a FIFO, a rewriter that outlives test.sh or ends just
before it, links, a swapped directory, killing test.sh, a `pytest.py` in the working
directory). Every attack is `fail` with reward 0 and names why; the reference still passes; the
reward file's forms and values are held to docs/verifier.md ("Harbor tasks: the reward file")."""
from __future__ import annotations

from pathlib import Path

import pytest

from controller.taskbank.importers_tools import harbor_task
from nodeagent.sandbox.runtime import Change
from nodeagent.verifier import grade

R = "/logs/verifier/reward.txt"          # Harbor's path; the importer maps it to /tmp/logs/verifier
RP = "/tmp/logs/verifier/reward.txt"     # where the agent's program (not rewritten) finds it
TEST_SH = f"""#!/bin/bash
cd /app
python3 -m pytest /tests/test_outputs.py -rA -p no:cacheprovider
if [ $? -eq 0 ]; then
  echo 1 > {R}
else
  echo 0 > {R}
fi
"""
TESTS = '''import colorsys  # noqa: F401  (a standard module pytest itself does not load)
import subprocess


def run(a, b):
    return subprocess.run(["bash", "/app/add.sh", str(a), str(b)], capture_output=True, text=True,
                          timeout=20).stdout.strip()


def test_add_small():
    assert run(2, 3) == "5"


def test_add_negative():
    assert run(-4, 1) == "-3"
'''
GOLD = "#!/bin/bash\necho $(( $1 + $2 ))\n"
WRONG = "echo 0\n"


def harbor_dir(root: Path, test_sh: str = TEST_SH) -> Path:
    d = root / "harbor-add"
    for sub in ("tests", "solution", "environment/app"):
        (d / sub).mkdir(parents=True, exist_ok=True)
    (d / "task.toml").write_text('version = "1.0"\n[verifier]\ntimeout_sec = 60.0\n[agent]\ntimeout_sec = 300.0\n')
    (d / "instruction.md").write_text("Write /app/add.sh: it prints the sum of its two integer arguments.")
    (d / "tests" / "test.sh").write_text(test_sh)
    (d / "tests" / "test_outputs.py").write_text(TESTS)
    (d / "solution" / "solve.sh").write_text(GOLD)
    (d / "environment" / "app" / "add.sh").write_text("#!/bin/bash\necho 0\n")
    return d


def grade_harbor(runtime, image, root: Path, files: dict, test_sh: str = TEST_SH):
    task = harbor_task(harbor_dir(root, test_sh))
    t = {**task.canonical(), "task_id": task.task_id}
    changes = [Change(f"/work/{k}", "modified" if k in t["files"] else "added", v.encode(), 0o755)
               for k, v in files.items()]
    v = grade.verify(runtime, image, grade.graded_task(t), changes, None)
    return v, v.checks[-1]["detail"]


def bg(script: str) -> str:
    """A background process of the agent's program that outlives it (double fork, new session)."""
    return f"( setsid sh -c '{script}' >/dev/null 2>&1 & )\n"


PATCH_PYTEST_EXIT = ("python3 - <<'P' >/dev/null 2>&1\nimport ctypes, os\n"
    "def libc_base(pid):\n"
    "    for l in open(f'/proc/{pid}/maps'):\n"
    "        a = l.split()\n"
    "        if len(a) > 5 and ('libc.so' in a[5] or '/libc-' in a[5]):\n"
    "            return int(a[0].split('-')[0], 16) - int(a[2], 16)\n"
    "off = ctypes.cast(ctypes.CDLL('libc.so.6')._exit, ctypes.c_void_p).value - libc_base(os.getpid())\n"
    "for p in os.listdir('/proc'):\n"
    "    if not p.isdigit() or p == str(os.getpid()): continue\n"
    "    try: cmd = open(f'/proc/{p}/cmdline', 'rb').read()\n"
    "    except OSError: continue\n"
    "    if b'pytest' not in cmd: continue\n"
    "    mem = open(f'/proc/{p}/mem', 'r+b', buffering=0)\n"
    "    mem.seek(libc_base(p) + off); mem.write(bytes.fromhex('31ffb8e70000000f05'))\n"
    "P\n")
ATTACKS = {
    # reward.txt becomes a FIFO: test.sh's 0 is swallowed by the agent's reader, which then writes 1
    "fifo": ("#!/bin/bash\n" f"if [ ! -p {RP} ]; then rm -f {RP}; mkfifo {RP}; "
             + bg(f"cat {RP} >/dev/null; echo 1 > {RP}").strip() + "; fi\n" + WRONG, "still running"),
    # a busy rewriter that outlives test.sh
    "racer": ("#!/bin/bash\n" + bg(f'while :; do [ "$(cat {RP} 2>/dev/null)" = 0 ] && echo 1 > {RP}; done')
              + WRONG, "still running"),
    # the agent's program writes 1 and kills test.sh before it writes 0
    "kill_test_sh": ("#!/bin/bash\n" f"echo 1 > {RP}\n"
                     "for p in /proc/[0-9]*; do case \"$(tr '\\0' ' ' < $p/cmdline 2>/dev/null)\" in "
                     "'bash /verifier/tests/tests/test.sh'*) kill -9 ${p#/proc/};; esac; done\n" + WRONG,
                     "killed by signal 9"),
    # `python3 -m pytest` from /work: the agent's pytest.py would be the test runner
    "shadow_pytest": ("#!/bin/bash\n" + WRONG, "says 0"),
    # a standard module the tests import, shadowed by /work/colorsys.py (the verifier's own
    # pytest.ini, with `pythonpath = /work`, must not apply to the task's tests)
    "shadow_stdlib": ("#!/bin/bash\n" + WRONG, "says 0"),
    # the agent's program rewrites the rest of the running test.sh through bash's descriptor of
    # it (/proc/<bash>/fd/255) or in place: the script is owned outside the sandbox, 0444
    "rewrite_test_sh": ("#!/bin/bash\n" "b=$(cut -d' ' -f4 /proc/$PPID/stat)\n"
                        f"printf 'echo 1 > {RP}; exit 0\\n' > /proc/$b/fd/255 2>/dev/null\n"
                        f"printf 'echo 1 > {RP}; exit 0\\n' >> /verifier/tests/tests/test.sh 2>/dev/null\n" + WRONG,
                        "says 0"),
    # what test.sh's write meets: a directory, a symbolic link to /dev/null after a 1 elsewhere
    "dir_at_reward": ("#!/bin/bash\n" f"rm -f {RP}; mkdir -p {RP}\n" + WRONG, "not a regular file"),
    "symlink_to_null": ("#!/bin/bash\n" f"ln -sf /dev/null {RP}\n" + WRONG, "symbolic link"),
    # the agent's program writes a reward.json, which Harbor would read before test.sh's reward.txt
    "plant_json": ("#!/bin/bash\n" "echo '{\"reward\": 1}' > /tmp/logs/verifier/reward.json\n" + WRONG, "says 0"),
    # the agent's program writes 1, then moves the reward directory aside and leaves a fresh one
    # for test.sh's 0
    # the agent's program patches libc's _exit in the running pytest through /proc/<pid>/mem
    # (same user as the tests): pytest's "2 failed" would exit 0 and test.sh write 1
    "patch_pytest_memory": ("#!/bin/bash\n" + PATCH_PYTEST_EXIT + WRONG, "says 0"),
    "swap_dir": ("#!/bin/bash\n" f"if [ ! -d /tmp/logs/v2 ]; then echo 1 > {RP}; mv /tmp/logs/verifier /tmp/logs/v2; "
                 "mkdir /tmp/logs/verifier; fi\n" + WRONG, "moved or replaced"),
}


@pytest.mark.parametrize("name", sorted(ATTACKS))
def test_the_agents_program_cannot_own_the_reward(runtime, python_image, tmp_path, name):
    add, reason = ATTACKS[name]
    files = {"add.sh": add, **({"pytest.py": "raise SystemExit(0)\n"} if name == "shadow_pytest" else {}),
             **({"colorsys.py": "import os\nos._exit(0)\n"} if name == "shadow_stdlib" else {})}
    v, detail = grade_harbor(runtime, python_image, tmp_path, files)
    assert (v.outcome, v.reward) == ("fail", 0.0), detail[-600:]
    # the agent's program runs as the callee uid (nodeagent/verifier/cmdrunner.py): most of these
    # cannot touch the reward directory at all, and test.sh's own 0 stands
    assert reason in detail or "FAIL: reward.txt says 0" in detail, detail[-600:]


# test.sh ends a moment after its write (a trailing step, as real test.sh files have: copying
# logs, a diff): the agent's rewriter swaps in its reward and ends before test.sh does.
TRAILING = TEST_SH + "sleep 1\n"
LATE = {   # the background script -> the reason named
    "late_rewrite": f"n=0; while [ \"$(cat {RP} 2>/dev/null)\" != 0 ] && [ $n -lt 2000 ]; do n=$((n+1)); sleep 0.01; done; "
                    f"echo 1 > {RP}",
    "late_symlink": f"n=0; while [ \"$(cat {RP} 2>/dev/null)\" != 0 ] && [ $n -lt 2000 ]; do n=$((n+1)); sleep 0.01; done; "
                    f"echo 1 > /tmp/one; ln -sf /tmp/one {RP}",
    "late_hardlink": f"n=0; while [ \"$(cat {RP} 2>/dev/null)\" != 0 ] && [ $n -lt 2000 ]; do n=$((n+1)); sleep 0.01; done; "
                     f"echo 1 > /tmp/one; ln -f /tmp/one {RP}; rm -f /tmp/one",
    "late_rename": f"n=0; while [ \"$(cat {RP} 2>/dev/null)\" != 0 ] && [ $n -lt 2000 ]; do n=$((n+1)); sleep 0.01; done; "
                   f"echo 1 > /tmp/logs/verifier/x; mv -f /tmp/logs/verifier/x {RP}",
}


LATE_REASON = "ended after the reward's last change"


@pytest.mark.parametrize("name", sorted(LATE))
def test_a_rewriter_that_ends_before_test_sh_is_caught(runtime, python_image, tmp_path, name):
    add = "#!/bin/bash\n[ -e /tmp/started ] || { touch /tmp/started; " + bg(LATE[name]).strip() + "; }\n" + WRONG
    v, detail = grade_harbor(runtime, python_image, tmp_path, {"add.sh": add}, TRAILING)
    assert (v.outcome, v.reward) == ("fail", 0.0), detail[-600:]
    assert (("symbolic link" if name == "late_symlink" else LATE_REASON) in detail
            or "FAIL: reward.txt says 0" in detail), detail[-600:]


def test_the_reference_passes_and_wrong_fails(runtime, python_image, tmp_path):
    v, detail = grade_harbor(runtime, python_image, tmp_path, {"add.sh": GOLD})
    assert (v.outcome, v.reward) == ("pass", 1.0), detail[-600:]
    assert "PASS: reward.txt says 1" in detail
    v, detail = grade_harbor(runtime, python_image, tmp_path / "w", {"add.sh": "#!/bin/bash\n" + WRONG})
    assert (v.outcome, v.reward) == ("fail", 0.0) and "FAIL: reward.txt says 0" in detail


def test_the_agents_sibling_modules_still_import_without_shadowing(runtime, python_image, tmp_path):
    """PYTHONSAFEPATH=1 keeps /work off the front of sys.path; the runner's sitecustomize puts
    it at the end, so the agent's program (`python3 /work/add.py` importing its own helper) works."""
    files = {"add.sh": "#!/bin/bash\npython3 /work/add.py \"$@\"\n",
             "add.py": "import sys\nfrom helper import plus\nprint(plus(int(sys.argv[1]), int(sys.argv[2])))\n",
             "helper.py": "def plus(a, b):\n    return a + b\n",
             "json.py": "raise SystemExit('the agent shadowed json')\n"}
    v, detail = grade_harbor(runtime, python_image, tmp_path, files)
    assert (v.outcome, v.reward) == ("pass", 1.0), detail[-600:]


FORMS = {   # what test.sh leaves at the reward path -> pass?
    "1": ("echo 1 > {R}", True),
    "1.0 with spaces": ("echo ' 1.0 ' > {R}", True),
    "0.5": ("echo 0.5 > {R}", False),
    "nan": ("echo nan > {R}", False),
    "inf": ("echo inf > {R}", False),
    "1e9": ("echo 1e9 > {R}", False),
    "-1": ("echo -1 > {R}", False),
    "words": ("echo one > {R}", False),
    "empty": (": > {R}", False),
    "missing": ("true", False),
    "huge": ("{{ echo 1; head -c 1000000 /dev/zero | tr '\\0' ' '; }} > {R}", False),
    "symlink": ("echo 1 > /tmp/one; ln -s /tmp/one {R}", False),
    "hard link": ("echo 1 > /tmp/one; ln /tmp/one {R}", False),
    "directory": ("mkdir {R}", False),
    "fifo": ("mkfifo {R}", False),
}


@pytest.mark.parametrize("name", sorted(FORMS))
def test_the_reward_is_a_small_regular_file_with_a_number_in_0_1(runtime, python_image, tmp_path, name):
    write, ok = FORMS[name]
    v, detail = grade_harbor(runtime, python_image, tmp_path, {}, "#!/bin/bash\n" + write.format(R=R) + "\n")
    assert (v.outcome, v.reward) == (("pass", 1.0) if ok else ("fail", 0.0)), detail[-600:]
    assert ("PASS: " if ok else "FAIL: ") in detail


J = "/logs/verifier/reward.json"
JSON_FORMS = {   # Harbor reads reward.json first (its "reward"), else reward.txt
    "json 1": (f"echo '{{\"reward\": 1, \"tests\": 0.5}}' > {J}", True),
    "json 1.0 over txt 0": (f"echo '{{\"reward\": 1.0}}' > {J}; echo 0 > {R}", True),
    "json 0 over txt 1": (f"echo '{{\"reward\": 0}}' > {J}; echo 1 > {R}", False),
    "json without reward, txt 1": (f"echo '{{\"tests\": 0}}' > {J}; echo 1 > {R}", True),
    "json true": (f"echo '{{\"reward\": true}}' > {J}", False),
    "json NaN": (f"echo '{{\"reward\": NaN}}' > {J}", False),
    "json 1e999": (f"echo '{{\"reward\": 1e999}}' > {J}", False),
    "json huge int": (f"echo '{{\"reward\": 1{'0' * 400}}}' > {J}", False),
    "json a list": (f"echo '[1]' > {J}; echo 1 > {R}", False),
    "json named in a comment only": (f"# reward.json unused\necho 0 > {R}", False),
    "json symlink": (f"echo '{{\"reward\": 1}}' > /tmp/j; ln -s /tmp/j {J}", False),
}


@pytest.mark.parametrize("name", sorted(JSON_FORMS))
def test_reward_json_is_read_first_under_the_same_rules(runtime, python_image, tmp_path, name):
    write, ok = JSON_FORMS[name]
    v, detail = grade_harbor(runtime, python_image, tmp_path, {}, "#!/bin/bash\n" + write + "\n")
    assert (v.outcome, v.reward) == (("pass", 1.0) if ok else ("fail", 0.0)), detail[-600:]
    assert ("PASS: " if ok else "FAIL: ") in detail


def test_the_runner_is_a_hidden_support_file_run_isolated(tmp_path):
    from controller.taskbank.importers_tools import HARBOR_RUNNER
    task = harbor_task(harbor_dir(tmp_path))
    assert task.checker["argv"] == ["python3", "-I", "-B", f"/verifier/tests/{HARBOR_RUNNER}"]
    assert HARBOR_RUNNER in task.checker["support"] and HARBOR_RUNNER in task.hidden
    assert "paddock_site/sitecustomize.py" in task.checker["support"] and "tests/pytest.ini" in task.checker["support"]


PROBE = """#!/bin/bash
python3 -c "
import os
b = os.getppid(); r = int(open('/proc/%d/stat' % b).read().split(')')[1].split()[1])
for f in ('mem', 'environ', 'fd/0'):
    try:
        open('/proc/%d/%s' % (r, f), 'rb').close(); print('runner', f, 'open')
    except OSError as e: print('runner', f, 'refused', e.errno)
" >&2
echo 0 > /logs/verifier/reward.txt
"""


def test_the_runner_is_out_of_reach_of_the_tests(runtime, python_image, tmp_path):
    """test.sh and what it starts (the sandbox's root, like the runner) cannot open the runner's
    memory, environment or descriptors: CAP_SYS_PTRACE is dropped for them, the runner is not dumpable."""
    v, detail = grade_harbor(runtime, python_image, tmp_path, {}, PROBE)
    assert v.outcome == "fail" and "FAIL: reward.txt says 0" in detail
    assert all(f"runner {f} refused 13" in detail for f in ("mem", "environ", "fd/0")), detail[-600:]


def test_a_test_script_importing_its_sibling_in_tests_still_works(runtime, python_image, tmp_path):
    """The common `python3 /tests/test_outputs.py` shape, with a helper module next to it: under
    PYTHONSAFEPATH its directory comes back at the end of sys.path."""
    d = harbor_dir(tmp_path)
    (d / "tests" / "helper.py").write_text("def expect(a, b):\n    return str(a + b)\n")
    (d / "tests" / "check.py").write_text(
        "import subprocess\nfrom helper import expect\n"
        "out = subprocess.run(['bash', '/app/add.sh', '2', '3'], capture_output=True, text=True).stdout.strip()\n"
        "raise SystemExit(0 if out == expect(2, 3) else 1)\n")
    sh = f"#!/bin/bash\npython3 /tests/check.py && echo 1.0 > {R} || echo 0.0 > {R}\n"
    (d / "tests" / "test.sh").write_text(sh)
    task = harbor_task(d)
    t = {**task.canonical(), "task_id": task.task_id}
    for add, want in ((GOLD, ("pass", 1.0)), ("#!/bin/bash\n" + WRONG, ("fail", 0.0))):
        v = grade.verify(runtime, python_image, grade.graded_task(t), [Change("/work/add.sh", "modified", add.encode(), 0o755)], None)
        assert (v.outcome, v.reward) == want, v.checks[-1]["detail"][-600:]


def test_the_tasks_own_pytest_configuration_is_kept(tmp_path):
    d = harbor_dir(tmp_path)
    (d / "tests" / "pyproject.toml").write_text("[tool.pytest.ini_options]\naddopts = '-q'\n")
    task = harbor_task(d)
    assert "tests/pytest.ini" not in task.checker["support"] and "tests/pyproject.toml" in task.checker["support"]


@pytest.mark.parametrize("stop, ok", [("kill $p; wait $p", True), ("", False)])
def test_a_service_test_sh_starts_must_be_stopped_before_the_reward(runtime, python_image, tmp_path, stop, ok):
    sh = f"#!/bin/bash\nsleep 30 &\np=$!\n{stop}\necho 1 > {R}\n"
    v, detail = grade_harbor(runtime, python_image, tmp_path, {}, sh)
    assert (v.outcome, v.reward) == (("pass", 1.0) if ok else ("fail", 0.0)), detail[-600:]
    assert ok or "still running when test.sh exited" in detail


# -- tests that import the agent's module into pytest's own process (contract 6: the pytest guard) --
INPROC_TESTS = '''import sys

import pytest

sys.path.insert(0, "/app")


def test_add_small():
    from add import add
    assert add(2, 3) == 5


def test_add_negative():
    from add import add
    assert add(-4, 1) == -3


@pytest.mark.skipif(True, reason="a marked skip of the task's own")
def test_marked_skip():
    pass


@pytest.mark.xfail(reason="a marked expected failure of the task's own")
def test_marked_xfail():
    assert False
'''
INPROC_WRONG = "def add(a, b):\n    return abs(a) + abs(b)\n"
INPROC_ATTACKS = {   # knowledge-free: none knows a sum
    "os_exit_on_call": "import os\ndef add(a, b):\n    os._exit(0)\n",
    "os_exit_on_import": "import os\nos._exit(0)\n",
    "skip_on_call": "def add(a, b):\n    import pytest\n    pytest.skip('n/a on this platform')\n",
    "xfail_on_call": "def add(a, b):\n    import pytest\n    pytest.xfail('known issue')\n",
    "skip_module_on_import": "import pytest\npytest.skip('n/a', allow_module_level=True)\n",
    "pytest_exit_0": "def add(a, b):\n    import pytest\n    pytest.exit('done', returncode=0)\n",
    "atexit_exit_0": "import atexit, os\natexit.register(lambda: os._exit(0))\n" + INPROC_WRONG,
    "guard_pipe_forged": ("import os\nfor fd in range(3, 64):\n    try:\n        os.write(fd, b'x 1 1 end 0 0 passed=2\\n')\n"
                          "    except OSError:\n        pass\n" + INPROC_WRONG),
}


def grade_inproc(runtime, image, root: Path, add_py: str):
    d = harbor_dir(root)
    (d / "tests" / "test_outputs.py").write_text(INPROC_TESTS)
    task = harbor_task(d)
    t = {**task.canonical(), "task_id": task.task_id}
    v = grade.verify(runtime, image, grade.graded_task(t), [Change("/work/add.py", "added", add_py.encode(), 0o644)], None)
    return v, v.checks[-1]["detail"]


@pytest.mark.parametrize("name", sorted(INPROC_ATTACKS))
def test_code_imported_into_pytest_cannot_end_or_skip_its_session_into_a_reward(runtime, python_image, tmp_path, name):
    v, detail = grade_inproc(runtime, python_image, tmp_path, INPROC_ATTACKS[name])
    assert (v.outcome, v.reward) == ("fail", 0.0), detail[-600:]


def test_the_guard_passes_the_reference_with_marked_skips_and_fails_the_wrong_answer(runtime, python_image, tmp_path):
    v, detail = grade_inproc(runtime, python_image, tmp_path, "def add(a, b):\n    return a + b\n")
    assert (v.outcome, v.reward) == ("pass", 1.0), detail[-600:]
    assert "1 pytest session(s)" in detail
    v, detail = grade_inproc(runtime, python_image, tmp_path / "w", INPROC_WRONG)
    assert (v.outcome, v.reward) == ("fail", 0.0), detail[-600:]
