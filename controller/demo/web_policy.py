"""The scripted policy's player for `web` tasks: reads the instruction, acts on the page's tree.

Plugged in as a family player of the scripted policy: `ScriptedPolicy(players={"web":
WebPlayer()})` (the local run does it for a task set with web tasks, `controller.demo.localrun
.scripted_players`; no policy script is needed: the plan comes from the instruction, the element
ids from the observations). `choose(task, version, seed)` draws the variant: `solve` with
probability `SOLVE_RATE[version]` (past the table's end, its last value), else `sloppy` (the
same plan with its final, committing action left out), so the pass rate rises with the
version. `script(task, variant, tool_results)` returns the steps so far and the next one: step
n is computed from the n-th tool result (the tree after the previous action), finding an
element by role and name (`[id] role "name"`).

The plan of a goal is a list of high-level actions: `("open", path)`, `("click", role, name)`,
`("type", role, name, text, submit)`, `("select", role, name, option)`, `("check", name)`.
An instruction that matches no template gets a final message saying so (the task fails).

Must not import: zmq, sqlite3, nodeagent.
"""
from __future__ import annotations

import math
import random
import re

from controller.contracts.tasks import Task
from controller.demo.policy_server import FinalStep, Step, ToolStep

FAMILY = "web"
SOLVE_RATE = (0.2, 0.45, 0.7, 0.9)
DONE = "done"
_LOGIN = re.compile(r"Log in to the shop at (\S+) as (\w+) \(password (\S+)\)\. Then (.*)$", re.S)
GOALS = [
    ("cart", re.compile(r"put (\d+) × (.+?) in your cart, without placing an order\.")),
    ("buy", re.compile(r'buy (\d+) × (.+?), shipped to "(.+?)"(?:, with the coupon code (\w+))?\.')),
    ("cancel", re.compile(r"cancel your order #(\d+)\.")),
    ("review", re.compile(r'post a review of (.+?) with a rating of (\d) and the text "(.*)"\.')),
    ("wishlist", re.compile(r"add (.+?) to your wishlist\.")),
    ("name", re.compile(r'change your display name to "(.+)"\.')),
    ("email", re.compile(r'change your email to "(.+)" and subscribe to the newsletter\.')),
]


def plan(instruction: str) -> list[tuple] | None:
    """The high-level actions for an instruction, or None if it matches no template."""
    m = _LOGIN.match(instruction.strip())
    if not m:
        return None
    _origin, user, password, goal = m.groups()
    steps: list[tuple] = [("open", "/login"), ("type", "textbox", "Username", user, False),
                          ("type", "textbox", "Password", password, True)]
    for kind, rx in GOALS:
        g = rx.fullmatch(goal.strip())
        if not g:
            continue
        a = g.groups()
        if kind == "cart":
            return steps + [("open", "/"), ("click", "link", a[1]), ("type", "textbox", "Quantity", a[0], False),
                            ("click", "button", "Add to cart")]
        if kind == "buy":
            tail = [("type", "textbox", "Coupon code", a[3], False)] if a[3] else []
            return steps + [("open", "/"), ("click", "link", a[1]), ("type", "textbox", "Quantity", a[0], False),
                            ("click", "button", "Add to cart"), ("open", "/checkout"),
                            ("type", "textbox", "Shipping address", a[2], False), *tail,
                            ("click", "button", "Place order")]
        if kind == "cancel":
            return steps + [("open", f"/order/{a[0]}"), ("click", "button", "Cancel order")]
        if kind == "review":
            return steps + [("open", "/"), ("click", "link", a[0]), ("select", "combobox", "Rating", a[1]),
                            ("type", "textbox", "Review", a[2], False), ("click", "button", "Post review")]
        if kind == "wishlist":
            return steps + [("open", "/"), ("click", "link", a[0]), ("click", "button", "Add to wishlist")]
        if kind == "name":
            return steps + [("open", "/account"), ("type", "textbox", "Display name", a[0], False),
                            ("click", "button", "Save")]
        if kind == "email":
            return steps + [("open", "/account"), ("type", "textbox", "Email", a[0], False),
                            ("check", "Subscribe to the newsletter"), ("click", "button", "Save")]
    return None


def find_element(observation: str, role: str, name: str) -> int | None:
    """The id of the first element `[id] role "name..."` in a tree (name: a prefix match)."""
    m = re.search(r"\[(\d+)\] " + re.escape(role) + r' "' + re.escape(name), observation)
    return int(m.group(1)) if m else None


def _checkbox(observation: str, label: str) -> int | None:
    return find_element(observation, "checkbox", label)


def to_step(action: tuple, observation: str) -> Step:
    """One tool call for `action`, given the tree the previous action returned."""
    kind = action[0]
    if kind == "open":
        return ToolStep("browser_navigate", {"url": action[1]})
    if kind == "check":          # tick a checkbox unless it is ticked already (then just look)
        el = _checkbox(observation, action[1])
        if el is None:
            return FinalStep(f"I cannot find the checkbox {action[1]!r} on this page.")
        line = next(l for l in observation.splitlines() if f"[{el}]" in l)
        return ToolStep("browser_observe", {}) if " checked" in line else ToolStep("browser_click", {"element": el})
    el = find_element(observation, action[1], action[2])
    if el is None:
        return FinalStep(f"I cannot find the {action[1]} {action[2]!r} on this page.")
    if kind == "click":
        return ToolStep("browser_click", {"element": el})
    if kind == "type":
        return ToolStep("browser_type", {"element": el, "text": action[3], "clear": True, "submit": action[4]})
    return ToolStep("browser_select", {"element": el, "option": action[3]})


class WebPlayer:
    """`ScriptedPolicy`'s player for web tasks (see the module docstring)."""

    def __init__(self, solve_rate: tuple[float, ...] = SOLVE_RATE) -> None:
        self.solve_rate = solve_rate

    def choose(self, task: Task, version: int, seed: int) -> tuple[str, float]:
        p = self.solve_rate[min(version, len(self.solve_rate) - 1)]
        rng = random.Random(f"{task.task_id}:{version}:{seed}")
        variant = "solve" if rng.random() < p else "sloppy"
        return variant, math.log(p if variant == "solve" else 1 - p)

    def script(self, task: Task, variant: str, tool_results: list[str]) -> list[Step]:
        actions = plan(task.instruction)
        if actions is None:
            return [FinalStep("I do not know how to do this task.")]
        if variant == "sloppy":
            actions = actions[:-1]          # never commits: the last click is left out
        n = len(tool_results)
        done: list[Step] = [FinalStep("")] * n   # placeholders: only step n is read
        if n >= len(actions):
            return done + [FinalStep(DONE)]
        last = tool_results[-1] if tool_results else ""
        if last.startswith("error:") and n > 0:
            return done + [FinalStep(f"giving up: {last[:200]}")]
        return done + [to_step(actions[n], last)]


__all__ = ["SOLVE_RATE", "WebPlayer", "find_element", "plan", "to_step"]
