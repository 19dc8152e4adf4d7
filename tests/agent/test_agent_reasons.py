"""The node agent reports an infrastructure failure with its code (`result.infra_code`) beside
its text: a typed reason gives both; the attempt runner's prose gets its code at the agent's
edge (`AttemptResult`); a malformed task, a missing image and a crash are coded where made."""
from __future__ import annotations

import pytest

from controller.contracts import protocol as P
from controller.contracts.states import InfraReason
from nodeagent.agent import attempt
from nodeagent.agent.core import AttemptResult
from nodeagent.agent.daemon import NodeAgent
from nodeagent.agent.guard import AttemptGuard, Deadlines
from tests.sim.test_agent_core import DEP, lease, sent, welcomed


def finish(res: AttemptResult) -> P.Result:
    core, _ = welcomed()
    core.receive_data(P.encode(lease(7), DEP))
    (a,) = core.take_attempts()
    core.attempts_done([(a, res)])
    (msg,) = sent(core, P.Result)
    return P.decode(P.encode(msg, DEP), DEP)      # as the controller reads it


def test_a_typed_reason_travels_as_its_code_and_its_text():
    why = InfraReason.of("sandbox", "task: the harness killed init: SIGKILL")
    got = finish(AttemptResult("infra_error", None, {}, why))
    assert (got.infra_code, got.infra_reason) == ("sandbox", why.text) and got.reason == why


def test_a_reason_in_prose_gets_its_code_at_the_agents_edge():
    res = AttemptResult("infra_error", None, {}, "deadline: teardown: the teardown phase ran past its 1s deadline")
    assert (res.infra_code, res.reason.is_loss) == ("deadline_teardown", True)
    got = finish(res)
    assert got.infra_code == "deadline_teardown" and got.infra_reason == res.infra_reason


def test_a_verdict_has_no_code():
    got = finish(AttemptResult("pass", 1.0, {}, None))
    assert (got.infra_code, got.reason) == (None, None)


def test_a_malformed_task_is_coded_task():
    core, _ = welcomed()
    core.receive_data(P.encode(lease(7, {"task_id": "t1", "budgets": {"max_step": 3}}), DEP))
    (res,) = sent(core, P.Result)
    assert res.infra_code == "task" and res.infra_reason.startswith("task: ") and "max_step" in res.infra_reason


def test_the_daemons_own_failures_are_coded(tmp_path):
    def crash(a):
        raise KeyError("boom")
    agent = NodeAgent("n1", "tcp://127.0.0.1:9", DEP, slots=1, image_store=str(tmp_path), insecure=True,
                      runner=crash)
    core, _ = welcomed()
    core.receive_data(P.encode(lease(7, {"task_id": "t1"}), DEP))
    (a,) = core.take_attempts()
    res = agent._run_attempt(a)
    assert (res.infra_code, res.infra_reason) == ("task", "task: the lease task has no 'image_digest'")
    agent._work(a)
    ((_, crashed),) = agent.done
    assert (crashed.infra_code, crashed.infra_reason) == ("agent_crash", "agent_crash: KeyError: 'boom'")


@pytest.mark.parametrize("stop", [("deadline", "create"), ("deadline", "setup"), ("deadline", "verify"),
                                  ("deadline", "teardown"), ("deadline", "total (agent)"), ("cancel", "drain")])
def test_the_guard_names_its_stop_as_the_attempt_runner_writes_it(stop):
    guard = AttemptGuard(Deadlines(total_s=60.0))
    guard.stop = stop
    reason = guard.reason()
    prose = attempt._stopped(guard).infra_reason          # the runner's text today
    assert reason.text == prose and reason.code == InfraReason.parse(prose).code
    assert reason.code == {"create": "deadline_create", "setup": "deadline_setup", "verify": "deadline_verify",
                           "teardown": "deadline_teardown", "total (agent)": "deadline_total",
                           "drain": "cancelled"}[stop[1]]
