"""End to end: the job a GPU cluster's user submits (issue 25), on an in-test cluster made like a
real one. Seven nodes in their own network and UTS namespaces: node1-3 and node7 in partition
`gpu` with four "GPUs" each (gres.conf, character devices the cluster makes), node4-6 in partition `cpu` (the
default); TaskPlugin=task/affinity binds every step to its CPUs. The job, submitted by the
ordinary user paddock-u1 with its own `sbatch`, is a heterogeneous job rendered from a job
description: the trainer (the head) on a GPU node with 4 GPUs, two inference replicas (the
scripted policy server, started in the allocation as a real Slurm step) on GPU nodes, a judge
(another scripted server, asking for `--gres=gpu:2`) on a GPU node, a farm of three node agents
on CPU nodes.

Checked: `scontrol show job` (components, partitions, GPUs), the CPU affinity of every step
(`taskset -p`), that rollouts flow through both replicas, and that a node agent SIGKILLed once
is restarted by its step, costs no rollout, and comes back.

Run (root; Slurm, munge, iproute2, the user paddock-u1 from `make setup`):
  PYTHONPATH=. .venv/bin/python -m pytest -q -p no:cacheprovider tests/slurm/test_slurm_cluster_gpu.py
"""
from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import tempfile
import time
from pathlib import Path

import pytest

from slurm.sbatch import render
from slurm.testcluster import TestCluster, missing_requirements, sweep
from tests.conftest import wait_for
from tests.slurm_fixture import JOB_USER, USER_PYTHON, job_env, missing_job_user

