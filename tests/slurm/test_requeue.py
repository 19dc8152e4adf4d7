"""Job requeue and resume (issue 19, item 4) on the in-test cluster.

A job rendered with `requeue=1` (slurm/sbatch.py) runs a trainer that submits each training
step's rollouts under a key and checkpoints every result with its cursor (the loop of
docs/examples/resumable_trainer.py), serving the scripted policy on a port of its own. While
rollouts run, the test puts that model server into a weight update (so the rollouts it then
leases cannot finish in this run) and requeues the job (`scontrol requeue`, what preemption
does). Slurm runs it again under the same job id; the head resumes the run from the queue in the
run directory (slurm/jobsteps.py), the restarted trainer publishes its policy again at its new
port (an endpoint move), gets its batch back (same key) and reads on from its cursor. Then a
second, new job on the same run directory runs the trainer's next step. The checks are the
user's: every rollout committed exactly once (queue, catalog and the Parquet rows read by
DuckDB agree), none committed before the requeue or by the first job ran again, every rollout
leased at the requeue was leased anew and finished, the trainer's results complete with none
twice, and no farm process ran as root.

The time limit: a job with a 1-minute limit and a trainer with more steps than that runs hits
the warning (USR1), drains, requeues itself and the next run finishes; a `scancel`led requeue=1
job and one past `max_requeues` end without a restart.

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
import urllib.request
from pathlib import Path

import pytest

from slurm.sbatch import ParamError, render
from tests.conftest import wait_for
from tests.farmprocs import FarmWatch
from tests.slurm.test_sbatch import TERMINAL, give_to_user, job_components, logs, slurm_out, stray_processes, submit
from tests.slurm_fixture import JOB_USER, USER_PYTHON

ROOT = Path(__file__).resolve().parents[2]
STEP_SIZES = (8, 2)          # rollouts of training step 0 (the requeued job) and step 1 (the new job)
HELD = ("leased", "running", "verifying")
KEY = "requeue-test/step-{}"

# The training command: per step a keyed submit, results read from the checkpointed cursor, the
# scripted policy served on a free port (a new one in every run: the version moves).
TRAINER = f'''
import json, os
from pathlib import Path
from controller.client import Client
from controller.farm.assemble import load_taskset
from controller.demo.policy_server import PolicyServer

run_dir = Path(os.environ["PADDOCK_RUN_DIR"])
steps = int(os.environ["TRAINER_STEPS"])
sizes = [int(n) for n in os.environ["TRAINER_SIZES"].split(",")]
def size(step):                      # the last size repeats
    return sizes[min(step, len(sizes) - 1)]
ckpt = run_dir / "trainer-checkpoint.json"
def save(state):
    tmp = ckpt.with_name(ckpt.name + ".tmp")
    tmp.write_text(json.dumps(state))
    os.replace(tmp, ckpt)
state = json.loads(ckpt.read_text()) if ckpt.exists() else {{"step": 0, "cursor": 0, "seen": [], "runs": [], "batches": {{}}}}
run = os.environ["SLURM_JOB_ID"] + "." + os.environ["PADDOCK_INCARNATION"]
state["runs"].append(run)
if os.environ.get("TRAINER_PLAN") == "until-restart" and os.environ["PADDOCK_INCARNATION"] != "0":
    state.setdefault("planned", min(state["step"] + 2, steps))   # restarted: the step it was in and one more
steps = state.get("planned", steps)
save(state)
taskset = load_taskset(os.environ["PADDOCK_TASKSET"], os.environ.get("PADDOCK_TASKBANK", ""))
names = [t.name for t in taskset.tasks]
with PolicyServer(taskset, host=os.environ["PADDOCK_HEAD_ADDR"]) as policy, \\
        Client.for_run(run_dir, os.environ["PADDOCK_DEPLOYMENT"]) as client:
    client.publish_policy(0, policy.url, model="scripted-v0")   # after a restart: the same version, moved
    while state["step"] < steps:
        first = sum(size(k) for k in range(state["step"]))      # steps past the task set wrap around it
        batch = client.submit([names[(first + i) % len(names)] for i in range(size(state["step"]))], n_per_task=1, policy=0,
                              key={KEY!r}.format(state["step"]))
        state["batches"][str(state["step"])] = batch
        for item in client.results(batch, after=state["cursor"]):
            state["seen"].append([item["rollout_id"], item["state"], item["attempt"], item["token"], run])
            state["cursor"] = item["cursor"]       # checkpointed with what was folded in
            save(state)
        state.update(step=state["step"] + 1, cursor=0)
        save(state)
print(f"trainer: {{len(state['seen'])}} results over runs {{state['runs']}}", flush=True)
'''


def read_queue(run_dir: Path, sql: str, args=()) -> list[dict]:
    """Rows of the run's queue (read-only; [] while there is none)."""
    try:
        con = sqlite3.connect(f"file:{run_dir / 'controller.db'}?mode=ro", uri=True, timeout=5)
        con.row_factory = sqlite3.Row
        try:
            return [dict(r) for r in con.execute(sql, args)]
        finally:
            con.close()
    except sqlite3.Error:
        return []


