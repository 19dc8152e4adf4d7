"""One sandbox: its builder (outside, root of the node namespace) and its init (inside).

The builder is forked by the node init. It unshares a mount namespace, mounts a tmpfs capped
by `size=` and `nr_inodes=`, an OverlayFS (`userxattr`; or fuse-overlayfs on kernels < 6.5)
whose lower layer is the node's shared read-only squashfuse mount of the image and whose upper
and work dirs live on that tmpfs, a minimal /dev, then unshares PID, network, IPC and UTS
namespaces and forks the sandbox init. It hands its mount namespace (an fd) to the node init,
the init's socket (an fd) to the agent, and exits: no process per sandbox but the init.

The init (PID 1 of the sandbox; the builder moves it into its cgroups through files the agent
opened) mounts a fresh /proc with sensitive paths masked, brings up `lo` (the only
interface), pivots into the overlay, then unshares a *child* user namespace whose uid/gid maps
the builder writes (`0 <slice base> <slice size>`: a disjoint slice of the node's subordinate
ids per sandbox), and a cgroup namespace rooted at its cgroup. From then on it owns no mount
or network namespace (its UTS namespace, made at create time for the hostname, is its own).
It runs commands on request, each in its own session with rlimits (for caps no cgroup enforces), the seccomp filter,
an output cap and a wall-clock kill; with an egress socket it relays 127.0.0.1:3128 to it.

File operations (`handle_op`: write, read, diff, apply) run in a short-lived fork of the node
init that entered the sandbox's mount namespace. Replies from the init are untrusted data (the
workload shares its uid): the agent checks their shape and size (`checked_exec_reply`).
Standard library and nodeagent.{nsutil,framing,seccomp} only.
"""
from __future__ import annotations

import os
import resource
import selectors
import signal
import socket
import stat
import subprocess
import threading
import time

from nodeagent import framing, nsutil, seccomp

SANDBOX_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
DEV_NODES = ("null", "zero", "full", "random", "urandom", "tty")
# /proc as OCI runtimes leave it: host-wide files masked (/dev/null over them), host-wide
# directories hidden (an empty read-only tmpfs), kernel knobs read-only.
PROC_MASKED = ("kcore", "keys", "timer_list", "timer_stats", "sched_debug", "latency_stats",
               "sysrq-trigger", "kallsyms")
PROC_HIDDEN_DIRS = ("acpi", "asound", "scsi")
PROC_READONLY = ("sys", "bus", "fs", "irq")
INIT_REPLY_MAX_BYTES = 32 * 1024 * 1024
FUSE_MOUNT_TIMEOUT_S = 10.0
EGRESS_PORT = 3128
STRAY_GRACE_S = 0.02
EGRESS_MAX_CONNECTIONS = 32
WHITEOUT = ".wh."
OPAQUE_MARKER = ".wh..wh..opq"


def _w(path: str, data: str) -> None:
    with open(path, "w") as f:
        f.write(data)


# --------------------------------------------------------------------------- builder

def make_dev_template(path: str) -> None:
    """The sandbox /dev, built once per node: a 0755 tmpfs (nosuid, noexec) with null, zero,
    full, random, urandom, tty bind-mounted, the fd symlinks and an empty shm dir. Each sandbox
    gets a recursive bind of it (one mount call) plus its own capped /dev/shm."""
    os.makedirs(path, 0o755, exist_ok=True)
    nsutil.mount("paddock-dev", path, "tmpfs", nsutil.MS_NOSUID | nsutil.MS_NOEXEC, "mode=0755,size=64k")
    for name in DEV_NODES:
        target = os.path.join(path, name)
        open(target, "w").close()
        nsutil.mount(f"/dev/{name}", target, None, nsutil.MS_BIND)
    for name, dest in (("fd", "/proc/self/fd"), ("stdin", "/proc/self/fd/0"),
                       ("stdout", "/proc/self/fd/1"), ("stderr", "/proc/self/fd/2")):
        os.symlink(dest, os.path.join(path, name))
    os.mkdir(os.path.join(path, "shm"), 0o1777)
    os.chmod(os.path.join(path, "shm"), 0o1777)


def _tmpfs_caps(limits: dict) -> str:
    return f"size={int(limits.get('disk_mb', 64))}m,nr_inodes={int(limits.get('inodes', 16384))}"


def build_root(sbx: str, lower: str, overlay: str = "kernel", dev_template: str | None = None,
               limits: dict | None = None) -> tuple[str, subprocess.Popen | None]:
    """The writable root at `sbx`/root: a tmpfs (resized by `finish_root`), the overlay over the
    image, /work /proc /dev /tmp, the /dev template and a /dev/shm. Needs no sandbox id, caps or
    ids: spare builders do it ahead of time for the image last asked for."""
    os.makedirs(sbx, mode=0o755)
    flags = nsutil.MS_NOSUID | nsutil.MS_NODEV
    nsutil.mount("paddock-sbx", sbx, "tmpfs", flags, "mode=0755," + _tmpfs_caps(limits or {}))
    for d in ("upper", "work", "root"):
        os.mkdir(os.path.join(sbx, d), 0o755)
    root = os.path.join(sbx, "root")
    daemon = None
    if overlay == "fuse-overlayfs":
        daemon = _fuse_overlay(lower, sbx, root)
    else:
        nsutil.mount("paddock-overlay", root, "overlay", flags,
                     f"lowerdir={lower},upperdir={sbx}/upper,workdir={sbx}/work,userxattr")
    for d in ("work", "proc", "dev", "tmp"):
        os.makedirs(os.path.join(root, d), exist_ok=True)
    os.chmod(os.path.join(root, "tmp"), 0o1777)
    dev = os.path.join(root, "dev")
    if dev_template:
        nsutil.mount(dev_template, dev, None, nsutil.MS_BIND | nsutil.MS_REC)
    else:
        make_dev_template(dev)
    shm = os.path.join(dev, "shm")
    nsutil.mount("paddock-shm", shm, "tmpfs", flags | nsutil.MS_NOEXEC, "mode=1777,size=16m")
    return root, daemon


