"""The checker spec: what a task's `checker` field may say, and its validation.

A checker spec is a JSON object with a `kind` and that kind's fields (`CHECKER_SCHEMA`, JSON
Schema; docs/verifier.md lists them):
- `pytest`: `tests` (files run by the grader), `support`, `fail_to_pass`, `pass_to_pass`,
  `strict_eq`, `isolation` (`auto` | `call` | `process`: whether the agent's code runs behind a
  call boundary in a process of its own), `modules` (the agent's modules the tests call, for
  `call`; default `["solution"]`), `call_timeout_s` (per-call deadline);
- `math`, `exact`, `regex`: `answer` (the gold answer, or the pattern);
- `command`: `argv`, `cwd`, `pass_exit_codes`, `support` (hidden files placed under
  `/verifier/tests`, read-only);
- `state`: `goal` ({service: goal state}), `match` (`exact` | `fields`), `fields` (JSON
  pointers `/service/...` compared when `fields`), `told` (`include` / `exclude`: what the
  agent's messages to the user must or must not say);
- `webstate`: `app` (the web app family: `shop`), `checks` (each `{sql: "SELECT ...", expect:
  rows}` over the captured database, or `{page, as, password, element, expect}`: the text of the
  element with that id on a page the app renders from it), `name` per check optional; the task
  carries the starting database as hidden `seed.sql`;
- every kind: `timeout_s` and an optional LLM `judge` (`endpoint`, `model`, `rubric`, `weight`,
  `timeout_s`).

`validate_spec(spec, task)` returns the spec or raises `SpecError` naming the field: an
unknown field, a missing answer or test list, an invalid regular expression, a test file the
task does not carry. The task bank validates a task with it when the task is made; the verifier
validates again before it grades (a malformed spec is the task's fault: an infra error, never a
score).

`CheckerSpec.decode(spec, task)` validates once and returns the spec typed: the fields the
graders read, with `None` where the grader picks a kind-dependent default (`timeout_s`,
`strict_eq`); `raw` keeps the validated object (the state checker's goal is compared in its
JSON form by `controller.contracts.services.compare_state`, which task validation shares).

A leaf of the contracts: no I/O. Must not import: zmq, sqlite3, controller.* outside
contracts, nodeagent.
"""
from __future__ import annotations

import math
import re
from dataclasses import dataclass, field
from typing import Any, Mapping, Optional

KINDS = ("pytest", "math", "exact", "regex", "command", "state", "webstate")
# A check deadline beyond a day is a mistake (`.inf` or `1e308` cannot be slept on: every
# answer would then be scored as a failed check); NaN passes JSON Schema's bounds, so every
# number is also checked to be finite here.
MAX_TIMEOUT_S = 86400.0
MAX_ANSWER_CHARS = 256 * 1024     # a gold answer or pattern: grading cost grows with it


class SpecError(ValueError):
    """A checker spec is malformed; the message names the field."""


# A judge endpoint: a URL, or `node:<name>`, the node's own judge service for that name
# (`$PADDOCK_<NAME>_ENDPOINT` on the node: a task need not know where the farm hosts its judges).
_JUDGE = {"type": "object", "additionalProperties": False, "required": ["endpoint", "model", "rubric"],
          "properties": {"endpoint": {"type": "string", "pattern": "^(https?://|node:[a-z][a-z0-9_]*$)"},
                         "model": {"type": "string", "minLength": 1},
                         "rubric": {"type": "string", "minLength": 1},
                         "weight": {"type": "number", "minimum": 0, "maximum": 1},
                         "timeout_s": {"type": "number", "exclusiveMinimum": 0},
                         # what the judge reads; rate limits and retries (nodeagent/verifier/judge.py)
                         "sees": {"enum": ["answer", "diff", "trajectory"]},
                         "requests_per_s": {"type": "number", "exclusiveMinimum": 0},
                         "tokens_per_s": {"type": "number", "exclusiveMinimum": 0},
                         "max_retries": {"type": "integer", "minimum": 0, "maximum": 10}}}
_COMMON = {"timeout_s": {"type": "number", "exclusiveMinimum": 0}, "judge": _JUDGE}
_STR_LIST = {"type": "array", "items": {"type": "string", "minLength": 1}}