def queue_rows(run_dir: Path) -> dict[str, dict]:
    """rollout id -> its row of the run's queue."""
    return {r["rollout_id"]: r for r in read_queue(run_dir, "SELECT * FROM rollouts")}


def attempts(run_dir: Path) -> list[dict]:
    return read_queue(run_dir, "SELECT * FROM attempts ORDER BY rollout_id, attempt")


def policy_endpoint(run_dir: Path) -> str | None:
    rows = read_queue(run_dir, "SELECT endpoint FROM policies WHERE version = 0")
    return rows[0]["endpoint"] if rows else None


def set_loading(endpoint: str, loading: bool) -> None:
    """The scripted model server's weight-update switch (POST /admin/loading): while on, every
    completion is refused with 503 model_loading, which the node gateway retries for some
    seconds. The head node's address is on the in-test cluster's bridge."""
    base = endpoint.rsplit("/v1", 1)[0]
    req = urllib.request.Request(f"{base}/admin/loading", data=json.dumps({"loading": loading}).encode(),
                                 headers={"Content-Type": "application/json"}, method="POST")
    opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
    with opener.open(req, timeout=10) as resp:
        assert json.loads(resp.read())["loading"] is loading


def describe(run_dir: Path, tmp_path: Path) -> str:
    """The rollouts that did not commit, with their attempts, and the job's logs."""
    rows = queue_rows(run_dir)
    bad = {rid: r for rid, r in rows.items() if r["state"] != "committed"}
    keep = ("state", "attempt", "token", "failures", "losses", "infra_reason", "outcome", "node")
    return (json.dumps({rid: {k: r[k] for k in keep} for rid, r in bad.items()}, indent=1) + "\n"
            + json.dumps([{k: a[k] for k in ("rollout_id", "attempt", "token", "node", "outcome", "reason")}
                          for a in attempts(run_dir) if a["rollout_id"] in bad], indent=1)
            + "\n" + logs(tmp_path))


def trainer_command(tmp_path: Path, steps: int, sizes: tuple[int, ...] = STEP_SIZES, plan: str = "") -> str:
    """`plan="until-restart"`: train `steps` steps in the job's first run, then, once the job is
    requeued, only the step it was in and one more (the test's way to have a trainer with more
    work than one allocation, whatever this machine's speed, that a second allocation finishes)."""
    return (f"TRAINER_STEPS={steps} TRAINER_SIZES={','.join(map(str, sizes))} TRAINER_PLAN={plan} "
            f"{shlex.quote(USER_PYTHON)} {shlex.quote(str(tmp_path / 'trainer.py'))}")


