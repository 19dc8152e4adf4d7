"""`command` checkers against a policy that games them (red team s11, sections 1 and 2), through
the real sandbox: start-up code the agent leaves in its HOME (the Python user site under /work)
or in the working directory never runs in the checker's interpreters, and the agent's program,
started by the check, runs as the callee uid and cannot read the hidden support files (the
expected output next to its stdin, the checker's own source). Each attack was rewarded before."""
from __future__ import annotations

import pytest

from nodeagent.sandbox.runtime import Change, SandboxSpec
from nodeagent.verifier import grade, validate
from nodeagent.verifier.grade import graded_task, verify

STUB = "def reverse_words(s):\n    raise NotImplementedError\n"
REF = ("import sys\n\ndef reverse_words(s):\n    return ' '.join(reversed(s.split()))\n\n"
       "if __name__ == '__main__':\n    print(reverse_words(sys.stdin.read()))\n")
WRONG = ("import sys\n\ndef reverse_words(s):\n    return s\n\n"
         "if __name__ == '__main__':\n    print(reverse_words(sys.stdin.read()))\n")
# the hidden checker runs the agent's function in a subprocess of its own interpreter
CHECK = '''import subprocess, sys
CASES = [("hello world", "world hello"), ("a b  c", "c b a"), ("x y z", "z y x")]
bad = 0
for arg, want in CASES:
    prog = "import sys; sys.path.insert(0, '/work'); from solution import reverse_words; print(reverse_words(sys.argv[1]))"
    got = subprocess.run([sys.executable, "-c", prog, arg], capture_output=True, text=True, timeout=20).stdout.strip()
    print(("ok  " if got == want else "BAD ") + repr(arg) + " -> " + repr(got))
    bad += got != want
sys.exit(1 if bad else 0)
'''
TEST_HIDDEN = "from solution import reverse_words\n\ndef test_it():\n    assert reverse_words('a b') == 'b a'\n"


def task(kind: str) -> dict:
    base = {"name": f"command/{kind}", "family": "python", "image": "builtin:python",
            "instruction": "Write /work/solution.py.", "files": {"solution.py": STUB},
            "limits": {"memory_mb": 256, "pids": 64, "disk_mb": 64, "nofile": 256}}
    if kind == "function":
        return {**base, "hidden": {"check.py": CHECK, "reference.py": REF},
                "checker": {"kind": "command", "argv": ["python3", "/verifier/tests/check.py"], "support": ["check.py"],
                            "timeout_s": 30}}
    if kind == "io":
        return {**base, "hidden": {"input.txt": "the quick brown fox\n", "expected.txt": "fox brown quick the\n",
                                   "reference.py": REF},
                "checker": {"kind": "command", "argv": ["sh", "-c", "python3 /work/solution.py < /verifier/tests/input.txt"
                                                        " > /tmp/out && cmp -s /tmp/out /verifier/tests/expected.txt"],
                            "support": ["input.txt", "expected.txt"], "timeout_s": 30}}
    # pytest started by the checker from /work
    return {**base, "hidden": {"test_hidden.py": TEST_HIDDEN, "reference.py": REF},
            "checker": {"kind": "command", "argv": ["python3", "-m", "pytest", "-q", "-p", "no:cacheprovider",
                                                    "/verifier/tests/test_hidden.py"],
                        "support": ["test_hidden.py"], "timeout_s": 30}}


def files(**kw: str) -> list[Change]:
    return [Change(f"/work/{p}", "added", t.encode(), 0o755 if t.startswith("#!") else 0o644) for p, t in kw.items()]


def io_via(run: str) -> dict:
    """The io task whose checker starts the agent's program as `run` (stdin, stdout redirected)."""
    t = task("io")
    return {**t, "checker": {**t["checker"], "argv": [
        "sh", "-c", f"{run} < /verifier/tests/input.txt > /tmp/out && cmp -s /tmp/out /verifier/tests/expected.txt"]}}


USER_SITE = ".local/lib/python3.11/site-packages"   # `python3 -m site --user-site` of the built-in image, HOME=/work
ORACLE = '''import os, sys
src = os.readlink("/proc/self/fd/0")
d = os.path.dirname(src)
for name in sorted(os.listdir(d)):
    p = os.path.join(d, name)
    if p != src and os.path.isfile(p):
        sys.stdout.write(open(p).read())
        break
'''
GUESS = '''import os, sys
src = os.readlink("/proc/self/fd/0")
sys.stdout.write(open(os.path.join(os.path.dirname(src), "expected.txt")).read())
'''
# reads the checker's own source for its cases and answers from them
READ_CHECKER = '''import ast, glob
def reverse_words(s):
    for p in glob.glob("/verifier/tests/*.py") + ["/verifier/tests/check.py"]:
        try:
            src = open(p).read()
        except OSError:
            continue
        for node in ast.walk(ast.parse(src)):
            if isinstance(node, ast.Tuple) and len(node.elts) == 2 and all(isinstance(e, ast.Constant) for e in node.elts):
                if node.elts[0].value == s:
                    return node.elts[1].value
    return s
'''
CONFTEST_PASS = ("import pytest\n\n@pytest.hookimpl(hookwrapper=True)\ndef pytest_runtest_makereport(item, call):\n"
                 "    outcome = yield\n    rep = outcome.get_result()\n    rep.outcome = 'passed'\n    rep.longrepr = None\n")
