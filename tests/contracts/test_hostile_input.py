"""Hostile input, as an untrusted dataset, a careless operator or a curious analyst brings it:
bombs, zeros, NaN, huge values, traversal. Each case must end in a clear error naming what is
wrong (file, line, key, limit) and must lose nothing already accepted (a task set imported
before stays loadable). The commands run as the user runs them: `python -m controller.cli.main`
in a child process with a memory and time bound, so a regression fails the test instead of
taking the machine down.
"""
from __future__ import annotations

import gzip
import json
import os
import resource
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
CHILD_MEMORY_BYTES = 1 << 30          # 1 GiB of address space for each CLI child
CHILD_DEADLINE_S = 60

BILLION_LAUGHS = """\
name: laughs
family: python
instruction: import me
checker: {kind: pytest, tests: [t.py]}
setup:
  - &a ["lol","lol","lol","lol","lol","lol","lol","lol","lol"]
  - &b [*a,*a,*a,*a,*a,*a,*a,*a,*a]
  - &c [*b,*b,*b,*b,*b,*b,*b,*b,*b]
  - &d [*c,*c,*c,*c,*c,*c,*c,*c,*c]
  - &e [*d,*d,*d,*d,*d,*d,*d,*d,*d]
  - &f [*e,*e,*e,*e,*e,*e,*e,*e,*e]
  - &g [*f,*f,*f,*f,*f,*f,*f,*f,*f]
  - &h [*g,*g,*g,*g,*g,*g,*g,*g,*g]
  - &i [*h,*h,*h,*h,*h,*h,*h,*h,*h]
"""

GOOD_TASK = """\
name: good
family: python
instruction: write x
checker: {kind: pytest, tests: [test_x.py]}
"""


def _limit_child() -> None:
    resource.setrlimit(resource.RLIMIT_AS, (CHILD_MEMORY_BYTES, CHILD_MEMORY_BYTES))


def paddock(*argv: str, cwd: Path | None = None, timeout: float = CHILD_DEADLINE_S) -> subprocess.CompletedProcess:
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    try:
        return subprocess.run([sys.executable, "-m", "controller.cli.main", *argv], cwd=cwd, env=env,
                              capture_output=True, text=True, timeout=timeout, preexec_fn=_limit_child)
    except subprocess.TimeoutExpired:
        pytest.fail(f"paddock {' '.join(argv)} still running after {timeout}s (unbounded work?)")


def package(root: Path, name: str, text: str) -> Path:
    d = root / name
    (d / "hidden").mkdir(parents=True)
    (d / "task.yaml").write_text(text)
    (d / "hidden" / "test_x.py").write_text("def test_x():\n    assert True\n")
    return d


def assert_clean_refusal(proc: subprocess.CompletedProcess, *needles: str) -> None:
    err = proc.stderr
    assert proc.returncode == 2, (proc.returncode, err[-2000:])
    assert "Traceback" not in err, err[-2000:]
    for needle in needles:
        assert needle in err, (needle, err[-2000:])


# -- parsers ---------------------------------------------------------------------------------

def test_a_billion_laughs_in_a_task_package_is_refused_quickly_naming_file_line_and_limit(tmp_path):
    bank = tmp_path / "bank"
    pkgs = tmp_path / "pkgs"
    package(pkgs, "good", GOOD_TASK)
    assert paddock("tasks", "--bank", str(bank), "import", "package", str(pkgs), "--set", "before").returncode == 0
    bomb = tmp_path / "bomb"
    package(bomb, "laughs", BILLION_LAUGHS)
    proc = paddock("tasks", "--bank", str(bank), "import", "package", str(bomb), "--set", "bomb", timeout=30)
    assert_clean_refusal(proc, "task.yaml:", "max_aliases")
    # nothing already accepted is lost, nothing of the bomb stored
    assert paddock("tasks", "--bank", str(bank), "list", "before").returncode == 0
    assert not (bank / "sets" / "bomb.yaml").exists()


