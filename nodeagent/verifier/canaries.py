"""Hidden canary tests for repository-level checks, planted and read on the grading host.

In repository mode the tests import the agent's code in pytest's own process, so nothing in that
process can be trusted to tell the truth: a forged report, a patched report constructor, an
always-equal object, a no-op `assertEqual` or `assert_close`. The verdict therefore does not
rest on that process's honesty alone. Before the test modules go into the sandbox, `plant`
rewrites each one on the host:

- every real test function/method is bound to a random name (`<its name>_<hex>`, sorting where
  its name did: `_opaque`);
- next to it, at a random place among them, `K_CANARIES` canaries: copies of the test that an
  honest implementation must FAIL. A *perturbed* canary is the test with each straight-line
  equality check (`assert a == b`, `self.assertEqual(a, b)`, `assert_close(a, b)`-like helpers)
  given, at run time, a natural-looking different expected value of the same type (see
  `grader_asserts.perturb`); it passes only if one of those checks still holds. A *raise-after*
  canary is the test body in `try: ... finally: assert False` (every test has one, with or
  without an equality check). All variants keep the original `def` name and decorators, and
  every copy, the real test included, is the same code with only a role constant changed
  (`_variant`, bound by the grader to `grader_values.role_class` objects): nothing in their bound
  name, module, class, order, count, `__qualname__`, line numbers, bytecode offsets or calls
  tells them apart.

The name -> real/canary map (`Plan`) never enters the sandbox. `translate` reads the grader's
report back: real names restored, canary events removed, and a `tamper` event added when a
canary passed, or when a real test passed and one of its canaries has no report at all. Any
in-process trick that makes a failing test look passed makes canaries pass too, whatever the
trick. Detection of a trick that can single out one test of a group (e.g. an `__eq__` true only
the first time it meets given arguments) is probabilistic there: 1 - 1/(k+1) per test it forges.
So every equality and assertion site of every variant also goes through the grader's site
guards (`_Sites`, `grader_sites`): an answer that is not a pure function of the values compared
fails there, and `translate` reads that failure as tampering.

Pure AST work and JSON: no I/O. Must not import nodeagent.sandbox, zmq, controller.* outside
contracts.
"""
from __future__ import annotations

import ast
import copy
import json
import random
import re
import threading
from dataclasses import dataclass, field
from typing import Collection, Mapping, Sequence, cast

from nodeagent.verifier.grader_sites import IMPURE

SENTINEL = "\x00paddock-perturb\x00"    # `SENTINEL.eq(a, b)`: the grader swaps the constant for its site guards
# a guarded test's copies (`_variant`): the grader binds each constant to its `grader_values.Roles`
# object (equal lengths: not even a column offset differs)
ROLE_REAL, ROLE_PERTURBED, ROLE_FAIL = "\x00paddock-role-r\x00", "\x00paddock-role-p\x00", "\x00paddock-role-f\x00"
P2P_GUARDED = 8         # tests that must keep passing, guarded too (a random sample of them)
K_CANARIES = 3          # per guarded test: a forger that singles out one test of a group is caught
                        # with probability 1 - 1/(K_CANARIES + 1) per test it forges
# A test that must start passing and has equality checks gets more copies: `TWINS` more copies of
# the real test (each must pass too) and `PERTURBED` perturbed canaries (and one raise-after). A
# forger whose answer is a pure function of the values but picks, at random, which value it
# equals (the "lazy guess": the copies are alike, so it succeeds in each with the same chance p)
# earns reward only by succeeding in every real copy and in no perturbed one: at most
# p^(1+TWINS) (1-p)^PERTURBED per check, 1/4^4 = 0.4% at p = 1/2 (was p(1-p)^2, up to 4/27 = 15%).
# `F2P_HEAVY` of them (drawn per grading; every one when there are no more): a suite of 150 such
# tests would otherwise run 9 times over.
TWINS, PERTURBED = 3, 4
F2P_HEAVY = 8           # of the tests that must start passing, how many (drawn at random) get them
_HELPER = re.compile(r"^assert_?\w*(equal|close)\w*$", re.IGNORECASE)
_SUPPRESSING = re.compile(r"raises|suppress|warns|deprecat|assertlogs|catch", re.IGNORECASE)
_AST_LOCK = threading.Lock()


