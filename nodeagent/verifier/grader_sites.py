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

A perturbed expected value and every probe look like the expected value itself (`perturb`: a
number on its own decimal grid, a string's characters within their classes, a container's
length kept), so a comparison that answers by the look of a value meets them as it meets the
real one. And they are made as it is: the real comparisons are evaluated against copies of the
plain operand made at run time like the probes (`twin`: four copies, each twice, held in the
same places), so neither identity (a compiled, interned literal; a folded constant), nor a
reference count, nor "made by my own constructor" tells the real comparison from a probe.

Everything a site function uses is bound as a default argument (nothing is looked up at run
time: the audit hook refuses `__defaults__` swaps) and no closure holds mutable state.

Standard library only. Must not import: anything of Paddock, pytest.
"""

import math
import os
import sys
from collections import deque
from types import MemberDescriptorType

REPEATS = 7     # the real comparison again, besides its first evaluation
PROBES = 8      # comparisons with perturbed expected values (4 values, each twice: none may hold)
_BUDGET = 100000        # nodes walked per operand (plain data, suspicion)
_SCALARS = frozenset({int, float, complex, bool, str, bytes, type(None)})
_CONTAINERS = frozenset({list, tuple, set, frozenset, dict})
_DUNDERS = ("__eq__", "__ne__", "__bool__", "__len__", "__iter__", "__hash__")
_WRAPPER, _FUNCTION = type(object.__eq__), type(lambda: None)
IMPURE = "is not a pure function of the values compared"    # in a site's failure: `canaries.translate` reads it


# A nonzero float whose leading digit is below 10^LIFT moves to that decade (see `_number`): -4 for
# a canary's value and the site guards' probes (no tolerance beyond an assertion's default), -1
# for the probes the value and class guards try against a tolerance below 0.1
_LIFT, _LIFT_STRICT = -4, -1
_PUNCT = "!\"#$%&'()*+,-./:;<=>?@[\\]^_`{|}~"
_SPACE = " \t\n\r\x0b\x0c"


def _rand(n, _urandom=os.urandom, _from=int.from_bytes):
    return _from(_urandom(4), "little") % n if n > 0 else 0


def _decimal(v, _type=type, _float=float, _repr=repr, _str=str, _int=int, _len=len):
    """(negative, digits, exponent) of a finite int or float: |v| = int(digits) * 10**exponent in
    the shortest repr's digits, without trailing zeros ("0" for zero)."""
    neg = v < 0 or _type(v) is _float and _repr(v)[0] == "-"
    text = _repr(-v if neg else v) if _type(v) is _float else _str(-v if neg else v)
    mant, _, ex = text.partition("e")
    whole, _, frac = mant.partition(".")
    digits, exp = (whole + frac).lstrip("0"), (_int(ex) if ex else 0) - _len(frac)
    if not digits:
        return neg, "0", 0
    stripped = digits.rstrip("0")
    return neg, stripped, exp + _len(digits) - _len(stripped)


def _form(v, _decimal=_decimal, _type=type, _float=float, _len=len, _big=1 << 20):
    """What a number looks like: its last digit's place (decimals), count of significant digits,
    leading digit's place (magnitude), sign, last digit, and a short binary fraction's denominator."""
    neg, digits, exp = _decimal(v)
    den = v.as_integer_ratio()[1] if _type(v) is _float else 1
    return exp, _len(digits), exp + _len(digits) - 1, neg, digits[-1], den if den <= _big else 0


