"""What this host offers the native backend, and the node state a killed predecessor left.

Pure checks and detection, each failure a SandboxError (or a problem string) naming its fix:
`subid_range` (the sandbox user's subordinate ids), `image_partition` (where the squashfs
starts inside a SIF file), `kernel_version` / `choose_overlay` (the writable-root path for
this kernel: kernel overlay over FUSE from Linux 6.5, else fuse-overlayfs, else an extracted
copy), `host_problems` (squashfuse, /dev/fuse), `cgroup_migration_is_fast` (favordynmods),
`check_traversable` (the holder's ids must reach the state dir), `find_host_pid` (a node
namespace PID as this namespace sees it). `owner_tag` names a runtime's
state dir so that `sweep_state_dirs` can tell a live owner from a dead one and remove (and
unmount) what the dead left.

No processes are started here (the sweep only unmounts and removes). Of the sandbox folder it uses only spec, cgroups,
nsutil and statedir. Must not import: zmq, controller other than controller.contracts, nodeagent.agent,
nodeagent.harness, nodeagent.verifier, nodeagent.sandbox.runtime, nodeagent.sandbox.zygote.
"""
from __future__ import annotations

import logging
import os
import platform
import pwd
import shutil
from pathlib import Path
from typing import Callable

from layers import sif  # the layers package owns the SIF format
from nodeagent.sandbox import cgroups, nsutil
from nodeagent.sandbox.spec import SandboxError

log = logging.getLogger(__name__)

SIF_MAGIC_OFFSET, SIF_MAGIC = 32, b"SIF_MAGIC\0"
DEFAULT_USER = "paddock"
OVERLAY_ON_FUSE_KERNEL = (6, 5)   # writable kernel overlay over a FUSE lower works from 6.5
OVERLAY_MODES = ("auto", "kernel", "fuse-overlayfs", "extracted")


def subid_range(user: str | None = None) -> tuple[int, int]:
    """(base, count) of the subordinate uid range of `user` (default: the caller, or `paddock` for root)."""
    if user is None:
        user = DEFAULT_USER if os.geteuid() == 0 else pwd.getpwuid(os.geteuid()).pw_name
    for path in ("/etc/subuid", "/etc/subgid"):
        with open(path) as f:
            entries = [ln.strip().split(":") for ln in f if ln.strip() and not ln.startswith("#")]
        match = [e for e in entries if e[0] == user and len(e) == 3]
        if not match:
            raise SandboxError(f"user {user!r} has no range in {path}: run `make setup`, or have an admin "
                               f"give it one: `usermod --add-subuids A-B --add-subgids A-B {user}` with a "
                               f"range of at least 2048 ids no other user has (e.g. 100000-165535)")
        if path == "/etc/subuid":
            base, count = int(match[0][1]), int(match[0][2])
    return base, count


def image_partition(path: Path) -> tuple[str, int]:
    """(key, offset) of the squashfs inside `path`: a SIF file's primary partition, or offset 0."""
    with open(path, "rb") as f:
        head = f.read(64)
    if head[SIF_MAGIC_OFFSET:SIF_MAGIC_OFFSET + len(SIF_MAGIC)] == SIF_MAGIC:
        info = sif.read_sif(path)
        sif.check_arch(info)     # ArchMismatchError (a SifError) names both architectures
        offset = info.primary_partition_offset
    elif head[:4] == b"hsqs":
        offset = 0
    else:
        raise SandboxError(f"image {path} is neither a SIF file nor a squashfs image")
    st = os.stat(path)
    key = path.stem if len(path.stem) == 64 else f"{st.st_dev:x}-{st.st_ino:x}-{int(st.st_mtime)}"
    return key, offset


def kernel_version(release: str | None = None) -> tuple[int, int]:
    parts = (release or platform.release()).split(".")
    return int(parts[0]), int("".join(ch for ch in parts[1] if ch.isdigit()) or 0)


def choose_overlay(mode: str = "auto", release: str | None = None,
                   which: Callable[[str], str | None] = shutil.which) -> str:
    """The writable-root path for this kernel: 'kernel' (overlay over the squashfuse mount, Linux
    ≥ 6.5), else 'fuse-overlayfs', else 'extracted' (overlay over an unpacked copy of the image
    per node)."""
    if mode not in OVERLAY_MODES:
        raise SandboxError(f"overlay={mode!r} is not one of {OVERLAY_MODES}")
    new_enough = kernel_version(release) >= OVERLAY_ON_FUSE_KERNEL
    if mode == "kernel" and not new_enough:
        raise SandboxError(f"overlay='kernel' needs Linux ≥ 6.5 over a FUSE lower (this is "
                           f"{release or platform.release()}): use overlay='fuse-overlayfs' or 'extracted'")
    if mode == "auto" and not new_enough:
        mode = "fuse-overlayfs" if which("fuse-overlayfs") else "extracted"
    if mode == "fuse-overlayfs" and not which("fuse-overlayfs"):
        raise SandboxError("overlay='fuse-overlayfs' but fuse-overlayfs is not installed: run `make setup` "
                           "(apt-get install fuse-overlayfs)")
    if mode == "extracted" and not which("unsquashfs"):
        raise SandboxError("overlay='extracted' (kernel < 6.5 without fuse-overlayfs) needs unsquashfs: "
                           "run `make setup` (apt-get install squashfs-tools)")
    return "kernel" if mode == "auto" else mode


