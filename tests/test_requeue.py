"""Job requeue and resume (issue 19, item 4) on the in-test cluster.

A job rendered with `requeue=1` (slurm/sbatch.py) runs a trainer that submits N rollouts under
a key and checkpoints every result with its cursor. While rollouts are running, the job is
requeued (`scontrol requeue`, what preemption does); Slurm runs it again under the same job id,
the head resumes the run from the queue in the run directory (slurm/jobsteps.py), and the
restarted trainer gets its batch back (same key) and reads on from its cursor. The checks are
the user's: every rollout ended exactly once (committed once; queue and catalog agree), none
committed before the requeue ran again, none leased at the requeue lost, the trainer's results
complete with none twice, and no farm process ran as root.

Must not import: zmq (the test talks to Slurm and reads the run directory; the trainer is the client).
"""
from __future__ import annotations

import json
import os
import shlex
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

import pytest

from slurm.sbatch import ParamError, render
from tests.conftest import wait_for
from tests.farmprocs import FarmWatch
from tests.slurm_fixture import JOB_USER, USER_PYTHON
from tests.test_sbatch import (TERMINAL, give_to_user, job_components, logs, slurm_out,
                               stray_processes, submit)

ROOT = Path(__file__).resolve().parents[1]
ROLLOUTS = 10
POLICY_PORT = 18931          # the trainer's policy server: the same URL in every run of the job
RESUMED_JOB_DEADLINE_S = 150.0
BATCH_KEY = "requeue-test/step-0"

# The training command: a keyed submit, results read from a checkpointed cursor (the pattern of
# docs/examples/resumable_trainer.py), with the scripted policy served on a fixed port so the
# policy version published by the first run is the one the requeued run serves again.
TRAINER = f'''
import json, os
from pathlib import Path
from controller.client import Client
from controller.demo.localrun import load_taskset
from controller.demo.policy_server import PolicyServer

run_dir = Path(os.environ["PADDOCK_RUN_DIR"])
ckpt = run_dir / "trainer-checkpoint.json"
def save(state):
    tmp = ckpt.with_name(ckpt.name + ".tmp")
    tmp.write_text(json.dumps(state))
    os.replace(tmp, ckpt)
state = json.loads(ckpt.read_text()) if ckpt.exists() else {{"cursor": 0, "seen": [], "runs": []}}
state["runs"].append(os.environ["PADDOCK_INCARNATION"])
save(state)
taskset = load_taskset(os.environ["PADDOCK_TASKSET"], os.environ.get("PADDOCK_TASKBANK", ""))
names = [t.name for t in taskset.tasks][:{ROLLOUTS}]
with PolicyServer(taskset, host=os.environ["PADDOCK_HEAD_ADDR"], port={POLICY_PORT}) as policy, \\
        Client.for_run(run_dir, os.environ["PADDOCK_DEPLOYMENT"]) as client:
    client.publish_policy(0, policy.url, model="scripted-v0")
    state["batch"] = client.submit(names, n_per_task=1, policy=0, key={BATCH_KEY!r})
    for item in client.results(state["batch"], after=state["cursor"]):
        state["seen"].append([item["rollout_id"], item["state"], state["runs"][-1]])
        state["cursor"] = item["cursor"]
        save(state)
state["done"] = True
save(state)
print(f"trainer: {{len(state['seen'])}} results over runs {{state['runs']}}", flush=True)
'''


def queue_rows(run_dir: Path) -> dict[str, dict]:
    """rollout id -> its row of the run's queue (read-only; {} while there is none)."""
    try:
        con = sqlite3.connect(f"file:{run_dir / 'controller.db'}?mode=ro", uri=True, timeout=5)
        con.row_factory = sqlite3.Row
        try:
            return {r["rollout_id"]: dict(r) for r in con.execute("SELECT * FROM rollouts")}
        finally:
            con.close()
    except sqlite3.Error:
        return {}


def ended_attempts(run_dir: Path) -> list[dict]:
    con = sqlite3.connect(f"file:{run_dir / 'controller.db'}?mode=ro", uri=True, timeout=5)
    con.row_factory = sqlite3.Row
    try:
        return [dict(r) for r in con.execute("SELECT * FROM attempts")]
    finally:
        con.close()


