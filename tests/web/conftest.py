"""Fixtures of the web tests: the browser image (built once per store, about 4 minutes the first
time; `layers.builtin.ensure_browser_image`) and a helper that plays a web task in a real sandbox
with a real chromium and grades it with the real verifier."""
import dataclasses
import json

import pytest

from controller.demo.policy_server import ToolStep


@pytest.fixture(scope="session")
def browser_image(image_store):
    from layers.builtin import ensure_browser_image
    return ensure_browser_image(image_store)[1]


@dataclasses.dataclass
class Played:
    observations: list
    verdict: object
    toolbox: object


@pytest.fixture
def play(runtime, browser_image, tmp_path):
    """play(task, calls | player variant, out_of_band=None, checker=None) -> Played.
    `calls`: (tool, arguments or a function of the last observation) pairs, or the scripted
    web player's variant ("solve", "sloppy"); `out_of_band(sandbox)` runs after the agent, before the
    capture (an attacker with a shell in the sandbox)."""
    from controller.demo.web_policy import WebPlayer
    from nodeagent.browser.rollout import artifact_sink
    from nodeagent.browser.session import BrowserSession
    from nodeagent.harness.browser_tools import BrowserToolbox
    from nodeagent.sandbox.runtime import SandboxSpec
    from nodeagent.verifier.grade import graded_task, verify
    from nodeagent.verifier.webstate import state_changes

    def run(task, calls, out_of_band=None, checker=None):
        bs = BrowserSession()
        sb = runtime.create(SandboxSpec(image=browser_image, limits=dataclasses.asdict(task.limits),
                                        egress_socket=bs.path))
        obs = []
        try:
            bs.start(sb, task.hidden["seed.sql"])
            tb = BrowserToolbox(bs, artifacts=artifact_sink(str(tmp_path), "r1", 0))
            if isinstance(calls, str):
                while True:
                    step = WebPlayer().script(task, calls, obs)[-1]
                    if not isinstance(step, ToolStep):
                        break
                    obs.append(tb.call(step.name, json.dumps(step.arguments)).observation)
            else:
                for name, args in calls:
                    if callable(args):
                        args = args(obs[-1] if obs else "")
                    obs.append(tb.call(name, json.dumps(args)).observation)
            if out_of_band is not None:
                out_of_band(sb)
            changes = state_changes(bs.capture(sb))
        finally:
            sb.destroy()
            bs.close()
        d = task.canonical()
        if checker is not None:
            d["checker"] = checker
        return Played(obs, verify(runtime, browser_image, graded_task(d), changes, None), tb)
    return run


def el(role, name, **extra):
    """Arguments naming the element `role "name"` of the last observation."""
    from controller.demo.web_policy import find_element

    def args(obs):
        found = find_element(obs, role, name)
        assert found is not None, f"no {role} {name!r} in:\n{obs}"
        return {"element": found, **extra}
    return args


def login(user, password):
    return [("browser_navigate", {"url": "/login"}),
            ("browser_type", el("textbox", "Username", text=user)),
            ("browser_type", el("textbox", "Password", text=password, submit=True))]
