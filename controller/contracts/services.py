"""Mock services and simulated users as a task declares them: their schema and validation.

A conversational task (family `conversational`) carries `services` — each a small state machine
a task author writes as data — and `user`, the goal of the simulated user who talks to the
agent. This module is the contract both sides read: the task bank validates a task with it,
the node's service host and user simulator run what it accepts (docs/tasks.md, "Writing a
service and a user goal").

A **service** is `{description, state_schema, initial_state, operations}`; each operation is
`{description, parameters (JSON Schema of its arguments), steps}` and becomes one tool the
agent may call (its name is the operation's name). `steps` are the transition rules, run in
order on a copy of the state (nothing is kept unless every step succeeds):

| step | effect |
|---|---|
| `{require: COND, error: EXPR}` | stop with the error (the agent reads it) unless COND holds |
| `{let: {name: EXPR}}` | bind names, read back with `{var: name}` |
| `{set: [PATH, EXPR]}` / `{append: [PATH, EXPR]}` / `{delete: PATH}` | change the state |
| `{return: EXPR}` | the operation's result (default `{"ok": true}`) |

An expression is a JSON scalar (itself), a list (each item evaluated), or a one-key object
naming an operator (`OPERATORS`): `{arg: name}`, `{get: PATH}`, `{exists: PATH}`, `{lit: v}`,
`{object: {k: EXPR}}`, comparisons, `and`/`or`/`not`, `in`, arithmetic, `len`, `concat`,
`keys`, `filter`, `sum`, `if`. A PATH is a list of segments (strings, integers or
expressions) from the service's state root. After each operation the new state must still
match `state_schema`, else the operation is refused (the author's invariant).

A **user** (`USER_SCHEMA`) is a persona, an `instruction` (the goal as the user knows it),
`hidden` facts (given only when asked), an `opening` message, template `replies`, `stop`
conditions and, for `kind: model`, the simulator model's sampling (`temperature`, `seed`).

A leaf of the contracts: no I/O. Must not import: zmq, sqlite3, controller.* outside
contracts, nodeagent.
"""
from __future__ import annotations

import json
import re
from typing import Any, Mapping

from controller.contracts.tools import ALL_TOOLS

# The engine (controller/contracts/serviceengine.py, standard library only: it runs inside the
# rollout's sandbox) implements exactly these; tests/conversational checks that they agree.
OPERATORS = frozenset({"arg", "var", "get", "exists", "lit", "object", "eq", "ne", "lt", "le", "gt", "ge",
                       "and", "or", "not", "in", "add", "sub", "mul", "round", "len", "concat", "keys",
                       "filter", "sum", "if", "lower"})
STATEMENTS = frozenset({"require", "let", "set", "append", "delete", "return"})
MAX_STEPS_PER_OPERATION = 64
MAX_EXPRESSION_DEPTH = 24
MAX_STATE_BYTES = 1 << 20           # a service's state as JSON
NAME = r"^[A-Za-z_][A-Za-z0-9_]{0,63}$"
STOP_TOKEN = "###STOP###"           # a user's message containing it ends the conversation


class ServiceSpecError(ValueError):
    """A task's `services` or `user` is malformed; the message names the field."""


_OPERATION = {"type": "object", "additionalProperties": False, "required": ["parameters", "steps"],
              "properties": {"description": {"type": "string"},
                             "parameters": {"type": "object"},
                             "steps": {"type": "array", "minItems": 1, "maxItems": MAX_STEPS_PER_OPERATION,
                                       "items": {"type": "object", "minProperties": 1}}}}
SERVICE_SCHEMA = {"type": "object", "additionalProperties": False,
                  "required": ["state_schema", "initial_state", "operations"],
                  "properties": {"description": {"type": "string"},
                                 "state_schema": {"type": "object"},
                                 "initial_state": {"type": "object"},
                                 "operations": {"type": "object", "minProperties": 1,
                                                "propertyNames": {"pattern": NAME},
                                                "additionalProperties": _OPERATION}}}
_REPLY = {"type": "object", "additionalProperties": False, "required": ["when", "say"],
          "properties": {"when": {"type": "string", "minLength": 1}, "say": {"type": "string"},
                         "once": {"type": "boolean"}}}