# ------------------------------------------------------------------ rendering and the agent step, no Slurm
def test_requeue_renders_sbatch_requeue_with_appended_output_and_the_default_renders_neither():
    assert "#SBATCH --requeue\n#SBATCH --open-mode=append\n" in render({"run_dir": "/r", "env_nodes": 2, "requeue": 1})
    script = render({"run_dir": "/r", "env_nodes": 2, "requeue": 1})
    subprocess.run(["bash", "-n"], input=script, text=True, check=True)
    # the old run's shell never signals the job id once signalled itself: it may name the next run
    assert "  ENDING=1\n" in script and '|| [ -n "${ENDING:-}" ] || scancel --signal=TERM' in script
    plain = render({"run_dir": "/r", "env_nodes": 2})
    assert "--requeue" not in plain and "--open-mode" not in plain and "scontrol requeue" not in plain
    with pytest.raises(ParamError, match="'requeue'"):
        render({"run_dir": "/r", "env_nodes": 2, "requeue": 2})


def test_with_requeue_the_time_limit_warning_is_usr1_and_the_job_requeues_itself_at_most_max_requeues_times():
    script = render({"run_dir": "/r", "env_nodes": 2, "requeue": 1, "max_requeues": 3})
    assert "#SBATCH --signal=B:USR1@120\n" in script
    assert "trap 'forward USR1' USR1\ntrap 'forward TERM' TERM\n" in script
    assert 'scontrol requeue "$SLURM_JOB_ID"' in script and '"${SLURM_RESTART_COUNT:-0}" -ge 3 ]' in script
    assert render({"run_dir": "/r", "env_nodes": 2, "requeue": 1, "signal": "USR1"}) == \
        render({"run_dir": "/r", "env_nodes": 2, "requeue": 1})
    # without requeue the default stays TERM (the golden files pin the whole script)
    assert "#SBATCH --signal=B:TERM@120\n" in render({"run_dir": "/r", "env_nodes": 2})
    # TERM cannot be the warning: scancel sends it too, and a cancelled job must not requeue itself
    with pytest.raises(ParamError, match="'signal' must not be TERM with requeue=1: scancel sends TERM too"):
        render({"run_dir": "/r", "env_nodes": 2, "requeue": 1, "signal": "TERM"})
    with pytest.raises(ParamError, match="'max_requeues' must be >= 0"):
        render({"run_dir": "/r", "env_nodes": 2, "requeue": 1, "max_requeues": -1})
    # the shortest Slurm limit with the warning 30 s before it (the cluster test below)
    subprocess.run(["bash", "-n"], check=True, text=True, input=render(
        {"run_dir": "/r", "env_nodes": 2, "requeue": 1, "time_limit": "1", "signal_before_s": 30,
         "controller_wait_s": 28, "agents_wait_s": 28}))


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
def job_state(cluster, job_id: str, watch: FarmWatch) -> dict:
    [comp] = job_components(cluster, job_id)
    watch.sample_job({job_id})
    return comp


def wait_job_done(cluster, job_id: str, run_dir: Path, tmp_path: Path, watch: FarmWatch, timeout_s: float) -> dict:
    try:
        return wait_for(lambda: (c := job_state(cluster, job_id, watch))["JobState"] in TERMINAL and c,
                        timeout_s, f"job {job_id} to finish")
    except AssertionError as exc:
        raise AssertionError(f"{exc}\n{describe(run_dir, tmp_path)}") from None


def committed_keys(rows: dict[str, dict]) -> dict[str, tuple[int, int]]:
    return {rid: (r["attempt"], r["token"]) for rid, r in rows.items() if r["state"] == "committed"}


def assert_each_committed_once(run_dir: Path, n: int, tmp_path: Path) -> dict[str, dict]:
    """Every rollout of the run committed, once: the queue, the catalog (queue keys only) and
    the Parquet rows DuckDB reads (one per rollout) agree."""
    from controller.analysis.query import connect
    from controller.store.catalog import Catalog
    rows = queue_rows(run_dir)
    assert len(rows) == n and {r["state"] for r in rows.values()} == {"committed"}, describe(run_dir, tmp_path)
    assert Catalog(run_dir).keys() == committed_keys(rows)
    con = connect(run_dir)
    total, distinct = con.execute("SELECT count(*), count(DISTINCT rollout_id) FROM rollouts").fetchone()
    assert total == distinct == n
    stored = {r[0]: (r[1], r[2]) for r in con.execute("SELECT rollout_id, attempt, fencing_token FROM rollouts").fetchall()}
    assert stored == committed_keys(rows)
    # and underneath the view: each committed attempt's row was written once, in one shard
    raw = con.execute(f"SELECT rollout_id, attempt, fencing_token, count(*) FROM read_parquet("
                      f"'{run_dir / 'rollouts'}/*.parquet', union_by_name = true) GROUP BY ALL").fetchall()
    written = {(rid, a, t): k for rid, a, t, k in raw}
    assert {rid: written.get((rid, *key)) for rid, key in committed_keys(rows).items()} == dict.fromkeys(rows, 1)
    return rows


