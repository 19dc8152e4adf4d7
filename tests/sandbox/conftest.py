"""Fixtures of the sandbox suite: a tiny image with a world-writable tree (so deletions in the
lower layer, i.e. whiteouts, can be exercised), as a raw squashfs and as a SIF file."""
from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
from pathlib import Path

import pytest

from layers import build


def _rw_tree(root: Path) -> None:
    """busybox + /data (mode 0777) holding files, a subdir and a symlink, under `root`."""
    (root / "bin").mkdir(parents=True)
    shutil.copy("/bin/busybox", root / "bin" / "busybox")
    for app in ("sh", "ls", "cat", "rm", "mkdir", "echo", "chmod", "ln", "stat", "readlink", "mv", "true"):
        os.symlink("busybox", root / "bin" / app)
    for d in ("tmp", "work", "proc", "dev", "etc"):
        (root / d).mkdir()
    (root / "etc" / "passwd").write_text("root:x:0:0:root:/root:/bin/sh\nchecker:x:1000:1000::/:/bin/sh\n")
    data = root / "data"
    (data / "sub").mkdir(parents=True)
    (data / "keep.txt").write_text("keep\n")
    (data / "gone.txt").write_text("gone\n")
    (data / "sub" / "inner.txt").write_text("inner\n")
    os.symlink("keep.txt", data / "link")
    for p in (data, data / "sub"):
        os.chmod(p, 0o777)
    for p in (data / "keep.txt", data / "gone.txt", data / "sub" / "inner.txt"):
        os.chmod(p, 0o666)
    os.chmod(root / "tmp", 0o1777)


@pytest.fixture(scope="session")
def rw_image():
    """A raw squashfs: busybox + /data (mode 0777) holding files, a subdir and a symlink."""
    base = Path(tempfile.mkdtemp(prefix="paddock-rwimg-", dir="/tmp"))   # reachable by subuids
    os.chmod(base, 0o755)
    root = base / "root"
    _rw_tree(root)
    img = base / "rw.sqfs"
    subprocess.run(["mksquashfs", str(root), str(img), "-all-root", "-noappend", "-quiet", "-no-progress"],
                   check=True, capture_output=True)
    os.chmod(img, 0o644)
    shutil.rmtree(root)
    yield str(img)
    shutil.rmtree(base, ignore_errors=True)


@pytest.fixture(scope="session")
def rw_sif():
    """The same tree as `rw_image`, built into a SIF file (what both backends can run)."""
    base = Path(tempfile.mkdtemp(prefix="paddock-rwsif-", dir="/tmp"))   # reachable by subuids
    os.chmod(base, 0o755)
    _rw_tree(base / "root")
    img = build.build_image(base / "root", base / "rw.sif", workdir=base)
    os.chmod(img, 0o644)
    shutil.rmtree(base / "root")
    yield img
    shutil.rmtree(base, ignore_errors=True)