USER_SCHEMA = {"type": "object", "additionalProperties": False, "required": ["instruction", "opening"],
               "properties": {
                   "kind": {"enum": ["template", "model"]},
                   "persona": {"type": "string"},
                   "instruction": {"type": "string", "minLength": 1},
                   "hidden": {"type": "object", "additionalProperties": {"type": ["string", "number", "boolean"]}},
                   "opening": {"type": "string", "minLength": 1},
                   "replies": {"type": "array", "items": _REPLY},
                   "fallback": {"type": "string"},
                   "stop": {"type": "object", "additionalProperties": False, "properties": {
                       "max_turns": {"type": "integer", "minimum": 1, "maximum": 100},
                       "when_agent_says": {"type": "array", "items": {"type": "string", "minLength": 1}},
                       "goodbye": {"type": "string"}}},
                   "model": {"type": "string", "minLength": 1},
                   "temperature": {"type": "number", "minimum": 0, "maximum": 2},
                   "seed": {"type": "integer"},
                   "max_tokens": {"type": "integer", "minimum": 1}}}


def _schema_error(value: Any, schema: dict, where: str) -> None:
    import jsonschema  # lazily: a fifth of a second of imports the controller's start does without
    error = next(iter(sorted(jsonschema.Draft202012Validator(schema).iter_errors(value),
                             key=lambda e: list(e.absolute_path))), None)
    if error is not None:
        path = ".".join(str(p) for p in error.absolute_path)
        raise ServiceSpecError(f"{where}{'.' + path if path else ''}: {error.message}")


def _check_schema(schema: Any, where: str) -> None:
    import jsonschema
    try:
        jsonschema.Draft202012Validator.check_schema(schema)
    except jsonschema.SchemaError as exc:
        raise ServiceSpecError(f"{where} is not a valid JSON Schema: {exc.message}") from None


def _check_expr(expr: Any, where: str, depth: int = 0) -> None:
    if depth > MAX_EXPRESSION_DEPTH:
        raise ServiceSpecError(f"{where}: expression nested deeper than {MAX_EXPRESSION_DEPTH}")
    if expr is None or isinstance(expr, (str, int, float, bool)):
        return
    if isinstance(expr, list):
        for i, e in enumerate(expr):
            _check_expr(e, f"{where}[{i}]", depth + 1)
        return
    if not isinstance(expr, dict) or len(expr) != 1:
        raise ServiceSpecError(f"{where}: an expression object must have exactly one key, an operator of "
                               f"{sorted(OPERATORS)} (literal objects: {{lit: ...}} or {{object: ...}})")
    (op, arg), = expr.items()
    if op not in OPERATORS:
        raise ServiceSpecError(f"{where}: unknown operator {op!r}; valid: {sorted(OPERATORS)}")
    if op in ("arg", "var") and not isinstance(arg, str):
        raise ServiceSpecError(f"{where}.{op}: must be a name (string)")
    if op == "lit":
        return
    if op == "object":
        if not isinstance(arg, dict):
            raise ServiceSpecError(f"{where}.object: must map keys to expressions")
        for k, v in arg.items():
            _check_expr(v, f"{where}.object.{k}", depth + 1)
        return
    if op in ("filter", "sum"):
        if not isinstance(arg, dict) or "from" not in arg:
            raise ServiceSpecError(f"{where}.{op}: must be {{from: EXPR, {'where: {field: EXPR}' if op == 'filter' else 'field: NAME'}}}")
        _check_expr(arg["from"], f"{where}.{op}.from", depth + 1)
        for k, v in (arg.get("where") or {}).items():
            _check_expr(v, f"{where}.{op}.where.{k}", depth + 1)
        return
    if op in ("get", "exists"):
        _check_path(arg, f"{where}.{op}", depth)
        return
    _check_expr(arg, f"{where}.{op}", depth + 1)


def _check_path(path: Any, where: str, depth: int = 0) -> None:
    if not isinstance(path, list) or not path:
        raise ServiceSpecError(f"{where}: a path must be a non-empty list of segments")
    for i, seg in enumerate(path):
        if not isinstance(seg, (str, int)) or isinstance(seg, bool):
            _check_expr(seg, f"{where}[{i}]", depth + 1)


