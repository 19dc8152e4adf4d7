"""Conversational rollouts end to end: a real sandbox, the built-in harness talking with a
simulated user, the task's mock services running in the sandbox, the state checker."""
from __future__ import annotations

import json

import pytest

from tests.conversational.conftest import TASKSET

pytestmark = pytest.mark.sandbox
CANCEL = TASKSET.by_name()["conversational/retail/cancel-pending"]


def test_an_agent_that_does_the_job_passes_on_the_final_service_state(rollout):
    res, rid, con = rollout(CANCEL, "solve")
    assert (res.outcome, res.reward) == ("pass", 1.0), res.infra_reason
    checks = dict(con.execute('SELECT "check", verdict FROM checks WHERE rollout_id = ?', [rid]).fetchall())
    assert checks["state:shop"] == "pass" and checks["told:include:cancelled"] == "pass"
    final = json.loads(con.execute('SELECT detail FROM checks WHERE rollout_id = ? AND "check" = \'state:final\'',
                                   [rid]).fetchone()[0])
    assert final["shop"]["orders"]["W1001"]["status"] == "cancelled"


def test_every_user_turn_is_a_step_of_the_trajectory(rollout):
    res, rid, con = rollout(CANCEL, "solve")
    rows = con.execute("SELECT step, role, content, tool_name FROM steps WHERE rollout_id = ? ORDER BY step",
                       [rid]).fetchall()
    roles = [r[1] for r in rows]
    assert roles[0] == "user" and rows[0][2] == CANCEL.user["opening"]
    assert roles.count("user") >= 3 and [r[0] for r in rows] == list(range(len(rows)))
    assert "###STOP###" in rows[-1][2] and roles[-1] == "user"
    assert [r[3] for r in rows if r[3]] == ["find_user", "get_order", "cancel_order"]
    stop = con.execute("SELECT stop_reason FROM rollouts WHERE rollout_id = ?", [rid]).fetchone()[0]
    assert stop == "user_stop"


@pytest.mark.parametrize("strategy", ["sloppy", "claim_success"])
def test_an_agent_that_only_says_it_is_done_earns_nothing(rollout, strategy):
    res, rid, con = rollout(CANCEL, strategy)
    assert (res.outcome, res.reward) == ("fail", 0.0), res.infra_reason


def test_a_conversation_replays_to_the_same_verdict_and_the_same_user_turns(rollout, runtime, python_image):
    from nodeagent.agent.replay import reexecute
    res, rid, con = rollout(CANCEL, "solve")
    cur = con.execute("SELECT * FROM steps WHERE rollout_id = ? ORDER BY step", [rid])
    names = [d[0] for d in cur.description]
    steps = [dict(zip(names, r)) for r in cur.fetchall()]
    again, new_steps = reexecute({**CANCEL.canonical(), "task_id": CANCEL.task_id}, python_image, rollout_id=rid,
                                 attempt=1, seed=7, policy_version=0, steps=steps, runtime=runtime)
    assert (again.outcome, again.reward) == (res.outcome, res.reward) == ("pass", 1.0)
    assert [(s["role"], s["content"], s["observation"]) for s in new_steps] == \
        [(s["role"], s["content"], s["observation"]) for s in steps]


def test_a_conversation_is_rescored_from_its_kept_final_state(rollout, runtime, python_image, tmp_path):
    from nodeagent.verifier.rescore import regrade
    res, rid, con = rollout(CANCEL, "solve")
    cur = con.execute("SELECT * FROM rollouts WHERE rollout_id = ?", [rid])
    row = dict(zip([d[0] for d in cur.description], cur.fetchone()))
    tasks = {CANCEL.task_id: {**CANCEL.canonical(), "task_id": CANCEL.task_id}}
    out = regrade(row, tmp_path, tasks, runtime, lambda digest: python_image)
    assert (out["outcome"], out["reward"], out["rescored"]) == ("pass", 1.0, True), out["infra_reason"]
    (tmp_path / row["changes_path"].replace(".tar", ".conversation.json")).unlink()
    out = regrade(row, tmp_path, tasks, runtime, lambda digest: python_image)
    assert out["outcome"] == "infra_error" and "no service state" in out["infra_reason"]
