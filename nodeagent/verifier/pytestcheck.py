"""The `pytest` check: unit tests run by the in-sandbox grader in a fresh sandbox of the
rollout's image (`verify_pytest`).

The sandbox (`nodeagent.verifier.freshbox`) holds the task's visible files, then the agent's
captured changes, then -- only now -- the test files, read-only under `/verifier/tests` (owned
outside the sandbox's id slice: the workload cannot write, rename or delete them). The
in-sandbox grader (`grader_plugin.py` of this package, shipped as `GRADER_PATH`) runs as the
sandbox's root, makes a 0700 report directory, and runs pytest as another uid (`GRADER_UID`)
that can write neither `/work`, `/verifier` nor that directory; pytest events reach the grader
through an inherited pipe, signed, and the grader writes the report. Results come from that
report (`nodeagent.verifier.pytestreport`) -- never from stdout. Test asserts `a == b` are
rewritten to `strict_eq`, so an object whose `__eq__` always says True cannot pass. The test
files are parsed once per grading (`parse_tests`); `isolation` picks call or process isolation;
a repository-level check (`repo_scope`) runs the hidden tests at their /work paths with hidden
canaries planted (`nodeagent.verifier.canaries`).

Must not import: zmq, controller.* outside contracts, nodeagent.agent, nodeagent.harness.loop,
nodeagent.verifier.grade.
"""
from __future__ import annotations

import ast
import copy
import dataclasses
import json
from pathlib import Path

from controller.contracts.checkerspec import CheckerSpec
from controller.contracts.tasks import GradedTask
from nodeagent.sandbox.runtime import Change, SandboxError
from nodeagent.verifier import canaries
from nodeagent.verifier.freshbox import (
    CHECK_TIMEOUT_S,
    OUTPUT_CAP,
    TESTS_DIR,
    agent_files,
    as_bytes,
    compiled_artifact,
    fresh_sandbox,
)
from nodeagent.verifier.pytestreport import grade_report
from nodeagent.verifier.verdicts import Verdict, VerifierInfraError
from nodeagent.verifier.verdicts import check as _check

GRADER_UID = 1000
CALLEE_UID = 1001           # the agent's code under call isolation: neither root, nor pytest's uid
GRADER_PATH = "/verifier/paddock_grader.py"
CALLBRIDGE_PATH = "/verifier/paddock_callbridge.py"
REPORT_DIR = "/tmp/.paddock-grader"
PYTEST_INI = "[pytest]\npythonpath = /work\naddopts =\ncache_dir = /tmp/.pytest_cache\n"
PYTEST_INI_CALL = "[pytest]\naddopts =\ncache_dir = /tmp/.pytest_cache\n"     # /work never on the path
UNUSED_PLUGINS = ("cacheprovider", "pastebin", "nose", "doctest", "junitxml", "stepwise", "setuponly",
                  "setupplan", "freeze_support", "legacypath")
PYTEST_ARGS = ("-q", *(a for p in UNUSED_PLUGINS for a in ("-p", f"no:{p}")), "-c", "/verifier/tests/pytest.ini",
               "--rootdir", TESTS_DIR, "--confcutdir", TESTS_DIR, "-o", "console_output_style=classic")

GRADER_FILE = Path(__file__).with_name("grader_plugin.py")
GRADER_SOURCE = GRADER_FILE.read_bytes()    # read once: the bytes shipped are the bytes hashed below
CALLBRIDGE_SOURCE = GRADER_FILE.with_name("callbridge.py").read_bytes()
ASSERTS_PATH = "/verifier/paddock_asserts.py"     # the grader's honest_eq and canary perturber
ASSERTS_SOURCE = GRADER_FILE.with_name("grader_asserts.py").read_bytes()
SITES_PATH = "/verifier/paddock_sites.py"     # its assertion-site guards and the perturber (loaded by paddock_asserts)
SITES_SOURCE = GRADER_FILE.with_name("grader_sites.py").read_bytes()
VALUES_PATH = "/verifier/paddock_values.py"     # its value guards and the canaries' roles (loaded by paddock_asserts)
VALUES_SOURCE = GRADER_FILE.with_name("grader_values.py").read_bytes()
LIARS_PATH = "/verifier/paddock_liars.py"     # its class guards: lying comparisons wherever made (loaded by paddock_asserts)
LIARS_SOURCE = GRADER_FILE.with_name("grader_liars.py").read_bytes()
LIARS_ITER_PATH = "/verifier/paddock_liars_iter.py"     # their strict checks (iteration views, number values; loaded by paddock_liars)
LIARS_ITER_SOURCE = GRADER_FILE.with_name("grader_liars_iter.py").read_bytes()


