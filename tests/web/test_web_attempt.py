"""A web task through the node's whole attempt pipeline: the scripted policy (web player) over
the OpenAI wire format, the gateway, the browser harness in a real sandbox, the webstate
verifier in a fresh one, Parquet shards read back with DuckDB: the trajectory holds the
accessibility observations and the screenshot artifact; a policy that does not commit fails."""
from __future__ import annotations

import pytest

from controller.analysis.query import connect
from controller.contracts.tasks import TaskSet
from controller.demo.policy_server import PolicyServer, default_params
from controller.demo.web_policy import WebPlayer
from controller.store.catalog import Catalog
from controller.taskbank.webtasks import web_tasks
from nodeagent.agent.attempt import Attempt, run_attempt

TASK = web_tasks()[15]            # add the Rain Jacket to alice's wishlist


@pytest.fixture(scope="module")
def policy():
    with PolicyServer(TaskSet("web", (TASK,)), players={"web": WebPlayer(solve_rate=(0.0, 1.0))}) as srv:
        srv.set_policy(0, default_params())
        srv.set_policy(1, default_params())
        yield srv


def run(tmp_path, runtime, image, policy, version, rollout="r1"):
    lease = {**TASK.canonical(), "task_id": TASK.task_id}
    res = run_attempt(runtime, image, "n1", Attempt("run", str(tmp_path), rollout, 1, 1, "b", 1, lease, version,
                                                    policy.url, f"scripted-v{version}"))
    with Catalog(tmp_path) as cat:
        cat.commit(rollout, 1, 1, res.shards, 0.0)
    return res, connect(tmp_path)


def test_a_solving_version_passes_and_the_trajectory_holds_the_tree(tmp_path, runtime, browser_image, policy):
    res, con = run(tmp_path, runtime, browser_image, policy, 1)
    assert (res.outcome, res.reward) == ("pass", 1.0), res.infra_reason
    tools, obs = zip(*con.execute("SELECT tool_name, observation FROM steps WHERE tool_name IS NOT NULL "
                                  "ORDER BY step").fetchall())
    assert tools[0] == "browser_navigate" and "browser_click" in tools
    assert any('] button "Add to wishlist"' in o for o in obs)
    (span,) = con.execute("SELECT name FROM spans WHERE kind = 'sandbox_start'").fetchone()
    assert "chromium" in span
    changes = con.execute("SELECT changes_path FROM rollouts").fetchone()[0]
    assert (tmp_path / changes).stat().st_size > 0          # the captured state, for rescore


def test_a_version_that_does_not_commit_fails(tmp_path, runtime, browser_image, policy):
    res, _ = run(tmp_path, runtime, browser_image, policy, 0)
    assert (res.outcome, res.reward) == ("fail", 0.0), res.infra_reason


def test_a_screenshot_lands_beside_the_shards_and_is_named_in_the_step(tmp_path, runtime, browser_image):
    """A policy that takes a screenshot (its own one-tool script)."""
    class Shooter(WebPlayer):
        def script(self, task, variant, tool_results):
            from controller.demo.policy_server import FinalStep, ToolStep
            return [ToolStep("browser_screenshot", {}), FinalStep("done")][: len(tool_results) + 1]

    with PolicyServer(TaskSet("web", (TASK,)), players={"web": Shooter()}) as srv:
        srv.set_policy(0, default_params())
        res, con = run(tmp_path, runtime, browser_image, srv, 0, "r2")
    assert res.outcome == "fail" and res.infra_reason is None
    (obs,) = con.execute("SELECT observation FROM steps WHERE tool_name = 'browser_screenshot'").fetchone()
    ref = obs.split("stored as ")[1].split(" ")[0]
    assert ref.startswith("artifacts/r2.1/") and (tmp_path / ref).read_bytes()[:4] == b"\x89PNG"
    from controller.analysis.report import build_report
    from controller.analysis.report_render import render_html
    rep = build_report(tmp_path)
    assert rep["web"]["tasks"] == [{"task_name": TASK.name, "rollouts": 1, "observations": 0, "screenshots": 1}]
    assert rep["web"]["thumbnails"] == [{"task_name": TASK.name, "path": ref}]
    assert "data:image/png;base64,iVBORw0KGgo" in render_html(rep), "the report page shows the screenshot"
