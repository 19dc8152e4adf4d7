"""The deterministic simulation with lease prefetch on (every agent takes 2 leases beyond its
slots): the same safety invariants under seeded faults and liveness after they heal, plus the
prefetch ones (`World.check_agents`): no agent runs more than its slots or holds more than
slots + prefetch, no lease is given to a runner twice (`SimAgent.flush`), a draining agent
holds nothing waiting (handed back), the controller never leases a node beyond slots +
prefetch."""
from __future__ import annotations

import pytest

from tests.sim.sim import World

SEEDS = range(1, 61)


@pytest.mark.parametrize("pf_seed", SEEDS)
def test_simulated_farm_with_prefetch_is_safe_and_finishes(pf_seed, sim_db_dir):
    world = World(pf_seed, sim_db_dir, prefetch=2)
    try:
        world.run()
    except BaseException as exc:
        raise AssertionError(
            f"simulation seed {pf_seed} with prefetch failed\nfaults: {world.faults}\n"
            f"last events: {world.trace[-12:]}\n{type(exc).__name__}: {exc}") from exc
    finally:
        for path in sim_db_dir.glob(f"sim-{pf_seed}.db*"):
            path.unlink()
    assert world.trainer.results, "the run committed something"
    waited = sum(a.core.prefetch for a in world.agents if a.core is not None)
    assert waited, "the agents ran with prefetch"


def test_the_seeds_exercise_waiting_leases_and_drains_that_hand_them_back(sim_db_dir):
    """The seeds above are not vacuous: leases waited and were started later, and drains
    handed waiting leases back (which the runs then finished elsewhere)."""
    promoted = handed_back = 0
    for seed in SEEDS[:30]:
        world = World(seed, sim_db_dir, prefetch=2)
        try:
            world.run()
        finally:
            for path in sim_db_dir.glob(f"sim-{seed}.db*"):
                path.unlink()
        promoted, handed_back = promoted + world.promoted, handed_back + world.handed_back
    assert promoted > 0 and handed_back > 0, (promoted, handed_back)
