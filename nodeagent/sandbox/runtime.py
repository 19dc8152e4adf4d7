"""The native sandbox runtime, as the node agent sees it.

`SandboxRuntime` owns one node namespace holder (`nodeagent.sandbox.zygote`): a user namespace that
maps the agent's subordinate-id range, in which each image is mounted once (squashfuse,
counted, unmounted after a grace period) and from which every sandbox is forked with its own
disjoint id slice. At start it detects how caps are enforced (`nodeagent.sandbox.cgroups`: cgroup v2,
v1 or rlimits; `caps_report()`), refuses caps the host cannot enforce unless told to degrade,
picks the writable-root path for the kernel, and sweeps what a killed predecessor left.
`Sandbox` is one sandbox: `exec` (optionally as another in-sandbox uid), `write_files`,
`read_file`, `diff` / `diff_archive`, `apply`, `destroy`. Sandboxes are one-shot; warm pools
(`pool`, `acquire`; `nodeagent.sandbox.warmpool`) keep ready ones per image.

Every infrastructure failure (the holder or a sandbox init died, a mount failed) raises
`SandboxError`; a command that fails inside the sandbox is an `ExecResult`, not an error.
Must not import zmq or the controller.
"""
from __future__ import annotations

import collections
import io
import itertools
import logging
import os
import platform
import pwd
import select
import shutil
import signal
import socket
import subprocess
import sys
import tarfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

from nodeagent.sandbox import cgroups

from nodeagent.sandbox import framing

from nodeagent.sandbox import native

from nodeagent.sandbox import nsutil

from nodeagent.sandbox import sbxinit
log = logging.getLogger(__name__)

SIF_MAGIC_OFFSET, SIF_MAGIC = 32, b"SIF_MAGIC\0"
DEFAULT_SLICE_SIZE = 1024
DEFAULT_USER = "paddock"
DEFAULT_RUN_ROOT = "/tmp/paddock-nodes"
OVERLAY_ON_FUSE_KERNEL = (6, 5)   # writable kernel overlay over a FUSE lower works from 6.5
OVERLAY_MODES = ("auto", "kernel", "fuse-overlayfs", "extracted")
EXEC_GRACE_S = 30.0   # past an exec's own timeout, a silent init is declared dead
DESTROY_TIMEOUT_S = 10.0
RECORD_TEMPLATES_MAX = 64   # create-request templates kept (one per image and spec shape)


class SandboxError(Exception):
    """Infrastructure failure: the sandbox could not be created or died under us."""


@dataclass(frozen=True)
class ExecResult:
    exit_code: int
    stdout: bytes
    stderr: bytes
    timed_out: bool = False
    truncated: bool = False
    wall_s: float = 0.0


@dataclass(frozen=True)
class Change:
    path: str
    kind: str          # added | modified | deleted | symlink | dir
    data: bytes | None  # file content; a symlink's target; None for deleted and dir
    mode: int


@dataclass(frozen=True)
class SandboxSpec:
    image: Path
    limits: dict = field(default_factory=lambda: {"memory_mb": 256, "pids": 64, "disk_mb": 64, "nofile": 256})
    files: dict = field(default_factory=dict)     # relative to /work -> bytes, owned by the agent
    hostname: str = "sandbox"
    egress_socket: str | None = None   # host path of the node egress proxy's Unix socket


def subid_range(user: str | None = None) -> tuple[int, int]:
    """(base, count) of the subordinate uid range of `user` (default: the caller, or `paddock` for root)."""
    if user is None:
        user = DEFAULT_USER if os.geteuid() == 0 else pwd.getpwuid(os.geteuid()).pw_name
    for path in ("/etc/subuid", "/etc/subgid"):
        with open(path) as f:
            entries = [ln.strip().split(":") for ln in f if ln.strip() and not ln.startswith("#")]
        match = [e for e in entries if e[0] == user and len(e) == 3]
        if not match:
            raise SandboxError(f"user {user!r} has no range in {path}: run `make setup` "
                               f"(or `usermod --add-subuids 100000-165535 --add-subgids 100000-165535 {user}`)")
        if path == "/etc/subuid":
            base, count = int(match[0][1]), int(match[0][2])
    return base, count


def image_partition(path: Path) -> tuple[str, int]:
    """(key, offset) of the squashfs inside `path`: a SIF file's primary partition, or offset 0."""
    with open(path, "rb") as f:
        head = f.read(64)
    if head[SIF_MAGIC_OFFSET:SIF_MAGIC_OFFSET + len(SIF_MAGIC)] == SIF_MAGIC:
        from layers import sif  # the layers package owns the SIF format
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


class _ImageMount:
    """One image mounted by the node holder, counted by the sandboxes that use it."""

    def __init__(self, path: str):
        self.path, self.refs, self.idle_since = path, 0, None


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


