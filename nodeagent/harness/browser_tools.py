"""The browser tools of web tasks, run against a rollout's `BrowserSession` over DevTools.

Same shape as `nodeagent.harness.tools.Toolbox` (`names`, `definitions()`, `call(name,
raw_arguments, budget_s) -> ToolResult`), so the agent loop takes either. Every call is checked
before anything runs: the name against the task's tool set, the raw size, JSON, the tool's
schema (`controller.contracts.browser_tools`), the rollout's action budget. What the model can
get wrong (an unknown element id, a URL outside the allowed origins, a screenshot too large)
is an observation starting with `error:`; a dead browser (channel closed, no reply) raises
`SandboxError` (infrastructure, retried, never scored).

Observations:
- the accessibility tree (`render_tree`): one line per element that carries meaning, indented
  by depth, `[id] role "name" (value) @x,y wxh`; the id is the element's DevTools backend node
  id; ignored, generic and inline-text nodes are folded into their parents; at most
  `max_tree_nodes` lines;
- an action answers `ok: <what>; now at <url> "<title>"` followed by the page's tree;
- a screenshot is stored through `artifacts(name, png) -> ref` (the attempt writes it under the
  run directory) and answered with its reference, size and dimensions; the PNG never enters
  the prompt.

Navigation is confined to the allowed origins: `browser_navigate` refuses other URLs, and after
every action a page that left them (a link to `file://`, `about:`, another host) is sent back
to the start page and the action answered with an error.
Must not import zmq, controller.* outside contracts, nodeagent.agent or nodeagent.verifier.
"""
from __future__ import annotations

import base64
import json
import struct
import urllib.parse
from typing import Any, Callable, Iterable

from controller.contracts.browser_tools import (
    KEYS,
    BrowserBudgets,
    browser_argument_error,
    browser_definitions,
    browser_tool_set,
)
from nodeagent.browser.cdp import CdpClosed, CdpError
from nodeagent.harness.tools import DEFAULT_OBSERVATION_BYTES, MAX_ARGUMENT_BYTES, ToolResult, _cap, _refuse
from nodeagent.sandbox.spec import SandboxError

NAVIGATION_START_S = 0.6    # how long an action's navigation may take to start (a loaded node is slow)
SKIP_ROLES = {"none", "generic", "InlineTextBox", "LineBreak", "ListMarker", "presentation", "MenuListPopup"}
FOLD_IF_NAMELESS = {"paragraph", "LabelText", "Section", "group", "div"}
_KEYCODES = {"Enter": (13, "\r"), "Tab": (9, ""), "Escape": (27, ""), "Backspace": (8, ""), "Delete": (46, ""),
             "ArrowUp": (38, ""), "ArrowDown": (40, ""), "ArrowLeft": (37, ""), "ArrowRight": (39, ""),
             "PageUp": (33, ""), "PageDown": (34, ""), "Home": (36, ""), "End": (35, ""), "Space": (32, " ")}
assert set(_KEYCODES) == set(KEYS)


def _value(field: dict | None) -> Any:
    return (field or {}).get("value")


def render_tree(nodes: list[dict], bounds: dict[int, tuple], max_nodes: int) -> str:
    """The compact text of Accessibility.getFullAXTree's nodes (see the module docstring)."""
    by_id = {n["nodeId"]: n for n in nodes}
    roots = [n for n in nodes if not n.get("parentId") or n["parentId"] not in by_id]
    lines: list[str] = []

    def visit(n: dict, depth: int, parent_name: tuple) -> None:
        if len(lines) >= max_nodes:
            return
        role, name = _value(n.get("role")), _value(n.get("name")) or ""
        shown = not n.get("ignored") and role not in SKIP_ROLES and not (role == "StaticText" and not name.strip())
        if role == "StaticText" and (name.strip() in ("|", "—", "•") or name.strip() in parent_name):
            shown = False       # a separator, or the text its parent is already named or valued by
        if role in FOLD_IF_NAMELESS and not name.strip():
            shown = False
        if shown:
            bid = n.get("backendDOMNodeId")
            text = f"[{bid}] {role}" + (f' "{name.strip()[:200]}"' if name.strip() else "")
            props = {p["name"]: _value(p.get("value")) for p in n.get("properties") or []}
            val = _value(n.get("value"))
            if val not in (None, ""):
                text += f" value={json.dumps(str(val)[:200])}"
            for flag in ("checked", "disabled", "focused"):
                if props.get(flag) not in (None, False, "false"):
                    text += f" {flag}" if props[flag] is True or props[flag] == "true" else f" {flag}={props[flag]}"
            if bid in bounds:
                x, y, w, h = bounds[bid]
                text += f" @{int(x)},{int(y)} {int(w)}x{int(h)}"
            lines.append("  " * depth + text)
            depth += 1
            parent_name = (name.strip(), str(val).strip() if val not in (None, "") else name.strip())
        for cid in n.get("childIds") or []:
            if cid in by_id:
                visit(by_id[cid], depth, parent_name)

    for r in roots:
        visit(r, 0, ())
    if len(lines) >= max_nodes:
        lines.append(f"[tree cut at {max_nodes} elements]")
    return "\n".join(lines)


