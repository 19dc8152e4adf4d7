"""Paddock's in-sandbox assert helpers (installed read-only at /verifier/paddock_asserts.py).

The grader (`grader_plugin.py`, `paddock_grader` in the sandbox) loads this file by path in the
pytest child before any code under test runs, as `paddock_asserts`: `honest_eq` (a test module's
`assert a == b`, through `HonestAsserts`), the image's pytest plugins (`image_plugins`), the
canaries' perturber (`perturb`, bound by `bind_perturber`), the test modules' state (constants
inlined, the rest pinned and checked: `state_compile`/`state_pin`/`state_items`/`state_check`),
and `inspect.currentframe` for the code under test (`install_frame_views`). `trusted_function`
asks the grader's audit hook, through an audit event, whether a function's code is trusted.

Standard library only at import (it runs inside the task's image; `grader_sites` is loaded by
path there, imported from the package only on the host; so are `grader_values`, `grader_liars`).
Must not import: pytest, Paddock other than nodeagent.verifier.grader_sites and nodeagent.verifier.grader_values and nodeagent.verifier.grader_liars.
"""

import ast
import copy
import os
import sys
import types

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
    _values._check_lies((a, b))     # `__eq__ = int.__ne__` on an int subclass: a builtin slot that lies
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


def _load_sites(path="/verifier/paddock_sites.py", name="paddock_sites", given=None):
    """In the sandbox: `grader_sites` (`grader_values`), loaded by path before any code under test
    (`grade.SITES_PATH`, `grade.VALUES_PATH`); `given`: globals it finds already set."""
    import importlib.util
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    module.__dict__.update(given or {})
    spec.loader.exec_module(module)
    return module


if __name__.startswith("nodeagent."):      # on the host (tests): the package's own copies
    from nodeagent.verifier import grader_liars as _liars
    from nodeagent.verifier import grader_sites as _sites
    from nodeagent.verifier import grader_values as _values
else:
    _sites, _liars = _load_sites(), _load_sites("/verifier/paddock_liars.py", "paddock_liars")
    _values = _load_sites("/verifier/paddock_values.py", "paddock_values", {"paddock_unwrap": _liars.unwrap})
perturb = _sites.perturb        # the canaries' perturber (`grader_sites.perturb`)
ROLES = {"\x00paddock-role-r\x00": "real", "\x00paddock-role-p\x00": "perturbed", "\x00paddock-role-f\x00": "fail"}


def _perturber(agent=frozenset(), _format=perturb, _guards=_values.guards, _site_eq=_sites.site_eq,
               _site_call=_sites.site_call, _probes=_sites._probes, _approx=_values.approx_types()):
    """A private object whose `.format` is `perturb` and `.eq`/`.call`/`.cmp`/`.chain`/`.sub`/
    `.op`/`.isinstance` the assertion-site guards (`grader_sites` behind `grader_values`' value
    guards; `agent`: `grader_values.agent_code`): planted sources call `SENTINEL.eq(a, b)`, and the grader swaps
    the string constant for this object in the compiled code, so no name a test could rebind
    leads to it (nor to these functions: default arguments)."""
    class Perturber:
        __slots__ = ("format", "eq", "call", "cmp", "chain", "sub", "op", "isinstance")
    p = Perturber()
    p.format, (p.eq, p.call, p.cmp, p.chain, p.sub, p.op, p.isinstance) = _format, _guards(
        _site_eq, _site_call, _probes, _approx, agent)
    return p


def bind_perturber(code, source=None, _roles=None, _role_class=_values.role_class, _perturb=perturb,
                   _probes=_sites._probes, _names=ROLES, _agent_code=_values.agent_code, _frozenset=frozenset):
    """`code` with every canary sentinel constant (in it and its nested code) replaced by a fresh
    perturber, and every role constant of a guarded test's copies by its role object (one fresh
    class per module: `grader_values.role_class`); kept nowhere else, only the compiled tests hold
    them. `source`: the planted module's bytes (the functions the agent wrote: `grader_values.agent_code`)."""
    agent = source if type(source) is _frozenset else _agent_code(source)
    if _roles is None:
        cls = _role_class(_perturb, _probes)
        _roles = {k: cls(v) for k, v in _names.items()}
    if not any(type(c) is str and (c == CANARY_SENTINEL or c in _roles or c == _liars.CALL_SENTINEL)
               or isinstance(c, type(code)) for c in code.co_consts):
        return code
    consts = tuple(_perturber(agent) if type(c) is str and c == CANARY_SENTINEL else _roles[c] if type(c) is str and c
                   in _roles else _liars.BOUNDARY if type(c) is str and c == _liars.CALL_SENTINEL else
                   bind_perturber(c, agent, _roles) if isinstance(c, type(code)) else c for c in code.co_consts)
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


