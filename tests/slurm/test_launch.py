"""`paddock launch`: the farm submitted with submitit to the in-test cluster, whose job states come
from Slurm accounting (its own slurmdbd), so a job that dies is seen as dead, not waited on. The
launches are the ordinary user paddock-u1's own (tests/slurm/launchworker.py runs `launch` as that
user), and no process of the launched farm runs as root."""
from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

import pytest

from slurm.jobsteps import JobStepError
from slurm.launch import TERMINAL_STATES, launch
from slurm.sbatch import ParamError
from tests.conftest import wait_for
from tests.farmprocs import FarmWatch
from tests.slurm_fixture import JOB_USER, USER_PYTHON, job_env

ROOT = Path(__file__).resolve().parents[2]
BASE = dict(env_nodes=2, time_limit="10", versions=1, tasks_limit=4, heartbeat_interval_s=0.5,
            controller_wait_s=90, agents_wait_s=90, signal_before_s=60)


@pytest.fixture
def accounted_cluster(slurm_cluster, monkeypatch):
    if not slurm_cluster.accounting:
        pytest.skip("the in-test cluster has no accounting here (install slurmdbd, mariadb-server)")
    for k in [k for k in list(__import__("os").environ) if k.startswith("SLURM_")]:
        monkeypatch.delenv(k)
    monkeypatch.setenv("SLURM_CONF", str(slurm_cluster.conf))   # the test's own scancel
    return slurm_cluster


