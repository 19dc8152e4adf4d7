"""The CLI does what its documentation says (issue 27, item 6).

1. Every subcommand given an unknown option prints the usage of that subcommand (not the
   top level's) and exits 2. The subcommands are walked from the real parser.
2. Every `paddock ...` command written in README.md and docs/*.md (inline code and code
   blocks) names a real subcommand path, and every option it shows is one that subcommand (or
   a group above it) accepts: `export -o` in the README is checked against `paddock export`.
   Synopsis placeholders (DIR, `[...]`, `a|b`) are read as such: each alternative of `a|b` in
   a command position must be a subcommand.
3. The concrete examples run as written, against a real run directory where they need one
   (`DIR`, `RUN` replaced by it). Reduced forms, marked REDUCED below: `paddock run` runs one
   policy version of two tasks with one agent (the documented run is 8 versions); `paddock
   sandbox run -- CMD` runs `echo`; examples that need a Slurm cluster or a running farm
   (`launch`, `job`, `controller`, `agent`, `top`, `agents`, `drain`, `replay`, `rescore`,
   `tasks validate`) are checked by item 2 only (their own tests run them for real).
4. Commands given a nonexistent path fail (exit 2, or 1 for a failed verdict) and create
   nothing.
"""
from __future__ import annotations

import argparse
import glob
import json
import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

from controller.cli.main import build_parser, main
from tests.analysis.test_export import policy, real_run  # noqa: F401 - the fixture is used by name
from tests.cli.test_cli_help import PATHS

ROOT = Path(__file__).resolve().parents[2]
DOCS = [ROOT / "README.md"] + sorted(Path(p) for p in glob.glob(str(ROOT / "docs" / "*.md")))


# -- 1. unknown options ---------------------------------------------------------------------

@pytest.mark.parametrize("path", PATHS, ids=" ".join)
def test_an_unknown_option_prints_the_usage_of_that_subcommand_and_exits_2(path, capsys):
    with pytest.raises(SystemExit) as exc:
        main([*path, "--no-such-option"])
    assert exc.value.code == 2
    err = capsys.readouterr().err
    usage = " ".join(err.split("\n\n")[0].split())
    assert usage.startswith("usage: paddock " + " ".join(path)), err
    assert "error:" in err


# -- 2. documented commands name real subcommands and options --------------------------------

def documented_commands() -> list[tuple[str, str]]:
    """(file, command text) of every `paddock ...` in the docs, continuation lines joined."""
    out = []
    for doc in DOCS:
        text = doc.read_text()
        name = doc.relative_to(ROOT).as_posix()
        for m in re.finditer(r"`(paddock [^`]+)`", text):
            out.append((name, " ".join(m.group(1).split())))
        for block in re.findall(r"```[a-z]*\n(.*?)```", text, re.S):
            joined = re.sub(r"\\\n\s*", " ", block)
            for line in joined.splitlines():
                line = line.strip().removeprefix("$ ").split("  #")[0].strip()
                if line.startswith("paddock "):
                    out.append((name, line))
    return sorted(set(out))


def _subparsers(parser: argparse.ArgumentParser) -> dict[str, argparse.ArgumentParser]:
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            return dict(action.choices)
    return {}


def check_documented(command: str) -> list[str]:
    """What in `command` the parser does not know (empty: it conforms)."""
    text = command.replace("\\|", "|").replace("…", "...")
    try:
        tokens = shlex.split(text)[1:]           # a quoted trainer command is one value
    except ValueError:
        tokens = text.split()[1:]
    if not tokens or tokens[0] in ("...",) or tokens[0].endswith(":") or "/" in tokens[0]:
        return []                               # prose: "paddock ...", an error line, "top/agents"
    problems, parsers = [], [build_parser()]
    i = 0
    while i < len(tokens):
        tok = tokens[i].strip("[]()")
        subs = _subparsers(parsers[-1])
        if subs and not tok.startswith("-"):
            alts = tok.split("|")
            if all(a in subs for a in alts):
                if len(alts) > 1:               # `job head|agent`: each alternative is checked
                    return problems + [p for a in alts
                                       for p in check_documented(" ".join(["paddock", *_path_of(parsers), a, *tokens[i + 1:]]))]
                parsers.append(subs[tok])
            elif any(a in subs for a in alts) or (tok.isidentifier() and tok.islower()):
                problems.append(f"{[a for a in alts if a not in subs]} not subcommands of {parsers[-1].prog!r}")
        elif tok.startswith("-") and tok != "--" and not re.fullmatch(r"-\d.*", tok):
            flag = tok.split("=")[0]
            known = {o for p in parsers for a in p._actions for o in a.option_strings}
            if flag not in known:
                problems.append(f"{parsers[-1].prog} has no option {flag}")
        elif tok == "--":
            break
        i += 1
    return problems


