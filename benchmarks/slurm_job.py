"""A Paddock farm as a Slurm job, against the bare heterogeneous job it is built on.

On a fresh in-test cluster (3 nodes in their own network and UTS namespaces), in one run:
  reference  `sbatch` of a heterogeneous job (1 node + 2 nodes) whose steps run `true`
  Paddock    `sbatch` of the rendered het batch script: head (controller + policy + trainer)
             on one node, node agents on two, one policy version over --tasks built-in tasks
Per job: submit -> controller endpoint published (Paddock only), submit -> first rollout
committed (Paddock only), submit -> job COMPLETED (both, polled with scontrol every 50 ms).
Prints medians, p99 and the Paddock/reference ratio of the submit -> COMPLETED time.

`--farm`: hundreds of concurrent no-op sandboxes on the 3 nodes. A controller on this host
(bound to the cluster's bridge, CURVE with the run's keys), one node agent per node started by
`srun -N3 --ntasks-per-node=1` (a Slurm job step; each agent in its node's network and UTS
namespace), each agent with `--slots` slots whose attempts run in real native sandboxes of the
built-in busybox image: create, exec `sleep --hold-s`, destroy (no harness, no model). The
trainer client here submits `--rollouts` at once. Prints the controller's CPU (per rollout and
in cores over the run), the peak of concurrent sandboxes, and p50/p99 of each stage of a
rollout: queued (submit -> leased, from the queue's rows: waiting for a free slot when more are
submitted than there are slots), lease -> the attempt starts on its node, create, exec, destroy,
result -> committed (the attempt ends -> the queue commits it), committed -> the trainer sees
it, and submit -> the trainer sees it. Runs as root, as the in-test cluster does; each node's
sandboxes take a third of the `paddock` user's subordinate ids (slices of 128: up to 169 slots
a node).

    .venv/bin/python benchmarks/slurm_job.py [--runs 3] [--tasks 4]
    .venv/bin/python benchmarks/slurm_job.py --farm [--slots 100] [--rollouts 600] [--hold-s 2]
"""
from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import sqlite3
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from slurm.sbatch import render  # noqa: E402
from slurm.testcluster import TestCluster  # noqa: E402

REFERENCE = """#!/bin/bash
#SBATCH --time=10
#SBATCH --nodes=1 --ntasks=1
#SBATCH hetjob
#SBATCH --nodes=2 --ntasks-per-node=1
srun --het-group=0 true &
srun --het-group=1 --ntasks-per-node=1 true &
wait
"""


def job_state(env: dict, job_id: str) -> str:
    out = subprocess.run(["scontrol", "show", "job", "-o", job_id], env=env, capture_output=True,
                         text=True).stdout
    states = re.findall(r"JobState=(\S+)", out)
    return states[0] if states and len(set(states)) == 1 else "MIXED"


