"""The node agent's sans-I/O core, driven by hand: frames in, the outbox out, time injected."""
from __future__ import annotations

import pytest

from controller.contracts import protocol as P
from controller.contracts.tasks import LeaseTask, TaskError
from nodeagent.agent.core import PHASES, RECONNECT, AgentCore, AttemptResult, Phase

DEP = "core-test"


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def lease(token: int, task: object = None, rid: str = "r1") -> P.Lease:
    return P.Lease(rollout_id=rid, attempt=1, token=token, lease_ttl_s=10.0,
                   task={"task_id": "t1", "image_digest": "sha256:aa"} if task is None else task,
                   policy=P.PolicyRef(version=1, endpoint="http://m/v1", model="m"), seed=0,
                   run_id="run", run_dir="/run", batch_id="b")


def welcomed(slots: int = 2) -> tuple[AgentCore, Clock]:
    clock = Clock()
    core = AgentCore("n1", slots, DEP, heartbeat_interval_s=1.0, liveness=3, clock=clock,
                     rng=type("NoPhase", (), {"uniform": staticmethod(lambda a, b: 0.0)})())
    core.start()
    core.receive_data(P.encode(P.Welcome(node="n1", heartbeat_interval_s=1.0, liveness=3,
                                         session="s1"), DEP))
    core.take_outbox()
    return core, clock


def sent(core: AgentCore, cls) -> list:
    return [m for m in core.take_outbox() if isinstance(m, cls)]


def test_start_registers_then_says_ready_with_its_free_slots():
    core = AgentCore("n1", 3, DEP, clock=Clock())
    core.start()
    reg, ready = core.take_outbox()
    assert isinstance(reg, P.Register) and reg.slots == 3 and reg.held == []
    assert isinstance(ready, P.Ready) and ready.credit == 3 and not ready.draining


def test_a_lease_becomes_one_attempt_with_its_task_decoded_once():
    core, _ = welcomed()
    core.receive_data(P.encode(lease(7), DEP))
    core.receive_data(P.encode(lease(7), DEP))  # a duplicate delivery
    (a,) = core.take_attempts()
    assert (a.rollout_id, a.token, a.endpoint) == ("r1", 7, "http://m/v1")
    assert isinstance(a.task, LeaseTask) and a.task.image_digest == "sha256:aa"


def test_a_malformed_task_is_an_infra_error_result_naming_the_field_never_an_attempt():
    core, _ = welcomed()
    core.receive_data(P.encode(lease(7, {"task_id": "t1", "budgets": {"max_step": 3}}), DEP))
    assert core.take_attempts() == []
    (res,) = sent(core, P.Result)
    assert res.outcome == "infra_error" and res.infra_reason.startswith("task:")
    assert "max_step" in res.infra_reason and core.infra_errors == 1


def test_a_result_is_resent_until_acknowledged():
    core, clock = welcomed()
    core.receive_data(P.encode(lease(7), DEP))
    (a,) = core.take_attempts()
    core.attempts_done([(a, AttemptResult("pass", 1.0, {}, None))])
    (res,) = sent(core, P.Result)
    clock.now += 3.0  # a liveness period: heartbeat, and the result again
    core.receive_data(P.encode(P.Heartbeat(), DEP))
    core.tick()
    assert [m.id for m in sent(core, P.Result)] == [res.id]
    core.receive_data(P.encode(P.Ack(ref=res.id, ok=True), DEP))
    clock.now += 3.0
    core.receive_data(P.encode(P.Heartbeat(), DEP))
    core.tick()
    assert sent(core, P.Result) == [] and core.unacked == {}


def test_a_silent_controller_means_a_fresh_socket_and_a_new_registration():
    core, clock = welcomed()
    clock.now += 3.5
    core.tick()
    out = core.take_outbox()
    i = out.index(RECONNECT)
    assert isinstance(out[i + 1], P.Register) and isinstance(out[i + 2], P.Ready)
    assert core.registrations == 2


def test_an_unsolicited_welcome_makes_the_agent_register_again_listing_what_it_holds():
    core, _ = welcomed()
    core.receive_data(P.encode(lease(7), DEP))
    core.take_outbox()
    core.receive_data(P.encode(P.Welcome(node="n1", heartbeat_interval_s=1.0, liveness=3,
                                         session="s2"), DEP))
    (reg,) = sent(core, P.Register)
    assert reg.held == ["r1"]


def test_drain_releases_what_has_not_finished_by_the_deadline_then_disconnects():
    core, clock = welcomed()
    core.receive_data(P.encode(lease(7), DEP))
    core.take_attempts()
    core.drain(1.0)
    assert sent(core, P.Ready)[0].credit == 0
    core.receive_data(P.encode(lease(8, rid="r2"), DEP))
    assert [m.token for m in sent(core, P.Release)] == [8], "no new lease while draining"
    clock.now += 1.0
    core.tick()
    out = core.take_outbox()
    assert [m.token for m in out if isinstance(m, P.Release)] == [7]
    assert isinstance(out[-1], P.Disconnect) and core.done


def test_a_refusal_stops_the_agent_with_the_reason():
    core, _ = welcomed()
    core.receive_data(P.encode(P.Refused(reason="agent_version", detail="too old",
                                         protocol_versions=[P.PROTOCOL_VERSION],
                                         min_agent_version="0.1"), DEP))
    assert core.stopped and "too old" in core.refused


def test_the_phase_table_forbids_going_back():
    assert PHASES[Phase.DONE] == frozenset()
    core, _ = welcomed()
    with pytest.raises(AssertionError, match="illegal phase"):
        core._enter(Phase.DONE)


def test_lease_task_decode_names_the_bad_field():
    with pytest.raises(TaskError, match="task_id"):
        LeaseTask.decode({"image_digest": "sha256:aa"})
    with pytest.raises(TaskError, match=r"files\[a.py\]"):
        LeaseTask.decode({"task_id": "t", "files": {"a.py": 3}})
    with pytest.raises(TaskError, match="limit 'memory'"):
        LeaseTask.decode({"task_id": "t", "limits": {"memory": 5}})
    t = LeaseTask.decode({"task_id": "t", "files": {"b": {"base64": "AAE="}}, "tools": ["shell"]})
    assert t.files == {"b": b"\x00\x01"} and t.tools == ("shell",)
