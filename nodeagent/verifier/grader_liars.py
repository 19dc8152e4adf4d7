"""Paddock's in-sandbox class guards (installed read-only at /verifier/paddock_liars.py).

Loaded by `grader_asserts` (`paddock_asserts`) in the pytest child before any code under test
runs. The assertion-site guards (`grader_sites`, `grader_values`) watch comparisons the test
*writes*; a comparison made anywhere else (C code: `list.count`, `list.index`, `max`,
`operator.countOf`, `in`; an alias of `operator.eq`; `match`; `eval`; a helper, a fixture, a
TestCase method) reaches the object's own dunder without passing a site. So the guard sits on the
value's class instead: every class whose comparison dunder (`__eq__`, `__ne__`, `<`, `<=`, `>`,
`>=`, `__contains__`) is code the audit hook does not trust (the code under test's, code no file
holds, or a builtin slot of another operation or type) is *armed*: that dunder, in the class that
owns it, is replaced by a wrapper that calls the original and, when the answer claims equality
(or an ordering, or membership), asks the original again with a fresh `object()` (and, for `==` and
`!=` against plain data, with two copies of the other operand moved deep inside:
`grader_sites._probes`). Holding for either is a lie: the wrapper emits a `tamper` event (reward
0, flagged) and raises `AssertionError` (`IMPURE`), whichever code compared.

When classes are armed (`install`): every class statement as it runs (`builtins.__build_class__`
wrapped: a metaclass too); a class an object's `__class__` is set to (the `object.__setattr__`
audit event); every class alive when the guards are installed, then before each test's call
phase the new direct subclasses of the builtin roots and of every armed class (classes made by
`type(...)`), the armed classes again (a dunder assigned after the class was made), and the
classes reached from the test's fixture values; and every class reached from the result of every call a
test module makes (`Boundaries`: `f(a)` compiled as `"\\0paddock-call\\0".ret(f(a))`, the constant
swapped by the grader's loader for a private object, `grader_asserts.bind_perturber`), walking
builtin containers and instance dicts (bounded). `unwrap` gives the other guards the original
dunder behind a wrapper (the first of its defaults, which the audit hook keeps from being replaced). A dunder found replaced is armed again.
Test modules and conftest files are the task's (the agent's changes to them are never applied):
their classes (a `mock.ANY`-like helper) are not armed, unless their code was compiled from a
string under such a name (`paddock.trusted` of a name: forged).

Everything a wrapper uses is a positional default argument (the audit hook refuses `__defaults__`
swaps); nothing is looked up at run time. Standard library only. Must not import: anything of
Paddock, pytest.
"""

import ast
import builtins
import itertools
import operator
import os
import sys

IMPURE = "is not a pure function of the values compared"    # = grader_sites.IMPURE
NAMES = ("__eq__", "__ne__", "__lt__", "__le__", "__gt__", "__ge__", "__contains__")
_OPPOSITE = {"__lt__": operator.ge, "__ge__": operator.lt, "__le__": operator.gt, "__gt__": operator.le}
CALL_SENTINEL = "\x00paddock-call\x00"
_SLOT_TYPES = (type(object.__eq__), type(str.join), type(int.__dict__["__eq__"]))
_SCALARS = frozenset({int, float, complex, bool, str, bytes, type(None), type, type(len), type(lambda: 0)})
_CONTAINERS = frozenset({list, tuple, set, frozenset, dict})
_FRAME_CALLS = frozenset({"super", "locals", "vars", "eval", "exec", "globals", "dir", "breakpoint", "__import__"})
_TEST_DIRS = frozenset({"tests", "test"})
_ROOTS = (object, int, float, complex, str, bytes, tuple, list, dict, set, frozenset, type, BaseException)
_WRAPPER_CODE = None    # the code object every wrapper shares (set by `guards`)
BOUNDARY = None         # the call boundary the grader's loader binds to CALL_SENTINEL (set by `install`)


def _task_file(name, _basename=os.path.basename, _str=str):
    """A conftest or test module (or anything under tests/): the task's, never the agent's."""
    if _str(name).startswith("<"):
        return False
    base = _basename(name)
    parts = _str(name).split("/")
    return (base == "conftest.py" or base.startswith("test_") or base.endswith("_test.py")
            or base in ("test.py", "tests.py") or any(p in _TEST_DIRS for p in parts[:-1]))