# -- the test modules' own state: read-only constants compiled into the tests (`InlineConstants`),
# the rest pinned in a generator's frame and compared at every test (docs/verifier.md "The tests'
# own state")

_MUTATORS = frozenset({"append", "extend", "insert", "remove", "pop", "popitem", "clear", "update", "setdefault",
                       "add", "discard", "sort", "reverse", "difference_update", "intersection_update",
                       "symmetric_difference_update", "__setitem__", "__delitem__", "__iadd__", "__ior__",
                       "fill", "resize", "put", "appendleft", "extendleft", "rotate", "move_to_end"})
_READERS = frozenset({"len", "sorted", "list", "tuple", "set", "frozenset", "dict", "isinstance", "repr", "str",
                      "print", "zip", "enumerate", "range", "min", "max", "sum", "any", "all", "parametrize",
                      "param", "approx", "deepcopy", "copy", "iter", "reversed", "hash", "type", "bool", "int",
                      "float", "format", "map", "filter", "fixture"})
_INLINE_NODES = 64      # a mutable literal is inlined (a fresh copy per read) only when this small


def _immutable(v):
    t = type(v)
    return t in (int, float, complex, str, bytes, bool, type(None)) or t in (tuple, frozenset) and all(map(_immutable, v))


def _literal_value(node):
    try:
        return True, ast.literal_eval(node)
    except (ValueError, TypeError, SyntaxError, MemoryError, RecursionError):
        return False, None


def _bindings(nodes, into_functions):
    """name -> how often the code in `nodes` binds it (for the module's scope: not inside function,
    class or lambda bodies unless `into_functions`); "*" for a star import."""
    out, todo = {}, list(nodes)

    def bind(name):
        out[name] = out.get(name, 0) + 1
    while todo:
        n = todo.pop()
        if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            bind(n.name)
            if not into_functions:
                todo += n.decorator_list + (n.bases + [k.value for k in n.keywords] if isinstance(n, ast.ClassDef)
                                            else n.args.defaults + [d for d in n.args.kw_defaults if d])
                continue
        elif isinstance(n, ast.Lambda) and not into_functions:
            continue
        elif isinstance(n, ast.Name) and isinstance(n.ctx, (ast.Store, ast.Del)):
            bind(n.id)
        elif isinstance(n, (ast.Import, ast.ImportFrom)):
            for a in n.names:
                bind((a.asname or a.name).partition(".")[0])
        elif isinstance(n, ast.arg):
            bind(n.arg)
        elif isinstance(n, (ast.Global, ast.Nonlocal)):
            for name in n.names:
                bind(name)
        elif isinstance(getattr(n, "name", None), str) and isinstance(n, (ast.ExceptHandler, ast.MatchAs,
                                                                           ast.MatchStar)):
            bind(n.name)
        elif isinstance(n, ast.MatchMapping) and n.rest:
            bind(n.rest)
        todo += ast.iter_child_nodes(n)
    return out