def _kind(name: str, required: list[str], props: dict) -> dict:
    return {"type": "object", "additionalProperties": False, "required": ["kind", *required],
            "properties": {"kind": {"const": name}, **_COMMON, **props}}


CHECKER_SCHEMA = {"oneOf": [
    _kind("pytest", ["tests"], {"tests": {**_STR_LIST, "minItems": 1}, "support": _STR_LIST,
                                "fail_to_pass": _STR_LIST, "pass_to_pass": _STR_LIST,
                                "strict_eq": {"type": "boolean"},
                                "isolation": {"enum": ["auto", "call", "process"]},
                                "modules": {"type": "array", "minItems": 1,
                                            "items": {"type": "string", "pattern": "^[A-Za-z_][A-Za-z0-9_]*$"}},
                                "call_timeout_s": {"type": "number", "exclusiveMinimum": 0}}),
    _kind("math", ["answer"], {"answer": {"type": "string", "minLength": 1}}),
    _kind("exact", ["answer"], {"answer": {"type": "string"}}),
    _kind("regex", ["answer"], {"answer": {"type": "string", "minLength": 1}}),
    _kind("command", ["argv"], {"argv": {**_STR_LIST, "minItems": 1}, "cwd": {"type": "string"},
                                "support": _STR_LIST,      # hidden files under /verifier/tests
                                "pass_exit_codes": {"type": "array", "items": {"type": "integer"}}}),
    # the final state of the task's mock services against a goal state (nodeagent/verifier/statecheck.py)
    _kind("state", ["goal"], {"goal": {"type": "object", "minProperties": 1,
                                       "additionalProperties": {"type": "object"}},
                              "match": {"enum": ["exact", "fields"]},
                              "fields": {"type": "array", "minItems": 1,
                                         "items": {"type": "string", "pattern": "^/[^/]+"}},
                              "told": {"type": "object", "additionalProperties": False,
                                       "properties": {"include": _STR_LIST, "exclude": _STR_LIST}}}),
    _kind("webstate", ["app", "checks"], {"app": {"enum": ["shop"]}, "checks": {
        "type": "array", "minItems": 1, "items": {"oneOf": [
            {"type": "object", "additionalProperties": False, "required": ["sql", "expect"],
             "properties": {"name": {"type": "string"}, "sql": {"type": "string", "pattern": "^\\s*(?i:select)\\b"},
                            "expect": {"type": "array", "items": {"type": "array"}}}},
            {"type": "object", "additionalProperties": False,
             "required": ["page", "as", "password", "element", "expect"],
             "properties": {"name": {"type": "string"}, "page": {"type": "string", "pattern": "^/"},
                            "as": {"type": "string"}, "password": {"type": "string"},
                            "element": {"type": "string", "pattern": "^[A-Za-z0-9_-]+$"},
                            "expect": {"type": "string"}}}]}}}),
]}


def validate_spec(spec, task: dict | None = None) -> dict:
    """Return `spec` if it is a valid checker spec (and consistent with `task`), else SpecError."""
    if not spec:
        raise SpecError("task has no checker")
    if not isinstance(spec, dict):
        raise SpecError(f"checker must be an object, got {type(spec).__name__}")
    if spec.get("kind") not in KINDS:
        raise SpecError(f"checker.kind must be one of {KINDS}, got {spec.get('kind')!r}")
    schema = next(s for s in CHECKER_SCHEMA["oneOf"] if s["properties"]["kind"]["const"] == spec["kind"])
    unknown = sorted(set(spec) - set(schema["properties"]))
    if unknown:
        raise SpecError(f"checker has unknown field(s) {unknown}; valid for kind {spec['kind']!r}: "
                        f"{sorted(schema['properties'])}")
    import jsonschema  # here: a fifth of a second of imports the controller's start does without
    try:
        jsonschema.validate(spec, schema)
    except jsonschema.ValidationError as exc:
        where = ".".join(str(p) for p in exc.absolute_path) or "(root)"
        raise SpecError(f"checker.{where}: {exc.message}") from None
    _check_numbers(spec)
    if spec["kind"] == "regex":
        try:
            re.compile(spec["answer"])
        except re.error as exc:
            raise SpecError(f"checker.answer is not a valid regular expression: {exc}") from None
    if spec["kind"] == "state" and spec.get("match") == "fields" and not spec.get("fields"):
        raise SpecError("checker.fields: required when match is 'fields' (JSON pointers, /service/...)")
    if task is not None and spec["kind"] == "pytest":
        have = set(task.get("hidden", {})) | set(task.get("files", {}))
        missing = [f for f in list(spec["tests"]) + list(spec.get("support", ())) if f not in have]
        if missing:
            raise SpecError(f"checker names files missing from the task's hidden and visible files: {missing}")
    if task is not None and spec["kind"] == "webstate" and "seed.sql" not in task.get("hidden", {}):
        raise SpecError("a webstate checker needs the starting database as the hidden file 'seed.sql'")
    return spec


