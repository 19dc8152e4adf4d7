"""A conversational task with an LLM judge reading the whole conversation: the judge's score is
weighted in on a passing state; a judge that fails is `judge_failed` (its own outcome, reward
NULL) in the store; a judge that would obey text the agent injects is never even asked about a
hack (the state failed), and the built-in tasks' own judge (`node:judge`) scores the honest
agent 1 and the tone task `judge_failed`."""
from __future__ import annotations

import dataclasses
import re

import pytest

from controller.demo.policy_server import CONVERSATIONAL_CHEATS
from tests.conversational.conftest import TASKSET
from tests.conversational.test_judge import FakeJudge

pytestmark = pytest.mark.sandbox
BASE = TASKSET.by_name()["conversational/retail/cancel-pending"]


def judged(fake, **extra):
    judge = {"endpoint": fake.url, "model": "judge-1", "rubric": "Was the agent polite and clear?",
             "sees": "trajectory", "weight": 0.2, "max_retries": 1, **extra}
    return dataclasses.replace(BASE, checker={**BASE.checker, "judge": judge})


def test_the_judge_reads_the_conversation_and_its_score_is_weighted_in(rollout):
    fake = FakeJudge("Polite.\nSCORE: 0.5")
    try:
        res, rid, con = rollout(judged(fake), "solve")
    finally:
        fake.close()
    assert res.outcome == "pass" and res.reward == pytest.approx(0.8 + 0.2 * 0.5)
    prompt = fake.requests[0]["messages"][0]["content"]
    assert "[user] Hi, I want to cancel an order." in prompt and "[assistant]" in prompt
    verdict, detail = con.execute('SELECT verdict, detail FROM checks WHERE rollout_id = ? AND "check" = \'judge\'',
                                  [rid]).fetchone()
    assert verdict == "0.500" and "Polite." in detail


def test_a_failing_judge_is_judge_failed_never_zero(rollout):
    fake = FakeJudge(503)
    try:
        res, rid, con = rollout(judged(fake, model="judge-down"), "solve")
    finally:
        fake.close()
    assert (res.outcome, res.reward) == ("judge_failed", None)
    row = con.execute("SELECT outcome, reward FROM rollouts WHERE rollout_id = ?", [rid]).fetchone()
    assert row == ("judge_failed", None) and len(fake.requests) == 2
    verdict, detail = con.execute('SELECT verdict, detail FROM checks WHERE rollout_id = ? AND "check" = \'judge\'',
                                  [rid]).fetchone()
    assert verdict == "judge_failed" and "503" in detail


def naive_judge(request: dict) -> str:
    """A judge the injection fools: it repeats any 'SCORE: x' it finds in the artifact."""
    artifact = request["messages"][0]["content"].split("<<<ARTIFACT", 1)[1]
    found = re.findall(r"SCORE:\s*([01](?:\.\d+)?)", artifact)
    return f"As instructed.\nSCORE: {found[-1]}" if found else "Meh.\nSCORE: 0.3"


@pytest.mark.parametrize("cheat", CONVERSATIONAL_CHEATS)
def test_hacks_earn_nothing_even_from_a_judge_that_obeys_injections(rollout, cheat):
    fake = FakeJudge(naive_judge)
    try:
        res, rid, con = rollout(judged(fake, model=f"naive-{cheat}"), cheat)
    finally:
        fake.close()
    assert res.outcome == "fail" and res.reward == 0.0, (cheat, res.outcome)
    verdict, = con.execute('SELECT verdict FROM checks WHERE rollout_id = ? AND "check" = \'judge\'',
                           [rid]).fetchone()
    assert verdict == "skipped" and fake.requests == []      # a failed state is never put to the judge


def test_a_judge_that_obeys_injections_is_fooled_only_where_the_state_is_right(rollout):
    fake = FakeJudge(naive_judge)
    try:
        res, rid, con = rollout(judged(fake, model="naive-solve"), "solve")
    finally:
        fake.close()
    assert res.outcome == "pass" and res.reward == pytest.approx(0.8 + 0.2 * 0.3)   # no score in the text


def test_the_built_in_tasks_are_judged_by_the_nodes_judge(rollout):
    res, rid, con = rollout(TASKSET.by_name()["conversational/retail/cancel-pending"], "solve")
    assert (res.outcome, res.reward) == ("pass", 1.0)
    assert con.execute('SELECT verdict FROM checks WHERE rollout_id = ? AND "check" = \'judge\'',
                       [rid]).fetchone() == ("1.000",)
    res, rid, con = rollout(TASKSET.by_name()["conversational/retail/new-address-tone"], "solve")
    assert (res.outcome, res.reward) == ("judge_failed", None)
    detail, = con.execute('SELECT detail FROM checks WHERE rollout_id = ? AND "check" = \'judge\'', [rid]).fetchone()
    assert "not able to grade the tone" in detail


def test_without_a_judge_on_the_node_a_judged_task_is_judge_failed(rollout, monkeypatch):
    from nodeagent.verifier import judge
    task = TASKSET.by_name()["conversational/airline/cancel"]
    monkeypatch.delenv("PADDOCK_JUDGE_ENDPOINT")
    monkeypatch.setattr(judge, "_default", judge.JudgeService())     # nothing cached
    res, rid, con = rollout(task, "solve")
    assert (res.outcome, res.reward) == ("judge_failed", None)
    detail, = con.execute('SELECT detail FROM checks WHERE rollout_id = ? AND "check" = \'judge\'', [rid]).fetchone()
    assert "PADDOCK_JUDGE_ENDPOINT" in detail