def finish_root(sbx: str, root: str, limits: dict, base: int, files: dict, built_with: dict | None) -> None:
    """The create-time part: the tmpfs gets the sandbox's size and inode caps (if the root was
    built with others), /work its owner (the sandbox's root), then the task's files."""
    if built_with is None or _tmpfs_caps(built_with) != _tmpfs_caps(limits):
        nsutil.mount("paddock-sbx", sbx, None, nsutil.MS_REMOUNT | nsutil.MS_NOSUID | nsutil.MS_NODEV,
                     _tmpfs_caps(limits))
    os.chown(os.path.join(root, "work"), base, base)
    os.chmod(os.path.join(root, "work"), 0o755)
    for rel, data in (files or {}).items():
        _write_file(root, "/work/" + rel, data, base, owner="agent")


def give_root(init: socket.socket, root: str) -> None:
    """Tell a waiting init where its root is; it mounts /proc there and pivots into it."""
    framing.send_msg(init, {"stage": "root", "root": root})


def _fuse_overlay(lower: str, sbx: str, root: str) -> subprocess.Popen:
    """fuse-overlayfs in the foreground, a child of the builder (the node init kills it on destroy)."""
    argv = ["fuse-overlayfs", "-f", "-o",
            f"lowerdir={lower},upperdir={sbx}/upper,workdir={sbx}/work,allow_other,noxattrs=1", root]
    # No PDEATHSIG: the builder exits; the daemon lives in the node PID namespace (it dies with
    # the node) and the node init kills it when the sandbox is destroyed.
    proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + FUSE_MOUNT_TIMEOUT_S
    while not _is_mountpoint(root):
        if proc.poll() is not None or time.monotonic() > deadline:
            proc.kill()
            raise RuntimeError(f"{argv} failed (exit {proc.wait()})")
        time.sleep(0.002)
    return proc


def _is_mountpoint(path: str) -> bool:
    with open("/proc/self/mountinfo") as f:
        return any(line.split()[4] == path for line in f)


def enter_mount_ns() -> None:
    """A builder's own mount namespace: it receives the node's image mounts, sends nothing."""
    nsutil.unshare(nsutil.CLONE_NEWNS)
    nsutil.mount("none", "/", None, nsutil.MS_REC | nsutil.MS_SLAVE)


def fork_init(seccomp_prog: "seccomp.Program | bytes" = b"", cgroup_fds: list[int] = ()) -> tuple[int, socket.socket]:
    """New PID, network, IPC and UTS namespaces and the sandbox init forked into them, waiting
    for its root. Spare builders do this ahead of time (the init is then forked from a process
    that has done little, so it shares more pages with the node init). With fuse-overlayfs it
    runs after the root is built: the daemon must stay outside the sandbox's PID namespace.
    `cgroup_fds`: move the init into these cgroups now."""
    nsutil.unshare(nsutil.CLONE_NEWPID | nsutil.CLONE_NEWNET | nsutil.CLONE_NEWIPC | nsutil.CLONE_NEWUTS)
    mon_end, init_end = socket.socketpair()
    pid = os.fork()
    if pid == 0:
        code = 1
        try:
            mon_end.close()
            keep = {0, 1, 2, init_end.fileno()}
            for fd in os.listdir("/proc/self/fd"):
                if int(fd) not in keep:
                    try:
                        os.close(int(fd))
                    except OSError:
                        pass
            code = run_init(init_end, seccomp_prog)
        finally:
            os._exit(code)
    init_end.close()
    # The files were opened by the agent: its credentials authorise the write. A v1 migration
    # waits for an RCU grace period; the init unshares its cgroup namespace once "mapped" arrives.
    for fd in cgroup_fds:
        os.write(fd, str(pid).encode())
    return pid, mon_end


