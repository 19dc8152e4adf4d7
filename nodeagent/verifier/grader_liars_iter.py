"""The override guard's strict checks (installed read-only at /verifier/paddock_liars_iter.py, loaded
by `grader_liars`): what an override of a builtin data type's query must answer like the builtin.

- Iteration (`VIEWS`): `__iter__`, `__reversed__`, `keys`, `values`, `items`, `copy` (and
  `__bool__`: the builtin's length is not 0) of a list, tuple, dict, set or frozenset subclass show the builtin's items of the same data (as a multiset:
  a sorted or ordered view is honest; an item made into an object of another kind is too, an item
  hidden, added or swapped for other data is not). An iterator is drained (bounded by the builtin's
  length) and handed back as an iterator over what it gave and the rest.
- Numbers (`number_lies`): an arithmetic answer of a float or complex subclass, for builtin number
  operands, has the builtin's value (its type may differ: a float with units returning its own
  subclass is honest); where the answer is not a number, every way it reaches a comparison (`float`,
  `abs`, `int`, `round`, `-x`, `+x`, `bool`, `< <= > >=` against thresholds around the value) must
  give the builtin value's answer. The same holds for `-` and `/` of a class with no builtin base
  whose own `float()` gives its value (`abs(got - want) < tol` on a number-like object); without
  one, the answer read as a number follows the operand moved as a number's does (`slope_lies`).
- A faithful copy (`copy_slots`): an honest override is a function of the data and the type; the
  guard's copy of an instance (same class, data, `__dict__` and slots, another identity) must get
  the same answer.

Everything a check uses is a default argument. Standard library only. Must not import: anything of
Paddock, pytest.
"""

import itertools
import operator

VIEWS: dict[type, tuple[str, ...]] = {list: ("__iter__", "__reversed__", "copy"), tuple: ("__iter__",),
         dict: ("__iter__", "__reversed__", "keys", "values", "items", "copy"),
         set: ("__iter__", "copy"), frozenset: ("__iter__", "copy")}
VIEWS = {b: tuple(n for n in q if hasattr(b, n)) + ("__bool__",) for b, q in VIEWS.items()}     # (`bool`: its length's)
STRICT_EXTRA = {list: frozenset({"__len__"}), tuple: frozenset({"__len__"}), dict: frozenset({"__len__"})}
NUMBER_BASES = (float, complex)     # (an int subclass may wrap or saturate honestly: the data-moving rule asks it)
PLAIN_ARITH = ("__sub__", "__rsub__", "__truediv__", "__rtruediv__")
_NUMS = (int, float, complex, bool)
_MAX_VIEW = 4096        # a view longer than this is checked by its length only
_MAX_PAIRS = 256        # past this many items, no unordered matching


def close(a, b, _abs=abs, _exception=Exception):
    """Two numbers equal up to rounding (NaN equals NaN)."""
    try:
        if a == b or (a != a and b != b):
            return True
        return _abs(a - b) <= 1e-9 * max(_abs(a), _abs(b)) + 1e-12
    except _exception:
        return False


def _reraise(exc, _type=type, _error=AssertionError, _str=str, _mark="is not a pure function"):
    if _type(exc) is _error and _mark in _str(exc):
        raise exc       # (another guard's verdict on the way: never swallowed)


def _value(r, _type=type, _isinstance=isinstance, _exception=Exception):
    """A builtin number's value, read without its subclass's code (None: not readable)."""
    try:
        for b in (bool, int, float, complex):
            if _type(r) is b:
                return r
        for b, read in ((float, float.__float__), (int, int.__int__), (complex, complex.__complex__)):
            if _isinstance(r, b):
                return read(r)
    except _exception:
        pass
    return None


def _round6(x, _round=round):
    return _round(x, 6)


_UNARY = (("__float__", float), ("__abs__", abs), ("__neg__", operator.neg), ("__pos__", operator.pos),
          ("__int__", int), ("__round__", round), ("__round__", _round6), ("__bool__", bool))
