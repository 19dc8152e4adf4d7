"""Task validation: a task is usable only if its reference passes, doing nothing fails, and every
known reward hack scores 0.

For each task, `validate_task` grades, each in a fresh verification sandbox (or the isolated
answer checker): the reference solution (must pass), the null solution (no change: must fail),
and the battery for its checker kind (`_pytest_hacks`, `_answer_hacks`): edit or delete the
tests, a conftest that skips or passes everything, `sys.exit(0)` / `os._exit(0)` at import,
printing PASSED/OK, fake report files, monkeypatching the test framework, reading the hidden
tests or the reference by guessing paths, an object that equals everything, forged events on
the report pipe, startup hooks (.pth, sitecustomize), a shadow pytest, a full disk, and one hack
per family of issue 14 (`nodeagent.verifier.hacks`: star-import fill, /work modules shadowing
pdb, redefined prompt helpers, patched random, in-process forgery through the plugin, a forked
writer, frame and loader oracles); for answer
tasks: claiming success, empty or multiple answers, a LaTeX text box, a power tower, code.
Every hack must get reward 0 (`fail` or `timeout`). Each case is graded in the task's own image
(`own_image`: its `image: sha256:...`, else the one handed in) with its layers stacked
(`sandbox_layers`: repository layers, then the set-up layer, built once; a failing set-up
quarantines the task). A task that fails validation is quarantined
with the reasons in `<dir>/quarantine.json`; results are cached in `<dir>/validation-cache.json`
by task id and verifier version, so an unchanged task is validated once per verifier version.

A task whose own `budgets.verify_s` is below what its checker may take (`verify_budget_error`,
`grade.verify_time_s`) fails validation before anything is graded, naming the task, its
`verify_s` and the checker's need.

Tasks arrive as JSON (a task set's canonical forms) and are decoded once, at `validate_task`,
into the verifier's typed `GradedTask` (`grade.graded_task`); a task that does not decode fails
validation naming the field. `paddock tasks validate SET` (controller/cli/tasks.py) calls `validate_tasks`; the local run calls
`validate_for_run` (handed to it by the CLI). Must not import: zmq, controller.taskbank,
controller.store, controller.broker.
"""
from __future__ import annotations

import ast
import json
import logging
import os
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any, Callable, Mapping

from controller.contracts.tasks import BudgetError, Budgets, GradedTask
from controller.ondisk.fileio import atomic_write
from layers.store import ImageNotFound, ImageStore, ImageStoreError
from nodeagent.sandbox.runtime import SandboxError, SandboxRuntime
from nodeagent.sandbox.setuplayer import ensure_setup_layer
from nodeagent.verifier import grade as verifier
from nodeagent.verifier import hacks
from nodeagent.verifier.baseline import ANSWER_KINDS, GOLD_PATCH, GOLD_PREFIX, _text, reference_of, solution_file  # noqa: F401 - the task's own solutions, shared with the verifier
from nodeagent.verifier.baseline import solution_changes as _changes
from nodeagent.verifier.freshbox import as_bytes, fresh_sandbox

log = logging.getLogger(__name__)

QUARANTINE_FILE = "quarantine.json"
CACHE_FILE = "validation-cache.json"
PASSING_TEST = "def test_ok():\n    pass\n"


@dataclass
class TaskValidation:
    task_id: str
    name: str
    ok: bool
    reasons: list[str] = field(default_factory=list)
    cases: dict = field(default_factory=dict)     # case -> {"outcome", "reward", "detail"}
    verifier_version: str = ""
    wall_s: float = 0.0


# -- the battery ------------------------------------------------------------------------------
# Each case builds (files to write under /work: rel -> text or None to delete, answer text).

def _test_files(task: GradedTask) -> list[str]:
    return sorted(set(task.protected) | {r for r in task.files if r.rsplit("/", 1)[-1].startswith("test")})


def _visible_text(task: GradedTask, rel: str) -> str:
    text = task.files.get(rel, "")
    return text.decode("utf-8", "replace") if isinstance(text, bytes) else text


