"""The mock-service engine: one operation of a data-declared service, state in, state out.

`apply(service, state, operation, args)` runs the operation's steps (the rule language of
controller/contracts/services.py) on a deep copy of `state` and returns
`{"ok": True, "state": new_state, "result": value}` or `{"ok": False, "error": message}` (the
agent's mistake: a failed `require`, a missing path; the state is unchanged). A malformed rule
the validator let through raises `RuleError` (the task's fault).

The rule language is part of the task contract, so the engine lives with the contracts: the
task bank and the importers replay a task's reference actions with it to get the goal state.
This file is standard library only and imports nothing of Paddock: the service host
(nodeagent/services/host.py) ships its bytes into the rollout's sandbox and runs them there per operation (`python3 -I -S -c`), with
`{"service" | "service_path", "state" | "state_path", "operation", "args"}` as JSON on stdin and the reply as JSON on stdout
(`main`). The same function runs on the node to check the sandbox's reply.

Bounded: at most `MAX_EVALS` expression evaluations per operation. No I/O except `main`
(stdin/stdout, run as a script inside the sandbox). Must not import: anything of Paddock, zmq,
sqlite3, socket, subprocess.
"""
from __future__ import annotations

import copy
import json
import sys

MAX_EVALS = 20000
_MISSING = object()


class RuleError(Exception):
    """A rule cannot be evaluated (the task's fault, not the agent's)."""


class Refused(Exception):
    """The operation is refused: the message goes back to the agent."""


class _Run:
    def __init__(self, state, args):
        self.state, self.args, self.vars, self.evals = state, args, {}, 0

    def tick(self):
        self.evals += 1
        if self.evals > MAX_EVALS:
            raise RuleError(f"operation exceeded {MAX_EVALS} evaluations")

    # -- expressions ------------------------------------------------------------------------
    def ev(self, e):
        self.tick()
        if e is None or isinstance(e, (str, int, float, bool)):
            return e
        if isinstance(e, list):
            return [self.ev(x) for x in e]
        if not isinstance(e, dict) or len(e) != 1:
            raise RuleError(f"malformed expression {e!r}")
        (op, a), = e.items()
        fn = getattr(self, "op_" + op, None)
        if fn is None:
            raise RuleError(f"unknown operator {op!r}")
        return fn(a)

    def op_arg(self, a):
        return copy.deepcopy(self.args.get(a))

    def op_var(self, a):
        if a not in self.vars:
            raise RuleError(f"variable {a!r} is not bound")
        return self.vars[a]

    def op_lit(self, a):
        return copy.deepcopy(a)

    def op_object(self, a):
        return {k: self.ev(v) for k, v in a.items()}

    def op_get(self, a):
        v = self.lookup(a)
        return None if v is _MISSING else copy.deepcopy(v)

    def op_exists(self, a):
        return self.lookup(a) is not _MISSING

    def _pair(self, a):
        if not isinstance(a, list) or len(a) != 2:
            raise RuleError(f"operator needs [a, b], got {a!r}")
        return self.ev(a[0]), self.ev(a[1])

    def op_eq(self, a):
        x, y = self._pair(a)
        return x == y

    def op_ne(self, a):
        x, y = self._pair(a)
        return x != y

    def _cmp(self, a, f):
        x, y = self._pair(a)
        try:
            return f(x, y)
        except TypeError:
            raise Refused(f"cannot compare {x!r} and {y!r}") from None

    def op_lt(self, a):
        return self._cmp(a, lambda x, y: x < y)

    def op_le(self, a):
        return self._cmp(a, lambda x, y: x <= y)

    def op_gt(self, a):
        return self._cmp(a, lambda x, y: x > y)

    def op_ge(self, a):
        return self._cmp(a, lambda x, y: x >= y)

    def op_and(self, a):
        return all(self.ev(x) for x in a)

    def op_or(self, a):
        return any(self.ev(x) for x in a)

    def op_not(self, a):
        return not self.ev(a)

    def op_in(self, a):
        x, y = self._pair(a)
        try:
            return x in (y or ())
        except TypeError:
            return False

    def _num(self, a):
        x, y = self._pair(a)
        for v in (x, y):
            if isinstance(v, bool) or not isinstance(v, (int, float)):
                raise Refused(f"expected a number, got {v!r}")
        return x, y

    def op_add(self, a):
        x, y = self._num(a)
        return x + y

    def op_sub(self, a):
        x, y = self._num(a)
        return x - y

    def op_mul(self, a):
        x, y = self._num(a)
        return x * y

    def op_round(self, a):
        x, y = self._num(a)
        return round(x, int(y))

    def op_len(self, a):
        v = self.ev(a)
        return len(v) if isinstance(v, (list, dict, str)) else 0

    def op_concat(self, a):
        return "".join("" if v is None else str(v) for v in self.ev(a))

    def op_lower(self, a):
        v = self.ev(a)
        return v.lower() if isinstance(v, str) else v

    def op_keys(self, a):
        v = self.ev(a)
        return sorted(v) if isinstance(v, dict) else []

    def _items(self, a):
        v = self.ev(a["from"])
        return list(v.values()) if isinstance(v, dict) else list(v) if isinstance(v, list) else []

    def op_filter(self, a):
        where = {k: self.ev(x) for k, x in (a.get("where") or {}).items()}
        return [it for it in self._items(a)
                if isinstance(it, dict) and all(it.get(k) == v for k, v in where.items())]

    def op_sum(self, a):
        field = a.get("field")
        total = 0
        for it in self._items(a):
            v = it.get(field) if isinstance(it, dict) and field else it
            if isinstance(v, (int, float)) and not isinstance(v, bool):
                total += v
        return total

    def op_if(self, a):
        if not isinstance(a, list) or len(a) != 3:
            raise RuleError("if needs [cond, then, else]")
        return self.ev(a[1]) if self.ev(a[0]) else self.ev(a[2])

    # -- paths --------------------------------------------------------------------------------
    def segments(self, path):
        if not isinstance(path, list) or not path:
            raise RuleError(f"malformed path {path!r}")
        out = []
        for s in path:
            v = s if isinstance(s, (str, int)) and not isinstance(s, bool) else self.ev(s)
            if not isinstance(v, (str, int)) or isinstance(v, bool):
                raise Refused(f"a path segment must be a string or an integer, got {v!r}")
            out.append(v)
        return out

    def lookup(self, path):
        node = self.state
        for s in self.segments(path):
            node = _child(node, s)
            if node is _MISSING:
                return _MISSING
        return node

    def parent(self, path, create: bool):
        segs = self.segments(path)
        node = self.state
        for s in segs[:-1]:
            nxt = _child(node, s)
            if nxt is _MISSING:
                if not (create and isinstance(node, dict) and isinstance(s, str)):
                    raise Refused(f"no such entry: {'/'.join(map(str, segs))}")
                nxt = node[s] = {}
            node = nxt
        return node, segs[-1]

    # -- steps --------------------------------------------------------------------------------
    def run(self, steps):
        for step in steps:
            if "require" in step:
                if not self.ev(step["require"]):
                    raise Refused(str(self.ev(step.get("error", "refused"))))
            elif "let" in step:
                for k, v in step["let"].items():
                    self.vars[k] = self.ev(v)
            elif "set" in step:
                node, key = self.parent(step["set"][0], create=True)
                _put(node, key, self.ev(step["set"][1]))
            elif "append" in step:
                node, key = self.parent(step["append"][0], create=True)
                cur = _child(node, key)
                if cur is _MISSING:
                    _put(node, key, [])
                    cur = _child(node, key)
                if not isinstance(cur, list):
                    raise Refused(f"cannot append to {key!r}: not a list")
                cur.append(self.ev(step["append"][1]))
            elif "delete" in step:
                node, key = self.parent(step["delete"], create=False)
                if _child(node, key) is _MISSING:
                    raise Refused(f"no such entry: {key}")
                del node[key]
            elif "return" in step:
                return self.ev(step["return"])
            else:
                raise RuleError(f"unknown step {sorted(step)}")
        return {"ok": True}