def _uses(tree):
    """(names and attribute names the module may mutate or hand to other code, names compared
    with `is`, names rebound by `global`, string constants, dynamic access to namespaces)."""
    touched, identity, declared, strings, dynamic = set(), set(), set(), set(), False

    def key(e):
        return e.id if isinstance(e, ast.Name) else "." + e.attr if isinstance(e, ast.Attribute) else None
    for n in ast.walk(tree):
        if isinstance(n, ast.Global):
            declared.update(n.names)
        elif isinstance(n, ast.Constant) and type(n.value) is str and len(n.value) < 200:
            strings.add(n.value.rpartition(".")[2])
        elif isinstance(n, ast.Name) and n.id in ("globals", "vars", "setattr", "delattr", "locals"):
            dynamic = True
        elif isinstance(n, (ast.Subscript, ast.Attribute)) and isinstance(n.ctx, (ast.Store, ast.Del)):
            touched.add(key(n.value))
            if isinstance(n, ast.Attribute):
                touched.add("." + n.attr)
        elif isinstance(n, ast.AugAssign):
            touched.add(key(n.target))
        elif isinstance(n, ast.Attribute) and n.attr in _MUTATORS:
            touched.add(key(n.value))
        elif isinstance(n, ast.Compare) and any(isinstance(o, (ast.Is, ast.IsNot)) for o in n.ops):
            identity.update(k for k in map(key, [n.left, *n.comparators]) if k)
        elif isinstance(n, ast.Call):
            f = n.func
            name = f.attr if isinstance(f, ast.Attribute) else getattr(f, "id", "")
            site = isinstance(f, ast.Attribute) and isinstance(f.value, ast.Constant) and f.value.value == CANARY_SENTINEL
            if not (name in _READERS or name.lower().startswith("assert") or site):     # (site: grader_sites)
                touched.update(key(a.value if isinstance(a, ast.Starred) else a) for a in n.args)
                touched.update(key(k.value) for k in n.keywords)
    touched.discard(None)
    return touched, identity, declared, strings, dynamic


def state_plan(tree):
    """What of a test module's state its code never rebinds (from its AST): {"globals": {name:
    (literal?, value, deep)}, "attrs": {(class, name): (literal?, value, deep)}, "classes": set,
    "inline": {name or (class, name): value node}}. `deep`: nothing in the module mutates it or
    hands it to other code, so its contents are pinned too."""
    touched, identity, declared, strings, dynamic = _uses(tree)
    counts = _bindings(tree.body, into_functions=False)
    plan = {"globals": {}, "attrs": {}, "classes": set(), "inline": {}, "params": _parametrized(tree),
            "nonlocal": {name for n in ast.walk(tree) if isinstance(n, ast.Nonlocal) for name in n.names}}
    if "*" in counts:       # a star import may bind any name: only the parameters are pinned
        return plan

    def consider(label, value_node, excluded, deep_key):
        ok, lit = _literal_value(value_node)
        deep = deep_key not in touched
        if ok and not excluded and (_immutable(lit) or deep and sum(1 for _ in ast.walk(value_node)) <= _INLINE_NODES):
            plan["inline"][label] = value_node
        return ok, lit, deep
    for stmt in tree.body:
        target = stmt.targets[0] if isinstance(stmt, ast.Assign) and len(stmt.targets) == 1 else \
            stmt.target if isinstance(stmt, ast.AnnAssign) and stmt.value is not None else None
        if isinstance(target, ast.Name) and counts.get(target.id) == 1 and target.id not in declared \
                and not dynamic and target.id not in strings:
            plan["globals"][target.id] = consider(target.id, stmt.value, target.id in identity, target.id)
        if isinstance(stmt, ast.ClassDef) and counts.get(stmt.name) == 1 and not stmt.keywords:
            plan["classes"].add(stmt.name)
            inner = _bindings(stmt.body, into_functions=False)
            for s in stmt.body:
                t = s.targets[0] if isinstance(s, ast.Assign) and len(s.targets) == 1 else \
                    s.target if isinstance(s, ast.AnnAssign) and s.value is not None else None
                if isinstance(t, ast.Name) and inner.get(t.id) == 1 and "." + t.id not in touched \
                        and t.id not in strings and not dynamic:
                    plan["attrs"][(stmt.name, t.id)] = consider((stmt.name, t.id), s.value, "." + t.id in identity,
                                                                "." + t.id)
    return plan


