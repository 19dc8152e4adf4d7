"""pytest plugin: the session-scoped `slurm_cluster` fixture, a started 3-node TestCluster
(slurm/testcluster.py) torn down at the end of the session, run as a real cluster is: slurmctld
as the `slurm` user, jobs submitted by and run as the ordinary user `paddock-u1`
(`slurm_cluster.job_argv(argv)` with `slurm_cluster.job_env`). It has job accounting (its own
MariaDB + slurmdbd, so `sacct` works) when those are installed (`make setup` installs them);
`slurm_cluster.accounting` says which. `cluster_workdir` is a fresh directory the cluster's users
can reach (a pytest tmp_path cannot be: its parents are 0700); `job_user_dir` one owned by the
job user (run directories, batch scripts, job output), both removed afterwards.

Load with `pytest_plugins = ["tests.slurm_fixture"]` in conftest.py or `-p tests.slurm_fixture`.
Skips (with the reason) when not root, the Slurm/munge/iproute2 commands are missing, or the
job user, its subordinate range or the world-readable interpreter (`make setup`) is missing.
Before starting, it sweeps leftovers of earlier sessions that were killed (live clusters of
parallel sessions are left alone).

Must not import: zmq, controller.*, nodeagent.*.
"""
from __future__ import annotations

import os
import pwd
import shutil
import tempfile
from pathlib import Path

import pytest

from slurm.testcluster import DEFAULT_PREFIX, TestCluster, missing_accounting, missing_requirements, sweep

SESSION_CLUSTER_NODES = 3
JOB_USER = os.environ.get("PADDOCK_SLURM_JOB_USER", "paddock-u1")
USER_PYTHON = os.environ.get("PADDOCK_SHARED_VENV", "/opt/paddock/venv") + "/bin/python"
REPO = Path(__file__).resolve().parents[1]


def missing_job_user() -> str | None:
    """Why jobs cannot run as the ordinary user here, or None."""
    try:
        pwd.getpwnam(JOB_USER)
    except KeyError:
        return f"user {JOB_USER} is missing: run `make setup`"
    for f in ("/etc/subuid", "/etc/subgid"):
        with open(f) as fh:
            if not any(line.split(":")[0] == JOB_USER for line in fh):
                return f"{JOB_USER} has no range in {f}: run `make setup`"
    if not os.access(USER_PYTHON, os.X_OK):
        return f"{USER_PYTHON} is missing: run `make setup` (the interpreter every user can run)"
    return None


def user_dir(owner: str, prefix: str) -> Path:
    """A fresh 0700 directory under /tmp owned by `owner` (reachable: /tmp is o+x)."""
    d = Path(tempfile.mkdtemp(prefix=prefix, dir="/tmp"))
    pw = pwd.getpwnam(owner)
    os.chown(d, pw.pw_uid, pw.pw_gid)
    return d


def job_env(cluster) -> dict[str, str]:
    """The job user's environment for Slurm commands: this checkout on PYTHONPATH (sbatch exports it
    to the job, so the job steps run this code with the user's interpreter)."""
    return dict(cluster.job_env, PYTHONPATH=str(REPO))


@pytest.fixture
def cluster_workdir():
    d = Path(tempfile.mkdtemp(prefix="paddock-slurm-", dir="/tmp"))
    os.chmod(d, 0o755)
    yield d
    shutil.rmtree(d, ignore_errors=True)


@pytest.fixture
def job_user_dir():
    reason = missing_job_user()
    if reason:
        pytest.skip(reason)
    d = user_dir(JOB_USER, "paddock-job-")
    yield d
    shutil.rmtree(d, ignore_errors=True)


@pytest.fixture(scope="session")
def slurm_cluster():
    missing = missing_requirements()
    if missing:
        pytest.skip("in-test Slurm cluster unavailable: " + "; ".join(missing))
    reason = missing_job_user()
    if reason:
        pytest.skip("in-test Slurm cluster runs jobs as an ordinary user: " + reason)
    sweep(DEFAULT_PREFIX)
    workdir = Path(tempfile.mkdtemp(prefix="paddock-slurm-cluster-", dir="/tmp"))
    os.chmod(workdir, 0o755)
    try:
        with TestCluster(workdir, nodes=SESSION_CLUSTER_NODES, name_prefix=DEFAULT_PREFIX,
                         accounting=not missing_accounting(), job_user=JOB_USER) as cluster:
            yield cluster
    finally:
        shutil.rmtree(workdir, ignore_errors=True)