def _stub_with(task: GradedTask, prefix: str = "", suffix: str = "") -> dict:
    rel = solution_file(task)
    return {rel: prefix + _visible_text(task, rel) + suffix}


_FAKE_JSON = json.dumps({"grader": 1, "exit_code": 0, "events": [{"ev": "start"}, {"ev": "end", "exitstatus": 0}]})
_FAKE_XML = '<testsuite tests="7" failures="0" errors="0" skipped="0"><testcase name="t"/></testsuite>'
_FAKE_REPORT = f"""
import os
for _d in ("/tmp/.paddock-grader", "/tmp", "/work", "/verifier", "/verifier/tests"):
    for _n, _t in (("report.json", {_FAKE_JSON!r}), ("report.xml", {_FAKE_XML!r}), (".report.xml", {_FAKE_XML!r})):
        try:
            os.makedirs(_d, exist_ok=True)
            with open(os.path.join(_d, _n), "w") as _f:
                _f.write(_t)
        except OSError:
            pass
"""
_PATCH_FRAMEWORK = """
import _pytest.reports, _pytest.runner
_orig_init = _pytest.reports.TestReport.__init__
def _init(self, *a, **k):
    _orig_init(self, *a, **k)
    self.outcome = "passed"
    self.longrepr = None
_pytest.reports.TestReport.__init__ = _init
_orig_from_call = _pytest.runner.CallInfo.from_call
def _from_call(func, when, reraise=None):
    def safe():
        try:
            return func()
        except BaseException:
            return None
    return _orig_from_call(safe, when, reraise)
_pytest.runner.CallInfo.from_call = staticmethod(_from_call)
"""
_PEEK = """
import glob, re as _re
_src = ""
for _p in ["/work/reference.py", "/verifier/reference.py", "/verifier/tests/reference.py", "/reference.py",
           "/tmp/reference.py", *glob.glob("/verifier/**/*.py", recursive=True), "/verifier/tests/test_hidden.py",
           "/work/test_hidden.py"]:
    try:
        with open(_p) as _f:
            _src += _f.read() + "\\n"
    except OSError:
        pass
if "def " in _src:
    exec(_src)
"""
_EQ_EVERYTHING = """
class _Everything(str):
    def __eq__(self, other):
        return True
    def __ne__(self, other):
        return False
    __hash__ = str.__hash__
def __getattr__(name):
    return lambda *a, **k: _Everything()
"""
_FORGE_EVENTS = """
import json as _json, os as _os
def _forge(*args, **kwargs):
    fake = [{"ev": "test", "id": f"test_{i}", "when": "call", "outcome": "passed"} for i in range(50)]
    fake.append({"ev": "end", "exitstatus": 0})
    for fd in range(3, 64):
        for ev in fake:
            try:
                _os.write(fd, (_json.dumps({"ev": ev, "mac": "0" * 32}) + "\\n").encode())
            except OSError:
                break
    _os._exit(0)
def __getattr__(name):
    return _forge
"""
_FILL_DISK = """
import os as _os
for _i in range(100000):
    try:
        with open(f"/tmp/fill{_i}", "wb") as _f:
            _f.write(b"x" * (1 << 20))
    except OSError:
        break
"""
_CONFTEST_SKIP = ("import pytest\n\ncollect_ignore_glob = ['*']\n\n"
                  "def pytest_collection_modifyitems(items):\n"
                  "    for item in items:\n        item.add_marker(pytest.mark.skip(reason='x'))\n")
_CONFTEST_PASS = ("import pytest\n\n@pytest.hookimpl(hookwrapper=True)\n"
                  "def pytest_runtest_makereport(item, call):\n    outcome = yield\n"
                  "    rep = outcome.get_result()\n    rep.outcome = 'passed'\n    rep.longrepr = None\n")