def _checker_files(task: GradedTask, spec: CheckerSpec, parsed: dict[str, TestFile],
                   mode: str) -> tuple[dict[str, bytes], dict[str, bytes]]:
    """(system files, test files). System (read-only to everyone in the sandbox, owned outside
    it): the protected originals in /work, the grader and pytest.ini (for isolation `mode`).
    Tests: owned by the sandbox's root, mode 0400 under a 0711 directory, so the code under test
    (another uid) can neither read nor change them; only the grader reads them, before it drops
    privileges. `parsed`: the test files' ASTs (`parse_tests`), rewritten to strict equality."""
    system = {f"/work/{rel}": as_bytes(task.files[rel]) for rel in task.protected}
    tests = {}
    for rel in spec.tests + spec.support:
        text = task.hidden.get(rel, task.files.get(rel))
        if text is None:
            raise VerifierInfraError(f"task {task.name!r}: checker file {rel!r} is in neither "
                                     f"'hidden' nor 'files'")
        if rel.endswith(".py") and spec.strict_eq is not False and rel in spec.tests:
            text = _strict(parsed[rel])
        tests[f"{TESTS_DIR}/{rel}"] = as_bytes(text)
    system[f"{TESTS_DIR}/pytest.ini"] = (PYTEST_INI_CALL if mode == "call" else PYTEST_INI).encode()
    system[GRADER_PATH] = GRADER_SOURCE
    system[CALLBRIDGE_PATH] = CALLBRIDGE_SOURCE
    return system, tests


def _test_sources(task: GradedTask, spec: CheckerSpec):
    for rel in spec.tests:
        yield rel, as_bytes(task.hidden.get(rel, task.files.get(rel, b"")))


def _parse(source: str | bytes) -> ast.Module:
    """A test file's AST (`canaries.parse`: one parse at a time); bytes are read as a source
    file is (its coding cookie, else UTF-8), as `ast.parse` reads them."""
    return canaries.parse(source)  # type: ignore[arg-type]  # ast.parse takes bytes too


@dataclasses.dataclass(frozen=True)
class TestFile:
    """One test file of a pytest check, read once per grading (`parse_tests`)."""
    __test__ = False                # (not a pytest test class)
    rel: str
    tree: ast.Module | None         # None: it does not parse (`error`)
    error: str = ""
    classes: frozenset[str] = frozenset()     # the classes pytest collects: `Test*`, unittest cases

    def module(self) -> ast.Module:
        """Its AST; VerifierInfraError naming the file if it does not parse."""
        if self.tree is None:
            raise VerifierInfraError(f"test file {self.rel!r} does not parse: {self.error}")
        return self.tree


def parse_tests(task: GradedTask, spec: CheckerSpec) -> dict[str, TestFile]:
    """The check's test files (`spec.tests`), each parsed once, with its test classes."""
    out = {}
    for rel, source in _test_sources(task, spec):
        try:
            tree = _parse(source)
        except SyntaxError as exc:
            out[rel] = TestFile(rel, None, str(exc))
            continue
        out[rel] = TestFile(rel, tree, classes=frozenset(canaries.test_classes(tree)))
    return out


def _is_test_file(rel: str) -> bool:
    base = rel.rsplit("/", 1)[-1]
    return base.startswith("test") or base.endswith("_test.py") or base == "conftest.py"


