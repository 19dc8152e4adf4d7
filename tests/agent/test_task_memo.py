"""The node agent decodes each distinct lease task once (`TaskMemo`, nodeagent/agent/leases.py):
leases of a task already seen take the LeaseTask decoded when it first came, a task that
differs only in a value's JSON type (`1` against `true`) is decoded and checked on its own, a
malformed task is never kept (each of its leases is an `infra_error` naming the field), and
the memo's size is bounded (the oldest task goes; a very large task is never kept)."""
from __future__ import annotations

from controller.contracts import protocol as P
from nodeagent.agent.core import AgentCore, AttemptResult
from nodeagent.agent.leases import TaskMemo
from tests.conftest import FakeClock

DEP = "memo-test"
TASK = {"task_id": "t1", "image_digest": "sha256:aa", "budgets": {"max_steps": 1}}


def lease(token: int, task: dict) -> P.Lease:
    return P.Lease(rollout_id=f"r{token}", attempt=1, token=token, lease_ttl_s=10.0, task=task,
                   policy=P.PolicyRef(version=1, endpoint="http://m/v1", model="m"), seed=0,
                   run_id="run", run_dir="/run", batch_id="b")


def welcomed() -> AgentCore:
    core = AgentCore("n1", 4, DEP, heartbeat_interval_s=1.0, liveness=3, clock=FakeClock())
    core.start()
    core.receive_data(P.encode(P.Welcome(node="n1", heartbeat_interval_s=1.0, liveness=3,
                                         session="s1"), DEP))
    core.take_outbox()
    return core


def give(core: AgentCore, token: int, task: dict) -> None:
    core.receive_data(P.encode(lease(token, task), DEP))  # a frame: the task dict is new each time


def results(core: AgentCore) -> list[P.Result]:
    return [m for m in core.take_outbox() if isinstance(m, P.Result)]


def test_leases_of_one_task_decode_it_once_and_share_the_frozen_task():
    core = welcomed()
    give(core, 1, TASK)
    give(core, 2, dict(TASK))
    a, b = core.take_attempts()
    assert core.tasks.decoded == 1
    assert a.task is b.task and a.task.budgets.max_steps == 1
    give(core, 3, {**TASK, "task_id": "t2"})
    (c,) = core.take_attempts()
    assert core.tasks.decoded == 2 and c.task.task_id == "t2"


def test_a_task_equal_in_python_but_not_in_json_is_checked_on_its_own():
    """`True == 1` in Python: a memo keyed by dict equality would pass a boolean budget."""
    core = welcomed()
    give(core, 1, TASK)
    give(core, 2, {**TASK, "budgets": {"max_steps": True}})
    assert len(core.take_attempts()) == 1
    (res,) = results(core)
    assert (res.token, res.outcome, res.infra_code) == (2, "infra_error", "task")
    assert "max_steps" in res.infra_reason


def test_a_malformed_task_is_never_kept_each_lease_of_it_fails_naming_the_field():
    core = welcomed()
    bad = {**TASK, "split": "nope"}
    give(core, 1, bad)
    give(core, 2, dict(bad))
    assert core.take_attempts() == []
    got = results(core)
    assert [r.token for r in got] == [1, 2]
    assert all(r.outcome == "infra_error" and "'split'" in r.infra_reason for r in got)
    assert core.tasks.decoded == 2


def test_the_memo_keeps_at_most_kept_tasks_and_never_a_task_over_max_chars():
    memo = TaskMemo(kept=2, max_chars=200)
    tasks = [{**TASK, "task_id": f"t{i}"} for i in range(3)]
    for t in tasks:
        memo.decode(t)
    assert memo.decoded == 3
    memo.decode(dict(tasks[2]))
    memo.decode(dict(tasks[1]))
    assert memo.decoded == 3, "the two newest are kept"
    memo.decode(dict(tasks[0]))
    assert memo.decoded == 4, "the oldest went"
    big = {**TASK, "instruction": "x" * 300}
    memo.decode(big)
    memo.decode(dict(big))
    assert memo.decoded == 6, "a task over max_chars is decoded every time"


def test_an_attempt_of_a_shared_task_still_reports_its_own_result():
    core = welcomed()
    give(core, 1, TASK)
    give(core, 2, TASK)
    a, b = core.take_attempts()
    core.attempts_done([(b, AttemptResult("pass", 1.0, {}, None)),
                        (a, AttemptResult("fail", 0.0, {}, None))])
    assert sorted((r.token, r.outcome) for r in results(core)) == [(1, "fail"), (2, "pass")]


def test_an_attempt_from_a_lease_is_the_attempt_its_fields_make():
    """`from_lease` fills the frozen instance directly: the same value as the constructor's."""
    from nodeagent.agent.core import Attempt
    msg = lease(7, TASK)
    a = Attempt.from_lease(msg, TaskMemo())
    b = Attempt(msg.run_id, msg.run_dir, msg.rollout_id, msg.attempt, msg.token, msg.batch_id,
                msg.seed, a.task, 1, "http://m/v1", "m")
    assert a == b and repr(a) == repr(b)
    assert a.cancel is not b.cancel and not a.cancel
