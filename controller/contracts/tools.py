"""The agent's tool vocabulary: tool names, their JSON Schemas, and the task's tool set.

`TOOL_SPECS` maps each tool (shell, read_file, write_file, edit, list, search) to a description
and the JSON Schema of its arguments; `ALL_TOOLS` is their canonical order. `tool_set(names)`
validates a task's `tools` field (None means all) and raises `ToolSetError` naming an unknown
tool; `definitions(names)` is the OpenAI `tools` array for a tool set; `argument_error(name,
args)` is the first schema violation of a call's parsed arguments, then the first string the
sandbox cannot carry (`value_error`: NaN, a lone surrogate, a NUL or an oversized
command-line argument), or None. `call_error(name, raw, max_bytes)` is what no toolbox may be
handed, whatever tool a call names (arguments that are not an object, nested deeper than
MAX_ARGUMENT_DEPTH, a non-finite number or an integer past MAX_INTEGER or a lone surrogate
anywhere, then `value_error`): the agent loop checks every call with it. The harness
(`nodeagent.harness.tools`) runs the tools; the task bank validates a task's tool set here.

A leaf of the contracts: no I/O. Must not import: zmq, sqlite3, controller.* outside
contracts, nodeagent.
"""
from __future__ import annotations

import functools
import json
import math
from typing import Any, Iterable

MAX_TIMEOUT_S = 120.0                  # the longest `shell` timeout_s a call may ask for

_PATH = {"type": "string", "minLength": 1, "maxLength": 4096}
TOOL_SPECS: dict[str, dict[str, Any]] = {
    "shell": {
        "description": "Run a shell command (sh -c) in /work. Output (stdout then stderr) is capped.",
        "parameters": {"type": "object", "additionalProperties": False, "required": ["command"],
                       "properties": {"command": {"type": "string", "minLength": 1},
                                      "timeout_s": {"type": "number", "exclusiveMinimum": 0,
                                                    "maximum": MAX_TIMEOUT_S}}}},
    "read_file": {
        "description": "Read a text file, optionally only lines start_line..start_line+max_lines-1.",
        "parameters": {"type": "object", "additionalProperties": False, "required": ["path"],
                       "properties": {"path": _PATH,
                                      "start_line": {"type": "integer", "minimum": 1},
                                      "max_lines": {"type": "integer", "minimum": 1}}}},
    "write_file": {
        "description": "Create or overwrite a text file (parent directories are created).",
        "parameters": {"type": "object", "additionalProperties": False, "required": ["path", "content"],
                       "properties": {"path": _PATH, "content": {"type": "string"}}}},
    "edit": {
        "description": ("Replace the text `old` by `new` in a file. `old` must occur exactly once, "
                        "unless replace_all is true (then at least once)."),
        "parameters": {"type": "object", "additionalProperties": False, "required": ["path", "old", "new"],
                       "properties": {"path": _PATH, "old": {"type": "string", "minLength": 1},
                                      "new": {"type": "string"}, "replace_all": {"type": "boolean"}}}},
    "list": {
        "description": "List the files under a directory (default /work), up to `depth` levels.",
        "parameters": {"type": "object", "additionalProperties": False,
                       "properties": {"path": _PATH, "depth": {"type": "integer", "minimum": 1, "maximum": 8}}}},
    "search": {
        "description": "Search files under a path (default /work) for a regular expression (grep -E).",
        "parameters": {"type": "object", "additionalProperties": False, "required": ["pattern"],
                       "properties": {"pattern": {"type": "string", "minLength": 1, "maxLength": 4096},
                                      "path": _PATH, "ignore_case": {"type": "boolean"},
                                      "fixed_strings": {"type": "boolean"}}}},
}
ALL_TOOLS: tuple[str, ...] = tuple(TOOL_SPECS)


@functools.cache
def _validator(name: str):
    """Tool `name`'s argument validator, made at the first call (jsonschema is a fifth of a
    second of imports that the controller's start, which never checks a call, does without)."""
    import jsonschema
    return jsonschema.Draft202012Validator(TOOL_SPECS[name]["parameters"])