def test_a_yaml_bomb_with_few_aliases_is_refused_by_its_expanded_size():
    from controller.contracts import safeload
    from controller.contracts.safeload import Bounds, ParseLimitError
    # 3 aliases per level under a generous alias budget: still 3^20 nodes once expanded
    lines = ["a0: &a0 [x, x, x]"] + [f"a{i}: &a{i} [*a{i-1}, *a{i-1}, *a{i-1}]" for i in range(1, 21)]
    with pytest.raises(ParseLimitError, match="max_nodes"):
        safeload.load_yaml_text("\n".join(lines), "bomb.yaml", Bounds(max_aliases=1000))


def test_deep_yaml_and_json_are_refused_naming_the_depth_limit():
    from controller.contracts import safeload
    from controller.contracts.safeload import ParseLimitError
    with pytest.raises(ParseLimitError, match=r"deep.yaml:\d+: nesting deeper than 64"):
        safeload.load_yaml_text("[" * 200 + "]" * 200, "deep.yaml")
    with pytest.raises(ParseLimitError, match="deep.json: nesting deeper than 64"):
        safeload.load_json_text("[" * 100_000 + "]" * 100_000, "deep.json")
    # brackets inside strings are text, not nesting
    assert safeload.load_json_text(json.dumps({"s": "[" * 1000})) == {"s": "[" * 1000}


def test_a_json_file_over_the_size_limit_is_refused_without_reading_it_whole(tmp_path):
    from controller.contracts import safeload
    from controller.contracts.safeload import Bounds, ParseLimitError
    big = tmp_path / "big.json"
    big.write_text("[" + "1," * 1000 + "1]")
    with pytest.raises(ParseLimitError, match=r"big.json: larger than 100 bytes \(limit max_bytes\)"):
        safeload.load_json(big, Bounds(max_bytes=100))


def test_a_jsonl_line_over_the_limit_is_refused_naming_its_line(tmp_path):
    from controller.contracts import safeload
    from controller.contracts.safeload import Bounds, ParseLimitError
    src = tmp_path / "data.jsonl"
    src.write_text('{"a": 1}\n{"b": "' + "x" * 5000 + '"}\n')
    with open(src) as f:
        it = safeload.iter_jsonl(f, str(src), Bounds(max_line_bytes=1000))
        assert next(it) == (1, {"a": 1})
        with pytest.raises(ParseLimitError, match=r"data.jsonl:2: line longer than 1000"):
            next(it)


def test_an_import_of_a_jsonl_with_a_nesting_bomb_names_file_and_line(tmp_path):
    src = tmp_path / "math.jsonl.gz"
    with gzip.open(src, "wt") as f:
        f.write('{"question": "1+1?", "answer": "#### 2"}\n')
        f.write('{"question": ' + "[" * 50_000 + "]" * 50_000 + ', "answer": "#### 2"}\n')
    proc = paddock("tasks", "--bank", str(tmp_path / "bank"), "import", "math", str(src), "--set", "s")
    assert_clean_refusal(proc, "math.jsonl.gz:2", "nesting deeper than 64")


def test_a_manifest_bomb_is_refused_and_the_bank_stays_readable(tmp_path):
    bank = tmp_path / "bank"
    pkgs = tmp_path / "pkgs"
    package(pkgs, "good", GOOD_TASK)
    assert paddock("tasks", "--bank", str(bank), "import", "package", str(pkgs), "--set", "ok").returncode == 0
    (bank / "sets" / "evil.yaml").write_text(BILLION_LAUGHS.replace("setup:", "tasks:"))
    proc = paddock("tasks", "--bank", str(bank), "list", "evil", timeout=30)
    assert_clean_refusal(proc, "evil.yaml:", "max_aliases")
    assert paddock("tasks", "--bank", str(bank), "list", "ok").returncode == 0


# -- limits: zeros, NaN, huge -----------------------------------------------------------------

@pytest.mark.parametrize("flag,value", [("--pids", "0"), ("--memory", "0"), ("--timeout", "nan"),
                                        ("--timeout", "inf"), ("--timeout", "-1"), ("--cpu", "0"),
                                        ("--cpu", "nan"), ("--disk", "0"), ("--output-cap", "0"),
                                        ("--memory", "1048576G"), ("--pids", "-5")])
