"""Paddock's in-sandbox assertion-site guard (installed read-only at /verifier/paddock_sites.py).

Loaded by `grader_asserts` (`paddock_asserts`) in the pytest child before any code under test
runs. In repository mode the host rewrites every equality and assertion site of a guarded test,
the real copy and its canaries alike (`canaries.plant`): `a == b` becomes `SENTINEL.eq(a, b)`
and `self.assertEqual(a, b)` / `assert_close(a, b)` / any `assert*` call becomes
`SENTINEL.call(self.assertEqual, a, b)`; the grader's loader swaps the sentinel constant for a
private object whose `eq`, `call` and `format` are `site_eq`, `site_call` and `perturb`.

An honest equality is a pure function of the values compared. When the values a site compares
are anything but plain builtin data (and for an assertion whose function is the code under
test's own), the site evaluates the same comparison `1 + REPEATS` times and `PROBES` times
against perturbed expected values, in a random order whose first comparison is a probe, all from
one line of code (a caller's line tells a probe from the real comparison by nothing): the real
comparisons must all give the same answer, and when it is "equal" no probe may be equal. An
object whose answer is not a pure function of the values (a counter, randomness, time, the
caller, the number of comparisons made, "true on the first k calls", "true for the first value
it meets") fails the site: a value-independent answer passes it with probability at most
1 / C(REPEATS + PROBES, PROBES - 1) (1/6435: the first is a probe), and the canaries stay in
place on top.

Everything a site function uses is bound as a default argument (nothing is looked up at run
time: the audit hook refuses `__defaults__` swaps) and no closure holds mutable state.

Standard library only. Must not import: anything of Paddock, pytest.
"""

import os
import sys
from collections import deque

REPEATS = 7     # the real comparison again, besides its first evaluation
PROBES = 8      # comparisons with perturbed expected values (4 values, each twice: none may hold)
_BUDGET = 100000        # nodes walked per operand (plain data, suspicion)
_SCALARS = frozenset({int, float, complex, bool, str, bytes, type(None)})
_CONTAINERS = frozenset({list, tuple, set, frozenset, dict})
_DUNDERS = ("__eq__", "__ne__", "__bool__", "__len__", "__iter__", "__hash__")
_WRAPPER, _FUNCTION = type(object.__eq__), type(lambda: None)
IMPURE = "is not a pure function of the values compared"    # in a site's failure: `canaries.translate` reads it


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


def _rand(n, _urandom=os.urandom, _from=int.from_bytes):
    return _from(_urandom(4), "little") % n if n > 0 else 0


def _trusted(fn, _audit=sys.audit, _list=list):
    """Does the grader's audit hook trust `fn`'s code (`paddock_asserts.trusted_function`)?"""
    out = _list()
    _audit("paddock.trusted", fn, out)
    return out == [True]


def _plain(v, _type=type, _scalars=_SCALARS, _containers=_CONTAINERS, _dict=dict, _budget=_BUDGET):
    """Is `v` builtin data all the way down (exact types)? Its equality runs no Python code."""
    todo, n = [v], 0
    while todo:
        x = todo.pop()
        t = _type(x)
        if t in _scalars:
            continue
        n += 1
        if n > _budget or t not in _containers:
            return False
        todo += (*x.keys(), *x.values()) if t is _dict else x
    return True


def _suspect(v, _type=type, _scalars=_SCALARS, _containers=_CONTAINERS, _dict=dict, _budget=_BUDGET,
             _dunders=_DUNDERS, _mro=type.__dict__["__mro__"].__get__, _vars=type.__dict__["__dict__"].__get__,
             _wrapper=_WRAPPER, _function=_FUNCTION, _trusted=_trusted, _isinstance=isinstance, _list=list,
             _getattribute=object.__getattribute__, _seq=(list, tuple, set, frozenset, deque), _set=set, _id=id,
             _str=str, _getattr=getattr, _qualname=type.__dict__["__qualname__"].__get__):
    """Does anything in `v` (builtin containers, the instance dicts and items of objects whose
    comparison is the builtins' or trusted code's) compare or answer truth with code the audit
    hook does not trust (the code under test's)? Read without running any of its code."""
    todo, n, seen = [v], 0, _set()
    while todo:
        x = todo.pop()
        t = _type(x)
        if t in _scalars:
            continue
        n += 1
        if n > _budget:
            return True
        if t in _containers:
            todo += (*x.keys(), *x.values()) if t is _dict else x
            continue
        if _id(x) in seen:
            continue
        seen.add(_id(x))
        for name in _dunders:
            d = None
            for k in _mro(t):
                d = _vars(k).get(name)
                if d is not None:
                    break
            if d is None or _type(d) is _wrapper:
                continue
            if _type(d) is not _function or not _trusted(d) or not _str(_getattr(d, "__qualname__", "")).startswith(
                    _qualname(k) + "."):     # trusted code borrowed by another class (`__eq__ = Random.randrange`)
                return True
        if _isinstance(x, _dict):
            todo += (*x.keys(), *x.values())
        elif _isinstance(x, _seq):
            todo += _list(x)
        try:
            inner = _getattribute(x, "__dict__")
        except Exception:
            continue
        if _type(inner) is _dict:
            todo += inner.values()
    return False


