"""The node's namespace holder: one long-lived user + mount + PID namespace per node agent.

Started by `nodeagent.sandbox.runtime.SandboxRuntime` as `python -m nodeagent.sandbox.zygote --ctl-fd N
--state DIR --init-fd N --spares-fd N [--fuse-shim-fd N] [--layer-cache-mb N]`: an INTERNAL entry point, not a user
command (users go through `paddock`); its fixed flags are read by `parse_args`, no argparse.
Stage 1 unshares a user and mount namespace and waits while the agent writes its
subordinate-id mapping (`0 <subuid base> <count>`), becomes root of that namespace, unshares a
PID namespace and forks stage 2, the node init, which:

- mounts a private /proc and a small tmpfs over `DIR` (mount points only);
- mounts each image once with `squashfuse -f -o ro,allow_other,offset=N` under `DIR/images/`
  (a FUSE mount made inside the namespace, so image uid 0 is the namespace's root and copy-up
  works), shared by every sandbox of the node;
- unpacks each layer once onto the node's layer tmpfs `DIR/layers/` (`nodeagent.sandbox.layerfs`),
  shared by every sandbox stacked on it (each sees it through its own idmapped clone);
- keeps SPARE_BUILDERS native builders (`nodeagent/sandbox/native/sbxinit.c`, forked by its native
  factory, which holds nothing of any sandbox either) waiting, holding nothing
  of any sandbox; the agent gets each one's request socket (over the spares channel) and sends
  a create to it directly; the builder reports the sandbox here and is replaced;
- keeps each sandbox's mount namespaces (fds) and its init's pidfd, forks a short-lived helper
  per file operation, kills on destroy.

Both stages set PDEATHSIG=SIGKILL: if the agent dies, the node init dies, the kernel kills
every process in the node PID namespace (sandboxes and squashfuse daemons) and the mount
namespace, with its mounts and tmpfs, disappears. Nothing outlives the agent.

Imports only the standard library and nodeagent.sandbox.{nsutil,framing,layerfs,sbxinit,seccomp}. Must not
import: zmq, controller.*, nodeagent.agent, nodeagent.harness, nodeagent.verifier.
"""
from __future__ import annotations

import gc
import os
import select
import selectors
import shutil
import signal
import socket
import subprocess
import sys
import time

from nodeagent.sandbox import framing, layerfs, nsutil, sbxinit, seccomp

MOUNT_TIMEOUT_S = 10.0
# squashfuse_ll: the low-level daemon lets the kernel cache entries (negative ones too) and
# attributes without timeout (an image never changes under its mount); it runs with the FUSE
# shim preloaded (native/fuseshim.c: no xattr requests, cached symlinks) when the agent sent
# one. The high-level `squashfuse` is the fallback, told to cache for a day.
SQUASHFUSE = "squashfuse_ll" if shutil.which("squashfuse_ll") else "squashfuse"
FUSE_CACHE_OPTS = "" if SQUASHFUSE == "squashfuse_ll" else \
    ",entry_timeout=86400,negative_timeout=86400,attr_timeout=86400,kernel_cache"
DESTROY_TIMEOUT_S = 10.0
EXTRACT_TIMEOUT_S = 600.0
SPARE_BUILDERS = 2   # forks of this process waiting for a create (each used one is replaced at once)


def _mounted(path: str) -> bool:
    with open("/proc/self/mountinfo") as f:
        return any(line.split()[4] == path for line in f)