def run_builder(agent: socket.socket, zygote: socket.socket, req: dict, lower: str, sbx_root: str,
                init_pid: int | None, init: socket.socket | None, make_init=None,
                prepared: tuple[str, str, dict] | None = None) -> int:
    """Second half of a builder (after `fork_init`; a spare has also done `prepare_root`:
    `prepared` = (sbx, root, the limits it was built with), its init mapped and waiting).
    Finishes the root, starts the init, hands the mount namespace (an fd) to the node init
    and the init's socket to the agent."""
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    base, size = int(req["slice_base"]), int(req["slice_size"])
    daemon, pid = None, init_pid
    stages = {"builder": time.monotonic()}   # CLOCK_MONOTONIC: comparable across processes
    try:
        if prepared is None:
            sbx = os.path.join(sbx_root, req["id"])
            built_with = req.get("limits") or {}
            root, daemon = build_root(sbx, lower, req.get("overlay", "kernel"),
                                      os.path.join(os.path.dirname(sbx_root), "dev"), built_with)
            if init_pid is None:
                pid, init = make_init()
            give_root(init, root)
        else:
            sbx, root, built_with, went, init_ns_fd = prepared
        finish_root(sbx, root, req.get("limits") or {}, base, req.get("files") or {}, built_with)
        stages["root_built"] = time.monotonic()
        if prepared is None:
            stages.update(map_init(pid, base, size, init))
        go = go_message(req)
        if prepared is None or went is None:
            egress = [os.open(req["egress_socket"], os.O_PATH)] if req.get("egress_socket") else []
            ready, init_ns_fd = start_init(init, dict(go or {}, hostname=req.get("hostname", "sandbox"),
                                                      cgroup_caps=req.get("cgroup_caps") or [],
                                                      limits=req.get("limits") or {}), egress)
            stages.update(ready)
            for fd in egress:
                os.close(fd)
        elif went != go:   # the node init hands a started spare only to a create it matches
            raise RuntimeError(f"spare init started with {went}, asked for {go}")
        uid_map = open(f"/proc/{pid}/uid_map").read().strip()
        ns_fd = os.open("/proc/self/ns/mnt", os.O_RDONLY | os.O_CLOEXEC)
        # With the init's own mount namespace (see run_init).
        framing.send_msg(zygote, {"id": req["id"], "init_pid": pid, "root": root, "sbx": sbx, "base": base,
                                  "lower": lower, "daemon_pid": daemon.pid if daemon else None},
                         [ns_fd, init_ns_fd])
    except Exception as exc:
        for p in ([pid] if pid else []) + ([daemon.pid] if daemon else []):
            try:
                os.kill(p, signal.SIGKILL)
            except ProcessLookupError:
                pass
        framing.send_msg(agent, {"ok": False, "error": f"sandbox setup failed: {type(exc).__name__}: {exc}"})
        return 1
    stages["ready"] = time.monotonic()
    framing.send_msg(agent, {"ok": True, "init_pid": pid, "stages": stages, "uid_map": uid_map},
                     [init.fileno()])
    return 0


def prepare_root(sbx: str, lower: str, dev_template: str, limits: dict, init_pid: int,
                 init: socket.socket, base: int, size: int, go: dict | None = None) -> tuple[str, str, dict, dict | None]:
    """What a spare builder does ahead of time: the root on its image, the init inside it and
    mapped onto the spare's id slice, /work owned by that slice's root; with `go` (the settings
    of the create it expects, see `go_message`), the init started with them too, so a matching
    create only finishes the root. Returns (sbx, root, limits built with, go sent or None)."""
    root, _ = build_root(sbx, lower, "kernel", dev_template, limits)
    give_root(init, root)
    os.chown(os.path.join(root, "work"), base, base)
    map_init(init_pid, base, size, init)
    init_ns_fd = None
    if go is not None:
        _, init_ns_fd = start_init(init, go, [])
        # Not warmed further (a dummy spawn would save ~0.6 ms on the first exec but copy
        # ~0.2 MiB of the init's pages per idle sandbox: benchmarks/density.py).
    return sbx, root, limits, go, init_ns_fd


def go_message(req: dict) -> dict | None:
    """The init's create-time settings (hostname, cgroup-enforced caps, limits) for a create or
    spare request, or None when they include an fd (an egress socket: sent at create time)."""
    if req.get("egress_socket"):
        return None
    return {"hostname": req.get("hostname", "sandbox"), "cgroup_caps": list(req.get("cgroup_caps") or []),
            "limits": dict(req.get("limits") or {})}


class InitConfig:
    """What the sandbox init needs besides its root: the seccomp program, which caps the cgroups
    enforce (the rest fall back to rlimits), and the egress socket (an O_PATH fd) if any."""

    def __init__(self, seccomp_prog: "seccomp.Program | bytes" = b"", cgroup_caps=(), egress_fd: int | None = None,
                 limits: dict | None = None):
        self.seccomp_prog, self.cgroup_caps, self.egress_fd = seccomp_prog, set(cgroup_caps), egress_fd
        self.limits = limits or {}
        # Fast path: with memory and pids in cgroups, the remaining rlimits and the seccomp
        # filter go on the init itself (inherited by every command), and commands are started
        # with vfork+exec (no copy of the init's memory). Otherwise each command's child sets
        # its own rlimits (RLIMIT_AS must not bind the init) and installs the filter.
        self.fast = {"memory", "pids"} <= self.cgroup_caps
        self.filtered = False


def map_init(pid: int, base: int, size: int, init: socket.socket) -> dict:
    """The init has entered its root and unshared its user namespace: map it onto the id slice
    (`0 <base> <size>`, setgroups denied) and wait until it has dropped to that namespace."""
    msg = framing.recv_msg(init, max_bytes=4096)
    if msg.get("stage") != "unshared":
        raise RuntimeError(f"sandbox init failed before its user namespace: {msg.get('error', msg)}")
    t_unshared = time.monotonic()
    _w(f"/proc/{pid}/uid_map", f"0 {base} {size}\n")
    _w(f"/proc/{pid}/setgroups", "deny")
    _w(f"/proc/{pid}/gid_map", f"0 {base} {size}\n")
    framing.send_msg(init, {"stage": "mapped"})
    msg = framing.recv_msg(init, max_bytes=4096)
    if msg.get("stage") != "prepared":
        raise RuntimeError(f"sandbox init failed in its user namespace: {msg.get('error', msg)}")
    return {"init_unshared": t_unshared, "init_prepared": time.monotonic()}