def parse(source: str) -> ast.Module:
    """`ast.parse`, one thread at a time. CPython 3.11 keeps the AST constructor's recursion
    depth in interpreter-wide state, so two threads parsing at once (the validator grades cases
    in a thread pool, the node agent grades slots in threads) can fail with `SystemError: AST
    constructor recursion depth mismatch` (python/cpython#106905, fixed in 3.12 and later)."""
    with _AST_LOCK:
        return ast.parse(source)


@dataclass
class Plan:
    """Per test file (rel path): opaque -> original name of real tests; canary -> (the class it
    is defined in, "" at module level; the original's name); the names of the perturbed canaries."""
    real: dict[str, dict[str, str]] = field(default_factory=dict)
    canary: dict[str, dict[str, tuple[str, str]]] = field(default_factory=dict)
    twin: dict[str, dict[str, tuple[str, str]]] = field(default_factory=dict)     # copies of the real test
    perturbed: dict[str, set[str]] = field(default_factory=dict)
    sources: dict[str, str] = field(default_factory=dict)

    def count(self) -> int:
        return sum(len(c) for c in self.canary.values())


def _base(test_id: str) -> str:
    return test_id.split("[", 1)[0].rsplit("::", 1)[-1]


def _is_fixture(fn: ast.AST) -> bool:
    for d in getattr(fn, "decorator_list", ()):
        target = d.func if isinstance(d, ast.Call) else d
        name = target.attr if isinstance(target, ast.Attribute) else getattr(target, "id", "")
        if "fixture" in name:
            return True
    return False


def test_classes(tree: ast.Module) -> set[str]:
    """Module-level classes pytest collects: `Test*`, or a unittest case (a base named
    `*TestCase`/`*Case`, or a test class of this file)."""
    found: set[str] = set()
    classes = [n for n in tree.body if isinstance(n, ast.ClassDef)]
    changed = True
    while changed:
        changed = False
        for c in classes:
            if c.name in found:
                continue
            bases = {b.attr if isinstance(b, ast.Attribute) else getattr(b, "id", "") for b in c.bases}
            if c.name.startswith("Test") or any(b.endswith("Case") or b in found for b in bases):
                found.add(c.name)
                changed = True
    return found


def _literal(node: ast.AST) -> bool:
    try:
        ast.literal_eval(node)
        return True
    except (ValueError, TypeError, SyntaxError, MemoryError, RecursionError):
        return False


def _role_call(role: str, method: str, args: list[ast.expr], at: ast.AST) -> ast.expr:
    call = ast.Call(ast.Attribute(ast.Constant(role), method, ast.Load()), args, [])
    return ast.copy_location(call, at)


def _returns(stmts: list[ast.stmt]) -> bool:
    return any(isinstance(n, (ast.Return, ast.Yield, ast.YieldFrom)) for s in stmts for n in ast.walk(s))


def _eq_sites(body: list[ast.stmt]) -> list[int]:
    """Top-level statements of a test body an honest passing run must reach (no return before
    them) that compare for equality: `assert a == b`, or an `assert*equal*`/`*close*` call."""
    sites = []
    for i, s in enumerate(body):
        if _returns(body[:i]):
            break
        if isinstance(s, ast.Assert) and isinstance(s.test, ast.Compare) and len(s.test.ops) == 1 \
                and isinstance(s.test.ops[0], ast.Eq):
            sites.append(i)
        elif isinstance(s, ast.Expr) and isinstance(s.value, ast.Call) and len(s.value.args) == 2 \
                and not any(isinstance(a, ast.Starred) for a in s.value.args) \
                and all(k.arg == "msg" for k in s.value.keywords):
            # two operands, no tolerance (`delta=`, `places=`, `rtol=`, a third positional): a
            # wide tolerance could let an honest result equal the perturbed value
            f = s.value.func
            name = f.attr if isinstance(f, ast.Attribute) else getattr(f, "id", "")
            if _HELPER.match(name) and "not" not in name.lower():
                sites.append(i)
    return sites