def describe(rows: dict[str, dict], run_dir: Path, tmp_path: Path) -> str:
    """The rollouts that did not commit, with their attempts, and the job's logs."""
    bad = {rid: r for rid, r in rows.items() if r["state"] != "committed"}
    attempts = [a for a in ended_attempts(run_dir) if a["rollout_id"] in bad]
    keep = ("state", "attempt", "failures", "losses", "infra_reason", "outcome", "node")
    return (json.dumps({rid: {k: r[k] for k in keep} for rid, r in bad.items()}, indent=1)
            + "\n" + json.dumps([{k: a[k] for k in ("rollout_id", "attempt", "node", "outcome", "reason")}
                                 for a in attempts], indent=1) + "\n" + logs(tmp_path))


# ------------------------------------------------------------------ rendering and the agent step, no Slurm
def test_requeue_renders_sbatch_requeue_with_appended_output_and_the_default_renders_neither():
    assert "#SBATCH --requeue\n#SBATCH --open-mode=append\n" in render({"run_dir": "/r", "env_nodes": 2, "requeue": 1})
    script = render({"run_dir": "/r", "env_nodes": 2, "requeue": 1})
    subprocess.run(["bash", "-n"], input=script, text=True, check=True)
    # the old run's shell never signals the job id once signalled itself: it may name the next run
    assert 'forward() { ENDING=1; ' in script and '|| [ -n "${ENDING:-}" ] || scancel --signal=TERM' in script
    plain = render({"run_dir": "/r", "env_nodes": 2})
    assert "--requeue" not in plain and "--open-mode" not in plain
    with pytest.raises(ParamError, match="'requeue'"):
        render({"run_dir": "/r", "env_nodes": 2, "requeue": 2})


def test_an_agent_of_a_requeued_job_waits_past_the_previous_runs_job_file(tmp_path):
    """The previous run's job.json and endpoint are still there when a requeued job's agents
    start (the head may not have started yet): they are not this run's, so the agent never
    dials them, and names them when it gives up."""
    from nodeagent.agent.version import AGENT_VERSION
    (tmp_path / "job.json").write_text(json.dumps({"deployment": "slurm-1", "incarnation": "0",
                                                   "agent_version": AGENT_VERSION}))
    (tmp_path / "controller.endpoint").write_text("tcp://127.0.0.1:1")
    cp = subprocess.run([sys.executable, "-m", "controller.cli", "job", "agent", "--run-dir", str(tmp_path),
                         "--deployment", "slurm-1", "--image-store", "/var/tmp/paddock/images",
                         "--controller-wait-s", "1"], capture_output=True, text=True, cwd=ROOT, timeout=60,
                        env=dict(os.environ, SLURM_RESTART_COUNT="1"))
    assert cp.returncode == 3, cp.stderr
    assert "holds run 0 of this job, this agent belongs to run 1" in cp.stderr
    assert "joining" not in cp.stdout


# ------------------------------------------------------------------ the real thing on the in-test cluster
def requeue_and_wait_restart(cluster, job_id: str, tmp_path: Path, watch: FarmWatch) -> None:
    """`scontrol requeue` (what preemption does), then wait until the job runs again. A requeued
    job may be held back by a begin time; the test lets it start now (an admin's scontrol)."""
    slurm_out(cluster, "scontrol", "requeue", job_id)
    deadline = time.monotonic() + 60
    released = False
    while True:
        [comp] = job_components(cluster, job_id)
        watch.sample_job({job_id})
        if comp["JobState"] == "RUNNING" and comp.get("Restarts") == "1":
            return
        if comp["JobState"] == "PENDING" and comp.get("Reason") == "BeginTime" and not released:
            slurm_out(cluster, "scontrol", "update", f"JobId={job_id}", "StartTime=now")
            released = True
        assert time.monotonic() < deadline, f"job {job_id} did not run again after the requeue: {comp}\n" + logs(tmp_path)
        time.sleep(0.2)