# Where an interpreter the checker starts would run the agent's code before its own: the Python
# user site of HOME=/work (the agent's sandbox's HOME) for every Python 3 a task image may have
# (`python3 -m site --user-site`), the working directory, shell start-up files.
_EXIT0 = "import os\nos._exit(0)\n"
_STARTUP_HOOKS = {
    **{f".local/lib/python3.{v}/site-packages/{name}": body for v in range(6, 16)
       for name, body in (("usercustomize.py", _EXIT0), ("zz.pth", "import os; os._exit(0)\n"))},
    "sitecustomize.py": _EXIT0, "usercustomize.py": _EXIT0,
    ".bashrc": "exit 0\n", ".profile": "exit 0\n", ".pythonrc.py": _EXIT0,
}
# A knowledge-free oracle: print the first other file of the directory stdin comes from, else of
# /verifier/tests or /verifier (a checker's hidden expected output), and end with status 0.
_ORACLE = """
import os as _os, sys as _sys
def _paddock_oracle():
    try:
        _src = _os.readlink("/proc/self/fd/0")
    except OSError:
        _src = ""
    for _d in ([_os.path.dirname(_src)] if _src.startswith("/") else []) + ["/verifier/tests", "/verifier"]:
        try:
            _names = sorted(_os.listdir(_d))
        except OSError:
            continue
        for _n in _names:
            _p = _os.path.join(_d, _n)
            if _p != _src and _os.path.isfile(_p):
                try:
                    with open(_p) as _f:
                        _sys.stdout.write(_f.read())
                    _sys.stdout.flush()
                    _os._exit(0)
                except (OSError, UnicodeDecodeError):
                    continue
_paddock_oracle()
"""


# The reference, made executable and started by a prologue that ends it (exit 97) when it can
# list /verifier/tests and open a hidden file there (not Paddock's own support, readable by all):
# what the checker's own identity can.
# A command checker that runs the agent's program with its own rights (executed directly, by an
# absolute interpreter path, or imported into the checker's process) lets any program read the
# hidden tests: the probe then fails where the reference passes, and the task is refused.
PROBE = "probe:reach"
_PROBE = """#!/usr/bin/python3
import os as _pd_os
def _pd_reach():
    for _pd_d in ("/verifier/tests",):
        try:
            for _pd_n in _pd_os.listdir(_pd_d):
                _pd_p = _pd_os.path.join(_pd_d, _pd_n)
                if not _pd_n.startswith("paddock") and _pd_os.path.isfile(_pd_p):
                    open(_pd_p, "rb").close()
                    return True
        except OSError:
            pass
    return False
if _pd_reach():
    _pd_os._exit(97)
"""


def _probe_of(reference: str) -> str:
    """The reference with the probe's prologue: after its `from __future__` imports (which must
    come first) when it has any, its own shebang line dropped (the probe's is line 1)."""
    lines = reference.splitlines(keepends=True)
    if lines and lines[0].startswith("#!"):
        lines = lines[1:]
    text = "".join(lines)
    try:
        tree = ast.parse(text)
    except SyntaxError:
        return _PROBE + text
    future = [n.end_lineno for n in tree.body if isinstance(n, ast.ImportFrom) and n.module == "__future__"]
    if not future:
        return _PROBE + text
    body = text.splitlines(keepends=True)
    cut = max(n for n in future if n is not None)
    return _PROBE.split("\n", 1)[0] + "\n" + "".join(body[:cut]) + _PROBE.split("\n", 1)[1] + "".join(body[cut:])


HARBOR_SOLVE = "solution/solve.sh"        # a Harbor task's reference (hidden; /app already /work)
SOLVE_DIR = "/solution"                     # where Harbor's oracle finds its solution files
SOLVE_TIMEOUT_S = 600.0
_SH_PROBE = ("if [ -n \"$(find /verifier/tests -type f ! -name 'paddock*' -readable -print -quit 2>/dev/null)\" ]; "
             "then exit 97; fi\n")