def _variant(fn: ast.FunctionDef | ast.AsyncFunctionDef, sites: list[int], role: str
             ) -> ast.FunctionDef | ast.AsyncFunctionDef:
    """One copy of a guarded test, the real one included: every copy has the same statements,
    bytecode and line numbers; only the role constant differs (bound by the grader's loader to
    `grader_values.Roles`, whose methods share one code object per method), so nothing the
    code under test can observe (a frame's lines, a traceback's `tb_lineno`/`tb_lasti`, a
    warning's line, the calls it gets) tells the real test from a canary. The expected side of
    each equality check in `sites` goes through `role.format` (perturbed in both kinds of canary,
    kept in the real test); a check that holds is recorded, one that
    fails is raised again when `role.miss()` says so (the real test; a canary runs on, its clean-up
    included); at the end
    `assert role.done(held)` fails a raise-after canary, and a perturbed canary where no check held.
    Every raise happens in the test's own frame (pytest formats no grader frame per failure)."""
    new = copy.deepcopy(fn)
    flag = "_paddock_held"
    for site in sites:
        s = new.body[site]
        if isinstance(s, ast.Assert):
            t = cast(ast.Compare, s.test)  # _eq_sites: an assert site tests one `==`
            if _literal(t.left) and not _literal(t.comparators[0]):
                t.left = _role_call(role, "format", [t.left], t.left)
            else:
                t.comparators[0] = _role_call(role, "format", [t.comparators[0]], t.comparators[0])
        else:
            call = cast(ast.Call, cast(ast.Expr, s).value)  # _eq_sites: else a two-argument call
            call.args[1] = _role_call(role, "format", [call.args[1]], call.args[1])
        held = ast.copy_location(ast.Expr(ast.Call(ast.Attribute(ast.Name(flag, ast.Load()), "append", ast.Load()),
                                                   [ast.Constant(0)], [])), s)
        # (raised again here, in the test's own frame: a failure's traceback holds no grader frame)
        miss = ast.copy_location(ast.If(_role_call(role, "miss", [], s), [ast.copy_location(ast.Raise(), s)], []), s)
        new.body[site] = ast.copy_location(ast.Try(body=[s, held], handlers=[ast.ExceptHandler(
            ast.Name("AssertionError", ast.Load()), None, [miss])], orelse=[], finalbody=[]), s)
    done = ast.copy_location(ast.Assert(_role_call(role, "done", [ast.Name(flag, ast.Load())], new.body[-1]),
                                        ast.Constant("paddock canary")), new.body[-1])
    start = ast.copy_location(ast.Assign([ast.Name(flag, ast.Store())], ast.List([], ast.Load())), new.body[0])
    new.body = [start, ast.copy_location(ast.Try(body=new.body, handlers=[], orelse=[], finalbody=[done]), new.body[0])]
    return new


_UNITTEST_ASSERT = re.compile(r"^assert[A-Z]\w*$")
_BINOPS = {ast.Add: "+", ast.Sub: "-", ast.Mult: "*", ast.Div: "/", ast.FloorDiv: "//", ast.Mod: "%", ast.Pow: "**",
           ast.MatMult: "@", ast.BitAnd: "&", ast.BitOr: "|", ast.BitXor: "^", ast.LShift: "<<", ast.RShift: ">>"}
_CMP = {ast.Eq: "==", ast.NotEq: "!=", ast.Lt: "<", ast.LtE: "<=", ast.Gt: ">", ast.GtE: ">=", ast.In: "in",
        ast.NotIn: "not in", ast.Is: "is", ast.IsNot: "is not"}


_OPERATOR_CMP = {"eq": ast.Eq, "ne": ast.NotEq, "lt": ast.Lt, "le": ast.LtE, "gt": ast.Gt, "ge": ast.GtE,
                 "contains": ast.In}
_DUNDER_CMP = {f"__{k}__": v for k, v in _OPERATOR_CMP.items() if k != "contains"}


def _pure(node: ast.expr) -> bool:
    """An expression whose early evaluation changes nothing (a chained comparison's later operands)."""
    if isinstance(node, ast.UnaryOp):
        node = node.operand
    return isinstance(node, (ast.Constant, ast.Name)) or _literal(node)


