"""Web tasks: what the agent typed cannot turn grading into an infrastructure error (red team
s11 §3). The captured state is built through the app's own `Shop.mutate` (a valid audit chain,
as the app leaves it) and graded by the real verifier in a real sandbox."""
import dataclasses
import sqlite3
import tempfile

import pytest

from controller.taskbank.webtasks import SEED_SQL, web_tasks
from nodeagent.browser.apps import shop
from nodeagent.verifier import grade, webstate
from nodeagent.verifier.baseline import Baseline, Watched, null_changes

KEY = bytes(range(32))


def _captured(name: str, email: str) -> list:
    """The changes of a rollout whose agent set alice's account to (name, email) in the app."""
    with tempfile.TemporaryDirectory() as d:
        db = f"{d}/app.db"
        shop.init_db(db, SEED_SQL)
        s = shop.Shop(db, KEY)
        s.seed_digest = shop.seed_digest(SEED_SQL)
        vals = {"display_name": name, "email": email, "address": "", "newsletter": 0}
        s.mutate("alice", "account", vals, lambda x: x.execute(
            "UPDATE users SET display_name=?, email=?, address=?, newsletter=? WHERE username='alice'",
            tuple(vals.values())))
        with open(db, "rb") as f:
            data = f.read()
    return webstate.state_changes({"db": data, "key_hex": KEY.hex()})


NAME_TASK = next(t for t in web_tasks() if t.name == "web/shop-name-alice-alice")


@pytest.mark.parametrize("name,email", [
    ("\U0001F600" * 2000, "\U0001F600" * 1990 + "@x.example"),     # the red team's: ~100 KB of JSON escapes
    ("\u4e00" * 2000, "\u4e00" * 1990 + "@x.example"),
    ("\x00\x7f" * 1000, "\U0010FFFF" * 1990 + "@x.example"),
])
def test_long_astral_strings_in_the_state_grade_fail_not_infra(runtime, python_image, name, email):
    v = grade.verify(runtime, python_image, grade.graded_task(NAME_TASK.canonical()), _captured(name, email), None,
                     baseline=Baseline())
    assert (v.outcome, v.reward) == ("fail", 0.0)
    assert all(len(c["detail"]) < 4000 for c in v.checks)          # what the verdict repeats is bounded


def test_the_right_state_still_passes(runtime, python_image):
    v = grade.verify(runtime, python_image, grade.graded_task(NAME_TASK.canonical()),
                     _captured("Alice Liddell", "alice@example.com"), None, baseline=Baseline())
    assert (v.outcome, v.reward) == ("pass", 1.0)


def test_the_evaluator_echo_is_bounded():
    with tempfile.TemporaryDirectory() as d:
        changes = {c.path: c.data for c in _captured("\U0001F600" * 2000, "\U0001F600" * 1990 + "@x.example")}
        db = f"{d}/app.db"
        with open(db, "wb") as f:
            f.write(changes[webstate.DB_CHANGE])
        out = shop.evaluate({"db": db, "key_hex": KEY.hex(), "seed_digest": shop.seed_digest(SEED_SQL), "port": 0,
                             "checks": NAME_TASK.checker["checks"]})
    import json
    assert out["verdict"] == "fail" and len(json.dumps(out)) < 16384


def test_a_web_tasks_null_solution_is_its_initial_state(runtime, python_image):
    """The baseline grades a web task without the agent: its initial state reaches a verdict,
    so a failure only the agent's state causes is the rollout's fail."""
    task = grade.graded_task(NAME_TASK.canonical())
    v = webstate.verify_webstate(runtime, python_image, task, null_changes(task))
    assert v.outcome == "fail"
    db = dict((c.path, c.data) for c in webstate.initial_changes(SEED_SQL))[webstate.DB_CHANGE]
    with tempfile.NamedTemporaryFile() as f:
        f.write(db)
        f.flush()
        assert sqlite3.connect(f.name).execute("SELECT COUNT(*) FROM audit").fetchone()[0] == 0


def test_the_web_grading_sandbox_is_watched(runtime, python_image):
    """`verify_webstate` makes its sandbox with `create`: the baseline must see the agent's
    state enter it, or every failure after it would stay infrastructure."""
    w = Watched(runtime, True)
    webstate.verify_webstate(w, python_image, grade.graded_task(NAME_TASK.canonical()),
                             _captured("Alice Smith", "alice@example.com"))
    assert w.agent_ran


def test_a_state_only_the_agents_rollout_breaks_is_its_fail(runtime, python_image):
    """The evaluator dies on the captured database (not a database at all); the initial state
    grades cleanly, so the failure is the rollout's: fail, never a task fault."""
    changes = [c if c.path != webstate.DB_CHANGE else dataclasses.replace(c, data=b"not a database " * 100)
               for c in _captured("Alice Smith", "alice@example.com")]
    v = grade.verify(runtime, python_image, grade.graded_task(NAME_TASK.canonical()), changes, None,
                     baseline=Baseline())
    assert (v.outcome, v.reward) == ("fail", 0.0)
    assert "grades cleanly without them" in v.checks[-1]["detail"]
