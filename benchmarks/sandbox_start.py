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
Prints p50 and p99 of each and the ratios to bwrap's p50.

    .venv/bin/python benchmarks/sandbox_start.py [--n 100] [--handouts 1000]
"""
from __future__ import annotations

import argparse
import os
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
        with SandboxRuntime() as rt:
            print(rt.caps_report())
            rt.create(spec).destroy()   # warm: mounts the image once

            phases = {"create": [], "exec": [], "destroy": []}

            gaps: dict[str, list[float]] = {}

            def cold():
                t0 = time.perf_counter()
                sb = rt.create(spec)
                t1 = time.perf_counter()
                sb.exec(["true"])
                t2 = time.perf_counter()
                sb.destroy()
                t3 = time.perf_counter()
                for k, a, b in (("create", t0, t1), ("exec", t1, t2), ("destroy", t2, t3)):
                    phases[k].append(b - a)
                marks = sorted((at, name) for name, at in sb.start_stages.items())
                for (a, _), (b, name) in zip(marks, marks[1:]):
                    gaps.setdefault(name, []).append(b - a)
            ours, ref, low = [], [], []
            for _ in range(n):   # interleaved, so machine noise hits all three alike
                ours += timed(cold, 1)
                ref += timed(lambda: subprocess.run(bwrap, check=True), 1)
                low += timed(lambda: subprocess.run(floor, check=True), 1)
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