@pytest.mark.slurm
@pytest.mark.sandbox
def test_a_requeued_job_and_a_new_job_on_its_run_directory_resume_the_run(slurm_cluster, job_user_dir, python_image):
    t0 = time.monotonic()
    tmp_path, cluster = job_user_dir, slurm_cluster
    (tmp_path / "trainer.py").write_text(TRAINER)
    give_to_user(tmp_path / "trainer.py")
    jobs: list[str] = []
    try:
        job_id, run_dir = submit(cluster, tmp_path, layout="single", requeue=1, tasks_limit=0, slots_per_node=1,
                                 trainer=trainer_command(tmp_path, steps=1))
        jobs.append(job_id)
        watch = FarmWatch(JOB_USER)

        def some_committed_some_held() -> bool:
            job_state(cluster, job_id, watch)
            states = [r["state"] for r in queue_rows(run_dir).values()]
            return states.count("committed") >= 2 and bool(set(HELD) & set(states))
        wait_for(some_committed_some_held, 90, "committed rollouts while others run")
        first_endpoint = policy_endpoint(run_dir)
        # A weight update on the trainer's model server: a rollout leased from now on is stuck in
        # its model calls (retried for seconds), so it cannot finish in this run of the job.
        last_token = max(r["token"] or 0 for r in queue_rows(run_dir).values())
        set_loading(first_endpoint, True)
        stuck = wait_for(lambda: job_state(cluster, job_id, watch) and [
            rid for rid, r in queue_rows(run_dir).items() if r["state"] in HELD and r["token"] > last_token],
            30, "a rollout leased during the weight update")
        at_requeue = queue_rows(run_dir)
        slurm_out(cluster, "scontrol", "requeue", job_id)
        # The old run ends (its steps are killed), then the job waits for its begin time.
        wait_for(lambda: job_state(cluster, job_id, watch)["JobState"] == "PENDING" and not stray_processes(cluster),
                 60, f"job {job_id} back in the queue with its old run gone")
        after_old = queue_rows(run_dir)
        comp = job_state(cluster, job_id, watch)
        assert comp["Restarts"] == "1", comp
        pending_reason = comp.get("Reason")
        if pending_reason == "BeginTime":       # a requeued job waits; an admin lets it start now
            slurm_out(cluster, "scontrol", "update", f"JobId={job_id}", "StartTime=now")
        comp = wait_job_done(cluster, job_id, run_dir, tmp_path, watch, 120)
        assert comp["JobState"] == "COMPLETED" and comp["Restarts"] == "1", logs(tmp_path)
        requeued_s = time.monotonic() - t0
        head_log = (run_dir / "logs" / "head.log").read_text()
        assert "resuming the run" in head_log and "the trainer is back" in head_log, logs(tmp_path)

        first = assert_each_committed_once(run_dir, STEP_SIZES[0], tmp_path)
        assert len({r["batch_id"] for r in first.values()}) == 1            # one batch: the keyed submit
        committed_before = committed_keys(at_requeue)
        held = {rid: r for rid, r in at_requeue.items() if r["state"] in HELD}
        assert committed_before and held and len(committed_before) < STEP_SIZES[0]   # the requeue came mid-batch
        # committed before the requeue, or by the old run while it drained: never run again
        kept = committed_keys(after_old)
        assert kept.items() >= committed_before.items()
        assert {rid: committed_keys(first)[rid] for rid in kept} == kept
        assert not [a for a in attempts(run_dir) if a["rollout_id"] in kept and a["attempt"] > kept[a["rollout_id"]][0]]
        # leased at the requeue and not finished by the old run: leased anew (a later token) and finished
        relet = {rid for rid in held if rid not in kept}
        assert set(stuck) <= relet, (stuck, relet)
        for rid in relet:
            assert first[rid]["token"] > at_requeue[rid]["token"] and first[rid]["attempt"] > at_requeue[rid]["attempt"], \
                (rid, at_requeue[rid], first[rid])
        # the requeued trainer served its policy at a new port: the version moved there
        assert policy_endpoint(run_dir) != first_endpoint
        # the trainer: two runs of the job, every result once, the second reading on from its cursor
        state = json.loads((run_dir / "trainer-checkpoint.json").read_text())
        assert state["runs"] == [f"{job_id}.0", f"{job_id}.1"] and state["step"] == 1, state
        seen = [rid for rid, *_ in state["seen"]]
        assert sorted(seen) == sorted(first) and {s for _rid, s, *_ in state["seen"]} == {"committed"}
        assert {run for *_, run in state["seen"]} == {f"{job_id}.0", f"{job_id}.1"}

        # ---- a new job on the same run directory: the trainer's next step; nothing of step 0 redone
        attempts_before = attempts(run_dir)
        job2, _ = submit(cluster, tmp_path, layout="single", tasks_limit=0, slots_per_node=1,
                         trainer=trainer_command(tmp_path, steps=2))
        jobs.append(job2)
        comp = wait_job_done(cluster, job2, run_dir, tmp_path, watch, 90)
        assert comp["JobState"] == "COMPLETED", logs(tmp_path)
        final = assert_each_committed_once(run_dir, sum(STEP_SIZES), tmp_path)
        assert {rid: committed_keys(final)[rid] for rid in first} == committed_keys(first)
        assert [a for a in attempts(run_dir) if a["rollout_id"] in first] == attempts_before
        state = json.loads((run_dir / "trainer-checkpoint.json").read_text())
        assert state["runs"][2:] == [f"{job2}.0"] and state["step"] == 2
        seen = [rid for rid, *_ in state["seen"]]
        assert sorted(seen) == sorted(final)                                  # every result once, none twice
        assert watch.as_root() == [], watch.describe(watch.as_root())        # no farm process ran as root
        wait_for(lambda: not stray_processes(cluster), 15, "job processes to leave the nodes")
        print(f"\nrequeue test: {len(committed_before)} committed before the requeue, {len(kept) - len(committed_before)} "
              f"by the old run while it drained, {len(relet)} leased anew ({len(stuck)} stuck in the weight update); "
              f"requeued job pending for {pending_reason}; job 1 done after {requeued_s:.1f}s, "
              f"job 2 after {time.monotonic() - t0:.1f}s")
    finally:
        for j in jobs:
            subprocess.run(["scancel", j], env=cluster.env, capture_output=True)