class NodeInit:
    def __init__(self, ctl: socket.socket, state_dir: str, init_exe: int, spares_chan: socket.socket,
                 fuse_shim: int = -1, layer_cache_mb: int = 4096):
        self.ctl = ctl
        self.layer_cache_mb = layer_cache_mb
        self.layers_dir = os.path.join(state_dir, "layers")
        self.layers: set[str] = set()   # keys of the layers unpacked under layers_dir
        self.fuse_shim = fuse_shim   # the squashfuse_ll preload library (native/fuseshim.c), open, or -1
        self.spares_chan = spares_chan   # spare builders' request sockets go to the agent here
        self.init_exe = init_exe   # the native sandbox init (an open file, exec'd via /proc/self/fd)
        self.bpf_fd = -1           # the seccomp program (raw BPF in a memfd), built once
        self.state = state_dir
        self.images_dir = os.path.join(state_dir, "images")
        self.sbx_dir = os.path.join(state_dir, "sbx")
        self.mounts: dict[str, subprocess.Popen | None] = {}   # digest -> squashfuse daemon, or None:
        # an extracted copy (in the host state dir, reached through `host_state`), bound read-only
        self.host_state = -1
        self.sandboxes: dict[str, dict] = {}           # id -> init pid, mount ns fd, paths
        self.sel = selectors.DefaultSelector()
        self.spares: set[int] = set()           # spare builders handed to the agent, not yet used
        self.builders: dict[socket.socket, int] = {}   # builder -> its PID, until it reports (or dies)
        self.factory: socket.socket | None = None   # the native factory of spare builders
        self.leaked: list[str] = []                               # what a teardown could not remove

    def setup(self) -> None:
        # The host directory under the tmpfs below: extracted images live there (on disk).
        self.host_state = os.open(self.state, os.O_PATH | os.O_DIRECTORY | os.O_CLOEXEC)
        nsutil.mount("none", "/", None, nsutil.MS_REC | nsutil.MS_PRIVATE)
        nsutil.mount("proc", "/proc", "proc", nsutil.MS_NOSUID | nsutil.MS_NODEV | nsutil.MS_NOEXEC)
        nsutil.mount("paddock-node", self.state, "tmpfs", nsutil.MS_NOSUID | nsutil.MS_NODEV,
                     "mode=0755,size=4m,nr_inodes=65536")
        os.mkdir(self.images_dir, 0o755)
        os.mkdir(self.sbx_dir, 0o755)
        os.mkdir(self.layers_dir, 0o755)
        nsutil.mount(layerfs.TMPFS_NAME, self.layers_dir, "tmpfs", nsutil.MS_NOSUID | nsutil.MS_NODEV,
                     layerfs.tmpfs_options(self.layer_cache_mb))
        # Image mounts propagate into the builders' namespaces (spares are forked before an
        # image may be mounted); nothing propagates back (builders make their copies slaves).
        nsutil.mount(self.images_dir, self.images_dir, None, nsutil.MS_BIND)
        nsutil.mount("none", self.images_dir, None, nsutil.MS_SHARED)
        sbxinit.make_dev_template(os.path.join(self.state, "dev"))
        self.bpf_fd = os.memfd_create("paddock-seccomp", 0)   # inherited by every builder
        os.write(self.bpf_fd, seccomp.build())

    def serve(self) -> None:
        self.sel.register(self.ctl, selectors.EVENT_READ)
        while True:
            for key, _ in self.sel.select(timeout=0.5):
                if self.sel.get_map().get(key.fd) is not key:
                    continue   # handled earlier in this batch (a builder's report read on demand)
                if key.fileobj is self.ctl:
                    if not self.serve_agent():
                        return   # the agent went away: exiting tears the node namespace down
                elif key.data and key.data[0] == "init":
                    self.finish_dead(key.data[1])
                else:
                    self.builder_done(key.fileobj)
            self.reap()

    def serve_agent(self) -> bool:
        try:
            req, fds = framing.recv_msg(self.ctl, with_fds=True)
        except framing.FramingError:
            return False
        try:
            reply = self.handle(req, fds)
        except Exception as exc:  # an operating error: report it, keep serving
            reply = {"ok": False, "error": f"{type(exc).__name__}: {exc}"}
        finally:
            for fd in fds:
                os.close(fd)
        framing.send_msg(self.ctl, reply)
        return True

    # -- builders: native ones spawned ahead of time (spares, handed to the agent), holding --
    # -- nothing of any sandbox; each builds one sandbox and reports it here ---------------
    def fill_spares(self) -> None:
        while len(self.spares) < SPARE_BUILDERS:
            ours, theirs = socket.socketpair()
            try:
                pid = self._spawn_builder(theirs.fileno())
                framing.send_records(self.spares_chan, [("p", str(pid).encode())], [ours.fileno()])
            finally:
                ours.close()
                theirs.close()
            self.spares.add(pid)

    def _spawn_builder(self, agent_fd: int) -> int:
        """A native builder (`nodeagent/sandbox/native/sbxinit.c`) that reads one create request on
        `agent_fd` and reports the sandbox here: forked by the native factory, or (if it is
        gone) spawned (vfork+exec: no copy of this process)."""
        ours, theirs = socket.socketpair()
        try:
            pid = self._factory_fork(theirs.fileno(), agent_fd)
            if pid is None:
                for fd in (theirs.fileno(), agent_fd, self.bpf_fd):
                    os.set_inheritable(fd, True)
                argv = ["paddock-sbxbuild", "builder", "--sock", str(theirs.fileno()), "--agent-fd",
                        str(agent_fd), "--bpf-fd", str(self.bpf_fd)]
                pid = os.posix_spawn(f"/proc/self/fd/{self.init_exe}", argv, {})
        finally:
            theirs.close()
            os.set_inheritable(agent_fd, False)
        self.builders[ours] = pid
        self.sel.register(ours, selectors.EVENT_READ, ("builder", pid))
        return pid

    def start_factory(self) -> None:
        """The native factory of spare builders (a fork of it costs a third of an exec)."""
        ours, theirs = socket.socketpair()
        os.set_inheritable(theirs.fileno(), True)
        os.set_inheritable(self.bpf_fd, True)
        argv = ["paddock-sbxfactory", "factory", "--ctl", str(theirs.fileno()), "--bpf-fd", str(self.bpf_fd)]
        try:
            os.posix_spawn(f"/proc/self/fd/{self.init_exe}", argv, {})
            self.factory = ours
        except OSError:
            ours.close()
        finally:
            theirs.close()

    def _factory_fork(self, sock_fd: int, agent_fd: int) -> int | None:
        """A builder forked by the factory (its PID), or None when the factory is gone."""
        if self.factory is None:
            return None
        try:
            framing.send_records(self.factory, [("f", b"")], [sock_fd, agent_fd])
            pid = int(framing.recv_records(self.factory, max_bytes=256)["p"][0])
            if pid > 0:
                return pid
        except (framing.FramingError, OSError, KeyError, ValueError):
            pass
        self.factory.close()   # gone or failing: builders are spawned from now on
        self.factory = None
        return None

    def _fork_builder(self, req: dict, agent_fd: int) -> None:
        """A Python builder for the fuse-overlayfs path (it starts the daemon, then spawns the
        native init), answering the agent on `agent_fd`."""
        ours, theirs = socket.socketpair()
        dup = os.dup(agent_fd)
        pid = os.fork()
        if pid == 0:
            code = 1
            try:
                # Only this sandbox's fds: never another sandbox's mount namespace or pidfd.
                _close_fds_except({0, 1, 2, theirs.fileno(), self.init_exe, self.bpf_fd, dup})
                agent = socket.socket(fileno=dup)
                code = sbxinit.run_builder(agent, theirs, req, lower=os.path.join(self.images_dir, req["image_key"]),
                                           sbx_root=self.sbx_dir, init_exe=self.init_exe, bpf_fd=self.bpf_fd)
            finally:
                os._exit(code)
        theirs.close()
        os.close(dup)
        self.builders[ours] = pid
        self.sel.register(ours, selectors.EVENT_READ, ("builder", pid))

    def builder_done(self, sock: socket.socket) -> None:
        """A builder reported its sandbox (its init's PID; its mount namespaces as fds, which
        keep them alive after it exits), or died. A spare is replaced either way."""
        self.sel.unregister(sock)
        pid = self.builders.pop(sock)
        try:
            msg, fds = framing.recv_records(sock, max_bytes=4096, with_fds=True)
            self._take_sandbox(msg, fds)
        except (framing.FramingError, OSError, ValueError, KeyError):
            pass   # it failed (and told the agent) or died: nothing of it is kept
        finally:
            sock.close()
        self.reap()
        if pid in self.spares:
            self.spares.discard(pid)
            self.fill_spares()

    def _take_sandbox(self, msg: dict, fds: list[int]) -> None:
        try:
            one = {k: v[0].decode() for k, v in msg.items()}
            sid = one["i"]
            sbx = os.path.join(self.sbx_dir, sid)
            if len(fds) != 2 or "/" in sid or one["d"] != sbx or sid in self.sandboxes:
                raise ValueError(f"bad report from a builder: {one}")
            rec = {"id": sid, "root": os.path.join(sbx, "root"), "sbx": sbx, "base": int(one["b"]),
                   "init_pid": int(one["p"]), "daemon_pid": int(one["D"]) if one.get("D") else None,
                   "lowers": layerfs.layer_lowers(sbx, one["l"]), "mnt_fd": fds[0], "init_mnt_fd": fds[1]}
        except (KeyError, ValueError, UnicodeDecodeError):
            for fd in fds:
                os.close(fd)
            raise
        self.sandboxes[sid] = rec
        try:
            rec["pidfd"] = os.pidfd_open(rec["init_pid"])
        except ProcessLookupError:   # destroyed (and reaped) before this report was read
            rec["pidfd"] = None
            self.finish_dead(sid)
        else:   # its exit (a destroy, or a crash) releases the rest of the sandbox
            self.sel.register(rec["pidfd"], selectors.EVENT_READ, ("init", sid))

    def _settle(self, sid) -> None:
        """An op may arrive before a builder's report was read (it was sent before the agent
        heard of the sandbox): read every report that is in."""
        if sid in self.sandboxes or not self.builders:
            return
        poller = select.poll()
        socks = {s.fileno(): s for s in self.builders}
        for fd in socks:
            poller.register(fd, select.POLLIN)
        for fd, _ in poller.poll(0):
            self.builder_done(socks[fd])

    def reap(self) -> None:
        while True:
            try:
                pid, _status = os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:
                return
            if pid == 0:
                return
            # builders, sandbox inits, fuse-overlayfs daemons: all children of this PID 1

    def handle(self, req: dict, fds: list[int]) -> dict:
        op = req.get("op")
        if op == "ping":
            return {"ok": True, "pid": os.getpid(), "images": sorted(self.mounts), "layers": sorted(self.layers),
                    "spares": len(self.spares), "spare_pids": sorted(self.spares),
                    "sbx_dirs": sorted(os.listdir(self.sbx_dir)),
                    "sandboxes": len(self.sandboxes)}
        if op == "settle":
            return self.settle(float(req.get("timeout_s", DESTROY_TIMEOUT_S)), list(req.get("ids") or []))
        if op == "mount_image":
            return self.mount_image(req["key"], req["path"], int(req.get("offset", 0)), bool(req.get("extract")))
        if op == "unmount_image":
            return self.unmount_image(req["key"])
        if op == "mount_layer":
            return self.mount_layer(req["key"], req["path"], int(req.get("offset", 0)))
        if op == "unmount_layer":
            return self.unmount_layer(req["key"])
        if op == "create":
            if len(fds) != 1:
                return {"ok": False, "error": "create needs exactly one socket fd (the agent's, for this sandbox)"}
            return self.create(req, fds[0])
        if op == "sbx_op":
            if len(fds) != 1:
                return {"ok": False, "error": "sbx_op needs exactly one reply socket fd"}
            return self.sandbox_op(req, fds[0])
        return {"ok": False, "error": f"unknown op {op!r}"}

    def mount_image(self, key: str, path: str, offset: int, extract: bool = False) -> dict:
        mnt = os.path.join(self.images_dir, key)
        if key in self.mounts and (self.mounts[key] is None or self.mounts[key].poll() is None):
            return {"ok": True, "mountpoint": mnt}
        if not os.access(path, os.R_OK):
            return {"ok": False, "error": f"image {path} is not readable by the sandbox user "
                                          f"(uid {os.getuid()} in the node namespace)"}
        os.makedirs(mnt, mode=0o755, exist_ok=True)
        if extract:
            return self._extract_image(key, path, offset, mnt)
        argv = [SQUASHFUSE, "-f", "-o", f"ro,allow_other,offset={offset}{FUSE_CACHE_OPTS}", path, mnt]
        env, keep = dict(os.environ), ()
        if SQUASHFUSE == "squashfuse_ll" and self.fuse_shim >= 0:   # no xattr requests, cached symlinks
            env["LD_PRELOAD"], keep = f"/proc/self/fd/{self.fuse_shim}", (self.fuse_shim,)
        proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                                stderr=subprocess.PIPE, env=env, pass_fds=keep)
        deadline = time.monotonic() + MOUNT_TIMEOUT_S
        while not _mounted(mnt):
            if proc.poll() is not None or time.monotonic() > deadline:
                proc.kill()
                err = proc.stderr.read().decode(errors="replace").strip() if proc.stderr else ""
                return {"ok": False, "error": f"{argv} failed (exit {proc.wait()}): {err}"}
            time.sleep(0.005)
        self.mounts[key] = proc
        return {"ok": True, "mountpoint": mnt}

    def mount_layer(self, key: str, path: str, offset: int) -> dict:
        """Unpack layer `key` (the squashfs at `path`) onto the layer tmpfs, once."""
        dest = layerfs.layer_dir(self.layers_dir, key)
        if key in self.layers:
            return {"ok": True, "dir": dest}
        if not os.access(path, os.R_OK):
            return {"ok": False, "error": f"layer {path} is not readable by the sandbox user "
                                          f"(uid {os.getuid()} in the node namespace)"}
        why = layerfs.unpack_layer(path, offset, dest)
        if why is not None:
            return {"ok": False, "error": why}
        self.layers.add(key)
        return {"ok": True, "dir": dest}

    def unmount_layer(self, key: str) -> dict:
        if key not in self.layers:
            return {"ok": False, "error": f"layer {key} is not unpacked"}
        self.layers.discard(key)
        layerfs.remove_layer(layerfs.layer_dir(self.layers_dir, key))
        return {"ok": True}

    def _extract_image(self, key: str, path: str, offset: int, mnt: str) -> dict:
        """The lower layer for kernels whose overlay cannot stack on FUSE and hosts without
        fuse-overlayfs: the squashfs unpacked once (as this namespace's root, so image uid 0 is
        ours) into the host state dir, bound read-only under images/."""
        dest = self._extracted(key)
        argv = ["unsquashfs", "-no-progress", "-no-xattrs", "-o", str(offset), "-d", dest, path]
        try:
            res = subprocess.run(argv, stdin=subprocess.DEVNULL, capture_output=True, timeout=EXTRACT_TIMEOUT_S,
                                 pass_fds=(self.host_state,))
        except subprocess.TimeoutExpired:
            res = None
        if res is None or res.returncode != 0:
            shutil.rmtree(dest, ignore_errors=True)
            os.rmdir(mnt)
            why = f"exit {res.returncode}: {res.stderr.decode(errors='replace').strip()[-1000:]}" if res \
                else f"timed out after {EXTRACT_TIMEOUT_S}s"
            return {"ok": False, "error": f"{argv} failed ({why})"}
        nsutil.mount(dest, mnt, None, nsutil.MS_BIND)
        nsutil.mount(dest, mnt, None, nsutil.MS_BIND | nsutil.MS_REMOUNT | nsutil.MS_RDONLY
                     | nsutil.MS_NOSUID | nsutil.MS_NODEV)
        self.mounts[key] = None
        return {"ok": True, "mountpoint": mnt}

    def _extracted(self, key: str) -> str:
        return f"/proc/self/fd/{self.host_state}/extracted/{key}"

    def unmount_image(self, key: str) -> dict:
        if key not in self.mounts:
            return {"ok": False, "error": f"image {key} is not mounted"}
        proc = self.mounts.pop(key)
        mnt = os.path.join(self.images_dir, key)
        try:
            nsutil.umount(mnt, nsutil.MNT_DETACH)
        except OSError:
            pass
        if proc is None:   # an extracted copy: removed with the last reference
            shutil.rmtree(self._extracted(key), ignore_errors=True)
            os.rmdir(mnt)
            return {"ok": True}
        proc.terminate()
        try:
            proc.wait(timeout=5)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        os.rmdir(mnt)
        return {"ok": True}

    def create(self, req: dict, fd: int) -> dict:
        """A builder for one sandbox, answering the agent on `fd` (its socket for this sandbox):
        native (the agent sends the request there, as to a spare), or for fuse-overlayfs a
        Python one given `req`."""
        if req.get("overlay") == "fuse-overlayfs":
            if req.get("layer_keys"):
                return {"ok": False, "error": "layers need the kernel overlay (Linux 6.5 or later): "
                                              "fuse-overlayfs cannot show them as the sandbox's own"}
            if req.get("image_key") not in self.mounts:
                return {"ok": False, "error": f"image {req.get('image_key')} is not mounted"}
            self._fork_builder(req, fd)
        else:
            self._spawn_builder(fd)
        return {"ok": True}

    def sandbox_op(self, req: dict, fd: int) -> dict:
        """Fork a helper that enters the sandbox's mount namespace and answers on `fd`."""
        self._settle(req.get("id"))
        rec = self.sandboxes.get(req.get("id"))
        if rec is None:
            return {"ok": False, "error": f"no sandbox {req.get('id')!r}"}
        dup = os.dup(fd)
        pid = os.fork()
        if pid == 0:
            code = 1
            try:
                _close_fds_except({0, 1, 2, dup, rec["mnt_fd"]})
                sock = socket.socket(fileno=dup)
                try:
                    nsutil.setns(rec["mnt_fd"], nsutil.CLONE_NEWNS)
                    reply = sbxinit.handle_op(req["req"], rec)
                except Exception as exc:  # reported to the agent, which raises SandboxError
                    reply = {"ok": False, "error": f"{type(exc).__name__}: {exc}"}
                framing.send_msg(sock, reply)
                code = 0
            finally:
                os._exit(code)
        os.close(dup)
        return {"ok": True}

    def finish_dead(self, sid: str) -> None:
        """The sandbox's init has exited (the agent killed it through its pidfd: `destroy`), so
        every process of its PID namespace is gone: drop its mount namespaces (tmpfs, overlay,
        /dev, /proc go with them), its fuse-overlayfs daemon and its directory."""
        rec = self.sandboxes.pop(sid)
        if rec.get("pidfd") is not None:
            self.sel.unregister(rec["pidfd"])
            os.close(rec["pidfd"])
        try:
            os.waitpid(int(rec["init_pid"]), os.WNOHANG)   # our child (reparented to this PID 1)
        except ChildProcessError:
            pass
        if rec.get("daemon_pid") and not _kill_and_wait(int(rec["daemon_pid"]), None, DESTROY_TIMEOUT_S):
            self.leaked.append(f"sandbox {sid}: fuse-overlayfs {rec['daemon_pid']} did not die")
        os.close(rec["mnt_fd"])
        os.close(rec["init_mnt_fd"])
        try:
            os.rmdir(rec["sbx"])
        except OSError:
            pass

    def settle(self, timeout_s: float, ids: list[str]) -> dict:
        """Wait until the sandboxes `ids` (destroyed by the agent) are gone: processes, mount
        namespaces, directory. Names what is left (a leak)."""
        deadline = time.monotonic() + timeout_s
        for sid in ids:
            self._settle(sid)
        poller = select.poll()   # not select(): pidfds pass 1024 on a busy node
        live = {rec["pidfd"]: sid for sid, rec in self.sandboxes.items() if rec.get("pidfd") is not None}
        for fd in live:   # every init that has exited, destroyed earlier or not, before answering
            poller.register(fd, select.POLLIN)
        for fd, _ in poller.poll(0):
            self.finish_dead(live[fd])
        poller = select.poll()
        waiting = {self.sandboxes[sid]["pidfd"]: sid for sid in ids if sid in self.sandboxes}
        for fd in waiting:
            poller.register(fd, select.POLLIN)
        while waiting:
            remaining = deadline - time.monotonic()
            ready = poller.poll(max(remaining, 0) * 1000) if remaining > 0 else []
            if not ready:
                self.leaked += [f"sandbox {sid}: init {self.sandboxes[sid]['init_pid']} did not die in {timeout_s}s"
                                for sid in waiting.values()]
                break
            for fd, _ in ready:
                poller.unregister(fd)
                self.finish_dead(waiting.pop(fd))
        leaked, self.leaked = self.leaked, []
        if leaked:
            return {"ok": False, "error": "; ".join(leaked)}
        return {"ok": True}