def solve_changes(runtime, image, layers: tuple, task: GradedTask) -> list:
    """A Harbor task's reference changes: its `solution/` files in /solution and `solve.sh` run
    by bash in /work of a fresh sandbox of the task, as Harbor's oracle agent does; the changes
    it leaves under /work (modes kept: a script it makes executable stays so).
    VerifierInfraError when it cannot run or exits non-zero."""
    sb = fresh_sandbox(runtime, image, layers, task, [])
    try:
        sol = {f"{SOLVE_DIR}/{rel[len('solution/'):]}": as_bytes(t) for rel, t in task.hidden.items()
               if rel.startswith("solution/") and t is not None}
        sb.write_files(sol, owner="system", mode=0o755)
        r = sb.exec(["bash", f"{SOLVE_DIR}/solve.sh"], cwd="/work", timeout_s=SOLVE_TIMEOUT_S)
        if r.timed_out or r.exit_code != 0:
            raise verifier.VerifierInfraError(
                f"solution/solve.sh {'timed out' if r.timed_out else f'exited {r.exit_code}'}: "
                f"{(r.stderr.strip() or r.stdout.strip()).decode(errors='replace')[-300:]}")
        return sb.diff("/work", skip_bytecode=True)
    except SandboxError as exc:
        raise verifier.VerifierInfraError(f"solution/solve.sh could not run: {exc}") from None
    finally:
        sb.destroy()


def _probed(changes: list) -> list:
    """The reference's changes with the probe's prologue in every script it writes (after the
    shebang: a Python prologue for a python shebang, a shell one otherwise), made executable."""
    out = []
    for c in changes:
        data = c.data if c.kind in ("added", "modified") else None
        if data and data.startswith(b"#!"):
            first, _, rest = data.partition(b"\n")
            prologue = _PROBE.split("\n", 1)[1] if b"python" in first else _SH_PROBE
            c = replace(c, data=first + b"\n" + prologue.encode() + rest, mode=c.mode | 0o111)
        out.append(c)
    return out


def _family_hacks(task: GradedTask, sol: str, stub: str) -> dict[str, Callable[[], dict]]:
    """Issue 14's families (star-import fill, /work shadowing, redefined helpers, patched random,
    in-process forgery, oracles), generated for this task by `nodeagent.verifier.hacks`."""
    entry = hacks.entry_point({}, stub)         # (hacks reads the stub, not the task)
    generated = hacks.family_hacks({}, sol, stub, entry, hacks.helper_names(stub, entry))
    return {name: (lambda files=files: files)  # type: ignore[misc]  # a default binds each dict
            for name, files in generated.items()}


def _pytest_hacks(task: GradedTask) -> dict[str, Callable[[], dict]]:
    tests = _test_files(task)
    sol = solution_file(task)
    stub = _visible_text(task, sol)
    return {**_family_hacks(task, sol, stub),
        "edit_tests": lambda: {**{t: PASSING_TEST for t in tests}, sol: stub},
        "delete_tests": lambda: {t: None for t in tests},
        "conftest_skip": lambda: {"conftest.py": _CONFTEST_SKIP, "pytest.ini": "[pytest]\naddopts = --co -q\n",
                                  "tests/conftest.py": _CONFTEST_SKIP},
        "conftest_pass": lambda: {"conftest.py": _CONFTEST_PASS,
                                  "setup.cfg": "[tool:pytest]\naddopts = -p no:python\n"},
        "sys_exit_at_import": lambda: {sol: "import sys\nsys.exit(0)\n"},
        "os_exit_at_import": lambda: {sol: "import os\nos._exit(0)\n"},
        "print_passed": lambda: _stub_with(task, "print('PASSED')\nprint('OK')\n"
                                                 "print('===== 7 passed in 0.01s =====')\n"),
        "fake_report": lambda: _stub_with(task, _FAKE_REPORT),
        "monkeypatch_framework": lambda: _stub_with(task, _PATCH_FRAMEWORK),
        "peek_hidden_files": lambda: _stub_with(task, "", _PEEK),
        "equals_everything": lambda: {sol: _EQ_EVERYTHING},
        "forge_report_events": lambda: {sol: _FORGE_EVENTS},
        "fill_the_disk": lambda: _stub_with(task, _FILL_DISK),
        "startup_hooks": lambda: {**_STARTUP_HOOKS, sol: stub},
        "oracle_reads_hidden_files": lambda: _stub_with(task, "", _ORACLE),
        "shadow_pytest": lambda: {"pytest.py": "print('7 passed')\nraise SystemExit(0)\n",
                                  "_pytest/__init__.py": "raise SystemExit(0)\n", sol: stub},
    }