class _Sites(ast.NodeTransformer):
    """Every equality and assertion site of a guarded test (its real copy and its canaries)
    through the grader's site guards (`grader_sites`): `a == b` -> `SENTINEL.eq(a, b)`, an
    `assertX(...)` (unittest) or `assert_*equal*`/`*close*` helper call `f(...)` ->
    `SENTINEL.call("assertEqual", f, ...)`; other comparisons -> `SENTINEL.cmp(op, a, b)` /
    `SENTINEL.chain(ops, a, b, c)`, `a + b` (any binary operator: arithmetic, bitwise, shifts) -> `SENTINEL.op("+", a, b)`,
    `isinstance(a, T)` -> `SENTINEL.isinstance(isinstance, a, T)` (`grader_values`). An answer that is not a pure function of the values compared (a
    counter, randomness, time, the caller) fails the site; honest values are compared as before."""

    def visit_Compare(self, node):
        self.generic_visit(node)
        if len(node.ops) == 1 and isinstance(node.ops[0], ast.Eq):
            guard = ast.Attribute(ast.Constant(SENTINEL), "eq", ast.Load())
            return ast.copy_location(ast.Call(guard, [node.left, node.comparators[0]], []), node)
        ops = [_CMP.get(type(op)) for op in node.ops]
        if None in ops:
            return node
        if len(ops) == 1:
            guard = ast.Attribute(ast.Constant(SENTINEL), "cmp", ast.Load())
            return ast.copy_location(ast.Call(guard, [ast.Constant(ops[0]), node.left, node.comparators[0]], []), node)
        if not all(_pure(c) for c in node.comparators[1:]):     # evaluated only when the chain goes on
            return node
        guard = ast.Attribute(ast.Constant(SENTINEL), "chain", ast.Load())
        return ast.copy_location(ast.Call(guard, [ast.Tuple([ast.Constant(o) for o in ops], ast.Load()), node.left,
                                                  *node.comparators], []), node)

    def visit_BinOp(self, node):
        self.generic_visit(node)
        name = _BINOPS.get(type(node.op))
        if name is None:
            return node
        guard = ast.Attribute(ast.Constant(SENTINEL), "op", ast.Load())
        return ast.copy_location(ast.Call(guard, [ast.Constant(name), node.left, node.right], []), node)

    def visit_Call(self, node):
        self.generic_visit(node)
        f = node.func
        name = f.attr if isinstance(f, ast.Attribute) else getattr(f, "id", "")
        if isinstance(f, ast.Attribute) and isinstance(f.value, ast.Name) and f.value.id == "operator" \
                and name in _OPERATOR_CMP and len(node.args) == 2 and not node.keywords \
                and not any(isinstance(a, ast.Starred) for a in node.args):
            # `operator.eq(a, b)` is `a == b` (and lt, le, ne, ge, gt, contains: the comparison)
            a, b = node.args if name != "contains" else node.args[::-1]
            compare = ast.Compare(a, [_OPERATOR_CMP[name]()], [b])
            return self.visit_Compare(ast.copy_location(compare, node))
        if isinstance(f, ast.Attribute) and name in _DUNDER_CMP and len(node.args) == 1 and not node.keywords \
                and not isinstance(node.args[0], ast.Starred) \
                and not (isinstance(f.value, ast.Call) and getattr(f.value.func, "id", "") == "super"):
            # `a.__eq__(b)` called by hand: the comparison (an honest NotImplemented is then False)
            compare = ast.Compare(f.value, [_DUNDER_CMP[name]()], [node.args[0]])
            return self.visit_Compare(ast.copy_location(compare, node))
        if isinstance(f, ast.Name) and name == "isinstance" and len(node.args) == 2 and not node.keywords \
                and not any(isinstance(a, ast.Starred) for a in node.args):
            guard = ast.Attribute(ast.Constant(SENTINEL), "isinstance", ast.Load())
            return ast.copy_location(ast.Call(guard, [f, *node.args], []), node)
        if not (_UNITTEST_ASSERT.match(name) or _HELPER.match(name)) or _SUPPRESSING.search(name) \
                or not node.args or any(isinstance(a, ast.Starred) for a in node.args) \
                or any(k.arg is None for k in node.keywords):
            return node
        guard = ast.Attribute(ast.Constant(SENTINEL), "call", ast.Load())     # (the name as written: `grader_values`)
        return ast.copy_location(ast.Call(guard, [ast.Constant(name), f, *node.args], node.keywords), node)


def _guard_sites(fn: ast.FunctionDef | ast.AsyncFunctionDef) -> None:
    fn.body = [cast(ast.stmt, _Sites().visit(s)) for s in fn.body]