def start_init(init: socket.socket, go: dict, fds: list[int]) -> tuple[dict, int]:
    """The create-time message: hostname, caps, egress socket. The init answers once commands
    can run (rlimits and seccomp in place), with its own mount namespace (an fd)."""
    framing.send_msg(init, dict(go, stage="go"), fds)
    msg, got = framing.recv_msg(init, max_bytes=4096, with_fds=True)
    if msg.get("stage") != "ready" or len(got) != 1:
        for fd in got:
            os.close(fd)
        raise RuntimeError(f"sandbox init failed: {msg.get('error', msg)}")
    return {"init_ready": time.monotonic()}, got[0]


def _resolve(root: str, path: str) -> str:
    """Map an absolute sandbox path into the merged tree, refusing '..' and symlink escapes."""
    if not path.startswith("/") or ".." in path.split("/"):
        raise ValueError(f"sandbox path {path!r} must be absolute without '..'")
    full = os.path.normpath(os.path.join(root, path.lstrip("/")))
    parent = os.path.realpath(os.path.dirname(full))
    if parent != root and not parent.startswith(root + "/"):
        raise ValueError(f"sandbox path {path!r} leaves the sandbox through a symlink")
    return os.path.join(parent, os.path.basename(full))


def _write_file(root: str, path: str, data: bytes, base: int, owner: str, mode: int = 0o644) -> None:
    full = _resolve(root, path)
    rel_dirs = os.path.relpath(os.path.dirname(full), root).split("/")
    cur = root
    for part in rel_dirs:
        if part in ("", "."):
            continue
        cur = os.path.join(cur, part)
        if not os.path.isdir(cur):
            os.mkdir(cur, 0o755)
            if owner == "agent":
                os.chown(cur, base, base)
    if os.path.islink(full):
        os.unlink(full)
    fd = os.open(full, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW, mode)
    try:
        os.write(fd, data)
        os.fchmod(fd, mode)
        if owner == "agent":
            os.fchown(fd, base, base)
        else:
            os.fchown(fd, 0, 0)
    finally:
        os.close(fd)


def handle_op(req: dict, rec: dict) -> dict:
    """A file operation on a sandbox, run in a short-lived fork of the node init that has
    entered the sandbox's mount namespace (`rec`: root, sbx, base, lower of the sandbox)."""
    op, root, base = req.get("op"), rec["root"], rec["base"]
    if op == "write_files":
        for path, data in req["files"].items():
            _write_file(root, path, data, base, req.get("owner", "agent"), int(req.get("mode", 0o644)))
        return {"ok": True}
    if op == "read_file":
        cap = int(req.get("max_bytes", 1 << 20))
        with _open_nofollow(_resolve(root, req["path"])) as f:
            data = f.read(cap + 1)
        return {"ok": True, "data": data[:cap], "truncated": len(data) > cap}
    if op == "diff":
        return {"ok": True, "changes": upper_diff(rec["sbx"], req.get("prefix", "/"),
                                                  int(req.get("max_bytes", 8 << 20)), rec.get("lower"))}
    if op == "apply":
        apply_changes(root, req["changes"], base)
        return {"ok": True}
    if op == "usage":
        st = os.statvfs(rec["sbx"])
        return {"ok": True, "disk_used_bytes": (st.f_blocks - st.f_bfree) * st.f_frsize}
    return {"ok": False, "error": f"unknown op {op!r}"}


def checked_exec_reply(reply) -> dict:
    ok = (isinstance(reply, dict) and isinstance(reply.get("exit_code"), int)
          and isinstance(reply.get("stdout"), bytes) and isinstance(reply.get("stderr"), bytes))
    if not ok:
        return {"ok": False, "error": "sandbox init sent a malformed reply", "dead": True}
    return {"ok": True, "exit_code": reply["exit_code"], "stdout": reply["stdout"],
            "stderr": reply["stderr"], "timed_out": bool(reply.get("timed_out")),
            "truncated": bool(reply.get("truncated")), "wall_s": float(reply.get("wall_s", 0.0))}


