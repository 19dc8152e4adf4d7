"""Density of the conversational family: N concurrent rollouts' mock services and simulated
users on one node, each service in its own rollout sandbox.

Holds N sandboxes of the built-in python image (id slices of --slice, as benchmarks/density.py,
so N fit in one subuid range), gives each a `ServiceHost` (its services' engine and specs
written into the sandbox, the state on the node) over the built-in `conversational/retail/
cancel-pending` task's shop, and a `TemplateUser`. Then every rollout plays one exchange — the
user's opening, one `find_user` and one `cancel_order` operation (each run in its sandbox by the
engine, checked on the node), the user's reply — with --workers threads. Reports: memory
(MemAvailable drop per rollout, PSS of the processes the sandboxes hold, the node process's
RSS growth for N hosts and users), the processes per idle sandbox (a service runs only during
an operation), and per operation the wall time (p50 / p99) and CPU (node process, and the
machine's from /proc/stat: shared with other work, an upper bound).

    PYTHONPATH=. .venv/bin/python benchmarks/conversational_density.py [--n 1000] [--workers 4]
"""
from __future__ import annotations

import argparse
import os
import resource
import statistics
import time
from concurrent.futures import ThreadPoolExecutor

import psutil

from controller.taskbank.conversational import conversational_taskset
from layers.builtin import default_store_root, ensure_builtin_image
from layers.store import ImageStore
from nodeagent.harness.usersim import TemplateUser
from nodeagent.sandbox.runtime import SandboxRuntime, SandboxSpec
from nodeagent.services.host import ServiceHost

MIB = 1 << 20


def mem_available() -> int:
    with open("/proc/meminfo") as f:
        return next(int(ln.split()[1]) * 1024 for ln in f if ln.startswith("MemAvailable:"))


def machine_cpu_s() -> float:
    with open("/proc/stat") as f:
        fields = [int(x) for x in f.readline().split()[1:]]
    busy = sum(fields) - fields[3] - fields[4]          # all but idle and iowait
    return busy / os.sysconf("SC_CLK_TCK")


def cgroup_value(rt, controller: str, names: tuple[str, ...]) -> int | None:
    """A counter of the node's cgroup (every sandbox's cgroup sits under it), or None."""
    d = rt.cgroups.report.dirs.get(controller)
    for name in names:
        try:
            with open(f"{d}/{name}") as f:
                return int(f.read().split()[0]) if name != "cpu.stat" else int(
                    next(ln.split()[1] for ln in open(f"{d}/{name}") if ln.startswith("usage_usec"))) * 1000
        except (OSError, TypeError, ValueError, StopIteration):
            continue
    return None


def pct(xs, q):
    xs = sorted(xs)
    return xs[min(int(q * len(xs)), len(xs) - 1)]