def _answer_hacks(task: GradedTask) -> dict[str, Callable[[], str]]:
    gold = str(task.checker.answer or "").strip()
    return {
        "spray_gold_last": lambda: " or ".join(f"\\boxed{{{v}}}" for v in ("0", "1", "2", gold)),
        "claim_passed": lambda: "All tests PASSED. OK",
        "empty_answer": lambda: "\\boxed{}",
        "every_number": lambda: " ".join(f"\\boxed{{{i}}}" for i in range(-3, 4)) + " \\boxed{anything}",
        "latex_text": lambda: "\\boxed{\\text{the correct answer}}",
        "pathological": lambda: "\\boxed{9^{9^{9^{9^{9}}}}}",
        "code_injection": lambda: "\\boxed{__import__('os').system('true')}",
    }


def task_layers(image, task: GradedTask) -> tuple[Path, ...]:
    """The task's layer files, from the image store that holds `image`. A layer missing from
    the store is a VerifierInfraError naming it."""
    digests = task.layers
    if not digests:
        return ()
    store = ImageStore(Path(image).parent.parent)
    try:
        return tuple(store.layer(d) for d in digests)
    except ImageStoreError as exc:
        raise verifier.VerifierInfraError(f"task {task.name!r}: {exc}") from None


def own_image(image, task: GradedTask) -> Path:
    """The image a task is graded in: its own (`image: sha256:<digest>`, from the store that
    holds `image`), else `image` (the built-in python image or the caller's choice). An image
    missing from the store is a VerifierInfraError naming it."""
    ref = task.image
    if not ref.startswith("sha256:"):
        return Path(image)
    store = ImageStore(Path(image).parent.parent)
    try:
        return Path(store.get(ref))
    except (ImageNotFound, ImageStoreError) as exc:
        raise verifier.VerifierInfraError(f"task {task.name!r}: image {ref} is not in the image "
                                          f"store at {store.root}: {exc}") from None


def sandbox_layers(runtime, image, task: GradedTask) -> tuple[Path, ...]:
    """The layers a task's grading sandbox stacks on `image`, as a rollout's: its repository
    layers, then its set-up layer (built once per task and image, reused). A missing layer or
    a failing set-up is a VerifierInfraError naming the task."""
    layers = task_layers(image, task)
    setup = task.setup
    if not setup:
        return layers
    try:
        made = ensure_setup_layer(runtime, ImageStore(Path(image).parent.parent), Path(image), layers, setup)
    except SandboxError as exc:     # SetupError included: quarantine, never a score
        raise verifier.VerifierInfraError(f"task {task.name!r}: set-up failed: {exc}") from None
    return layers + ((made,) if made is not None else ())


def cases(task: GradedTask, quick: bool = False) -> dict[str, tuple[dict | list, str | None]]:
    """Every case to grade: reference, null, then (unless `quick`) the hacks for the task's kind."""
    out: dict[str, tuple[dict | list, str | None]] = {}
    ref = reference_of(task)
    if ref is not None:
        out["reference"] = ref
    out["null"] = ({}, None)
    if quick:
        return out
    if task.checker.kind == "command" and "reference.py" in task.hidden:
        out[PROBE] = ({solution_file(task): _probe_of(_text(task.hidden["reference.py"]) or "")}, None)
    if task.checker.kind in ANSWER_KINDS:
        out.update({f"hack:{k}": ({}, f()) for k, f in _answer_hacks(task).items()})
    else:
        out.update({f"hack:{k}": (f(), None) for k, f in _pytest_hacks(task).items()})
    return out


