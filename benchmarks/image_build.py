"""Image conversion cost: `paddock image build` vs a bare `mksquashfs`, side by side in one run.

Paddock: stage the source (copy or extract, sanitise: setuid/setgid cleared, special files
dropped, reproducible times), detect the arch, mksquashfs with the fixed options, wrap in a SIF
(one more pass over the bytes for the content-derived UUID, one to write). Reference: the floor,
`mksquashfs SRC OUT -comp zstd -all-root -no-xattrs -noappend` straight from the same tree, and
`tar -xf` + the same mksquashfs for the tarball source. Runs alternate, so load hits both alike.
Prints medians, p99 and the ratios. Sources: the busybox rootfs and a copy of the host's Python
standard library (a few thousand files), as a directory and as a .tar.gz.

    .venv/bin/python benchmarks/image_build.py [--n 15]
"""
from __future__ import annotations

import argparse
import hashlib
import os
import shutil
import statistics
import subprocess
import sys
import sysconfig
import tarfile
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from layers import build  # noqa: E402

MKSQUASHFS = ["-comp", "zstd", "-all-root", "-no-xattrs", "-noappend", "-no-progress", "-quiet"]


def pct(xs: list[float], q: float) -> float:
    xs = sorted(xs)
    return xs[min(int(q * len(xs)), len(xs) - 1)]


def busybox_tree(dest: Path) -> Path:
    for d in ("bin", "etc", "tmp", "work"):
        (dest / d).mkdir(parents=True)
    shutil.copy2("/bin/busybox", dest / "bin/busybox")
    for applet in ("sh", "ls", "cat", "env", "sleep", "true"):
        (dest / "bin" / applet).symlink_to("busybox")
    (dest / "etc/passwd").write_text("root:x:0:0:root:/root:/bin/sh\n")
    return dest


def stdlib_tree(dest: Path) -> Path:
    src = Path(sysconfig.get_paths()["stdlib"])
    shutil.copytree(src, dest / "usr/lib/python3", symlinks=True,
                    ignore=shutil.ignore_patterns("__pycache__", "site-packages", "test"))
    busybox_tree(dest)
    return dest


def timed(fn) -> float:
    t = time.perf_counter()
    fn()
    return time.perf_counter() - t


def bench(name: str, src: Path, n: int, tmp: Path) -> None:
    out = tmp / "out.sif"
    ref_out = tmp / "ref.sqfs"
    is_tar = src.is_file()

    def ours() -> None:
        build.build_image(src, out, workdir=tmp)

    def reference() -> None:
        tree = src
        if is_tar:
            tree = tmp / "ref-tree"
            shutil.rmtree(tree, ignore_errors=True)
            tree.mkdir()
            subprocess.run(["tar", "-xzf", str(src), "-C", str(tree)], check=True)
        subprocess.run(["mksquashfs", str(tree), str(ref_out), *MKSQUASHFS], check=True)

    ours()                                          # warm the page cache for both
    reference()
    a, b = [], []
    for _ in range(n):
        a.append(timed(ours))
        b.append(timed(reference))
    digest = hashlib.sha256(out.read_bytes()).hexdigest()
    ma, mb = statistics.median(a), statistics.median(b)
    size = out.stat().st_size / 2**20
    print(f"{name} (SIF {size:.1f} MiB) sha256:{digest[:12]}")
    print(f"  paddock image build : median {ma * 1e3:8.1f} ms  p99 {pct(a, .99) * 1e3:8.1f} ms")
    print(f"  bare mksquashfs     : median {mb * 1e3:8.1f} ms  p99 {pct(b, .99) * 1e3:8.1f} ms")
    print(f"  ratio paddock/bare  : median {ma / mb:5.2f}x  p99 {pct(a, .99) / pct(b, .99):5.2f}x")


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--n", type=int, default=15)
    n = ap.parse_args().n
    os.environ.pop("SOURCE_DATE_EPOCH", None)
    with tempfile.TemporaryDirectory(prefix="paddock-bench-") as t:
        tmp = Path(t)
        bb = busybox_tree(tmp / "busybox")
        std = stdlib_tree(tmp / "stdlib")
        files = sum(len(f) for _, _, f in os.walk(std))
        tgz = tmp / "stdlib.tar.gz"
        with tarfile.open(tgz, "w:gz") as tf:
            tf.add(std, arcname=".")
        print(f"n={n} per case, runs alternate; stdlib tree: {files} files")
        bench("busybox rootfs dir", bb, n, tmp)
        bench("python stdlib dir", std, n, tmp)
        bench("python stdlib .tar.gz", tgz, max(3, n // 3), tmp)


if __name__ == "__main__":
    main()