def _check_traversable(path: str) -> None:
    """The node holder runs as a subordinate uid: every ancestor of its state dir needs o+x."""
    cur = os.path.abspath(path)
    while cur != "/":
        cur = os.path.dirname(cur)
        if not os.stat(cur).st_mode & 0o001:
            raise SandboxError(f"state dir {path}: {cur} is not searchable by other users (mode "
                               f"{os.stat(cur).st_mode & 0o777:o}); the sandbox ids cannot reach it: "
                               f"`chmod o+x {cur}` or choose a run_root under /tmp")


def _owner_tag() -> str:
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


class SandboxRuntime:
    """One node's sandbox factory. Start it from a long-lived thread (PDEATHSIG follows the thread).

    caps: the caps every sandbox must get; one the host cannot enforce fails `start()` with an
    error naming it, unless degrade=True (then it is logged and reported by `caps_report()`).
    overlay: "auto" (kernel overlay on kernels ≥ 6.5, else fuse-overlayfs), "kernel" or
    "fuse-overlayfs". image_grace_s: how long an unused image stays mounted; clock: monotonic.
    """

    def __init__(self, state_dir: str | None = None, subids: tuple[int, int] | None = None,
                 slice_size: int = DEFAULT_SLICE_SIZE, user: str | None = None,
                 caps: tuple[str, ...] = cgroups.CAPS, degrade: bool = False, use_cgroups: bool = True,
                 overlay: str = "auto", image_grace_s: float = 60.0,
                 clock: Callable[[], float] = time.monotonic, run_root: str = DEFAULT_RUN_ROOT):
        self.subids = subids or subid_range(user)
        self.slice_size = slice_size
        self.slots = self.subids[1] // slice_size - 1   # slice 0 is the holder's own root
        if self.slots < 1:
            raise SandboxError(f"subordinate range {self.subids} is too small for slices of {slice_size}: "
                               f"give the sandbox user at least {2 * slice_size} subordinate ids "
                               f"(`usermod --add-subuids 100000-165535 --add-subgids 100000-165535 USER`)")
        self.overlay = choose_overlay(overlay)
        self.caps, self.degrade, self.clock = tuple(caps), degrade, clock
        self.image_grace_s = image_grace_s
        self.run_root = run_root
        self._own_state = state_dir is None
        self.state_dir = state_dir
        self.cgroups = cgroups.CgroupManager(enabled=use_cgroups)
        self._ctl_lock = threading.Lock()     # one request at a time to the holder
        self._lock = threading.Lock()         # slices and image reference counts
        self._free_slices = list(range(1, self.slots + 1))
        self._live: set[str] = set()          # ids of sandboxes created and not yet destroyed
        self._dying: list["Sandbox"] = []     # destroyed, not yet reclaimed (see `settle`)
        self._images: dict[str, _ImageMount] = {}
        self._pools: dict[tuple, "warmpool.WarmPool"] = {}
        # id(spec) -> (spec, pool) for the spec object a pool was made with: a handout for it
        # builds no key (allocates nothing the collector tracks, so it never triggers a collection)
        self._pool_of_spec: dict[int, tuple] = {}
        self._partitions: dict[tuple, tuple[str, int, str]] = {}   # stat identity -> key, offset, path
        self._record_templates: dict[tuple, list] = {}   # see _build_records
        self._ids = itertools.count(1)
        self._cg_ids = itertools.count(1)
        self._proc: subprocess.Popen | None = None
        self._ctl: socket.socket | None = None
        self._init_exe: int | None = None   # the native sandbox init, open (handed to the holder)
        self._spares_chan: socket.socket | None = None   # the holder hands spare builders over here
        self._spares: collections.deque = collections.deque()   # their request sockets, oldest first
        self._spares_lock = threading.Lock()   # creates run on several threads (warm pools)
        self.swept: list[str] = []

    # -- lifecycle --------------------------------------------------------------------------
    def start(self) -> "SandboxRuntime":
        problems = host_problems()
        if problems:
            raise SandboxError("native sandboxes cannot run on this host: " + "; ".join(problems))
        if self._own_state:
            os.makedirs(self.run_root, mode=0o755, exist_ok=True)
            self.swept = sweep_state_dirs(self.run_root)
            self.state_dir = os.path.join(self.run_root, _owner_tag())
            os.mkdir(self.state_dir, 0o755)
        _check_traversable(self.state_dir)
        report = self.cgroups.detect()
        missing = report.unenforceable(self.caps)
        if missing and not self.degrade:
            self.cgroups.close()
            self._remove_state_dir()
            raise SandboxError(
                f"cap(s) {', '.join(missing)} cannot be enforced on this host ({report}): give the node "
                f"agent a delegated cgroup v2 subtree with memory, pids and cpu enabled, or writable "
                f"cgroup v1 memory/pids/cpu hierarchies; or run without them: degrade=True (`paddock agent --degrade`, `paddock sandbox run --degrade`)")
        if missing:
            log.warning("running DEGRADED: %s not enforced (%s)", ", ".join(missing), report)
        os.chmod(self.state_dir, 0o755)
        if self.overlay == "extracted":   # written by the holder (root of the node namespace)
            os.mkdir(os.path.join(self.state_dir, "extracted"), 0o700)
            os.chown(os.path.join(self.state_dir, "extracted"), self.subids[0], self.subids[0])
        try:
            self._init_exe = os.open(native.init_binary(), os.O_RDONLY | os.O_CLOEXEC)
        except (native.NativeBuildError, OSError) as exc:
            self.cgroups.close()
            self._remove_state_dir()
            raise SandboxError(f"the native sandbox init is not available: {exc}") from None
        shim = _open_fuse_shim()
        ours, theirs = socket.socketpair()
        self._spares_chan, chan = socket.socketpair()
        self._spares_chan.setblocking(False)
        argv = [sys.executable, "-m", "nodeagent.sandbox.zygote", "--ctl-fd", str(theirs.fileno()),
                "--state", self.state_dir, "--init-fd", str(self._init_exe), "--spares-fd", str(chan.fileno())]
        if shim is not None:
            argv += ["--fuse-shim-fd", str(shim)]
        try:
            self._proc = subprocess.Popen(
                argv, pass_fds=(theirs.fileno(), self._init_exe, chan.fileno(), *([shim] if shim is not None else [])),
                stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, cwd="/",
                env=_clean_env())
        finally:
            if shim is not None:
                os.close(shim)
        theirs.close()
        chan.close()
        self._ctl = ours
        try:
            msg = framing.recv_msg(ours, max_bytes=65536)
            if msg.get("stage") != "unshared":
                raise SandboxError(f"node namespace holder failed: {msg}")
            self._write_maps(int(msg["pid"]))
            framing.send_msg(ours, {"stage": "mapped"})
            msg = framing.recv_msg(ours, max_bytes=65536)
            if msg.get("stage") != "ready":
                raise SandboxError(f"node namespace holder failed: {msg.get('error', msg)}")
        except (framing.FramingError, OSError) as exc:
            err = self._stderr_tail()
            self.close()
            raise SandboxError(f"node namespace holder died during start: {exc}; {err}") from None
        log.info("sandbox runtime up: subids=%s slots=%d overlay=%s %s", self.subids, self.slots,
                 self.overlay, report)
        if report.mode == "cgroup-v1" and not cgroup_migration_is_fast():
            log.warning("every sandbox create waits for an RCU grace period to join its v1 cgroups: "
                        "remount a cgroup2 mount with favordynmods (`make setup` does)")
        return self

    def caps_report(self) -> dict:
        """How this node enforces caps and which kernel path it uses (for logs, ops and tests)."""
        r = self.cgroups.report
        return {"caps": dict(r.mechanism), "mode": r.mode, "cgroup_dirs": dict(r.dirs),
                "swap_accounted": r.swap_accounted, "degraded": r.unenforceable(self.caps),
                "overlay": self.overlay, "kernel": platform.release(), "seccomp": "libseccomp (EPERM)",
                "cgroup_migration": "fast (favordynmods)" if cgroup_migration_is_fast()
                else "waits for an RCU grace period"}

    def _write_maps(self, pid: int) -> None:
        base, count = self.subids
        if os.geteuid() == 0:
            for kind in ("uid_map", "gid_map"):
                with open(f"/proc/{pid}/{kind}", "w") as f:
                    f.write(f"0 {base} {count}\n")
            return
        for tool in ("newuidmap", "newgidmap"):
            argv = [tool, str(pid), "0", str(base), str(count)]
            res = subprocess.run(argv, capture_output=True, text=True)
            if res.returncode != 0:
                raise SandboxError(f"{argv} failed (exit {res.returncode}): {res.stderr.strip()}")

    def _stderr_tail(self) -> str:
        if self._proc and self._proc.poll() is not None and self._proc.stderr:
            return self._proc.stderr.read().decode(errors="replace")[-2000:]
        return ""

    def close(self) -> None:
        self._pool_of_spec.clear()
        for p in list(self._pools.values()):   # first: their refills still need the holder
            p.stop()
        self._pools.clear()
        if self._ctl and self._dying:
            try:
                self.settle()
            except SandboxError as exc:
                log.warning("closing with sandboxes not torn down: %s", exc)
        if self._ctl:
            self._ctl.close()
            self._ctl = None
        for sock in self._spares:
            sock.close()
        self._spares.clear()
        if self._spares_chan is not None:
            self._spares_chan.close()
            self._spares_chan = None
        if self._proc:
            if self._proc.poll() is None:
                self._proc.kill()
            self._proc.wait()
            if self._proc.stderr:
                self._proc.stderr.close()
            self._proc = None
        if self._init_exe is not None:
            os.close(self._init_exe)
            self._init_exe = None
        self.cgroups.close()
        self._remove_state_dir()
        self._images.clear()

    def _remove_state_dir(self) -> None:
        if self._own_state and self.state_dir:
            shutil.rmtree(self.state_dir, ignore_errors=True)

    def __enter__(self) -> "SandboxRuntime":
        return self.start()

    def __exit__(self, *exc) -> None:
        self.close()

    @property
    def holder_pid(self) -> int | None:
        return self._proc.pid if self._proc else None

    # -- requests to the holder -------------------------------------------------------------
    def _call(self, req: dict, fds: list[int] | None = None, meanwhile: Callable[[], None] | None = None) -> dict:
        """One request to the holder and its reply; `meanwhile` runs between the two (its
        exception is raised after the reply is read, so requests and replies stay paired)."""
        failed = None
        with self._ctl_lock:
            if self._ctl is None:
                raise SandboxError("sandbox runtime is not running")
            try:
                framing.send_msg(self._ctl, req, fds)
                if meanwhile is not None:
                    try:
                        meanwhile()
                    except Exception as exc:  # noqa: BLE001 - re-raised below, after the reply
                        failed = exc
                reply = framing.recv_msg(self._ctl, max_bytes=1 << 20)
            except (framing.FramingError, OSError) as exc:
                raise SandboxError(f"node namespace holder is gone: {exc}; {self._stderr_tail()}") from None
        if failed is not None:
            raise failed
        if not reply.get("ok"):
            raise SandboxError(reply.get("error", "unknown error"))
        return reply

    def host_pid(self, node_pid: int) -> int:
        """Translate a PID of the node namespace into the agent's PID namespace (via NSpid)."""
        holder = self.holder_pid
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

    # -- images: one mount per digest, counted, unmounted after a grace period ---------------
    def mount_image(self, image: Path) -> str:
        """Mount `image` (once) and take a reference on it; the sandbox's destroy gives it back."""
        try:
            st = os.stat(image)
        except FileNotFoundError:
            raise SandboxError(f"image {image} does not exist: build it with `paddock image build` "
                               f"or give the path of a SIF file in the image store") from None
        ident = (str(image), st.st_dev, st.st_ino, st.st_mtime_ns, st.st_size)
        cached = self._partitions.get(ident)   # the same file, unchanged: no need to re-read it
        if cached is None:
            image = Path(image).resolve()
            try:
                cached = (*image_partition(image), str(image))
            except SandboxError:
                raise
            except Exception as exc:   # layers.sif.SifError: corrupt, truncated, another architecture
                raise SandboxError(f"image {image} cannot be used: {exc}") from exc
            self._partitions[ident] = cached
        key, offset, image = cached
        with self._lock:
            m = self._images.get(key)
            if m is not None:
                m.refs += 1
                m.idle_since = None
                return key
        self._call({"op": "mount_image", "key": key, "path": str(image), "offset": offset,
                    "extract": self.overlay == "extracted"})
        with self._lock:
            m = self._images.setdefault(key, _ImageMount(str(image)))
            m.refs += 1
            m.idle_since = None
        return key

    def reap_images(self) -> list[str]:
        """Unmount images unused for longer than the grace period. Returns their keys."""
        now, gone = self.clock(), []
        with self._lock:
            idle = [k for k, m in self._images.items()
                    if m.refs == 0 and m.idle_since is not None and now - m.idle_since >= self.image_grace_s]
            for k in idle:
                del self._images[k]
        for k in idle:
            try:
                self._call({"op": "unmount_image", "key": k})
                gone.append(k)
            except SandboxError as exc:
                log.warning("unmounting image %s failed: %s", k, exc)
        return gone

    def image_refs(self) -> dict[str, int]:
        with self._lock:
            return {k: m.refs for k, m in self._images.items()}

    def spare_builders(self) -> list[int]:
        """Node PIDs of the holder's spare builders (forks waiting for a create; ops and tests)."""
        return list(self._call({"op": "ping"})["spare_pids"])

    def mounted_images(self) -> list[str]:
        return sorted(self._call({"op": "ping"})["images"])

    # -- sandboxes --------------------------------------------------------------------------
    def create(self, spec: SandboxSpec) -> "Sandbox":
        """A sandbox built from nothing: its cgroup (caps written before anything runs), id
        slice, mount and other namespaces, writable root and init are all made by this call.
        The cgroups are made while the builder mounts the root (they are sent to it after)."""
        self.reap_images()
        key = self.mount_image(spec.image)
        with self._lock:
            short = not self._free_slices
        if short:
            self._reclaim()
            self.settle()   # destroyed sandboxes still hold slices: wait for their teardown
        with self._lock:
            if not self._free_slices:
                self._unref_image_locked(key)
                raise SandboxError(f"no free id slice: all {self.slots} sandboxes of this node are in use")
            slice_no = self._free_slices.pop()
        sid = f"s{next(self._ids)}"
        cgroup = f"c{next(self._cg_ids)}"
        t_req = time.monotonic()
        cg_fds: list[int] = []
        cg_caps = [c for c, m in self.cgroups.report.mechanism.items() if m and m.startswith("cgroup")]
        req = {"op": "create", "id": sid, "image_key": key, "slice_base": slice_no * self.slice_size,
               "slice_size": self.slice_size, "limits": spec.limits, "hostname": spec.hostname,
               "cgroup_caps": cg_caps, "overlay": self.overlay, "egress_socket": spec.egress_socket}

        def make_cgroups() -> None:
            nonlocal cg_fds
            try:
                cg_fds = self.cgroups.create(cgroup, spec.limits)
            except cgroups.CapsError:
                framing.send_records(ours, [("s", b"failed")])   # the builder gives up too
                raise
            framing.send_records(ours, [("c", b"")], cg_fds)
            self._reclaim()   # destroyed sandboxes' empty cgroups, while the builder works

        ours = theirs = None
        try:
            ours = self._spare_builder(req) if self.overlay != "fuse-overlayfs" else None
            if ours is not None:   # a spare builder got the request: no round trip to the holder
                make_cgroups()
            else:
                ours, theirs = socket.socketpair()

                def request_then_cgroups() -> None:
                    if self.overlay != "fuse-overlayfs":
                        framing.send_records(ours, self._build_records(req))
                    make_cgroups()
                self._call(req, [theirs.fileno()], meanwhile=request_then_cgroups)
                theirs.close()
            reply, fds = framing.recv_records(ours, max_bytes=65536, with_fds=True)
            if reply.get("s") != [b"ok"] or len(fds) != 2 or "p" not in reply:
                for fd in fds:
                    os.close(fd)
                why = (reply.get("m") or [b"no reason given"])[0].decode(errors="replace")
                raise SandboxError(f"sandbox setup failed: {why}")
            init_sock = socket.socket(fileno=fds[0])
            init_pidfd = fds[1]
        except (SandboxError, cgroups.CapsError, framing.FramingError, OSError) as exc:
            if theirs is not None:
                theirs.close()
            if cg_fds:
                self.cgroups.remove(cgroup)
            self._release(slice_no, key)
            raise SandboxError(f"sandbox {sid} failed to start: {exc}") from None
        finally:
            if ours is not None:
                ours.close()
            for fd in cg_fds:
                os.close(fd)
        sb = Sandbox(self, sid, init_sock, slice_no, int(reply["p"][0]),
                     (reply.get("U") or [b""])[0].decode().strip(), spec, key, init_pidfd)
        sb.cgroup = cgroup
        sb._stage_marks = (t_req, time.monotonic(), reply.get("T") or [])   # parsed on demand
        with self._lock:
            self._live.add(sid)
        if spec.files:
            try:
                sb.write_files({f"/work/{k}": v for k, v in spec.files.items()})
            except SandboxError:
                sb.destroy()
                raise
        return sb

    def _spare_builder(self, req: dict) -> socket.socket | None:
        """The request socket of a spare builder (handed over by the holder) that took `req`, or
        None when none is left (the holder then starts one for this create)."""
        while True:
            with self._spares_lock:
                while True:
                    try:
                        _, fds = framing.recv_records(self._spares_chan, max_bytes=4096, with_fds=True)
                    except (BlockingIOError, framing.FramingError):
                        break
                    self._spares.extend(socket.socket(fileno=fd) for fd in fds)
                if not self._spares:
                    return None
                sock = self._spares.popleft()
            sock.setblocking(True)
            try:
                framing.send_records(sock, self._build_records(req))
                return sock
            except OSError:   # that spare died (the holder replaces it)
                sock.close()

    def _build_records(self, req: dict) -> list[tuple[str, bytes]]:
        """`sbxinit.build_records(req)`: all but the sandbox's id, dir and id slice come from a
        template per (image, limits, hostname, egress, caps), made once."""
        tkey = (req["image_key"], tuple(sorted(req["limits"].items())), req["hostname"],
                req["egress_socket"], tuple(req["cgroup_caps"]))
        template = self._record_templates.get(tkey)
        if template is None:
            if len(self._record_templates) >= RECORD_TEMPLATES_MAX:
                self._record_templates.clear()
            template = [r for r in sbxinit.build_records({**req, "id": "s0", "slice_base": 0}, self.state_dir)
                        if r[0] not in ("i", "d", "b")]
            self._record_templates[tkey] = template
        sid = req["id"]
        return [("i", sid.encode()), ("d", f"{self.state_dir}/sbx/{sid}".encode()),
                ("b", str(int(req["slice_base"])).encode()), *template]

    def active_sandboxes(self) -> int:
        """Sandboxes created and not yet destroyed (warm-pool sandboxes included; spare
        builders, which are not sandboxes yet, not)."""
        with self._lock:
            return len(self._live)

    def _unref_image_locked(self, key: str) -> None:
        m = self._images.get(key)
        if m is not None:
            m.refs -= 1
            if m.refs <= 0:
                m.refs, m.idle_since = 0, self.clock()

    def _release(self, slice_no: int, key: str | None = None) -> None:
        with self._lock:
            self._free_slices.append(slice_no)
            if key is not None:
                self._unref_image_locked(key)

    def _sandbox_op(self, sid: str, req: dict, max_bytes: int) -> dict:
        """A file operation on sandbox `sid`, answered by a helper of the holder on its own socket."""
        ours, theirs = socket.socketpair()
        try:
            self._call({"op": "sbx_op", "id": sid, "req": req}, [theirs.fileno()])
            theirs.close()
            return framing.recv_msg(ours, max_bytes=max_bytes)
        except (framing.FramingError, OSError) as exc:
            raise SandboxError(f"sandbox {sid}: {req.get('op')} failed: {exc}") from None
        finally:
            theirs.close()
            ours.close()

    def _destroyed(self, sb: "Sandbox") -> None:
        with self._lock:
            self._live.discard(sb.id)
            self._dying.append(sb)
            # Its processes are killed: the image may go (a detached mount outlives no one).
            self._unref_image_locked(sb.image_key)
        self._reclaim()

    def _reclaim(self) -> None:
        """Give back the cgroups, id slices and image references of destroyed sandboxes whose
        processes are all gone (an empty cgroup); never waits."""
        with self._lock:
            dying, self._dying = self._dying, []
        left = []
        for sb in dying:
            if not self.cgroups.paths(sb.cgroup):
                left.append(sb)   # no cgroup tells when its processes are gone: `settle` will
                continue
            try:
                gone = self.cgroups.try_remove(sb.cgroup)
            except cgroups.CapsError as exc:
                log.warning("%s", exc)
                gone = False
            if gone:
                self._release(sb.slice_no)
            else:
                left.append(sb)
        with self._lock:
            self._dying = left + self._dying

    def settle(self, timeout_s: float = 10.0) -> None:
        """Until every destroyed sandbox is gone: its processes, namespaces, mounts, tmpfs and
        cgroups, its id slice free again. Raises SandboxError naming what could not be removed.
        `close()` settles; `create()` settles when destroyed sandboxes hold the last free slice."""
        with self._lock:
            dying, self._dying = self._dying, []
        try:   # their mount namespaces and directories: released by the holder
            self._call({"op": "settle", "timeout_s": timeout_s, "ids": [sb.id for sb in dying]})
        except SandboxError:
            with self._lock:
                self._dying = dying + self._dying
            raise
        for sb in dying:   # empty now: removed at once (remove() still kills a stray, if any)
            self.cgroups.remove(sb.cgroup)
            self._release(sb.slice_no)

    def destroying(self) -> int:
        """Sandboxes destroyed whose teardown `settle()` has not yet confirmed."""
        with self._lock:
            return len(self._dying)

    # -- warm pools (see nodeagent.sandbox.warmpool) ---------------------------------------------------
    def pool(self, spec: SandboxSpec, target: int) -> "warmpool.WarmPool":
        """Keep `target` ready sandboxes of `spec` (started in the background); see `acquire`."""
        from nodeagent.sandbox import warmpool
        with self._lock:
            p = self._pools.get(_pool_key(spec))
            if p is None:
                p = self._pools[_pool_key(spec)] = warmpool.WarmPool(self, spec, target).start()
            else:
                p.set_target(target)
            self._pool_of_spec[id(spec)] = (spec, p)
        return p

    def acquire(self, spec: SandboxSpec, timeout_s: float = 30.0) -> "Sandbox":
        """A ready sandbox from the pool of `spec` if one exists, else a fresh one. Use once."""
        known = self._pool_of_spec.get(id(spec))
        p = known[1] if known is not None and known[0] is spec else self._pools.get(_pool_key(spec))
        if p is not None:
            sb = p.take()
            if sb is not None:
                if spec.files:
                    sb.write_files({f"/work/{k}": v for k, v in spec.files.items()})
                return sb
        return self.create(spec)


