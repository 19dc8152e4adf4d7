"""The warm-pool autoscaler (nodeagent.sandbox.autoscale), on seeded arrival traces and a
FakeClock: a burst, a steady rate, a lull, flapping demand, and the node's capacity bound."""
from __future__ import annotations

import random

import pytest

from nodeagent.sandbox.autoscale import Autoscaler, Capacity, Cost, ScaleConfig
from tests.conftest import FakeClock

ROOM = Capacity(sandboxes=64)


def drive(scaler: Autoscaler, clock: FakeClock, arrivals: list[float], until_s: float,
          step_s: float = 1.0, capacity: Capacity = ROOM) -> list[tuple[float, int]]:
    """Feed `arrivals` (seconds from now, sorted) and plan every `step_s`; [(t, target)]."""
    t0, i, out, t = clock.now, 0, [], 0.0
    while t <= until_s:
        while i < len(arrivals) and arrivals[i] <= t:
            clock.now = t0 + arrivals[i]
            scaler.arrival("k", Cost(mem_mb=8))
            i += 1
        clock.now = t0 + t
        out.append((t, scaler.plan(capacity).get("k", 0)))
        t += step_s
    return out


def poisson(rng: random.Random, rate_per_s: float, start_s: float, end_s: float) -> list[float]:
    out, t = [], start_s
    while True:
        t += rng.expovariate(rate_per_s)
        if t >= end_s:
            return out
        out.append(t)


def test_a_burst_scales_up_at_once_to_the_burst_size():
    clock = FakeClock()
    scaler = Autoscaler(ScaleConfig(), clock)
    for _ in range(4):
        scaler.arrival("k")
    assert scaler.plan(ROOM) == {"k": 4}
    assert scaler.plan(Capacity(sandboxes=3)) == {"k": 3}     # never past the node's capacity


def changes_of(trace: list[tuple[float, int]]) -> int:
    targets = [n for _t, n in trace]
    return sum(a != b for a, b in zip(targets, targets[1:]))


NO_HYSTERESIS = ScaleConfig(downscale_window_s=0, dead_band=0)


def test_a_steady_rate_settles_on_a_steady_target():
    runs = []
    for config in (ScaleConfig(), NO_HYSTERESIS):
        clock = FakeClock()
        scaler = Autoscaler(config, clock)
        scaler.arrival("k")
        scaler.created("k", 0.005)
        runs.append(drive(scaler, clock, poisson(random.Random(7), 0.5, 0, 600), until_s=600))
    steady, naive = runs
    assert {n for _t, n in steady} <= {1, 2}       # ~0.5/s with 5 ms creates: one, two at a pair
    assert changes_of(steady) <= 6 and changes_of(naive) >= 2 * changes_of(steady)


def test_scale_down_waits_for_the_stabilisation_window():
    clock = FakeClock()
    scaler = Autoscaler(ScaleConfig(downscale_window_s=60, half_life_s=5), clock)
    arrivals = [0.0] * 4 + [float(t) for t in range(10, 200, 10)]     # a burst, then 0.1/s
    trace = dict(drive(scaler, clock, arrivals, until_s=200))
    assert trace[0] == 4
    assert all(trace[t] == 4 for t in range(0, 60))                   # held for the window
    assert trace[200] == 1                                            # then down to the need


def test_a_lull_drops_the_key_to_zero_and_forgets_it():
    clock = FakeClock()
    scaler = Autoscaler(ScaleConfig(idle_after_s=120), clock)
    trace = dict(drive(scaler, clock, poisson(random.Random(3), 1.0, 0, 60), until_s=300))
    assert trace[30] >= 1
    assert trace[60 + 119] >= 1 and trace[60 + 121] == 0
    assert "k" not in scaler.stats() and scaler.plan(ROOM) == {}


def test_flapping_demand_does_not_flap_the_target():
    clock = FakeClock()
    scaler = Autoscaler(ScaleConfig(), clock)
    rng, arrivals = random.Random(11), []
    for period in range(60):                  # every 10 s: a batch of 3, or a single lease
        base = period * 10.0 + rng.uniform(0, 0.5)
        arrivals += [base] * (3 if period % 2 else 1)
    trace = drive(scaler, clock, arrivals, until_s=600)
    assert max(n for _t, n in trace) == 3 and changes_of(trace) <= 2, trace
    clock = FakeClock()
    naive = drive(Autoscaler(NO_HYSTERESIS, clock), clock, arrivals, until_s=600)
    assert changes_of(naive) >= 20           # what the window and the dead band prevent


def test_the_busiest_key_is_served_first_within_the_memory_budget():
    clock = FakeClock()
    scaler = Autoscaler(ScaleConfig(), clock)
    for _ in range(3):
        scaler.arrival("busy", Cost(mem_mb=10))
    scaler.arrival("quiet", Cost(mem_mb=10))
    assert scaler.plan(Capacity(sandboxes=8, mem_mb=35)) == {"busy": 3, "quiet": 0}
    assert scaler.plan(Capacity(sandboxes=8, mem_mb=45)) == {"busy": 3, "quiet": 1}
    assert scaler.plan(Capacity(sandboxes=0)) == {"busy": 0, "quiet": 0}


def test_a_bad_config_is_refused_naming_the_field():
    with pytest.raises(ValueError, match="half_life_s"):
        ScaleConfig(half_life_s=0)
    with pytest.raises(ValueError, match="clock"):
        Autoscaler(ScaleConfig())
