"""Paddock's in-sandbox assert helpers (installed read-only at /verifier/paddock_asserts.py).

The grader (`grader_plugin.py`, `paddock_grader` in the sandbox) loads this file by path in the
pytest child before any code under test runs, as `paddock_asserts`. It holds what the grader's
loader compiles into the test modules: `honest_eq` (an `assert a == b` of a test module, through
`HonestAsserts`), the image's pytest plugins a repository's configuration may need
(`image_plugins`, found before the grader seals its imports) and the canaries' perturber (`perturb`, bound into compiled canary code by
`bind_perturber`: see `nodeagent.verifier.canaries`). `trusted_function` asks the grader's audit
hook, through an audit event, whether a function's code is trusted.

Standard library only at import (it runs inside the task's image). Must not import: anything of
Paddock, pytest.
"""

import ast
import os
import sys

TRUSTED_EVENT = "paddock.trusted"


def trusted_function(fn, _audit=sys.audit, _list=list):
    """Is `fn` a function whose code the audit hook trusts? Asked through an audit event: the
    hook's state (its re-entrancy set, its trusted prefixes) lives only in its own closure,
    which nothing reachable from Python shares (a closure cell the test process could reach
    could be rewritten to switch the hook off)."""
    out = _list()
    _audit(TRUSTED_EVENT, fn, out)
    return out == [True]


_PLAIN = frozenset({int, float, complex, bool, str, bytes, bytearray, type(None), list, tuple, dict, set,
                    frozenset, range})


def _perturbed(y):
    """A value of y's own builtin type that differs from y (None when there is no such value)."""
    t, new = type(y), None
    if t is bool:
        new = not y
    elif t in (int, float, complex):
        new = y + 1
    elif t is str:
        new = y + "\u2063"
    elif t in (bytes, bytearray):
        new = y + b"\0"
    elif t in (list, tuple):
        new = y + t((object(),))
    elif t is dict:
        new = {**y, object(): None}
    elif t in (set, frozenset):
        new = y | {object()}
    return None if new is None or new == y else new


def _truthy(v):
    try:
        return bool(v)
    except Exception:
        return False


_trusted_function = trusted_function     # the judge `_suspect` consults (replaceable in host tests)


def _suspect(x):
    """x's == is neither a builtin's nor trusted code's: it is the code under test's to define."""
    if type(x) in _PLAIN:
        return False
    eq = getattr(type(x), "__eq__", None)
    if type(eq).__name__ == "wrapper_descriptor":      # C: a builtin or extension type's own slot
        return False
    return not (_trusted_function is not None and _trusted_function(eq))


def honest_eq(a, b):
    """`assert a == b` as Python computes it (a project's own types keep their own equality),
    except that an object whose == the code under test defines must not also equal what no honest
    value equals: a fresh `object()`, or a perturbed copy of a builtin value on the other side.
    Test modules loaded by the grader have their `assert x == y` compiled to this."""
    result = a == b
    if not result:
        return result
    for x, y in ((a, b), (b, a)):
        if not _suspect(x):
            continue
        probe = object()
        twin = _perturbed(y) if type(y) in _PLAIN else None
        if _truthy(x == probe) or (twin is not None and _truthy(x == twin)):
            raise AssertionError(f"paddock grader: a {type(x).__qualname__} compares equal to anything "
                                 f"(also to {'a fresh object()' if _truthy(x == probe) else repr(twin)[:80]})")
    return result


CANARY_SENTINEL = "\x00paddock-perturb\x00"    # nodeagent.verifier.canaries.SENTINEL


