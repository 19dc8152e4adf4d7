"""pytest plugin: the session-scoped `slurm_cluster` fixture, a started 3-node TestCluster
(slurm/testcluster.py) torn down at the end of the session. It has job accounting (its own
MariaDB + slurmdbd, so `sacct` works) when those are installed (`make setup` installs them);
`slurm_cluster.accounting` says which.

Load with `pytest_plugins = ["tests.slurm_fixture"]` in conftest.py or `-p tests.slurm_fixture`.
Skips (with the reason) when not root or the Slurm/munge/iproute2 commands are missing.
Before starting, it sweeps leftovers of earlier sessions that were killed (live clusters of
parallel sessions are left alone).

Must not import: zmq, controller.*, nodeagent.*.
"""
from __future__ import annotations

import pytest

from slurm.testcluster import (DEFAULT_PREFIX, TestCluster, missing_accounting, missing_requirements,
                               sweep)

SESSION_CLUSTER_NODES = 3


@pytest.fixture(scope="session")
def slurm_cluster(tmp_path_factory):
    missing = missing_requirements()
    if missing:
        pytest.skip("in-test Slurm cluster unavailable: " + "; ".join(missing))
    sweep(DEFAULT_PREFIX)
    workdir = tmp_path_factory.mktemp("slurm-cluster")
    with TestCluster(workdir, nodes=SESSION_CLUSTER_NODES, name_prefix=DEFAULT_PREFIX,
                     accounting=not missing_accounting()) as cluster:
        yield cluster