def _path_of(parsers: list[argparse.ArgumentParser]) -> list[str]:
    return parsers[-1].prog.split()[1:] if len(parsers) > 1 else []


DOCUMENTED = documented_commands()


def test_the_docs_show_many_commands():
    assert len(DOCUMENTED) > 100


@pytest.mark.parametrize("where,command", DOCUMENTED, ids=[f"{w}:{c[:60]}" for w, c in DOCUMENTED])
def test_every_documented_command_names_real_subcommands_and_options(where, command):
    assert check_documented(command) == [], f"{where}: {command}"


def test_the_checker_catches_drift():
    assert check_documented("paddock export --run DIR --format hf -x OUT") == ["paddock export has no option -x"]
    assert check_documented("paddock tasks importt X") != []
    assert check_documented("paddock job head|agentz") != []


# -- 3. concrete examples run as written -------------------------------------------------------

def paddock(*argv: str, cwd: Path = ROOT, timeout: float = 120) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "controller.cli.main", *argv], cwd=cwd, timeout=timeout,
                          env=dict(os.environ, PYTHONPATH=str(ROOT)), capture_output=True, text=True)


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory, policy):  # noqa: F811 - the fixture
    d = tmp_path_factory.mktemp("conformance") / "run"
    d.mkdir()
    real_run(d, policy, n=3)
    return d


def _documented(prefix: str) -> list[str]:
    return [c for _w, c in DOCUMENTED if c.startswith(prefix)]


AS_WRITTEN = ["paddock --help", "paddock agent --help", "paddock controller --help", "paddock top --help",
              "paddock egress check --allow pypi.org https://pypi.org.attacker.net/",
              "paddock egress check --allow 'pypi.org,*.pythonhosted.org:443' https://files.pythonhosted.org/p",
              "paddock tools list [--tools …]", "paddock run --help"]


@pytest.mark.parametrize("command", AS_WRITTEN)
def test_a_concrete_example_runs_as_written(command):
    assert any(c == command for _w, c in DOCUMENTED) or command.endswith("--help"), \
        f"{command!r} is no longer in the docs: update this list"
    argv = [t for t in shlex.split(command)[1:] if t != "[--tools" and t != "…]"]   # the synopsis' optional part
    proc = paddock(*argv)
    assert "Traceback" not in proc.stderr, proc.stderr
    assert proc.returncode in (0, 1), (proc.returncode, proc.stderr)   # egress check: 1 = denied


def test_egress_examples_decide_as_the_docs_say():
    # REDUCED: DNS here may answer with a test address, so the host's address is given
    assert paddock("egress", "check", "--allow", "pypi.org", "https://pypi.org.attacker.net/").returncode != 0
    ok = paddock("egress", "check", "--allow", "pypi.org,*.pythonhosted.org:443",
                 "--resolve", "files.pythonhosted.org=151.101.0.223", "https://files.pythonhosted.org/p")
    assert ok.returncode == 0, ok.stdout + ok.stderr