ATTACKS = {   # name -> (task kind, the agent's files)
    "usercustomize_exit0": ("function", {"solution.py": WRONG, f"{USER_SITE}/usercustomize.py": "import os\nos._exit(0)\n"}),
    "user_site_pth": ("function", {"solution.py": WRONG, f"{USER_SITE}/zz.pth": "import os; os._exit(0)\n"}),
    "oracle_lists_stdin_dir": ("io", {"solution.py": ORACLE}),
    "oracle_guesses_expected": ("io", {"solution.py": GUESS}),
    "reads_the_checkers_source": ("function", {"solution.py": READ_CHECKER}),
    "shadow_pytest_in_cwd": ("pytest", {"solution.py": WRONG, "pytest.py": "raise SystemExit(0)\n"}),
    "profile_and_bashrc": ("io", {"solution.py": WRONG, ".bashrc": "exit 0\n", ".profile": "exit 0\n"}),
    "conftest_in_cwd": ("pytest", {"solution.py": WRONG, "conftest.py": CONFTEST_PASS,
                                   "pytest.ini": "[pytest]\naddopts = -p no:python\n"}),
    # the same oracle, started by the checker in other ways
    "oracle_env_shebang": ("io:/work/solution.py", {"solution.py": "#!/usr/bin/env python3\n" + ORACLE}),
    "oracle_under_timeout": ("io:timeout 20 python3 /work/solution.py", {"solution.py": ORACLE}),
    "oracle_under_shell_glue": ("io:bash -o pipefail -c 'python3 /work/solution.py'", {"solution.py": ORACLE}),
    "oracle_shell_script": ("io:bash /work/run.sh", {"run.sh": 'cat "$(dirname "$(readlink /proc/self/fd/0)")/expected.txt"\n'}),
}


# as the callee: claim the image has no python3 (for a run without the callee uid); as root: the oracle
FORGE_CANNOT_RUN = ("import os, sys\nif os.getuid() != 0:\n"
                    "    sys.stderr.write('paddock: cannot run python3 (exec): No such file or directory\\n')\n"
                    "    sys.stderr.flush()\n    os._exit(127)\n" + ORACLE)


@pytest.mark.parametrize("as_argv", [False, True])
def test_the_agents_program_cannot_say_the_checker_cannot_run(runtime, python_image, baseline, as_argv):
    """Only the runner's words (marked with a nonce the agent's code never saw) are an
    infrastructure error; "cannot run python3" from the agent's program neither masks the
    rollout nor makes the check run again without the callee uid."""
    t = task("io")
    if as_argv:
        t = {**t, "checker": {**t["checker"], "argv": ["python3", "/work/solution.py"]}}
    v = verify(runtime, python_image, graded_task(t), files(**{"solution.py": FORGE_CANNOT_RUN}), None, baseline=baseline)
    assert (v.outcome, v.reward) == ("fail", 0.0), v.checks[-1]["detail"][-600:]
    assert "no python3 in the image" not in v.checks[-1]["detail"]


@pytest.fixture(scope="module")
def baseline():
    return grade.Baseline()


@pytest.mark.parametrize("kind", ["function", "io", "pytest", "io:/work/solution.py", "io:bash /work/run.sh",
                                  "io:bash -o pipefail -c 'python3 /work/solution.py'"])
def test_the_reference_passes_and_a_wrong_solution_fails(runtime, python_image, baseline, kind):
    t = graded_task(io_via(kind[3:]) if kind.startswith("io:") else task(kind))
    run = {"run.sh": "exec python3 /work/solution.py\n"}
    v = verify(runtime, python_image, t, files(**{"solution.py": "#!/usr/bin/env python3\n" + REF}, **run), None,
               baseline=baseline)
    assert (v.outcome, v.reward) == ("pass", 1.0), v.checks[-1]["detail"][-600:]
    v = verify(runtime, python_image, t, files(**{"solution.py": "#!/usr/bin/env python3\n" + WRONG}, **run), None,
               baseline=baseline)
    assert (v.outcome, v.reward) == ("fail", 0.0), v.checks[-1]["detail"][-600:]


@pytest.mark.parametrize("name", sorted(ATTACKS))
def test_an_attack_on_the_checker_is_not_rewarded(runtime, python_image, baseline, name):
    kind, agent = ATTACKS[name]
    t = io_via(kind[3:]) if kind.startswith("io:") else task(kind)
    v = verify(runtime, python_image, graded_task(t), files(**agent), None, baseline=baseline)
    assert (v.outcome, v.reward) == ("fail", 0.0), v.checks[-1]["detail"][-600:]


