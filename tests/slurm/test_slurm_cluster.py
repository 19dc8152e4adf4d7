"""Specification of the in-test Slurm cluster (slurm/testcluster.py) and its pytest fixture. The
session cluster's jobs are submitted by, and run as, the ordinary user paddock-u1; slurmctld runs
as the `slurm` user.

Run: .venv/bin/python -m pytest -p tests.slurm_fixture tests/slurm/test_slurm_cluster.py -q
"""
from __future__ import annotations

import ipaddress
import json
import os
import pwd
import random
import re
import select
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from slurm.testcluster import (
    DEFAULT_PREFIX,
    ClusterConfigError,
    TestCluster,
    choose_subnet,
    missing_accounting,
    missing_requirements,
    proc_alive,
    render_gres_conf,
    render_slurm_conf,
    sweep,
    validate_prefix,
)
from tests.conftest import wait_for
from tests.slurm_fixture import JOB_USER

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "slurm" / "clusterctl.py"
JOB_DEADLINE_S = 60.0
TERMINAL_JOB_STATES = {"COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "NODE_FAIL",
                       "OUT_OF_MEMORY", "BOOT_FAIL", "DEADLINE", "PREEMPTED"}

needs_cluster = pytest.mark.skipif(bool(missing_requirements()),
                                   reason="; ".join(missing_requirements()) or "ok")



def slurm(cluster_env: dict, *argv: str, timeout_s: float = 30.0) -> str:
    cp = subprocess.run(argv, env=cluster_env, capture_output=True, text=True, timeout=timeout_s)
    assert cp.returncode == 0, f"{argv} exited {cp.returncode}: {cp.stderr}"
    return cp.stdout


def user_slurm(cluster, *argv: str, timeout_s: float = 30.0) -> str:
    """A Slurm command of the job user's own (runuser), as on a login node."""
    cp = subprocess.run(cluster.job_argv(list(argv)), env=cluster.job_env, capture_output=True, text=True,
                        timeout=timeout_s, cwd="/tmp")
    assert cp.returncode == 0, f"{argv} as {cluster.job_user} exited {cp.returncode}: {cp.stderr}"
    return cp.stdout


def netns_names() -> set[str]:
    return set(os.listdir("/run/netns")) if os.path.isdir("/run/netns") else set()


def link_names() -> set[str]:
    return set(os.listdir("/sys/class/net"))


def recorded_pids(record: dict) -> dict[int, int]:
    return {int(p): t for p, t in record["pids"].items()}


# ------------------------------------------------------------------ pure parts (no root needed)
def test_slurm_conf_has_one_node_line_per_node_with_its_address_and_hostname():
    text = render_slurm_conf(workdir=Path("/w"), munge_socket=Path("/r/m.sock"), cluster_name="pdkabc123", ctld_host="h",
                             ctld_addr="10.170.3.1", ctld_port=23456,
                             node_addrs={"node1": "10.170.3.11", "node2": "10.170.3.12"})
    node_lines = [ln for ln in text.splitlines() if ln.startswith("NodeName=")]
    assert node_lines == [
        "NodeName=node1 NodeAddr=10.170.3.11 NodeHostname=node1 CPUs=2 RealMemory=2000 State=UNKNOWN",
        "NodeName=node2 NodeAddr=10.170.3.12 NodeHostname=node2 CPUs=2 RealMemory=2000 State=UNKNOWN",
    ]
    for line in ("SlurmctldHost=h(10.170.3.1)", "SlurmctldPort=23456", "MinJobAge=300",
                 "SchedulerParameters=sched_interval=1,bf_interval=1",
                 "SlurmdParameters=config_overrides", "AuthInfo=socket=/r/m.sock"):
        assert line in text.splitlines()


def test_slurm_conf_binds_cpus_and_can_give_nodes_gpus_and_partitions():
    text = render_slurm_conf(workdir=Path("/w"), munge_socket=Path("/r/m.sock"), cluster_name="pdkabc123", ctld_host="h",
                             ctld_addr="10.170.3.1", ctld_port=23456,
                             node_addrs={"node1": "10.170.3.11", "node2": "10.170.3.12"},
                             gpus={"node1": 4}, partitions={"cpu": ("node2",), "gpu": ("node1",)})
    lines = text.splitlines()
    assert "TaskPlugin=task/affinity" in lines and "GresTypes=gpu" in lines
    assert "AccountingStorageTRES=gres/gpu" not in lines          # needs slurmdbd
    assert [ln for ln in lines if ln.startswith("NodeName=node1")][0].endswith("Gres=gpu:4 State=UNKNOWN")
    assert "Gres" not in [ln for ln in lines if ln.startswith("NodeName=node2")][0]
    assert [ln for ln in lines if ln.startswith("PartitionName=")] == [
        "PartitionName=cpu Nodes=node2 Default=YES MaxTime=INFINITE State=UP",
        "PartitionName=gpu Nodes=node1 Default=NO MaxTime=INFINITE State=UP"]
    assert render_gres_conf(Path("/w"), {"node1": 4, "node2": 0}) == "NodeName=node1 Name=gpu File=/w/dev/node1/nvidia[0-3]\n"