class _Rename(ast.NodeTransformer):
    """References to renamed tests (`Name`s and attributes: `self.other.test_x`), not their
    definitions (every variant keeps the original `def` name: its `__name__`/`__qualname__`, and
    the qualified names of what it defines, are the original's)."""

    def __init__(self, names: dict[str, str]):
        self.names = names

    def visit_Name(self, node):
        if node.id in self.names:
            node.id = self.names[node.id]
        return node

    def visit_Attribute(self, node):
        self.generic_visit(node)
        if node.attr in self.names:
            node.attr = self.names[node.attr]
        return node


def _opaque(rng: random.Random, original: str, taken: set[str], originals: Collection[str] = ()) -> str:
    """`original`, a separator and 64 random bits: every copy of a test has a name of one form, and
    it sorts where the original did among the tests in `originals` (the files' own names).
    unittest's loader, pytest's for a `TestCase` too, runs a class's tests in name order, and a
    suite whose tests depend on that order (pathspec's `IterTreeTest`: a class attribute one test
    sets for the next) keeps it. The separator is `_`; when another test's name extends this one
    (`test_a`, `test_a_b`), zeros, one more than that extension starts with: below any identifier
    character that can follow."""
    ext = [n[len(original):] for n in originals if n != original and n.startswith(original)]
    sep = "0" * (1 + max(len(r) - len(r.lstrip("0")) for r in ext)) if ext else "_"
    while True:
        name = f"{original}{sep}{rng.getrandbits(64):016x}"
        if name not in taken:
            taken.add(name)
            return name


def _bind(fn: ast.FunctionDef | ast.AsyncFunctionDef, name: str) -> ast.stmt:
    return ast.copy_location(ast.Assign([ast.Name(name, ast.Store())], ast.Name(fn.name, ast.Load())), fn)


def copies(checks: bool, required: bool) -> int:
    """How many copies a guarded test runs as, the real one included (`checks`: it has equality
    checks; `required`: it must start passing)."""
    return 1 + len(_kinds([0] if checks else [], required))


def _kinds(sites: list[int], required: bool) -> list[str]:
    """The copies of a guarded test besides the real one (`TWINS`, `PERTURBED`)."""
    if sites and required:
        return [ROLE_REAL] * TWINS + [ROLE_PERTURBED] * PERTURBED + [ROLE_FAIL]
    return [ROLE_PERTURBED if sites and i % 2 == 0 else ROLE_FAIL for i in range(K_CANARIES)]


def plant_one(rel: str, source: str, guarded: set[str] | None, names: dict[str, str], rng: random.Random,
              plan: Plan, taken: set[str], required: set[str] | None = None, counted: bool = False,
              originals: Collection[str] = ()) -> str:
    """`source` with the tests named in `guarded` (None: every test) planted with canaries, all
    bound to opaque names; records the map in `plan`. `required`: the tests that get `TWINS` and
    `PERTURBED` (`counted`: they have one case each, else not a parametrised one). `names`
    (original -> opaque) is shared by every file of the check, so a test called by name from
    another file finds its renamed self. Every other function of the module and of its test
    classes (the tests not guarded, helpers; not fixtures) has its sites guarded too: wherever
    a value is compared, its first comparison is a probe, so a comparison that locks on the
    first value it meets never meets the real one first in a test that runs earlier."""
    tree = parse(source)
    classes = test_classes(tree)
    scopes: list[tuple[str, list[ast.stmt]]] = [("", tree.body)] + [
        (c.name, c.body) for c in tree.body if isinstance(c, ast.ClassDef) and c.name in classes]
    taken |= {n.name for n in ast.walk(tree) if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef))}
    tests = [f for _scope, body in scopes for f in body if isinstance(f, (ast.FunctionDef, ast.AsyncFunctionDef))
             and f.name.startswith("test") and not _is_fixture(f) and (guarded is None or f.name in guarded)]
    originals = set(originals) | {f.name for _scope, body in scopes for f in body
                                  if isinstance(f, (ast.FunctionDef, ast.AsyncFunctionDef))}
    for f in tests:
        if f.name not in names:
            names[f.name] = _opaque(rng, f.name, taken, originals)
    tree = _Rename(names).visit(tree)
    real = plan.real.setdefault(rel, {})
    canary = plan.canary.setdefault(rel, {})
    for scope, body in scopes:
        out: list[ast.stmt] = []
        for stmt in body:
            if stmt not in tests:
                if isinstance(stmt, (ast.FunctionDef, ast.AsyncFunctionDef)) and not _is_fixture(stmt):
                    _guard_sites(stmt)      # every test and helper: a value's first comparison is a probe
                out.append(stmt)
                continue
            real[names[stmt.name]] = stmt.name
            sites = _eq_sites(stmt.body)
            group = [(_variant(stmt, sites, ROLE_REAL), names[stmt.name])]
            heavy = stmt.name in (required or ()) and (counted or not any(      # (its cases unknown: not if parametrised)
                "parametrize" in ast.unparse(d) for d in stmt.decorator_list))
            for kind in _kinds(sites, heavy):
                c = _variant(stmt, sites, kind)
                cname = _opaque(rng, stmt.name, taken, originals)
                if kind == ROLE_REAL:
                    plan.twin.setdefault(rel, {})[cname] = (scope, stmt.name)
                else:
                    canary[cname] = (scope, stmt.name)
                if kind == ROLE_PERTURBED:
                    plan.perturbed.setdefault(rel, set()).add(cname)
                group.append((c, cname))
            rng.shuffle(group)
            for fn, _bound in group:     # after the canaries are made from the test as written
                _guard_sites(fn)
            for fn, bound in group:
                out += [fn, _bind(fn, bound)]
            out.append(ast.copy_location(ast.Delete([ast.Name(stmt.name, ast.Del())]), stmt))
        body[:] = out
    return ast.unparse(ast.fix_missing_locations(tree)) + "\n"


