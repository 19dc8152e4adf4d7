"""The simulation at a reduced training size (100 agents x 32 slots, no faults): the real
BrokerCore and SQLite queue keep every slot busy through heartbeats, leases and results, the
trainer gets each result once, and the controller's CPU per event stays bounded; with lease
prefetch, small agents hold leases ahead within their bound. The full 1,000 x 32 run is
`benchmarks/scale.py sim` (docs/operations.md, sizing).

Must not import zmq (the simulation has no sockets)."""
from __future__ import annotations

from controller.store import queue as qm
from tests.sim.sim import ScaleWorld

AGENTS, SLOTS = 100, 32


def test_a_hundred_agents_of_32_slots_stay_busy_and_each_result_reaches_the_trainer_once(sim_db_dir):
    world = ScaleWorld(7, sim_db_dir, AGENTS, SLOTS, n_tasks=3000, attempt_s=15.0, hb_s=5.0)
    try:
        stats = world.run_for(60.0)
        counts = world.queue.counts()
        held = counts[qm.LEASED] + counts[qm.RUNNING]
        assert held >= 0.9 * AGENTS * SLOTS, f"slots left idle: {counts}"
        done = counts[qm.COMMITTED] + counts[qm.DEAD_LETTER]
        assert done > 2 * AGENTS * SLOTS, f"too few rollouts ended in 60 simulated s: {counts}"
        assert len(world.trainer.results) >= 0.9 * done, "the trainer follows the commits"
        world.check_safety()       # tokens grow, nothing committed twice, nothing lost
        assert stats.max_frame_out < 1 << 20 and stats.max_frame_in < 1 << 20
        per_event_ms = 1000 * stats.cpu_s / stats.frames_in
        assert per_event_ms < 5.0, f"controller CPU per frame in: {per_event_ms:.2f} ms"
    finally:
        for path in sim_db_dir.glob("scale-7.db*"):
            path.unlink()


def test_a_farm_of_small_agents_with_prefetch_holds_leases_ahead_and_stays_within_them(sim_db_dir):
    """`ScaleWorld(prefetch=2)` (benchmarks/scale.py --prefetch): leases wait on the agents and
    start when a slot frees, no agent runs more than its slots or holds more than slots + 2,
    and every result still reaches the trainer once."""
    agents, slots = 200, 1
    world = ScaleWorld(11, sim_db_dir, agents, slots, n_tasks=500, attempt_s=10.0, hb_s=5.0, prefetch=2)
    try:
        for _ in range(120):   # 60 simulated s, checked every tick
            world.run_for(0.5)
            world.check_agents()
        counts = world.queue.counts()
        held = counts[qm.LEASED] + counts[qm.RUNNING]
        assert agents * slots < held <= agents * (slots + 2), f"no lease held ahead of the slots: {counts}"
        assert world.promoted > agents, "leases that waited were started"
        assert counts[qm.COMMITTED] > 2 * agents * slots, counts
        world.check_safety()
    finally:
        for path in sim_db_dir.glob("scale-11.db*"):
            path.unlink()
