"""Lease prefetch on the node agent's sans-I/O core: an agent of `slots` slots and `prefetch`
takes up to slots + prefetch leases, runs `slots` of them and holds the rest waiting (renewed
and fenced like running ones), starts a waiting one when a slot frees, drops a cancelled
waiting one without ever starting it, and hands the waiting ones back on a drain. The
Register field is omitted at 0, so an older controller still takes the frame."""
from __future__ import annotations

import json

import pytest

from controller.contracts import protocol as P
from nodeagent.agent.config import AgentConfig
from nodeagent.agent.core import AgentCore, AttemptResult
from tests.conftest import FakeClock

DEP = "prefetch-test"
PASS = AttemptResult("pass", 1.0, {}, None)


def lease(token: int, rid: str) -> P.Lease:
    return P.Lease(rollout_id=rid, attempt=1, token=token, lease_ttl_s=10.0,
                   task={"task_id": "t1", "image_digest": "sha256:aa"},
                   policy=P.PolicyRef(version=1, endpoint="http://m/v1", model="m"), seed=0,
                   run_id="run", run_dir="/run", batch_id="b")


def welcomed(slots: int, prefetch: int) -> tuple[AgentCore, FakeClock]:
    clock = FakeClock()
    core = AgentCore("n1", slots, DEP, heartbeat_interval_s=1.0, liveness=3, clock=clock,
                     prefetch=prefetch,
                     rng=type("NoPhase", (), {"uniform": staticmethod(lambda a, b: 0.0)})())
    core.start()
    core.receive_data(P.encode(P.Welcome(node="n1", heartbeat_interval_s=1.0, liveness=3,
                                         session="s1"), DEP))
    core.take_outbox()
    return core, clock


def give(core: AgentCore, *tokens: int) -> None:
    for t in tokens:
        core.receive_data(P.encode(lease(t, f"r{t}"), DEP))


def sent(core: AgentCore, cls) -> list:
    return [m for m in core.take_outbox() if isinstance(m, cls)]


def started(core: AgentCore) -> list[int]:
    return [a.token for a in core.take_attempts()]


def register_body(prefetch: int) -> dict:
    core = AgentCore("n1", 2, DEP, clock=FakeClock(), prefetch=prefetch)
    core.start()
    (reg,) = sent(core, P.Register)
    return json.loads(P.encode(reg, DEP))["body"]


def test_register_omits_prefetch_at_zero_so_an_older_controller_takes_it():
    assert "prefetch" not in register_body(0), "an older controller refuses an unknown field"
    body = register_body(3)
    assert body["prefetch"] == 3
    frame = json.dumps({"v": P.PROTOCOL_VERSION, "dep": DEP, "type": "register", "id": "x",
                        "body": {k: v for k, v in body.items() if k != "prefetch"}})
    assert P.decode(frame.encode(), DEP).prefetch == 0, "a register without it: no prefetch"


def test_a_negative_prefetch_is_refused_naming_the_field():
    with pytest.raises(ValueError, match="agent.prefetch"):
        AgentConfig(prefetch=-1)
    body = register_body(1) | {"prefetch": -1}
    frame = json.dumps({"v": P.PROTOCOL_VERSION, "dep": DEP, "type": "register", "id": "x",
                        "body": body})
    with pytest.raises(P.ProtocolError, match="prefetch"):
        P.decode(frame.encode(), DEP)


def test_without_prefetch_a_lease_beyond_the_slots_is_released_as_today():
    core, _ = welcomed(slots=1, prefetch=0)
    give(core, 1, 2)
    assert started(core) == [1]
    assert [(m.token, m.reason) for m in sent(core, P.Release)] == [(2, "no free slot")]


def test_the_agent_holds_slots_plus_prefetch_runs_its_slots_and_renews_all():
    core, clock = welcomed(slots=1, prefetch=2)
    give(core, 1, 2, 3, 4)
    assert started(core) == [1], "one slot: one attempt runs, the next two wait"
    assert [m.token for m in sent(core, P.Release)] == [4], "beyond slots + prefetch: released"
    assert core.running() == 1 and core.free() == 0
    clock.advance(1.0)
    core.tick()
    (hb,) = sent(core, P.Heartbeat)
    assert hb.held == ["r1", "r2", "r3"], "waiting leases are renewed like running ones"
    assert (hb.slots_free, hb.active) == (0, 1), "active: what runs, not what waits"