def _parametrized(tree):
    """(class name or "", name the test is bound to) -> [(argument names, digests of the literal
    rows)] of its `parametrize` decorators whose values are all literals (a canary's opaque name
    is bound to a copy of the test: `test_<hex> = test_x`)."""
    out = {}
    for scope, body in [("", tree.body)] + [(c.name, c.body) for c in tree.body if isinstance(c, ast.ClassDef)]:
        defs = {}
        for s in body:
            if isinstance(s, (ast.FunctionDef, ast.AsyncFunctionDef)):
                rows = []
                for d in s.decorator_list:
                    f = d.func if isinstance(d, ast.Call) else None
                    if (getattr(f, "attr", None) or getattr(f, "id", None)) != "parametrize" or len(d.args) < 2:
                        continue
                    ok_names, names = _literal_value(d.args[0])
                    ok, values = _literal_value(d.args[1])
                    names = names.replace(" ", "").split(",") if type(names) is str else names
                    if ok and ok_names and type(names) in (list, tuple) and type(values) in (list, tuple):
                        one = len(names) == 1
                        rows.append((tuple(names), {digest(v if one else tuple(v)) for v in values
                                                    if one or type(v) in (list, tuple) and len(v) == len(names)}))
                defs[s.name] = rows
            elif isinstance(s, ast.Assign) and len(s.targets) == 1 and isinstance(s.targets[0], ast.Name) \
                    and isinstance(s.value, ast.Name) and s.value.id in defs:
                defs[s.targets[0].id] = defs[s.value.id]
        out.update({(scope, name): rows for name, rows in defs.items() if rows})
    return out


class InlineConstants(ast.NodeTransformer):
    """Reads of a module's read-only literal constants inside its functions (`WANT`,
    `Expect.want`) compiled to the literal itself (a fresh copy for a small list/dict/set): the
    value the tests compare is in their own code, not in a namespace the code under test can
    write. A function (with what it nests) that binds the name keeps its own."""

    def __init__(self, plan):
        self.names = {k: v for k, v in plan["inline"].items() if type(k) is str}
        self.attrs = {k: v for k, v in plan["inline"].items() if type(k) is tuple}
        self.shadow = None

    def _function(self, node):
        returns = getattr(node, "returns", None)
        if returns is not None:
            node.returns = None
            try:
                return self._function(node)
            finally:
                node.returns = returns
        if self.shadow is not None:
            return self.generic_visit(node)
        self.shadow = _bindings([node], into_functions=True)
        try:
            return self.generic_visit(node)
        finally:
            self.shadow = None
    visit_FunctionDef = visit_AsyncFunctionDef = visit_Lambda = _function

    def visit_arg(self, node):          # annotations keep their names (`from __future__ import annotations`)
        return node

    def visit_AnnAssign(self, node):
        node.value = self.visit(node.value) if node.value is not None else None
        return node

    def _copy(self, value, node):
        return ast.copy_location(copy.deepcopy(value), node)     # a fresh tree: a fresh object per read

    def visit_Name(self, node):
        if self.shadow is not None and isinstance(node.ctx, ast.Load) and node.id in self.names \
                and node.id not in self.shadow:
            return ast.fix_missing_locations(self._copy(self.names[node.id], node))
        return node

    def visit_Attribute(self, node):
        v = node.value
        if self.shadow is not None and isinstance(node.ctx, ast.Load) and isinstance(v, ast.Name) \
                and (v.id, node.attr) in self.attrs and v.id not in self.shadow:
            return ast.fix_missing_locations(self._copy(self.attrs[(v.id, node.attr)], node))
        return self.generic_visit(node)


def framework_targets(classes=False):
    """pytest's fixture machinery, watched like its reporting (`_Plugin.snapshot`): a patched
    `FixtureDef.execute` or `call_fixture_func` would hand every test, and its canaries, the same
    rewritten fixture value. `classes`: the classes whose whole `__dict__` is watched. Also this
    module's binder of the canaries' perturber and the assertion-site guards (`grader_sites`)."""
    fixtures = sys.modules.get("_pytest.fixtures")
    own = [(sys.modules[__name__], n) for n in ("bind_perturber", "_perturber", "_sites", "_values", "_liars",
                                                  "HonestAsserts")] + [(_liars, n) for n in ("BOUNDARY", "_WRAPPER_CODE",
                                                                                         "unwrap")] \
        if not classes else []
    if classes:     # pytest's report, call, item and fixture classes (`TestReport.outcome`)
        import _pytest.nodes
        import _pytest.python
        import _pytest.reports
        import _pytest.runner
        return [_liars.Boundaries, HonestAsserts, _pytest.reports.BaseReport, _pytest.reports.TestReport, _pytest.reports.CollectReport,
                _pytest.runner.CallInfo, _pytest.python.Function, _pytest.nodes.Item, _pytest.nodes.Node] + [
            c for c in (getattr(fixtures, n, None) for n in ("FixtureDef", "FixtureRequest", "SubRequest"))
            if isinstance(c, type)]
    if fixtures is None:
        return own
    return own + [(fixtures, n) for n in ("call_fixture_func", "pytest_fixture_setup", "resolve_fixture_function",
                                          "getfixturemarker") if hasattr(fixtures, n)]