def _probes(y, count, _type=type, _scalars=_SCALARS, _perturb=perturb, _rand=_rand, _list=list, _tuple=tuple,
            _dict=dict, _int=int, _object=object, _range=range, _abs=abs, _len=len, _set=set, _frozenset=frozenset):
    """`count` values that an honest operand equal to `y` is not equal to: for plain data, `y`
    with one value deep inside it perturbed (the shape kept, so a container's comparison reaches
    its items: a list's or tuple's item, a dict's value or key, a set's member; an int moved by
    half its size and more, as `perturb` moves a float: a tolerance does not hide it), else
    fresh objects."""
    def moved(cur, t):
        return cur + (_abs(cur) // 2 + 1 + _rand(3)) * (1 if _rand(2) else -1) if t is _int else _perturb(cur)

    def member(k):          # a hashable member moved: a scalar, or one scalar of a tuple
        if _type(k) in _scalars:
            return moved(k, _type(k))
        if _type(k) is _tuple and k:
            i = _rand(_len(k))
            return (*k[:i], moved(k[i], _type(k[i])), *k[i + 1:]) if _type(k[i]) in _scalars else None
        return None
    out = []
    for _ in _range(count):
        path, cur, t, new = [], y, _type(y), None
        while t in (_list, _tuple, _dict, _set, _frozenset) and cur:
            keys = _list(cur) if t in (_dict, _set, _frozenset) else _range(_len(cur))
            k = keys[_rand(_len(keys))]
            if t in (_set, _frozenset) or t is _dict and _rand(3) == 0:    # a member or a key replaced (size kept)
                try:
                    m = member(k)
                except Exception:
                    m = None
                if m is not None and m not in cur:
                    new = t([x for x in cur if x is not k] + [m]) if t is not _dict else {
                        (m if x is k else x): v for x, v in cur.items()}
                    break
                if t is not _dict:
                    break
            path.append((t, cur, k))
            cur = cur[k]
            t = _type(cur)
        if new is None:
            try:
                new = moved(cur, t)
            except Exception:
                out.append(_object())
                continue
        for t, box, k in reversed(path):
            if t is _dict:
                new = {**box, k: new}
            else:
                new = t((*box[:k], new, *box[k + 1:]))
        out.append(new)
    return out


def _order(ops, _rand=_rand, _len=len):
    """`ops` shuffled, a probe first when there is one."""
    for i in range(_len(ops) - 1, 0, -1):
        j = _rand(i + 1)
        ops[i], ops[j] = ops[j], ops[i]
    probes = [i for i, op in enumerate(ops) if op[0] >= 0]
    if probes:
        i = probes[_rand(_len(probes))]
        ops[0], ops[i] = ops[i], ops[0]
    return ops


def _truth(r, _bool=bool, _true=True, _false=False):
    if r is _true or r is _false:
        return r
    try:
        return _bool(r)
    except Exception:
        return None


def _inconsistent(what, _error=AssertionError, _impure=IMPURE):
    return _error(f"paddock grader: {what} {_impure}")


def site_eq(a, b, _plain=_plain, _suspect=_suspect, _probes=_probes, _order=_order, _truth=_truth,
            _repeats=REPEATS, _count=PROBES, _type=type, _bool=bool, _inconsistent=_inconsistent,
            _wrapper=_WRAPPER, _mro=type.__dict__["__mro__"].__get__, _vars=type.__dict__["__dict__"].__get__,
            _len=len, _enumerate=enumerate):
    """`a == b` at a guarded test's site: Python's own answer, once the same comparison repeated
    and against perturbed values has shown it to be a pure function of the two values (see the
    module docstring). Plain builtin data, and values whose comparison is the builtins' or trusted
    code's all the way down, are compared once."""
    if _plain(a) and _plain(b):
        return a == b
    suspects = (_suspect(a), _suspect(b))
    if not any(suspects):
        return a == b
    ops = [(-1, a, b)] * (1 + _repeats)
    for mine, other, left, suspect in ((a, b, True, suspects[0]), (b, a, False, suspects[1])):
        if suspect:
            ops += [(_len(ops) + i, mine, p) if left else (_len(ops) + i, p, mine)
                    for i, p in _enumerate(_probes(other if _plain(other) else object(), _count // 2))] * 2
    first, answers, held = None, {}, False
    for kind, x, y in _order(ops):
        try:
            r, err = x == y, None           # (one line for every comparison: its caller tells nothing)
        except Exception as exc:
            r, err = None, exc
        t = _truth(r) if err is None else err.__class__
        if kind < 0 and first is None:
            first = (r, err)
        held = held or kind >= 0 and t is True
        answers.setdefault(kind, []).append(t)
    if any(t != ts[0] for ts in answers.values() for t in ts):
        raise _inconsistent("`==` at this site gave different answers for the same values: it")
    answers, (r, err) = answers[-1], first
    if err is not None:
        raise err
    if answers[0] is True and held:
        raise _inconsistent("`==` at this site also held for a perturbed value: it")
    if _type(r) is _bool or answers[0] is None:
        return r
    for k in _mro(_type(r)):        # a result whose truth is the code under test's: its answer here
        d = _vars(k).get("__bool__")
        if d is not None:
            return r if _type(d) is _wrapper else answers[0]
    return r


def site_call(f, /, *args, _plain=_plain, _suspect=_suspect, _probes=_probes, _order=_order, _trusted=_trusted,
              _repeats=REPEATS, _count=PROBES, _type=type, _getattr=getattr, _str=str, _len=len,
              _inconsistent=_inconsistent, _base=BaseException, _exc=Exception,
              _passing=(KeyboardInterrupt, SystemExit, GeneratorExit), _enumerate=enumerate, **kwargs):
    """`f(*args, **kwargs)` at a guarded test's assertion site (`self.assertEqual(a, b)`, a
    package's `assert_close(a, b)`, any `assert*` call): called once when `f` is trusted code
    and its arguments compare with the builtins' or trusted code's equality; otherwise repeated
    (every call must pass, or every call fail) and, for a two-argument `*equal*`/`*close*`
    assertion without tolerance keywords, called with a perturbed expected value, which must
    fail. A one-shot iterator argument (a generator) is called once."""
    fn = _getattr(f, "__func__", f)
    values = (*args, *kwargs.values())
    if any(_getattr(_type(v), "__next__", None) is not None for v in values) or (
            _trusted(fn) and all(_plain(v) or not _suspect(v) for v in values)):
        return f(*args, **kwargs)
    name = _str(_getattr(fn, "__name__", "")).lower()
    ops = [(-1, args)] * (1 + _repeats)
    if _len(args) == 2 and set(kwargs) <= {"msg"} and "not" not in name and ("equal" in name or "close" in name):
        at = 1 if _plain(args[1]) or not _plain(args[0]) else 0
        ops += [(i, (args[0], p) if at else (p, args[1])) for i, p in _enumerate(
            _probes(args[at] if _plain(args[at]) else object(), _count // 2))] * 2
    first, answers, held = None, {}, False
    for kind, xs in _order(ops):
        try:
            r, err = f(*xs, **kwargs), None     # (one line for every call)
        except _passing:
            raise
        except _base as exc:
            r, err = None, exc
        if kind < 0 and first is None:
            first = (r, err)
        held = held or kind >= 0 and err is None
        answers.setdefault(kind, []).append(err is None)
    if any(t != ts[0] for ts in answers.values() for t in ts):
        raise _inconsistent(f"the assertion {name!r} passed and failed for the same values: it")
    r, err = first
    if err is not None:
        raise err
    if held:
        raise _inconsistent(f"the assertion {name!r} also passed with a perturbed expected value: it")
    return r
