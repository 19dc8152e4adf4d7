"""Execution stage of the contamination check: a held-out code task's own hidden tests, run
against the code of its nearest training tasks, in a sandbox.

A rephrased copy of a code benchmark item renames, reorders and pads, so what it says drifts
from the original; what it does does not. For each held-out code task whose checker is pytest
over hidden test files (`probe`), and each of its `top_k` nearest training neighbours by the
semantic stage (semantic score at least `min_score`) that has Python code
(`codetext.task_code`), the neighbour's code becomes the held-out task's solution module and the
held-out task's tests run against it: a neighbour that passes them does what the held-out task
asks. The held-out task's functions are bound by name, else to the neighbour's functions of the
same positional arity (`bindings`, at most `max_bindings` ways; the closest names first).
Weak tests are backed by a differential check: the neighbour and the reference also run on every
example input written as a literal call in the held-out task's text and in the neighbour's code
(`examples`, parsed, never run here) and must agree.

Two controls per held-out task make a pass mean something: the task's own reference must pass
its tests in this runner (else the task is not judged here: its tests need what this runner
lacks) and a null solution (every function returns None) must fail them (else the tests
cannot tell code apart). Outcomes per pair: `pass`, `fail` (an assertion, an error, the time
limit) or no verdict (`None`, with the reason in the report).

Runs happen in one sandbox per batch of `batch` held-out tasks, given by the caller's
`Executor` (the CLI's is the farm's rootless sandbox of the built-in Python image, no network,
capped). Each run is its own exec of `CHILD` (standard library only) under its own in-sandbox
uid, so no run's code can signal another run or touch its files, and is killed at
`timeout_s`; its output goes nowhere. A run passes only if it answers with its per-run nonce
after its tests, so code that exits 0 on import does not pass. A sandbox that fails costs its
batch its verdicts, never a crash and never a `pass`. Hostile code can still fake a pass from
inside its own run (it shares the test runner's process): that yields a suspect, never a reward.

Must not import: zmq, nodeagent, numpy.
"""
from __future__ import annotations

import ast
import itertools
import json
import logging
import re
import secrets
import time
from dataclasses import dataclass
from pathlib import PurePosixPath
from typing import Callable, ContextManager, Protocol, Sequence

from controller.contracts.tasks import Task
from controller.taskbank import codetext

log = logging.getLogger(__name__)

MAX_STDIN_BYTES = 4 << 20   # one run's request (the sandbox takes up to 8 MiB)

class Executor(Protocol):
    """Where runs happen: `sandbox()` is a context manager giving `run(script, stdin, timeout_s,
    run_no) -> (exit code, stdout)` for `python3 -I -c script` in one fresh sandbox (no network,
    capped), each `run_no` (0, 1, ... within the sandbox) under an in-sandbox uid of its own;
    -9 for a run killed at `timeout_s`. Raises ExecutionUnavailable when no sandbox can start
    here."""

    def sandbox(self) -> ContextManager[Callable[[str, bytes, float, int], tuple[int, str]]]: ...


class ExecutionUnavailable(RuntimeError):
    """The executor cannot run anything here (no sandbox): the stage is skipped, saying why."""


@dataclass(frozen=True)
class ExecutionConfig:
    top_k: int = 3              # nearest training neighbours run per held-out task
    min_score: float = 0.42     # of the pair's semantic score: neighbours below are not run
    timeout_s: float = 5.0      # per run (one candidate under one binding)
    max_bindings: int = 3       # ways of binding the held-out task's functions to a neighbour's
    batch: int = 16             # held-out tasks per sandbox run

    def __post_init__(self) -> None:
        for key in ("top_k", "max_bindings", "batch"):
            if getattr(self, key) < 1:
                raise ValueError(f"contamination: execution {key!r} must be >= 1")
        if not 0.0 <= self.min_score <= 1.0:
            raise ValueError("contamination: execution 'min_score' must be in [0, 1]")
        if not 0.0 < self.timeout_s <= 600:
            raise ValueError("contamination: execution 'timeout_s' must be in (0, 600]")


@dataclass(frozen=True)
class Probe:
    """What the runner needs of a held-out task."""
    module: str                      # the solution module's file, relative to /work
    entries: dict[str, int]          # function the tests import -> its required positional arity
    tests: tuple[str, ...]           # test files (run in this order)
    files: dict[str, str]            # every text file the tests may read (tests included)
    reference: str                   # the task's reference code (the control that must pass)
    text: str = ""                   # where its examples are: the instruction and the visible files


def _functions(code: str) -> dict[str, tuple[int, int, bool]]:
    """Top-level functions: name -> (required positional, max positional, takes *args)."""
    try:
        tree = ast.parse(code)
    except (SyntaxError, ValueError, RecursionError, MemoryError):
        return {}
    out = {}
    for node in tree.body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            a = node.args
            positional = len(a.posonlyargs) + len(a.args)
            out[node.name] = (positional - len(a.defaults), positional, a.vararg is not None)
    return out