# ------------------------------------------------------------------ the time limit: the job requeues itself
TIME_LIMIT_STEPS = 500      # steps of 2 rollouts: far more than one 1-minute allocation of two 1-slot agents runs


def run_until_done(cluster, job_id: str, run_dir: Path, tmp_path: Path, watch: FarmWatch, timeout_s: float,
                   seen_at: list) -> tuple[dict, list]:
    """Follow a job that requeues itself until it ends; each time it waits for its begin time
    after a requeue (Slurm's delay), an admin lets it start now. Returns its last state and,
    per run that ended, (restart count, the queue rows once that run's processes were gone)."""
    runs, seen, pending_since = [], {"0"}, {}

    def step():
        comp = job_state(cluster, job_id, watch)
        assert comp["JobState"] != "TIMEOUT", f"job {job_id} hit its time limit: {comp}\n{describe(run_dir, tmp_path)}"
        if comp["JobState"] == "PENDING":
            pending_since.setdefault(comp["Restarts"], time.time())
        # At the requeue slurmd revokes the old run's credential, and a run of the same job
        # started within that second is refused ("Job credential revoked"): the next run is let
        # in once the clock is past that second (Slurm's own begin-time delay is minutes).
        if comp["JobState"] == "PENDING" and comp["Restarts"] not in seen and not stray_processes(cluster) \
                and int(time.time()) > int(pending_since[comp["Restarts"]]):
            seen.add(comp["Restarts"])
            runs.append((int(comp["Restarts"]) - 1, queue_rows(run_dir)))
            seen_at.append(time.monotonic())
            if comp.get("Reason") == "BeginTime":
                slurm_out(cluster, "scontrol", "update", f"JobId={job_id}", "StartTime=now")
        return comp["JobState"] in TERMINAL and comp
    try:
        return wait_for(step, timeout_s, f"job {job_id} to finish"), runs
    except AssertionError as exc:
        raise AssertionError(f"{exc}: {job_state(cluster, job_id, watch)}; left on the nodes: {stray_processes(cluster)}"
                             f"\n{describe(run_dir, tmp_path)}") from None