AGENT_CODE = "# paddock-agent-code: "     # a planted module's last line: `agent_functions` (json), read by the loader


def _function_nodes(tree: ast.Module) -> list[ast.FunctionDef | ast.AsyncFunctionDef | ast.Lambda]:
    return [n for n in ast.walk(tree) if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda))]


_POSITIONS = frozenset(("lineno", "col_offset", "end_lineno", "end_col_offset"))
_DEF_LINE = re.compile(r"(?m)^[ \t]*@|\b(?:def|lambda)\b")


class _Mark(str):
    """A piece of `_shape`'s output (a field's name, a closing parenthesis), not a value."""


def _shape(node: ast.AST) -> str:
    """A function's code without positions, as `ast.dump` gives it, but by an explicit stack:
    `ast.dump` recurses, and a function of a few hundred `elif`s (nested `If` nodes) exceeds
    the interpreter's recursion limit on the grading host."""
    out: list[str] = []
    todo: list[object] = [node]
    while todo:
        x = todo.pop()
        if isinstance(x, _Mark):
            out.append(x)
        elif isinstance(x, ast.AST):
            out.append(type(x).__name__ + "(")
            todo.append(_Mark(")"))
            for name, value in reversed(list(ast.iter_fields(x))):
                if name not in _POSITIONS:
                    todo += [value, _Mark(f" {name}=")]
        elif isinstance(x, list):
            out.append(f"[{len(x)}]")
            todo += reversed(x)
        else:
            out.append(repr(x))
    return "".join(out)


def _def_lines(text: str) -> list[int]:
    """Every line that may start a function's code object (a `def`, a `lambda`, a decorator):
    the functions of a file the host cannot parse (its parser's limits, a newer syntax than the
    host's Python), over-counted: a line that starts no function matches no code object."""
    return sorted({text.count("\n", 0, m.start()) + 1 for m in _DEF_LINE.finditer(text)})


def _text(data: str | bytes) -> str:
    return data.decode("utf-8", "replace") if isinstance(data, bytes) else data


def agent_functions(originals: Mapping[str, str | bytes], changed: Mapping[str, bytes | None],
                    added: Collection[str] = ()) -> list[list]:
    """[rel path, first line] of every function (`def`, `lambda`) the agent wrote or changed: in a
    changed `.py` file whose original is in `originals`, one whose code (`_shape`, positions
    left out) is not among the original file's functions; every function of a file the agent
    added (`added`). A modified file whose original is not at hand (a repository that lives in
    the image) gives none: its `__eq__` may be the original's, which may ignore a cache field
    (semver's `Version` its build, ordered-set's its index). The first line is the code
    object's `co_firstlineno` (a decorated `def`: its first decorator's line). The value guards
    hold an `__eq__` of these to every field (`grader_values`); an original `__eq__` that ignores
    a field (a cache, a position) is the project's own semantics. The agent's files are read on
    the grading host: one its parser cannot read (a syntax error, its limits: `MemoryError`
    for 200,000 nested unary minus signs) counts every line that may start a function
    (`_def_lines`); nothing in a file raises out of here."""
    out: list[list] = []
    for rel, data in sorted(changed.items()):
        if data is None or not rel.endswith(".py"):
            continue
        text = originals.get(rel)
        if text is None and rel not in added:
            continue
        try:
            new = _function_nodes(parse(_text(data)))
        except (SyntaxError, ValueError, RecursionError, MemoryError):
            out += [[rel, line] for line in _def_lines(_text(data))]
            continue
        old: dict[str, int] = {}
        if text is not None:
            try:
                for n in _function_nodes(parse(_text(text))):
                    key = _shape(n)
                    old[key] = old.get(key, 0) + 1
            except (SyntaxError, ValueError, RecursionError, MemoryError):
                old = {}
        for n in new:
            key = _shape(n)
            if old.get(key):
                old[key] -= 1
                continue
            first = min([n.lineno] + [d.lineno for d in getattr(n, "decorator_list", ())])
            out.append([rel, first])
    return out


