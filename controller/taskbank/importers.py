"""Importers: turn public task formats into Task packages.

  humaneval  JSONL of {task_id, prompt, canonical_solution, test, entry_point}
  mbpp       JSONL of {task_id, text|prompt, code, test_list[, test_setup_code, test_imports]}
  math       JSONL of {question|problem, answer} (GSM8K: the answer after "####") or
             {problem, solution} (MATH: the last \\boxed{} of the solution)
  swe        JSONL of {instance_id, repo, base_commit, problem_statement, test_patch,
                       FAIL_TO_PASS, PASS_TO_PASS} where `repo` is a local git repository
             (path relative to the JSONL file or absolute)
  package    a directory whose subdirectories are task packages (task.yaml + files/ + hidden/)

Every record error names the file and line. A repository task's visible tree is the
repository at its base commit with a scrubbed `.git`: only the base commit's history (no
later commits, so no future fix), no reflogs, tags, remotes, stashes or hooks.

Must not import zmq. Runs `git` (argv lists, never a shell).
"""
from __future__ import annotations

import ast
import json
import os
import re
import shutil
import subprocess
import tempfile
from pathlib import Path
from typing import Any, Callable, Iterator

from controller.contracts.answers import boxed_contents
from controller.contracts.tasks import Budgets, Task, TaskError
from controller.taskbank.bank import TASK_FILE, load_package

KINDS = ("humaneval", "mbpp", "math", "swe", "package")
SOLUTION_FILE = "solution.py"
HIDDEN_TESTS_FILE = "test_hidden.py"
REFERENCE_FILE = "reference.py"
ANSWER_FILE = "answer.txt"
TEST_PATCH_FILE = "test.patch"
GIT_TIMEOUT_S = 120.0


class ImportSourceError(TaskError):
    """A source record cannot be imported; the message names the file and line."""


def import_source(kind: str, source: Path) -> list[Task]:
    if kind not in KINDS:
        raise ImportSourceError(f"unknown import kind {kind!r}; valid: {', '.join(KINDS)}")
    if kind == "package":
        return import_packages(source)
    convert: Callable[[dict, Path, int], Task] = {
        "humaneval": humaneval_task, "mbpp": mbpp_task, "math": math_task, "swe": swe_task,
    }[kind]
    tasks = []
    for lineno, record in _jsonl(source):
        try:
            tasks.append(convert(record, source, lineno))
        except ImportSourceError:
            raise
        except (TaskError, KeyError, TypeError, ValueError, SyntaxError) as exc:
            detail = f"missing field {exc}" if isinstance(exc, KeyError) else str(exc)
            raise ImportSourceError(f"{source}:{lineno}: {detail}") from None
    if not tasks:
        raise ImportSourceError(f"{source}: no records")
    return tasks


def _jsonl(path: Path) -> Iterator[tuple[int, dict]]:
    """Records of a JSONL file, plain or gzip-compressed (HumanEval ships `.jsonl.gz`)."""
    import gzip
    try:
        data = path.read_bytes()
        if data[:2] == b"\x1f\x8b":
            data = gzip.decompress(data)
        lines = data.decode("utf-8").splitlines()
    except OSError as exc:
        raise ImportSourceError(f"{path}: cannot read: {exc.strerror or exc}") from None
    except (EOFError, UnicodeDecodeError) as exc:
        raise ImportSourceError(f"{path}: not UTF-8 JSON lines (plain or gzip): {exc}") from None
    for lineno, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            record = json.loads(line)
        except ValueError as exc:
            raise ImportSourceError(f"{path}:{lineno}: not valid JSON: {exc}") from None
        if not isinstance(record, dict):
            raise ImportSourceError(f"{path}:{lineno}: a record must be a JSON object")
        yield lineno, record


def _slug(text: str) -> str:
    return re.sub(r"[^A-Za-z0-9._-]+", "_", str(text)).strip("_") or "task"


# -- python function tasks ------------------------------------------------------------------