@pytest.mark.slurm
@pytest.mark.sandbox
def test_a_job_that_reaches_its_time_limit_drains_requeues_itself_and_the_next_run_finishes(
        slurm_cluster, job_user_dir, python_image):
    """A 1-minute job (Slurm's shortest) with the warning 30 s before its end and a trainer with
    more steps than one allocation runs: at the warning (USR1) the batch shell drains the farm and
    requeues its own job; the requeued run resumes from the queue and finishes the step the first
    run was in, and one more."""
    t0 = time.monotonic()
    tmp_path, cluster = job_user_dir, slurm_cluster
    (tmp_path / "trainer.py").write_text(TRAINER)
    give_to_user(tmp_path / "trainer.py")
    job_id = None
    try:
        job_id, run_dir = submit(cluster, tmp_path, layout="single", requeue=1, time_limit="1", signal_before_s=30,
                                 controller_wait_s=28, agents_wait_s=28, tasks_limit=0, slots_per_node=1,
                                 trainer=trainer_command(tmp_path, steps=TIME_LIMIT_STEPS, sizes=(2,),
                                                         plan="until-restart"))
        watch = FarmWatch(JOB_USER)
        seen_at: list[float] = []
        comp, runs = run_until_done(cluster, job_id, run_dir, tmp_path, watch, 150, seen_at)
        wall_s = time.monotonic() - t0
        assert comp["JobState"] == "COMPLETED" and comp["Restarts"] == "1", \
            f"{comp}\n{logs(tmp_path)}\n" + "\n".join((cluster.log_dir / "slurmctld.log").read_text().splitlines()[-40:])
        out = (tmp_path / f"slurm-{job_id}.out").read_text()
        assert "paddock: SIGUSR1 before the time limit: draining, then requeueing" in out, out
        assert f"paddock: requeueing job {job_id} (restart 1 of at most 10)" in out, out
        assert "resuming the run" in (run_dir / "logs" / "head.log").read_text(), logs(tmp_path)

        state = json.loads((run_dir / "trainer-checkpoint.json").read_text())
        assert state["runs"] == [f"{job_id}.0", f"{job_id}.1"] and state["step"] == state["planned"], state
        n = 2 * state["planned"]
        final = assert_each_committed_once(run_dir, n, tmp_path)
        assert len({r["batch_id"] for r in final.values()}) == state["planned"]   # one batch per step: keyed
        done_first = committed_keys(runs[0][1])
        assert 0 < len(done_first) < n, (len(done_first), logs(tmp_path))   # the first run did some, not all
        # what each run committed (and drained) keeps its attempt and token, and is never run again
        for _restart, rows in runs:
            kept = committed_keys(rows)
            assert {rid: committed_keys(final)[rid] for rid in kept} == kept
            assert not [a for a in attempts(run_dir) if a["rollout_id"] in kept and a["attempt"] > kept[a["rollout_id"]][0]]
        assert sorted(rid for rid, *_ in state["seen"]) == sorted(final)       # every result once, none twice
        assert watch.as_root() == [], watch.describe(watch.as_root())
        wait_for(lambda: not stray_processes(cluster), 15, "job processes to leave the nodes")
        overran = out.count("the drain is not over")
        print(f"\ntime-limit requeue test: {len(done_first)} of {n} committed by the first run, "
              f"{[len(committed_keys(rows)) for _r, rows in runs]} committed after each requeued run, "
              f"{comp['Restarts']} restart(s), {overran} drain(s) cut short by the watchdog, "
              f"{sum(a['attempt'] > 1 for a in attempts(run_dir))} attempts after a first; requeue seen "
              f"{seen_at[0] - t0:.1f}s after the submit, done after {wall_s:.1f}s")
    finally:
        if job_id:
            subprocess.run(["scancel", job_id], env=cluster.env, capture_output=True)


