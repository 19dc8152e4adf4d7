"""The web task family as data: the built-in tasks, the web-task rules of the task contract, the
webstate checker spec, the browser tools' schemas, and the scripted web player's plans."""
import dataclasses

import pytest

from controller.contracts.browser_tools import (
    BROWSER_TOOLS,
    BrowserBudgets,
    browser_argument_error,
    browser_definitions,
)
from controller.contracts.tasks import TaskError
from controller.contracts.tools import ToolSetError
from controller.demo.policy_server import FinalStep, ToolStep
from controller.demo.web_policy import WebPlayer, find_element, plan
from controller.taskbank.webtasks import SEED_SQL, web_tasks, web_taskset
from nodeagent.browser.apps import shop


def test_the_builtin_web_set_has_at_least_20_valid_tasks_with_distinct_ids():
    ts = web_taskset()
    assert len(ts.tasks) >= 20
    assert len({t.task_id for t in ts.tasks}) == len(ts.tasks)
    for t in ts.tasks:
        assert t.family == "web" and t.checker["kind"] == "webstate" and t.image == "builtin:browser"
        assert set(t.tools) <= set(BROWSER_TOOLS) and t.hidden["seed.sql"] == SEED_SQL


def test_a_web_task_offering_the_shell_is_refused():
    t = web_tasks()[0]
    with pytest.raises(TaskError, match="browser tools"):
        dataclasses.replace(t, tools=("browser_click", "shell"))


def test_a_web_task_needs_a_webstate_checker_with_a_seed():
    t = web_tasks()[0]
    with pytest.raises(TaskError, match="webstate"):
        dataclasses.replace(t, checker={"kind": "exact", "answer": "x"})
    with pytest.raises(TaskError, match="seed.sql"):
        dataclasses.replace(t, hidden={})


@pytest.mark.parametrize("check, message", [
    ({"sql": "DELETE FROM orders", "expect": []}, "does not match"),
    ({"page": "/x", "as": "alice", "password": "p", "element": "a b", "expect": "x"}, "is not valid"),
    ({"sql": "SELECT 1", "expect": [], "extra": 1}, "is not valid"),
])
def test_a_malformed_webstate_check_is_refused_naming_it(check, message):
    t = web_tasks()[0]
    with pytest.raises(TaskError, match="checker"):
        dataclasses.replace(t, checker={"kind": "webstate", "app": "shop", "checks": [check]})


def test_the_evaluator_refuses_anything_but_a_select_at_run_time_too(tmp_path):
    db = tmp_path / "app.db"
    shop.init_db(str(db), SEED_SQL)
    out = shop.evaluate({"db": str(db), "key_hex": "00" * 32, "seed_digest": shop.seed_digest(SEED_SQL),
                         "checks": [{"sql": "DROP TABLE orders", "expect": []}]})
    assert out["verdict"] == "error"


def test_browser_tool_schemas_refuse_bad_calls():
    assert browser_argument_error("browser_click", {"element": 3}) is None
    assert browser_argument_error("browser_click", {"x": 1, "y": 2}) is None
    assert browser_argument_error("browser_click", {"element": 3, "x": 1, "y": 2}) is not None
    assert browser_argument_error("browser_click", {}) is not None
    assert browser_argument_error("browser_key", {"key": "F13"}) is not None
    assert browser_argument_error("browser_navigate", {"url": ""}) is not None
    assert [d["function"]["name"] for d in browser_definitions()] == list(BROWSER_TOOLS)


def test_browser_budgets_refuse_unknown_and_non_positive_keys():
    assert BrowserBudgets.from_dict({"max_screenshots": 3}).max_screenshots == 3
    with pytest.raises(ToolSetError, match="unknown"):
        BrowserBudgets.from_dict({"screenshots": 3})
    with pytest.raises(ToolSetError, match="positive"):
        BrowserBudgets.from_dict({"max_actions": 0})


def test_the_web_player_has_a_plan_for_every_builtin_task():
    for t in web_tasks():
        assert plan(t.instruction), t.name


def test_the_web_player_acts_on_the_ids_of_the_last_observation():
    t = web_tasks()[0]
    obs = 'ok\n[12] textbox "Username" @1,2 3x4\n[13] textbox "Password" @1,2 3x4'
    steps = WebPlayer().script(t, "solve", ["at /login", obs])
    assert steps[-1] == ToolStep("browser_type", {"element": 13, "text": "alice-pw", "clear": True, "submit": True})
    assert find_element(obs, "button", "Save") is None
    assert isinstance(WebPlayer().script(t, "solve", ["x", "error: gone"])[-1], FinalStep)


def test_the_web_players_solve_rate_rises_with_the_version():
    t, p = web_tasks()[0], WebPlayer()
    rates = [sum(p.choose(t, v, s)[0] == "solve" for s in range(400)) / 400 for v in range(4)]
    assert rates == sorted(rates) and rates[0] < 0.35 and rates[-1] > 0.8


def test_the_tree_folds_generic_nodes_and_repeated_text_and_keeps_ids_and_bounds():
    from nodeagent.harness.browser_tools import render_tree

    def node(i, role, name="", parent=None, children=(), bid=None, value=None, ignored=False, props=()):
        n = {"nodeId": str(i), "role": {"value": role}, "name": {"value": name}, "childIds": [str(c) for c in children],
             "backendDOMNodeId": bid or i, "ignored": ignored,
             "properties": [{"name": k, "value": {"value": v}} for k, v in props]}
        if parent is not None:
            n["parentId"] = str(parent)
        if value is not None:
            n["value"] = {"value": value}
        return n
    nodes = [node(1, "RootWebArea", "Shop", children=(2,)), node(2, "generic", parent=1, children=(3, 5, 7)),
             node(3, "link", "Home", parent=2, children=(4,)), node(4, "StaticText", "Home", parent=3),
             node(5, "textbox", "Qty", parent=2, children=(6,), value="2"), node(6, "StaticText", "2", parent=5),
             node(7, "checkbox", "News", parent=2, props=[("checked", "true")])]
    text = render_tree(nodes, {3: (10, 20, 30, 40)}, max_nodes=50)
    assert text.splitlines() == ['[1] RootWebArea "Shop"', '  [3] link "Home" @10,20 30x40',
                                 '  [5] textbox "Qty" value="2"', '  [7] checkbox "News" checked']
    assert render_tree(nodes, {}, max_nodes=2).endswith("[tree cut at 2 elements]")


def test_type_key_and_scroll_take_an_element_or_a_point_never_both():
    assert browser_argument_error("browser_type", {"text": "a", "x": 1, "y": 2}) is None
    assert browser_argument_error("browser_type", {"text": "a", "x": 1}) is not None
    assert browser_argument_error("browser_type", {"text": "a", "element": 3, "x": 1, "y": 2}) is not None
    assert browser_argument_error("browser_key", {"key": "Enter", "element": 4}) is None
    assert browser_argument_error("browser_scroll", {"dy": 100, "element": 4}) is None
    assert browser_argument_error("browser_scroll", {"dy": 100, "element": 4, "x": 1, "y": 1}) is not None


def test_a_rollout_without_captured_state_is_never_scored():
    from nodeagent.verifier.grade import VerifierInfraError, graded_task, verify
    with pytest.raises(VerifierInfraError, match="no captured web state"):
        verify(None, None, graded_task(web_tasks()[0].canonical()), [], None)