def _trusted(fn, _audit=sys.audit, _list=list):
    out = _list()
    _audit("paddock.trusted", fn, out)
    return out == [True]


def _forged(name, _audit=sys.audit, _list=list):
    out = _list()
    _audit("paddock.trusted", name, out)
    return out != [False]


def _truth(r, _bool=bool, _exception=Exception):
    try:
        return _bool(r)
    except _exception:
        return None         # an elementwise result (an array): no single answer to check


def _suspect(name, d, owner, _slots=_SLOT_TYPES, _type=type, _getattr=getattr, _function=type(_trusted),
             _trusted=_trusted, _forged=_forged, _task_file=_task_file, _mro=type.__dict__["__mro__"].__get__):
    """Is `d`, `owner.__dict__[name]`, a comparison the code under test defines (or a lying slot)?"""
    if _type(d) in _slots:      # a builtin slot: a lie only when it is another operation's or type's
        return _getattr(d, "__name__", name) != name or _getattr(d, "__objclass__", object) not in _mro(owner)
    if _type(d) is _function:
        code = d.__code__
        if _trusted(d):
            return False
        return not (_task_file(code.co_filename) and not _forged(code.co_filename))
    return d is not None        # a staticmethod, a partial, a builtin function, a callable object


def guards(emit, probes, _object=object, _truth=_truth, _type=type, _exception=Exception, _error=AssertionError,
           _impure=IMPURE, _scalars=_SCALARS, _containers=_CONTAINERS, _names=NAMES, _suspect=_suspect,
           _setattr=type.__setattr__, _vars=type.__dict__["__dict__"].__get__, _mro=type.__dict__["__mro__"].__get__,
           _id=id, _getattr=getattr, _isinstance=isinstance, _str=str, _set=set, _dict=dict, _notimpl=NotImplemented,
           _list=list, _getattribute=object.__getattribute__, _budget=48, _flags=type.__dict__["__flags__"].__get__):
    """(arm, walk): `arm(cls)` arms every suspect comparison dunder of `cls` and its bases;
    `walk(values)` arms the classes of everything reachable from `values`. `emit`: the plugin's
    event emitter (a lie is a `tamper` event); `probes(y, n)`: `grader_sites._probes`."""
    wrappers, known, armed = _dict(), _dict(), _list()  # our wrappers by id; class -> its dunders when seen; classes armed
    # (objects held, never bare ids: a freed wrapper's id reused by a new dunder must not pass for it)

    def lie(name, owner, _emit=emit, _error=_error, _impure=_impure, _str=str):
        what = f"{_getattr(owner, '__qualname__', '?')}.{name}"
        _emit(ev="tamper", detail=f"a lying comparison: {what} {_impure} (it holds for a fresh object or a moved "
                                  "value, or changes its answer)")
        return _error(f"paddock grader: {what} (the code under test's comparison) {_impure}")

    def probe(name, f, self, other, r, owner, _opposite=_OPPOSITE, _error=_error, _impure=_impure, _str=_str,
              _object=_object, _truth=_truth, _exception=_exception, _type=_type,
              _plain=frozenset({int, float, str, bytes}), _data=_scalars | _containers, _probes=probes, _lie=lie, _notimpl=_notimpl):
        t = _truth(r)
        claims = t is False if name == "__ne__" else t is True
        if not claims:
            return
        tries = [_object()]     # (a container moved may still be equal: a class comparing a dict's keys)
        if name in ("__eq__", "__ne__") and _type(other) in _plain:
            try:
                tries += _probes(other, 2)
            except _exception:
                pass
        for p in tries:
            try:
                q = f(p)
            except _exception:
                continue
            if q is _notimpl:
                continue
            held = _truth(q)
            if (held is False) if name == "__ne__" else (held is True):
                raise _lie(name, owner)
        if name in _opposite:       # `x < o` and `x >= o` both true
            try:
                if _truth(_opposite[name](self, other)) is True:
                    raise _lie(name, owner)
            except _exception as exc:
                if _type(exc) is _error and _impure in _str(exc):
                    raise
        if _type(other) not in _data:      # (another operand may be used up by a comparison: an iterator)
            return
        try:        # asked again after the probes: the same answer (not "true on the first call only")
            again = _truth(f(other))
        except _exception:
            again = None
        if again is not t:
            raise _lie(name, owner)

    def wrap(name, d, owner, _probe=probe, _type=_type, _getattr=_getattr, _notimpl=_notimpl):
        get = _getattr(_type(d), "__get__", None)

        def guarded(self, other, _d=d, _get=get, _name=name, _owner=owner, _probe=_probe, _type=_type,
                    _notimpl=_notimpl):
            f = _get(_d, self, _type(self)) if _get is not None else _d
            r = f(other)
            if r is not _notimpl:
                _probe(_name, f, self, other, r, _owner)
            return r
        global _WRAPPER_CODE
        _WRAPPER_CODE = guarded.__code__
        guarded.__name__, guarded.__qualname__ = name, f"{_getattr(owner, '__qualname__', '?')}.{name}"
        guarded.__doc__, guarded.__wrapped__ = _getattr(d, "__doc__", None), d
        return guarded

    def arm(cls, deep=True, _heap=1 << 9, _flags=_flags, _armed=armed, _wrap=wrap, _wrappers=wrappers, _known=known, _names=_names, _suspect=_suspect, _setattr=_setattr,
            _vars=_vars, _mro=_mro, _id=_id, _tuple=tuple, _exception=_exception, _isinstance=_isinstance):
        if not _isinstance(cls, type):
            return
        try:
            chain = _mro(cls) if deep else (cls,)
        except _exception:
            return
        for k in chain:
            if not _flags(k) & _heap:      # a static type: never the code under test's (nor settable)
                continue
            own = _vars(k)
            seen = _tuple([own.get(n) for n in _names])
            last = _known.get(_id(k))     # (by id, the class held: a metaclass's `__hash__` is not asked)
            if last is not None and last[0] is k and last[1] == _tuple(map(_id, seen)):     # (`is`: `==` would run their code)
                continue
            for n, d in zip(_names, seen):
                if d is None or _wrappers.get(_id(d)) is d or not _suspect(n, d, k):
                    continue
                g = _wrap(n, d, k)
                try:
                    _setattr(k, n, g)
                except _exception:
                    continue        # a static type: not the code under test's
                _wrappers[_id(g)] = g
                if not _armed or _armed[-1] is not k:
                    _armed.append(k)
            now = _tuple([own.get(n) for n in _names])
            _known[_id(k)] = (k, _tuple(map(_id, now)), now)      # (the dunders held: their ids stay theirs)

    def walk(values, _arm=arm, _type=_type, _scalars=_scalars, _containers=_containers, _budget=_budget,
             _isinstance=_isinstance, _getattribute=_getattribute, _dict=_dict, _list=_list, _exception=_exception,
             _id=_id, _set=_set, _seq=(list, tuple, set, frozenset), _islice=itertools.islice, _heap=1 << 9,
             _flags=_flags, _met=_dict()):
        todo, n, types, seen = _list(values), 0, _set(), _set()
        while todo and n < _budget:
            x = todo.pop()
            n += 1
            t = _type(x)
            if t in _scalars:
                if t is type:
                    _arm(x)
                continue
            if _id(x) in seen:
                continue
            seen.add(_id(x))
            if t not in types and _flags(t) & _heap:
                types.add(t)
                _arm(t, _met.get(_id(t)) is not t)      # its bases once; then itself (a dunder set late)
                _met[_id(t)] = t
            try:
                if _isinstance(x, _dict):       # (the builtin's own iteration: no code of a subclass runs)
                    for k, v in _islice(_dict.items(x), 24):
                        todo += (k, v)
                else:
                    for base in _seq:
                        if _isinstance(x, base):
                            todo += _islice(base.__iter__(x), 24)
                            break
                if t not in _containers:
                    inner = _getattribute(x, "__dict__")
                    if _type(inner) is _dict:
                        todo += _islice(_dict.values(inner), 24)
            except _exception:
                continue

    def sweep(_roots=_ROOTS, _armed=armed, _arm=arm, _subclasses=type.__subclasses__, _id=_id, _set=_set, _seen=_set(),
              _list=_list):
        """Before each test: arm the classes made since the last sweep directly on a builtin root
        (`type("L", (), ...)`, `class N(int)`) or on a class armed before, and arm again a class
        whose dunder was replaced (a dunder assigned after the class was made). Cheap: only new
        direct subclasses are looked at."""
        for root in (*_roots, *_armed):
            for k in _subclasses(root):
                if _id(k) not in _seen:
                    _seen.add(_id(k))
                    _arm(k)
        for k in _list(_armed):
            _arm(k, False)

    return arm, walk, sweep