def _number(y, strict=False, probe=False, _type=type, _float=float, _int=int, _abs=abs, _decimal=_decimal, _form=_form, _rand=_rand,
            _isfinite=math.isfinite, _len=len, _lifts=(_LIFT, _LIFT_STRICT), _zip=zip, _tuple=tuple, _max=max):
    """A finite int or float on y's own decimal grid: the leading digit changed, every other digit,
    the sign, the count of significant digits and of decimals kept (3.0 -> 5.0, 2.5 -> 7.5, 0.1 ->
    0.6, 12345.678 -> 42345.678, 300 -> 800), moved by at least half of |y| (no tolerance an
    assertion has by default hides it); among the candidates, those that keep all of `_form`. A
    nonzero float below 10^_LIFT moves to that decade (1e-9 -> 1e-4: an absolute tolerance such
    as `assertAlmostEqual`'s 7 places would hide a move on its own grid). `strict`: the move also
    beats any absolute and relative tolerance below 0.1 together (10 |p - y| >= 1 + max(|p|, |y|);
    a float below 0.1 moves to the 0.1 decade: 0.05 -> 0.5). `probe`: a probe of y, drawn first
    from the look-alikes y is *not* far from (2 |p - y| < |p|): y may be a canary's perturbed value
    (far from the real one), and a probe of it then never is the real value, which a comparison
    that remembers the first value it met would otherwise have met in a canary (a look-alike set
    is small: 3.0 has eight). None when there is none."""
    t = _type(y)
    neg, digits, exp = _decimal(y)
    lead = exp + _len(digits) - 1
    lift = _lifts[1 if strict else 0]
    shift = lift - lead if t is _float and y and lead < lift else 0
    want = _form(y)
    for down in (0, 1):     # (a decade down only when y's own has no candidate: y near the largest float)
        for near in ((True, False) if probe else (False,)):
            best, found = None, []
            for d in "123456789":
                if d == digits[0] and not shift and not down:
                    continue
                e = exp + shift - down
                text = ("-" if neg else "") + d + digits[1:]
                p = _float(f"{text}e{e}") if t is _float else _int(text) * 10 ** e if e >= 0 else None
                if p is None or t is _float and not _isfinite(p) or p == y or (
                        2 * _abs(p - y) >= _abs(p) if near else 2 * _abs(p - y) < _abs(y)) or (
                        strict and 10 * _abs(p - y) < 1 + _max(_abs(p), _abs(y))):
                    continue
                score = _tuple(a == b for a, b in _zip(_form(p), want))
                if best is None or score > best:
                    best, found = score, [p]
                elif score == best:
                    found.append(p)
            if found:
                return found[_rand(_len(found))]
    return None


def _text(y, _type=type, _str=str, _bytes=bytes, _len=len, _chr=chr, _ord=ord, _rand=_rand, _list=list,
          _range=range, _punct=_PUNCT, _space=_SPACE, _enumerate=enumerate):
    """y (a str or bytes) with one character changed to another of its class: a digit to a digit, a
    letter to a letter of the same case, punctuation to punctuation, a space to a space, anything
    else to a neighbour of the same kind; an ASCII letter or digit is the one changed when there
    is one. The length is kept (an empty one gets one letter: no other value looks like it)."""
    text = _type(y) is _str
    if not y:
        c = 97 + _rand(26)
        return _chr(c) if text else _bytes((c,))
    codes = [_ord(c) for c in y] if text else _list(y)
    where = [i for i, o in _enumerate(codes) if 48 <= o <= 57 or 65 <= o <= 90 or 97 <= o <= 122]
    i = where[_rand(_len(where))] if where else _rand(_len(codes))
    o, new = codes[i], None
    for lo, n in ((48, 10), (65, 26), (97, 26)):
        if lo <= o < lo + n:
            new = lo + (o - lo + 1 + _rand(n - 1)) % n
    for group in (_punct, _space):
        if new is None and o < 128 and _chr(o) in group:
            new = _ord(group[(group.index(_chr(o)) + 1 + _rand(_len(group) - 1)) % _len(group)])
    if new is None and not text:        # a control byte or one above 127: another of its range
        lo, n = (0, 32) if o < 32 or o == 127 else (128, 128)
        new = lo + (o - lo + 1 + _rand(n - 1)) % n
    if new is None:     # a character outside ASCII (or a control one): a neighbour of the same kind
        c = _chr(o)
        kind = (c.isalpha(), c.isupper(), c.islower(), c.isdigit(), c.isspace(), c.isprintable(), o < 128)
        for _ in _range(64):
            k = o + (1 + _rand(64)) * (1 if _rand(2) else -1)
            if 0 <= k < 0x110000 and not 0xD800 <= k < 0xE000 and k != o:
                d = _chr(k)
                if (d.isalpha(), d.isupper(), d.islower(), d.isdigit(), d.isspace(), d.isprintable(), k < 128) == kind:
                    new = k
                    break
        new = 97 + (o + 1) % 26 if new is None or new == o else new
    return y[:i] + (_chr(new) if text else _bytes((new,))) + y[i + 1:]