_MISSING, _SCALARS = object(), frozenset({int, bool, str, bytes, type(None)})


_APPROX = _values.approx_types()     # pytest.approx's classes


def digest(v, ids=None, _budget=None, _type=type, _id=id, _float=float, _tuple=tuple, _list=list, _dict=dict,
           _set=set, _frozenset=frozenset, _complex=complex, _bytearray=bytearray, _approx=_APPROX):
    """A comparable picture of `v` that runs none of its code: builtin values by value (exact
    types, recursively), pytest.approx objects by their fields, anything else by identity (its
    type's and its own). `ids` collects the ids of the mutable containers met."""
    budget = _budget if _budget is not None else [20000]
    t = _type(v)
    if t in _SCALARS:
        return (t.__name__, v)
    if t is _float:
        return ("float", v.hex())
    if t is _complex:
        return ("complex", v.real.hex(), v.imag.hex())
    budget[0] -= 1
    if budget[0] < 0:
        return ("id", _id(t), _id(v))
    if t in (_list, _dict, _set, _bytearray) and ids is not None:
        ids.add(_id(v))
    if t in (_list, _tuple):
        return (t.__name__, *[digest(x, ids, budget) for x in v])
    if t is _dict:
        return ("dict", *[(digest(k, ids, budget), digest(x, ids, budget)) for k, x in v.items()])
    if t in (_set, _frozenset):
        return (t.__name__, _frozenset(digest(x, ids, budget) for x in v))
    if t is _bytearray:
        return ("bytearray", bytes(v))
    if t in _approx:
        return ("approx", _id(t), digest(_dict(object.__getattribute__(v, "__dict__")), ids, budget))
    return ("id", _id(t), _id(v))