def host_problems(fuse_dev: str = "/dev/fuse", which: Callable[[str], str | None] = shutil.which) -> list[str]:
    """What this host lacks for native sandboxes, each with its fix (empty when ready)."""
    out = []
    if os.geteuid() != 0:
        for tool in ("newuidmap", "newgidmap"):
            if not which(tool):
                out.append(f"{tool} is missing: an ordinary user maps its subordinate ids with it "
                           f"(apt-get install uidmap)")
    if not which("squashfuse"):
        out.append("squashfuse is not installed: run `make setup` (apt-get install squashfuse)")
    try:
        if os.stat(fuse_dev).st_mode & 0o006 != 0o006:
            out.append(f"{fuse_dev} is not usable by the sandbox ids: run `make setup` (chmod 0666 {fuse_dev})")
    except FileNotFoundError:
        out.append(f"{fuse_dev} is missing: load the fuse kernel module (modprobe fuse)")
    return out


def cgroup_migration_is_fast(mounts: str = "/proc/mounts") -> bool:
    """Whether the cgroup core favours dynamic changes (a global flag, set through any cgroup2
    mount's `favordynmods` option): then joining a cgroup does not wait for an RCU grace period."""
    with open(mounts) as f:
        return any(ln.split()[2] == "cgroup2" and "favordynmods" in ln.split()[3].split(",") for ln in f)


def check_traversable(path: str) -> None:
    """The node holder runs as a subordinate uid: every ancestor of its state dir needs o+x."""
    cur = os.path.abspath(path)
    while cur != "/":
        cur = os.path.dirname(cur)
        if not os.stat(cur).st_mode & 0o001:
            raise SandboxError(f"state dir {path}: {cur} is not searchable by other users (mode "
                               f"{os.stat(cur).st_mode & 0o777:o}); the sandbox ids cannot reach it: "
                               f"`chmod o+x {cur}` or choose a run_root under /tmp")


def owner_tag() -> str:
    """node-<pid>-<start time>-<random>: lets the next start tell a live owner from a dead one."""
    return f"node-{os.getpid()}-{cgroups._starttime(os.getpid())}-{os.urandom(3).hex()}"


def sweep_state_dirs(run_root: str) -> list[str]:
    """Remove the state dirs (and any host mount left under them) of runtimes that are gone."""
    swept = []
    for name in sorted(os.listdir(run_root)):
        parts = name.split("-")
        if len(parts) != 4 or parts[0] != "node" or not parts[1].isdigit():
            continue
        if cgroups._starttime(int(parts[1])) == parts[2]:
            continue   # a live runtime (this process's or another agent's)
        path = os.path.join(run_root, name)
        with open("/proc/self/mountinfo") as f:
            mounts = [ln.split()[4] for ln in f if ln.split()[4].startswith(path + "/")
                      or ln.split()[4] == path]
        for mnt in sorted(mounts, key=len, reverse=True):
            try:
                nsutil.umount(mnt, nsutil.MNT_DETACH)
            except OSError as exc:
                log.warning("cannot unmount stale %s: %s", mnt, exc)
        shutil.rmtree(path, ignore_errors=True)
        swept.append(path)
        log.info("swept stale sandbox state %s (%d mounts)", path, len(mounts))
    return swept


def find_host_pid(node_pid: int, holder: int | None) -> int:
    """The PID, in this PID namespace, of the process with PID `node_pid` in the node namespace
    of the holder `holder` (via NSpid)."""
    for pid in os.listdir("/proc"):
        if not pid.isdigit():
            continue
        try:
            with open(f"/proc/{pid}/status") as f:
                nspid = next((ln.split()[1:] for ln in f if ln.startswith("NSpid:")), [])
        except OSError:
            continue
        if len(nspid) >= 2 and int(nspid[-1 if len(nspid) == 2 else 1]) == node_pid \
                and _descends_from(int(pid), holder):
            return int(pid)
    raise SandboxError(f"no process with node PID {node_pid}")


def _descends_from(pid: int, ancestor: int | None) -> bool:
    while pid > 1 and ancestor:
        if pid == ancestor:
            return True
        try:
            with open(f"/proc/{pid}/stat") as f:
                pid = int(f.read().rsplit(")", 1)[1].split()[1])
        except OSError:
            return False
    return False