PREFIX = "pgpu"
GPU_NODES = ("node1", "node2", "node3", "node7")
CPU_NODES = ("node4", "node5", "node6")
JOB_DEADLINE_S = 240.0
TERMINAL = {"COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "NODE_FAIL", "OUT_OF_MEMORY", "BOOT_FAIL"}

pytestmark = [pytest.mark.slurm, pytest.mark.sandbox]


@pytest.fixture(scope="module")
def gpu_cluster():
    missing = missing_requirements()
    if missing:
        pytest.skip("in-test Slurm cluster unavailable: " + "; ".join(missing))
    reason = missing_job_user()
    if reason:
        pytest.skip(reason)
    sweep(PREFIX)
    workdir = Path(tempfile.mkdtemp(prefix="paddock-slurm-gpu-", dir="/tmp"))
    os.chmod(workdir, 0o755)
    try:
        with TestCluster(workdir, nodes=7, name_prefix=PREFIX, job_user=JOB_USER,
                         gpus={h: 4 for h in GPU_NODES},
                         partitions={"cpu": CPU_NODES, "gpu": GPU_NODES}) as cluster:
            yield cluster
    finally:
        shutil.rmtree(workdir, ignore_errors=True)


def job_description(run_dir: Path) -> dict:
    scripted = (f"{USER_PYTHON} -m controller.demo.scripted_server --port $PADDOCK_SERVER_PORT "
                f"--count-to {run_dir}/servers/inference/$(hostname).calls")
    return {
        "run_dir": str(run_dir), "python": USER_PYTHON, "time_limit": "10", "signal_before_s": 60,
        "versions": 2, "tasks_limit": 8, "slots_per_node": 2, "heartbeat_interval_s": 0.5,
        "controller_wait_s": 150, "agents_wait_s": 150,
        "components": {
            "trainer": {"partition": "gpu", "gpus_per_node": 4, "cpus_per_task": 2, "mem": "1000M"},
            "inference": {"nodes": 2, "partition": "gpu", "gpus_per_node": 1, "cpus_per_task": 1,
                          "command": scripted, "port": 8000, "health": "/v1/models",
                          "reload": "/admin/policies", "ready_wait_s": 120, "mem": "500M"},
            "judge": {"nodes": 1, "partition": "gpu", "gres": "gpu:2", "cpus_per_task": 1, "mem": "500M",
                      "command": f"{USER_PYTHON} -m controller.demo.scripted_server --port $PADDOCK_SERVER_PORT",
                      "port": 9000, "health": "/v1/models", "ready_wait_s": 120},
            "farm": {"nodes": 3, "partition": "cpu", "cpus_per_task": 2, "mem": "1500M"},
        },
    }


def slurm_out(cluster, *argv: str) -> str:
    cp = subprocess.run(argv, env=cluster.env, capture_output=True, text=True, timeout=30)
    assert cp.returncode == 0, f"{argv}: {cp.stderr}"
    return cp.stdout


def components(cluster, job_id: str) -> list[dict]:
    out = slurm_out(cluster, "scontrol", "show", "job", "-d", "-o", job_id)
    return [dict(re.findall(r"(\w+(?::\w+)?)=(\S*)", ln)) for ln in out.splitlines() if ln.strip()]


def committed(run_dir: Path) -> int:
    import sqlite3
    try:
        con = sqlite3.connect(f"file:{run_dir / 'controller.db'}?mode=ro", uri=True, timeout=5)
        try:
            return con.execute("SELECT count(*) FROM rollouts WHERE state = 'committed'").fetchone()[0]
        finally:
            con.close()
    except sqlite3.Error:
        return 0


def logs(d: Path) -> str:
    parts = []
    for f in sorted(d.glob("slurm-*.out")) + sorted((d / "run" / "logs").glob("*.log")):
        parts.append(f"--- {f.name}\n" + "\n".join(f.read_text(errors="replace").splitlines()[-30:]))
    return "\n".join(parts)


def node_procs(cluster, host: str) -> dict[int, str]:
    """{pid: command line} of the processes in a node's network namespace."""
    cp = subprocess.run(["ip", "netns", "pids", cluster.netns[host]], capture_output=True, text=True)
    out = {}
    for pid in cp.stdout.split():
        try:
            out[int(pid)] = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode().strip()
        except OSError:
            continue
    return out


def affinity(pid: int) -> int:
    """How many CPUs `taskset -p PID` says the process may run on."""
    out = subprocess.run(["taskset", "-p", str(pid)], capture_output=True, text=True, check=True).stdout
    return bin(int(out.rsplit(":", 1)[1].strip(), 16)).count("1")


def step_pid(cluster, host: str, pattern: str) -> int:
    found = [p for p, cmd in node_procs(cluster, host).items() if re.search(pattern, cmd)]
    assert len(found) == 1, f"{pattern} on {host}: {found}"
    return found[0]


def test_a_gpu_shaped_job_runs_end_to_end_and_survives_a_killed_agent(gpu_cluster, job_user_dir, python_image):
    from controller.analysis.query import connect
    d = job_user_dir
    run_dir = d / "run"
    script = d / "job.sh"
    script.write_text(render(job_description(run_dir)))
    pw = __import__("pwd").getpwnam(JOB_USER)
    os.chown(script, pw.pw_uid, pw.pw_gid)
    cp = subprocess.run(gpu_cluster.job_argv(["sbatch", "--parsable", "-o", str(d / "slurm-%j.out"), str(script)]),
                        env=job_env(gpu_cluster), capture_output=True, text=True, timeout=30, cwd=d)
    assert cp.returncode == 0, f"sbatch as {JOB_USER}: {cp.stderr}"
    job_id = cp.stdout.strip().split(";")[0]

    # -- scontrol show job: three components on the node types asked for
    def running():
        c = components(gpu_cluster, job_id)
        return c if c and all(x["JobState"] == "RUNNING" for x in c) else None
    comps = wait_for(running, 60, "the job's components to run")
    by_part = {}
    for c in comps:
        by_part.setdefault(c["Partition"], []).append(c)
        assert c["UserId"].startswith(f"{JOB_USER}(")
    trainer, inference, judge = sorted(by_part["gpu"], key=lambda c: int(c["JobId"]))
    (farm,) = by_part["cpu"]
    assert (trainer["NumNodes"], trainer["TresPerNode"], trainer["GRES"]) == ("1", "gres:gpu:4", "gpu:4(IDX:0-3)")
    assert (inference["NumNodes"], inference["TresPerNode"], inference["JOB_GRES"]) == ("2", "gres:gpu:1", "gpu:2")
    assert (judge["NumNodes"], judge["TresPerNode"]) == ("1", "gres:gpu:2")
    assert farm["NumNodes"] == "3" and farm["JOB_GRES"] == "(null)" and "TresPerNode" not in farm
    assert [c["MinCPUsNode"] for c in (trainer, inference, farm)] == ["2", "1", "2"]
    assert [c["MinMemoryNode"] for c in (trainer, inference, farm)] == ["1000M", "500M", "1500M"]
    hosts = {name: set(slurm_out(gpu_cluster, "scontrol", "show", "hostnames", c["NodeList"]).split())
             for name, c in (("trainer", trainer), ("inference", inference), ("judge", judge), ("farm", farm))}
    assert hosts["farm"] == set(CPU_NODES)
    assert hosts["trainer"] | hosts["inference"] | hosts["judge"] == set(GPU_NODES)   # each on nodes of its own

    # -- every step is bound to the CPUs its component asked for (task/affinity)
    wait_for(lambda: committed(run_dir) >= 2, 150, "the first committed rollouts\n" + logs(d))
    (head_node,) = hosts["trainer"]
    assert affinity(step_pid(gpu_cluster, head_node, r"^\S+ -m controller\.cli job head ")) == 2
    for host in hosts["farm"]:
        assert affinity(step_pid(gpu_cluster, host, r"^\S+ -m controller\.cli job agent ")) == 2
        assert affinity(step_pid(gpu_cluster, host, r"^\S+ -m controller\.cli agent ")) == 2
    for host in hosts["inference"]:
        assert affinity(step_pid(gpu_cluster, host, r"^\S+ -m controller\.cli job server ")) == 1
    servers = json.loads((run_dir / "servers.json").read_text())
    assert {r["node"] for r in servers["inference"]} == hosts["inference"]
    assert [r["url"] for r in servers["judge"]] == [f"http://{gpu_cluster.node_addrs[h]}:9000/v1" for h in hosts["judge"]]

    # -- kill one node agent (the supervised process, not its step): it comes back, nothing is lost
    victim = sorted(hosts["farm"])[0]
    agent_pid = step_pid(gpu_cluster, victim, r"^\S+ -m controller\.cli agent ")
    killed_at, killed_wall = time.monotonic(), time.time()
    os.kill(agent_pid, signal.SIGKILL)

    def back() -> bool:
        try:
            new = step_pid(gpu_cluster, victim, r"^\S+ -m controller\.cli agent ")
        except AssertionError:
            return False
        if new == agent_pid:
            return False
        # the controller's log: the node registered again (the keys are the job user's, not ours)
        text = (run_dir / "logs" / "controller.log").read_text(errors="replace")
        return len(re.findall(rf"node {victim} registered", text)) == 2
    wait_for(back, 60, f"the agent on {victim} to be restarted and registered\n" + logs(d))
    restart_s = time.monotonic() - killed_at
    report = json.loads((run_dir / "health" / f"{victim}.supervisor.json").read_text())
    assert report["restarts"] == 1 and report["failures"][0]["exit"] == -signal.SIGKILL

    # -- the job completes; every rollout committed once, none failed for infrastructure
    deadline = time.monotonic() + JOB_DEADLINE_S
    while True:
        comps = components(gpu_cluster, job_id)
        if all(c["JobState"] in TERMINAL for c in comps):
            break
        assert time.monotonic() < deadline, f"job {job_id} not done: {comps}\n" + logs(d)
        time.sleep(0.5)
    assert {c["JobState"] for c in comps} == {"COMPLETED"}, logs(d)
    con = connect(run_dir)
    n, distinct = con.execute("SELECT count(*), count(DISTINCT rollout_id) FROM rollouts").fetchone()
    assert n == distinct == 16
    assert con.execute("SELECT count(*) FROM rollouts WHERE outcome = 'infra_error'").fetchone()[0] == 0
    assert {r[0] for r in con.execute("SELECT DISTINCT node FROM rollouts").fetchall()} <= hosts["farm"]
    after_kill = con.execute("SELECT count(*) FROM rollouts WHERE node = ? AND epoch(started_at) > ?",
                             [victim, killed_wall]).fetchone()[0]
    # both replicas answered model calls (the gateways spread rollouts over them)
    calls = {p.stem: json.loads(p.read_text())["completions"]
             for p in (run_dir / "servers" / "inference").glob("*.calls")}
    assert set(calls) == hosts["inference"] and all(v > 0 for v in calls.values()), calls
    run = json.loads((run_dir / "run.json").read_text())
    assert run["validate"] == "quick" and (run_dir / "quarantine.json").exists()
    print(f"\nGPU-shaped job {job_id}: {n} rollouts committed, 0 infra errors; agent on {victim} restarted "
          f"and registered {restart_s:.1f}s after SIGKILL, ran {after_kill} rollouts afterwards; "
          f"model calls per replica {calls}")