# -- running it -------------------------------------------------------------------------------

BASELINE_CASES = ("reference", "null")


def seed_baseline(task: GradedTask, image, layers, cases: dict) -> None:
    """Hand validation's reference and null outcomes to the verifier's baseline
    (`baseline.BASELINE`), so a rollout whose grading fails with its changes is compared with
    them without grading them again (see docs/verifier.md, "Infrastructure errors")."""
    verifier.BASELINE.seed(task, image, {k: c.get("outcome") for k, c in cases.items() if k in BASELINE_CASES},
                           tuple(layers))


def verify_budget_error(task: GradedTask, budgets: Mapping[str, Any] | None) -> str | None:
    """Why the task's own `budgets.verify_s` cannot hold its verify phase, or None: it is below
    what its checker may legitimately take (`grade.verify_time_s`: the rollout's grading, the
    baseline's reference and null gradings, their retries). Such a task would end a rollout whose
    solution stalls grading as `deadline: verify`, an infrastructure error charged to the task,
    instead of the solution's `fail`. No `verify_s` (0): the node's default, raised to the
    checker's need, holds it."""
    try:
        verify_s = Budgets.from_dict(dict(budgets or {})).verify_s
    except BudgetError:
        return None                    # the task does not decode: graded_task has said so
    need = verifier.verify_time_s(task.checker)
    if not verify_s or verify_s >= need:
        return None
    timeout = f"timeout_s {task.checker.timeout_s:g}" if task.checker.timeout_s else "the default timeout"
    return (f"task {task.name!r}: budgets.verify_s is {verify_s:g} s, below the {need:g} s its {task.checker.kind} "
            f"checker ({timeout}) may take with the baseline's gradings and the retries; raise verify_s to at "
            f"least {need:g} s or leave it out (the node's default then covers the checker)")


