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
Every Paddock farm runs twice side by side, with CURVE (the default control plane: the run's
keys, encrypted and authenticated) and with `--insecure` (plain text); `--curve on|off` runs
one mode only. `--baseline TREE` runs every farm a second time with its controller from
another source tree (a checkout of main: before and after a change in one run). All farms
are up before the first throughput run, the runs go round them in turn and the latency
probes interleave them, so every farm is measured under the same load of this shared
machine (the idle farms' heartbeats included); the load average is printed as it goes.
Prints medians, p99 and the ratios (Paddock / Slurm throughput, p99 at N agents / p99 at 1,
CURVE / plain throughput and p50 at each agent count, many small agents / fewer big ones,
this tree / the baseline), the CPU time per rollout of the controller (its loop, and
ZeroMQ's threads: CURVE and the sockets), the agent processes and the client over the
throughput runs (all on the same cores), and their CPU per second once the farms are idle
(`--idle-s`: what the agents' count costs by itself); `--profile-controller PATH` runs the
controller under cProfile with a thread-time clock (stats in PATH.<agents>, the baseline's in
PATH.<tree>.<agents>). `--prefetch 0,2` runs every farm once per value, its agents taking
that many leases beyond their slots (docs/protocol.md "Prefetch"; a --baseline controller
runs only the farms without it, an older one refuses the field), all side by side; the
ratios are printed per value and between each value and 0.

Which CPU figure compares many small agents with few big ones: the CONTROLLER's per rollout.
On a cluster every agent runs on its own node: its CPU is that node's, spent whatever the
farm's size, while the controller's is the one shared by the whole farm, the share that grows
with the number of agents. Here 64 agents are threads packed 32 to a process on the same 2
cores as the controller: their CPU per rollout carries the co-location (the interpreter
lock passed among 32 threads: futex calls, switches), which a node does not pay, and the
throughput of this machine is shared between them and the controller. Both are printed (the
agents' figure and all processes' too), so the co-location's share stays in view.

    .venv/bin/python benchmarks/dispatch.py [--rollouts 20000] [--agents 1,8,64]
                                            [--curve both|on|off] [--slurm-jobs 40] [--no-slurm]
                                            [--baseline ../main] [--prefetch 0,2]
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

def agent_host(endpoint: str, names: list[str], slots: int, key_file: str | None,
               prefetch: int = 0) -> int:
    """Agents in threads; with the run's keys from `key_file`, or plain text (None)."""
    import logging
    logging.basicConfig(level=logging.WARNING)
    from controller.ondisk.keys import read_key_file
    from nodeagent.agent.daemon import NodeAgent, noop_runner
    keys = read_key_file(key_file) if key_file else None
    # Health sampling is off: it reads all of /proc (~0.1-0.2 s here), which 64 agents sharing
    # 2 cores would do 64 times a second; on a cluster each node samples once for itself.
    agents = [NodeAgent(n, endpoint, DEP, slots, runner=noop_runner(), heartbeat_interval_s=1.0,
                        health=lambda n=n: {"node": n}, keys=keys, insecure=keys is None,
                        prefetch=prefetch)
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
                 profile: str | None = None, curve: bool = True, root: Path = ROOT,
                 prefetch: int = 0):
        """`root`: the source tree the controller runs from (the agents and the client run
        from this one's)."""
        self.tmp = tmp
        key_file = str(tmp / "run" / "controller.key") if curve else None
        plain = [] if curve else ["--insecure"]
        tmp.mkdir(parents=True)
        (tmp / "tasks.json").write_text(json.dumps(TASKS))
        ep_file = tmp / "endpoint"
        # cProfile with a thread-time clock: the loop's own CPU, not the time it waited for it
        prof = ["-c", PROFILED, f"{profile}.{agents}"] if profile else ["-m", "controller.broker"]
        self.procs = [subprocess.Popen(
            [sys.executable, *prof, "--deployment", DEP, "--run-dir",
             str(tmp / "run"), "--tasks-json", str(tmp / "tasks.json"), "--endpoint-file",
             str(ep_file), "--log-level", "WARNING", "--lease-ttl-s", "60", *plain],
            cwd=root, env={**os.environ, "PYTHONPATH": str(root)},
            stderr=open(tmp / "controller.log", "wb"))]
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
                 ",".join(mine), "--slots", str(slots), "--prefetch", str(prefetch),
                 *(["--key-file", key_file] if curve else [])], cwd=ROOT,
                env={**os.environ, "PYTHONPATH": str(ROOT)}, stderr=open(tmp / f"agents-{k}.log", "wb")))
        from controller.client.api import Client
        self.client = Client(self.endpoint, DEP, timeout_s=10, give_up_s=120, watch_wait_s=1.0,
                             key_file=key_file, insecure=not curve)
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


