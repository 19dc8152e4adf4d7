"""Sandbox start latency: Paddock's native sandbox vs bare `bwrap`, side by side in one run.

Paddock: create (own mount ns, tmpfs, overlay over the node's shared squashfuse mount, PID/net/
IPC/UTS ns, child user ns) + exec `true` + destroy. Reference: `bwrap --unshare-all
--ro-bind ROOTFS / --proc /proc --dev /dev true` on an unpacked copy of the same image (no
overlay, no writable root: less work than Paddock does). Prints medians, p95 and the ratio.

    .venv/bin/python benchmarks/sandbox_start.py [--n 50]
"""
from __future__ import annotations

import argparse
import shutil
import statistics
import subprocess
import tempfile
import time

from layers.builtin import default_store_root, ensure_busybox_image
from layers.sif import read_sif
from layers.store import ImageStore
from nodeagent.sandbox import SandboxRuntime, SandboxSpec


def pct(xs, q):
    xs = sorted(xs)
    return xs[min(int(q * len(xs)), len(xs) - 1)]


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--n", type=int, default=50)
    n = ap.parse_args().n
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
        ours, ref = [], []
        with SandboxRuntime() as rt:
            rt.create(SandboxSpec(image=image)).destroy()   # warm: mounts the image once
            for _ in range(n):
                t = time.perf_counter()
                sb = rt.create(SandboxSpec(image=image))
                sb.exec(["true"])
                sb.destroy()
                ours.append(time.perf_counter() - t)
                t = time.perf_counter()
                subprocess.run(bwrap, check=True)
                ref.append(time.perf_counter() - t)
        mo, mr = statistics.median(ours), statistics.median(ref)
        print(f"n={n}")
        print(f"paddock create+exec+destroy: median {mo * 1e3:.1f} ms  p95 {pct(ours, .95) * 1e3:.1f} ms")
        print(f"bare bwrap (read-only root): median {mr * 1e3:.1f} ms  p95 {pct(ref, .95) * 1e3:.1f} ms")
        print(f"ratio paddock/bwrap (median): {mo / mr:.2f}")
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