def wait_done(cluster, job_id: str, tmp_path: Path, watch: FarmWatch) -> dict:
    deadline = time.monotonic() + RESUMED_JOB_DEADLINE_S
    while True:
        [comp] = job_components(cluster, job_id)
        watch.sample_job({job_id})
        if comp["JobState"] in TERMINAL:
            return comp
        if time.monotonic() > deadline:
            subprocess.run(["scancel", job_id], env=cluster.env)
            raise AssertionError(f"job {job_id} not done after {RESUMED_JOB_DEADLINE_S}s: {comp}\n" + logs(tmp_path))
        time.sleep(0.2)


@pytest.mark.slurm
@pytest.mark.sandbox
def test_a_requeued_job_resumes_its_run_with_nothing_redone_or_lost(slurm_cluster, job_user_dir, python_image):
    from controller.analysis.query import connect
    from controller.store.catalog import Catalog
    tmp_path = job_user_dir
    (tmp_path / "trainer.py").write_text(TRAINER)
    give_to_user(tmp_path / "trainer.py")
    trainer = f"{shlex.quote(USER_PYTHON)} {shlex.quote(str(tmp_path / 'trainer.py'))}"
    job_id, run_dir = submit(slurm_cluster, tmp_path, layout="single", requeue=1, tasks_limit=0,
                             slots_per_node=1, trainer=trainer)
    watch = FarmWatch(JOB_USER)

    def some_committed_some_running() -> bool:
        watch.sample_job({job_id})
        states = [r["state"] for r in queue_rows(run_dir).values()]
        return states.count("committed") >= 2 and {"leased", "running", "verifying"} & set(states)
    wait_for(some_committed_some_running, 90, "committed rollouts while others run")
    before = queue_rows(run_dir)
    requeue_and_wait_restart(slurm_cluster, job_id, tmp_path, watch)
    comp = wait_done(slurm_cluster, job_id, tmp_path, watch)
    assert comp["JobState"] == "COMPLETED" and comp["Restarts"] == "1", logs(tmp_path)
    head_log = (run_dir / "logs" / "head.log").read_text()
    assert "resuming the run" in head_log and "the trainer is back" in head_log, logs(tmp_path)

    after = queue_rows(run_dir)
    committed_before = {rid for rid, r in before.items() if r["state"] == "committed"}
    held_before = {rid for rid, r in before.items() if r["state"] in ("leased", "running", "verifying")}
    assert len(after) == ROLLOUTS and len({r["batch_id"] for r in after.values()}) == 1   # one batch, keyed
    assert {r["state"] for r in after.values()} == {"committed"}, describe(after, run_dir, tmp_path)
    assert len(committed_before) < ROLLOUTS and held_before      # the requeue came mid-batch
    # committed before the requeue: the same attempt and token after it, never run again
    assert {rid: (after[rid]["attempt"], after[rid]["token"]) for rid in committed_before} == \
        {rid: (before[rid]["attempt"], before[rid]["token"]) for rid in committed_before}
    assert not [a for a in ended_attempts(run_dir) if a["rollout_id"] in committed_before
                and a["attempt"] > before[a["rollout_id"]]["attempt"]]
    # queue and catalog agree: one key per rollout, the queue's
    assert Catalog(run_dir).keys() == {rid: (r["attempt"], r["token"]) for rid, r in after.items()}
    n, distinct = connect(run_dir).execute("SELECT count(*), count(DISTINCT rollout_id) FROM rollouts").fetchone()
    assert n == distinct == ROLLOUTS
    # the trainer: two runs, every result once, the requeued run reading on from its cursor
    state = json.loads((run_dir / "trainer-checkpoint.json").read_text())
    assert state["runs"] == ["0", "1"] and state.get("done") is True, logs(tmp_path)
    seen = [rid for rid, _state, _run in state["seen"]]
    assert sorted(seen) == sorted(after) and len(set(seen)) == ROLLOUTS
    assert {s for _rid, s, _run in state["seen"]} == {"committed"}
    assert {run for _rid, _s, run in state["seen"]} == {"0", "1"}
    assert watch.as_root() == [], watch.describe(watch.as_root())   # no farm process ran as root
    wait_for(lambda: not stray_processes(slurm_cluster), 15, "job processes to leave the nodes")
