"""Sandbox start latency: Paddock's native sandbox vs bare `bwrap` and the `unshare` floor, one run.

- paddock cold: create + exec `true` + destroy, with everything per sandbox made inside create():
  its cgroups (memory, pids, cpu caps), id slice, mount namespace, tmpfs (size and inode caps),
  overlay over the node's shared squashfuse mount of the image, PID/net/IPC/UTS/cgroup and
  child user namespaces, and its init (seccomp installed). What exists ahead of time holds
  nothing of any sandbox: the node holder, the image mount, two spare native builders (waiting
  processes). The warm pool is not used here. destroy returns once every process of the
  sandbox is gone; its mount namespaces, cgroups and id slice are released right after, in
  the background (confirmed by `runtime.settle()`: the time of one settle after the last cold
  cycle is printed). The split create / exec / destroy is printed too, and the builder's own
  stage times (median gaps, from `Sandbox.start_stages`);
- paddock warm handout: `runtime.acquire(spec)` from a warm pool (the sandbox is ready);
- bwrap: `bwrap --unshare-all --die-with-parent --ro-bind ROOT / --proc /proc --dev /dev /bin/true`
  on an unpacked copy of the same image (read-only root: less work than Paddock does);
- floor: `unshare -Urmnp --fork true`.
Prints p50 and p99 of each and the ratios to bwrap's p50, and what else the machine did to the
slowest 5% of cold cycles: this thread's and the sandbox init's time runnable but waiting for a
CPU (`/proc/.../schedstat`), this thread's page faults and involuntary switches, the cyclic
collector's runs.

    .venv/bin/python benchmarks/sandbox_start.py [--n 100] [--handouts 1000] [--slice-us 0]
"""
from __future__ import annotations

import argparse
import gc
import os
import resource
import shutil
import statistics
import subprocess
import tempfile
import time

from layers.builtin import default_store_root, ensure_busybox_image
from layers.sif import read_sif
from layers.store import ImageStore
from nodeagent.sandbox.runtime import SandboxRuntime, SandboxSpec

LIMITS = {"memory_mb": 256, "pids": 64, "cpu": 1.0, "disk_mb": 64, "nofile": 256}


def set_slice(ns: int) -> None:
    """This thread's EEVDF slice request (`sched_setattr`, `sched_runtime` of SCHED_OTHER, Linux
    6.12+; 0 = the kernel's default): a short slice makes a waking task preempt sooner. The
    node holder, its builders and the inits fork from here, so they inherit it."""
    import ctypes
    import struct
    libc = ctypes.CDLL(None, use_errno=True)
    attr = ctypes.create_string_buffer(struct.pack("IIQiIQQQII", 56, 0, 0, os.getpriority(os.PRIO_PROCESS, 0), 0, ns,
                                                   0, 0, 0, 0))
    if libc.syscall(314, 0, attr, 0) != 0:
        raise OSError(ctypes.get_errno(), "sched_setattr")


def runqueue_wait_s(path: str = "/proc/thread-self/schedstat") -> float:
    """Time spent runnable but waiting for a CPU (the second field of a schedstat file)."""
    try:
        with open(path) as f:
            return int(f.read().split()[1]) / 1e9
    except (OSError, IndexError, ValueError):   # gone (a process that ended)
        return 0.0


def process_wait_s(pid: int) -> float:
    """`runqueue_wait_s` summed over the threads of process `pid`."""
    try:
        tids = os.listdir(f"/proc/{pid}/task")
    except OSError:
        return 0.0
    return sum(runqueue_wait_s(f"/proc/{pid}/task/{t}/schedstat") for t in tids)


def pct(xs, q):
    xs = sorted(xs)
    return xs[min(int(q * len(xs)), len(xs) - 1)]