def _state_store(_audit=sys.audit, _list=list, _type=type, _vars=vars, _set=set, _getattr=getattr,
                 _isinstance=isinstance, _digest=digest, _honest=honest_eq):
    """The pins, in this generator's frame. Requests: ("plan", path, plan), ("pin", module, path),
    ("items", [(nodeid, params)]), ("check", nodeid or None, when) -> [what changed]. Asked with
    the code under test on the stack (the audit hook judges it), it answers None."""
    plans, pins, params, touched, module_pins, pending = {}, [], {}, _set(), {}, _list()
    literal_params = {}
    out = None

    def pin_value(label, space, key, value, lit, deep, where):
        want = _digest(lit) if lit is not _MISSING else _digest(value, _set()) if deep else None
        pins.append([label, space, key, value, want, where,     # frozen: an immutable value, as its literal
                     lit is not _MISSING and _immutable(lit) and _digest(value) == want])

    def changed(p):
        label, space, key, value, want, _where, frozen = p
        if _type(space).__name__ == "cell":
            try:
                cur = space.cell_contents
            except ValueError:
                cur = _MISSING
        else:
            cur = space.get(key, _MISSING) if space is not None else value
        if want is None or (frozen and cur is value):      # an immutable value still bound: unchanged
            return cur is not value
        ids = _set()
        now = _digest(cur, ids)
        if now == want:
            return False
        if ids & touched:       # a value a test handed to the code under test: its to change
            p[3], p[4] = cur, now
            return False
        return True
    while True:
        req = yield out
        out = None
        culprit = _list()
        _audit("paddock.stack", culprit)
        if any(culprit) or _type(req) is not tuple or not req:
            continue
        try:
            if req[0] == "plan":
                plans[req[1]] = req[2]
            elif req[0] == "pin":
                module, path = req[1], req[2]
                plan = plans.pop(path, None)
                if type(plan) is not dict:
                    continue
                literal_params[path] = plan.get("params") or {}
                space = _vars(module)
                where = module_pins.setdefault(path, _list())
                start = len(pins)
                for name, (ok, lit, deep) in plan["globals"].items():
                    if name in space:
                        pin_value(f"{path}:{name}", space, name, space[name], lit if ok and (deep or _immutable(lit))
                                  else _MISSING, deep, path)
                for (cls_name, name), (ok, lit, deep) in plan["attrs"].items():
                    cls = space.get(cls_name)
                    if _isinstance(cls, type) and name in _vars(cls):
                        pin_value(f"{path}:{cls_name}.{name}", _vars(cls), name, _vars(cls)[name],
                                  lit if ok and (deep or _immutable(lit)) else _MISSING, deep, path)
                fns = [(n, f) for n, f in space.items() if _type(f).__name__ == "function"]
                fns += [(f"{c}.{n}", f) for c in plan["classes"] if _isinstance(space.get(c), type)
                        for n, f in _vars(space[c]).items() if _type(f).__name__ == "function"]
                for name, fn in fns:        # the module's own functions (not a wrapper the code under test made)
                    if _getattr(_getattr(fn, "__code__", None), "co_filename", None) != path:
                        continue
                    defaults = [*enumerate(_getattr(fn, "__defaults__", None) or ()),
                                *(_getattr(fn, "__kwdefaults__", None) or {}).items()]
                    for i, d in defaults:   # a non-empty one: an empty one is a cache the function fills
                        if _type(d) in (_list, dict, _set) and d:
                            pin_value(f"{path}:{name} default {i}", None, None, d, _MISSING, True, path)
                    for i, cell in enumerate(() if plan["nonlocal"] else _getattr(fn, "__closure__", None) or ()):
                        try:
                            pin_value(f"{path}:{name} closure {i}", cell, None, cell.cell_contents, _MISSING, False, path)
                        except ValueError:
                            pass
                where += pins[start:]
                pending += [p[0] for p in pins[start:] if changed(p)]       # already moved while the module ran
                if space.get("_paddock_honest_eq", _honest) is not _honest:     # rebound while the module ran
                    pending.append(f"{path}:_paddock_honest_eq")
            elif req[0] == "items":
                for nodeid, ps, cls, name in req[1]:
                    params[nodeid] = [ps, _digest(ps, _set())]
                    file = nodeid.partition("::")[0]
                    rows = [r for where, lit in literal_params.items() if where.endswith("/" + file) or where == file
                            for r in lit.get((cls, name), ())]
                    for names, allowed in rows:     # the values pytest holds are rows the source wrote
                        if _type(ps) is dict and all(n in ps for n in names) and _digest(
                                ps[names[0]] if len(names) == 1 else tuple(ps[n] for n in names)) not in allowed:
                            pending.append(f"{nodeid}: its parameters are not its source's")
            elif req[0] == "check":
                nodeid, when = req[1], req[2]
                out, pending[:] = pending[:], []
                if nodeid is None:
                    out += [p[0] for p in pins if changed(p)]
                    continue
                path = nodeid.partition("::")[0]
                if when == "call":      # the module's pins (a change at set-up or teardown shows at the next call)
                    out += [p[0] for where, ps in module_pins.items() if where.endswith(("/" + path, "/conftest.py"))
                            or where == path for p in ps if changed(p)]
                if when == "setup" and nodeid in params:
                    ps, want = params[nodeid]
                    ids = _set()
                    now = _digest(ps, ids)
                    if now != want and not ids & touched:
                        out.append(f"{nodeid}: its parameters")
                    params[nodeid][1] = now
                    touched.update(ids)
        except Exception:       # (a fault of the grader's own: no verdict on the code under test)
            out = None


_STATE = _state_store()
next(_STATE)


def state_compile(tree, path, _store=_STATE):
    """The grader's loader: plan a test module's pins (sent to the store) and inline its
    read-only constants (see `InlineConstants`)."""
    plan = state_plan(tree)
    _store.send(("plan", path, plan))
    return InlineConstants(plan).visit(tree)


def state_pin(module, path, _store=_STATE):
    """After the module ran: pin its state; what already differs from its source's literals."""
    return _store.send(("pin", module, path)) or []