@pytest.mark.parametrize("template", [
    "paddock query --run DIR \"SELECT task_family, count(*) FROM rollouts GROUP BY ALL\"",
    "paddock query --run RUN \"SELECT node, infra_reason, count(*) FROM infra_attempts GROUP BY ALL ORDER BY 3 DESC\"",
    "paddock query --run RUN \"SELECT * FROM rollouts WHERE rollout_id = 'b000001-00007'\"",
    "paddock query --run DIR \"SELECT step, role, tool_name, tool_args, observation FROM steps WHERE rollout_id = '...' ORDER BY step\"",
    "paddock query --run DIR --export FILE.duckdb",
    "paddock report --run DIR --html FILE",
    "paddock report --run DIR --json --band 0.2 0.8",
    "paddock export --run DIR --format hf -o OUT",
    "paddock export --run DIR --format verifiers --out PATH",
    "paddock compact --run DIR",
    "paddock check math --gold G --pred P",
])
def test_a_documented_analyst_command_runs_on_a_real_run(template, run_dir, tmp_path):
    values = {"DIR": str(run_dir), "RUN": str(run_dir), "FILE.duckdb": str(tmp_path / "snap.duckdb"),
              "FILE": str(tmp_path / "report.html"), "OUT": str(tmp_path / "out.parquet"),
              "PATH": str(tmp_path / "out.jsonl"), "G": "2", "P": "\\boxed{2}"}
    argv = [values.get(t, t) for t in shlex.split(template)[1:]]
    proc = paddock(*argv)
    assert proc.returncode == 0, (template, proc.stderr)
    assert "Traceback" not in proc.stderr


def test_reduced_paddock_run_with_its_options_as_written(tmp_path, python_image):
    # REDUCED: one version of two tasks with one agent (the documented default is 8 versions)
    assert any("--metrics-port PORT" in c for c in _documented("paddock run"))
    proc = paddock("run", "--versions", "1", "--tasks-limit", "2", "--agents", "1", "--rollouts-per-task", "1",
                   "--metrics-port", "0", "--runs-dir", str(tmp_path / "runs"), cwd=tmp_path, timeout=300)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    (run,) = (tmp_path / "runs").glob("2*")
    assert (run / "health" / "local-1.jsonl").is_file()
    assert "metrics http://" in proc.stdout


def test_reduced_sandbox_run_with_its_documented_caps(python_image):
    # REDUCED: `-- CMD ...` is `echo hi`
    assert _documented("paddock sandbox run [--image IMG] [--memory 256M]")
    proc = paddock("sandbox", "run", "--memory", "256M", "--disk", "64M", "--pids", "64", "--cpu", "1",
                   "--timeout", "10", "--", "echo", "hi")
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == "hi"


# -- 4. nonexistent paths -------------------------------------------------------------------

MISSING_PATH_COMMANDS = [
    ["query", "--run", "{m}", "SELECT 1"], ["query", "--run", "{m}", "--export", "{t}/x.duckdb"],
    ["report", "--run", "{m}"], ["report", "--run", "{m}", "--html", "{m}/r.html"],
    ["compact", "--run", "{m}"], ["export", "--run", "{m}", "--format", "hf"],
    ["export", "--run", "{m}", "--format", "hf", "-o", "{m}/x.parquet"],
    ["replay", "r1", "--run", "{m}"], ["rescore", "--run", "{m}"],
    ["health", "--run", "{m}"], ["top", "--run", "{m}", "--once"], ["agents", "--run", "{m}"],
    ["drain", "n1", "--run", "{m}"], ["image", "inspect", "{m}/x.sif"],
    ["verify", "--task", "{m}/task.json", "--answer", "2"],
    ["tasks", "--bank", "{m}", "list"], ["tasks", "--bank", "{m}", "show", "x"],
    ["tasks", "--bank", "{m}", "import", "math", "{m}/x.jsonl", "--set", "s"],
    ["run", "--config", "{m}/run.yaml", "--runs-dir", "{m}/runs"],
    ["sandbox", "run", "--image", "{m}/x.sif", "--", "true"],
]


@pytest.mark.parametrize("argv", MISSING_PATH_COMMANDS, ids=lambda a: " ".join(a[:2]))
def test_a_nonexistent_path_fails_and_creates_nothing(argv, tmp_path):
    missing = tmp_path / "missing"
    before = sorted(p.name for p in tmp_path.iterdir())
    proc = paddock(*[a.format(m=missing, t=tmp_path) for a in argv], cwd=tmp_path, timeout=60)
    assert proc.returncode in (1, 2), (proc.returncode, proc.stdout, proc.stderr)
    assert "Traceback" not in proc.stderr, proc.stderr
    assert not missing.exists(), f"{argv[0]} created {missing}"
    assert sorted(p.name for p in tmp_path.iterdir()) == before
    assert json.dumps(proc.stderr)     # said something
    assert proc.stderr.strip(), "a failure must say why"
