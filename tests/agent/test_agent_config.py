"""The node agent's configuration object and its core's explicit states and message table.

`AgentConfig` holds every agent knob with one default (the core, the daemon and `paddock agent`
read the same ones), checked when made with errors naming the key; the core dispatches by one
table (type -> handler) and its ends (stopped, refused, gave up) are phases of its table."""
from __future__ import annotations

import argparse
import dataclasses
import subprocess
import sys

import pytest

from controller.broker.config import BrokerConfig
from controller.cli.agent import add_arguments
from controller.contracts import protocol as P
from controller.contracts.liveness import HEARTBEAT_INTERVAL_S, LIVENESS
from controller.contracts.tasks import BudgetError
from nodeagent.agent.config import AgentConfig, with_knobs
from nodeagent.agent.core import ENDED, LINKS, PHASES, RECONNECT, AgentCore, Link, Phase
from nodeagent.agent.daemon import NodeAgent, noop_runner
from tests.conftest import FakeClock

DEP = "config-test"


@pytest.mark.parametrize("knob, value, says", [
    ("slots", 0, "agent.slots must be an integer >= 1, got 0"),
    ("liveness", 2.5, "agent.liveness must be an integer >= 1"),
    ("heartbeat_interval_s", 0, "agent.heartbeat_interval_s must be a number > 0"),
    ("backoff_max_s", -1.0, "agent.backoff_max_s must be a number > 0"),
    ("drain_deadline_s", -1, "agent.drain_deadline_s must be a number >= 0"),
    ("give_up_s", 0, "agent.give_up_s must be a number > 0 or None"),
    ("noop_s", "fast", "agent.noop_s must be a number >= 0 or None"),
    ("warm_pool", -1, "agent.warm_pool must be an integer >= 0 or None"),
    ("sandbox", "docker", "agent.sandbox must be one of ['native', 'apptainer']"),
    ("heartbeat_interval_s", True, "agent.heartbeat_interval_s must be a number"),
])
def test_an_invalid_knob_is_refused_naming_its_key(knob, value, says):
    with pytest.raises(ValueError, match=r"^" + says.replace("[", r"\[").replace("]", r"\]")):
        AgentConfig(**{knob: value})


def test_a_bad_run_budget_default_names_the_budget_key():
    with pytest.raises(BudgetError, match="create_s"):
        AgentConfig(run_budgets={"create_s": -3})
    with pytest.raises(BudgetError, match="'wall_s' is not one of"):
        AgentConfig(run_budgets={"wall_s": 5})


def test_the_config_is_frozen_and_keeps_its_own_copy_of_the_budgets():
    budgets = {"total_s": 60}
    config = AgentConfig(run_budgets=budgets)
    budgets["total_s"] = -1  # the caller's dict changes later: the config does not
    assert config.run_budgets == {"total_s": 60}
    with pytest.raises(dataclasses.FrozenInstanceError):
        config.slots = 3  # type: ignore[misc]


def test_an_unknown_knob_is_refused_listing_the_valid_ones():
    with pytest.raises(ValueError, match=r"unknown agent setting\(s\) \['heartbeat_s'\]; valid: .*'liveness'"):
        with_knobs(AgentConfig(), {"heartbeat_s": 1.0})
    with pytest.raises(ValueError, match="heartbeat_s"):
        AgentCore("n1", 2, DEP, heartbeat_s=1.0)
    with pytest.raises(ValueError, match="heartbeat_s"):
        NodeAgent("n1", "tcp://127.0.0.1:9", DEP, 1, insecure=True, runner=noop_runner(), heartbeat_s=1.0)


def test_the_core_the_daemon_and_the_command_line_share_one_default_per_knob():
    """(Before the config object the core's reconnect backoff cap was 30 s and the daemon's 2 s.)"""
    defaults = AgentConfig()
    core = AgentCore("n1", None, DEP)
    agent = NodeAgent("n1", "tcp://127.0.0.1:9", DEP, insecure=True, runner=noop_runner())
    for c in (core, agent.core):
        assert (c.slots, c.hb_s, c.liveness, c.drain_deadline_s, c.backoff_max_s, c.give_up_s) == (
            defaults.slots, defaults.heartbeat_interval_s, defaults.liveness, defaults.drain_deadline_s,
            defaults.backoff_max_s, defaults.give_up_s)
    ap = argparse.ArgumentParser()
    add_arguments(ap)
    args = ap.parse_args(["--deployment", DEP])
    for key in ("slots", "heartbeat_interval_s", "drain_deadline_s", "give_up_s", "image_store", "noop_s",
                "sandbox"):
        assert getattr(args, key) == getattr(defaults, key), key


def test_both_ends_start_from_the_same_liveness_defaults():
    agent, broker = AgentConfig(), BrokerConfig()
    assert (agent.heartbeat_interval_s, agent.liveness) == (broker.heartbeat_interval_s, broker.liveness) == (
        HEARTBEAT_INTERVAL_S, LIVENESS)


def test_single_knobs_replace_fields_of_a_given_config():
    config = AgentConfig(slots=4, heartbeat_interval_s=0.5, drain_deadline_s=7.0)
    core = AgentCore("n1", None, DEP, config=config, liveness=3)
    assert (core.slots, core.hb_s, core.liveness, core.drain_deadline_s) == (4, 0.5, 3, 7.0)
    agent = NodeAgent("n1", "tcp://127.0.0.1:9", DEP, 2, insecure=True, runner=noop_runner(), config=config)
    assert agent.core.slots == 2 and agent.core.hb_s == 0.5 and agent.config.slots == 2


