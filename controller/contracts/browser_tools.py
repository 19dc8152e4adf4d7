"""The browser tools of web tasks: names, JSON Schemas, budgets.

A web task (family `web`) offers these tools instead of the shell tools of
`controller.contracts.tools`: the agent's only way to act is the page. Element ids are the ids
printed in the accessibility tree (`[12] button "Add to cart" @40,300 120x24`); coordinates are
CSS pixels of the viewport. `browser_tool_set(names)` validates a task's `tools` (None: all);
`browser_definitions` is the OpenAI `tools` array; `browser_argument_error` the first schema
violation. `BrowserBudgets` are the per-rollout limits the harness enforces.

A leaf of the contracts: no I/O. Must not import: zmq, sqlite3, controller.* outside
contracts, nodeagent.
"""
from __future__ import annotations

import functools
from dataclasses import dataclass, fields
from typing import Any, Iterable

from controller.contracts.tools import ToolSetError

_ELEMENT = {"type": "integer", "minimum": 0, "description": "an element id from the accessibility tree"}
_COORD = {"type": "number", "minimum": 0, "maximum": 10000}
KEYS = ("Enter", "Tab", "Escape", "Backspace", "Delete", "ArrowUp", "ArrowDown", "ArrowLeft", "ArrowRight",
        "PageUp", "PageDown", "Home", "End", "Space")

BROWSER_TOOL_SPECS: dict[str, dict[str, Any]] = {
    "browser_observe": {
        "description": ("The current page as an accessibility tree: one line per element, "
                        "`[id] role \"name\" @x,y wxh` (ids are what the other tools take)."),
        "parameters": {"type": "object", "additionalProperties": False, "properties": {}}},
    "browser_click": {
        "description": "Click an element (by id) or a point of the viewport (x, y). Returns the page after.",
        "parameters": {"type": "object", "additionalProperties": False,
                       "properties": {"element": _ELEMENT, "x": _COORD, "y": _COORD},
                       "oneOf": [{"required": ["element"]}, {"required": ["x", "y"]}]}},
    "browser_type": {
        "description": ("Type text into an element (by id, or the one clicked at x, y; else the focused "
                        "one). `clear` empties it first; `submit` presses Enter after. Returns the page after."),
        "parameters": {"type": "object", "additionalProperties": False, "required": ["text"],
                       "properties": {"element": _ELEMENT, "x": _COORD, "y": _COORD,
                                      "text": {"type": "string", "maxLength": 2000},
                                      "clear": {"type": "boolean"}, "submit": {"type": "boolean"}},
                       "dependentRequired": {"x": ["y"], "y": ["x"]},
                       "not": {"required": ["element", "x"]}}},
    "browser_select": {
        "description": "Choose an option of a select element (by id) by its value or visible text.",
        "parameters": {"type": "object", "additionalProperties": False, "required": ["element", "option"],
                       "properties": {"element": _ELEMENT, "option": {"type": "string", "maxLength": 200}}}},
    "browser_key": {
        "description": "Press a key in an element (by id, focused first; else the focused one).",
        "parameters": {"type": "object", "additionalProperties": False, "required": ["key"],
                       "properties": {"key": {"enum": list(KEYS)}, "element": _ELEMENT}}},
    "browser_scroll": {
        "description": "Scroll the page, or what is under x, y or under an element (by id), by dy (and dx) pixels.",
        "parameters": {"type": "object", "additionalProperties": False, "required": ["dy"],
                       "properties": {"dy": {"type": "number", "minimum": -10000, "maximum": 10000},
                                      "dx": {"type": "number", "minimum": -10000, "maximum": 10000},
                                      "x": _COORD, "y": _COORD, "element": _ELEMENT},
                       "dependentRequired": {"x": ["y"], "y": ["x"]},
                       "not": {"required": ["element", "x"]}}},
    "browser_navigate": {
        "description": "Open a URL of the task's site (an absolute URL of an allowed origin, or a path).",
        "parameters": {"type": "object", "additionalProperties": False, "required": ["url"],
                       "properties": {"url": {"type": "string", "minLength": 1, "maxLength": 2048}}}},
    "browser_screenshot": {
        "description": "A PNG screenshot of the viewport, stored with the trajectory (the reply names it).",
        "parameters": {"type": "object", "additionalProperties": False,
                       "properties": {"full_page": {"type": "boolean"}}}},
}
BROWSER_TOOLS: tuple[str, ...] = tuple(BROWSER_TOOL_SPECS)


@dataclass(frozen=True)
class BrowserBudgets:
    """Per rollout, enforced by the harness (`nodeagent.harness.browser_tools`)."""
    action_timeout_s: float = 10.0      # one DevTools command
    load_timeout_s: float = 10.0        # a navigation's load event after an action
    max_actions: int = 200              # tool calls of the rollout
    max_tree_nodes: int = 400           # lines of one accessibility tree
    screenshot_bytes: int = 512 * 1024  # one PNG; a larger one is retaken at half scale, then refused
    max_screenshots: int = 20

    @classmethod
    def from_dict(cls, d: dict | None) -> "BrowserBudgets":
        d = dict(d or {})
        known = {f.name: f.type for f in fields(cls)}
        unknown = sorted(set(d) - set(known))
        if unknown:
            raise ToolSetError(f"unknown browser budget(s) {unknown}; valid: {sorted(known)}")
        for k, v in d.items():
            if isinstance(v, bool) or not isinstance(v, (int, float)) or v <= 0:
                raise ToolSetError(f"browser budget {k!r} must be a positive number, got {v!r}")
        return cls(**d)


@functools.cache
def _validator(name: str):
    import jsonschema
    return jsonschema.Draft202012Validator(BROWSER_TOOL_SPECS[name]["parameters"])


def browser_tool_set(names: Iterable[str] | None) -> tuple[str, ...]:
    if names is None:
        return BROWSER_TOOLS
    if isinstance(names, str) or not all(isinstance(n, str) for n in names):
        raise ToolSetError(f"task tools must be a list of tool names, got {names!r}")
    unknown = sorted(set(names) - set(BROWSER_TOOLS))
    if unknown:
        raise ToolSetError(f"web tasks offer only the browser tools; unknown or not allowed: {unknown}; "
                           f"available: {list(BROWSER_TOOLS)}")
    return tuple(n for n in BROWSER_TOOLS if n in set(names))


def browser_definitions(names: Iterable[str] | None = None) -> list[dict[str, Any]]:
    return [{"type": "function", "function": {"name": n, "description": BROWSER_TOOL_SPECS[n]["description"],
                                              "parameters": BROWSER_TOOL_SPECS[n]["parameters"]}}
            for n in browser_tool_set(names)]


def browser_argument_error(name: str, args: Any) -> str | None:
    error = next(iter(sorted(_validator(name).iter_errors(args), key=lambda e: list(e.path))), None)
    if error is None:
        return None
    where = "/".join(str(p) for p in error.absolute_path) or "arguments"
    return f"at {where}: {error.message}"


__all__ = ["BROWSER_TOOLS", "BROWSER_TOOL_SPECS", "BrowserBudgets", "KEYS", "browser_argument_error",
           "browser_definitions", "browser_tool_set"]
