"""Importers: turn public task formats into Task packages.

  humaneval  JSONL of {task_id, prompt, canonical_solution, test, entry_point}
  mbpp       JSONL of {task_id, text|prompt, code, test_list[, test_setup_code, test_imports]}
  math       JSONL of {question|problem, answer} (GSM8K: the answer after "####") or
             {problem, solution} (MATH: the last \\boxed{} of the solution)
  swe        SWE-bench / SWE-Gym JSONL (controller/taskbank/swe.py: repositories as layers)
  package    a directory whose subdirectories are task packages (task.yaml + files/ + hidden/)
  tau, harbor  τ-bench / τ²-bench domains and Harbor task directories (importers_tools.py)

JSONL is streamed (plain or gzip), one record at a time (`iter_source`). Every record error
names the file and line. Must not import zmq.
"""
from __future__ import annotations

import ast
import functools
import gzip
import io
import math
import os
import re
import stat
from pathlib import Path
from typing import Callable, Iterator

from controller.contracts.answers import boxed_contents
from controller.contracts.safeload import DEFAULT as DEFAULT_BOUNDS
from controller.contracts.safeload import ParseLimitError, load_json_text
from controller.contracts.tasks import Task, TaskError
from controller.taskbank import importers_tools  # tau, harbor
from controller.taskbank.bank import TASK_FILE, load_package
from controller.taskbank.swe import TEST_PATCH_FILE, ImportSourceError, SweContext, scrubbed_checkout, slug, swe_task  # noqa: F401

KINDS = ("humaneval", "mbpp", "math", "swe", "package") + importers_tools.KINDS
SOLUTION_FILE = "solution.py"
HIDDEN_TESTS_FILE = "test_hidden.py"
REFERENCE_FILE = "reference.py"
ANSWER_FILE = "answer.txt"


def import_source(kind: str, source: Path, context: SweContext = SweContext()) -> list[Task]:
    """Every task of `source` (see `iter_source`)."""
    tasks = list(iter_source(kind, source, context))
    if not tasks:
        raise ImportSourceError(f"{source}: no records")
    return tasks


def iter_source(kind: str, source: Path, context: SweContext = SweContext()) -> Iterator[Task]:
    """The tasks of `source`, one record at a time (memory bounded by one record: a large
    dataset streams). `context`: the image store and clones directory of swe records."""
    if kind not in KINDS:
        raise ImportSourceError(f"unknown import kind {kind!r}; valid: {', '.join(KINDS)}")
    if kind == "package":
        yield from import_packages(source)
        return
    if kind in importers_tools.KINDS:
        yield from importers_tools.iter_source(kind, source)
        return
    convert: Callable[[dict, Path, int], Task] = {
        "humaneval": humaneval_task, "mbpp": mbpp_task, "math": math_task,
        "swe": functools.partial(swe_task, ctx=context),
    }[kind]
    for lineno, record in _jsonl(source):
        try:
            task = convert(record, source, lineno)
        except ImportSourceError as exc:
            raise ImportSourceError(f"{source}:{lineno}: {exc}") from None
        except (TaskError, KeyError, TypeError, ValueError, SyntaxError) as exc:
            detail = f"missing field {exc}" if isinstance(exc, KeyError) else str(exc)
            raise ImportSourceError(f"{source}:{lineno}: {detail}") from None
        yield task


def _lines(path: Path, max_line_chars: int) -> Iterator[str]:
    """The lines of a plain or gzip-compressed text file, streamed; a line longer than
    `max_line_chars` is returned cut (the caller refuses it) and never held whole."""
    st = os.stat(path)
    if not stat.S_ISREG(st.st_mode):
        raise ImportSourceError(f"{path}: not a regular file (a FIFO, socket or device cannot be imported)")
    with open(path, "rb") as raw:
        gz = raw.read(2) == b"\x1f\x8b"
        raw.seek(0)
        stream = gzip.open(raw) if gz else raw
        text = io.TextIOWrapper(stream, encoding="utf-8")
        while True:
            line = text.readline(max_line_chars + 1)
            if not line:
                return
            yield line
            if len(line) > max_line_chars and not line.endswith("\n"):
                return


def _jsonl(path: Path) -> Iterator[tuple[int, dict]]:
    """Records of a JSONL file, plain or gzip-compressed (HumanEval ships `.jsonl.gz`), streamed;
    bounded per record in size and nesting (controller/contracts/safeload.py)."""
    bounds = DEFAULT_BOUNDS
    lines = _lines(path, bounds.max_line_bytes)
    lineno = 0
    while True:
        try:
            line = next(lines)
        except StopIteration:
            return
        except OSError as exc:
            raise ImportSourceError(f"{path}: cannot read: {exc.strerror or exc}") from None
        except (EOFError, UnicodeDecodeError, gzip.BadGzipFile) as exc:
            raise ImportSourceError(f"{path}: not UTF-8 JSON lines (plain or gzip): {exc}") from None
        lineno += 1
        if len(line) > bounds.max_line_bytes and not line.endswith("\n"):
            raise ImportSourceError(f"{path}:{lineno}: line longer than {bounds.max_line_bytes} "
                                    "characters (limit max_line_bytes)")
        if not line.strip():
            continue
        try:
            record = load_json_text(line, str(path), bounds, line=lineno, max_bytes=bounds.max_line_bytes + 1)
        except ParseLimitError as exc:
            raise ImportSourceError(str(exc)) from None
        if not isinstance(record, dict):
            raise ImportSourceError(f"{path}:{lineno}: a record must be a JSON object")
        yield lineno, record


_slug = slug


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
    lines = [*imports, *_module_imports(code), f"from solution import {', '.join(_called_functions(code, asserts, fn.name))}", setup, ""]
    for i, stmt in enumerate(asserts):
        lines += ["", f"def test_{i}():", f"    {stmt.strip()}", ""]
    instruction = (f"{text.strip()}\n\nWrite the function `{fn.name}({signature})` in "
                   f"/work/solution.py. Hidden tests check it, for example:\n{asserts[0].strip()}")
    return Task(name=f"mbpp/{_slug(rec.get('task_id', lineno))}", family="python",
                instruction=instruction, files={SOLUTION_FILE: stub},
                hidden={HIDDEN_TESTS_FILE: "\n".join(lines), REFERENCE_FILE: code},
                checker={"kind": "pytest", "tests": [HIDDEN_TESTS_FILE], "isolation": "call"})


def _module_imports(code: str) -> list[str]:
    """The reference's top-level absolute imports: tests that use them (MBPP 596's asserts call
    `sys.getsizeof`) got them from the solution's namespace; now from the hidden reference."""
    return [ast.unparse(n) for n in ast.parse(code).body
            if isinstance(n, ast.Import) or (isinstance(n, ast.ImportFrom) and not n.level
                                             and all(a.name != "*" for a in n.names))]


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
        value = rec["answer"]
        if isinstance(value, bool) or not isinstance(value, (str, int, float)):
            raise ValueError(f"'answer' must be a string or a number, got {type(value).__name__} {str(value)[:40]}")
        if isinstance(value, float) and not math.isfinite(value):
            raise ValueError(f"'answer' must be a finite number, got {value!r}")
        answer = str(value)
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