def exchange(host: ServiceHost, user: TemplateUser) -> list[float]:
    user.opening()
    times = []
    for name, args in (("find_user", '{"name": "Ada Byron", "zip": "10115"}'),
                       ("cancel_order", '{"order_id": "W1001", "reason": "no longer needed"}')):
        t = time.perf_counter()
        out = host.call(name, args)
        times.append(time.perf_counter() - t)
        assert out.error is None, out.observation
    user.reply("Your order W1001 has been cancelled.")
    assert host.final_state()["shop"]["orders"]["W1001"]["status"] == "cancelled" and not host.tampered
    return times


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--n", type=int, default=1000)
    ap.add_argument("--slice", type=int, default=64)
    ap.add_argument("--workers", type=int, default=4)
    args = ap.parse_args()
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    _, image = ensure_builtin_image(ImageStore(default_store_root()))
    task = conversational_taskset().by_name()["conversational/retail/cancel-pending"]
    spec = SandboxSpec(image=image, limits={"memory_mb": 64, "pids": 16, "cpu": 0.5, "disk_mb": 4, "nofile": 64})
    me = psutil.Process()
    with SandboxRuntime(slice_size=args.slice) as rt:
        if rt.slots < args.n:
            raise SystemExit(f"only {rt.slots} id slices of {args.slice}: lower --slice or --n")
        rt.create(spec).destroy()
        avail0, rss0 = mem_available(), me.memory_info().rss
        cg_mem0 = cgroup_value(rt, "memory", ("memory.usage_in_bytes", "memory.current"))
        t0 = time.perf_counter()
        boxes = [rt.create(spec) for _ in range(args.n)]
        created_s = time.perf_counter() - t0
        rss1 = me.memory_info().rss
        t0 = time.perf_counter()
        hosts = [ServiceHost(task.services, b) for b in boxes]
        users = [TemplateUser(task.user) for _ in boxes]
        for h in hosts:
            h.install()
        install_s = time.perf_counter() - t0
        rss2 = me.memory_info().rss
        cg_mem1 = cgroup_value(rt, "memory", ("memory.usage_in_bytes", "memory.current"))
        cg_cpu0 = cgroup_value(rt, "cpu", ("cpuacct.usage", "cpu.stat"))
        cpu0, mcpu0, w0 = me.cpu_times(), machine_cpu_s(), time.perf_counter()
        with ThreadPoolExecutor(args.workers) as pool:
            op_times = [t for ts in pool.map(exchange, hosts, users) for t in ts]
        wall = time.perf_counter() - w0
        cpu1, mcpu1 = me.cpu_times(), machine_cpu_s()
        cg_cpu1 = cgroup_value(rt, "cpu", ("cpuacct.usage", "cpu.stat"))
        cg_mem2 = cgroup_value(rt, "memory", ("memory.usage_in_bytes", "memory.current"))
        time.sleep(1.0)
        avail_drop = avail0 - mem_available()
        holder = psutil.Process(rt.holder_pid)
        node_init = holder.children()[0].pid
        spares = {rt.host_pid(pid) for pid in rt.spare_builders()}
        held = [p for p in holder.children(recursive=True)
                if not p.name().startswith("squashfuse") and p.pid != node_init and p.pid not in spares]
        pss = sum(p.memory_full_info().pss for p in held if p.is_running())
        ops = len(op_times)
        node_cpu = (cpu1.user + cpu1.system) - (cpu0.user + cpu0.system)
        print(f"{args.n} rollouts held: {args.n} sandboxes (created in {created_s:.1f} s), {args.n} service hosts "
              f"+ template users (installed in {install_s:.1f} s)")
        print(f"  processes held per idle sandbox: {len(held) / args.n:.2f} (no service process between operations)")
        print(f"  memory per rollout: MemAvailable drop {avail_drop / args.n / MIB:.2f} MiB, sandbox PSS "
              f"{pss / args.n / MIB:.3f} MiB, node process (hosts + users + handles) "
              f"{(rss2 - rss0) / args.n / 1024:.1f} KiB (of which hosts + users {(rss2 - rss1) / args.n / 1024:.1f} KiB)")
        print(f"  {ops} operations in {wall:.1f} s ({ops / wall:.0f}/s, {args.workers} workers): wall p50 "
              f"{statistics.median(op_times) * 1e3:.1f} ms p99 {pct(op_times, .99) * 1e3:.1f} ms")
        if None not in (cg_mem0, cg_mem1, cg_mem2):
            print(f"  sandboxes' cgroup memory (kernel, tmpfs and processes) per rollout: held "
                  f"{(cg_mem1 - cg_mem0) / args.n / MIB:.2f} MiB, after its exchange {(cg_mem2 - cg_mem0) / args.n / MIB:.2f} MiB")
        sb_cpu = f", in the sandboxes {(cg_cpu1 - cg_cpu0) / 1e6 / ops:.1f} ms" if None not in (cg_cpu0, cg_cpu1) else ""
        print(f"  CPU per operation: node process {node_cpu / ops * 1e3:.1f} ms{sb_cpu}, machine (all processes, "
              f"shared host) {(mcpu1 - mcpu0) / ops * 1e3:.1f} ms")
        t = time.perf_counter()
        for b in boxes:
            b.destroy()
        rt.settle()
        print(f"  destroy all: {time.perf_counter() - t:.1f} s")


if __name__ == "__main__":
    main()