def _check_steps(steps: list, where: str) -> None:
    for i, step in enumerate(steps):
        at = f"{where}[{i}]"
        kinds = sorted(set(step) & STATEMENTS)
        if len(kinds) != 1:
            raise ServiceSpecError(f"{at}: a step must have exactly one of {sorted(STATEMENTS)}, got {sorted(step)}")
        kind = kinds[0]
        extra = sorted(set(step) - {kind, "error"} if kind == "require" else set(step) - {kind})
        if extra:
            raise ServiceSpecError(f"{at}: unknown key(s) {extra} in a {kind!r} step")
        arg = step[kind]
        if kind == "require":
            _check_expr(arg, f"{at}.require")
            _check_expr(step.get("error", "refused"), f"{at}.error")
        elif kind == "let":
            if not isinstance(arg, dict) or not all(isinstance(k, str) for k in arg):
                raise ServiceSpecError(f"{at}.let: must map names to expressions")
            for k, v in arg.items():
                _check_expr(v, f"{at}.let.{k}")
        elif kind in ("set", "append"):
            if not isinstance(arg, list) or len(arg) != 2:
                raise ServiceSpecError(f"{at}.{kind}: must be [PATH, EXPR]")
            _check_path(arg[0], f"{at}.{kind}[0]")
            _check_expr(arg[1], f"{at}.{kind}[1]")
        elif kind == "delete":
            _check_path(arg, f"{at}.delete")
        else:
            _check_expr(arg, f"{at}.return")


def validate_services(services: Any, builtin_tools: tuple[str, ...] = ALL_TOOLS) -> dict:
    """Return `services` ({name: service spec}) if valid, else ServiceSpecError naming the
    field: a schema violation, an invalid JSON Schema, an initial state its own schema refuses,
    an operation name used twice or equal to a built-in tool, a malformed rule."""
    if not isinstance(services, Mapping) or not services:
        raise ServiceSpecError("services: must map service names to service specs")
    import jsonschema
    seen: dict[str, str] = {}
    for name, spec in services.items():
        where = f"services.{name}"
        if not isinstance(name, str) or not re.match(NAME, name):
            raise ServiceSpecError(f"services: service name {name!r} must match {NAME}")
        _schema_error(spec, SERVICE_SCHEMA, where)
        _check_schema(spec["state_schema"], f"{where}.state_schema")
        if len(json.dumps(spec["initial_state"])) > MAX_STATE_BYTES:
            raise ServiceSpecError(f"{where}.initial_state: larger than {MAX_STATE_BYTES} bytes as JSON")
        try:
            jsonschema.validate(spec["initial_state"], spec["state_schema"])
        except jsonschema.ValidationError as exc:
            path = ".".join(str(p) for p in exc.absolute_path)
            raise ServiceSpecError(f"{where}.initial_state{'.' + path if path else ''} does not match its "
                                   f"state_schema: {exc.message}") from None
        for op, ospec in spec["operations"].items():
            at = f"{where}.operations.{op}"
            if op in builtin_tools:
                raise ServiceSpecError(f"{at}: the name is a built-in tool's; choose another")
            if op in seen:
                raise ServiceSpecError(f"{at}: operation name also used by service {seen[op]!r}")
            seen[op] = name
            _check_schema(ospec["parameters"], f"{at}.parameters")
            if ospec["parameters"].get("type") != "object":
                raise ServiceSpecError(f"{at}.parameters: must be an object schema (type: object)")
            _check_steps(ospec["steps"], f"{at}.steps")
    return dict(services)


def validate_user(user: Any) -> dict:
    """Return the user goal if valid, else ServiceSpecError naming the field; every `{name}` a
    template reply uses must be a hidden fact."""
    _schema_error(user, USER_SCHEMA, "user")
    hidden = set(user.get("hidden") or {})
    for i, reply in enumerate(user.get("replies") or ()):
        try:
            re.compile(reply["when"])
        except re.error as exc:
            raise ServiceSpecError(f"user.replies[{i}].when is not a valid regular expression: {exc}") from None
        names = set(re.findall(r"\{([A-Za-z_][A-Za-z0-9_]*)\}", reply["say"]))
        if names - hidden:
            raise ServiceSpecError(f"user.replies[{i}].say names {sorted(names - hidden)}, which are not in user.hidden")
    if user.get("kind") == "model" and not user.get("model"):
        raise ServiceSpecError("user.model: required for kind 'model' (the user_sim endpoint's model name)")
    return dict(user)