def _scalar(y, strict=False, probe=False, _type=type, _float=float, _int=int, _complex=complex, _str=str, _bytes=bytes, _bool=bool,
            _none=type(None), _isfinite=math.isfinite, _number=_number, _text=_text, _error=ValueError):
    """A different value of scalar y's own type that looks like y (`_number`, `_text`; `strict`
    and `probe` as there); a raise when there is none."""
    t, new = _type(y), None
    if t is _bool:
        new = not y
    elif t is _none:
        new = 0
    elif t is _float and not _isfinite(y):
        new = -y if y == y else y      # inf <-> -inf; nan stays nan (nothing equals it)
    elif t in (_int, _float):
        try:
            new = _number(y, strict, probe)
        except _error:                  # an int with more digits than `str` converts: moved by half
            new = y + y // 2 + 1
    elif t is _complex:     # each nonzero part on its own grid (a zero part stays zero: "2j" stays "Nj")
        def part(v):
            return (-v if v == v else v) if not _isfinite(v) else _number(v, strict, probe)
        re, im = y.real, y.imag
        new = _complex(part(re) if re else re, part(im) if im or not re else im)
    elif t in (_str, _bytes):
        new = _text(y)
    if new is None:
        raise _error("no value of this type to move to")
    return new


def perturb(y, strict=False, probe=False, other=None, _type=type, _len=len, _scalar=_scalar, _rand=_rand, _list=list, _tuple=tuple, _dict=dict,
            _set=set, _frozenset=frozenset, _range=range, _scalars=_SCALARS, _error=AssertionError,
            _exception=Exception, _reversed=reversed):
    """A different value of y's own builtin type that looks like an ordinary expected value, and
    like y itself (the expected side of a canary's assertion: an honest result equal to y must not
    equal it; a comparison that tells real copies from canaries by the look of the expected value
    finds nothing to read). A scalar moves on its own grid (`_scalar`); a container keeps its
    shape and has one value deep inside it moved (a list's or tuple's item, a dict's value or key,
    a set's member: its length is the same, so "as long as my own answer" tells nothing; a
    comparison reaches the moved item). An empty container gets one item (no other looks like it).
    Everything it uses is bound as a default argument: no global or builtin a test could swap
    is looked up (and `__defaults__` cannot be replaced: the audit hook refuses it). A value it
    cannot perturb fails the canary. `strict`: a number moves beyond any tolerance below 0.1;
    `probe`: a number moves to a look-alike y is near (`_number`). `other(v)`: a moved copy of an
    object `v` that is not plain data (a list's item, a dict's value, y itself: a project object
    moved as it would be alone, `grader_values._fields`), or None."""
    def leaf(v, item=True):
        t = _type(v)
        if t in _scalars:
            return _scalar(v, strict, probe)
        if t in (_list, _tuple, _set, _frozenset) and not v:
            return t((0,))
        if t is _dict and not v:
            return {0: 0}
        new = other(v) if item and other is not None else None
        if new is None:
            raise _error("not plain data")
        moved[0] = True
        return new

    def member(k):          # a hashable member moved: a scalar, or one scalar of a tuple (not by `other`:
        if _type(k) is _tuple and k:        # finding it in the set would run the code under test's `==`)
            i = _rand(_len(k))
            return (*k[:i], leaf(k[i], False), *k[i + 1:])
        return leaf(k, False)
    new, moved = None, [False]
    for _ in _range(8):
        path, cur, t, new, moved[0] = [], y, _type(y), None, False
        try:
            while t in (_list, _tuple, _dict, _set, _frozenset) and cur:
                keys = _list(cur) if t in (_dict, _set, _frozenset) else _range(_len(cur))
                k = keys[_rand(_len(keys))]
                if t in (_set, _frozenset) or t is _dict and _rand(3) == 0:    # a member or a key replaced
                    m = member(k)
                    if m in cur:
                        raise _error("the moved member is already there")
                    new = t([x for x in cur if x is not k] + [m]) if t is not _dict else {
                        (m if x is k else x): v for x, v in cur.items()}
                    break
                path.append((t, cur, k))
                cur = cur[k]
                t = _type(cur)
            if new is None:
                new = leaf(cur)
        except _exception:
            new = None
            continue
        for t, box, k in _reversed(path):
            new = {**box, k: new} if t is _dict else t((*box[:k], new, *box[k + 1:]))
        if moved[0] or new != y:       # (a moved object is not asked: its `==` is the code under test's)
            return new
    t = _type(y)
    if t in (_list, _tuple) and y:          # an item no move reaches (a project object): one dropped
        i = _rand(_len(y))
        new = y[:i] + y[i + 1:]
    elif t is _dict and y:
        items = _list(y.items())
        i = _rand(_len(items))
        new = _dict(items[:i] + items[i + 1:])
    elif t in (_set, _frozenset) and y:
        new = t(_list(y)[1:])
    if new is None or new == y:
        raise _error("paddock canary: the expected value cannot be perturbed")
    return new


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