def upper_diff(sbx: str, prefix: str, max_bytes: int, lower: str | None = None) -> list[dict]:
    """Changes in the overlay's upper layer under `prefix`, parents first: files added or modified
    (content, mode), directories new or changed ('dir', mode), symlinks, and deletions. Whiteouts
    are the kernel's (char 0:0, `user.overlay.whiteout`, opaque `user.overlay.opaque`) or
    fuse-overlayfs's (`.wh.NAME`, `.wh..wh..opq`); an opaque directory is 'deleted' then 'dir'."""
    upper = os.path.join(sbx, "upper")
    lower = lower or _lowerdir(os.path.join(sbx, "root"))
    start = os.path.join(upper, prefix.strip("/"))
    changes, total = [], 0

    def in_lower(rel: str):
        try:
            return os.lstat(os.path.join(lower, rel.lstrip("/"))) if lower else None
        except OSError:
            return None

    for dirpath, dirnames, filenames in os.walk(start):
        dirnames.sort()
        rel_dir = "/" + os.path.relpath(dirpath, upper) if dirpath != upper else "/"
        names = sorted(filenames + [d for d in dirnames if os.path.islink(os.path.join(dirpath, d))])
        for name in names:
            full = os.path.join(dirpath, name)
            rel = os.path.join(rel_dir, name)
            if name == OPAQUE_MARKER:
                continue
            if name.startswith(WHITEOUT):
                changes.append({"path": os.path.join(rel_dir, name[len(WHITEOUT):]), "kind": "deleted",
                                "data": None, "mode": 0})
                continue
            st = os.lstat(full)
            if (stat.S_ISCHR(st.st_mode) and st.st_rdev == 0) or _xattr(full, "overlay.whiteout") is not None:
                changes.append({"path": rel, "kind": "deleted", "data": None, "mode": 0})
            elif stat.S_ISLNK(st.st_mode):
                changes.append({"path": rel, "kind": "symlink", "data": os.readlink(full).encode(),
                                "mode": 0o777})
            elif stat.S_ISREG(st.st_mode):
                total += st.st_size
                if total > max_bytes:
                    raise ValueError(f"diff exceeds {max_bytes} bytes")
                with _open_nofollow(full) as f:
                    data = f.read()
                kind = "modified" if in_lower(rel) is not None else "added"
                changes.append({"path": rel, "kind": kind, "data": data, "mode": stat.S_IMODE(st.st_mode)})
        for name in list(dirnames):
            full = os.path.join(dirpath, name)
            if os.path.islink(full):
                continue
            rel = os.path.join(rel_dir, name)
            st, low = os.lstat(full), in_lower(rel)
            opaque = (_xattr(full, "overlay.opaque") == b"y"
                      or os.path.lexists(os.path.join(full, OPAQUE_MARKER)))
            if opaque and low is not None:
                changes.append({"path": rel, "kind": "deleted", "data": None, "mode": 0})
            if opaque or low is None or stat.S_IMODE(low.st_mode) != stat.S_IMODE(st.st_mode) \
                    or not stat.S_ISDIR(low.st_mode):
                changes.append({"path": rel, "kind": "dir", "data": None, "mode": stat.S_IMODE(st.st_mode)})
    return _parents_first(changes)


def _parents_first(changes: list[dict]) -> list[dict]:
    """Order so a directory (and its deletion) precedes what is inside it; stable otherwise."""
    rank = {"deleted": 0, "dir": 1}
    return sorted(changes, key=lambda c: (c["path"].rstrip("/").split("/"), rank.get(c["kind"], 2)))


def _xattr(path: str, name: str) -> bytes | None:
    for ns in ("user.", "trusted."):
        try:
            return os.getxattr(path, ns + name, follow_symlinks=False)
        except OSError:
            continue
    return None


def apply_changes(root: str, changes: list[dict], base: int) -> None:
    """Replay another sandbox's diff into this merged tree; everything is owned by the agent."""
    import shutil
    for c in changes:
        path, kind = c["path"], c["kind"]
        if kind not in ("added", "modified", "deleted", "symlink", "dir"):
            raise ValueError(f"change {path!r} has unknown kind {kind!r}")
        full = _resolve(root, path)
        if full == root:
            raise ValueError("a change may not replace the sandbox root")
        mode = int(c.get("mode") or 0) & 0o1777   # never setuid/setgid
        if kind == "deleted":
            if os.path.isdir(full) and not os.path.islink(full):
                shutil.rmtree(full)
            elif os.path.lexists(full):
                os.unlink(full)
        elif kind == "dir":
            if os.path.lexists(full) and not _is_real_dir(full):
                os.unlink(full)
            if not _is_real_dir(full):
                _write_parents(root, full, base)
                os.mkdir(full)
                os.lchown(full, base, base)
            os.chmod(full, mode or 0o755)
        elif kind == "symlink":
            _write_parents(root, full, base)
            if os.path.isdir(full) and not os.path.islink(full):
                shutil.rmtree(full)
            elif os.path.lexists(full):
                os.unlink(full)
            os.symlink((c.get("data") or b"").decode(), full)
            os.lchown(full, base, base)
        else:
            if os.path.isdir(full) and not os.path.islink(full):
                shutil.rmtree(full)
            _write_file(root, path, c.get("data") or b"", base, owner="agent", mode=mode or 0o644)


def _is_real_dir(path: str) -> bool:
    try:
        return stat.S_ISDIR(os.lstat(path).st_mode)
    except FileNotFoundError:
        return False


def _open_nofollow(path: str):
    """Open for reading, refusing a symlink in the last component (it could point at a host
    path: these helpers run in the node's view of the filesystem)."""
    return os.fdopen(os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC), "rb")


def _write_parents(root: str, full: str, base: int) -> None:
    cur = root
    for part in os.path.relpath(os.path.dirname(full), root).split("/"):
        if part in ("", "."):
            continue
        cur = os.path.join(cur, part)
        if not os.path.isdir(cur):
            os.mkdir(cur, 0o755)
            os.chown(cur, base, base)


