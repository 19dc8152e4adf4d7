"""Deterministic simulation: safety under seeded faults every tick, then liveness once the
faults heal. A failing seed prints itself and how to replay it."""
from __future__ import annotations

from tests.sim.sim import World


def test_simulated_farm_is_safe_under_faults_and_finishes_after_they_heal(seed, sim_db_dir):
    world = World(seed, sim_db_dir)
    try:
        world.run()
    except BaseException as exc:
        raise AssertionError(
            f"simulation seed {seed} failed; replay with: pytest tests/sim --seed {seed}\n"
            f"faults: {world.faults}\nlast events: {world.trace[-12:]}\n"
            f"{type(exc).__name__}: {exc}") from exc
    finally:
        for path in sim_db_dir.glob(f"sim-{seed}.db*"):
            path.unlink()
    assert world.trainer.results, "the run committed something"