def test_gpus_or_partitions_on_unknown_nodes_are_refused_by_name(tmp_path):
    with pytest.raises(ClusterConfigError, match="gpus: no node 'node9'"):
        TestCluster(tmp_path, nodes=2, gpus={"node9": 1})
    with pytest.raises(ClusterConfigError, match="partition gpu: no node 'node3'"):
        TestCluster(tmp_path, nodes=2, partitions={"gpu": ("node3",)})


def test_chosen_subnet_overlaps_no_network_already_in_use():
    first = choose_subnet([], random.Random(7))
    again = choose_subnet([first], random.Random(7))  # same seed: first pick is taken, skip it
    assert not again.overlaps(first)
    assert again.prefixlen == 24 and again.subnet_of(ipaddress.ip_network("10.160.0.0/11"))
    with pytest.raises(Exception, match="no free /24"):
        choose_subnet([ipaddress.ip_network("10.0.0.0/8")], random.Random(7))


def test_slurm_conf_with_accounting_points_at_the_clusters_own_slurmdbd():
    text = render_slurm_conf(workdir=Path("/w"), munge_socket=Path("/r/m.sock"), cluster_name="c", ctld_host="h",
                             ctld_addr="10.170.3.1", ctld_port=23456, node_addrs={"node1": "10.170.3.11"},
                             dbd_port=24567)
    lines = text.splitlines()
    for line in ("AccountingStorageType=accounting_storage/slurmdbd", "AccountingStorageHost=127.0.0.1",
                 "AccountingStoragePort=24567", "AccountingStoragePass=/r/m.sock"):
        assert line in lines
    assert "AccountingStorageType=accounting_storage/none" not in lines


@pytest.mark.parametrize("prefix", ["", "toolong", "PDK", "pd-k", "p1"])
def test_prefix_that_cannot_fit_interface_names_is_rejected_by_name(prefix):
    with pytest.raises(ClusterConfigError, match="name_prefix"):
        validate_prefix(prefix)


@pytest.mark.parametrize("bad", ["with space", "semi#colon", "quo'te"])
def test_workdir_that_slurm_conf_cannot_hold_is_rejected_before_anything_starts(tmp_path, bad):
    with pytest.raises(ClusterConfigError, match="workdir"):
        TestCluster(tmp_path / bad)
    assert not (tmp_path / bad).exists()


def test_a_workdir_the_cluster_users_cannot_reach_is_refused_naming_the_fix(tmp_path):
    if os.geteuid() != 0 or bool(missing_requirements()):
        pytest.skip("; ".join(missing_requirements()) or "needs root")
    os.chmod(tmp_path, 0o700)
    with pytest.raises(ClusterConfigError, match=r"cannot reach it .* use one under /tmp"):
        TestCluster(tmp_path / "c", nodes=1, name_prefix="pdkr").start()
    assert not (tmp_path / "c" / "cluster.json").exists()   # nothing started, no record


def test_an_unknown_job_user_is_refused_by_name(tmp_path):
    with pytest.raises(ClusterConfigError, match="job_user 'no-such-user' does not exist"):
        TestCluster(tmp_path, job_user="no-such-user")


# ------------------------------------------------------------------ the session cluster
@pytest.mark.slurm
def test_srun_on_three_nodes_returns_each_node_hostname_once(slurm_cluster):
    out = user_slurm(slurm_cluster, "srun", "-N3", "hostname")
    assert sorted(out.split()) == ["node1", "node2", "node3"]
    assert slurm_cluster.nodes == ("node1", "node2", "node3")


@pytest.mark.slurm
def test_steps_are_bound_to_the_cpus_they_asked_for(slurm_cluster):
    """task/affinity, as on a real cluster: a step that names no --cpus-per-task gets one CPU."""
    def mask(*opts: str) -> str:
        cp = subprocess.run(slurm_cluster.job_argv(["srun", "-N1", *opts, "sh", "-c", "taskset -p $$"]),
                            env=slurm_cluster.job_env, capture_output=True, text=True, timeout=30)
        assert cp.returncode == 0, cp.stderr
        return cp.stdout.rsplit(":", 1)[1].strip()
    assert mask("--cpus-per-task=2") == "3"
    assert mask() == "1"