def operation_names(services: Mapping[str, Any]) -> dict[str, str]:
    """Operation (tool) name -> its service."""
    return {op: name for name, spec in services.items() for op in spec["operations"]}


def service_tools(services: Mapping[str, Any]) -> list[dict[str, Any]]:
    """The OpenAI `tools` array of every operation of `services`."""
    return [{"type": "function", "function": {
        "name": op, "description": ospec.get("description") or f"{op} ({name})",
        "parameters": ospec["parameters"]}}
        for name, spec in services.items() for op, ospec in spec["operations"].items()]


# -- the goal: a final state (and what was told) against a state checker's spec ---------------
_MISSING = object()


def pointer(doc: Any, ptr: str) -> Any:
    """RFC 6901 JSON pointer lookup; `MISSING` when a segment is absent."""
    node = doc
    for raw in ptr.split("/")[1:]:
        seg = raw.replace("~1", "/").replace("~0", "~")
        if isinstance(node, Mapping):
            node = node.get(seg, _MISSING)
        elif isinstance(node, list) and seg.isdigit() and int(seg) < len(node):
            node = node[int(seg)]
        else:
            return _MISSING
        if node is _MISSING:
            return _MISSING
    return node


MISSING = _MISSING


def _canon(v: Any) -> str:
    return "<missing>" if v is _MISSING else json.dumps(v, sort_keys=True, separators=(",", ":"))


def differences(got: Any, want: Any, path: str = "", limit: int = 8) -> list[str]:
    """Up to `limit` JSON pointers where `got` differs from `want`, with both values."""
    out: list[str] = []

    def walk(g, w, p):
        if len(out) >= limit:
            return
        if isinstance(g, Mapping) and isinstance(w, Mapping):
            for k in sorted(set(g) | set(w)):
                walk(g.get(k, _MISSING), w.get(k, _MISSING), f"{p}/{k}")
        elif _canon(g) != _canon(w):
            out.append(f"{p or '/'}: {_canon(g)[:200]} != goal {_canon(w)[:200]}")
    walk(got, want, path)
    return out


def compare_state(spec: Mapping[str, Any], final: Mapping[str, Any], told: list[str]) -> list[tuple[str, bool, str]]:
    """A state checker's checks (`checker.kind: state`): (name, ok, detail) for each service
    of the goal (`match: exact`, the default) or each JSON pointer of `fields` (`match:
    fields`; both sides missing counts as equal), then each `told.include` phrase (said, case
    insensitive, in some message to the user) and `told.exclude` phrase (never said)."""
    goal, out = spec["goal"], []
    if spec.get("match", "exact") == "fields":
        for ptr in spec["fields"]:
            got, want = pointer(final, ptr), pointer(goal, ptr)
            same = _canon(got) == _canon(want)
            out.append((f"state:{ptr}", same, "as the goal" if same else f"{_canon(got)[:200]} != goal {_canon(want)[:200]}"))
    else:
        for svc in sorted(goal):
            diffs = differences(final.get(svc, _MISSING), goal[svc], f"/{svc}")
            out.append((f"state:{svc}", not diffs, "; ".join(diffs) if diffs else "equals the goal state"))
    said = "\n".join(str(m) for m in told).lower()
    for phrase in (spec.get("told") or {}).get("include", ()):
        hit = phrase.lower() in said
        out.append((f"told:include:{phrase}"[:200], hit, "said to the user" if hit else "never said to the user"))
    for phrase in (spec.get("told") or {}).get("exclude", ()):
        hit = phrase.lower() in said
        out.append((f"told:exclude:{phrase}"[:200], not hit, "said to the user" if hit else "not said"))
    return out


__all__ = ["MAX_STATE_BYTES", "MISSING", "compare_state", "differences", "pointer", "OPERATORS", "SERVICE_SCHEMA", "STATEMENTS", "STOP_TOKEN", "ServiceSpecError",
           "USER_SCHEMA", "operation_names", "service_tools", "validate_services", "validate_user"]