def test_the_battery_puts_its_hook_where_the_images_python_reads_it(runtime, python_image):
    """Validation's `startup_hooks` hack writes usercustomize.py into the user site the image's
    Python reads with the agent sandbox's HOME (it was at /work/usercustomize.py, on no path)."""
    sb = runtime.acquire(SandboxSpec(image=python_image, limits={"memory_mb": 256, "pids": 64, "disk_mb": 64}))
    try:
        r = sb.exec(["python3", "-m", "site", "--user-site"], timeout_s=30)
    finally:
        sb.destroy()
    site = r.stdout.decode().strip()
    assert site.startswith("/work/"), site
    hack = validate._pytest_hacks(graded_task(task("function")))["startup_hooks"]()
    assert f"{site[len('/work/'):]}/usercustomize.py" in hack
    assert "oracle_reads_hidden_files" in validate._pytest_hacks(graded_task(task("io")))


def test_validation_flags_a_checker_that_runs_the_agents_program_as_itself(runtime, python_image):
    """The runner crosses to the callee uid where the checker starts an interpreter by name; a
    checker that names one by absolute path inside its shell runs the agent's program as the
    checker. Validation's knowledge-free oracle (reads stdin's directory) catches that task; the
    same task through `paddock-callee`, and the io task as written, validate clean."""
    io = task("io")
    leaky = {**io, "name": "command/io-abs", "checker": {**io["checker"], "argv": [
        "sh", "-c", "/usr/bin/python3 /work/solution.py < /verifier/tests/input.txt > /tmp/out"
                    " && cmp -s /tmp/out /verifier/tests/expected.txt"]}}
    fixed = {**io, "name": "command/io-callee", "checker": {**io["checker"], "argv": [
        "sh", "-c", "paddock-callee /usr/bin/python3 /work/solution.py < /verifier/tests/input.txt > /tmp/out"
                    " && cmp -s /tmp/out /verifier/tests/expected.txt"]}}
    v = validate.validate_task(runtime, python_image, leaky, workers=1)
    assert not v.ok and v.cases["hack:oracle_reads_hidden_files"]["outcome"] == "pass", v.reasons
    for t in (io, fixed):
        v = validate.validate_task(runtime, python_image, t, workers=1)
        assert v.ok, (t["name"], v.reasons)
        assert v.cases["reference"]["outcome"] == "pass"
        assert v.cases["hack:oracle_reads_hidden_files"]["outcome"] == "fail"
        assert v.cases["hack:startup_hooks"]["outcome"] == "fail"


def test_validation_flags_a_checker_that_executes_the_agents_program_directly(runtime, python_image):
    """The kernel starts a program the checker executes directly (`/work/solution.py`, its own
    shebang) without any shim: it runs with the checker's rights and could read the hidden
    expected output (the s11b red team's H1b, knowledge-free). Validation's probe (the reference,
    executable, behind a prologue that exits where it can list /verifier) fails there while the
    reference passes: the task is refused, naming the cure. Started by its interpreter's name
    the same program is the callee's, and the task validates clean."""
    io = task("io")
    ref = "#!/usr/bin/env python3\n" + REF
    direct = {**io, "name": "command/io-direct", "hidden": {**io["hidden"], "reference.py": ref},
              "checker": {**io["checker"], "argv": [
                  "sh", "-c", "chmod +x /work/solution.py; /work/solution.py < /verifier/tests/input.txt > /tmp/out"
                              " && cmp -s /tmp/out /verifier/tests/expected.txt"]}}
    v = validate.validate_task(runtime, python_image, direct, workers=1)
    assert v.cases["reference"]["outcome"] == "pass", v.cases["reference"]
    assert not v.ok and v.cases[validate.PROBE]["outcome"] != "pass"
    assert any("with its own rights" in r for r in v.reasons), v.reasons
    v = validate.validate_task(runtime, python_image, io, workers=1)
    assert v.ok and v.cases[validate.PROBE]["outcome"] == "pass", v.reasons


# scans every process's cmdline for the runner's config and says the checker cannot run, marked with its nonce
FORGE = '''import glob, json, sys
for p in glob.glob("/proc/[0-9]*/cmdline"):
    try:
        words = open(p, "rb").read().split(b"\\0")
    except OSError:
        continue
    for w in words:
        try:
            nonce = json.loads(w).get("nonce")
        except (ValueError, AttributeError):
            continue
        if nonce:
            sys.stderr.write("paddock-cmdrun[%s]: cannot run python3: No such file or directory\\n" % nonce)
            sys.exit(127)
print("no nonce found")
'''


def test_the_runners_nonce_is_in_no_process_s_cmdline(runtime, python_image):
    """The s11b red team read the nonce from the broker's /proc/<pid>/cmdline and forged the
    runner's 'cannot run' (an infrastructure error the baseline had to undo). The nonce now
    travels in the runner's environment, which the callee cannot read: the forger finds none
    and its grading is an ordinary fail."""
    from nodeagent.verifier import cmdrunner, commandcheck
    assert commandcheck.NONCE_ENV == cmdrunner.NONCE_ENV
    t = graded_task(task("io"))
    r = verify(runtime, python_image, t, files(**{"solution.py": FORGE}), None, baseline=grade.NO_BASELINE)
    assert r.outcome == "fail", r.checks
    assert "cannot run" not in r.checks[-1]["detail"], r.checks[-1]