_ORDER = (("__lt__", operator.lt), ("__le__", operator.le), ("__gt__", operator.gt), ("__ge__", operator.ge))


def number_lies(r, e, depth=0, _type=type, _getattr=getattr, _nums=_NUMS, _close=close, _unary=_UNARY, _order=_ORDER,
                _object=object, _exception=Exception, _reraise=_reraise, _isinstance=isinstance, _abs=abs):
    """Does `r`, the answer of an arithmetic operation whose builtin value is `e` (a number), show
    another number to anything that reads it as one? (An answer no number is read from lies in nothing.)"""
    if _isinstance(r, _nums):
        v = _value(r)
        return v is not None and not _close(v, e)
    t = _type(r)
    for name, fn in _unary:
        if _getattr(t, name, None) is None:
            continue
        try:
            want = fn(e)
        except _exception:
            continue
        try:
            got = fn(r)
        except _exception as exc:
            _reraise(exc)
            continue
        if (_isinstance(got, _nums) and not _close(got, want)) or (
                not _isinstance(got, _nums) and depth == 0 and number_lies(got, want, 1)):
            return True
    if _isinstance(e, complex):
        return False
    m = _abs(e) / 2 + 1e-9
    for name, op in _order:
        if _getattr(t, name, None) is _getattr(_object, name):
            continue
        for x in (e - m, e + m, 0.0):
            try:
                got = op(r, x)
            except _exception as exc:
                _reraise(exc)
                break
            if got is not NotImplemented and _type(got) is bool and got is not op(e, x):
                return True
    return False


def plain_number(self, name, y, _type=type, _getattr=getattr, _float=float, _exception=Exception, _reraise=_reraise):
    """The builtin value of `self <name> y` for an object with no builtin data base whose own
    `float()` gives its value (None: not number-like, or no such operation)."""
    if _type(y) not in (int, float) or _getattr(_type(self), "__float__", None) is None:
        return None
    try:
        e = _getattr(_float, name)(_float(self), _float(y))
    except _exception as exc:
        _reraise(exc)
        return None
    return None if e is NotImplemented else e


def slope_lies(name, f, y, _reads=(float, abs), _abs=abs, _type=type, _nums=_NUMS, _isinstance=isinstance,
               _exception=Exception, _reraise=_reraise, _close=close):
    """`x - y`, `y - x`, `x / y`, `y / x` (`f(y)`) of an object whose own value cannot be read (no
    `float()`): read as a number (`float`, `abs`), the answer follows `y` moved by 1 as a number
    does: `-` moves by 1 one way (the slope of `abs`, away from 0, is 1), `/` scales by `y / y'`.
    A difference shrunk (`(x - y) * 1e-12`), or an object whose `abs` is tiny, does not."""
    for read in _reads:
        vals = []
        for p in (y, y + 1, y - 1):
            try:
                r = f(p)
                v = read(r) if r is not NotImplemented else None
            except _exception as exc:
                _reraise(exc)
                v = None
            vals.append(v if _isinstance(v, _nums) and not _isinstance(v, bool) else None)
        v0, up, down = vals
        if v0 is None or (up is None and down is None):
            continue
        if name in ("__sub__", "__rsub__"):
            if max(_abs(v - v0) for v in (up, down) if v is not None) < 1e-3 and up is not None and down is not None:
                return True
            continue
        for p, v in ((y + 1, up), (y - 1, down)):
            if v is None or p == 0 or y == 0 or v0 == 0:
                continue
            want = _abs(v0) * (_abs(y) / _abs(p) if name == "__truediv__" else _abs(p) / _abs(y))
            if _abs(_abs(v) - want) > 1e-3 * want + 1e-12:
                return True
    return False


