"""The agent's tool vocabulary: tool names, their JSON Schemas, and the task's tool set.

`TOOL_SPECS` maps each tool (shell, read_file, write_file, edit, list, search) to a description
and the JSON Schema of its arguments; `ALL_TOOLS` is their canonical order. `tool_set(names)`
validates a task's `tools` field (None means all) and raises `ToolSetError` naming an unknown
tool; `definitions(names)` is the OpenAI `tools` array for a tool set; `argument_error(name,
args)` is the first schema violation of a call's parsed arguments, then the first string the
sandbox cannot carry (`value_error`: NaN, a lone surrogate, a NUL or an oversized
command-line argument), or None. The harness
(`nodeagent.harness.tools`) runs the tools; the task bank validates a task's tool set here.

A leaf of the contracts: no I/O. Must not import: zmq, sqlite3, controller.* outside
contracts, nodeagent.
"""
from __future__ import annotations

import functools
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
        if isinstance(value, float) and not math.isfinite(value):    # NaN passes every JSON Schema bound
            return f"at {key}: {value!r} is not a finite number"
        if not isinstance(value, str):
            continue
        try:
            size = len(value.encode())
        except UnicodeEncodeError as exc:
            return (f"at {key}: character {exc.start} is a lone surrogate (U+{ord(value[exc.start]):04X}), "
                    "which is not Unicode text; send the text itself (UTF-8), not a surrogate escape")
        if key not in ARGV_ARGUMENTS.get(name, ()):
            continue
        if "\0" in value:
            return (f"at {key}: character {value.index(chr(0))} is a NUL (U+0000), which a command-line "
                    "argument cannot carry" + ("; put binary data in a file with write_file"
                                               if name == "shell" else ""))
        if size > MAX_ARGV_ARGUMENT_BYTES:
            return (f"at {key}: {size} bytes; a command-line argument holds at most {MAX_ARGV_ARGUMENT_BYTES} "
                    "bytes" + ("; write a script with write_file and run it" if name == "shell" else ""))
    return None


__all__ = ["ALL_TOOLS", "ARGV_ARGUMENTS", "MAX_ARGV_ARGUMENT_BYTES", "MAX_TIMEOUT_S", "TOOL_SPECS", "ToolSetError",
           "argument_error", "definitions", "value_error", "tool_set"]