def isolation(task: GradedTask, spec: CheckerSpec, parsed: dict[str, TestFile]) -> str:
    """`call` or `process` (see docs/verifier.md, "Call isolation"). `auto` (the default) is
    `call` for a function-level task: every visible file at the top of /work, its agent modules
    (top-level .py files that are not tests) exactly the modules the tests import, and the tests
    import them only as `import m` / `from m import name` (no star import, no submodule)."""
    if spec.isolation != "auto":
        return spec.isolation
    files = task.files
    if not spec.tests or any("/" in rel for rel in files):
        return "process"
    agent = {rel[:-3] for rel in files if rel.endswith(".py") and not _is_test_file(rel)
             and rel not in task.protected}
    used: set[str] = set()
    for test in parsed.values():
        if test.tree is None:
            return "process"
        for node in ast.walk(test.tree):
            if isinstance(node, ast.ImportFrom) and node.level:
                return "process"
            names = ([node.module or ""] if isinstance(node, ast.ImportFrom)
                     else [a.name for a in node.names] if isinstance(node, ast.Import) else [])
            for name in names:
                top = name.partition(".")[0]
                if top in agent:
                    if name != top or (isinstance(node, ast.ImportFrom) and any(a.name == "*" for a in node.names)):
                        return "process"
                    used.add(top)
    return "call" if agent and used == agent else "process"


def call_modules(task: GradedTask, spec: CheckerSpec) -> list[str]:
    if spec.modules is not None:
        return list(spec.modules)
    return sorted(rel[:-3] for rel in task.files if rel.endswith(".py") and "/" not in rel
                  and not _is_test_file(rel) and rel not in task.protected) or ["solution"]


class _StrictEq(ast.NodeTransformer):
    def visit_Assert(self, node: ast.Assert) -> ast.AST:
        t = node.test
        if isinstance(t, ast.Compare) and len(t.ops) == 1 and isinstance(t.ops[0], (ast.Eq, ast.NotEq)):
            call = ast.Call(ast.Name("_paddock_strict_eq", ast.Load()), [t.left, t.comparators[0]], [])
            node.test = call if isinstance(t.ops[0], ast.Eq) else ast.UnaryOp(ast.Not(), call)
        return node


def strict_asserts(source: str | bytes, name: str) -> str:
    """Rewrite `assert a == b` / `!=` in a test file to the grader's strict equality."""
    try:
        tree = _parse(source)
    except SyntaxError as exc:
        raise VerifierInfraError(f"test file {name!r} does not parse: {exc}") from None
    return _strict(TestFile(name, tree), copied=False)


def _strict(test: TestFile, copied: bool = True) -> str:
    """`test`'s source with its asserts rewritten (`strict_asserts`); its own tree is left as
    parsed unless `copied` is False."""
    tree = _StrictEq().visit(copy.deepcopy(test.module()) if copied else test.module())
    body = tree.body
    at = 0
    if body and isinstance(body[0], ast.Expr) and isinstance(getattr(body[0], "value", None), ast.Constant):
        at = 1
    while at < len(body) and isinstance(body[at], ast.ImportFrom) and body[at].module == "__future__":
        at += 1
    body.insert(at, ast.ImportFrom("paddock_grader", [ast.alias("strict_eq", "_paddock_strict_eq")], 0))
    return ast.unparse(ast.fix_missing_locations(tree)) + "\n"


def expected_tests(spec: CheckerSpec, parsed: dict[str, TestFile]) -> list[str]:
    """Node ids (`file::test` / `file::Class::test`) the test files define, from their AST
    (`parse_tests`; classes: `Test*`, and unittest cases whatever their name)."""
    ids = []
    for rel in spec.tests:
        tree, classes = parsed[rel].module(), parsed[rel].classes
        for node in tree.body:
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and node.name.startswith("test"):
                ids.append(f"{rel}::{node.name}")
            elif isinstance(node, ast.ClassDef) and node.name in classes:
                ids += [f"{rel}::{node.name}::{m.name}" for m in node.body
                        if isinstance(m, ast.FunctionDef) and m.name.startswith("test")]
    return ids


def repo_scope(task: GradedTask) -> bool:
    """Repository-level tests (the swe family): the hidden test files go to their paths under
    /work and pytest runs in the repository (its conftest and config), not in /verifier/tests."""
    return task.family == "swe"


# doctest and junitxml stay: a repository's conftest may use `doctest_namespace`, its addopts
# `--doctest-modules`, its ini `junit_family` (an unknown ini key is an error under filterwarnings=error)
REPO_PYTEST_ARGS = ("-q", *(a for p in UNUSED_PLUGINS if p not in ("doctest", "junitxml") for a in ("-p", f"no:{p}")),
                    "--rootdir", "/work", "-o", "console_output_style=classic")