def tail_shares(total: list[float], stages: dict[str, list[float]]) -> str:
    """Which stages make the tail: over the slowest 5% of cycles, each stage's excess over its
    own median, as a share of all stages' excess (stages listed per cycle, in the same order
    as `total`)."""
    slow = sorted(range(len(total)), key=total.__getitem__)[-max(1, len(total) // 20):]
    over = {k: max(0.0, sum(v[i] - statistics.median(v) for i in slow))
            for k, v in stages.items() if len(v) == len(total)}
    excess = sum(over.values()) or 1.0
    return "  ".join(f"{k} {x / excess:.0%}" for k, x in sorted(over.items(), key=lambda kv: -kv[1]))


def timed(fn, n):
    out = []
    for _ in range(n):
        t = time.perf_counter()
        fn()
        out.append(time.perf_counter() - t)
    return out


def line(name, xs, ref_p50):
    p50 = statistics.median(xs)
    print(f"{name:<34} p50 {p50 * 1e3:7.2f} ms   p99 {pct(xs, .99) * 1e3:7.2f} ms   "
          f"p50/bwrap {p50 / ref_p50:5.2f}")


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--n", type=int, default=100, help="cold cycles (each also runs bwrap and unshare once)")
    ap.add_argument("--handouts", type=int, default=1000,
                    help="warm-pool handouts (a p99 of 100 samples is their maximum)")
    ap.add_argument("--slice-us", type=int, default=0,
                    help="experiment: a shorter scheduler slice (us, >= 100) for Paddock's processes (the "
                         "runtime's holder, builders, inits and the command inherit it); bwrap and the floor "
                         "run with the default")
    args = ap.parse_args()
    n, handouts = args.n, args.handouts
    _, image = ensure_busybox_image(ImageStore(default_store_root()))
    tmp = tempfile.mkdtemp()
    try:
        part = tmp + "/part.sqfs"
        info = read_sif(image)
        with open(image, "rb") as f, open(part, "wb") as out:
            f.seek(info.primary_partition_offset)
            out.write(f.read(info.primary_partition_size))
        subprocess.run(["unsquashfs", "-q", "-d", tmp + "/root", part], check=True, capture_output=True)
        bwrap = ["bwrap", "--unshare-all", "--die-with-parent", "--ro-bind", tmp + "/root", "/",
                 "--proc", "/proc", "--dev", "/dev", "/bin/true"]
        floor = ["unshare", "-Urmnp", "--fork", "true"]
        spec = SandboxSpec(image=image, limits=LIMITS)
        if args.slice_us:
            set_slice(args.slice_us * 1000)
        with SandboxRuntime() as rt:
            print(rt.caps_report())
            rt.create(spec).destroy()   # warm: mounts the image once

            phases = {"create": [], "exec": [], "destroy": []}

            gaps: dict[str, list[float]] = {}

            # Per cycle, what else the machine did to it: this thread's and the init's time
            # runnable but waiting for a CPU, this thread's page faults and involuntary switches,
            # the cyclic collector's runs (counted by a callback).
            waits: dict[str, list[float]] = {"thread": [], "init": []}
            faults: dict[str, list[int]] = {"minor": [], "major": [], "invol_switches": []}
            collections = [0]
            gc.callbacks.append(lambda phase, info: collections.__setitem__(0, collections[0] + (phase == "start")))

            def cold():
                r0, w0 = resource.getrusage(resource.RUSAGE_THREAD), runqueue_wait_s()
                t0 = time.perf_counter()
                sb = rt.create(spec)
                t1 = time.perf_counter()
                sb.exec(["true"])
                t2 = time.perf_counter()
                init_wait = process_wait_s(sb.init_pid_host)   # since its fork: its part of create and exec
                t2b = time.perf_counter()
                sb.destroy()
                t3 = time.perf_counter()
                r1 = resource.getrusage(resource.RUSAGE_THREAD)
                waits["thread"].append(runqueue_wait_s() - w0)
                waits["init"].append(init_wait)
                for k, field in (("minor", "ru_minflt"), ("major", "ru_majflt"), ("invol_switches", "ru_nivcsw")):
                    faults[k].append(getattr(r1, field) - getattr(r0, field))
                for k, a, b in (("create", t0, t1), ("exec", t1, t2), ("destroy", t2b, t3)):
                    phases[k].append(b - a)
                marks = sorted((at, name) for name, at in sb.start_stages.items())
                for (a, _), (b, name) in zip(marks, marks[1:]):
                    gaps.setdefault(name, []).append(b - a)
            ours, ref, low = [], [], []
            for _ in range(n):   # interleaved, so machine noise hits all three alike
                cold()   # its time: the three phases (not the reading of the init's schedstat between)
                ours.append(phases["create"][-1] + phases["exec"][-1] + phases["destroy"][-1])
                if args.slice_us:
                    set_slice(0)
                ref += timed(lambda: subprocess.run(bwrap, check=True), 1)
                low += timed(lambda: subprocess.run(floor, check=True), 1)
                if args.slice_us:
                    set_slice(args.slice_us * 1000)
            t = time.perf_counter()
            rt.settle()
            settle_s = time.perf_counter() - t
            pool = rt.pool(spec, target=min(n, 50))
            handout, taken = [], []
            for _ in range(handouts):
                pool.wait_ready(1)
                t = time.perf_counter()
                sb = rt.acquire(spec)
                handout.append(time.perf_counter() - t)
                taken.append(sb)
                if len(taken) >= 10:
                    for sb in taken:
                        sb.destroy()
                    taken.clear()
            for sb in taken:
                sb.destroy()
            pool.stop()
        ref_p50 = statistics.median(ref)
        print(f"n={n}  load average {os.getloadavg()[0]:.1f} on {os.cpu_count()} CPUs "
              f"(shared machine: compare the ratios, not the absolute times)")
        line("paddock cold create+exec+destroy", ours, ref_p50)
        print("   phases p50: " + "  ".join(f"{k} {statistics.median(v) * 1e3:.2f} ms" for k, v in phases.items()))
        print("   phases p99: " + "  ".join(f"{k} {pct(v, .99) * 1e3:.2f} ms" for k, v in phases.items()))
        print(f"   settle() after the last cycle: {settle_s * 1e3:.2f} ms (background teardown confirmed)")
        print("   create stages p50: " + "  ".join(f"{k} {statistics.median(v) * 1e3:.2f}" for k, v in gaps.items()))
        print("   create stages p99: " + "  ".join(f"{k} {pct(v, .99) * 1e3:.2f}" for k, v in gaps.items()))
        print("   tail share (the slowest 5% of cycles: each stage's time over its own p50, as a "
              "share of all stages' time over theirs): " + tail_shares(ours, {**gaps, **{
                  k: v for k, v in phases.items() if k != "create"}}))
        slow = sorted(range(n), key=ours.__getitem__)[-max(1, n // 20):]
        mid = statistics.median(ours)

        def slow_vs_median(xs, scale=1e3):
            return f"{statistics.median(xs) * scale:.2f} -> {statistics.mean(xs[i] for i in slow) * scale:.2f}"
        excess = statistics.mean(ours[i] for i in slow) - mid
        waited = sum(statistics.mean(v[i] for i in slow) - statistics.median(v) for v in waits.values())
        print(f"   the slowest 5% of cycles ({len(slow)}) against the median cycle (median -> their mean): "
              f"{slow_vs_median(ours)} ms; waiting for a CPU (runqueue, schedstat): this thread "
              f"{slow_vs_median(waits['thread'])} ms, the sandbox init {slow_vs_median(waits['init'])} ms: "
              f"{waited * 1e3:.2f} ms of their {excess * 1e3:.2f} ms excess ({waited / excess:.0%}; the two may overlap)")
        print(f"   the bwrap and floor runs right after those cycles: {statistics.mean(ref[i] for i in slow) / ref_p50:.2f}x "
              f"and {statistics.mean(low[i] for i in slow) / statistics.median(low):.2f}x their medians "
              f"(1.00x: the machine was not slower then)")
        print(f"   this thread's page faults per cycle: minor {slow_vs_median(faults['minor'], 1)}, major "
              f"{slow_vs_median(faults['major'], 1)}; involuntary switches {slow_vs_median(faults['invol_switches'], 1)}; "
              f"collections of the cyclic GC during the {n} cold cycles: {collections[0]}")
        line("paddock warm-pool handout", handout, ref_p50)
        line("bwrap --unshare-all (ro root)", ref, ref_p50)
        line("unshare -Urmnp --fork true (floor)", low, ref_p50)
        print(f"ratio paddock cold / bwrap (p50): {statistics.median(ours) / ref_p50:.2f}  (goal <= 1.0)")
        print(f"ratio paddock cold p99 / its p50: {pct(ours, .99) / statistics.median(ours):.2f}  (goal <= 2.0; "
              f"this machine's own in the same run: bwrap {pct(ref, .99) / ref_p50:.2f}, unshare floor "
              f"{pct(low, .99) / statistics.median(low):.2f})")
        print(f"ratio paddock cold p99 / bwrap p99: {pct(ours, .99) / pct(ref, .99):.2f}  (goal <= 1.0)")
        print(f"warm handout p99: {pct(handout, .99) * 1e3:.3f} ms  (goal <= 1 ms; {len(handout)} handouts, "
              f"{sum(h > 1e-3 for h in handout)} over 1 ms, max {max(handout) * 1e3:.2f} ms)")
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