def test_each_node_has_its_own_network_address(slurm_cluster):
    out = user_slurm(slurm_cluster, "srun", "-N3", "sh", "-c", 'echo "$(hostname) $(hostname -I)"')
    seen = {}
    for line in out.splitlines():
        host, *addrs = line.split()
        seen[host] = addrs
    assert seen == {h: [a] for h, a in slurm_cluster.node_addrs.items()}
    assert len(set(slurm_cluster.node_addrs.values())) == 3


@pytest.mark.slurm
def test_two_node_batch_job_with_srun_steps_completes(slurm_cluster, job_user_dir):
    out = job_user_dir / "job.out"
    script = job_user_dir / "job.sh"
    script.write_text("#!/bin/sh\n#SBATCH -N2\n"
                      "srun -N2 hostname\n"
                      "srun -N2 -n2 sh -c 'echo step2 $SLURM_PROCID'\n")
    os.chmod(script, 0o644)
    job_id = user_slurm(slurm_cluster, "sbatch", "--parsable", "-o", str(out), str(script)).strip()
    assert job_id.isdigit()

    def finished():
        info = slurm(slurm_cluster.env, "scontrol", "show", "job", "-o", job_id)
        state = re.search(r"JobState=(\S+)", info).group(1)
        return info if state in TERMINAL_JOB_STATES else None
    info = wait_for(finished, JOB_DEADLINE_S, f"job {job_id} to finish")
    assert "JobState=COMPLETED" in info and "ExitCode=0:0" in info, info
    lines = out.read_text().split("\n")
    hosts = {ln for ln in lines if ln.startswith("node")}
    assert len(hosts) == 2 and hosts <= set(slurm_cluster.nodes)
    assert sorted(ln for ln in lines if ln.startswith("step2")) == ["step2 0", "step2 1"]


@pytest.mark.slurm
def test_sacct_reports_the_state_of_a_finished_and_a_failed_job(slurm_cluster):
    if not slurm_cluster.accounting:
        pytest.skip("no accounting on this machine: " + "; ".join(missing_accounting()))
    ok = user_slurm(slurm_cluster, "sbatch", "--parsable", "-o", "/dev/null", "--wrap", "true").strip()
    bad = user_slurm(slurm_cluster, "sbatch", "--parsable", "-o", "/dev/null", "--wrap", "exit 3").strip()

    want = {ok: ["COMPLETED", "0:0"], bad: ["FAILED", "3:0"]}
    seen: list[dict] = [{}]

    # The job's start record can reach slurmdbd after the job ended: it carries the final state
    # but not the exit code, which the completion record brings a moment later (FAILED 0:0 in
    # between). Wait for the records to settle; a wrong final record fails with what was seen.
    def states():
        out = user_slurm(slurm_cluster, "sacct", "-X", "-n", "-P", "-o", "JobID,State,ExitCode", "-j", f"{ok},{bad}")
        seen[0] = {ln.split("|")[0]: ln.split("|")[1:] for ln in out.splitlines() if ln.strip()}
        return seen[0] == want
    try:
        wait_for(states, JOB_DEADLINE_S, "sacct to report both jobs finished")
    except AssertionError:
        assert seen[0] == want
        raise


@pytest.mark.slurm
def test_jobs_run_as_their_submitter_and_slurmctld_as_the_slurm_user(slurm_cluster):
    user = pwd.getpwnam(JOB_USER)
    out = user_slurm(slurm_cluster, "srun", "-N3", "sh", "-c", 'echo "$(id -u) $(id -g) $HOME"')
    assert out.splitlines() == [f"{user.pw_uid} {user.pw_gid} {user.pw_dir}"] * 3
    status = Path(f"/proc/{slurm_cluster.pids['slurmctld']}/status").read_text()
    uids = re.search(r"^Uid:\s+(.*)$", status, re.M).group(1).split()
    assert set(uids) == {str(pwd.getpwnam(slurm_cluster.slurm_user).pw_uid)} and slurm_cluster.slurm_user == "slurm"
    assert "SlurmUser=slurm" in slurm_cluster.conf.read_text().splitlines()


@pytest.mark.slurm
def test_sweep_leaves_a_live_cluster_alone(slurm_cluster):
    sweep(DEFAULT_PREFIX)
    assert set(slurm_cluster.netns.values()) <= netns_names()
    assert slurm_cluster.names.bridge in link_names()
    assert sorted(slurm(slurm_cluster.env, "srun", "-N3", "hostname").split()) == list(slurm_cluster.nodes)