def reference_helpers(reference: str, exclude: set[str]) -> str:
    """The reference's top-level statements except the definitions of `exclude` (the functions
    the agent writes): its imports and the helpers a HumanEval `check` uses (an encoder, a
    polynomial). The tests take them from here, never from the agent's file."""
    tree = ast.parse(reference)
    keep = [node for node in tree.body
            if not (isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)) and node.name in exclude)
            and not (isinstance(node, ast.Expr) and isinstance(node.value, ast.Constant))]
    return ast.unparse(ast.Module(body=keep, type_ignores=[])) + "\n" if keep else ""


def humaneval_task(rec: dict, source: Path, lineno: int) -> Task:
    prompt, entry = rec["prompt"], rec["entry_point"]
    tests = rec["test"]
    reference = prompt + rec["canonical_solution"]
    stub = prompt.rstrip("\n") + "\n    raise NotImplementedError\n"
    hidden_tests = (f"{reference_helpers(reference, {entry})}\nfrom solution import {entry}\n\n"
                    f"{tests}\n\n\ndef test_check():\n    check({entry})\n")
    instruction = (f"Complete the function `{entry}` in /work/solution.py so that it does what "
                   f"its docstring says. Hidden tests check it.\n\n{prompt}")
    return Task(name=f"humaneval/{_slug(rec.get('task_id', lineno))}", family="python",
                instruction=instruction, files={SOLUTION_FILE: stub},
                hidden={HIDDEN_TESTS_FILE: hidden_tests, REFERENCE_FILE: reference},
                checker={"kind": "pytest", "tests": [HIDDEN_TESTS_FILE], "isolation": "call"})


def _tested_function(code: str, asserts: list) -> ast.FunctionDef:
    """The reference's function the asserts call: the first called name the code defines at
    top level (MBPP references often define helpers first); else the last function defined."""
    defined = {node.name: node for node in ast.parse(code).body if isinstance(node, ast.FunctionDef)}
    if not defined:
        raise ValueError("the reference code defines no function")
    for stmt in asserts:
        try:
            tree = ast.parse(str(stmt).strip())
        except SyntaxError as exc:
            raise ValueError(f"'test_list' holds a statement that is not Python: {str(stmt)[:80]!r}") from exc
        for node in ast.walk(tree):
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id in defined:
                return defined[node.func.id]
    return list(defined.values())[-1]


def mbpp_task(rec: dict, source: Path, lineno: int) -> Task:
    """Original MBPP ({text, code, test_list, test_setup_code, challenge_test_list}) or the
    sanitized split ({prompt, code, test_list, test_imports})."""
    code, asserts = rec["code"].replace("\r\n", "\n"), rec["test_list"]
    if not isinstance(asserts, list) or not asserts or not all(isinstance(a, str) for a in asserts):
        raise ValueError("'test_list' must be a non-empty list of assert statements")
    text = rec.get("text", rec.get("prompt"))
    if not isinstance(text, str) or not text.strip():
        raise ValueError("needs a non-empty 'text' (or 'prompt')")
    fn = _tested_function(code, asserts)
    signature = ast.unparse(fn.args)
    stub = f"def {fn.name}({signature}):\n    raise NotImplementedError\n"
    imports = rec.get("test_imports") or []
    if not isinstance(imports, list):
        raise ValueError("'test_imports' must be a list of import statements")
    setup = (rec.get("test_setup_code") or "").replace("\r\n", "\n")
    lines = [*imports, f"from solution import {', '.join(_called_functions(code, asserts, fn.name))}", setup, ""]
    for i, stmt in enumerate(asserts):
        lines += ["", f"def test_{i}():", f"    {stmt.strip()}", ""]
    instruction = (f"{text.strip()}\n\nWrite the function `{fn.name}({signature})` in "
                   f"/work/solution.py. Hidden tests check it, for example:\n{asserts[0].strip()}")
    return Task(name=f"mbpp/{_slug(rec.get('task_id', lineno))}", family="python",
                instruction=instruction, files={SOLUTION_FILE: stub},
                hidden={HIDDEN_TESTS_FILE: "\n".join(lines), REFERENCE_FILE: code},
                checker={"kind": "pytest", "tests": [HIDDEN_TESTS_FILE], "isolation": "call"})