def _pool_key(spec: SandboxSpec) -> tuple:
    return (str(spec.image), tuple(sorted(spec.limits.items())), spec.hostname, spec.egress_socket)


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


def _open_fuse_shim() -> int | None:
    """The squashfuse_ll preload library (`native/fuseshim.c`), open; None (logged) when it cannot
    be built: image mounts then work as before, with more FUSE round trips per sandbox."""
    try:
        return os.open(native.fuse_shim(), os.O_RDONLY | os.O_CLOEXEC)
    except (native.NativeBuildError, OSError) as exc:
        log.warning("squashfuse runs without the FUSE shim (more round trips per sandbox): %s", exc)
        return None


def _clean_env() -> dict:
    keep = ("PATH", "LANG", "PYTHONPATH", "VIRTUAL_ENV")
    return {k: v for k, v in os.environ.items() if k in keep}


class Sandbox:
    """One sandbox. `exec` talks to the sandbox's init directly; file operations go through the
    node holder (a helper in the sandbox's mount namespace); `destroy` asks the holder to kill."""

    def __init__(self, runtime, sid, sock, slice_no, init_pid, uid_map, spec, image_key=None, pidfd=None):
        self.runtime, self.id, self._sock, self.slice_no = runtime, sid, sock, slice_no
        self._pidfd = pidfd   # the init's: destroy kills through it and waits on it
        self.init_pid, self.uid_map, self.spec = init_pid, uid_map, spec
        self.image_key = image_key
        self.cgroup: str | None = None   # name of its cgroup under the node's (see cgroups.py)
        self._stage_marks: tuple | None = None   # (requested, returned, the builder's raw marks)
        self._lock = threading.Lock()
        self.destroyed = False

    @property
    def init_pid_host(self) -> int:
        """The sandbox init's PID in the agent's PID namespace (ops and tests look it up)."""
        if self._pidfd is not None and not self.destroyed:
            with open(f"/proc/self/fdinfo/{self._pidfd}") as f:   # "Pid:" is in this PID namespace
                pid = next((int(ln.split()[1]) for ln in f if ln.startswith("Pid:")), 0)
            if pid > 0:
                return pid
        return self.runtime.host_pid(self.init_pid)

    @property
    def start_stages(self) -> dict[str, float]:
        """When each stage of its create() happened (CLOCK_MONOTONIC seconds): requested and
        returned (the agent's), and the builder's and init's own marks in between."""
        if self._stage_marks is None:
            return {}
        t_req, t_ret, marks = self._stage_marks
        stages = {"requested": t_req, "returned": t_ret}
        for mark in marks:
            name, _, at = mark.decode(errors="replace").partition("=")
            stages[name] = float(at)
        return stages

    @property
    def cgroup_paths(self) -> dict[str, str]:
        """controller -> this sandbox's cgroup directory (empty when caps are rlimits)."""
        return self.runtime.cgroups.paths(self.cgroup)

    def cgroup_stat(self) -> dict:
        return self.runtime.cgroups.stat(self.cgroup)

    def _call(self, req: dict, max_bytes: int = framing.DEFAULT_MAX_BYTES) -> dict:
        if self.destroyed:
            raise SandboxError(f"sandbox {self.id} is destroyed")
        if req["op"] != "exec":
            reply = self.runtime._sandbox_op(self.id, req, max_bytes)
        else:
            with self._lock:
                try:
                    self._sock.settimeout(float(req["timeout_s"]) + EXEC_GRACE_S)
                    framing.send_records(self._sock, sbxinit.exec_records(
                        req["argv"], req["stdin"], req["timeout_s"], req["cwd"], req["env"],
                        req["output_cap"], req["uid"], self.spec.egress_socket is not None))
                    reply = sbxinit.checked_exec_reply(
                        framing.recv_records(self._sock, max_bytes=sbxinit.INIT_REPLY_MAX_BYTES))
                except (framing.FramingError, OSError) as exc:
                    raise SandboxError(f"sandbox {self.id} init is gone: {exc}") from None
        if not reply.get("ok"):
            raise SandboxError(f"sandbox {self.id}: {reply.get('error', 'unknown error')}")
        return reply

    def exec(self, argv: list[str], stdin: bytes = b"", timeout_s: float = 30.0, cwd: str = "/work",
             env: dict | None = None, output_cap: int = 65536, uid: int | None = None) -> ExecResult:
        """Run `argv` in the sandbox. `uid`: an in-sandbox uid (0 ≤ uid < slice size) other than the
        agent's root, e.g. a checker that does not own /work; its gid is the same number."""
        if uid is not None and not (0 <= int(uid) < self.runtime.slice_size):
            raise ValueError(f"uid {uid} is outside the sandbox's id slice [0, {self.runtime.slice_size})")
        r = self._call({"op": "exec", "argv": list(argv) if isinstance(argv, (list, tuple)) else argv,
                        "stdin": stdin, "timeout_s": timeout_s, "cwd": cwd, "env": env or {},
                        "output_cap": output_cap, "uid": uid})
        return ExecResult(r["exit_code"], r["stdout"], r["stderr"], r["timed_out"], r["truncated"], r["wall_s"])

    def write_files(self, files: dict, owner: str = "agent", mode: int = 0o644) -> None:
        if owner not in ("agent", "system"):
            raise ValueError(f"owner must be 'agent' or 'system', not {owner!r}")
        data = {k: (v.encode() if isinstance(v, str) else v) for k, v in files.items()}
        self._call({"op": "write_files", "files": data, "owner": owner, "mode": mode})

    def read_file(self, path: str, max_bytes: int = 1 << 20) -> bytes:
        return self._call({"op": "read_file", "path": path, "max_bytes": max_bytes})["data"]

    def diff(self, prefix: str = "/", max_bytes: int = 8 << 20) -> list[Change]:
        """The writable layer's changes under `prefix`, parents before children: files (added or
        modified, with mode), directories (kind 'dir', with mode), symlinks, and deletions
        (whiteouts; an opaque directory is a deletion followed by 'dir')."""
        changes = self._call({"op": "diff", "prefix": prefix, "max_bytes": max_bytes})["changes"]
        return [Change(c["path"], c["kind"], c["data"], c["mode"]) for c in changes]

    def diff_archive(self, prefix: str = "/", max_bytes: int = 8 << 20) -> bytes:
        """`diff()` as a tar archive (deletions as entries named `.wh.<name>`, as in OCI layers)."""
        return changes_to_tar(self.diff(prefix, max_bytes))

    def apply(self, changes: "list[Change] | bytes") -> None:
        """Apply another sandbox's `diff()` (or `diff_archive()`) here, owned by the agent."""
        if isinstance(changes, (bytes, bytearray)):
            changes = tar_to_changes(bytes(changes))
        wire = [{"path": c.path, "kind": c.kind, "data": c.data, "mode": c.mode} for c in changes]
        self._call({"op": "apply", "changes": wire})

    def usage(self) -> dict:
        r = self._call({"op": "usage"})
        return {"disk_used_bytes": r["disk_used_bytes"]}

    def destroy(self) -> None:
        """Idempotent. Kills the sandbox's PID 1 and returns once every process of the sandbox
        is gone (raises SandboxError if one is not: a leak). Its mount namespace (tmpfs,
        overlay, /dev), mountpoint directory and cgroups are released right after, in the
        background: all gone once `runtime.settle()` returns (SandboxError names a leak)."""
        if self.destroyed:
            return
        self.destroyed = True
        self._sock.close()
        try:
            try:
                signal.pidfd_send_signal(self._pidfd, signal.SIGKILL)
            except ProcessLookupError:
                pass
            poller = select.poll()   # not select(): pidfds pass 1024 on a busy node
            poller.register(self._pidfd, select.POLLIN)
            if not poller.poll(DESTROY_TIMEOUT_S * 1000):
                raise SandboxError(f"sandbox {self.id}: init {self.init_pid} did not die in {DESTROY_TIMEOUT_S}s")
        finally:
            os.close(self._pidfd)
            self.runtime._destroyed(self)

    def __enter__(self) -> "Sandbox":
        return self

    def __exit__(self, *exc) -> None:
        self.destroy()