def _repo_files(task: GradedTask, spec: CheckerSpec, plan: canaries.Plan | None = None) -> dict[str, bytes]:
    """System files of a repository-level check: the hidden tests at their /work paths (they
    replace whatever the agent left there; a test module with its canaries planted when `plan`
    has it) and the grader. (The empty tests directory is written as the agent, like a
    file-level check's tests: the grader makes it its own.)"""
    planted = plan.sources if plan is not None else {}
    files = {f"/work/{rel}": as_bytes(planted.get(rel, text)) for rel, text in _test_sources(task, spec)}
    if spec.strict_eq:
        files = {p: strict_asserts(t.decode(), p).encode() if p.endswith(".py") else t for p, t in files.items()}
    files[GRADER_PATH] = GRADER_SOURCE
    files[CALLBRIDGE_PATH] = CALLBRIDGE_SOURCE
    return files


TEST_CONFIG_FILES = frozenset({"conftest.py", "pytest.ini", ".pytest.ini", "tox.ini", "setup.cfg", "pyproject.toml"})
TEST_DIRS = frozenset({"tests", "test"})


def test_infrastructure(rel: str) -> bool:
    """Is /work/`rel` part of how a repository's tests run rather than what they test: a
    conftest.py or pytest configuration file, a test module (`test_*.py`, `*_test.py`,
    `test.py`, `tests.py`), or anything in (or being) a `tests`/`test` directory?"""
    parts = rel.strip("/").split("/")
    base = parts[-1]
    return (base in TEST_CONFIG_FILES or base.startswith("test_") or base.endswith("_test.py")
            or base in ("test.py", "tests.py") or any(p in TEST_DIRS for p in parts))


def split_test_infrastructure(changes: list[Change]) -> tuple[list[Change], list[str]]:
    """(the changes a repository-level check applies, the /work paths it leaves at the task's
    version). The agent's hooks in a conftest.py (a `pytest_runtest_makereport` wrapper that
    marks every report passed), its pytest options or its edits to the tests' helpers would
    decide the verdict; the tests and how they run are the task's, as the hidden tests are."""
    kept, ignored = [], []
    for c in changes:
        rel = c.path[len("/work/"):] if c.path.startswith("/work/") else ""
        if rel and test_infrastructure(rel):
            ignored.append(c.path)
        else:
            kept.append(c)
    return kept, ignored


def plant_canaries(task: GradedTask, spec: CheckerSpec, changes: list[Change] | tuple = ()) -> canaries.Plan:
    """The hidden canaries of a repository-level check (`nodeagent.verifier.canaries`), planted
    in its test modules (`locked_tests`), with the functions the agent wrote or changed
    (`canaries.agent_functions`: the value guards hold those `__eq__` to every field); the plan
    stays on this host."""
    modules = {rel: as_bytes(text).decode("utf-8", "replace") for rel, text in _test_sources(task, spec)
               if f"/work/{rel}" in set(locked_tests(task, spec))}
    agent = canaries.agent_functions(dict(task.files), agent_files(list(changes)))
    return canaries.plant(modules, list(spec.fail_to_pass), pass_to_pass=list(spec.pass_to_pass), agent_code=agent)