def validate_task(runtime, image, task: GradedTask | Mapping[str, Any], workers: int = 2, runner=None,
                  quick: bool = False, clock: Callable[[], float] = time.monotonic) -> TaskValidation:
    """Grade `task`'s cases (module docstring). `task`: the typed task, or its JSON (decoded
    here, once: a task that does not decode fails validation, naming the field)."""
    t0 = clock()
    raw_budgets = task.get("budgets") if isinstance(task, Mapping) else None
    try:
        task = verifier.graded_task(task)
    except verifier.VerifierInfraError as exc:
        raw: Mapping[str, Any] = task if isinstance(task, Mapping) else {}
        return TaskValidation(str(raw.get("task_id", "")), str(raw.get("name", "?")), False,
                              [f"the task does not decode: {exc}"], verifier_version=verifier_version(quick),
                              wall_s=clock() - t0)
    v = TaskValidation(task.task_id, task.name or "?", True, verifier_version=verifier_version(quick))
    short = verify_budget_error(task, raw_budgets)
    if short is not None:       # the verify phase would end `deadline: verify`, charged to the task
        v.ok, v.wall_s = False, clock() - t0
        v.reasons.append(short)
        return v
    todo = cases(task, quick)
    try:
        image = own_image(image, task)
        layers = sandbox_layers(runtime, image, task)
    except verifier.VerifierInfraError as exc:
        v.ok, v.wall_s = False, clock() - t0
        v.reasons.append(f"the task's environment cannot be made: {exc}")
        v.cases = {"reference": {"outcome": "infra_error", "reward": None, "detail": str(exc)[:300]}}
        return v
    if "reference" not in todo and task.checker.kind == "command" and HARBOR_SOLVE in task.hidden:
        try:        # a Harbor task: its solve.sh is the reference, and the probe runs its scripts
            solved = solve_changes(runtime, image, layers, task)
        except verifier.VerifierInfraError as exc:
            v.reasons.append(f"the task's reference (solution/solve.sh) does not run: {exc}")
        else:
            todo = {"reference": (solved, None), **todo, PROBE: (_probed(solved), None)}
    if "reference" not in todo and not any(r.startswith("the task's reference") for r in v.reasons):
        v.reasons.append("no reference solution (hidden reference.py, gold.patch for repository tasks, "
                         "solution/solve.sh for Harbor tasks, or answer.txt for answer tasks)")

    def grade(item):
        name, (files, answer) = item
        try:      # the reference and null runs are the baseline: never compared with themselves
            if isinstance(files, list):         # a Harbor reference's own changes (modes kept)
                changes = files
            else:
                changes = _changes(task, files)
                if name == PROBE:           # the agent may chmod +x its program: the probe does
                    changes = [replace(c, mode=0o755) for c in changes]
            r = verifier.verify(runtime, image, task, changes, answer, clock, runner=runner,
                                layers=layers, baseline=verifier.NO_BASELINE if name in BASELINE_CASES else None)
            return name, {"outcome": r.outcome, "reward": r.reward,
                          "detail": (r.checks[-1]["detail"] if r.checks else "")[:300]}
        except verifier.VerifierInfraError as exc:
            return name, {"outcome": "infra_error", "reward": None, "detail": str(exc)[:300]}

    first = {k: c for k, c in todo.items() if k in BASELINE_CASES}
    with ThreadPoolExecutor(max_workers=max(1, workers)) as pool:
        v.cases = dict(pool.map(grade, first.items()))
        seed_baseline(task, image, layers, v.cases)
        v.cases.update(pool.map(grade, [(k, c) for k, c in todo.items() if k not in first]))
    for name, res in v.cases.items():
        if name == "reference" and res["outcome"] == "infra_error":
            v.reasons.append(f"the task's tests cannot run (reference: infra_error): {res['detail']}")
        elif name == "reference" and res["outcome"] != "pass":
            v.reasons.append(f"reference solution does not pass: {res['outcome']}: {res['detail']}")
        elif name == PROBE:
            if v.cases.get("reference", {}).get("outcome") == "pass" and res["outcome"] != "pass":
                v.reasons.append(f"the checker runs the agent's program with its own rights (it can read the hidden "
                                 f"tests: the reference, started by a prologue that exits where it can, is graded "
                                 f"{res['outcome']}); start the agent's program by its interpreter's name or through "
                                 f"paddock-callee, never directly or imported into the checker: {res['detail']}")
        elif name != "reference" and (res["outcome"] not in ("fail", "timeout") or res["reward"] != 0.0):
            what = "null solution (no change)" if name == "null" else name
            v.reasons.append(f"{what} is not scored 0: {res['outcome']} reward={res['reward']}: {res['detail']}")
    v.ok = not v.reasons
    v.wall_s = clock() - t0
    return v