def _called_functions(code: str, asserts: list, tested: str) -> list[str]:
    """The reference's top-level functions the asserts call (the tested one first): the names the
    tests import from the agent's module, explicitly (never a star import)."""
    defined = {node.name for node in ast.parse(code).body if isinstance(node, ast.FunctionDef)}
    called = {node.func.id for stmt in asserts for node in ast.walk(ast.parse(str(stmt).strip()))
              if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id in defined}
    return [tested] + sorted(called - {tested})


# -- math -----------------------------------------------------------------------------------

def gold_answer(rec: dict) -> str:
    """The gold final answer of a math record: `answer` (GSM8K's "reasoning #### 72" gives
    "72"), else the last \\boxed{} of `solution` (the MATH dataset's records have no answer
    field)."""
    if "answer" in rec:
        answer = str(rec["answer"])
        if "####" in answer:
            answer = answer.rsplit("####", 1)[1]
            if re.fullmatch(r"\s*-?\d{1,3}(,\d{3})+(\.\d+)?\s*", answer):
                answer = answer.replace(",", "")
        answer = answer.strip()
        if not answer:
            raise ValueError("'answer' is empty")
        return answer
    if isinstance(rec.get("solution"), str):
        boxed = [b for b in boxed_contents(rec["solution"]) if b]
        if not boxed:
            raise ValueError("no 'answer', and 'solution' has no \\boxed{...} final answer")
        return boxed[-1]
    raise KeyError("answer")


def math_task(rec: dict, source: Path, lineno: int) -> Task:
    question = rec.get("question", rec.get("problem"))
    if not isinstance(question, str) or not question.strip():
        raise ValueError("needs a non-empty 'question' (or 'problem')")
    answer = gold_answer(rec)
    name = rec.get("id", rec.get("task_id", f"{source.stem}-{lineno}"))
    instruction = ("Solve the following problem. Put only the final answer in \\boxed{...}.\n\n"
                   + question.strip())
    return Task(name=f"math/{_slug(name)}", family="math", instruction=instruction,
                hidden={ANSWER_FILE: answer}, checker={"kind": "math", "answer": answer})


# -- repository (SWE-style) tasks -----------------------------------------------------------

def _git(cwd: Path, *argv: str, check: bool = True) -> str:
    cmd = ["git", "-c", "core.hooksPath=/dev/null", "-c", "protocol.file.allow=always", *argv]
    try:
        proc = subprocess.run(cmd, cwd=cwd, capture_output=True, text=True,
                              timeout=GIT_TIMEOUT_S,
                              env={**os.environ, "GIT_TERMINAL_PROMPT": "0",
                                   "GIT_CONFIG_NOSYSTEM": "1", "HOME": str(cwd)})
    except subprocess.TimeoutExpired:
        raise ImportSourceError(f"{' '.join(cmd)} (in {cwd}) timed out") from None
    if check and proc.returncode != 0:
        raise ImportSourceError(f"{' '.join(cmd)} (in {cwd}) exited {proc.returncode}: "
                                f"{proc.stderr.strip()[:500]}")
    return proc.stdout


def scrubbed_checkout(repo: Path, base_commit: str, dest: Path) -> None:
    """Clone `repo` into `dest` at `base_commit` with nothing beyond it.

    Keeps the base commit and its ancestors on one branch `main`; drops every other ref,
    tags, remotes, reflogs, stashes, hooks and unreachable objects.
    """
    if not (repo / ".git").exists() and not (repo / "HEAD").exists():
        raise ImportSourceError(f"{repo}: not a git repository")
    _git(dest.parent, "clone", "--quiet", "--no-local", "--no-checkout", "--no-tags",
         str(repo), dest.name)
    full = _git(dest, "rev-parse", "--verify", "--quiet", f"{base_commit}^{{commit}}",
                check=False).strip()
    if not full:
        raise ImportSourceError(f"{repo}: base commit {base_commit!r} not found")
    _git(dest, "checkout", "--quiet", "-B", "main", full)
    _git(dest, "remote", "remove", "origin")
    for ref in _git(dest, "for-each-ref", "--format=%(refname)").split():
        if ref != "refs/heads/main":
            _git(dest, "update-ref", "-d", ref)
    _git(dest, "reflog", "expire", "--expire=all", "--all")
    _git(dest, "gc", "--quiet", "--prune=now")
    git_dir = dest / ".git"
    # A package stores files only: keep the one ref loose so `.git/refs` is not an empty dir.
    head = _git(dest, "rev-parse", "HEAD").strip()
    (git_dir / "refs" / "heads").mkdir(parents=True, exist_ok=True)
    (git_dir / "refs" / "heads" / "main").write_text(head + "\n")
    for leftover in ("logs", "hooks", "FETCH_HEAD", "ORIG_HEAD", "packed-refs",
                     "description"):
        target = git_dir / leftover
        if target.is_dir():
            shutil.rmtree(target)
        elif target.exists():
            target.unlink()