def _close_fds_except(keep: set[int]) -> None:
    lo = 3
    for fd in sorted(k for k in keep if k >= 3):
        os.closerange(lo, fd)
        lo = fd + 1
    os.closerange(lo, 1 << 20)


def _kill_and_wait(pid: int, pidfd: int | None, timeout_s: float) -> bool:
    own = pidfd is None
    try:
        if own:
            pidfd = os.pidfd_open(pid)
    except ProcessLookupError:
        return True
    try:
        signal.pidfd_send_signal(pidfd, signal.SIGKILL)
    except ProcessLookupError:
        pass
    try:
        poller = select.poll()   # not select(): pidfds pass 1024 on a busy node
        poller.register(pidfd, select.POLLIN)
        ready = poller.poll(timeout_s * 1000)
        if ready:
            try:
                os.waitpid(pid, os.WNOHANG)   # it is our child (reparented to this PID 1)
            except ChildProcessError:
                pass
        return bool(ready)
    finally:
        if own:
            os.close(pidfd)


# The holder's fixed flags: flag -> (type, default; None = required). Only SandboxRuntime passes them.
FLAGS = {"--ctl-fd": (int, None), "--state": (str, None), "--init-fd": (int, None),
         "--spares-fd": (int, None), "--fuse-shim-fd": (int, -1), "--layer-cache-mb": (int, 4096)}