def _imported(tests: Sequence[str], modules: set[str]) -> tuple[str | None, set[str]]:
    """(the solution module the tests import from, the names they import from it)."""
    module, names = None, set()
    for src in tests:
        try:
            tree = ast.parse(src)
        except (SyntaxError, ValueError, RecursionError, MemoryError):
            return None, set()
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom) and node.level == 0 and node.module in modules:
                if module not in (None, node.module):
                    return None, set()      # two solution modules: not judged here
                module = node.module
                names |= {a.name for a in node.names}
    return module, names


def probe(task: Task) -> tuple[Probe | None, str]:
    """The held-out task's probe, or (None, why it cannot be judged by execution)."""
    checker = task.checker or {}
    if checker.get("kind") != "pytest" or not checker.get("tests"):
        return None, "checker is not pytest over hidden test files"
    tests = [rel for rel in checker["tests"] if isinstance(task.hidden.get(rel), str)]
    if len(tests) != len(checker["tests"]):
        return None, "a hidden test file is missing or binary"
    refs = [rel for rel in sorted(task.hidden) if PurePosixPath(rel).name.startswith("reference")
            and rel.endswith(".py") and isinstance(task.hidden[rel], str)]
    if not refs:
        return None, "no reference solution to confirm the tests run"
    modules = {PurePosixPath(rel).stem: rel for rel in task.files
               if rel.endswith(".py") and "/" not in rel and isinstance(task.files[rel], str)}
    module, names = _imported([task.hidden[rel] for rel in tests], set(modules))
    if module is None or not names or "*" in names:
        return None, "the tests import no function from a solution module"
    reference = task.hidden[refs[0]]
    defined = _functions(reference)
    if not names <= set(defined):
        return None, "the tests import names the reference does not define as functions"
    files = {rel: c for rel, c in {**task.files, **task.hidden}.items()
             if isinstance(c, str) and rel != modules[module] and rel not in refs
             and not rel.startswith(".git/")}
    text = "\n".join([task.instruction, *(c for c in task.files.values() if isinstance(c, str))])
    return Probe(modules[module], {n: defined[n][0] for n in sorted(names)}, tuple(tests),
                 files, reference, text), ""


MAX_EXAMPLES = 32


def examples(text: str, name: str) -> list[str]:
    """The argument tuples (as `repr`) of the calls `name(...)` with literal arguments written in
    `text`: a docstring's `>>> f(1, [2])` or a prose `f("ab") == "AB"`. Parsed, never run."""
    out: list[str] = []
    for m in re.finditer(r"\b" + re.escape(name) + r"\(", text):
        depth, j = 1, m.end()
        while j < len(text) and depth and j - m.end() < 2000:
            depth += {"(": 1, ")": -1}.get(text[j], 0)
            j += 1
        try:
            call = ast.parse(text[m.start():j], mode="eval").body
            args = tuple(ast.literal_eval(a) for a in call.args) if isinstance(call, ast.Call) \
                and not call.keywords else None
        except (SyntaxError, ValueError, TypeError, MemoryError, RecursionError):
            continue
        if args and repr(args) not in out:
            out.append(repr(args))
        if len(out) >= MAX_EXAMPLES:
            break
    return out


def _name_words(name: str) -> set[str]:
    return set(codetext.name_words(name).split())


def bindings(p: Probe, code: str, limit: int) -> list[dict[str, str]]:
    """Ways to bind the held-out task's functions to the functions of `code`: a function of the
    same name, else any whose positional arity admits the call, closest name first, then the
    last defined first (a copy defines its helpers before its entry point)."""
    fns = _functions(code)
    order = list(fns)
    options = []
    for entry, arity in p.entries.items():
        if entry in fns and (fns[entry][0] <= arity <= fns[entry][1] or fns[entry][2]):
            options.append([entry])
            continue
        fit = [f for f in order if fns[f][0] <= arity and (arity <= fns[f][1] or fns[f][2])]
        words = _name_words(entry)
        fit.sort(key=lambda f: (-len(words & _name_words(f)), -order.index(f)))
        if not fit:
            return []
        options.append(fit)
    return [dict(zip(p.entries, combo)) for combo in itertools.islice(itertools.product(*options), limit)]


def null_code(p: Probe) -> str:
    return "".join(f"def {e}(*args, **kwargs):\n    return None\n\n" for e in p.entries)


@dataclass
class Outcome:
    verdict: str | None          # pass | fail | None (no verdict)
    detail: str                  # the binding that passed, or why there is no verdict