def test_paddock_agent_refuses_an_invalid_flag_value_naming_the_key_before_it_connects():
    r = subprocess.run([sys.executable, "-m", "controller.cli.main", "agent", "--deployment", DEP, "--insecure",
                        "--controller", "tcp://127.0.0.1:9", "--noop-s", "0", "--slots", "0"],
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 2 and "agent.slots must be an integer >= 1, got 0" in r.stderr, r.stderr


# ---- the core: explicit states ---------------------------------------------------------------

def welcomed(**knobs) -> tuple[AgentCore, FakeClock]:
    clock = FakeClock()
    core = AgentCore("n1", 2, DEP, clock=clock, **knobs)
    core.start()
    core.receive(P.Welcome(node="n1", heartbeat_interval_s=1.0, liveness=5, session="s1"))
    core.take_outbox()
    return core, clock


def refused() -> P.Refused:
    return P.Refused(reason="agent_version", detail="too old", protocol_versions=[P.PROTOCOL_VERSION],
                     min_agent_version="0.1")


def test_the_ends_of_an_agent_are_phases_that_nothing_follows():
    assert ENDED == {Phase.STOPPED, Phase.REFUSED, Phase.GAVE_UP}
    for end in ENDED:
        assert PHASES[end] == frozenset()
        assert end in PHASES[Phase.SERVING] and end in PHASES[Phase.DRAINING]
    core, _ = welcomed()
    core.receive(P.Shutdown(reason="run over"))
    assert core.phase is Phase.STOPPED and core.stopped and not core.gave_up and core.refused is None
    with pytest.raises(AssertionError, match="illegal phase"):
        core._enter(Phase.DRAINING)


def test_a_refusal_is_the_refused_phase_with_its_reason():
    core, _ = welcomed()
    core.receive(refused())
    assert core.phase is Phase.REFUSED and core.stopped and "too old" in core.refused


def test_an_agent_never_welcomed_gives_up_as_a_phase():
    clock = FakeClock()
    core = AgentCore("n1", 2, DEP, clock=clock, give_up_s=3.0)
    core.start()
    for _ in range(4):
        clock.advance(1.0)
        core.tick()
    assert core.phase is Phase.GAVE_UP and core.gave_up and core.stopped


def test_the_first_end_stays():
    core, _ = welcomed()
    core.receive(P.Shutdown(reason="run over"))
    core.receive(refused())  # a refusal after the shutdown does not make it a refused agent
    assert core.phase is Phase.STOPPED and core.refused is None
    core.stop()
    assert core.phase is Phase.STOPPED


def test_an_ended_agent_takes_no_drain_and_a_drained_one_stays_draining():
    core, _ = welcomed()
    core.stop()
    core.drain(1.0)
    assert core.phase is Phase.STOPPED and not core.draining and core.take_outbox() == []
    core, clock = welcomed()
    core.drain(1.0)
    clock.advance(2.0)
    core.tick()
    assert core.done and core.draining and core.free() == 0


# ---- the core: one message table ---------------------------------------------------------------

def test_the_core_dispatches_every_message_the_controller_sends_by_its_table():
    core, _ = welcomed()
    assert set(core._handlers) == {P.Lease, P.LeaseBatch, P.AckBatch, P.Welcome, P.Ack, P.Reject, P.Drain,
                                   P.Shutdown, P.PolicyUpdate, P.Refused, P.Heartbeat}
    table = core._handlers
    core.receive(P.Ack(ref="x", ok=True))
    assert core._handlers is table, "the table is built once, with the core"


def test_a_message_the_agent_does_not_take_is_ignored_but_proves_the_controller_alive():
    core, clock = welcomed()
    clock.advance(3.0)
    core.receive(P.Status())
    assert core.last_rx == clock.now and core.take_outbox() == [] and core.phase is Phase.SERVING


def test_the_registration_is_a_state_table_a_reconnect_and_a_welcome_move_through():
    clock = FakeClock()
    core = AgentCore("n1", 2, DEP, clock=clock, heartbeat_interval_s=1.0, liveness=3, give_up_s=30.0)
    assert core.link is Link.NEW and Link.REGISTERED not in LINKS[Link.NEW]
    core.start()
    assert core.link is Link.REGISTERING and core.awaiting_welcome and not core.welcomed
    core.receive(P.Welcome(node="n1", heartbeat_interval_s=1.0, liveness=3, session="s1"))
    assert core.link is Link.REGISTERED and core.session == "s1" and core.welcomed and not core.awaiting_welcome
    clock.advance(10.0)  # the controller is silent: a fresh socket and a new registration
    core.tick()
    assert RECONNECT in core.take_outbox() and core.link is Link.REREGISTERING and core.welcomed
    clock.advance(25.0)  # past give_up_s from the start: an agent welcomed once never gives up
    core.tick()
    assert not core.gave_up
    core.receive(P.Welcome(node="n1", heartbeat_interval_s=1.0, liveness=3, session="s2"))
    assert core.link is Link.REGISTERED and core.session == "s2"
    core.take_outbox()
    core.receive(P.Welcome(node="n1", heartbeat_interval_s=1.0, liveness=3, session="s3"))  # unsolicited
    assert core.link is Link.REREGISTERING and [type(m) for m in core.take_outbox()] == [P.Register, P.Ready]
    with pytest.raises(AssertionError, match="illegal registration"):
        core._link(Link.REGISTERING)