def state_items(items, _store=_STATE, _getattr=getattr):
    """After collection: pin the conftest modules' state (from their sources, which the code
    under test cannot write) and the parameter values every item holds."""
    for module in list(sys.modules.values()):
        where = vars(module).get("__file__") if type(module) is type(sys) else None
        if type(where) is str and os.path.basename(where) == "conftest.py":
            try:
                with open(where, "rb") as f:
                    _store.send(("plan", where, state_plan(ast.parse(f.read(), where))))
            except (OSError, SyntaxError, ValueError):
                continue
            _store.send(("pin", module, where))
    _store.send(("items", [(i.nodeid, _getattr(_getattr(i, "callspec", None), "params", None),
                            _getattr(_getattr(i, "cls", None), "__name__", ""), _getattr(i, "originalname", ""))
                           for i in items if _getattr(i, "callspec", None) is not None]))


def state_check(nodeid=None, when=None, _store=_STATE):
    """What changed since pinned: the module's pins of test `nodeid` (all when None) and, at its
    setup, its parameters. A store closed by the code under test answers that."""
    try:
        return _store.send(("check", nodeid, when)) or []
    except BaseException:       # StopIteration (closed), or anything thrown into it
        return ["the grader's state store was closed"]


# -- frames for the code under test: where it was called from, nothing of what the caller holds -

class _CodeView:
    """A frame's code as the code under test sees it: names and first line, never constants,
    names used or bytecode (a test's expected values)."""
    __slots__ = ("co_filename", "co_name", "co_qualname", "co_firstlineno")
    __class__ = property(lambda self: types.CodeType)       # inspect.iscode / getfile


class _FrameView:
    """A frame as the code under test sees it: file, line and `__name__` of each caller down the
    stack (`f_back`), no locals, no globals but `__name__`, no real frame behind it."""
    __slots__ = ("f_back", "f_code", "f_lineno", "f_lasti", "f_globals", "f_locals", "f_builtins", "f_trace")
    __class__ = property(lambda self: types.FrameType)      # inspect.isframe / getfile


def frame_view(frame, _new=object.__new__, _get=dict.get, _dict=dict):
    """The whole chain from `frame` down, copied into views (made by trusted code from real frames)."""
    head = prev = None
    while frame is not None:
        code, c, v = frame.f_code, _new(_CodeView), _new(_FrameView)
        c.co_filename, c.co_name, c.co_qualname, c.co_firstlineno = (
            code.co_filename, code.co_name, code.co_qualname, code.co_firstlineno)
        v.f_code, v.f_lineno, v.f_lasti, v.f_back, v.f_trace = c, frame.f_lineno, -1, None, None
        v.f_globals, v.f_locals, v.f_builtins = {"__name__": _get(frame.f_globals, "__name__")}, _dict(), _dict()
        if prev is None:
            head = v
        else:
            prev.f_back = v
        prev, frame = v, frame.f_back
    return head


def install_frame_views(_getframe=sys._getframe, _trusted=trusted_function, _view=frame_view,
                        _ns=types.SimpleNamespace):
    """`inspect.currentframe()` for the code under test (semver names its caller in a deprecation
    warning: `inspect.getfile(frame.f_back.f_code)`, `f_lineno`): the real frame only when nothing
    but trusted code is on the stack, in pytest's thread; a `frame_view` chain otherwise (so a
    trusted function that calls what it is given, `Mock(side_effect=inspect.currentframe)`, hands
    over no real frame either). The function's internals wait in a generator's frame, which
    answers only that function's own code; `sys._getframe` and every other frame-returning
    function stay refused to the code under test by the audit hook."""
    import _thread
    import inspect
    home, ident = _thread.get_ident(), _thread.get_ident

    def frames(code):
        out = None
        while True:
            yield out
            asker, out = _getframe(1), None         # the frame that sent: `_paddock_currentframe`'s, or refused
            if asker.f_code is not code:
                continue
            frame = out = asker.f_back
            walk = frame if ident() == home else None
            while walk is not None and _trusted(_ns(__code__=walk.f_code)):
                walk = walk.f_back
            if ident() != home or walk is not None:
                out = _view(frame)
            frame = walk = asker = None

    def _paddock_currentframe(_frames=None):    # (not a name the audit hook counts as a frame giver)
        return _frames.send(None)
    store = frames(_paddock_currentframe.__code__)
    next(store)
    _paddock_currentframe.__defaults__ = (store,)
    _paddock_currentframe.__doc__ = inspect.currentframe.__doc__
    inspect.currentframe = _paddock_currentframe