def _child(node, key):
    if isinstance(node, dict):
        return node.get(key, _MISSING) if isinstance(key, str) else _MISSING
    if isinstance(node, list) and isinstance(key, int) and -len(node) <= key < len(node):
        return node[key]
    return _MISSING


def _put(node, key, value):
    if isinstance(node, dict) and isinstance(key, str):
        node[key] = value
    elif isinstance(node, list) and isinstance(key, int) and -len(node) <= key < len(node):
        node[key] = value
    else:
        raise Refused(f"cannot set {key!r} here")


def apply(service: dict, state: dict, operation: str, args: dict) -> dict:
    """Run `operation` of `service` on a copy of `state` (see the module docstring)."""
    ops = service.get("operations") or {}
    if operation not in ops:
        return {"ok": False, "error": f"unknown operation {operation!r}"}
    run = _Run(copy.deepcopy(state), dict(args or {}))
    try:
        result = run.run(ops[operation]["steps"])
    except Refused as exc:
        return {"ok": False, "error": str(exc)}
    return {"ok": True, "state": run.state, "result": result}


def replay(service: dict, state: dict, calls) -> dict:
    """The state after `calls` ([(operation, args)]) from `state`; RuleError names a call the
    rules refuse (a reference that does not run is the task's fault)."""
    for operation, args in calls:
        out = apply(service, state, operation, args)
        if not out["ok"]:
            raise RuleError(f"reference call {operation}({json.dumps(args, sort_keys=True)}) is refused: {out['error']}")
        state = out["state"]
    return state


def main() -> int:
    req = json.loads(sys.stdin.buffer.read())
    try:
        if "service" in req:
            service = req["service"]
        else:
            with open(req["service_path"], "rb") as f:
                service = json.loads(f.read())
        if "state" in req:
            state = req["state"]
        else:
            with open(req["state_path"], "rb") as f:
                state = json.loads(f.read())
        out = apply(service, state, req["operation"], req["args"])
    except (RuleError, RecursionError) as exc:
        out = {"ok": False, "rule_error": str(exc)}
    sys.stdout.write(json.dumps(out, sort_keys=True))
    return 0


if __name__ == "__main__":
    sys.exit(main())