def _lowerdir(merged: str) -> str | None:
    """The lowerdir option of the overlay mounted at `merged` (the node's image mount)."""
    with open("/proc/self/mountinfo") as f:
        for line in f:
            if line.split()[4] == merged:
                opts = line.split(" - ")[1].split()[2]
                return next((o[9:] for o in opts.split(",") if o.startswith("lowerdir=")), None)
    return None


# --------------------------------------------------------------------------- init (PID 1)

def _init_setup(root: str) -> None:
    # Its own mount namespace: pivot_root must not move the builder's root as well.
    nsutil.unshare(nsutil.CLONE_NEWNS)
    proc = os.path.join(root, "proc")
    nsutil.mount("proc", proc, "proc", nsutil.MS_NOSUID | nsutil.MS_NODEV | nsutil.MS_NOEXEC)
    locked = nsutil.MS_NOSUID | nsutil.MS_NODEV | nsutil.MS_NOEXEC
    for name in PROC_MASKED:
        path = os.path.join(proc, name)
        if os.path.exists(path):
            nsutil.mount("/dev/null", path, None, nsutil.MS_BIND)
    for name in PROC_HIDDEN_DIRS:
        path = os.path.join(proc, name)
        if os.path.isdir(path):
            nsutil.mount("paddock-hidden", path, "tmpfs", locked | nsutil.MS_RDONLY, "size=0,mode=0555")
    for name in PROC_READONLY:
        path = os.path.join(proc, name)
        if os.path.isdir(path):
            nsutil.mount(path, path, None, nsutil.MS_BIND | nsutil.MS_REC)
            nsutil.mount(path, path, None, nsutil.MS_BIND | nsutil.MS_REMOUNT | nsutil.MS_RDONLY | locked)
    os.chdir(root)
    nsutil.pivot_root(".", ".")
    nsutil.umount(".", nsutil.MNT_DETACH)
    os.chdir("/")


def run_init(mon: socket.socket, seccomp_prog: "seccomp.Program | bytes" = b"") -> int:
    """PID 1 of the sandbox. Protocol with its builder: "root" -> (mount /proc, pivot, unshare the
    user namespace) "unshared" -> "mapped" -> (become its root, cgroup namespace, no_new_privs)
    "prepared" -> "go" (hostname, caps, egress socket) -> (own UTS namespace, rlimits, seccomp)
    "ready"; then one command per request. A spare's init stops at "prepared" until used."""
    # No PDEATHSIG: the builder exits once the sandbox is up. The init ends when its socket
    # closes (the agent is gone) or when the node init dies (the node PID namespace goes).
    nsutil.loopback_up()   # its network namespace is its own already: no need to wait for the root
    try:
        msg = framing.recv_msg(mon, max_bytes=65536)
        if msg.get("stage") != "root":
            return 1
        try:
            _init_setup(msg["root"])
            nsutil.unshare(nsutil.CLONE_NEWUSER)   # needs a single-threaded process: relay starts later
        except OSError as exc:
            framing.send_msg(mon, {"stage": "failed", "error": str(exc)})
            return 1
        framing.send_msg(mon, {"stage": "unshared"})
        if framing.recv_msg(mon, max_bytes=4096).get("stage") != "mapped":
            return 1
        os.setresgid(0, 0, 0)
        os.setresuid(0, 0, 0)
        # The builder has moved this process into its cgroups by now: they become its root.
        nsutil.unshare(nsutil.CLONE_NEWCGROUP)
        nsutil.prctl(nsutil.PR_SET_NO_NEW_PRIVS, 1)
        nsutil.prctl(nsutil.PR_SET_DUMPABLE, 0)
        framing.send_msg(mon, {"stage": "prepared"})
        go, fds = framing.recv_msg(mon, max_bytes=65536, with_fds=True)
    except framing.FramingError:
        return 0   # the builder is gone (a spare that was never used, or a failed create)
    if go.get("stage") != "go":
        return 1
    cfg = InitConfig(seccomp_prog, go.get("cgroup_caps") or [], fds[0] if fds else None, go.get("limits"))
    try:
        # A UTS namespace of its own user namespace: the hostname is set at create time, after
        # the ids; the workload cannot change it (seccomp denies sethostname).
        nsutil.unshare(nsutil.CLONE_NEWUTS)
        nsutil.sethostname(go.get("hostname", "sandbox"))
        if cfg.egress_fd is not None:
            _start_egress_relay(cfg.egress_fd)
        if cfg.fast:
            _set_rlimits(cfg.limits, cfg.cgroup_caps)
            if cfg.seccomp_prog:
                seccomp.install(cfg.seccomp_prog)   # the init needs none of the denied calls from here on
                cfg.filtered = True
    except OSError as exc:
        framing.send_msg(mon, {"stage": "failed", "error": str(exc)})
        return 1
    # Its own mount namespace, for the node init to hold: torn down when the node init lets go
    # of it after a destroy, not in this process's exit, which destroy waits for.
    ns_fd = os.open("/proc/self/ns/mnt", os.O_RDONLY | os.O_CLOEXEC)
    framing.send_msg(mon, {"stage": "ready"}, [ns_fd])
    os.close(ns_fd)
    while True:
        try:
            req = framing.recv_msg(mon)
        except framing.FramingError:
            return 0
        framing.send_msg(mon, run_command(req, cfg))