def _check_numbers(spec: dict) -> None:
    """Every number of the spec finite; every deadline within (0, MAX_TIMEOUT_S]."""
    places = [("checker", spec)]
    if isinstance(spec.get("judge"), dict):
        places.append(("checker.judge", spec["judge"]))
    for where, obj in places:
        for key, value in obj.items():
            if isinstance(value, float) and not math.isfinite(value):
                raise SpecError(f"{where}.{key}: must be a finite number, got {value!r}")
            if key in ("timeout_s", "call_timeout_s") and isinstance(value, (int, float)) \
                    and not 0 < value <= MAX_TIMEOUT_S:
                raise SpecError(f"{where}.{key}: must be > 0 and at most {MAX_TIMEOUT_S:g} seconds, got {value!r}")
    answer = spec.get("answer")
    if spec.get("kind") == "math" and isinstance(answer, str) and not answer.strip():
        raise SpecError("checker.answer: a math gold answer cannot be blank")
    if isinstance(answer, str) and len(answer) > MAX_ANSWER_CHARS:
        raise SpecError(f"checker.answer: {len(answer)} characters; the limit is {MAX_ANSWER_CHARS}")


@dataclass(frozen=True)
class CheckerSpec:
    """A validated checker spec (`decode`): what the graders read, typed. `None` leaves the
    choice to the grader (its default per kind); every other field has the schema's default."""
    kind: str
    timeout_s: Optional[float] = None
    judge: Optional[Mapping[str, Any]] = None
    # pytest (and command's `support`)
    tests: tuple[str, ...] = ()
    support: tuple[str, ...] = ()
    fail_to_pass: tuple[str, ...] = ()
    pass_to_pass: tuple[str, ...] = ()
    strict_eq: Optional[bool] = None       # None: on for file-level tests, off for a repository's
    isolation: str = "auto"
    modules: Optional[tuple[str, ...]] = None
    call_timeout_s: Optional[float] = None
    # math, exact, regex
    answer: Optional[str] = None
    # command
    argv: tuple[str, ...] = ()
    cwd: str = "/work"
    pass_exit_codes: tuple[int, ...] = (0,)
    # webstate: the checks over the captured app state (each a JSON object, as the schema says)
    checks: tuple[Mapping[str, Any], ...] = ()
    raw: Mapping[str, Any] = field(default_factory=dict, repr=False, compare=False)

    @classmethod
    def decode(cls, spec: Any, task: Mapping[str, Any] | None = None) -> "CheckerSpec":
        """`spec` validated (`validate_spec`, against `task`'s files when given) and typed.
        Raises SpecError naming the field."""
        spec = validate_spec(spec, dict(task) if task is not None else None)
        names = ("tests", "support", "fail_to_pass", "pass_to_pass", "argv", "checks")
        out: dict[str, Any] = {k: tuple(spec[k]) for k in names if k in spec}
        for key in ("timeout_s", "call_timeout_s"):
            if key in spec:
                out[key] = float(spec[key])
        for key in ("judge", "strict_eq", "isolation", "answer", "cwd"):
            if key in spec:
                out[key] = spec[key]
        if "modules" in spec:
            out["modules"] = tuple(spec["modules"])
        if "pass_exit_codes" in spec:
            out["pass_exit_codes"] = tuple(spec["pass_exit_codes"])
        return cls(kind=spec["kind"], raw=spec, **out)

    @property
    def answer_kind(self) -> bool:
        """Graded on the final answer, on the host (math, exact, regex)."""
        return self.kind in ("math", "exact", "regex")


__all__ = ["CHECKER_SCHEMA", "KINDS", "MAX_TIMEOUT_S", "CheckerSpec", "SpecError", "validate_spec"]
