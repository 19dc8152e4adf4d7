"""The simulation at a reduced training size (100 agents x 32 slots, no faults): the real
BrokerCore and SQLite queue keep every slot busy through heartbeats, leases and results, the
trainer gets each result once, and the controller's CPU per event stays bounded. The full
1,000 x 32 run is `benchmarks/scale.py sim` (docs/operations.md, sizing).

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