def perturb(y, _type=type, _len=len, _abs=abs, _urandom=os.urandom, _from=int.from_bytes, _int=int,
            _float=float, _str=str, _bytes=bytes, _list=list, _tuple=tuple, _dict=dict, _set=set,
            _frozenset=frozenset, _bool=bool, _none=type(None), _error=AssertionError, _chr=chr, _ord=ord):
    """A different value of y's own builtin type that looks like an ordinary expected value (the
    expected side of a canary's assertion: an honest result equal to y must not equal it).
    Everything it uses is bound as a default argument: no global or builtin a test could swap
    is looked up (and `__defaults__` cannot be replaced: the audit hook refuses it). A value it
    cannot perturb fails the canary."""
    def r(n):
        return _from(_urandom(4), "little") % n if n > 0 else 0
    t, new = _type(y), None
    if t is _bool:
        new = not y
    elif t is _none:
        new = 0
    elif t is _int:
        span = _abs(y) // 2 + 2
        new = y + (1 + r(span)) * (1 if r(2) else -1)
    elif t is _float:
        new = y + (0.5 + _abs(y)) * (0.5 + r(1000) / 1000.0) * (1 if r(2) else -1)
    elif t in (_str, _bytes):
        letters = "abcdefghijklmnopqrstuvwxyz"
        if _len(y) == 0:
            new = letters[r(26)] if t is _str else _bytes([97 + r(26)])
        else:
            i = r(_len(y))
            old = y[i] if t is _str else _chr(y[i])
            c = letters[(letters.find(old.lower()) + 1 + r(25)) % 26] if old.isalpha() else letters[r(26)]
            c = c.upper() if old.isupper() else c
            new = y[:i] + (c if t is _str else _bytes([_ord(c)])) + y[i + 1:]
    elif t in (_list, _tuple):
        if _len(y) == 0:
            new = t((0,))
        else:
            i = r(_len(y))
            new = y[:i] + y[i + 1:]
    elif t is _dict:
        items, i = _list(y.items()), r(_len(y))
        new = _dict(items[:i] + items[i + 1:]) if items else {0: 0}
    elif t in (_set, _frozenset):
        new = t((0,)) if not y else t(_list(y)[1:])
    if new is None or new == y:
        raise _error("paddock canary: the expected value cannot be perturbed")
    return new


def _perturber():
    """A private object whose `.format` is `perturb`: canary sources call `SENTINEL.format(x)`
    and the grader swaps the string constant for this object in the compiled code, so no name
    a test could rebind leads to it."""
    class Perturber:
        __slots__ = ("format",)
    p = Perturber()
    p.format = perturb
    return p


def bind_perturber(code):
    """`code` with every canary sentinel constant (in it and its nested code) replaced by a fresh
    perturber (kept nowhere else: only the compiled canaries hold it)."""
    if CANARY_SENTINEL not in code.co_consts and not any(isinstance(c, type(code)) for c in code.co_consts):
        return code
    consts = tuple(_perturber() if type(c) is str and c == CANARY_SENTINEL else bind_perturber(c)
                   if isinstance(c, type(code)) else c for c in code.co_consts)
    return code.replace(co_consts=consts)


class HonestAsserts(ast.NodeTransformer):
    """`assert a == b` -> `assert _paddock_honest_eq(a, b)`, line numbers kept (the AST is compiled)."""

    def visit_Assert(self, node):
        t = node.test
        if isinstance(t, ast.Compare) and len(t.ops) == 1 and isinstance(t.ops[0], ast.Eq):
            node.test = ast.copy_location(ast.Call(ast.copy_location(ast.Name("_paddock_honest_eq", ast.Load()), t),
                                                   [t.left, t.comparators[0]], []), t)
        return node


def image_plugins(trusted_path, trusted_tops):
    """Repository mode: (pytest arguments, top-level names) for the `pytest11` entry points of
    the distributions on the trusted path (the image's site directories; metadata under /work is
    never read, so the agent cannot register a plugin): the plugins plain pytest would autoload
    (pytest-cov, pytest-asyncio), which a project's configuration may need (`--cov`,
    `asyncio_mode`; `trusted_tops`: the grader's own trusted top-level names). Their packages and their requirements' (coverage) are held to the trusted
    path like pytest's own (a /work/pytest_cov/ is never the plugin). Coverage is a trace
    function: `--no-cov` keeps it off while grading."""
    import importlib.metadata as md
    import re

    def tops(dist):
        return set((dist.read_text("top_level.txt") or "").split())
    modules, held = [], set()
    for dist in md.distributions(path=trusted_path):
        eps = [ep.value for ep in dist.entry_points if ep.group == "pytest11" and ":" not in ep.value]
        if not eps:
            continue
        modules += [m for m in eps if m not in modules]
        held |= tops(dist) | {m.partition(".")[0] for m in eps}
        for req in dist.requires or ():
            if "extra ==" not in req:
                held |= {t for d in md.distributions(name=re.match(r"[\w.-]+", req).group(), path=trusted_path)
                         for t in tops(d)}
    args = [a for m in modules for a in ("-p", m)] + (["--no-cov"] if "pytest_cov.plugin" in modules else [])
    return args, frozenset(held) - trusted_tops