class ToolSetError(ValueError):
    """A task names a tool that does not exist."""


def tool_set(names: Iterable[str] | None) -> tuple[str, ...]:
    """The task's tool set (`task["tools"]`; None means all), validated and in canonical order."""
    if names is None:
        return ALL_TOOLS
    if isinstance(names, str) or not all(isinstance(n, str) for n in names):
        raise ToolSetError(f"task tools must be a list of tool names, got {names!r}")
    unknown = sorted(set(names) - set(ALL_TOOLS))
    if unknown:
        raise ToolSetError(f"unknown tool(s) {unknown} in the task's tool set; available: {list(ALL_TOOLS)}")
    return tuple(n for n in ALL_TOOLS if n in set(names))


def definitions(names: Iterable[str] | None = None) -> list[dict[str, Any]]:
    """The OpenAI `tools` array for a tool set."""
    return [{"type": "function", "function": {"name": n, "description": TOOL_SPECS[n]["description"],
                                              "parameters": TOOL_SPECS[n]["parameters"]}}
            for n in tool_set(names)]


def argument_error(name: str, args: Any) -> str | None:
    """The first schema violation of `args` for tool `name` ("at <path>: <message>"), or None;
    then the first string the sandbox cannot carry (`value_error`)."""
    error = next(iter(sorted(_validator(name).iter_errors(args), key=lambda e: list(e.path))), None)
    if error is None:
        return value_error(name, args)
    where = "/".join(str(p) for p in error.absolute_path) or "arguments"
    return f"at {where}: {error.message}"


# Strings a tool passes as one command-line argument (argv) of a process in the sandbox.
ARGV_ARGUMENTS: dict[str, tuple[str, ...]] = {
    "shell": ("command",), "read_file": ("path",), "write_file": ("path",), "edit": ("path",),
    "list": ("path",), "search": ("pattern", "path")}
MAX_ARGV_ARGUMENT_BYTES = 128 * 1024 - 1   # Linux's MAX_ARG_STRLEN (32 pages) less its NUL


def _surrogate(where: str, value: str) -> str | None:
    """Why `value` (at `where`) is not Unicode text (a lone surrogate has no UTF-8 form), or None."""
    try:
        value.encode()
    except UnicodeEncodeError as exc:
        return (f"at {where}: character {exc.start} is a lone surrogate (U+{ord(value[exc.start]):04X}), "
                "which is not Unicode text; send the text itself (UTF-8), not a surrogate escape")
    return None


def _number(where: str, value: Any) -> str | None:
    """Why a JSON number (at `where`) is not one every tool can take, or None."""
    if isinstance(value, float) and not math.isfinite(value):    # NaN passes every JSON Schema bound
        return f"at {where}: {value!r} is not a finite number"
    if isinstance(value, int) and not isinstance(value, bool) and abs(value) > MAX_INTEGER:
        return (f"at {where}: an integer of {value.bit_length()} bits; a tool takes integers of at most "
                f"64 bits (send a larger number as a string)")
    return None


def value_error(name: str, args: Any) -> str | None:
    """The first argument of a schema-valid call that the sandbox cannot carry ("at <argument>:
    <why>"), or None: a number that is not finite (Python's JSON reads `NaN`, which no schema
    bound refuses); a lone surrogate in any string (not Unicode text: it has no UTF-8
    form); in an argument that becomes a command-line argument (`ARGV_ARGUMENTS`), a NUL
    character or more than MAX_ARGV_ARGUMENT_BYTES bytes. The model's error, never the sandbox's."""
    if not isinstance(args, dict):
        return None
    for key in sorted(args):
        value = args[key]
        if isinstance(value, float) and not math.isfinite(value):
            return _number(key, value)
        if not isinstance(value, str):
            continue
        bad = _surrogate(key, value)
        if bad is not None:
            return bad
        if key not in ARGV_ARGUMENTS.get(name, ()):
            continue
        if "\0" in value:
            return (f"at {key}: character {value.index(chr(0))} is a NUL (U+0000), which a command-line "
                    "argument cannot carry" + ("; put binary data in a file with write_file"
                                               if name == "shell" else ""))
        size = len(value.encode())
        if size > MAX_ARGV_ARGUMENT_BYTES:
            return (f"at {key}: {size} bytes; a command-line argument holds at most {MAX_ARGV_ARGUMENT_BYTES} "
                    "bytes" + ("; write a script with write_file and run it" if name == "shell" else ""))
    return None