def test_sandbox_run_refuses_zero_nan_and_huge_limits_as_usage_errors(flag, value):
    proc = paddock("sandbox", "run", flag, value, "--", "true")
    assert_clean_refusal(proc, flag)
    assert "usage: paddock sandbox run" in proc.stderr or "capacity" in proc.stderr, proc.stderr


def test_sandbox_run_refuses_more_cpus_than_this_node_has():
    proc = paddock("sandbox", "run", "--cpu", str(len(os.sched_getaffinity(0)) + 1), "--", "true")
    assert_clean_refusal(proc, "--cpu", "this node's capacity")


@pytest.mark.parametrize("section,key,value", [("limits", "pids", "0"), ("limits", "memory_mb", ".nan"),
                                               ("limits", "cpu", ".inf"), ("limits", "disk_mb", "-1"),
                                               ("limits", "nofile", "1e12"), ("budgets", "wall_s", ".nan"),
                                               ("budgets", "max_steps", "0"), ("budgets", "max_tokens", "2.5")])
def test_a_task_package_with_a_zero_nan_or_huge_limit_is_refused_naming_the_key(tmp_path, section, key, value):
    bank = tmp_path / "bank"
    good = tmp_path / "good"
    package(good, "good", GOOD_TASK)
    assert paddock("tasks", "--bank", str(bank), "import", "package", str(good), "--set", "kept").returncode == 0
    bad = tmp_path / "bad"
    package(bad, "bad", GOOD_TASK.replace("name: good", "name: bad") + f"{section}: {{{key}: {value}}}\n")
    proc = paddock("tasks", "--bank", str(bank), "import", "package", str(bad), "--set", "bad")
    assert_clean_refusal(proc, "task.yaml", repr(key))
    assert paddock("tasks", "--bank", str(bank), "list", "kept").returncode == 0
    assert not (bank / "sets" / "bad.yaml").exists()


@pytest.mark.parametrize("line", ["lease_ttl_s: .nan", "heartbeat_interval_s: .inf", "agents: true",
                                  "tasks_limit: -1", "learning_rate: 0", "versions: 0"])
def test_a_run_config_with_a_zero_nan_or_bool_value_is_refused_naming_the_key(tmp_path, line):
    cfg = tmp_path / "run.yaml"
    cfg.write_text(line + "\n")
    proc = paddock("run", "--config", str(cfg), "--runs-dir", str(tmp_path / "runs"), cwd=tmp_path)
    assert_clean_refusal(proc, repr(line.split(":")[0]))
    assert not (tmp_path / "runs").exists()


def test_run_refuses_a_task_set_whose_limits_exceed_this_machine(tmp_path):
    bank = tmp_path / "bank"
    pkgs = tmp_path / "pkgs"
    package(pkgs, "big", GOOD_TASK.replace("name: good", "name: big") + "limits: {memory_mb: 1048576}\n")
    assert paddock("tasks", "--bank", str(bank), "import", "package", str(pkgs), "--set", "big").returncode == 0
    proc = paddock("run", "--taskset", "big", "--bank", str(bank), "--runs-dir", str(tmp_path / "runs"), cwd=tmp_path)
    assert_clean_refusal(proc, "'big'", "limits.memory_mb", "more than this machine has")
    assert not (tmp_path / "runs").exists()


@pytest.mark.parametrize("flag", ["--versions", "--agents", "--rollouts-per-task"])
def test_run_refuses_zero_counts_as_usage_errors(tmp_path, flag):
    proc = paddock("run", flag, "0", "--runs-dir", str(tmp_path / "runs"), cwd=tmp_path)
    assert_clean_refusal(proc, flag, "usage: paddock run")


def test_a_lease_with_a_zero_pid_limit_is_refused_naming_the_key():
    from controller.contracts.tasks import LeaseTask, TaskError
    from controller.taskbank.builtin import builtin_taskset
    task = builtin_taskset().tasks[0]
    content = dict(task.canonical(), task_id=task.task_id, limits={"pids": 0})
    with pytest.raises(TaskError, match="'pids'"):
        LeaseTask.decode(content)


# -- the battery: one bank, every hostile input, nothing accepted before is lost -------------

