"""`pytest tests/sim --seed N` replays one seed of the simulation; `--sim-seeds K` runs K."""
from __future__ import annotations

import os
import tempfile
from pathlib import Path

import pytest

DEFAULT_SEEDS = 500


def pytest_addoption(parser):
    parser.addoption("--seed", type=int, default=None, help="replay one simulation seed")
    parser.addoption("--sim-seeds", type=int, default=None,
                     help=f"how many seeds to run (default {DEFAULT_SEEDS})")


def pytest_generate_tests(metafunc):
    if "seed" in metafunc.fixturenames:
        one = metafunc.config.getoption("--seed")
        n = metafunc.config.getoption("--sim-seeds") or DEFAULT_SEEDS
        metafunc.parametrize("seed", [one] if one is not None else list(range(1, n + 1)))


@pytest.fixture(scope="session")
def sim_db_dir():
    """The simulated controller's database: a real SQLite file, on tmpfs when there is one
    (the simulation models process crashes, for which an fsync changes nothing)."""
    base = "/dev/shm" if os.path.isdir("/dev/shm") and os.access("/dev/shm", os.W_OK) else None
    with tempfile.TemporaryDirectory(prefix="paddock-sim-", dir=base) as d:
        yield Path(d)
