"""Dispatch: no-op rollouts through a real controller and real node agents over ZeroMQ,
against one Slurm job (`sbatch`) and one job step (`srun`) per rollout, in one run.

Paddock: a controller process (`python -m controller.broker`, durable queue, group commit)
and 1, 8 or 64 node agents (threads in `--agent-procs` processes, no-op runner; the total
slot count is the same for every agent count) and a trainer client in this process.
  throughput  submit `--rollouts` in one batch, iterate results until the last commits:
              committed rollouts per second
  latency     closed loop, `--latency-n` times: submit one rollout, wait for its commit:
              p50 / p99 of submit -> committed (the whole path: client, queue, dispatch,
              agent, result, commit, watch). Every farm stays up after its throughput runs
              and the probes go round the farms in turn (1, 8, 64, 8, 64, 1, ...), so each
              agent count is measured under the same background load of this shared machine
              (the idle farms' heartbeats included); the p99 ratio compares like with like.
The co-located agents send heartbeats without health sampling (it reads all of /proc; 64
agents on 2 cores would measure that, not dispatch).
Slurm, on the in-test cluster (3 nodes): the same work with fewer items
  sbatch      `--slurm-jobs` jobs `sbatch --wrap true`, submitted back to back, until all
              have left the queue: jobs per second; and submit -> gone for single jobs
  srun        `--slurm-jobs` steps `srun -N1 true`, 8 at a time: steps per second; and the
              wall time of single steps
Prints medians, p99 and the ratios (Paddock / Slurm throughput, p99 at N agents / p99 at 1),
and the CPU time per rollout of the controller, the agent processes and the client over the
throughput runs (all on the same cores); `--profile-controller PATH` runs the controller under
cProfile (stats in PATH.<agents>).

    .venv/bin/python benchmarks/dispatch.py [--rollouts 20000] [--agents 1,8,64]
                                            [--slurm-jobs 40] [--no-slurm]
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

DEP = "bench-dispatch"
TASKS = {"noop": {"task_id": "noop", "image_digest": "sha256:00"}}


def pct(xs: list[float], q: float) -> float:
    xs = sorted(xs)
    return xs[min(int(q * len(xs)), len(xs) - 1)]


def cpu_s(pid: int) -> float:
    """User + system CPU seconds of a live process (all its threads)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def ms(x: float) -> str:
    return f"{x * 1000:8.2f} ms"


# ---- agent host (a child process running many agents in threads) ----------------------------

def agent_host(endpoint: str, names: list[str], slots: int) -> int:
    import logging
    logging.basicConfig(level=logging.WARNING)
    from nodeagent.agent.daemon import NodeAgent, noop_runner
    # Health sampling is off: it reads all of /proc (~0.1-0.2 s here), which 64 agents sharing
    # 2 cores would do 64 times a second; on a cluster each node samples once for itself.
    agents = [NodeAgent(n, endpoint, DEP, slots, runner=noop_runner(), heartbeat_interval_s=1.0,
                        health=lambda n=n: {"node": n})
              for n in names]
    threads = [threading.Thread(target=a.run, daemon=True) for a in agents]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return 0


# ---- Paddock ----------------------------------------------------------------------------------