# ------------------------------------------------------------------ own clusters: teardown
@pytest.mark.slurm
@needs_cluster
def test_stop_leaves_no_process_netns_veth_or_bridge_behind(cluster_workdir):
    cluster = TestCluster(cluster_workdir / "c", nodes=2, name_prefix="pdks").start()
    record = json.loads((cluster_workdir / "c" / "cluster.json").read_text())
    pids = recorded_pids(record)
    assert len(pids) == 4 and all(proc_alive(p, t) for p, t in pids.items())
    slurm(cluster.env, "srun", "-N2", "true")   # leaves slurmstepds behind to be cleaned too
    assert set(record["netns"]) <= netns_names()

    cluster.stop()

    assert [p for p, t in pids.items() if proc_alive(p, t)] == []
    assert not set(record["netns"]) & netns_names()
    assert not (set(record["veths"]) | {record["bridge"]}) & link_names()
    assert not (cluster.registry_dir / cluster.names.record_name).exists()
    assert (cluster_workdir / "c" / "log" / "slurmctld.log").exists()  # logs are kept
    cluster.stop()  # idempotent


@pytest.mark.slurm
@needs_cluster
def test_a_stopped_cluster_can_start_again_in_the_same_workdir(cluster_workdir):
    with TestCluster(cluster_workdir, nodes=2, name_prefix="pdks") as first:
        slurm(first.env, "srun", "-N2", "true")
    with TestCluster(cluster_workdir, nodes=2, name_prefix="pdks") as second:
        assert sorted(slurm(second.env, "srun", "-N2", "hostname").split()) == ["node1", "node2"]


OWNER = """
import sys, json
sys.path.insert(0, {root!r})
from slurm.testcluster import TestCluster
c = TestCluster(sys.argv[1], nodes=2, name_prefix="pdkw").start()
print("up", flush=True)
sys.stdin.read()
"""


@pytest.mark.slurm
@needs_cluster
def test_sweep_removes_leftovers_of_a_sigkilled_owner(cluster_workdir):
    sweep("pdkw")
    owner = subprocess.Popen([sys.executable, "-c", OWNER.format(root=str(ROOT)), str(cluster_workdir)],
                             stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        ready, _, _ = select.select([owner.stdout], [], [], 60)
        assert ready and owner.stdout.readline().strip() == "up"
        record = json.loads((cluster_workdir / "cluster.json").read_text())
    finally:
        owner.send_signal(signal.SIGKILL)
        owner.wait()
    assert set(record["netns"]) <= netns_names()   # the killed owner left its namespaces

    removed = sweep("pdkw")

    assert set(record["netns"]) | {record["bridge"]} <= set(removed)
    assert not set(record["netns"]) & netns_names()
    assert not (set(record["veths"]) | {record["bridge"]}) & link_names()
    wait_for(lambda: not any(proc_alive(p, t) for p, t in recorded_pids(record).items()),
             5.0, "the killed owner's daemons to be gone")


@pytest.mark.slurm
@needs_cluster
def test_sweep_removes_prefixed_names_that_have_no_record():
    ns, br = "pdkq-abcdef-node1", "pdkqabcdefbr"
    subprocess.run(["ip", "netns", "add", ns], check=True)
    subprocess.run(["ip", "link", "add", br, "type", "bridge"], check=True)

    removed = sweep("pdkq")

    assert {ns, br} <= set(removed)
    assert ns not in netns_names() and br not in link_names()


# ------------------------------------------------------------------ ops script
@pytest.mark.slurm
@needs_cluster
def test_script_up_status_down_round_trip(cluster_workdir):
    workdir = cluster_workdir / "ops"

    def script(*args: str) -> subprocess.CompletedProcess:
        return subprocess.run([sys.executable, str(SCRIPT), *args], capture_output=True,
                              text=True, timeout=90)
    up = script("up", str(workdir), "--nodes", "2", "--prefix", "pdkc")
    try:
        assert up.returncode == 0, up.stderr
        conf = workdir / "etc" / "slurm.conf"
        assert f"export SLURM_CONF={conf}" in up.stdout
        assert script("status", str(workdir)).returncode == 0
        env = {k: v for k, v in os.environ.items() if not k.startswith("SLURM_")}
        env["SLURM_CONF"] = str(conf)
        assert sorted(slurm(env, "srun", "-N2", "hostname").split()) == ["node1", "node2"]
        record = json.loads((workdir / "cluster.json").read_text())
        supervisor = json.loads((workdir / "run" / "supervisor.json").read_text())
    finally:
        down = script("down", str(workdir))
    assert down.returncode == 0, down.stderr
    assert not proc_alive(supervisor["pid"], supervisor["start_ticks"])
    assert [p for p, t in recorded_pids(record).items() if proc_alive(p, t)] == []
    assert not set(record["netns"]) & netns_names()
    assert record["bridge"] not in link_names()
    assert script("status", str(workdir)).returncode == 1