@pytest.mark.slurm
@pytest.mark.sandbox
def test_a_cancelled_requeue_job_ends_and_one_past_max_requeues_drains_and_ends(slurm_cluster, job_user_dir, python_image):
    """Two requeue=1 jobs at once: `scancel` of one ends it (TERM: no requeue); the other,
    with max_requeues=0, gets the time limit's warning (what --signal=B:USR1 delivers, now) and
    drains and ends instead of requeueing itself."""
    tmp_path, cluster = job_user_dir, slurm_cluster
    (tmp_path / "trainer.py").write_text(TRAINER)
    give_to_user(tmp_path / "trainer.py")
    jobs: dict[str, tuple[str, Path]] = {}
    try:
        for name, extra in (("cancelled", {}), ("capped", {"max_requeues": 0})):
            run_dir = tmp_path / f"run-{name}"
            job_id, _ = submit(cluster, tmp_path, run_dir=str(run_dir), requeue=1, env_nodes=1, layout="single",
                               tasks_limit=0, slots_per_node=1, trainer=trainer_command(tmp_path, steps=1, sizes=(40,)),
                               **extra)
            jobs[name] = job_id, run_dir
        watch = FarmWatch(JOB_USER)
        for name, (job_id, run_dir) in jobs.items():
            try:
                wait_for(lambda: job_state(cluster, job_id, watch) and committed_keys(queue_rows(run_dir)), 90,
                         f"a committed rollout in the {name} job")
            except AssertionError as exc:
                raise AssertionError(f"{exc}: {job_state(cluster, job_id, watch)}\n{logs(tmp_path)}\n"
                                     + "\n".join(f.read_text() for f in (run_dir / "logs").glob("*.log"))) from None
        slurm_out(cluster, "scancel", jobs["cancelled"][0])
        slurm_out(cluster, "scancel", "--batch", "--signal=USR1", jobs["capped"][0])
        ends = {name: wait_job_done(cluster, job_id, run_dir, tmp_path, watch, 90) for name, (job_id, run_dir) in jobs.items()}
        wait_for(lambda: not stray_processes(cluster), 30, "job processes to leave the nodes")
        out = {name: (tmp_path / f"slurm-{job_id}.out").read_text() for name, (job_id, _) in jobs.items()}
        # still ended once nothing of either job runs: neither requeued itself
        for name, (job_id, _) in jobs.items():
            comp = job_state(cluster, job_id, watch)
            assert (comp["JobState"], comp["Restarts"]) == (ends[name]["JobState"], "0"), (name, comp, out[name])
            assert "paddock: requeueing job" not in out[name], out[name]
        assert ends["cancelled"]["JobState"] == "CANCELLED"
        assert "paddock: SIGTERM (scancel, or Slurm ends or requeues the job): draining; not requeueing" in out["cancelled"]
        assert ends["capped"]["JobState"] == "COMPLETED", out["capped"]
        assert "was requeued 0 times (max_requeues=0): it ends here" in out["capped"]
        capped_dir = jobs["capped"][1]
        assert "waiting for agents to drain" in (capped_dir / "logs" / "head.log").read_text()
        assert watch.as_root() == [], watch.describe(watch.as_root())
    finally:
        for job_id, _ in jobs.values():
            subprocess.run(["scancel", job_id], env=cluster.env, capture_output=True)