def judge(pairs: Sequence[tuple[Task, list[tuple[Task, float]]]], cfg: ExecutionConfig, run: Executor
          ) -> tuple[dict[tuple[int, int], Outcome], dict[str, int], float]:
    """Run each held-out task's tests against its candidate training tasks.

    `pairs`: (held-out task, [(training task, semantic score)], best first). Returns
    ({(id(held-out task), id(training task)): Outcome}, counts, seconds)."""
    t0 = time.monotonic()
    out: dict[tuple[int, int], Outcome] = {}
    jobs: list[tuple[Task, Probe, list[tuple[Task, str, list[dict[str, str]]]]]] = []
    for h, neighbours in pairs:
        chosen = [(t, s) for t, s in neighbours if s >= cfg.min_score][:cfg.top_k]
        if not chosen:
            continue
        p, why = probe(h)
        cands = []
        for t, _ in chosen:
            code = codetext.task_code(t)
            python = bool(code) and codetext.is_python(code)
            b = bindings(p, code, cfg.max_bindings) if p is not None and python else []
            if p is None:
                out[(id(h), id(t))] = Outcome(None, why)
            elif not python:
                out[(id(h), id(t))] = Outcome(None, "the training task has no Python code")
            elif not b:
                out[(id(h), id(t))] = Outcome("fail", "no function of the arity the tests call")
            else:
                cands.append((t, code, b))
        if cands:
            jobs.append((h, p, cands))
    for start in range(0, len(jobs), cfg.batch):
        _run_batch(jobs[start:start + cfg.batch], cfg, run, out)
    counts = {"held-out tasks": len(jobs), "pairs run": sum(len(c) for _, _, c in jobs),
              "passed": sum(o.verdict == "pass" for o in out.values()),
              "no verdict": sum(o.verdict is None for o in out.values())}
    return out, counts, time.monotonic() - t0


def _request(p: Probe, code: str, binding: dict[str, str], check: dict | None, nonce: str) -> bytes:
    module = code + "\n\n" + "".join(f"{e} = {f}\n" for e, f in binding.items() if e != f)
    return json.dumps({"files": {**p.files, p.module: module}, "tests": list(p.tests),
                       "module": p.module, "examples": check, "nonce": nonce}).encode()


def _inputs(p: Probe, cands: list) -> list[str]:
    """Example inputs for the differential check: those written in the held-out task and in
    each candidate's code (under the name it is bound by); single-function tasks only."""
    if len(p.entries) != 1:
        return []
    (entry,) = p.entries
    seen = dict.fromkeys(examples(p.text, entry))
    for _, code, binds in cands:
        for b in binds:
            seen.update(dict.fromkeys(examples(code, b[entry])))
    return list(seen)[:2 * MAX_EXAMPLES]


def _run_batch(batch: list, cfg: ExecutionConfig, run: Executor, out: dict) -> None:
    """One sandbox for the batch; each run its own exec under its own uid, so no run can
    signal, read or change another's files. A sandbox failure costs the batch its
    verdicts (None), never a crash and never a pass."""
    run_no = itertools.count()
    try:
        with run.sandbox() as run_in:
            def one(p: Probe, code: str, binding: dict[str, str], check: dict | None = None
                    ) -> tuple[int, list | None]:
                """(exit, the reference's outputs); exit 0 only with the run's nonce in its
                answer, so code that exits 0 on its own (`os._exit(0)`) does not pass."""
                nonce = secrets.token_hex(16)
                request = _request(p, code, binding, check, nonce)
                if len(request) > MAX_STDIN_BYTES:
                    return 3, None
                rc, said = run_in(CHILD, request, cfg.timeout_s, next(run_no))
                answer = _answer(said)
                if rc == 0 and (answer is None or answer.get("nonce") != nonce):
                    return 8, None
                return rc, (answer or {}).get("outputs")
            for h, p, cands in batch:
                inputs = _inputs(p, cands)
                entry = next(iter(p.entries))
                ref, said = one(p, p.reference, {}, {"entry": entry, "args": inputs} if inputs else None)
                null, _ = one(p, null_code(p), {})
                expect = _expected(said, inputs) if ref == 0 and inputs else None
                for t, code, binds in cands:
                    if ref != 0:
                        out[(id(h), id(t))] = Outcome(None, "the task's own reference does not pass "
                                                            f"its tests here ({_code(ref)})")
                    elif null == 0:
                        out[(id(h), id(t))] = Outcome(None, "the tests pass a null solution: they "
                                                            "cannot tell code apart")
                    else:
                        out[(id(h), id(t))] = _candidate(one, p, code, binds, entry, expect)
    except ExecutionUnavailable:
        raise
    except Exception as exc:      # the sandbox failed: no verdicts for this batch, never a crash
        log.warning("contamination execution: the sandbox failed: %s", exc)
        for h, _, cands in batch:
            for t, _, _ in cands:
                out.setdefault((id(h), id(t)), Outcome(None, f"the sandbox failed: {exc}"))


