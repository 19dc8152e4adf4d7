"""The native sandbox runtime, as the node agent sees it: `SandboxRuntime` (a `SandboxBackend`).

`SandboxRuntime` owns one node namespace holder (`nodeagent.sandbox.zygote`): a user namespace that
maps the agent's subordinate-id range, in which each image is mounted once (squashfuse,
counted, unmounted after a grace period), each layer of `spec.layers` unpacked once onto the
node's layer tmpfs (`nodeagent.sandbox.layerfs`; counted and released likewise), and from which every sandbox is forked with its own
disjoint id slice. At start it detects how caps are enforced (`nodeagent.sandbox.cgroups`: cgroup v2,
v1 or rlimits; `caps_report()`), refuses caps the host cannot enforce unless told to degrade,
picks the writable-root path for the kernel and sweeps what a killed predecessor left (both in
`nodeagent.sandbox.host`). `create` hands back a `nodeagent.sandbox.handle.Sandbox`; sandboxes
are one-shot; warm pools (`pool`, `acquire`; `nodeagent.sandbox.warmpool`) keep ready ones per
image. The data types live in `nodeagent.sandbox.spec`, the interface in
`nodeagent.sandbox.interface`; this module re-exports the names the rest of Paddock imports
from it (`__all__`).

Every infrastructure failure (the holder or a sandbox init died, a mount failed) raises
`SandboxError`; a command that fails inside the sandbox is an `ExecResult`, not an error.
Must not import: zmq, controller.*, nodeagent.agent, nodeagent.harness, nodeagent.verifier.
"""
from __future__ import annotations

import collections
import itertools
import logging
import os
import platform
import shutil
import socket
import subprocess
import sys
import threading
import time
from typing import Callable

from nodeagent.sandbox import cgroups, framing, native, sbxinit, statedir, usercaps, warmpool
from nodeagent.sandbox.config import RuntimeConfig, with_knobs
from nodeagent.sandbox.handle import Sandbox
from nodeagent.sandbox.host import (
    OVERLAY_MODES,
    cgroup_migration_is_fast,
    check_traversable,
    choose_overlay,
    find_host_pid,
    host_problems,
    image_partition,
    kernel_version,
    owner_tag,
    subid_range,
    sweep_state_dirs,
)
from nodeagent.sandbox.interface import SandboxBackend
from nodeagent.sandbox.mounts import ImageMount, MountTable
from nodeagent.sandbox.spec import (
    Change,
    DiffRefused,
    ExecResult,
    SandboxError,
    SandboxSpec,
    changes_to_tar,
    tar_to_changes,
)

__all__ = ["Change", "DiffRefused", "ExecResult", "OVERLAY_MODES", "Sandbox", "SandboxError", "SandboxRuntime", "SandboxSpec",
           "cgroup_migration_is_fast", "changes_to_tar", "choose_overlay", "host_problems", "image_partition",
           "kernel_version", "subid_range", "sweep_state_dirs", "tar_to_changes"]

log = logging.getLogger(__name__)

RECORD_TEMPLATES_MAX = 64   # create-request templates kept (one per image and spec shape)