PROFILED = """import cProfile, runpy, sys, time
out = sys.argv.pop(1)
prof = cProfile.Profile(time.thread_time)
prof.enable()
try:
    runpy.run_module("controller.broker", run_name="__main__")
finally:
    prof.disable()
    prof.dump_stats(out)
"""
MODES = {"on": (True,), "off": (False,), "both": (True, False)}
# (code tree: "" this one, else --baseline's name; CURVE; agents; prefetch)
Key = tuple[str, bool, int, int]


def label(key: Key) -> str:
    return (f"{key[0] + ' ' if key[0] else ''}{key[2]:3d} agents {'curve' if key[1] else 'plain'}"
            f"{f' prefetch {key[3]}' if key[3] else ''}")


def controller_threads_s(pid: int) -> tuple[float, float]:
    """CPU seconds of a process's main thread (the broker's loop) and of its other threads
    (ZeroMQ's I/O thread: CURVE and the sockets' syscalls; the ZAP handler; the catalog)."""
    main = other = 0.0
    for task in Path(f"/proc/{pid}/task").iterdir():
        fields = (task / "stat").read_text().rsplit(")", 1)[1].split()
        cpu = (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
        if int(task.name) == pid:
            main += cpu
        else:
            other += cpu
    return main, other


def load() -> str:
    return "load average " + " ".join(Path("/proc/loadavg").read_text().split()[:3])


def bench_paddock(args, tmp: Path) -> dict[Key, dict]:
    """Throughput then interleaved latency of every (code tree, CURVE or plain, agent count)
    farm: every farm is up before the first run, and the runs go round the farms in turn
    (repeat r starts at farm r), so each is measured under the same background load."""
    out: dict[Key, dict] = {}
    farms: dict[Key, Farm] = {}
    trees = [("", ROOT)] + ([(args.baseline.name or "baseline", args.baseline)]
                            if args.baseline else [])
    try:
        for agents in args.agents:
            for tree, root in trees:
                for curve in MODES[args.curve]:
                    for pf in args.prefetch if not tree else [0]:  # an older controller: none
                        key = (tree, curve, agents, pf)
                        prof = args.profile_controller and (
                            f"{args.profile_controller}{'.' + tree if tree else ''}{f'.pf{pf}' if pf else ''}")
                        farms[key] = Farm(tmp / f"paddock-{tree or 'this'}-{agents}-{'curve' if curve else 'plain'}-pf{pf}",
                                          agents, args.slots, args.agent_procs, prof, curve, root, pf)
                        farms[key].throughput(min(1000, args.rollouts))  # warm up
        print(f"farms up ({len(farms)}), {load()}", flush=True)
        order = list(farms)
        rates: dict[Key, list[float]] = {k: [] for k in order}
        used = {k: [0.0] * (len(farms[k].procs) + 3) for k in order}
        frames = {k: [0.0, 0.0] for k in order}  # the controller's frames in, out per rollout
        for r in range(args.repeats):
            for key in order[r % len(order):] + order[:r % len(order)]:
                farm = farms[key]
                pid = farm.procs[0].pid
                before = [cpu_s(p.pid) for p in farm.procs] + [time.process_time(),
                                                               *controller_threads_s(pid)]
                seen = farm.client.status().counters
                rates[key].append(farm.throughput(args.rollouts))
                after = [cpu_s(p.pid) for p in farm.procs] + [time.process_time(),
                                                              *controller_threads_s(pid)]
                now_seen = farm.client.status().counters
                for i, name in enumerate(("frames_in", "frames_out")):
                    frames[key][i] += (now_seen[name] - seen[name]) / (args.rollouts * args.repeats)
                used[key] = [u + (b - a) / (args.rollouts * args.repeats)
                             for u, a, b in zip(used[key], before, after)]
        print(f"throughput runs done, {load()}", flush=True)
        # every farm with nothing to do, over the same seconds: heartbeats and timers only
        before_idle = {k: [cpu_s(p.pid) for p in farms[k].procs] for k in order}
        t0 = time.perf_counter()
        time.sleep(args.idle_s)
        idle = {k: [(cpu_s(p.pid) - b) / (time.perf_counter() - t0)
                    for p, b in zip(farms[k].procs, before_idle[k])] for k in order}
        for key in order:
            u = used[key]
            agents_u, client_u, loop_u, threads_u = sum(u[1:-3]), u[-3], u[-2], u[-1]
            out[key] = {"rate": statistics.median(rates[key]), "rates": rates[key],
                        "cpu_controller": u[0], "cpu_agents": agents_u, "cpu_total": sum(u[:-2]),
                        "cpu_loop": loop_u, "cpu_io": threads_u}
            print(f"paddock  {label(key)} x {max(args.slots // key[2], 1):2d} slots: "
                  f"{out[key]['rate']:9.0f} rollouts/s (runs "
                  f"{', '.join(f'{r:.0f}' for r in rates[key])})\n         cpu per rollout: "
                  f"controller {u[0] * 1e6:.0f} us (its loop {loop_u * 1e6:.0f}, ZeroMQ and "
                  f"other threads {threads_u * 1e6:.0f}), agents {agents_u * 1e6:.0f} us, "
                  f"client {client_u * 1e6:.0f} us; controller frames per rollout: in "
                  f"{frames[key][0]:.2f}, out {frames[key][1]:.2f}\n         idle ({args.idle_s:g} s, every farm "
                  f"at once): controller {idle[key][0] * 1e3:.1f} ms/s, agents "
                  f"{sum(idle[key][1:]) * 1e3:.1f} ms/s", flush=True)
        lat: dict[Key, list[float]] = {k: [] for k in farms}
        for i in range(args.latency_n):  # one probe per farm per round, the order rotating
            for key in order[i % len(order):] + order[:i % len(order)]:
                lat[key] += farms[key].latency(1)
    finally:
        for farm in farms.values():
            farm.stop()
    for key, xs in lat.items():
        out[key].update(p50=pct(xs, 0.5), p99=pct(xs, 0.99))
        print(f"paddock  {label(key)}: submit->commit p50 {ms(out[key]['p50'])}  "
              f"p99 {ms(out[key]['p99'])}  ({len(xs)} probes, interleaved)", flush=True)
    print(f"done, {load()}", flush=True)
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


def x(a: float, b: float) -> str:
    """a / b as a ratio ("n/a" when b is 0: CPU counted in clock ticks, a short run may have none)."""
    return f"{a / b:.2f}x" if b else "n/a"


def print_ratios(pad: dict[Key, dict], slurm: dict) -> None:
    print("\nratios")
    mode = max(k[1] for k in pad)  # CURVE's figures when it ran (the default control plane)
    for tree, pf in dict.fromkeys((k[0], k[3]) for k in pad):
        mine = {k[2]: r for k, r in pad.items() if k[1] == mode and k[0] == tree and k[3] == pf}
        name = (f"[{tree or 'this tree'}] " if len({k[0] for k in pad}) > 1 else "") + \
            (f"[prefetch {pf}] " if len({k[3] for k in pad}) > 1 else "")
        best, first = max(r["rate"] for r in mine.values()), mine[min(mine)]
        for kind, r in slurm.items():
            if not tree and not pf:
                print(f"  paddock throughput / {kind} per rollout: {best / r['rate']:10.0f}x")
                print(f"  {kind} p50 latency / paddock p50 ({min(mine)} agents): {r['p50'] / first['p50']:10.0f}x")
        for agents, r in mine.items():
            print(f"  {name}p99 latency at {agents:3d} agents / at {min(mine)}: {r['p99'] / first['p99']:6.2f}x")
        small, big = max(mine), sorted(mine)[-2] if len(mine) > 1 else None
        if big is not None:  # many small agents against fewer big ones (the same slots in all)
            s, b = mine[small], mine[big]
            goal = (" (goal >= 0.77)", " (goal <= 1.5)") if (small, big) == (64, 8) else ("", "")
            print(f"  {name}{small} agents / {big} agents (same slots in all): throughput "
                  f"{x(s['rate'], b['rate'])}{goal[0]}, CPU per rollout of the controller "
                  f"{x(s['cpu_controller'], b['cpu_controller'])}{goal[1]} (its loop "
                  f"{x(s['cpu_loop'], b['cpu_loop'])}, ZeroMQ's threads "
                  f"{x(s['cpu_io'], b['cpu_io'])}); co-located agents "
                  f"{x(s['cpu_agents'], b['cpu_agents'])}, all processes "
                  f"{x(s['cpu_total'], b['cpu_total'])}")
        for agents in sorted({k[2] for k in pad if k[0] == tree}):
            if (tree, True, agents, pf) in pad and (tree, False, agents, pf) in pad:
                on, off = pad[(tree, True, agents, pf)], pad[(tree, False, agents, pf)]
                print(f"  {name}CURVE / plain at {agents:3d} agents: throughput {on['rate'] / off['rate']:5.3f}x "
                      f"(costs {100 * (1 - on['rate'] / off['rate']):.1f}% of it), p50 latency "
                      f"{on['p50'] / off['p50']:5.3f}x")
    counts = sorted({k[2] for k in pad})  # the most agents (the smallest) against the next
    small, big = counts[-1], counts[-2] if len(counts) > 1 else None
    for key, r in pad.items():  # each prefetch against none, farm by farm; the small farm's
        # prefetch against the big farm without it (today's big farm: the goal's reference)
        if key[0] == "" and key[3] and ("", key[1], key[2], 0) in pad:
            b = pad[("", key[1], key[2], 0)]
            print(f"  prefetch {key[3]} / 0 at {label(key[:3] + (0,))}: throughput "
                  f"{x(r['rate'], b['rate'])}, controller CPU per rollout "
                  f"{x(r['cpu_controller'], b['cpu_controller'])}")
            if key[2] == small and ("", key[1], big, 0) in pad:
                b = pad[("", key[1], big, 0)]
                print(f"  {small} agents prefetch {key[3]} / {big} agents prefetch 0 "
                      f"({'curve' if key[1] else 'plain'}): throughput {x(r['rate'], b['rate'])}, "
                      f"controller CPU per rollout {x(r['cpu_controller'], b['cpu_controller'])}")
    trees = list(dict.fromkeys(k[0] for k in pad))
    if len(trees) > 1:  # this tree against the baseline, farm by farm
        for key, r in pad.items():
            if key[0] == "" and (trees[1], key[1], key[2], key[3]) in pad:
                b = pad[(trees[1], key[1], key[2], key[3])]
                print(f"  this tree / {trees[1]} at {label(key)}: throughput {x(r['rate'], b['rate'])}, "
                      f"controller CPU per rollout {x(r['cpu_controller'], b['cpu_controller'])}")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--rollouts", type=int, default=20000)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--agents", default="1,8,64")
    ap.add_argument("--slots", type=int, default=64, help="total slots, split over the agents")
    ap.add_argument("--agent-procs", type=int, default=2)
    ap.add_argument("--latency-n", type=int, default=2000,
                    help="probes per agent count (a p99 of 500 is their 5th largest: one stall of this shared machine moves it)")
    ap.add_argument("--idle-s", type=float, default=3.0,
                    help="CPU of each farm left idle this long (heartbeats, timers) after its runs")
    ap.add_argument("--slurm-jobs", type=int, default=40)
    ap.add_argument("--slurm-latency-n", type=int, default=10)
    ap.add_argument("--no-slurm", action="store_true")
    ap.add_argument("--profile-controller", metavar="PATH",
                    help="run the controller under cProfile, stats to PATH.<agents>")
    ap.add_argument("--curve", choices=sorted(MODES), default="both",
                    help="CURVE on, off (--insecure) or both side by side (default)")
    ap.add_argument("--baseline", type=Path, metavar="TREE",
                    help="also run every farm's controller from this source tree (e.g. a "
                         "checkout of main), the runs interleaved with this tree's")
    ap.add_argument("--prefetch", default="0",
                    help="leases each agent takes beyond its slots; a comma list runs every "
                         "farm once per value, side by side (default 0)")
    ap.add_argument("--agent-host", help=argparse.SUPPRESS)
    ap.add_argument("--names", help=argparse.SUPPRESS)
    ap.add_argument("--key-file", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.agent_host:
        return agent_host(args.agent_host, args.names.split(","), args.slots, args.key_file,
                          int(args.prefetch))
    args.agents = [int(a) for a in args.agents.split(",")]
    args.prefetch = [int(p) for p in args.prefetch.split(",")]
    if any(p < 0 for p in args.prefetch):
        ap.error(f"--prefetch: values must be >= 0, got {args.prefetch}")
    tmp = Path(tempfile.mkdtemp(prefix="paddock-bench-dispatch-"))
    try:
        print(f"dispatch benchmark: {os.cpu_count()} CPUs, {args.rollouts} no-op rollouts per "
              f"run, {args.slots} slots in total", flush=True)
        pad = bench_paddock(args, tmp)
        slurm = {} if args.no_slurm else bench_slurm(args, tmp)
        print_ratios(pad, slurm)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