def tree(root: Path) -> dict[str, bytes]:
    return {str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


def _symlinked(tmp: Path) -> list[str]:
    d = package(tmp, "sym", GOOD_TASK.replace("name: good", "name: sym"))
    (d / "files").mkdir()
    (d / "files" / "passwd").symlink_to("/etc/passwd")
    return ["tasks", "--bank", "{bank}", "import", "package", str(tmp), "--set", "sym"]


def _traversal_path(tmp: Path) -> list[str]:
    package(tmp, "trav", GOOD_TASK.replace("name: good", "name: trav").replace("tests: [test_x.py]",
                                                                              "tests: [../../../etc/passwd]"))
    return ["tasks", "--bank", "{bank}", "import", "package", str(tmp), "--set", "trav"]


def _huge_line(tmp: Path) -> list[str]:
    src = tmp / "huge.jsonl"
    with open(src, "w") as f:       # one 80 MiB line: over the 64 MiB record limit
        f.write('{"question": "')
        for _ in range(80):
            f.write("x" * (1 << 20))
        f.write('", "answer": "#### 1"}\n')
    return ["tasks", "--bank", "{bank}", "import", "math", str(src), "--set", "huge"]


def _bomb(tmp: Path) -> list[str]:
    package(tmp, "laughs", BILLION_LAUGHS)
    return ["tasks", "--bank", "{bank}", "import", "package", str(tmp), "--set", "bomb"]


def _zero_limit(tmp: Path) -> list[str]:
    package(tmp, "zero", GOOD_TASK.replace("name: good", "name: zero") + "limits: {pids: 0}\n")
    return ["tasks", "--bank", "{bank}", "import", "package", str(tmp), "--set", "zero"]


def _nan_config(tmp: Path) -> list[str]:
    (tmp / "run.yaml").write_text("lease_ttl_s: .nan\n")
    return ["run", "--config", str(tmp / "run.yaml"), "--bank", "{bank}", "--runs-dir", str(tmp / "runs")]


BATTERY = {
    "billion laughs": (_bomb, "max_aliases"),
    "zero pids": (_zero_limit, "'pids'"),
    "NaN config": (_nan_config, "'lease_ttl_s'"),
    "80 MiB line": (_huge_line, "limit max_line_bytes"),
    "symlink to /etc/passwd": (_symlinked, "symbolic links are not allowed"),
    "traversal in checker.tests": (_traversal_path, "passwd"),
    "set name traversal": (lambda tmp: ["tasks", "--bank", "{bank}", "import", "package", "{good}",
                                        "--set", "../../escaped"], "task set name"),
    "sandbox --memory 0": (lambda tmp: ["sandbox", "run", "--memory", "0", "--", "true"], "--memory"),
    "sandbox --timeout nan": (lambda tmp: ["sandbox", "run", "--timeout", "nan", "--", "true"], "--timeout"),
    "query COPY TO": (lambda tmp: ["query", "--run", "{bank}", "COPY (SELECT 1) TO '{bank}/x.csv'"], "read-only"),
}


@pytest.fixture(scope="module")
def accepted(tmp_path_factory):
    root = tmp_path_factory.mktemp("battery")
    bank, good = root / "bank", root / "good"
    package(good, "good", GOOD_TASK)
    assert paddock("tasks", "--bank", str(bank), "import", "package", str(good), "--set", "kept").returncode == 0
    (bank / "run.json").write_text("{}")        # so `query --run bank` treats it as a (run) directory
    return bank, good


@pytest.mark.parametrize("case", sorted(BATTERY))
def test_each_hostile_input_ends_in_a_clear_error_and_loses_nothing(case, accepted, tmp_path):
    bank, good = accepted
    make, needle = BATTERY[case]
    before = tree(bank)
    argv = [a.format(bank=bank, good=good) for a in make(tmp_path)]
    proc = paddock(*argv, cwd=tmp_path, timeout=60)
    assert_clean_refusal(proc, needle)
    assert tree(bank) == before, "the hostile input changed what was accepted before"
    listed = paddock("tasks", "--bank", str(bank), "list", "kept")
    assert listed.returncode == 0 and "good" in listed.stdout
    assert not (tmp_path.parent / "escaped.yaml").exists() and not (bank.parent / "escaped.yaml").exists()