def parse_args(argv: list[str]) -> dict:
    """`--flag value` pairs of FLAGS -> {"ctl_fd": 5, "state": "/tmp/...", ...}; a wrong command
    line is the runtime's bug: SystemExit naming it (the runtime reports the holder's stderr)."""
    given = dict(zip(argv[0::2], argv[1::2]))
    unknown = sorted(set(given) - set(FLAGS))
    missing = sorted(f for f, (_, default) in FLAGS.items() if default is None and f not in given)
    if len(argv) % 2 or unknown or missing:
        raise SystemExit(f"nodeagent.sandbox.zygote (internal; started by SandboxRuntime): bad command line "
                         f"{argv!r}: unknown {unknown}, missing {missing}; flags: {' '.join(FLAGS)}")
    return {f[2:].replace("-", "_"): kind(given.get(f, default)) for f, (kind, default) in FLAGS.items()}


def main(argv: list[str] | None = None) -> int:
    args = parse_args(sys.argv[1:] if argv is None else argv)
    if args["fuse_shim_fd"] >= 0:
        os.set_inheritable(args["fuse_shim_fd"], False)   # only the squashfuse daemons get it
    ctl = socket.socket(fileno=args["ctl_fd"])
    nsutil.prctl(nsutil.PR_SET_PDEATHSIG, signal.SIGKILL)
    nsutil.unshare(nsutil.CLONE_NEWUSER | nsutil.CLONE_NEWNS)
    framing.send_msg(ctl, {"stage": "unshared", "pid": os.getpid()})
    if framing.recv_msg(ctl).get("stage") != "mapped":
        return 2
    os.setresgid(0, 0, 0)
    os.setgroups([])
    os.setresuid(0, 0, 0)
    # Both are reset by the credential change. Dumpable lets the builders (same uid) write
    # their sandbox's /proc/PID/uid_map; no other uid can reach these processes.
    nsutil.prctl(nsutil.PR_SET_PDEATHSIG, signal.SIGKILL)
    nsutil.prctl(nsutil.PR_SET_DUMPABLE, 1)
    nsutil.unshare(nsutil.CLONE_NEWPID)
    pid = os.fork()
    if pid:
        signal.signal(signal.SIGTERM, lambda *_: os.kill(pid, signal.SIGKILL))
        _, status = os.waitpid(pid, 0)
        return os.waitstatus_to_exitcode(status)
    nsutil.prctl(nsutil.PR_SET_PDEATHSIG, signal.SIGKILL)
    node = NodeInit(ctl, args["state"], args["init_fd"], socket.socket(fileno=args["spares_fd"]),
                    args["fuse_shim_fd"], args["layer_cache_mb"])
    try:
        node.setup()
    except OSError as exc:
        framing.send_msg(ctl, {"stage": "failed", "error": str(exc)})
        os._exit(3)
    framing.send_msg(ctl, {"stage": "ready", "uid_map": open("/proc/self/uid_map").read()})
    # Density: every builder and init is a fork of this process. Frozen objects are never
    # scanned by the collector, so the forks do not dirty (copy) the pages that hold them.
    gc.collect()
    gc.freeze()
    node.start_factory()
    node.fill_spares()
    node.serve()
    os._exit(0)


if __name__ == "__main__":
    sys.exit(main())