def _start_egress_relay(sock_fd: int) -> None:
    """Listen on 127.0.0.1:3128 in the sandbox's netns; relay each connection to the node egress
    proxy's Unix socket (reached through an O_PATH fd: its path is not in the sandbox)."""
    lst = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    lst.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    lst.bind(("127.0.0.1", EGRESS_PORT))
    lst.listen(EGRESS_MAX_CONNECTIONS)
    target = f"/proc/self/fd/{sock_fd}"
    slots = threading.BoundedSemaphore(EGRESS_MAX_CONNECTIONS)

    def serve_one(conn: socket.socket) -> None:
        try:
            up = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            try:
                up.connect(target)
            except OSError:
                return
            with up:
                _splice(conn, up)
        finally:
            conn.close()
            slots.release()

    def accept_loop() -> None:
        while True:
            conn, _ = lst.accept()
            if not slots.acquire(blocking=False):
                conn.close()   # over the connection cap: refuse, do not queue
                continue
            threading.Thread(target=serve_one, args=(conn,), daemon=True).start()

    threading.Thread(target=accept_loop, daemon=True, name="egress-relay").start()


def _splice(a: socket.socket, b: socket.socket) -> None:
    sel = selectors.DefaultSelector()
    sel.register(a, selectors.EVENT_READ, b)
    sel.register(b, selectors.EVENT_READ, a)
    open_dirs = 2
    while open_dirs:
        for key, _ in sel.select():
            src, dst = key.fileobj, key.data
            try:
                chunk = src.recv(65536)
            except OSError:
                chunk = b""
            if not chunk:
                sel.unregister(src)
                open_dirs -= 1
                try:
                    dst.shutdown(socket.SHUT_WR)
                except OSError:
                    pass
                continue
            try:
                dst.sendall(chunk)
            except OSError:
                return


def _set_rlimits(lim: dict, cgroup_caps) -> None:
    mb = 1024 * 1024
    for res, val, cap in ((resource.RLIMIT_AS, lim.get("memory_mb", 0) * mb, "memory"),
                          (resource.RLIMIT_NPROC, lim.get("pids", 0), "pids"),
                          (resource.RLIMIT_FSIZE, lim.get("disk_mb", 0) * mb, None),
                          (resource.RLIMIT_NOFILE, lim.get("nofile", 0), None),
                          (resource.RLIMIT_CORE, 0, None)):
        if cap in cgroup_caps:
            continue
        if val or res == resource.RLIMIT_CORE:
            resource.setrlimit(res, (int(val), int(val)))


def _command_env(req: dict, cfg: "InitConfig") -> dict:
    env = {"PATH": SANDBOX_PATH, "HOME": "/work", "LANG": "C.UTF-8", "TERM": "dumb"}
    if cfg.egress_fd is not None:
        proxy = f"http://127.0.0.1:{EGRESS_PORT}"
        env.update({k: proxy for k in ("HTTP_PROXY", "HTTPS_PROXY", "http_proxy", "https_proxy")})
    env.update(req.get("env") or {})
    return env


def _spawn_fast(req: dict, cfg: "InitConfig", stdin_r: int, out_w: int, err_w: int) -> int:
    """vfork+exec through the subprocess machinery: new session, stdio, cwd, env, uid/gid;
    rlimits and seccomp are already on the init. Raises OSError if the command cannot start."""
    kw = {}
    if req.get("uid") is not None:
        kw = {"user": int(req["uid"]), "group": int(req["uid"])}
    try:
        p = subprocess.Popen(req["argv"], stdin=stdin_r, stdout=out_w, stderr=err_w,
                             cwd=req.get("cwd") or "/work", env=_command_env(req, cfg),
                             start_new_session=True, close_fds=True, **kw)
    except BlockingIOError:
        _kill_all_but_me()   # a fork bomb holds every PID: reclaim, try once more
        p = subprocess.Popen(req["argv"], stdin=stdin_r, stdout=out_w, stderr=err_w,
                             cwd=req.get("cwd") or "/work", env=_command_env(req, cfg),
                             start_new_session=True, close_fds=True, **kw)
    p.returncode = 0   # reaped by _reap(), never by this object
    try:
        with open(f"/proc/{p.pid}/oom_score_adj", "w") as f:
            f.write("1000")   # under memory pressure the workload dies, never the sandbox init
    except OSError:
        pass
    return p.pid


def _exec_child(req: dict, stdin_r: int, out_w: int, err_w: int, cfg: "InitConfig") -> None:
    """In the forked child: new session, rlimits (for caps no cgroup enforces), stdio, uid,
    the OOM killer's first choice, seccomp, execve. Never returns."""
    try:
        os.setsid()
        _set_rlimits(req.get("limits", {}), cfg.cgroup_caps)
        nsutil.prctl(nsutil.PR_SET_DUMPABLE, 1)   # execve makes it dumpable anyway; /proc/self is ours again
        with open("/proc/self/oom_score_adj", "w") as f:
            f.write("1000")   # under memory pressure the workload dies, never the sandbox init
        os.dup2(stdin_r, 0)
        os.dup2(out_w, 1)
        os.dup2(err_w, 2)
        os.closerange(3, 1 << 16)
        signal.signal(signal.SIGPIPE, signal.SIG_DFL)
        env = _command_env(req, cfg)
        os.chdir(req.get("cwd") or "/work")
        if req.get("uid") is not None:
            uid = int(req["uid"])
            os.setresgid(uid, uid, uid)
            os.setresuid(uid, uid, uid)
        if cfg.seccomp_prog and not cfg.filtered:
            seccomp.install(cfg.seccomp_prog)
        os.execvpe(req["argv"][0], req["argv"], env)
    except BaseException as exc:
        os.write(2, f"paddock: cannot run {req.get('argv')!r}: {exc}\n".encode())
        os._exit(127)


