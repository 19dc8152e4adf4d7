"""The simulation (tests/sim/sim.py, imported, not changed) checked for the accounting of
infrastructure attempts: every attempt that ended in an infrastructure failure counts once,
either as the task's own failure (`failures`, limit `max_attempts`) or as lost with its node
(`losses`, limit `max_node_losses`), and a rollout is dead-lettered only at one of the two
limits -- so the node crashes the simulation injects never dead-letter a task early; an
attempt the model server failed (`model_server: ...`) is always a loss, never a failure."""
from __future__ import annotations

import sqlite3

import pytest

from tests.sim.sim import World

SEEDS = range(1, 101)


@pytest.mark.parametrize("sim_seed", SEEDS)
def test_failures_and_node_losses_are_counted_apart(sim_seed, sim_db_dir):
    world = World(sim_seed, sim_db_dir)
    try:
        world.run()
        cfg = world.config
        db = sqlite3.connect(world.db)
        infra = dict(db.execute("SELECT rollout_id, COUNT(*) FROM attempts WHERE outcome ="
                                " 'infra_error' GROUP BY rollout_id").fetchall())
        model = dict(db.execute("SELECT rollout_id, COUNT(*) FROM attempts WHERE outcome ="
                                " 'infra_error' AND reason LIKE 'model_server:%' GROUP BY"
                                " rollout_id").fetchall())
        for rid, state, failures, losses in db.execute(
                "SELECT rollout_id, state, failures, losses FROM rollouts"):
            assert failures + losses == infra.get(rid, 0), (rid, failures, losses)
            assert losses >= model.get(rid, 0) and failures <= infra.get(rid, 0) - model.get(
                rid, 0), (rid, failures, losses)
            at_limit = failures >= cfg.max_attempts or losses >= cfg.max_node_losses
            assert (state == "dead_letter") == at_limit, (rid, state, failures, losses)
        db.close()
    finally:
        for path in sim_db_dir.glob(f"sim-{sim_seed}.db*"):
            path.unlink()
