"""Density: hold N idle sandboxes at once; creation rate and host memory per sandbox.

Paddock: N sandboxes from the busybox image (slices of --slice ids so N fit in one subuid
range), each with its init alive (PID 1 of the sandbox, idle; the one process a sandbox keeps). Reference in the
same run: N `bwrap --unshare-all` sandboxes on a read-only unpacked copy of the image, each
idling in `sleep`. Memory is measured three ways: the sum of USS and of PSS (psutil) of every
process the sandboxes hold, and the drop of MemAvailable (includes kernel memory: namespaces,
tmpfs, overlay, cgroups). Everything is destroyed and the leftovers counted at the end.

    .venv/bin/python benchmarks/density.py [--n 1000]
"""
from __future__ import annotations

import argparse
import os
import resource
import shutil
import statistics
import subprocess
import tempfile
import time

import psutil

from layers.builtin import default_store_root, ensure_busybox_image
from layers.sif import read_sif
from layers.store import ImageStore
from nodeagent.sandbox.runtime import SandboxRuntime, SandboxSpec

MIB = 1 << 20


def mem_available() -> int:
    with open("/proc/meminfo") as f:
        return next(int(ln.split()[1]) * 1024 for ln in f if ln.startswith("MemAvailable:"))


def tree_memory(pids: list[int]) -> tuple[int, int, int]:
    uss = pss = n = 0
    for pid in pids:
        try:
            m = psutil.Process(pid).memory_full_info()
        except psutil.Error:
            continue
        uss, pss, n = uss + m.uss, pss + m.pss, n + 1
    return uss, pss, n


def pct(xs, q):
    xs = sorted(xs)
    return xs[min(int(q * len(xs)), len(xs) - 1)]


def report(name, n, elapsed, lat, uss, pss, nproc, avail_drop):
    print(f"{name}: {n} sandboxes held, {nproc} processes")
    print(f"  creation: {n / elapsed:7.1f} sandboxes/s   latency p50 {statistics.median(lat) * 1e3:.2f} ms"
          f"  p99 {pct(lat, .99) * 1e3:.2f} ms")
    print(f"  per sandbox: USS {uss / n / MIB:.2f} MiB   PSS {pss / n / MIB:.2f} MiB   "
          f"MemAvailable drop {avail_drop / n / MIB:.2f} MiB")
    return pss / n, avail_drop / n


def run_paddock(image: str, n: int, slice_size: int):
    spec = SandboxSpec(image=image, limits={"memory_mb": 64, "pids": 16, "cpu": 0.5, "disk_mb": 4,
                                            "inodes": 1024, "nofile": 64})
    with SandboxRuntime(slice_size=slice_size) as rt:
        if rt.slots < n:
            raise SystemExit(f"only {rt.slots} id slices of {slice_size}: lower --slice or --n")
        rt.create(spec).destroy()
        before = mem_available()
        boxes, lat = [], []
        t0 = time.perf_counter()
        for _ in range(n):
            t = time.perf_counter()
            boxes.append(rt.create(spec))
            lat.append(time.perf_counter() - t)
        elapsed = time.perf_counter() - t0
        time.sleep(1.0)   # let the page cache and slab settle before reading memory
        avail_drop = before - mem_available()
        holder = psutil.Process(rt.holder_pid)
        node_init = holder.children()[0].pid   # shared by all sandboxes, like squashfuse: not counted
        spares = {rt.host_pid(pid) for pid in rt.spare_builders()}   # shared too (they hold no sandbox)
        per_sandbox = [p.pid for p in holder.children(recursive=True)
                       if not p.name().startswith("squashfuse") and p.pid != node_init and p.pid not in spares]
        uss, pss, nproc = tree_memory(per_sandbox)
        assert all(b.exec(["true"]).exit_code == 0 for b in boxes[:: max(1, n // 20)])
        res = report("paddock", n, elapsed, lat, uss, pss, nproc, avail_drop)
        t = time.perf_counter()
        for b in boxes:
            b.destroy()
        print(f"  destroy all: {time.perf_counter() - t:.2f} s")
        rt.settle()
        left = {c for d in rt.cgroups.report.dirs.values() for c in os.listdir(d)
                if os.path.isdir(os.path.join(d, c))}
        print(f"  sandbox cgroups left after destroy and settle(): {len(left)}")
        node_dirs = list(rt.cgroups.report.dirs.values())
    print(f"  node cgroup dirs left after close: {sum(os.path.exists(d) for d in node_dirs)}")
    return res


def run_bwrap(root: str, n: int):
    argv = ["bwrap", "--unshare-all", "--die-with-parent", "--ro-bind", root, "/", "--proc", "/proc",
            "--dev", "/dev", "--tmpfs", "/tmp", "/bin/sleep", "100000"]
    before = mem_available()
    procs, lat = [], []
    t0 = time.perf_counter()
    for _ in range(n):
        t = time.perf_counter()
        procs.append(subprocess.Popen(argv))
        lat.append(time.perf_counter() - t)
    elapsed = time.perf_counter() - t0
    time.sleep(1.0)
    avail_drop = before - mem_available()
    pids = []
    for p in procs:
        try:
            pids += [p.pid] + [c.pid for c in psutil.Process(p.pid).children(recursive=True)]
        except psutil.Error:
            pass
    uss, pss, nproc = tree_memory(pids)
    res = report("bwrap (spawn only, ro root)", n, elapsed, lat, uss, pss, nproc, avail_drop)
    for p in procs:
        p.kill()
    for p in procs:
        p.wait()
    return res


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--n", type=int, default=1000)
    ap.add_argument("--slice", type=int, default=64, help="ids per sandbox (65536/64 = 1023 slots)")
    args = ap.parse_args()
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    _, image = ensure_busybox_image(ImageStore(default_store_root()))
    tmp = tempfile.mkdtemp()
    try:
        info = read_sif(image)
        with open(image, "rb") as f, open(tmp + "/p.sqfs", "wb") as out:
            f.seek(info.primary_partition_offset)
            out.write(f.read(info.primary_partition_size))
        subprocess.run(["unsquashfs", "-q", "-d", tmp + "/root", tmp + "/p.sqfs"], check=True, capture_output=True)
        print(f"load average {os.getloadavg()[0]:.1f} on {os.cpu_count()} CPUs")
        ours_pss, ours_drop = run_paddock(str(image), args.n, args.slice)
        ref_pss, ref_drop = run_bwrap(tmp + "/root", args.n)
        drop = f"{ours_drop / ref_drop:.2f}" if ref_drop > 64 * 1024 else "n/a (bwrap's drop is within noise)"
        print(f"ratio paddock/bwrap per sandbox: PSS {ours_pss / ref_pss:.2f}   MemAvailable drop {drop}")
        print(f"paddock PSS per sandbox {ours_pss / MIB:.2f} MiB (goal <= 2 MiB)")
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