class SandboxRuntime(MountTable, warmpool.PooledBackend, SandboxBackend):
    """One node's sandbox factory. Start it from a long-lived thread (PDEATHSIG follows the thread).

    Its knobs are one `RuntimeConfig` (nodeagent/sandbox/config.py: the defaults, checked when
    made); keyword knobs (`degrade=True`) replace single fields of it; `clock`: monotonic.
    caps: the caps every sandbox must get; one the host cannot enforce fails `start()` with an
    error naming it, unless degrade=True (then it is logged and reported by `caps_report()`).
    Without cgroups, user-space caps hold them (`nodeagent.sandbox.usercaps`: a memory monitor
    over rlimits, CPU affinity and SCHED_BATCH, pids per id slice) unless user_space_caps=False.
    run_root: the per-user directory of node state dirs (`nodeagent.sandbox.statedir`; default
    `$XDG_RUNTIME_DIR/paddock` when usable, else /tmp/paddock-<uid>), checked before use.
    overlay: "auto" (kernel overlay on kernels ≥ 6.5, else fuse-overlayfs), "kernel" or
    "fuse-overlayfs". image_grace_s: how long an unused image (or layer) stays mounted.
    layer_cache_mb: the cap of the node's layer tmpfs (unpacked layers).
    """

    def __init__(self, config: RuntimeConfig = RuntimeConfig(), *,
                 clock: Callable[[], float] = time.monotonic, **knobs):
        self.config = config = with_knobs(config, knobs)
        self.subids = config.subids or subid_range(config.user)
        self.slice_size = slice_size = config.slice_size
        self.slots = self.subids[1] // slice_size - 1   # slice 0 is the holder's own root
        if self.slots < 1:
            raise SandboxError(f"subordinate range {self.subids} is too small for slices of {slice_size}: "
                               f"give the sandbox user at least {2 * slice_size} subordinate ids "
                               f"(`usermod --add-subuids 100000-165535 --add-subgids 100000-165535 USER`)")
        self.overlay = choose_overlay(config.overlay)
        self.caps, self.degrade, self.clock = config.caps, config.degrade, clock
        self.image_grace_s = config.image_grace_s
        self.layer_cache_mb = config.layer_cache_mb
        self.run_root = config.run_root or statedir.default_run_root()
        self.user_space_caps = config.user_space_caps
        self.monitor: usercaps.MemoryMonitor | None = None
        self._cpu_slices = usercaps.CpuSlices()
        self._own_state = config.state_dir is None
        self.state_dir = config.state_dir
        self.cgroups = cgroups.CgroupManager(enabled=config.use_cgroups)
        self._ctl_lock = threading.Lock()     # one request at a time to the holder
        self._lock = threading.Lock()         # slices and image reference counts
        self._free_slices = list(range(1, self.slots + 1))
        self._live: set[str] = set()          # ids of sandboxes created and not yet destroyed
        self._dying: list["Sandbox"] = []     # destroyed, not yet reclaimed (see `settle`)
        self._images: dict[str, ImageMount] = {}
        self._init_pools()   # warm pools: `pool`, `acquire` (nodeagent.sandbox.warmpool)
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
        """Check the host, detect how caps are enforced, start the node holder. Raises
        SandboxError naming what is missing (and leaves no state dir behind)."""
        problems = host_problems()
        if problems:
            raise SandboxError("native sandboxes cannot run on this host: " + "; ".join(problems))
        report = self._prepare_state()
        self._handshake(self._spawn_holder())
        log.info("sandbox runtime up: subids=%s slots=%d overlay=%s %s", self.subids, self.slots,
                 self.overlay, report)
        if report.mode == "cgroup-v1" and not cgroup_migration_is_fast():
            log.warning("every sandbox create waits for an RCU grace period to join its v1 cgroups: "
                        "remount a cgroup2 mount with favordynmods (`make setup` does)")
        return self

    def _prepare_state(self) -> cgroups.CapsReport:
        """The state dir (after the sweep), the caps check, the native init opened."""
        if self._own_state:
            statedir.ensure_run_root(self.run_root)
            self.swept = sweep_state_dirs(self.run_root)
            self.state_dir = os.path.join(self.run_root, owner_tag())
            os.mkdir(self.state_dir, statedir.RUN_ROOT_MODE)
        else:
            statedir.check_owned_dir(self.state_dir)
        check_traversable(self.state_dir)
        report = self.cgroups.detect()
        if self.user_space_caps:
            report = self.cgroups.report = usercaps.upgrade(report)
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
        os.chmod(self.state_dir, statedir.RUN_ROOT_MODE)   # others may pass (the holder's ids), not list
        if self.overlay == "extracted":   # written by the holder (root of the node namespace)
            os.mkdir(os.path.join(self.state_dir, "extracted"), 0o700)
            os.chown(os.path.join(self.state_dir, "extracted"), self.subids[0], self.subids[0])
        try:
            self._init_exe = os.open(native.init_binary(), os.O_RDONLY | os.O_CLOEXEC)
        except (native.NativeBuildError, OSError) as exc:
            self.cgroups.close()
            self._remove_state_dir()
            raise SandboxError(f"the native sandbox init is not available: {exc}") from None
        return report

    def _spawn_holder(self) -> socket.socket:
        """Start the node holder (`python -m nodeagent.sandbox.zygote`); its control socket."""
        shim = _open_fuse_shim()
        ours, theirs = socket.socketpair()
        self._spares_chan, chan = socket.socketpair()
        self._spares_chan.setblocking(False)
        argv = [sys.executable, "-m", "nodeagent.sandbox.zygote", "--ctl-fd", str(theirs.fileno()),
                "--state", self.state_dir, "--init-fd", str(self._init_exe), "--spares-fd", str(chan.fileno()),
                "--layer-cache-mb", str(self.layer_cache_mb)]
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
        return ours

    def _handshake(self, ours: socket.socket) -> None:
        """The holder unshares, the agent writes its id maps, the holder says it is ready."""
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
        self._stop_pools()   # first: their refills still need the holder
        if self.monitor is not None:
            self.monitor.close()
            self.monitor = None
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
        return find_host_pid(node_pid, self.holder_pid)

    def spare_builders(self) -> list[int]:
        """Node PIDs of the holder's spare builders (forks waiting for a create; ops and tests)."""
        return list(self._call({"op": "ping"})["spare_pids"])

    # -- sandboxes --------------------------------------------------------------------------
    def create(self, spec: SandboxSpec) -> "Sandbox":
        """A sandbox built from nothing: its cgroup (caps written before anything runs), id
        slice, mount and other namespaces, writable root and init are all made by this call.
        One pass: the image and layers mounted (counted), an id slice taken, the request and
        its records for the native builder made here, then `_build` sends them and makes the
        cgroups while the builder mounts the root (they are sent to it after)."""
        keys = self._mount_for(spec)
        slice_no = self._take_slice(keys)
        sid, cgroup = f"s{next(self._ids)}", f"c{next(self._cg_ids)}"
        t_req = time.monotonic()
        req = {"op": "create", "id": sid, "image_key": keys[0], "slice_base": slice_no * self.slice_size,
               "slice_size": self.slice_size, "limits": spec.limits, "hostname": spec.hostname,
               "cgroup_caps": [c for c, m in self.cgroups.report.mechanism.items() if m and m.startswith("cgroup")],
               "overlay": self.overlay, "egress_socket": spec.egress_socket, "layer_keys": keys[1:]}
        if usercaps.held_in_user_space(self.cgroups.report, "cpu"):
            req["sched"] = usercaps.sched_specs(self._cpu_slices.take(float(spec.limits.get("cpu") or 0)))
        records = self._build_records(req) if self.overlay != "fuse-overlayfs" else None
        try:
            reply, init_sock, init_pidfd = self._build(req, records, cgroup)
        except (SandboxError, cgroups.CapsError, framing.FramingError, OSError) as exc:
            self._release(slice_no, keys)
            raise SandboxError(f"sandbox {sid} failed to start: {exc}") from None
        sb = Sandbox(self, sid, init_sock, slice_no, int(reply["p"][0]),
                     (reply.get("U") or [b""])[0].decode().strip(), spec, keys[0], init_pidfd)
        sb.layer_keys = tuple(keys[1:])
        sb.cgroup = cgroup
        sb._stage_marks = (t_req, time.monotonic(), reply.get("T") or [])   # parsed on demand
        with self._lock:
            self._live.add(sid)
        self._watch_memory(sb)
        if spec.files:
            try:
                sb.write_files({f"/work/{k}": v for k, v in spec.files.items()})
            except SandboxError:
                sb.destroy()
                raise
        return sb

    def _mount_for(self, spec: SandboxSpec) -> list[str]:
        """The keys of `spec`'s image and layers, each mounted (or referenced once more)."""
        self.reap_images()
        key = self.mount_image(spec.image)
        try:
            return [key, *self._mount_layers(spec)]
        except SandboxError:
            with self._lock:
                self._unref_image_locked(key)
            raise

    def _watch_memory(self, sb: "Sandbox") -> None:
        """Put `sb` under the user-space memory monitor when no cgroup holds its memory cap."""
        mem_mb = int(sb.spec.limits.get("memory_mb") or 0)
        if not mem_mb or not usercaps.held_in_user_space(self.cgroups.report, "memory"):
            return
        if self.monitor is None:
            self.monitor = usercaps.MemoryMonitor()
        self.monitor.watch(sb.id, sb.init_pid_host, mem_mb << 20)

    def memory_watch(self, sid: str) -> "usercaps.Watched | None":
        """The memory monitor's record of sandbox `sid` (kills, peak), if it is watched."""
        return self.monitor.get(sid) if self.monitor is not None else None

    def _take_slice(self, keys: list[str]) -> int:
        """A free id slice, after waiting for destroyed sandboxes' teardown if none is free; none
        at all gives back the image and layer references `keys` and raises SandboxError."""
        with self._lock:
            short = not self._free_slices
        if short:
            self._reclaim()
            self.settle()   # destroyed sandboxes still hold slices: wait for their teardown
        with self._lock:
            if not self._free_slices:
                for key in keys:
                    self._unref_image_locked(key)
                raise SandboxError(f"no free id slice: all {self.slots} sandboxes of this node are in use")
            return self._free_slices.pop()

    def _build(self, req: dict, records: list | None, cgroup: str) -> tuple[dict, socket.socket, int]:
        """Have a builder make sandbox `req` while its cgroup is made here: a spare builder
        gets `records` (the native builder's request); without a spare (or for fuse-overlayfs,
        `records` None: the holder's Python builder reads `req`) the holder starts one on a
        socket whose records are already queued. (The builder's reply, the init's socket, the
        init's pidfd.) A failure removes the cgroup and raises (the caller gives back the
        slice and image)."""
        cg_fds: list[int] = []

        def make_cgroups() -> None:
            nonlocal cg_fds
            try:
                cg_fds = self.cgroups.create(cgroup, req["limits"])
            except cgroups.CapsError:
                framing.send_records(ours, [("s", b"failed")])   # the builder gives up too
                raise
            framing.send_records(ours, [("c", b"")], cg_fds)
            self._reclaim()   # destroyed sandboxes' empty cgroups, while the builder works

        ours = theirs = None
        try:
            ours = self._spare_builder(records) if records is not None else None
            if ours is not None:   # a spare builder got the request: no round trip to the holder
                make_cgroups()
            else:
                ours, theirs = socket.socketpair()
                if records is not None:   # waits in the socket for the builder the holder starts
                    framing.send_records(ours, records)
                self._call(req, [theirs.fileno()], meanwhile=make_cgroups)
                theirs.close()
            reply, fds = framing.recv_records(ours, max_bytes=65536, with_fds=True)
            if reply.get("s") != [b"ok"] or len(fds) != 2 or "p" not in reply:
                for fd in fds:
                    os.close(fd)
                why = (reply.get("m") or [b"no reason given"])[0].decode(errors="replace")
                raise SandboxError(f"sandbox setup failed: {why}")
            return reply, socket.socket(fileno=fds[0]), fds[1]
        except (SandboxError, cgroups.CapsError, framing.FramingError, OSError):
            if theirs is not None:
                theirs.close()
            if cg_fds:
                self.cgroups.remove(cgroup)
            raise
        finally:
            if ours is not None:
                ours.close()
            for fd in cg_fds:
                os.close(fd)

    def _spare_builder(self, records: list[tuple[str, bytes]]) -> socket.socket | None:
        """The request socket of a spare builder (handed over by the holder) that took
        `records`, or None when none is left (the holder then starts one for this create)."""
        while True:
            with self._spares_lock:
                self._spares.extend(socket.socket(fileno=fd) for fd in framing.recv_waiting_fds(self._spares_chan))
                if not self._spares:
                    return None
                sock = self._spares.popleft()
            sock.setblocking(True)
            try:
                framing.send_records(sock, records)
                return sock
            except OSError:   # that spare died (the holder replaces it)
                sock.close()

    def _build_records(self, req: dict) -> list[tuple[str, bytes]]:
        """`sbxinit.build_records(req)`: all but the sandbox's id, dir and id slice come from a
        template per (image, limits, hostname, egress, caps), made once."""
        tkey = (req["image_key"], tuple(req.get("layer_keys") or ()), tuple(sorted(req["limits"].items())), req["hostname"],
                req["egress_socket"], tuple(req["cgroup_caps"]), tuple(req.get("sched", ())[:2]))
        template = self._record_templates.get(tkey)
        if template is None:
            if len(self._record_templates) >= RECORD_TEMPLATES_MAX:
                self._record_templates.clear()
            template = [r for r in sbxinit.build_records({**req, "id": "s0", "slice_base": 0}, self.state_dir)
                        if r[0] not in ("i", "d", "b") and not (r[0] == "R" and r[1].startswith(b"cpus="))]
            self._record_templates[tkey] = template
        sid = req["id"]
        cpus = [("R", s.encode()) for s in req.get("sched", ()) if s.startswith("cpus=")]   # per sandbox
        return [("i", sid.encode()), ("d", f"{self.state_dir}/sbx/{sid}".encode()),
                ("b", str(int(req["slice_base"])).encode()), *template, *cpus]

    def active_sandboxes(self) -> int:
        """Sandboxes created and not yet destroyed (warm-pool sandboxes included; spare
        builders, which are not sandboxes yet, not)."""
        with self._lock:
            return len(self._live)

    def _release(self, slice_no: int, keys: list[str] = ()) -> None:
        with self._lock:
            self._free_slices.append(slice_no)
            for key in keys:
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
        if self.monitor is not None:
            self.monitor.forget(sb.id)
        with self._lock:
            self._live.discard(sb.id)
            self._dying.append(sb)
            # Its processes are killed: the image and layers may go (a detached mount outlives no one).
            for key in (sb.image_key, *sb.layer_keys):
                self._unref_image_locked(key)
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