def verify_pytest(runtime, image, layers, task: GradedTask, changes, clock) -> Verdict:
    """The pytest check's verdict (see the module docstring): every file and argument is made
    before the sandbox is; raises VerifierInfraError."""
    spec = task.checker
    parsed = parse_tests(task, spec)
    mode = isolation(task, spec, parsed)
    repo = repo_scope(task)
    ignored: list[str] = []
    refused = sorted(c.path for c in changes if compiled_artifact(c.path) and c.kind != "deleted")
    plan = None
    if repo:
        changes, ignored = split_test_infrastructure(changes)
        plan = plant_canaries(task, spec, changes)
        system, tests, cwd, args = _repo_files(task, spec, plan), {f"{TESTS_DIR}/.paddock": b""}, "/work", REPO_PYTEST_ARGS
    else:
        (system, tests), cwd, args = _checker_files(task, spec, parsed, mode), TESTS_DIR, PYTEST_ARGS
    system = {**system, ASSERTS_PATH: ASSERTS_SOURCE, SITES_PATH: SITES_SOURCE, VALUES_PATH: VALUES_SOURCE,
              LIARS_PATH: LIARS_SOURCE, LIARS_ITER_PATH: LIARS_ITER_SOURCE}
    expected = expected_tests(spec, parsed)
    if not expected:
        raise VerifierInfraError(f"task {task.name!r}: checker test files define no tests")
    locked = set(locked_tests(task, spec)) if repo else set()
    argv = ["python3", "-I", "-B", GRADER_PATH, grader_config(runtime, task, spec, mode), *args, *spec.tests]
    timeout_s, changed = _timeout_s(spec), set(agent_files(changes))
    sb = fresh_sandbox(runtime, image, layers, task, changes)
    try:
        if tests:
            sb.write_files(tests, owner="agent", mode=0o400)
        sb.write_files({p: b for p, b in system.items() if p not in locked}, owner="system", mode=0o444)
        if locked:
            sb.write_files({p: b for p, b in system.items() if p in locked}, owner="agent", mode=0o400)
        t = clock()
        r = sb.exec(argv, cwd=cwd, output_cap=OUTPUT_CAP, timeout_s=timeout_s)
        wall = clock() - t
        if r.timed_out:
            return Verdict("timeout", 0.0, {"correct": 0.0},
                           [_check("pytest", "timeout", "tests exceeded their time limit; killed", wall)])
        try:
            raw = sb.read_file(f"{REPORT_DIR}/report.json")
        except SandboxError as exc:
            tail = (r.stdout + r.stderr).decode(errors="replace")[-1500:]
            raise VerifierInfraError(f"grader wrote no report (exit {r.exit_code}): {exc}; {tail}") from None
    except SandboxError as exc:
        raise VerifierInfraError(f"verifier sandbox failed: {exc}") from None
    finally:
        sb.destroy()
    if plan is not None:
        raw = canaries.translate(raw, plan)
    try:
        verdict = grade_report(raw, expected, dict(spec.raw), wall, changed=changed)
        if refused:
            verdict.checks.insert(0, _check("source_only", "refused", "not applied (the grader applies the agent's "
                                            f"source only: no bytecode, native modules, .pth or metadata): {refused[:20]}"))
        if ignored:
            verdict.checks.insert(0, _check("test_infrastructure", "ignored", "agent changes not applied (the tests "
                                            f"and how they run are the task's): {sorted(ignored)[:20]}"))
        return verdict
    except VerifierInfraError as exc:
        if "did not start" not in str(exc):
            raise
        tail = (r.stdout + r.stderr).decode(errors="replace")[-1500:]     # why: the grader's own words
        raise VerifierInfraError(f"{exc}: {tail}") from None


def grader_config(runtime, task: GradedTask, spec: CheckerSpec, mode: str) -> str:
    """The grader's first argument: uids inside the sandbox's id slice, paths, call isolation
    (`mode`: `isolation`'s choice)."""
    top = int(getattr(runtime, "slice_size", CALLEE_UID + 1)) - 1
    uid, callee = min(GRADER_UID, top), min(CALLEE_UID, top)
    if callee == uid:
        callee = uid - 1
    call = None
    if mode == "call":
        call = {"uid": callee, "modules": call_modules(task, spec),
                "timeout_s": call_timeout(spec)}
    return json.dumps({"uid": uid, "report_dir": REPORT_DIR, "tests_dir": TESTS_DIR, "call": call,
                       "locked": locked_tests(task, spec) if repo_scope(task) else []})


def locked_tests(task: GradedTask, spec: CheckerSpec) -> list[str]:
    """A repository-level check's test modules (not conftest.py, which pytest loads before any
    collection): written 0400 and handed to pytest from memory by the grader, so the code under
    test, in pytest's process, cannot read the tests' source for their expected values."""
    return [f"/work/{rel}" for rel in spec.tests
            if rel.endswith(".py") and rel.rsplit("/", 1)[-1] != "conftest.py"]


def call_timeout(spec: CheckerSpec) -> float:
    """The per-call deadline: the task's `call_timeout_s`, else the whole check's time limit (so
    a correct but slow call passes whenever it passed in-process: MBPP 123's reference takes 12 s
    for one call on a loaded node; a hang is still a `timeout`, the whole run's limit)."""
    return spec.call_timeout_s if spec.call_timeout_s is not None else _timeout_s(spec)




def _timeout_s(spec: CheckerSpec) -> float:
    return spec.timeout_s if spec.timeout_s is not None else CHECK_TIMEOUT_S