def every_class(_subclasses=type.__subclasses__, _type=type, _set=set, _id=id, _exception=Exception):
    """Every class alive (a walk of `__subclasses__` from `object`)."""
    out, seen, todo = [], _set(), [object]
    while todo:
        k = todo.pop()
        try:
            subs = _subclasses(k)
        except _exception:
            continue
        for s in subs:
            if _id(s) not in seen:
                seen.add(_id(s))
                out.append(s)
                todo.append(s)
    return out


class Boundaries(ast.NodeTransformer):
    """Every call `f(a)` of a test module -> `CALL_SENTINEL.ret(f(a))`: the classes of its result are
    armed (the call itself is made where it was: a callee's `stacklevel` still names the test). Calls that need their caller's frame (`super()`, `locals()`,
    `eval(...)`) and the grader's own planted calls (a method of a string constant) stay as written."""

    def visit_Call(self, node):
        self.generic_visit(node)
        f = node.func
        if (isinstance(f, ast.Name) and f.id in _FRAME_CALLS) or (
                isinstance(f, ast.Attribute) and isinstance(f.value, ast.Constant) and isinstance(f.value.value, str)):
            return node
        ret = ast.Attribute(ast.Constant(CALL_SENTINEL), "ret", ast.Load())
        return ast.copy_location(ast.Call(ret, [node], []), node)