_BASES = (str, bytes, int, float, complex, tuple, frozenset, list, dict, set)   # a builtin subclass's data: made by the base
_BASE_DATA = {str: str.__str__, bytes: bytes.__bytes__, int: int.__index__, float: float.__float__,
              complex: complex.__complex__}     # (an exact copy of a subclass's data)
_COMPARING = ("__eq__", "__ne__", "__lt__", "__le__", "__gt__", "__ge__", "__contains__", "__hash__")


def twin(y, _type=type, _str=str, _bytes=bytes, _int=int, _float=float, _complex=complex, _tuple=tuple, _list=list,
         _dict=dict, _set=set, _frozenset=frozenset, _len=len, _id=id, _bases=_BASES, _comparing=_COMPARING,
         _mro=type.__dict__["__mro__"].__get__, _vars=type.__dict__["__dict__"].__get__, _function=_FUNCTION,
         _trusted=_trusted, _getattribute=object.__getattribute__, _new=object.__new__, _exception=Exception,
         _slot=MemberDescriptorType, _budget=_BUDGET, _data=_BASE_DATA, _identity=object.__hash__, _next=next,
         _singletons=(bool, type(None)), _any=any):
    """An equal copy of `y` made at run time the way a probe or a canary's perturbed value is made,
    all the way down, without running any code under test: a str or bytes longer than one a new
    object (never the compiler's interned constant), an int outside the small-int cache and every
    float but nan a new object, builtin containers rebuilt (a folded tuple or frozenset constant
    is not kept), and an object whose comparison is the code under test's (its class's own
    `__eq__`, ordering, `in` or hash) remade without its constructor: `object.__new__`, or its
    builtin base's `__new__` for a `str`/`int`/`tuple`/`dict`/... subclass, its instance dict and
    slots copied the same way. So the value a test's check compares with and its probes and
    canaries' values differ in their content only: an `==` that holds for "made by my
    constructor" or "a compiled literal" holds for none. Anything else (an object compared by
    identity or trusted code, nan, one it cannot remake, past the budget) is kept."""
    memo, left, owned = {}, [_budget], {}

    def resolve(t, name):
        return _next((_vars(k)[name] for k in _mro(t) if name in _vars(k)), None)

    def own(t):
        if _id(t) not in owned:     # (by id: a metaclass's own `==` or hash is code under test)
            owned[_id(t)] = _any(_type(d) is _function and not _trusted(d) for d in (resolve(t, n) for n in _comparing))
        return owned[_id(t)]

    def copy(v, key=False):
        t = _type(v)
        left[0] -= 1
        if left[0] < 0 or _id(v) in memo:
            return memo.get(_id(v), v)
        if t is _str or t is _bytes:
            return (v + v[:1])[:-1] if _len(v) > 1 else v
        if t is _int:
            return v + 0
        if t is _float:
            return v * 1.0 if v == v else v
        if t is _complex:
            return _complex(v.real * 1.0, v.imag * 1.0) if v == v else v
        if t is _tuple or t is _list:
            return t([copy(x, key) for x in v])
        if t is _set or t is _frozenset:
            return t([copy(x, True) for x in v])
        if t is _dict:
            return {copy(k, True): copy(x) for k, x in v.items()}
        if t in _singletons or not own(t) or key and resolve(t, "__hash__") is _identity:
            return v        # (a member hashed by identity: a copy would be another member)
        base = _next((b for b in _mro(t) if b in _bases), None)
        try:        # (the base's own C methods read the data: no method of `t` runs)
            if base is None:
                new = _new(t)
            elif base is _list or base is _dict or base is _set:
                new = base.__new__(t)
                data = _dict.items(v) if base is _dict else base.__iter__(v)
                (_list.extend if base is _list else base.update)(new, copy(base(data)))
            else:
                data = base(base.__iter__(v)) if base is _tuple or base is _frozenset else _data[base](v)
                new = base.__new__(t, copy(data))
        except _exception:
            return v
        memo[_id(v)] = new
        try:
            inner = _getattribute(v, "__dict__")
        except _exception:
            inner = None
        if _type(inner) is _dict:
            _getattribute(new, "__dict__").update({k: copy(x) for k, x in inner.items()})
        for k in _mro(t):
            names = _vars(k).get("__slots__")
            for name in ((names,) if _type(names) is _str else names if _type(names) in (_tuple, _list) else ()):
                d = _vars(k).get(name) if _type(name) is _str else None
                if _type(d) is _slot:
                    try:
                        d.__set__(new, copy(d.__get__(v, t)))
                    except _exception:
                        continue
        return new
    return copy(y)