def _read_tree(root: Path) -> dict[str, bytes]:
    out = {}
    for dirpath, dirnames, filenames in os.walk(root):
        dirnames.sort()
        for name in sorted(filenames):
            full = Path(dirpath) / name
            if full.is_symlink():
                raise ImportSourceError(f"{full}: symbolic links are not supported in repository tasks")
            out[full.relative_to(root).as_posix()] = full.read_bytes()
    return out


def _patched_paths(patch: str) -> list[str]:
    paths = re.findall(r"^\+\+\+ b/(\S+)", patch, flags=re.M)
    return sorted(set(paths))


def _test_ids(rec: dict, key: str) -> list[str]:
    """A list of test ids; the public SWE-bench files hold it as a JSON-encoded string."""
    value = rec.get(key) or []
    if isinstance(value, str):
        try:
            value = json.loads(value)
        except ValueError:
            raise ValueError(f"{key!r} is a string but not a JSON list of test ids: {value[:80]!r}") from None
    if not isinstance(value, list) or not all(isinstance(v, str) and v for v in value):
        raise ValueError(f"{key!r} must be a list of test ids (strings)")
    return value


def swe_task(rec: dict, source: Path, lineno: int) -> Task:
    repo = Path(rec["repo"])
    repo = repo if repo.is_absolute() else (source.parent / repo)
    base, patch = rec["base_commit"], rec["test_patch"]
    f2p, p2p = _test_ids(rec, "FAIL_TO_PASS"), _test_ids(rec, "PASS_TO_PASS")
    if not f2p:
        raise ValueError("'FAIL_TO_PASS' must list at least one test")
    test_files = _patched_paths(patch)
    if not test_files:
        raise ValueError("'test_patch' changes no file ('+++ b/<path>' lines)")
    with tempfile.TemporaryDirectory(prefix="paddock-swe-") as tmp:
        work = Path(tmp) / "repo"
        scrubbed_checkout(repo, base, work)
        files = _read_tree(work)
        patched = Path(tmp) / "patched"
        _git(Path(tmp), "clone", "--quiet", "--no-local", str(work), "patched")
        (Path(tmp) / TEST_PATCH_FILE).write_text(patch)
        _git(patched, "apply", "--whitespace=nowarn", str(Path(tmp) / TEST_PATCH_FILE))
        hidden: dict[str, Any] = {TEST_PATCH_FILE: patch}
        for rel in test_files:
            hidden[rel] = (patched / rel).read_bytes()
    protected = tuple(p for p in test_files if p in files)
    name = rec.get("instance_id", f"{source.stem}-{lineno}")
    instruction = (f"The repository is checked out at /work (git, branch main). Resolve this "
                   f"issue by changing the code; do not modify the tests.\n\n"
                   f"{rec['problem_statement'].strip()}")
    return Task(name=f"swe/{_slug(name)}", family="swe", instruction=instruction,
                files=files, hidden=hidden, protected=protected,
                checker={"kind": "pytest", "tests": test_files,
                         "fail_to_pass": f2p, "pass_to_pass": p2p},
                budgets=Budgets(max_steps=30, wall_s=600.0))


# -- packages -------------------------------------------------------------------------------

def import_packages(directory: Path) -> list[Task]:
    if (directory / TASK_FILE).exists():
        return [load_package(directory)]
    if not directory.is_dir():
        raise ImportSourceError(f"{directory}: not a directory of task packages")
    dirs = sorted(d for d in directory.iterdir() if (d / TASK_FILE).exists())
    if not dirs:
        raise ImportSourceError(f"{directory}: no task packages (subdirectories with {TASK_FILE})")
    return [load_package(d) for d in dirs]