WHITEOUT_PREFIX = ".wh."


def changes_to_tar(changes: list[Change]) -> bytes:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=tarfile.PAX_FORMAT) as tar:
        for c in changes:
            name = c.path.lstrip("/")
            if c.kind == "deleted":
                head, tail = os.path.split(name)
                ti = tarfile.TarInfo(os.path.join(head, WHITEOUT_PREFIX + tail))
                tar.addfile(ti, io.BytesIO(b""))
                continue
            ti = tarfile.TarInfo(name)
            ti.mode = c.mode & 0o7777
            if c.kind == "dir":
                ti.type = tarfile.DIRTYPE
                tar.addfile(ti)
            elif c.kind == "symlink":
                ti.type, ti.linkname = tarfile.SYMTYPE, (c.data or b"").decode()
                tar.addfile(ti)
            else:
                ti.size = len(c.data or b"")
                ti.pax_headers = {"PADDOCK.kind": c.kind}
                tar.addfile(ti, io.BytesIO(c.data or b""))
    return buf.getvalue()


def tar_to_changes(data: bytes) -> list[Change]:
    out = []
    try:
        with tarfile.open(fileobj=io.BytesIO(data), mode="r:") as tar:
            for ti in tar:
                head, tail = os.path.split(ti.name)
                if tail.startswith(WHITEOUT_PREFIX):
                    out.append(Change("/" + os.path.join(head, tail[len(WHITEOUT_PREFIX):]), "deleted", None, 0))
                elif ti.isdir():
                    out.append(Change("/" + ti.name, "dir", None, ti.mode))
                elif ti.issym():
                    out.append(Change("/" + ti.name, "symlink", ti.linkname.encode(), 0o777))
                elif ti.isfile():
                    f = tar.extractfile(ti)
                    kind = ti.pax_headers.get("PADDOCK.kind", "added")
                    out.append(Change("/" + ti.name, kind, f.read() if f else b"", ti.mode))
                else:
                    raise SandboxError(f"diff archive entry {ti.name!r} has an unsupported type")
    except tarfile.TarError as exc:
        raise SandboxError(f"diff archive is not a readable tar: {exc}") from None
    return out