def unwrap(d, _function=type(_trusted), _type=type):
    """The original dunder behind one of this module's wrappers (`d` itself otherwise)."""
    return d.__defaults__[0] if _type(d) is _function and d.__code__ is _WRAPPER_CODE else d


def compile_tree(tree, path, honest_asserts, state_compile):
    """A test module's AST as the grader compiles it: its state inlined (`state_compile`), `assert a
    == b` honest (`honest_asserts`), and, once `install` ran (repository mode), every call a boundary."""
    tree = honest_asserts().visit(state_compile(tree, path))
    return Boundaries().visit(tree) if BOUNDARY is not None else tree


def install(emit, probes, _build=builtins.__build_class__, _audit=sys.addaudithook, _type=type,
            _isinstance=isinstance, _exception=Exception):
    """Arm classes from now on (before any code under test runs); `BOUNDARY`: the call-boundary
    object the grader's loader binds to `CALL_SENTINEL`. Returns a pytest plugin whose
    `pytest_runtest_call` sweeps new classes and the fixtures' values before each test's call phase."""
    arm, walk, sweep = guards(emit, probes)
    for k in every_class():
        arm(k, False)
    sweep()

    def __build_class__(func, name, /, *bases, _build=_build, _arm=arm, _isinstance=_isinstance, _type=_type, **kw):
        cls = _build(func, name, *bases, **kw)
        if _isinstance(cls, _type):
            _arm(cls)
        return cls
    builtins.__build_class__ = __build_class__

    def hook(event, args, _arm=arm, _isinstance=_isinstance, _type=_type, _exception=Exception):
        if event == "object.__setattr__" and len(args) > 2 and args[1] == "__class__" and _isinstance(args[2], _type):
            try:
                _arm(args[2])
            except _exception:
                pass
    _audit(hook)

    class Boundary:
        __slots__ = ("ret",)

    def ret(r, _walk=walk):
        _walk((r,))
        return r
    global BOUNDARY
    BOUNDARY = b = Boundary()
    b.ret = ret

    class Plugin:
        def pytest_runtest_call(self, item, _sweep=sweep, _walk=walk, _getattr=getattr, _exception=Exception):
            _sweep()
            try:        # the fixtures' values (a conftest's fixture is no test module: no call boundary)
                _walk(_getattr(item, "funcargs", {}).values())
            except _exception:
                pass
    return Plugin()