def _answer(said: str) -> dict | None:
    try:
        answer = json.loads(said.strip().splitlines()[-1])
    except (ValueError, IndexError):
        return None
    return answer if isinstance(answer, dict) else None


def _expected(outputs: list | None, inputs: list[str]) -> dict | None:
    """The reference's outputs on the example inputs (None where it raised), as it reported."""
    if not isinstance(outputs, list) or len(outputs) != len(inputs):
        return None
    return {"args": inputs, "expect": outputs}


def _candidate(one, p: Probe, code: str, binds: list[dict[str, str]], entry: str,
               expect: dict | None) -> Outcome:
    rc = None
    for b in binds:
        rc, _ = one(p, code, b, None if expect is None else {"entry": entry, **expect})
        if rc == 0:
            agreed = f"; agrees on {sum(e is not None for e in expect['expect'])} example input(s)" \
                if expect else ""
            return Outcome("pass", ", ".join(f"{e} = {f}" for e, f in b.items()) + agreed)
    return Outcome("fail", _code(rc))


_CODES = {0: "passed", 1: "an assertion failed", 2: "an error", 3: "request refused",
          4: "tests take arguments", 5: "no test functions",
          6: "passes the tests but differs from the reference on an example input",
          8: "exited 0 without finishing the tests", -9: "time limit"}


def _code(rc) -> str:
    return _CODES.get(rc, f"exit {rc}")


# One run, inside the sandbox under its own uid, by the image's python3 (standard library only).
# Request on stdin: {"files": {rel: text}, "tests": [rel], "module": rel, "examples": None |
# {"entry", "args": [repr of a tuple]} (report the outputs) | {..., "expect": [...]} (compare
# with them), "nonce"}. Exit: 0 passed (answer {"nonce", "outputs"} on stdout), 1 an assertion
# failed, 2 an error, 3 the request was refused, 4 a test takes arguments, 5 no test functions,
# 6 an example's output differs; the executor reports -9 for a run killed at its time limit.
CHILD = r'''
import ast, importlib.util, inspect, json, os, sys, tempfile
req = json.loads(sys.stdin.buffer.read())
nonce = req.pop("nonce")
where = os.path.realpath(tempfile.mkdtemp(prefix="paddock-exec-"))
for rel, text in req["files"].items():
    path = os.path.realpath(os.path.join(where, rel))
    if not path.startswith(where + os.sep):
        os._exit(3)
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "w") as f:
        f.write(text)
said = os.dup(1)
null = os.open(os.devnull, os.O_RDWR)
for fd in (0, 1, 2):
    os.dup2(null, fd)
os.chdir(where)
sys.path.insert(0, where)

def norm(x, depth=0):
    if depth > 20:
        return "..."
    if isinstance(x, float):
        return repr(round(x, 6))
    if isinstance(x, (list, tuple)):
        return "[" + ", ".join(norm(v, depth + 1) for v in x) + "]"
    if isinstance(x, (set, frozenset)):
        return "{" + ", ".join(sorted(norm(v, depth + 1) for v in x)) + "}"
    if isinstance(x, dict):
        return "{" + ", ".join(sorted(norm(k, depth + 1) + ": " + norm(v, depth + 1) for k, v in x.items())) + "}"
    return repr(x)

try:
    ran = 0
    for n, rel in enumerate(req["tests"]):
        spec = importlib.util.spec_from_file_location(f"paddock_exec_test_{n}", os.path.join(where, rel))
        mod = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(mod)
        for name, fn in list(vars(mod).items()):
            if not (name.startswith("test") and inspect.isfunction(fn) and fn.__module__ == mod.__name__):
                continue
            if any(p.default is p.empty and p.kind not in (p.VAR_POSITIONAL, p.VAR_KEYWORD)
                   for p in inspect.signature(fn).parameters.values()):
                os._exit(4)
            fn()
            ran += 1
    if not ran:
        os._exit(5)
    ex, outputs = req.get("examples"), None
    if ex:
        f = getattr(importlib.import_module(req["module"][:-3]), ex["entry"])
        outputs = []
        for args in ex["args"]:
            try:
                outputs.append(norm(f(*ast.literal_eval(args))))
            except BaseException:
                outputs.append(None)
        if "expect" in ex:
            if any(e is not None and e != o for e, o in zip(ex["expect"], outputs)):
                os._exit(6)
            outputs = None
    os.write(said, (json.dumps({"nonce": nonce, "outputs": outputs}) + "\n").encode())
    os._exit(0)
except AssertionError:
    os._exit(1)
except BaseException:
    os._exit(2)
'''
