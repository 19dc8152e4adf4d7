"""The node's copies of layers (`layers.treelayer`): unpacked once per node, shared by every
sandbox stacked on them, removed after a grace period (the runtime counts references).

A layer is unpacked (`unsquashfs`, as root of the node namespace) onto the node's layer tmpfs
(`<state>/layers/<key>`, mounted by the holder at start, capped by `layer_cache_mb`), then its
OCI whiteouts become the kernel overlay's: `.wh.NAME` alone becomes a whiteout (a character
device 0:0) NAME; `.wh.NAME` beside a directory NAME of the same layer, or `.wh..wh..opq`
inside a directory, marks that directory opaque (`user.overlay.opaque=y`, read by the overlay's
`userxattr` mode). The copy is on a tmpfs, not a FUSE mount, because each sandbox sees it
through an idmapped clone (`native/sbxinit.c` `mount_layer`: node root -> sandbox root, so the
workload edits the layer's files as its own), and FUSE mounts made by squashfuse cannot be
idmapped. The copy is written to `<key>.partial` and renamed: a builder never sees half a layer.

Runs in the node holder (`nodeagent.sandbox.zygote`). Standard library only. Must not import:
zmq, controller.*, nodeagent.agent, nodeagent.harness, nodeagent.verifier.
"""
from __future__ import annotations

import os
import shutil
import stat
import subprocess

WHITEOUT = ".wh."
OPAQUE_MARKER = ".wh..wh..opq"
OPAQUE_XATTR = "user.overlay.opaque"
UNPACK_TIMEOUT_S = 600.0
ERROR_TAIL_BYTES = 1000
TMPFS_NAME = "paddock-layers"


def tmpfs_options(layer_cache_mb: int) -> str:
    """Options of the node's layer tmpfs (no inode cap: a repository has many small files)."""
    return f"mode=0755,size={int(layer_cache_mb)}m,nr_inodes=0"


def layer_dir(layers_root: str, key: str) -> str:
    if not key or "/" in key or key.startswith("."):
        raise ValueError(f"bad layer key {key!r}")
    return os.path.join(layers_root, key)


def materialise_whiteouts(root: str) -> int:
    """OCI whiteouts under `root` -> the overlay's (see the module docstring). Returns how many."""
    count = 0
    for dirpath, dirnames, filenames in os.walk(root, topdown=False):
        names = set(dirnames) | set(filenames)
        for name in sorted(filenames):
            if not name.startswith(WHITEOUT):
                continue
            marker = os.path.join(dirpath, name)
            os.unlink(marker)
            count += 1
            if name == OPAQUE_MARKER:
                os.setxattr(dirpath, OPAQUE_XATTR, b"y")
                continue
            victim = name[len(WHITEOUT):]
            target = os.path.join(dirpath, victim)
            if victim in names and os.path.isdir(target) and not os.path.islink(target):
                os.setxattr(target, OPAQUE_XATTR, b"y")
            elif not os.path.lexists(target):
                os.mknod(target, stat.S_IFCHR | 0o600, os.makedev(0, 0))
    return count


def unpack_layer(path: str, offset: int, dest: str) -> str | None:
    """Unpack the squashfs at `path` (+`offset`) into `dest`; None, or why it failed (nothing
    is left behind then)."""
    partial = dest + ".partial"
    shutil.rmtree(partial, ignore_errors=True)
    argv = ["unsquashfs", "-no-progress", "-no-xattrs", "-o", str(int(offset)), "-d", partial, path]
    try:
        res = subprocess.run(argv, stdin=subprocess.DEVNULL, capture_output=True, timeout=UNPACK_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        res = None
    if res is None or res.returncode != 0:
        shutil.rmtree(partial, ignore_errors=True)
        why = f"exit {res.returncode}: {res.stderr.decode(errors='replace').strip()[-ERROR_TAIL_BYTES:]}" \
            if res else f"timed out after {UNPACK_TIMEOUT_S}s"
        return f"{argv} failed ({why})"
    try:
        materialise_whiteouts(partial)
        os.chmod(partial, 0o755)
        os.rename(partial, dest)
    except OSError as exc:
        shutil.rmtree(partial, ignore_errors=True)
        return f"layer {path}: {type(exc).__name__}: {exc}"
    return None


def remove_layer(dest: str) -> None:
    shutil.rmtree(dest, ignore_errors=True)


def layer_lowers(sbx: str, lowerdir: str) -> list[str]:
    """The absolute lower directories (top first) of a sandbox whose overlay's lowerdir
    option, relative to its dir `sbx`, is `lowerdir`."""
    return [os.path.normpath(os.path.join(sbx, part)) for part in lowerdir.split(":") if part]