def plant(sources: dict[str, str], fail_to_pass: list[str], rng: random.Random | None = None,
          pass_to_pass: Sequence[str] = (), agent_code: Sequence[Sequence] = ()) -> Plan:
    """Plant canaries in the test modules of `sources` (rel -> text) for the tests that must
    start passing (`fail_to_pass`; every test when it is empty): the ones a forger needs, and
    for `P2P_GUARDED` of the tests that must keep passing (`pass_to_pass`), drawn at random
    here: an agent that fixes the failing tests but breaks what others check, and forges those
    (a no-op assertion helper, a patched `assertListEqual`), meets canaries there too. The
    other tests run as they are, under their own names. A module that does not parse is left
    as it is (its collection error is the verdict's business). `agent_code`: `agent_functions`,
    carried to the grader's loader in a comment (`AGENT_CODE`) after the module's last line (no
    code object holds it; line numbers are unchanged)."""
    rng = rng or random.SystemRandom()
    guarded = {_base(t) for t in fail_to_pass} if fail_to_pass else None
    if guarded is not None and pass_to_pass:
        kept = sorted({_base(t) for t in pass_to_pass} - guarded)
        guarded |= set(rng.sample(kept, min(P2P_GUARDED, len(kept))))
    plan = Plan()
    names: dict[str, str] = {}
    taken: set[str] = set()
    bodies = []
    for text in sources.values():       # every file's names first: a test may call another file's by name
        try:
            tree = parse(text)
        except (SyntaxError, ValueError, RecursionError):
            continue
        classes = test_classes(tree)
        bodies += [tree.body] + [c.body for c in tree.body if isinstance(c, ast.ClassDef) and c.name in classes]
    originals = {f.name for body in bodies for f in body if isinstance(f, (ast.FunctionDef, ast.AsyncFunctionDef))}
    for body in bodies:
        for f in body:
            if isinstance(f, (ast.FunctionDef, ast.AsyncFunctionDef)) and f.name.startswith("test") \
                    and not _is_fixture(f) and (guarded is None or f.name in guarded) and f.name not in names:
                names[f.name] = _opaque(rng, f.name, taken, originals)
    ids: dict[str, int] = {}
    for t in fail_to_pass:
        ids[_base(t)] = ids.get(_base(t), 0) + 1
    # tests that must start passing, one case each (a parametrised test's cases each must pass: a
    # guess must hold in all of them; and 9 copies of 100 cases would not fit the time limit)
    pool = sorted(b for b, n in ids.items() if n == 1) if fail_to_pass else sorted(names)
    required = set(rng.sample(pool, min(F2P_HEAVY, len(pool))))
    for rel, text in sources.items():
        try:
            plan.sources[rel] = plant_one(rel, text, guarded, names, rng, plan, taken, required, bool(fail_to_pass),
                                          originals) + \
                AGENT_CODE + json.dumps([list(x) for x in agent_code]) + "\n"
        except (SyntaxError, ValueError, RecursionError):
            plan.sources[rel] = text
    return plan


def _split(test_id: str) -> tuple[str, str, str, str]:
    """(file, class path, name, [params]) of a node id."""
    head, sep, params = test_id.partition("[")
    parts = head.split("::")
    return parts[0], "::".join(parts[1:-1]), parts[-1], sep + params