def run_job(env: dict, script: Path, out: Path, run_dir: Path | None) -> dict:
    t0 = time.monotonic()
    job_id = subprocess.run(["sbatch", "--parsable", "-o", str(out), str(script)], env=env,
                            capture_output=True, text=True, check=True).stdout.strip().split(";")[0]
    marks: dict[str, float] = {}
    while True:
        now = time.monotonic() - t0
        if run_dir is not None:
            if "endpoint" not in marks and (run_dir / "controller.endpoint").exists():
                marks["endpoint"] = now
            if "first_commit" not in marks and (run_dir / "controller.db").exists():
                try:
                    con = sqlite3.connect(f"file:{run_dir / 'controller.db'}?mode=ro", uri=True)
                    if con.execute("SELECT count(*) FROM rollouts WHERE state='committed'").fetchone()[0]:
                        marks["first_commit"] = now
                    con.close()
                except sqlite3.Error:
                    pass
        state = job_state(env, job_id)
        if state in ("COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "NODE_FAIL"):
            if state != "COMPLETED":
                raise SystemExit(f"job {job_id} ended {state}; see {out}")
            marks["completed"] = now
            return marks
        if now > 300:
            raise SystemExit(f"job {job_id} not done after 300 s")
        time.sleep(0.05)


def pct(xs: list[float], q: float) -> float:
    xs = sorted(xs)
    return xs[min(int(round(q * (len(xs) - 1))), len(xs) - 1)]


# ---- --farm: no-op sandboxes on three nodes --------------------------------------------------

DEP = "bench-slurm-farm"


def farm_agent(endpoint: str, key_file: str, slots: int, hold_s: float, log_dir: str) -> int:
    """One node agent (run by srun on each node): attempts in native sandboxes, each one's
    stage times appended to LOG_DIR/<node>.jsonl."""
    import logging
    import socket
    import threading

    from controller.ondisk.keys import read_key_file
    from layers.builtin import default_store_root, ensure_busybox_image
    from layers.store import ImageStore
    from nodeagent.agent.core import AttemptResult
    from nodeagent.agent.daemon import NodeAgent
    from nodeagent.sandbox.runtime import SandboxRuntime, SandboxSpec
    logging.basicConfig(level=logging.WARNING)
    node = socket.gethostname()
    k = int(os.environ.get("SLURM_NODEID", "0"))
    _, image = ensure_busybox_image(ImageStore(default_store_root()))
    spec = SandboxSpec(image=image, limits={"memory_mb": 64, "pids": 16, "cpu": 1.0, "disk_mb": 16})
    # each node its own part of the `paddock` subordinate range (on a cluster: its own host)
    per_node = 65536 // 3
    rt = SandboxRuntime(subids=(100000 + k * per_node, per_node), slice_size=128,
                        run_root=f"{log_dir}/state-{node}").start()
    lock, log = threading.Lock(), open(f"{log_dir}/{node}.jsonl", "a")

    def run(a) -> AttemptResult:
        t0 = time.time()
        sb = rt.create(spec)
        t1 = time.time()
        sb.exec(["sleep", str(hold_s)], timeout_s=hold_s + 30)
        t2 = time.time()
        sb.destroy()
        t3 = time.time()
        with lock:
            log.write(json.dumps({"rollout": a.rollout_id, "node": node, "start": t0, "created": t1,
                                  "execd": t2, "destroyed": t3}) + "\n")
            log.flush()
        return AttemptResult("pass", 1.0, {}, None)
    agent = NodeAgent(node, endpoint, DEP, slots, runner=run, heartbeat_interval_s=1.0,
                      keys=read_key_file(key_file), give_up_s=120)
    try:
        return agent.run()
    finally:
        rt.close()


def proc_cpu_s(pid: int) -> dict[str, float]:
    """CPU seconds of a live process, by thread name (the main thread is "python")."""
    out: dict[str, float] = {}
    for task in Path(f"/proc/{pid}/task").iterdir():
        try:
            name = (task / "comm").read_text().strip()
            fields = (task / "stat").read_text().rsplit(")", 1)[1].split()
        except OSError:  # the thread ended
            continue
        out[name] = out.get(name, 0.0) + (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
    return out


def farm(a) -> int:
    from controller.client.api import Client
    work = Path(tempfile.mkdtemp(prefix="paddock-bench-farm-"))
    os.chmod(work, 0o755)
    tasks = work / "tasks.json"
    tasks.write_text(json.dumps({"noop": {"task_id": "noop", "image_digest": "sha256:00"}}))
    run_dir, logs, ep_file = work / "run", work / "logs", work / "endpoint"
    logs.mkdir()
    with TestCluster(work / "cluster", nodes=3, name_prefix="pdkbf") as cluster:
        prof = ["-m", "cProfile", "-o", a.profile_controller] if a.profile_controller else []
        ctl = subprocess.Popen(
            [sys.executable, *prof, "-m", "controller.broker", "--deployment", DEP, "--run-dir",
             str(run_dir), "--tasks-json", str(tasks), "--endpoint-file", str(ep_file),
             "--bind", f"tcp://{cluster.controller_addr}:0", "--log-level", "WARNING",
             "--lease-ttl-s", "120"], stderr=open(work / "controller.log", "wb"),
            cwd=Path(__file__).resolve().parents[1])
        agents = None
        try:
            while not ep_file.exists():
                if ctl.poll() is not None:
                    raise SystemExit((work / "controller.log").read_text())
                time.sleep(0.05)
            endpoint, key_file = ep_file.read_text(), str(run_dir / "controller.key")
            agents = subprocess.Popen(
                ["srun", "-N3", "--ntasks-per-node=1", sys.executable,
                 str(Path(__file__).resolve()), "--farm-agent", endpoint, "--key-file", key_file,
                 "--slots", str(a.slots), "--hold-s", str(a.hold_s), "--log-dir", str(logs)],
                env=cluster.env, cwd=work, stdout=open(work / "agents.log", "wb"),
                stderr=subprocess.STDOUT)
            client = Client(endpoint, DEP, timeout_s=10, give_up_s=120, watch_wait_s=1.0,
                            key_file=key_file)
            deadline = time.monotonic() + 120
            while sum(n["state"] == "live" for n in client.status().nodes) < 3:
                if agents.poll() is not None or time.monotonic() > deadline:
                    raise SystemExit("agents did not register: " + (work / "agents.log").read_text())
                time.sleep(0.1)
            client.publish_policy(1, "http://127.0.0.1:9/v1", "noop")
            # warm-up (not measured): the image mounted on each node, the catalog open (keys
            # committed before it is are held back until it is: pyarrow's import)
            client.wait(client.submit(["noop"], 6, 1))
            # ... and its rows in the catalog (the first write imports pyarrow's compute)
            while not (run_dir / "catalog" / "commit-000000.parquet").exists():
                time.sleep(0.05)
            cpu0, t0 = proc_cpu_s(ctl.pid), time.time()
            batch = client.submit(["noop"], a.rollouts, 1)
            committed = {}
            for r in client.results(batch):
                committed[r["rollout_id"]] = time.time()
            wall, cpu1 = time.time() - t0, proc_cpu_s(ctl.pid)
            threads = {k: v - cpu0.get(k, 0.0) for k, v in cpu1.items()}
            cpu = sum(threads.values())
            client.shutdown("benchmark done")
            client.close()
            agents.wait(timeout=60)
        finally:
            if agents is not None and agents.poll() is None:
                agents.kill()
            if ctl.poll() is None:
                ctl.kill()
            ctl.wait()
    rows = [json.loads(line) for f in logs.glob("*.jsonl") for line in f.read_text().splitlines()]
    rows = [r for r in rows if r["rollout"] in committed]  # (not the warm-up's)
    events = sorted([(r["start"], 1) for r in rows] + [(r["destroyed"], -1) for r in rows])
    live = peak = 0
    for _, d in events:
        live += d
        peak = max(peak, live)
    con = sqlite3.connect(f"file:{run_dir / 'controller.db'}?mode=ro", uri=True)
    db = {rid: (leased, done) for rid, leased, done in con.execute(
        "SELECT rollout_id, leased_at, updated_at FROM rollouts WHERE state = 'committed'")}
    con.close()
    rows = [r for r in rows if r["rollout"] in db]
    stages = {"queued (no free slot)": [db[r["rollout"]][0] - t0 for r in rows],
              "lease -> node starts": [r["start"] - db[r["rollout"]][0] for r in rows],
              "create": [r["created"] - r["start"] for r in rows],
              f"exec (sleep {a.hold_s:g})": [r["execd"] - r["created"] for r in rows],
              "destroy": [r["destroyed"] - r["execd"] for r in rows],
              "result -> committed": [db[r["rollout"]][1] - r["destroyed"] for r in rows],
              "committed -> trainer": [committed[r["rollout"]] - db[r["rollout"]][1] for r in rows],
              "submit -> trainer": [committed[r["rollout"]] - t0 for r in rows]}
    per_node = {n: sum(r["node"] == n for r in rows) for n in sorted({r["node"] for r in rows})}
    print(f"farm: 3 nodes x {a.slots} slots, {len(committed)} of {a.rollouts} rollouts committed "
          f"in {wall:.1f} s ({per_node}); peak {peak} concurrent sandboxes; load average "
          f"{os.getloadavg()[0]:.1f} on {os.cpu_count()} CPUs")
    print(f"controller CPU: {cpu:.2f} s = {cpu / max(len(committed), 1) * 1e3:.2f} ms per rollout, "
          f"{cpu / wall:.3f} cores over the run (by thread: " + ", ".join(
              f"{k} {v:.2f} s" for k, v in sorted(threads.items(), key=lambda kv: -kv[1]) if v > 0) + ")")
    print(f"{'stage':22} {'p50 ms':>9} {'p99 ms':>9} {'p99/p50':>8}   (wall clock of one host)")
    for name, xs in stages.items():
        p50, p99 = statistics.median(xs), pct(xs, 0.99)
        print(f"{name:22} {p50 * 1e3:9.1f} {p99 * 1e3:9.1f} {p99 / p50:8.2f}")
    if a.keep:
        print(f"work dir kept: {work}")
    else:
        shutil.rmtree(work, ignore_errors=True)
    return 0


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--tasks", type=int, default=4)
    ap.add_argument("--farm", action="store_true", help="no-op sandboxes on 3 nodes (see above)")
    ap.add_argument("--slots", type=int, default=100, help="--farm: slots per node")
    ap.add_argument("--rollouts", type=int, default=600, help="--farm: rollouts submitted at once")
    ap.add_argument("--hold-s", type=float, default=2.0, help="--farm: each sandbox sleeps this long")
    ap.add_argument("--keep", action="store_true", help="--farm: keep the work directory")
    ap.add_argument("--profile-controller", metavar="PATH", help="--farm: cProfile stats of the controller")
    ap.add_argument("--farm-agent", help=argparse.SUPPRESS)
    ap.add_argument("--key-file", help=argparse.SUPPRESS)
    ap.add_argument("--log-dir", help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.farm_agent:
        return farm_agent(a.farm_agent, a.key_file, a.slots, a.hold_s, a.log_dir)
    if a.farm:
        return farm(a)
    work = Path(tempfile.mkdtemp(prefix="paddock-bench-job-"))
    results: dict[str, list[dict]] = {"reference": [], "paddock": []}
    with TestCluster(work / "cluster", nodes=3, name_prefix="pdkb") as cluster:
        ref = work / "reference.sh"
        ref.write_text(REFERENCE)
        for i in range(a.runs):
            results["reference"].append(run_job(cluster.env, ref, work / f"ref-{i}.out", None))
            run_dir = work / f"run-{i}"
            script = work / f"paddock-{i}.sh"
            script.write_text(render(dict(run_dir=str(run_dir), env_nodes=2, time_limit="10", versions=1,
                                          tasks_limit=a.tasks, python=sys.executable, heartbeat_interval_s=0.5,
                                          controller_wait_s=120, agents_wait_s=120, signal_before_s=60)))
            results["paddock"].append(run_job(cluster.env, script, work / f"paddock-{i}.out", run_dir))
    print(f"{a.runs} runs each; Paddock: one policy version over {a.tasks} tasks on 2 agents (2 slots each)")
    print(f"{'job':10} {'mark':14} {'median s':>9} {'p99 s':>7}")
    for kind, rows in results.items():
        for mark in ("endpoint", "first_commit", "completed"):
            xs = [r[mark] for r in rows if mark in r]
            if xs:
                print(f"{kind:10} {mark:14} {statistics.median(xs):9.2f} {pct(xs, 0.99):7.2f}")
    ref_c = statistics.median(r["completed"] for r in results["reference"])
    pad_c = statistics.median(r["completed"] for r in results["paddock"])
    print(f"ratio paddock/reference (submit -> COMPLETED, medians): {pad_c / ref_c:.2f}x "
          f"(+{pad_c - ref_c:.2f} s for the farm's start, {a.tasks} rollouts and its clean stop)")
    print(f"work dir kept: {work}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