def run_command(req: dict, cfg: "InitConfig | None" = None) -> dict:
    argv = req.get("argv")
    if not (isinstance(argv, list) and argv and all(isinstance(a, str) for a in argv)):
        return {"exit_code": 126, "stdout": b"", "stderr": b"paddock: argv must be a non-empty list of strings\n"}
    cap = int(req.get("output_cap", 65536))
    timeout_s = float(req.get("timeout_s", 30.0))
    stdin_r, stdin_w = os.pipe()
    out_r, out_w = os.pipe()
    err_r, err_w = os.pipe()
    t0 = time.monotonic()
    cfg = cfg or InitConfig()
    try:
        pid = _spawn_fast(req, cfg, stdin_r, out_w, err_w) if cfg.fast else _fork_or_reclaim()
    except OSError as exc:
        for fd in (stdin_r, stdin_w, out_r, out_w, err_r, err_w):
            os.close(fd)
        code = 127 if isinstance(exc, FileNotFoundError) else 126
        return {"exit_code": code, "stdout": b"",
                "stderr": f"paddock: cannot run {argv!r}: {exc}\n".encode(),
                "timed_out": False, "truncated": False, "wall_s": time.monotonic() - t0}
    if pid == 0:
        _exec_child(req, stdin_r, out_w, err_w, cfg)
    for fd in (stdin_r, out_w, err_w):
        os.close(fd)
    _feed_stdin(stdin_w, req.get("stdin") or b"")
    bufs, truncated, timed_out, status = _collect(pid, out_r, err_r, cap, t0 + timeout_s)
    if timed_out:
        _kill_all_but_me()
    wall_s = time.monotonic() - t0
    code = 124 if timed_out else os.waitstatus_to_exitcode(status)
    if code < 0:
        code = 128 - code
    return {"exit_code": code, "stdout": bytes(bufs[out_r]), "stderr": bytes(bufs[err_r]),
            "timed_out": timed_out, "truncated": truncated, "wall_s": wall_s}


def _fork_or_reclaim() -> int:
    """fork(); if the pids cap is exhausted (a fork bomb left running), kill every other process
    of the sandbox and try once more, so the sandbox stays usable."""
    try:
        return os.fork()
    except BlockingIOError:
        _kill_all_but_me()
        return os.fork()


def _feed_stdin(fd: int, data: bytes) -> None:
    try:
        if data:
            os.set_blocking(fd, False)
            try:
                os.write(fd, data[:65536])
            except BlockingIOError:
                pass
    finally:
        os.close(fd)


def _collect(pid: int, out_r: int, err_r: int, cap: int, deadline: float):
    """Read both pipes (capped) until they close and the command has exited, or the deadline.
    Waits on a pidfd for the exit: no polling. Once the command has exited, strays that keep
    the pipes open get STRAY_GRACE_S of silence before reading stops."""
    sel = selectors.DefaultSelector()
    bufs = {out_r: bytearray(), err_r: bytearray()}
    for fd in bufs:
        sel.register(fd, selectors.EVENT_READ)
    pidfd = os.pidfd_open(pid)
    sel.register(pidfd, selectors.EVENT_READ)
    truncated, timed_out, status, open_fds = False, False, None, 2
    try:
        while open_fds or status is None:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                timed_out = True
                break
            events = sel.select(timeout=remaining if status is None else min(remaining, STRAY_GRACE_S))
            if not events and status is not None:
                break   # the command exited and its strays keep the pipes open: stop reading
            for key, _ in events:
                if key.fd == pidfd:
                    status = _reap(pid)
                    if status is not None:
                        sel.unregister(pidfd)
                    continue
                chunk = os.read(key.fd, 65536)
                if not chunk:
                    sel.unregister(key.fd)
                    open_fds -= 1
                    continue
                room = cap - len(bufs[key.fd])
                if len(chunk) > room:
                    truncated = True
                bufs[key.fd] += chunk[:max(room, 0)]
    finally:
        sel.close()
        for fd in (out_r, err_r, pidfd):
            os.close(fd)
    if status is None:
        timed_out = True
        for target in (-pid, pid):
            try:
                os.kill(target, signal.SIGKILL)
            except ProcessLookupError:
                pass
        status = _reap(pid, block=True)
    return bufs, truncated, timed_out, status


def _reap(pid: int, block: bool = False):
    """Reap any children (PID 1 reaps orphans); return the status of `pid` once it exits."""
    found = None
    while True:
        try:
            got, status = os.waitpid(-1, 0 if (block and found is None) else os.WNOHANG)
        except ChildProcessError:
            return found if found is not None else 0
        if got == 0:
            return found
        if got == pid:
            found = status
            block = False


def _kill_all_but_me() -> None:
    try:
        os.kill(-1, signal.SIGKILL)   # as PID 1 of the sandbox: every other process in it
    except ProcessLookupError:
        pass
    while True:
        try:
            if os.waitpid(-1, 0)[0] == 0:
                break
        except ChildProcessError:
            break