class Farm:
    def __init__(self, tmp: Path, agents: int, slots_total: int, agent_procs: int,
                 profile: str | None = None):
        self.tmp = tmp
        tmp.mkdir(parents=True)
        (tmp / "tasks.json").write_text(json.dumps(TASKS))
        ep_file = tmp / "endpoint"
        prof = ["-m", "cProfile", "-o", f"{profile}.{agents}"] if profile else []
        self.procs = [subprocess.Popen(
            [sys.executable, *prof, "-m", "controller.broker", "--deployment", DEP, "--run-dir",
             str(tmp / "run"), "--tasks-json", str(tmp / "tasks.json"), "--endpoint-file",
             str(ep_file), "--log-level", "WARNING", "--lease-ttl-s", "60"],
            cwd=ROOT, stderr=open(tmp / "controller.log", "wb"))]
        deadline = time.monotonic() + 30
        while not ep_file.exists():
            if self.procs[0].poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"controller did not start: {(tmp / 'controller.log').read_text()}")
            time.sleep(0.02)
        self.endpoint = ep_file.read_text()
        names = [f"a{i:02d}" for i in range(agents)]
        slots = max(slots_total // agents, 1)
        procs = min(agent_procs, agents)
        for k in range(procs):
            mine = names[k::procs]
            self.procs.append(subprocess.Popen(
                [sys.executable, __file__, "--agent-host", self.endpoint, "--names",
                 ",".join(mine), "--slots", str(slots)], cwd=ROOT,
                stderr=open(tmp / f"agents-{k}.log", "wb")))
        from controller.client.api import Client
        self.client = Client(self.endpoint, DEP, timeout_s=10, give_up_s=120, watch_wait_s=1.0)
        while sum(n["state"] == "live" for n in self.client.status().nodes) < agents:
            time.sleep(0.05)
        self.client.publish_policy(1, "http://127.0.0.1:9/v1", "noop")

    def throughput(self, n: int) -> float:
        t0 = time.perf_counter()
        batch = self.client.submit(["noop"], n, 1)
        got = sum(1 for _ in self.client.results(batch))
        assert got == n, (got, n)
        return n / (time.perf_counter() - t0)

    def latency(self, n: int) -> list[float]:
        out = []
        for _ in range(n):
            t0 = time.perf_counter()
            batch = self.client.submit(["noop"], 1, 1)
            assert len(self.client.wait(batch)) == 1
            out.append(time.perf_counter() - t0)
        return out

    def stop(self) -> None:
        try:
            self.client.shutdown("benchmark done")
        finally:
            self.client.close()
            for p in self.procs:
                try:
                    p.wait(timeout=10)
                except subprocess.TimeoutExpired:
                    p.kill()
                    p.wait()


def bench_paddock(args, tmp: Path) -> dict[int, dict]:
    out, farms = {}, {}
    try:
        for agents in args.agents:
            farm = farms[agents] = Farm(tmp / f"paddock-{agents}", agents, args.slots,
                                        args.agent_procs, args.profile_controller)
            farm.throughput(min(1000, args.rollouts))  # warm up
            before = [cpu_s(p.pid) for p in farm.procs] + [time.process_time()]
            rates = [farm.throughput(args.rollouts) for _ in range(args.repeats)]
            after = [cpu_s(p.pid) for p in farm.procs] + [time.process_time()]
            used = [(b - a) / (args.rollouts * args.repeats) for a, b in zip(before, after)]
            out[agents] = {"rate": statistics.median(rates), "rates": rates}
            print(f"paddock  {agents:3d} agents x {max(args.slots // agents, 1):2d} slots: "
                  f"{out[agents]['rate']:9.0f} rollouts/s (runs "
                  f"{', '.join(f'{r:.0f}' for r in rates)})\n         cpu per rollout: "
                  f"controller {used[0] * 1e6:.0f} us, agents {sum(used[1:-1]) * 1e6:.0f} us, "
                  f"client {used[-1] * 1e6:.0f} us", flush=True)
        lat: dict[int, list[float]] = {a: [] for a in farms}
        order = list(farms)
        for i in range(args.latency_n):  # one probe per farm per round, the order rotating
            for agents in order[i % len(order):] + order[:i % len(order)]:
                lat[agents] += farms[agents].latency(1)
    finally:
        for farm in farms.values():
            farm.stop()
    for agents, xs in lat.items():
        out[agents].update(p50=pct(xs, 0.5), p99=pct(xs, 0.99))
        print(f"paddock  {agents:3d} agents: submit->commit p50 {ms(out[agents]['p50'])}  "
              f"p99 {ms(out[agents]['p99'])}  ({len(xs)} probes, interleaved)", flush=True)
    return out


# ---- Slurm ------------------------------------------------------------------------------------

def bench_slurm(args, tmp: Path) -> dict:
    from slurm.testcluster import TestCluster, missing_requirements
    missing = missing_requirements()
    if missing:
        print("slurm: skipped, in-test cluster unavailable: " + "; ".join(missing))
        return {}
    wd = tmp / "slurm"
    wd.mkdir()
    with TestCluster(wd, nodes=3, name_prefix="pdkbd") as cluster:
        env = cluster.env

        def queue_empty() -> bool:
            r = subprocess.run(["squeue", "-h", "-o", "%i"], env=env, capture_output=True,
                               text=True)
            return r.returncode == 0 and not r.stdout.strip()

        def sbatch() -> None:
            subprocess.run(["sbatch", "--parsable", "-o", "/dev/null", "-N1", "--wrap", "true"],
                           env=env, check=True, capture_output=True, cwd=wd)

        def wait_empty() -> None:
            while not queue_empty():
                time.sleep(0.02)

        def srun() -> None:
            subprocess.run(["srun", "-N1", "true"], env=env, check=True, capture_output=True,
                           cwd=wd)

        # throughput: back-to-back submissions, until every job has left the queue
        t0 = time.perf_counter()
        for _ in range(args.slurm_jobs):
            sbatch()
        wait_empty()
        sbatch_rate = args.slurm_jobs / (time.perf_counter() - t0)
        sbatch_lat = []
        for _ in range(args.slurm_latency_n):
            t = time.perf_counter()
            sbatch()
            wait_empty()
            sbatch_lat.append(time.perf_counter() - t)
        t0 = time.perf_counter()
        with ThreadPoolExecutor(8) as pool:
            list(pool.map(lambda _: srun(), range(args.slurm_jobs)))
        srun_rate = args.slurm_jobs / (time.perf_counter() - t0)
        srun_lat = []
        for _ in range(args.slurm_latency_n):
            t = time.perf_counter()
            srun()
            srun_lat.append(time.perf_counter() - t)
    res = {"sbatch": {"rate": sbatch_rate, "p50": pct(sbatch_lat, 0.5), "p99": pct(sbatch_lat, 0.99)},
           "srun": {"rate": srun_rate, "p50": pct(srun_lat, 0.5), "p99": pct(srun_lat, 0.99)}}
    for kind, r in res.items():
        print(f"slurm    {kind:6s} per rollout ({args.slurm_jobs} items): {r['rate']:9.1f} "
              f"rollouts/s  submit->done p50 {ms(r['p50'])}  p99 {ms(r['p99'])}", flush=True)
    return res


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--rollouts", type=int, default=20000)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--agents", default="1,8,64")
    ap.add_argument("--slots", type=int, default=64, help="total slots, split over the agents")
    ap.add_argument("--agent-procs", type=int, default=2)
    ap.add_argument("--latency-n", type=int, default=2000,
                    help="probes per agent count (a p99 of 500 is their 5th largest: one stall of this shared machine moves it)")
    ap.add_argument("--slurm-jobs", type=int, default=40)
    ap.add_argument("--slurm-latency-n", type=int, default=10)
    ap.add_argument("--no-slurm", action="store_true")
    ap.add_argument("--profile-controller", metavar="PATH",
                    help="run the controller under cProfile, stats to PATH.<agents>")
    ap.add_argument("--agent-host", help=argparse.SUPPRESS)
    ap.add_argument("--names", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.agent_host:
        return agent_host(args.agent_host, args.names.split(","), args.slots)
    args.agents = [int(a) for a in args.agents.split(",")]
    tmp = Path(tempfile.mkdtemp(prefix="paddock-bench-dispatch-"))
    try:
        print(f"dispatch benchmark: {os.cpu_count()} CPUs, {args.rollouts} no-op rollouts per "
              f"run, {args.slots} slots in total", flush=True)
        pad = bench_paddock(args, tmp)
        slurm = {} if args.no_slurm else bench_slurm(args, tmp)
        print("\nratios")
        best = max(r["rate"] for r in pad.values())
        for kind, r in slurm.items():
            print(f"  paddock throughput / {kind} per rollout: {best / r['rate']:10.0f}x")
            print(f"  {kind} p50 latency / paddock p50 (1 agent): "
                  f"{r['p50'] / pad[min(pad)]['p50']:10.0f}x")
        base = pad[min(pad)]["p99"]
        for agents, r in pad.items():
            print(f"  p99 latency at {agents:3d} agents / at {min(pad)}: {r['p99'] / base:6.2f}x")
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