def png_size(data: bytes) -> tuple[int, int]:
    if data[:8] != b"\x89PNG\r\n\x1a\n":
        return (0, 0)
    return struct.unpack(">II", data[16:24])


class BrowserToolbox:
    """The browser tools of one rollout, bound to its session and the task's tool set."""

    def __init__(self, session, names: Iterable[str] | None = None,
                 observation_bytes: int = DEFAULT_OBSERVATION_BYTES, budgets: BrowserBudgets | None = None,
                 artifacts: Callable[[str, bytes], str] | None = None,
                 allowed_origins: Iterable[str] | None = None) -> None:
        self.session = session
        self.names = browser_tool_set(names)
        self.obs_cap = observation_bytes
        self.b = budgets or BrowserBudgets()
        self.artifacts = artifacts
        self.allowed = tuple(allowed_origins or (session.origin,))
        self.actions = 0
        self.screenshots: list[dict] = []      # {"ref", "bytes", "width", "height"}
        self._bounds: dict[int, tuple] = {}

    def definitions(self) -> list[dict[str, Any]]:
        return browser_definitions(self.names)

    def parse(self, name: Any, raw_args: Any) -> tuple[dict | None, ToolResult | None]:
        if not isinstance(name, str) or name not in self.names:
            return None, _refuse("unknown_tool", f"unknown tool {name!r}; available: {list(self.names)}")
        if raw_args is None or raw_args == "":
            raw_args = "{}"
        if isinstance(raw_args, dict):
            raw_args = json.dumps(raw_args)
        if not isinstance(raw_args, str):
            return None, _refuse("bad_arguments", f"arguments of {name} must be a JSON string")
        if len(raw_args.encode(errors="replace")) > MAX_ARGUMENT_BYTES:
            return None, _refuse("oversized_arguments", f"arguments of {name} exceed {MAX_ARGUMENT_BYTES} bytes")
        try:
            args = json.loads(raw_args)
        except ValueError as exc:
            return None, _refuse("malformed_json", f"arguments of {name} are not valid JSON: {exc}")
        error = browser_argument_error(name, args)
        if error is not None:
            return None, _refuse("invalid_arguments", f"invalid arguments for {name} {error}")
        return args, None

    def call(self, name: Any, raw_args: Any, budget_s: float | None = None) -> ToolResult:
        args, refused = self.parse(name, raw_args)
        if refused is not None:
            return refused
        if self.actions >= self.b.max_actions:
            return _refuse("budget_exhausted", f"the browser action budget ({self.b.max_actions}) is spent")
        self.actions += 1
        try:
            return getattr(self, f"_{name[len('browser_'):]}")(args)
        except CdpError as exc:
            return _refuse("command_failed", str(exc))
        except CdpClosed as exc:
            raise SandboxError(f"browser: {exc}") from None

    # -- helpers ---------------------------------------------------------------------------
    def _t(self) -> float:
        return self.b.action_timeout_s

    def _origin_ok(self, url: str) -> bool:
        p = urllib.parse.urlsplit(url)
        return f"{p.scheme}://{p.netloc}" in self.allowed

    def tree(self) -> str:
        s = self.session
        nodes = s.page("Accessibility.getFullAXTree", timeout_s=self._t())["nodes"]
        snap = s.page("DOMSnapshot.captureSnapshot", {"computedStyles": []}, timeout_s=self._t())
        scroll = s.page("Runtime.evaluate", {"expression": "[window.scrollX, window.scrollY]", "returnByValue": True},
                        timeout_s=self._t())["result"].get("value") or [0, 0]
        bounds: dict[int, tuple] = {}
        for doc in snap.get("documents", [])[:1]:
            backend = doc["nodes"].get("backendNodeId", [])
            for idx, rect in zip(doc["layout"]["nodeIndex"], doc["layout"]["bounds"]):
                if idx < len(backend):
                    bounds[backend[idx]] = (rect[0] - scroll[0], rect[1] - scroll[1], rect[2], rect[3])
        self._bounds = bounds
        return render_tree(nodes, bounds, self.b.max_tree_nodes)

    def _after(self, what: str, may_navigate: bool = True) -> ToolResult:
        if may_navigate:          # a click, a key, a submit: wait for a navigation it may have started
            self.session.wait_loaded(NAVIGATION_START_S, self.b.load_timeout_s)
        url = self.session.current_url()
        if not self._origin_ok(url):
            self.session.navigate(self.session.origin + "/", self.b.load_timeout_s)
            return _refuse("origin_not_allowed", f"{what} led to {url}, outside the allowed origins "
                                                 f"{list(self.allowed)}; back at the start page")
        title = self.session.page("Runtime.evaluate", {"expression": "document.title", "returnByValue": True},
                                  timeout_s=self._t())["result"].get("value", "")
        text, truncated = _cap(f"ok: {what}; now at {url} {json.dumps(title)}\n{self.tree()}".encode(), self.obs_cap)
        return ToolResult(text, 0, None, truncated)

    def _center(self, element: int) -> tuple[float, float]:
        s = self.session
        try:
            s.page("DOM.scrollIntoViewIfNeeded", {"backendNodeId": element}, timeout_s=self._t())
            quad = s.page("DOM.getBoxModel", {"backendNodeId": element}, timeout_s=self._t())["model"]["content"]
        except CdpError:
            raise CdpError(f"no visible element [{element}] on this page; call browser_observe for the ids") from None
        xs, ys = quad[0::2], quad[1::2]
        return sum(xs) / 4, sum(ys) / 4

    def _mouse_click(self, x: float, y: float) -> None:
        self.session.cdp.events.clear()
        for kind in ("mouseMoved", "mousePressed", "mouseReleased"):
            self.session.page("Input.dispatchMouseEvent", {"type": kind, "x": x, "y": y, "button": "left",
                                                           "clickCount": 1}, timeout_s=self._t())

    def _press(self, key: str) -> None:
        code, text = _KEYCODES[key]
        name = " " if key == "Space" else key
        for kind in ("keyDown", "keyUp"):
            p = {"type": kind, "key": name, "code": key, "windowsVirtualKeyCode": code}
            if kind == "keyDown" and text:
                p["text"] = text
            self.session.page("Input.dispatchKeyEvent", p, timeout_s=self._t())

    def _call_on(self, element: int, fn: str, args: list | None = None) -> Any:
        s = self.session
        try:
            obj = s.page("DOM.resolveNode", {"backendNodeId": element}, timeout_s=self._t())["object"]["objectId"]
        except CdpError:
            raise CdpError(f"no element [{element}] on this page; call browser_observe for the ids") from None
        r = s.page("Runtime.callFunctionOn", {"objectId": obj, "functionDeclaration": fn, "returnByValue": True,
                                              "arguments": [{"value": a} for a in (args or [])]}, timeout_s=self._t())
        return r.get("result", {}).get("value")

    # -- the tools -------------------------------------------------------------------------
    def _observe(self, args: dict) -> ToolResult:
        url = self.session.current_url()
        text, truncated = _cap(f"at {url}\n{self.tree()}".encode(), self.obs_cap)
        return ToolResult(text, 0, None, truncated)

    def _click(self, args: dict) -> ToolResult:
        if "element" in args:
            x, y = self._center(args["element"])
            what = f"clicked [{args['element']}]"
        else:
            x, y, what = args["x"], args["y"], f"clicked at {args['x']:g},{args['y']:g}"
        self._mouse_click(x, y)
        return self._after(what)

    def _type(self, args: dict) -> ToolResult:
        if "element" in args:
            self._call_on(args["element"], "function(){this.focus()}")
        elif "x" in args:
            self._mouse_click(args["x"], args["y"])
        if args.get("clear"):
            clear = ("function(){if('value' in this){this.value='';"
                     "this.dispatchEvent(new Event('input',{bubbles:true}))}}")
            if "element" in args:
                self._call_on(args["element"], clear)
            else:
                self.session.page("Runtime.evaluate", {"expression": f"({clear}).call(document.activeElement)"},
                                  timeout_s=self._t())
        self.session.cdp.events.clear()
        if args["text"]:
            self.session.page("Input.insertText", {"text": args["text"]}, timeout_s=self._t())
        if args.get("submit"):
            self._press("Enter")
        return self._after(f"typed {len(args['text'])} characters" + (" and pressed Enter" if args.get("submit") else ""),
                           may_navigate=bool(args.get("submit")))

    def _select(self, args: dict) -> ToolResult:
        ok = self._call_on(args["element"], """function(want){
            if (this.tagName !== 'SELECT') return 'not a select element';
            for (const o of this.options) { if (o.value === want || o.text.trim() === want) {
                this.value = o.value; this.dispatchEvent(new Event('input', {bubbles: true}));
                this.dispatchEvent(new Event('change', {bubbles: true})); return 'ok'; } }
            return 'no option ' + JSON.stringify(want); }""", [args["option"]])
        if ok != "ok":
            return _refuse("no_match", f"cannot select in [{args['element']}]: {ok}")
        return self._after(f"selected {args['option']!r} in [{args['element']}]", may_navigate=False)

    def _key(self, args: dict) -> ToolResult:
        if "element" in args:
            self._call_on(args["element"], "function(){this.focus()}")
        self.session.cdp.events.clear()
        self._press(args["key"])
        return self._after(f"pressed {args['key']}")

    def _scroll(self, args: dict) -> ToolResult:
        x, y = self._center(args["element"]) if "element" in args else (args.get("x", 400), args.get("y", 300))
        self.session.page("Input.dispatchMouseEvent", {"type": "mouseWheel", "x": x, "y": y,
                                                       "deltaX": args.get("dx", 0), "deltaY": args["dy"]},
                          timeout_s=self._t())
        return self._after(f"scrolled by {args['dy']:g}", may_navigate=False)

    def _navigate(self, args: dict) -> ToolResult:
        url = args["url"]
        if url.startswith("/"):
            url = self.session.origin + url
        if not self._origin_ok(url):
            return _refuse("origin_not_allowed", f"{url} is outside the allowed origins {list(self.allowed)}")
        self.session.navigate(url, self.b.load_timeout_s)
        return self._after(f"opened {url}", may_navigate=False)   # navigate() waited for the load

    def _screenshot(self, args: dict) -> ToolResult:
        if len(self.screenshots) >= self.b.max_screenshots:
            return _refuse("budget_exhausted", f"the screenshot budget ({self.b.max_screenshots}) is spent")
        params: dict = {"format": "png", "captureBeyondViewport": bool(args.get("full_page"))}
        data = base64.b64decode(self.session.page("Page.captureScreenshot", params, timeout_s=self._t())["data"])
        if len(data) > self.b.screenshot_bytes:
            w, h = png_size(data)
            params["clip"] = {"x": 0, "y": 0, "width": w, "height": h, "scale": 0.5}
            data = base64.b64decode(self.session.page("Page.captureScreenshot", params, timeout_s=self._t())["data"])
        if len(data) > self.b.screenshot_bytes:
            return _refuse("too_large", f"the screenshot is {len(data)} bytes even at half scale; the cap is "
                                        f"{self.b.screenshot_bytes}")
        w, h = png_size(data)
        name = f"screenshot-{len(self.screenshots) + 1:03d}.png"
        ref = self.artifacts(name, data) if self.artifacts else name
        self.screenshots.append({"ref": ref, "bytes": len(data), "width": w, "height": h})
        return ToolResult(f"screenshot stored as {ref} (PNG {w}x{h}, {len(data)} bytes)", 0)


__all__ = ["BrowserToolbox", "png_size", "render_tree"]
