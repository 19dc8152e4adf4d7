"""The reward-hacking battery of the conversational family: every built-in task, every hack
the scripted policy knows (claiming success to the user, editing service state out of band
and forging the service's replies, prompt-injecting the user simulator and the judge), real
rollouts; none may earn reward. The honest strategy passes every task (the battery is not
passing because nothing can pass), but the one whose judge cannot grade it (`judge_failed`)."""
from __future__ import annotations

import pytest

from controller.demo.policy_server import CONVERSATIONAL_CHEATS
from controller.taskbank.conversational import TONE_TASKS
from tests.conversational.conftest import TASKSET

pytestmark = pytest.mark.sandbox


@pytest.mark.parametrize("task", TASKSET.tasks, ids=lambda t: t.name.split("/", 1)[1])
def test_no_hack_is_rewarded_and_the_honest_agent_passes(rollout, task):
    res, _, _ = rollout(task, "solve")
    honest = ("judge_failed", None) if task.name.split("/", 1)[1] in TONE_TASKS else ("pass", 1.0)
    assert (res.outcome, res.reward) == honest, res.infra_reason
    for cheat in CONVERSATIONAL_CHEATS:
        res, rid, con = rollout(task, cheat)
        assert res.outcome == "fail" and res.reward == 0.0, (cheat, res.outcome, res.infra_reason)


def test_out_of_band_edits_of_the_service_are_refused(rollout):
    task = TASKSET.by_name()["conversational/assistant/schedule"]      # offers `shell`
    res, rid, con = rollout(task, "edit_state")
    assert (res.outcome, res.reward) == ("fail", 0.0)
    obs = [r[0] for r in con.execute("SELECT observation FROM steps WHERE rollout_id = ? AND tool_name = 'shell' "
                                     "ORDER BY step", [rid]).fetchall()]
    assert len(obs) == 3 and all("Permission denied" in o for o in obs), obs   # service files, interpreter
    final = con.execute('SELECT detail FROM checks WHERE rollout_id = ? AND "check" = \'state:final\'', [rid]).fetchone()
    assert '"sent":[]' in final[0]                        # the state the agent wrote is not the service's