# What no tool of any toolbox (built-in, a task's services, MCP servers, the browser) may be given.
MAX_ARGUMENT_DEPTH = 32            # nesting of objects and arrays in one call's arguments
MAX_INTEGER = 2 ** 64              # |n| of an integer argument (JSON's numbers are doubles elsewhere)


def call_error(name: Any, raw: Any, max_bytes: int) -> str | None:
    """The first thing wrong with one tool call's raw arguments (the JSON text the model wrote)
    that no toolbox may be handed, whichever tool it names ("at <path>: <why>"), or None: the
    arguments are not a JSON object; objects and arrays nested deeper than MAX_ARGUMENT_DEPTH
    (Python's JSON reader raises RecursionError past about a thousand, and what reads them
    after recurses too); anywhere in them, a number that is not finite (`NaN`, `Infinity`,
    `1e400`) or an integer past MAX_INTEGER, or a string or key with a lone surrogate; then
    `value_error` (NUL and size of what becomes a command-line argument). None also for what each
    toolbox answers itself: arguments that are not a string, are longer than `max_bytes` or are
    not JSON. The agent loop checks every call here, once, before any toolbox sees it; the
    answer is the model's tool error, never an infrastructure one."""
    if not isinstance(raw, str) or raw.strip() == "":
        return None
    if len(raw) > max_bytes or len(raw.encode(errors="surrogatepass")) > max_bytes:
        return None
    try:
        args = json.loads(raw)
    except RecursionError:
        return f"at arguments: nested deeper than {MAX_ARGUMENT_DEPTH} levels of objects and arrays"
    except ValueError:
        return None
    if not isinstance(args, dict):
        return f"at arguments: must be a JSON object, not {_json_kind(args)}"
    error = _walk(args)
    return error if error is not None else value_error(str(name), args)


def _json_kind(value: Any) -> str:
    return {dict: "an object", list: "an array", str: "a string", bool: "a boolean",
            type(None): "null"}.get(type(value), "a number")


def _walk(args: dict) -> str | None:
    """The first non-finite or oversized number, lone surrogate or too deep nesting in `args`, in
    path order (keys sorted), without recursion."""
    stack: list[tuple[str, Any, int]] = [("", args, 1)]
    while stack:
        path, value, depth = stack.pop()
        where = path or "arguments"
        if isinstance(value, (dict, list)):
            if depth > MAX_ARGUMENT_DEPTH:
                return f"at {where}: nested deeper than {MAX_ARGUMENT_DEPTH} levels of objects and arrays"
            items = sorted(value.items()) if isinstance(value, dict) else list(enumerate(value))
            for key, item in reversed(items):
                sub = f"{path}/{key}" if path else str(key)
                if isinstance(key, str):
                    bad = _surrogate(f"{where} (a key)", key)
                    if bad is not None:
                        return bad
                stack.append((sub, item, depth + 1))
        elif isinstance(value, str):
            bad = _surrogate(where, value)
            if bad is not None:
                return bad
        elif isinstance(value, (int, float)):
            bad = _number(where, value)
            if bad is not None:
                return bad
    return None


__all__ = ["ALL_TOOLS", "ARGV_ARGUMENTS", "MAX_ARGV_ARGUMENT_BYTES", "MAX_TIMEOUT_S", "TOOL_SPECS", "ToolSetError",
           "MAX_ARGUMENT_DEPTH", "MAX_INTEGER", "argument_error", "call_error", "definitions", "value_error",
           "tool_set"]