class UserLaunch:
    """A `launch()` made by the job user in tests/slurm/launchworker.py; the same questions as a JobHandle."""

    def __init__(self, cluster, params: dict):
        code = (Path(__file__).with_name("launchworker.py")).read_text()
        self.proc = subprocess.Popen(cluster.job_argv([USER_PYTHON, "-c", code]), env=job_env(cluster), cwd="/tmp",
                                     stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
        got = self.ask(op="launch", params=dict(params, python=USER_PYTHON))
        self.job_id, self.run_dir = got["job_id"], Path(got["run_dir"])

    def ask(self, **req) -> dict:
        self.proc.stdin.write(json.dumps(req) + "\n")
        self.proc.stdin.flush()
        line = self.proc.stdout.readline()
        assert line, f"the launch worker of {JOB_USER} died (exit {self.proc.poll()})"
        got = json.loads(line)
        assert "error" not in got, got["error"]
        return got

    def state(self) -> str:
        return self.ask(op="state")["state"]

    def wait(self, timeout_s: float, poll_s: float) -> str:
        return self.ask(op="wait", timeout_s=timeout_s, poll_s=poll_s)["state"]

    def results(self) -> list:
        return self.ask(op="results")["results"]

    def close(self) -> None:
        if self.proc.poll() is None:
            self.proc.stdin.close()   # the worker's loop ends at EOF
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.proc.kill()      # by its PID
                self.proc.wait()


@pytest.fixture
def user_launch(accounted_cluster, job_user_dir):
    made: list[UserLaunch] = []

    def make(**params) -> UserLaunch:
        made.append(UserLaunch(accounted_cluster, dict(BASE, run_dir=str(job_user_dir / "run"), **params)))
        return made[-1]
    yield make
    for h in made:
        h.close()


def wait_watching(handle: UserLaunch, watch: FarmWatch, timeout_s: float) -> str:
    """handle.wait(), taking a census of the job's processes while it runs."""
    wait_for(lambda: watch.sample_job({handle.job_id}) or handle.state() in TERMINAL_STATES, timeout_s,
             f"launched job {handle.job_id} to finish", interval_s=0.3)
    return handle.wait(timeout_s=30, poll_s=0.5)



def test_launch_refuses_the_het_layout_and_unknown_parameters(tmp_path):
    with pytest.raises(ParamError, match="single-component layout"):
        launch(dict(BASE, run_dir=str(tmp_path / "r"), layout="het"))
    with pytest.raises(ParamError, match="unknown batch parameter 'gpus'.*valid parameters"):
        launch(dict(BASE, run_dir=str(tmp_path / "r"), gpus=1))
    with pytest.raises(ParamError, match=r"paddock launch does not requeue its job \(requeue=1\)"):
        launch(dict(BASE, run_dir=str(tmp_path / "r"), requeue=1))
    with pytest.raises(ParamError, match=r"'inference.nodes': paddock launch runs the trainer and the farm only"):
        launch(dict(BASE, run_dir=str(tmp_path / "r"), **{"inference.nodes": 1, "inference.command": "srv",
                                                       "inference.ready_wait_s": 60}))
    with pytest.raises(ParamError, match=r"'farm.gpus_per_node'.*layout=het"):   # one kind of node
        launch(dict(BASE, run_dir=str(tmp_path / "r"), **{"trainer.gpus_per_node": 4}))


def test_launch_refuses_a_run_directory_it_cannot_write():
    with pytest.raises(JobStepError, match="not writable"):
        launch(dict(BASE, run_dir="/proc/paddock-run"))


def test_launch_cli_names_the_bad_parameter(tmp_path):
    cp = subprocess.run([sys.executable, "-m", "controller.cli", "launch", f"run_dir={tmp_path}/r", "env_nodes=x"],
                        capture_output=True, text=True, cwd=ROOT)
    assert cp.returncode == 2 and "'env_nodes'" in cp.stderr


@pytest.mark.slurm
@pytest.mark.sandbox
def test_launched_farm_trains_and_accounting_reports_it_completed(user_launch, job_user_dir, python_image):
    from controller.analysis.query import connect
    handle = user_launch()
    assert handle.job_id.isdigit() and handle.run_dir == job_user_dir / "run"
    script = (job_user_dir / "run" / "submitit" / f"{handle.job_id}_submission.sh").read_text()
    assert "#SBATCH --signal=28@60" in script and "USR2" not in script   # sandboxes ignore WINCH
    # srun may not inherit --cpus-per-task (22.05-23.02): the step names it
    assert any(ln.startswith("srun ") and "--cpus-per-task=" in ln for ln in script.splitlines()), script
    watch = FarmWatch(JOB_USER)
    assert wait_watching(handle, watch, 120) == "COMPLETED", (job_user_dir / "run" / "logs" / "head.log").read_text()
    n, distinct = connect(handle.run_dir).execute(
        "SELECT count(*), count(DISTINCT rollout_id) FROM rollouts").fetchone()
    assert n == distinct == 4
    assert handle.results() == [0, 0, 0]      # head and two agents
    assert watch.as_root() == [], watch.describe(watch.as_root())
    assert watch.matching(r"submitit") and watch.sandbox_side()   # the census saw the farm


@pytest.mark.slurm
def test_a_launched_job_that_dies_is_reported_dead_by_accounting(user_launch):
    # an agent count the head will wait for in vain: the job would run until its time limit
    handle = user_launch(agents_wait_s=500, controller_wait_s=500)
    # the nodes may still be finishing the previous test's job (epilog), and accounting lags
    wait_for(lambda: handle.state() == "RUNNING", 90, "the job to run")
    subprocess.run(["scancel", "--signal=KILL", handle.job_id], check=True)   # the job dies
    t0 = time.monotonic()
    state = handle.wait(timeout_s=60, poll_s=0.5)
    assert state != "COMPLETED" and state in ("CANCELLED", "FAILED", "NODE_FAIL")
    assert time.monotonic() - t0 < 60


@pytest.mark.slurm
@pytest.mark.sandbox
def test_the_early_warning_signal_drains_a_launched_farm_without_infra_errors(user_launch, python_image):
    """What `--signal=28@<secs>` delivers before the time limit, now instead of in minutes: Slurm
    signals every process of the step, sandboxed workloads included; they must not die of it."""
    from controller.analysis.query import connect
    from tests.slurm.test_sbatch import committed
    handle = user_launch(versions=4, tasks_limit=16)
    wait_for(lambda: committed(handle.run_dir) >= 2, 90, "the first committed rollouts")
    subprocess.run(["scancel", "--signal=28", handle.job_id], check=True)
    head_out = handle.run_dir / "submitit" / f"{handle.job_id}_0_log.out"
    watch = FarmWatch(JOB_USER)
    assert wait_watching(handle, watch, 120) == "COMPLETED", head_out.read_text()
    con = connect(handle.run_dir)
    stored, infra = con.execute("SELECT count(*), count(*) FILTER (outcome = 'infra_error') FROM rollouts").fetchone()
    assert 2 <= stored < 4 * 16 and infra == 0
    assert "SIGWINCH before the time limit: waiting for agents to drain" in head_out.read_text()
    assert handle.results() == [0, 0, 0]
    assert watch.as_root() == [], watch.describe(watch.as_root())