def test_a_slot_freed_starts_the_oldest_waiting_lease_once():
    core, _ = welcomed(slots=1, prefetch=2)
    give(core, 1, 2, 3)
    (a1,) = core.take_attempts()
    core.attempts_done([(a1, PASS)])
    assert started(core) == [2]
    give(core, 2)  # a duplicate delivery of a lease now running: ignored
    assert started(core) == [] and sent(core, P.Release) == []
    core.attempts_done([])
    assert started(core) == [], "no slot freed: nothing more starts"


def test_a_cancelled_waiting_lease_is_dropped_and_never_started_or_reported():
    core, _ = welcomed(slots=1, prefetch=2)
    give(core, 1, 2, 3)
    (a1,) = core.take_attempts()
    core.receive_data(P.encode(P.Reject(rollout_id="r2", attempt=1, token=2,
                                        reason="cancelled"), DEP))
    assert "r2" not in core.held() and started(core) == [], "the running slot is still taken"
    core.attempts_done([(a1, PASS)])
    assert started(core) == [3], "the cancelled one is skipped"
    results = [r for m in core.take_outbox() for r in P.unbatched(m) if isinstance(r, P.Result)]
    assert [r.token for r in results] == [1], "only the attempt that ran reports"
    assert not core.abandoned, "a waiting lease never given to a runner leaves nothing behind"


def test_a_cancelled_running_attempt_frees_its_slot_for_a_waiting_lease():
    core, _ = welcomed(slots=1, prefetch=1)
    give(core, 1, 2)
    (a1,) = core.take_attempts()
    core.receive_data(P.encode(P.Reject(rollout_id="r1", attempt=1, token=1,
                                        reason="cancelled"), DEP))
    assert a1.cancel and started(core) == [2]


def test_a_drain_hands_the_waiting_leases_back_at_once_and_lets_the_running_finish():
    core, clock = welcomed(slots=1, prefetch=2)
    give(core, 1, 2, 3)
    (a1,) = core.take_attempts()
    core.drain(5.0)
    out = core.take_outbox()
    assert [(m.token, m.reason) for m in out if isinstance(m, P.Release)] == \
        [(2, "draining: not started"), (3, "draining: not started")]
    assert isinstance(out[0], P.Ready) and out[0].draining, "the ready first: none comes back here"
    assert core.held() == ["r1"] and not a1.cancel
    core.attempts_done([(a1, PASS)])
    assert started(core) == [], "nothing waiting is started during a drain"
    core.receive_data(P.encode(P.AckBatch(refs=list(core.unacked)), DEP))
    core.tick()
    assert core.done


def test_a_shutdown_stops_everything_and_starts_no_waiting_lease():
    core, _ = welcomed(slots=1, prefetch=2)
    give(core, 1, 2, 3)
    (a1,) = core.take_attempts()
    core.receive_data(P.encode(P.Shutdown(reason="bye"), DEP))
    assert a1.cancel and started(core) == [] and not core.active


def test_paddock_agent_prefetch_flag_reaches_the_config_and_a_bad_one_exits_naming_it():
    import argparse
    import subprocess
    import sys

    from controller.cli.agent import add_arguments, configs
    ap = argparse.ArgumentParser()
    add_arguments(ap)
    base = ["--deployment", "d", "--insecure", "--controller", "tcp://127.0.0.1:9", "--noop-s", "0"]
    assert configs(ap.parse_args(base), {}, None)[0].prefetch == 0
    assert configs(ap.parse_args(base + ["--prefetch", "2"]), {}, None)[0].prefetch == 2
    r = subprocess.run([sys.executable, "-m", "controller.cli.main", "agent", *base, "--prefetch", "-1"],
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 2 and "agent.prefetch" in r.stderr, r.stderr