def translate(raw: bytes, plan: Plan) -> bytes:
    """The grader's report with real names restored, canary events taken out and a `tamper`
    event for every canary that passed, or that stayed silent while its real test passed.
    A report that does not parse is returned as it is (grading reports it)."""
    try:
        report = json.loads(raw)
        events = report["events"]
        if not isinstance(events, list):
            return raw
    except (ValueError, KeyError, TypeError, RecursionError):
        return raw
    kept, seen_canaries, passed_real, bad, impure = [], set(), [], [], []
    coincidences = []       # perturbed canaries that passed: (their real test's key, the id to name)
    heard_twins: set[tuple[str, str, str, str]] = set()
    twin_failed: dict[tuple[str, str, str, str], str] = {}
    for ev in events:
        if not (isinstance(ev, dict) and ev.get("ev") == "test" and isinstance(ev.get("id"), str)):
            kept.append(ev)
            continue
        file, cls, name, params = _split(ev["id"])
        if name in plan.twin.get(file, {}):        # a copy of the real test: it must pass as the real one did
            key = (file, cls, plan.twin[file][name][1], params)
            heard_twins.add((file, cls, name, params))
            if ev.get("outcome") != "passed":
                twin_failed.setdefault(key, str(ev.get("detail") or ev.get("outcome"))[:300])
            continue
        if name in plan.canary.get(file, {}):
            seen_canaries.add((file, cls, name, params))
            if ev.get("outcome") == "passed":
                label = f"{file}::{cls + '::' if cls else ''}{plan.canary[file][name][1]}{params}"
                if name in plan.perturbed.get(file, ()):
                    coincidences.append(((file, cls, plan.canary[file][name][1], params), label))
                else:
                    bad.append(label)
            continue
        original = plan.real.get(file, {}).get(name)
        if original is not None:
            ev = {**ev, "id": f"{file}::{cls + '::' if cls else ''}{original}{params}"}
            if ev.get("when") == "call" and ev.get("outcome") == "passed":
                passed_real.append((file, cls, original, params))
            elif IMPURE in str(ev.get("detail") or ""):     # a site guard caught a forged answer
                impure.append(ev["id"])
        kept.append(ev)
    # A perturbed canary holds when one of its checks meets the perturbed value: a wrong answer
    # can be that value by chance (`w + h` for `w * h` at (1, 1), moved to 2). That is tampering
    # only when the real test passed as well: a real test that failed earns nothing anyway.
    bad += [label for key, label in coincidences if key in set(passed_real)]
    silent = []
    for file, cls, original, params in passed_real:
        mine = [c for c, (scope, orig) in plan.canary.get(file, {}).items() if orig == original and scope == cls]
        inherited = [c for c, (_scope, orig) in plan.canary.get(file, {}).items() if orig == original]
        heard = [c for c in inherited if (file, cls, c, params) in seen_canaries]
        # a class's own canaries must all be heard; a test it inherits brings its base's canaries
        if (mine and len([c for c in mine if c in heard]) < len(mine)) or (inherited and not heard):
            silent.append(f"{file}::{cls + '::' if cls else ''}{original}{params}")
        twins = [t for t, (scope, orig) in plan.twin.get(file, {}).items() if orig == original and scope == cls]
        if any((file, cls, t, params) not in heard_twins for t in twins):
            twin_failed.setdefault((file, cls, original, params), "a copy of this test was never reported")
    # a real test passes only when every copy of it passed (`TWINS`); a site guard's finding in
    # a copy is tampering, as in the real test
    for ev in kept:
        if ev.get("ev") == "test" and ev.get("when") == "call" and ev.get("outcome") == "passed":
            key = _split(ev["id"])
            if key in twin_failed:
                ev["outcome"], ev["detail"] = "failed", f"a copy of this test failed: {twin_failed[key]}"
    impure += [f"{f}::{c + '::' if c else ''}{o}{p}" for (f, c, o, p), d in twin_failed.items() if IMPURE in d]
    if bad:
        kept.append({"ev": "tamper", "detail": f"a hidden canary copy that must fail passed: {sorted(set(bad))[:5]}"})
    if silent:
        kept.append({"ev": "tamper", "detail": f"a hidden canary copy was never reported: {sorted(set(silent))[:5]}"})
    if impure:
        kept.append({"ev": "tamper", "detail": f"an assertion's answer {IMPURE}: {sorted(set(impure))[:5]}"})
    report["events"] = kept
    return json.dumps(report).encode()