def _probes(y, count, exact=False, same=False, _perturb=perturb, _object=object, _range=range, _exception=Exception,
            _twin=twin):
    """`count` values that an honest operand equal to `y` is not equal to, each `perturb(y)` as a
    probe: for plain data, `y` with one value deep inside it moved on its own grid (the shape kept,
    so a container's comparison reaches its items; a number moved by a tenth of its size and more:
    no default tolerance hides it), like `y` to look at (a comparison that answers by the look of a
    value meets them as it meets `y`) and drawn from the look-alikes `y` is near (a probe of a
    canary's perturbed value is not the real one); else fresh objects. `exact`: for a comparison
    with no tolerance beyond its default (the site guards); otherwise the move also beats any
    tolerance below 0.1 (`perturb`'s `strict`: the value guards' and class guards' probes). `same`:
    `count` copies of `y` itself made the same way (`twin`): what a check compares with."""
    if same:
        return [_twin(y) for _ in _range(count)]
    out = []
    for _ in _range(count):
        try:
            out.append(_perturb(y, not exact, True))
        except _exception:
            out.append(_object())
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
    if _plain(a) is not _plain(b):      # the real comparison with copies of the plain side made as the probes are
        mine, other, left = (a, b, True) if _plain(b) else (b, a, False)
        ops = [(-1, mine, c) if left else (-1, c, mine) for c in _probes(other, (1 + _repeats) // 2, True, True)] * 2
    for mine, other, left, suspect in ((a, b, True, suspects[0]), (b, a, False, suspects[1])):
        if suspect:
            ops += [(_len(ops) + i, mine, p) if left else (_len(ops) + i, p, mine)
                    for i, p in _enumerate(_probes(other if _plain(other) else object(), _count // 2, True))] * 2
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
        if _plain(args[at]):        # the real call with copies of the expected value made as the probes are
            ops = [(-1, (args[0], c) if at else (c, args[1])) for c in _probes(args[at], (1 + _repeats) // 2, True,
                                                                                True)] * 2
        ops += [(i, (args[0], p) if at else (p, args[1])) for i, p in _enumerate(
            _probes(args[at] if _plain(args[at]) else object(), _count // 2, True))] * 2
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