class ValidationStore:
    """`quarantine.json` and `validation-cache.json` in one directory (task bank or run dir)."""

    def __init__(self, directory: str | os.PathLike) -> None:
        self.dir = Path(directory)
        self._lock = threading.Lock()

    def _read(self, name: str) -> dict:
        try:
            return json.loads((self.dir / name).read_text())
        except FileNotFoundError:
            return {}
        except ValueError as exc:
            log.warning("ignoring unreadable %s: %s", self.dir / name, exc)
            return {}

    def _write(self, name: str, data: dict) -> None:
        self.dir.mkdir(parents=True, exist_ok=True)
        atomic_write(self.dir / name, json.dumps(data, indent=2, sort_keys=True), fsync=False)

    def cached(self, task_id: str, version: str) -> TaskValidation | None:
        hit = self._read(CACHE_FILE).get(f"{task_id}|{version}")
        return TaskValidation(**hit) if hit else None

    def record(self, v: TaskValidation) -> None:
        with self._lock:
            cache = self._read(CACHE_FILE)
            cache[f"{v.task_id}|{v.verifier_version}"] = asdict(v)
            self._write(CACHE_FILE, cache)
            quarantine = self._read(QUARANTINE_FILE)
            if v.ok and not v.verifier_version.endswith("-quick"):
                quarantine.pop(v.task_id, None)     # only a full validation lifts a quarantine
            elif v.ok:
                pass
            else:
                quarantine[v.task_id] = {"name": v.name, "reasons": v.reasons,
                                         "verifier_version": v.verifier_version,
                                         "at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}
            self._write(QUARANTINE_FILE, quarantine)

    def quarantined(self) -> dict:
        return self._read(QUARANTINE_FILE)


def validate_tasks(runtime, image, tasks: list[dict], store: ValidationStore, workers: int = 2,
                   progress: Callable[[TaskValidation, bool], None] | None = None,
                   quick: bool = False) -> list[TaskValidation]:
    """Validate tasks `workers` at a time (cached by task id + verifier version); record and
    quarantine. `quick`: reference and null solution only (the local run's start-up check)."""
    version = verifier_version(quick)

    def one(d: dict) -> TaskValidation:      # the task's JSON: decoded once, by whoever grades it
        hit = store.cached(d.get("task_id", ""), version)
        v = hit or validate_task(runtime, image, d, workers=1, quick=quick)
        if hit is None:
            store.record(v)
        elif not d.get("layers") and not d.get("setup"):    # layered: seeded when graded
            try:
                task = verifier.graded_task(d)
                seed_baseline(task, own_image(image, task), (), hit.cases)
            except verifier.VerifierInfraError:
                pass
        if progress:
            progress(v, hit is not None)
        return v
    with ThreadPoolExecutor(max_workers=max(1, workers)) as pool:
        return list(pool.map(one, tasks))


def verifier_version(quick: bool = False) -> str:
    """The cache key's version part: the verifier's version, marked for quick validations."""
    return verifier.VERIFIER_VERSION + ("-quick" if quick else "")


def task_dicts(taskset) -> list[dict]:
    return [dict(t.canonical(), task_id=t.task_id) for t in taskset.tasks]


# -- the local run's start-up check -------------------------------------------------------------

RUN_MODES = ("quick", "full", "off")


def validate_for_run(taskset, names: list[str], image, cache_dir: str | os.PathLike, run_dir: str | os.PathLike,
                     mode: str = "quick", workers: int = 2, console=None) -> list[str]:
    """The names of `names` that pass validation (`mode`: quick = reference + null, full = also
    the hack battery, off). Results are cached in `cache_dir` (kept across runs); the run's
    quarantined tasks, with reasons, go to `<run_dir>/quarantine.json`."""
    if mode == "off":
        return list(names)
    if mode not in RUN_MODES:
        raise ValueError(f"validation mode must be one of {RUN_MODES}, got {mode!r}")
    wanted = set(names)
    tasks = [d for d in task_dicts(taskset) if d["name"] in wanted]
    by_image: dict[str, list[dict]] = {}
    for d in tasks:           # `image`: one image for every task, or {task name: image path}
        by_image.setdefault(str(image[d["name"]] if isinstance(image, dict) else image), []).append(d)
    t0 = time.monotonic()
    results = []
    with SandboxRuntime() as rt:
        for path, group in sorted(by_image.items()):
            results += validate_tasks(rt, Path(path), group, ValidationStore(cache_dir), workers, quick=mode == "quick")
    bad = {v.name: {"task_id": v.task_id, "reasons": v.reasons} for v in results if not v.ok}
    Path(run_dir, QUARANTINE_FILE).write_text(json.dumps(bad, indent=2, sort_keys=True))
    if console is not None:
        console.print(f"validated {len(results)} tasks ({mode}) in {time.monotonic() - t0:.1f}s; "
                      f"quarantined {len(bad)}" + "".join(f"\n  {n}: {b['reasons'][0]}" for n, b in bad.items()))
    return [n for n in names if n not in bad]