def builtin_view(name, self, base, _list=list, _dict=dict, _reversed=reversed):
    """What the builtin's `name` shows of `self`'s data (a list), read without any subclass's code."""
    if base is _dict:
        if name == "values":
            return _list(_dict.values(self))
        if name == "items":
            return _list(_dict.items(self))
        keys = _list(_dict.keys(self))
        return keys[::-1] if name == "__reversed__" else keys
    items = _list(base.__iter__(self))
    return items[::-1] if name == "__reversed__" else items


def _replay(items, exc):
    yield from items
    raise exc


def drain(r, limit, _iter=iter, _list=list, _len=len, _exception=Exception, _replay=_replay, _chain=itertools.chain):
    """(items, r'): at most `limit` + 1 items `r` gives and the answer to hand back (when `r` was an
    iterator, one over the items taken and then the rest of `r`; else `r` itself); (None, r') when
    it raised on the way (r' gives what it gave, then raises the same)."""
    try:
        it = _iter(r)
    except _exception:
        return None, r
    out = _list()
    try:
        for x in it:
            out.append(x)
            if _len(out) > limit:
                break
    except _exception as exc:
        return None, (_replay(out, exc) if it is r else r)
    return out, (_chain(out, it) if it is r else r)


_KINDS = ((int, float, complex, bool), (str,), (bytes,), (list, tuple), (set, frozenset), (dict,), (type(None),))


def _kind(v, _type=type, _kinds=_KINDS):
    return next((i for i, k in enumerate(_kinds) if _type(v) in k), -1)


def swapped(a, b, plain, _type=type, _len=len, _kind=_kind, _exception=Exception):
    """Is `a` (shown) data of the same kind as `b` (held) but another value? (`plain`: a value as its
    builtin type's, or an unknown marker.) A pair is read member by member; a value of another
    kind (a list held, its last item shown; an object made of a dict) is a representation."""
    pa, pb = plain(a), plain(b)
    k = _kind(pa)
    if k < 0 or k != _kind(pb):
        return False
    if _type(pa) is tuple and _type(pb) is tuple and _len(pa) == _len(pb):
        return any(swapped(x, y, plain) for x, y in zip(pa, pb))
    try:
        return not (pa == pb or (pa != pa and pb != pb))
    except _exception:
        return False


def view_lies(got, want, same, plain, _len=len, _range=range, _list=list, _swapped=swapped):
    """Do the items `got` (an override's view) differ from `want` (the builtin's) as a multiset?
    `same(a, b)`: True, False or None (not data). Items shown that the builtin does not hold are
    paired with the builtin's items no item showed, in order: data of the same kind but another
    value in a pair is an item swapped (`swapped`). The builtin holding nothing while the view
    shows items: the data is held elsewhere (no builtin view to check)."""
    if not want:
        return False
    if _len(got) != _len(want):
        return True
    if _len(got) > _MAX_VIEW:
        return False
    if all(a is b or same(a, b) is True for a, b in zip(got, want)):
        return False
    if _len(got) > _MAX_PAIRS:
        return any(_swapped(a, b, plain) for a, b in zip(got, want))
    free, extra = _list(_range(_len(want))), _list()
    for a in got:
        hit = next((i for i in free if want[i] is a), None)
        if hit is None:
            hit = next((i for i in free if same(a, want[i]) is True), None)
        if hit is None:
            extra.append(a)
        else:
            free.remove(hit)
    return any(_swapped(a, want[i], plain) for a, i in zip(extra, free))


def copy_slots(src, dst, _type=type, _vars=type.__dict__["__dict__"].__get__, _mro=type.__dict__["__mro__"].__get__,
               _member=type(type(close).__dict__["__globals__"]), _heap=1 << 9,
               _flags=type.__dict__["__flags__"].__get__, _exception=Exception):
    """`src`'s slot values set on `dst` (member descriptors of its heap classes: no code of theirs runs)."""
    for k in _mro(_type(src)):
        if not _flags(k) & _heap:
            continue
        for d in _vars(k).values():
            if _type(d) is _member:
                try:
                    d.__set__(dst, d.__get__(src, k))
                except _exception:
                    continue
