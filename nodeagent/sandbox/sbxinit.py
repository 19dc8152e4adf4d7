"""One sandbox: its builder (outside, root of the node namespace) and the wire to its init.

The builder is a fork of the node init, made ahead of time with nothing of any sandbox in it
(a spare), and given one create request. It unshares a mount namespace, mounts a tmpfs capped
by `size=` and `nr_inodes=`, an OverlayFS (`userxattr`; or fuse-overlayfs) whose lower layer is
the node's shared read-only mount of the image and whose upper and work dirs live on that
tmpfs, a minimal /dev, writes the task's files, then unshares PID, network, IPC and UTS
namespaces and spawns the sandbox init into them (vfork+exec of the native binary,
`nodeagent/sandbox/native/sbxinit.c`). It moves the init into the sandbox's cgroups (through files
the agent opened), writes its uid/gid maps (a disjoint slice of the node's subordinate ids),
hands its mount namespaces (fds) to the node init and the init's socket to the agent, and
exits: no process per sandbox but the init, and no interpreter in it.

The init (PID 1 of the sandbox) mounts a fresh /proc with sensitive paths masked, brings up
`lo`, pivots into the overlay, unshares a child user namespace, cgroup and UTS namespaces,
sets no_new_privs, rlimits (for caps no cgroup enforces) and the seccomp filter, then runs
commands on request (`exec_records` / `checked_exec_reply`: the records of `framing`), each in
its own session with an output cap and a wall-clock kill; with an egress socket it relays
127.0.0.1:3128 to it.

File operations (`handle_op`: write, read, diff, apply) run in a short-lived fork of the node
init that entered the sandbox's mount namespace. Replies from the init are untrusted data (the
workload shares its uid): the agent checks their shape and size (`checked_exec_reply`).
Standard library and nodeagent.sandbox.{nsutil,framing} only.
"""
from __future__ import annotations

import errno
import os
import shutil
import signal
import socket
import stat
import subprocess
import time

from nodeagent.sandbox import framing, nsutil
from nodeagent.sandbox.spec import is_bytecode

SANDBOX_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
DEV_NODES = ("null", "zero", "full", "random", "urandom", "tty")
# /proc as OCI runtimes leave it: host-wide files masked (/dev/null over them), host-wide
# directories hidden (an empty read-only tmpfs), kernel knobs read-only.
# (The lists live in nodeagent/sandbox/native/sbxinit.c, which mounts /proc; named here for the docs.)
PROC_MASKED = ("kcore", "keys", "timer_list", "timer_stats", "sched_debug", "latency_stats",
               "sysrq-trigger", "kallsyms")
PROC_HIDDEN_DIRS = ("acpi", "asound", "scsi")
PROC_READONLY = ("sys", "bus", "fs", "irq")
INIT_REPLY_MAX_BYTES = 32 * 1024 * 1024
# An exec's stdin: all of it reaches the command (fed as the pipe drains), up to this cap (the
# native init refuses more; its request frame holds 16 MiB); more is a ValueError naming it.
STDIN_MAX_BYTES = 8 * 1024 * 1024
FUSE_MOUNT_TIMEOUT_S = 10.0
EGRESS_PORT = 3128
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
    """The writable root at `sbx`/root: a tmpfs capped by the sandbox's size and inodes, the
    overlay over the image, /work /proc /dev /tmp, the /dev template and a /dev/shm. The overlay
    is mounted from inside `sbx` with paths relative to it, so its options (shown in the
    sandbox's /proc/self/mountinfo) name no host path."""
    os.makedirs(sbx, mode=0o755)
    flags = nsutil.MS_NOSUID | nsutil.MS_NODEV
    nsutil.mount("paddock-sbx", sbx, "tmpfs", flags, "mode=0755," + _tmpfs_caps(limits or {}))
    for d in ("upper", "work", "root"):
        os.mkdir(os.path.join(sbx, d), 0o755)
    root = os.path.join(sbx, "root")
    daemon = None
    os.chdir(sbx)
    try:
        rel_lower = os.path.relpath(lower, sbx)
        if overlay == "fuse-overlayfs":
            daemon = _fuse_overlay(rel_lower, root)
        else:
            nsutil.mount("paddock-overlay", "root", "overlay", flags,
                         f"lowerdir={rel_lower},upperdir=upper,workdir=work,userxattr")
    finally:
        os.chdir("/")
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


def finish_root(root: str, base: int) -> None:
    """/work owned by the sandbox's root (the task's files come through `handle_op`)."""
    os.chown(os.path.join(root, "work"), base, base)
    os.chmod(os.path.join(root, "work"), 0o755)


def _fuse_overlay(rel_lower: str, root: str) -> subprocess.Popen:
    """fuse-overlayfs in the foreground (cwd: the sandbox dir), a child of the builder (the node
    init kills it on destroy)."""
    argv = ["fuse-overlayfs", "-f", "-o",
            f"lowerdir={rel_lower},upperdir=upper,workdir=work,allow_other,noxattrs=1", root]
    # No PDEATHSIG: the builder exits; the daemon lives in the node PID namespace (it dies with
    # the node) and the node init kills it when the sandbox is destroyed.
    proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL, cwd=os.getcwd())
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


def init_rlimits(limits: dict, cgroup_caps, sched=()) -> list[str]:
    """The init's rlimits (`NAME=VALUE` for sbxinit.c's --rlimit): caps no cgroup enforces,
    file size, open files, no core dumps; then `sched`, its scheduling settings when no cgroup
    holds the CPU cap (`nodeagent.sandbox.usercaps.sched_specs`: the init applies them too)."""
    mb = 1024 * 1024
    out = []
    for name, val, cap in (("as", int(limits.get("memory_mb", 0)) * mb, "memory"),
                           ("nproc", int(limits.get("pids", 0)), "pids"),
                           ("fsize", int(limits.get("disk_mb", 0)) * mb, None),
                           ("nofile", int(limits.get("nofile", 0)), None)):
        if val and cap not in cgroup_caps:
            out.append(f"{name}={val}")
    return out + ["core=0"] + list(sched)


def spawn_init(init_exe: int, bpf_fd: int, root: str, req: dict, egress_fd: int | None) -> tuple[int, socket.socket]:
    """New PID, network, IPC and UTS namespaces and the native init (`nodeagent/sandbox/native`)
    spawned into them (vfork+exec: no copy of this process), with its root and settings.
    `init_exe`: an open fd of the binary; `bpf_fd`: the seccomp program (raw BPF)."""
    nsutil.unshare(nsutil.CLONE_NEWPID | nsutil.CLONE_NEWNET | nsutil.CLONE_NEWIPC | nsutil.CLONE_NEWUTS)
    mon_end, init_end = socket.socketpair()
    argv = ["paddock-sbxinit", "--mon", str(init_end.fileno()), "--bpf-fd", str(bpf_fd), "--root", root,
            "--hostname", str(req.get("hostname", "sandbox"))]
    for spec in init_rlimits(req.get("limits") or {}, req.get("cgroup_caps") or [], req.get("sched") or []):
        argv += ["--rlimit", spec]
    passed = [init_end.fileno(), bpf_fd]
    if egress_fd is not None:
        argv += ["--egress-fd", str(egress_fd)]
        passed.append(egress_fd)
    for fd in passed:
        os.set_inheritable(fd, True)
    try:
        pid = os.posix_spawn(f"/proc/self/fd/{init_exe}", argv, {})
    finally:
        init_end.close()
    return pid, mon_end


def build_records(req: dict, state_dir: str) -> list[tuple[str, bytes]]:
    """A create request for a native builder (`nodeagent/sandbox/native/sbxinit.c`): the sandbox's id
    and dir, the image's mount relative to it, the layers' node copies (bottom first), the /dev template, tmpfs caps, id slice,
    hostname, the init's rlimits and the egress socket's path (paths as the node holder sees
    them: its state tmpfs is mounted at the state dir)."""
    sbx = os.path.join(state_dir, "sbx", req["id"])
    lower = os.path.join(state_dir, "images", req["image_key"])
    recs = [("y", os.path.join(state_dir, "layers", key)) for key in req.get("layer_keys") or ()]
    recs += [("i", req["id"]), ("d", sbx), ("l", os.path.relpath(lower, sbx)), ("v", os.path.join(state_dir, "dev")),
            ("z", _tmpfs_caps(req.get("limits") or {})), ("b", str(int(req["slice_base"]))),
            ("n", str(int(req["slice_size"]))), ("h", str(req.get("hostname", "sandbox")))]
    recs += [("R", spec) for spec in init_rlimits(req.get("limits") or {}, req.get("cgroup_caps") or [], req.get("sched") or [])]
    if req.get("egress_socket"):
        recs.append(("g", str(req["egress_socket"])))
    return [(tag, val.encode()) for tag, val in recs]


def receive_cgroups(agent: socket.socket) -> list[int]:
    """The sandbox's cgroup.procs files, sent by the agent while the root was being built."""
    msg, fds = framing.recv_records(agent, max_bytes=4096, with_fds=True)
    if "c" not in msg:
        for fd in fds:
            os.close(fd)
        raise RuntimeError("the agent abandoned this create")
    return fds


def run_builder(agent: socket.socket, zygote: socket.socket, req: dict, lower: str, sbx_root: str,
                init_exe: int, bpf_fd: int) -> int:
    """One sandbox, from nothing: its mount namespace, the root (tmpfs, overlay, /dev, files),
    its namespaces and native init, moved into its cgroups (files the agent opened: its
    credentials authorise the write) and mapped onto its id slice. Hands the mount
    namespaces (fds) to the node init and the init's socket to the agent, then exits."""
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    base, size = int(req["slice_base"]), int(req["slice_size"])
    daemon, pid = None, None
    try:
        enter_mount_ns()
        sbx = os.path.join(sbx_root, req["id"])
        root, daemon = build_root(sbx, lower, req.get("overlay", "kernel"),
                                  os.path.join(os.path.dirname(sbx_root), "dev"), req.get("limits") or {})
        finish_root(root, base)
        egress = os.open(req["egress_socket"], os.O_PATH) if req.get("egress_socket") else None
        pid, init = spawn_init(init_exe, bpf_fd, root, req, egress)
        if egress is not None:
            os.close(egress)
        for fd in receive_cgroups(agent):   # before "mapped": the init makes its cgroup namespace after it
            try:
                os.write(fd, str(pid).encode())
            finally:
                os.close(fd)
        init_ns_fd = map_init(pid, base, size, init)
        uid_map = open(f"/proc/{pid}/uid_map").read()
        ns_fd = os.open("/proc/self/ns/mnt", os.O_RDONLY | os.O_CLOEXEC)
        report = [("p", str(pid)), ("i", req["id"]), ("d", sbx), ("b", str(base)), ("l", os.path.relpath(lower, sbx))]
        framing.send_records(zygote, [(k, v.encode()) for k, v in report]
                             + ([("D", str(daemon.pid).encode())] if daemon else []), [ns_fd, init_ns_fd])
    except Exception as exc:
        for p in ([pid] if pid else []) + ([daemon.pid] if daemon else []):
            try:
                os.kill(p, signal.SIGKILL)
            except ProcessLookupError:
                pass
        framing.send_records(agent, [("s", b"failed"), ("m", f"{type(exc).__name__}: {exc}".encode())])
        return 1
    pidfd = os.pidfd_open(pid)   # the agent destroys through it
    framing.send_records(agent, [("s", b"ok"), ("p", str(pid).encode()), ("U", uid_map.encode())],
                         [init.fileno(), pidfd])
    return 0


def _stage(recs: dict) -> str:
    return (recs.get("s") or [b""])[0].decode(errors="replace")


def map_init(pid: int, base: int, size: int, init: socket.socket) -> int:
    """The init has entered its root and unshared its user namespace: map it onto the id slice
    (`0 <base> <size>`, setgroups denied); it answers "ready" (rlimits, seccomp in place) with
    its own mount namespace (an fd)."""
    try:
        msg = framing.recv_records(init, max_bytes=65536)
        if _stage(msg) != "unshared":
            raise RuntimeError(f"sandbox init failed before its user namespace: {_init_error(msg)}")
        _w(f"/proc/{pid}/uid_map", f"0 {base} {size}\n")
        _w(f"/proc/{pid}/setgroups", "deny")
        _w(f"/proc/{pid}/gid_map", f"0 {base} {size}\n")
        framing.send_records(init, [("s", b"mapped")])
        msg, got = framing.recv_records(init, max_bytes=65536, with_fds=True)
    except framing.FramingError as exc:
        raise RuntimeError(f"sandbox init {pid} is gone: {exc}") from None
    if _stage(msg) != "ready" or len(got) != 1:
        for fd in got:
            os.close(fd)
        raise RuntimeError(f"sandbox init failed: {_init_error(msg)}")
    return got[0]


def _init_error(msg: dict) -> str:
    return (msg.get("m") or [f"stage {_stage(msg)!r}".encode()])[0].decode(errors="replace")


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
        try:
            return {"ok": True, "changes": upper_diff(rec["sbx"], req.get("prefix", "/"),
                                                      int(req.get("max_bytes", 8 << 20)), rec.get("lowers"),
                                                      bool(req.get("skip_bytecode")))}
        except DiffRefused as exc:     # the agent's content, not a failure of the sandbox
            return {"ok": False, "error": str(exc), "refused": True}   # Sandbox.diff: spec.diff_refused
    if op == "apply":
        apply_changes(root, req["changes"], base)
        return {"ok": True}
    if op == "usage":
        st = os.statvfs(rec["sbx"])
        return {"ok": True, "disk_used_bytes": (st.f_blocks - st.f_bfree) * st.f_frsize}
    return {"ok": False, "error": f"unknown op {op!r}"}


def exec_records(argv, stdin: bytes, timeout_s: float, cwd: str, env: dict, output_cap: int,
                 uid: int | None, egress: bool, oom_score_adj: int | None = None) -> list[tuple[str, bytes]]:
    """An exec request for the init. Bad input (not a list of strings, a NUL inside one) is a
    ValueError naming it. `oom_score_adj` (0..1000, default 1000: the OOM killer's first
    choice): lower for a command that must outlive its workload (the grader); the init then
    keeps every process of an unprivileged uid at 1000 while it runs."""
    if not (isinstance(argv, (list, tuple)) and argv and all(isinstance(a, str) for a in argv)):
        raise ValueError(f"argv must be a non-empty list of strings, not {argv!r}")
    full_env = {"PATH": SANDBOX_PATH, "HOME": "/work", "LANG": "C.UTF-8", "TERM": "dumb"}
    if egress:
        proxy = f"http://127.0.0.1:{EGRESS_PORT}"
        full_env.update({k: proxy for k in ("HTTP_PROXY", "HTTPS_PROXY", "http_proxy", "https_proxy")})
    full_env.update(env or {})
    for k in full_env:
        if not k or "=" in k:
            raise ValueError(f"environment variable name {k!r} is empty or contains '='")
    for what, items in (("argv", argv), ("env", [f"{k}={v}" for k, v in full_env.items()]), ("cwd", [cwd])):
        for item in items:
            if "\0" in item:
                raise ValueError(f"{what} entry {item!r} contains a NUL byte")
    recs = [("a", a.encode()) for a in argv]
    recs += [("e", f"{k}={v}".encode()) for k, v in full_env.items()]
    recs += [("c", cwd.encode()), ("t", str(max(int(timeout_s * 1000), 1)).encode()),
             ("o", str(int(output_cap)).encode())]
    if stdin:
        if len(stdin) > STDIN_MAX_BYTES:
            raise ValueError(f"stdin of {len(stdin)} bytes is larger than the sandbox exec cap of "
                             f"{STDIN_MAX_BYTES} bytes (STDIN_MAX_BYTES): write the data to a file instead")
        recs.append(("i", bytes(stdin)))
    if uid is not None:
        recs.append(("u", str(int(uid)).encode()))
    if oom_score_adj is not None:
        if not 0 <= int(oom_score_adj) <= 1000:
            raise ValueError(f"oom_score_adj must be in [0, 1000], got {oom_score_adj!r}")
        recs.append(("O", str(int(oom_score_adj)).encode()))
    return recs


def checked_exec_reply(recs: dict) -> dict:
    """The init's reply records, checked (the workload shares the init's uid: untrusted)."""
    try:
        one = {k: v[0] for k, v in recs.items() if len(v) == 1}
        reply = {"ok": True, "exit_code": int(one["x"]), "stdout": one.get("1", b""),
                 "stderr": one.get("2", b""), "timed_out": one.get("T") == b"1",
                 "truncated": one.get("r") == b"1", "wall_s": int(one.get("w", b"0")) / 1e6}
    except (KeyError, ValueError):
        return {"ok": False, "error": "sandbox init sent a malformed reply", "dead": True}
    return reply


class DiffRefused(ValueError):
    """What the agent left under the diff's prefix cannot be carried as a diff (too large, too
    deep, too many entries, a path too long, changed while read): the agent's doing, named with
    the path and the limit. `handle_op` answers it with `refused` set (the agent's fault, never
    the sandbox's)."""


# The diff's limits besides `max_bytes` (file content): what a grading sandbox can replay and
# one framing message (64 MiB: base64 content, JSON-escaped paths) can carry.
DIFF_MAX_ENTRIES = 65536          # files, directories, symlinks and deletions
DIFF_MAX_DEPTH = 256              # directory levels below the prefix
DIFF_MAX_PATH_BYTES = 3072        # one path (below PATH_MAX with any sandbox root in front)
DIFF_MAX_META_BYTES = 4 << 20     # all paths and symlink targets together


def upper_diff(sbx: str, prefix: str, max_bytes: int, lowers: "list[str] | str | None" = None,
               skip_bytecode: bool = False) -> list[dict]:
    """Changes in the overlay's upper layer under `prefix`, parents first: files added or modified
    (content, mode), directories new or changed ('dir', mode), symlinks (the target's bytes), and
    deletions. Whiteouts are the kernel's (char 0:0, `user.overlay.whiteout`, opaque
    `user.overlay.opaque`) or fuse-overlayfs's (`.wh.NAME`, `.wh..wh..opq`); an opaque directory
    is 'deleted' then 'dir'. `lowers`: the lower dirs, top first (layers, then the image); a path
    is in the lower tree when the topmost lower that has it holds no whiteout there. Names that
    are not UTF-8 are carried as surrogate escapes (`os.fsdecode`); FIFOs, sockets and device
    nodes are not carried (nothing replays them). Walked without recursion and without following
    a symlink (the prefix itself included). Content beyond `max_bytes`, or beyond the DIFF_MAX_*
    limits, raises DiffRefused naming the path and the limit. `skip_bytecode`: Python bytecode
    written or changed (`__pycache__/` trees, `*.pyc`, `*.pyo`: what running the tests leaves,
    which a grader never applies) is neither carried nor counted; its deletions still are."""
    upper = os.path.join(sbx, "upper")
    if isinstance(lowers, str):
        lowers = [lowers]
    if not lowers:
        found = _lowerdir(os.path.join(sbx, "root"))
        lowers = [os.path.normpath(os.path.join(sbx, p)) for p in found.split(":")] if found else []
    rel_start = "/" + prefix.strip("/") if prefix.strip("/") else "/"
    changes: list[dict] = []
    used = {"bytes": 0, "meta": 0}

    def in_lower(rel: str):
        for lower in lowers:
            try:
                st = os.lstat(os.path.join(lower, rel.lstrip("/")))
            except OSError:
                continue
            return None if stat.S_ISCHR(st.st_mode) and st.st_rdev == 0 else st
        return None

    def add(change: dict, extra: int = 0) -> None:
        if len(changes) >= DIFF_MAX_ENTRIES:
            raise DiffRefused(f"{change['path']!r}: the changes under {rel_start} have more than "
                              f"{DIFF_MAX_ENTRIES} entries (DIFF_MAX_ENTRIES)")
        used["meta"] += len(os.fsencode(change["path"])) + extra
        if used["meta"] > DIFF_MAX_META_BYTES:
            raise DiffRefused(f"{change['path']!r}: the paths and symlink targets under {rel_start} exceed "
                              f"{DIFF_MAX_META_BYTES} bytes (DIFF_MAX_META_BYTES)")
        changes.append(change)

    def entry(full: str, rel: str, name: str, st: os.stat_result, depth: int) -> bool:
        """Record one entry; True when it is a directory to walk into."""
        if len(os.fsencode(rel)) > DIFF_MAX_PATH_BYTES:
            raise DiffRefused(f"{rel[:200]!r}...: a path longer than {DIFF_MAX_PATH_BYTES} bytes "
                              "(DIFF_MAX_PATH_BYTES)")
        if name == OPAQUE_MARKER:
            return False
        if name.startswith(WHITEOUT):
            add({"path": os.path.join(os.path.dirname(rel), name[len(WHITEOUT):]), "kind": "deleted",
                 "data": None, "mode": 0})
            return False
        if (stat.S_ISCHR(st.st_mode) and st.st_rdev == 0) or _xattr(full, "overlay.whiteout") is not None:
            add({"path": rel, "kind": "deleted", "data": None, "mode": 0})
        elif skip_bytecode and is_bytecode(name, stat.S_ISDIR(st.st_mode)):
            return False
        elif stat.S_ISLNK(st.st_mode):
            target = os.readlink(os.fsencode(full))
            add({"path": rel, "kind": "symlink", "data": target, "mode": 0o777}, len(target))
        elif stat.S_ISREG(st.st_mode):
            room = max_bytes - used["bytes"]
            if st.st_size > room:
                raise DiffRefused(f"{rel!r} ({st.st_size} bytes) takes the changes under {rel_start} past "
                                  f"{max_bytes} bytes of file content (the diff's max_bytes)")
            with _open_nofollow(full) as f:
                if not stat.S_ISREG(os.fstat(f.fileno()).st_mode):   # swapped (for a FIFO?) since the lstat
                    raise OSError(errno.ELOOP, "not a regular file any more", full)
                data = f.read(room + 1)
            if len(data) > room:
                raise DiffRefused(f"{rel!r} grew while it was read and takes the changes under {rel_start} "
                                  f"past {max_bytes} bytes of file content (the diff's max_bytes)")
            used["bytes"] += len(data)
            kind = "modified" if in_lower(rel) is not None else "added"
            add({"path": rel, "kind": kind, "data": data, "mode": stat.S_IMODE(st.st_mode)})
        elif stat.S_ISDIR(st.st_mode):
            if depth > DIFF_MAX_DEPTH:
                raise DiffRefused(f"{rel[:200]!r}: directories nested more than {DIFF_MAX_DEPTH} levels "
                                  f"below {rel_start} (DIFF_MAX_DEPTH)")
            low = in_lower(rel)
            opaque = (_xattr(full, "overlay.opaque") == b"y"
                      or os.path.lexists(os.path.join(full, OPAQUE_MARKER)))
            if opaque and low is not None:
                add({"path": rel, "kind": "deleted", "data": None, "mode": 0})
            if opaque or low is None or stat.S_IMODE(low.st_mode) != stat.S_IMODE(st.st_mode) \
                    or not stat.S_ISDIR(low.st_mode):
                add({"path": rel, "kind": "dir", "data": None, "mode": stat.S_IMODE(st.st_mode)})
            return True
        return False        # a FIFO, socket or device node: nothing could replay it

    start = os.path.join(upper, prefix.strip("/"))
    try:
        top = os.lstat(start)
    except FileNotFoundError:
        return []
    if not stat.S_ISDIR(top.st_mode):      # the prefix itself replaced (a symlink is never followed)
        entry(start, rel_start, os.path.basename(start), top, 0)
        return _parents_first(changes)
    stack = [(start, rel_start, 0)]
    while stack:
        dirpath, rel_dir, depth = stack.pop()
        try:
            with os.scandir(dirpath) as it:
                names = sorted(e.name for e in it)
        except (FileNotFoundError, NotADirectoryError):
            continue        # removed (or replaced) by a process of the agent while the diff ran
        subdirs = []
        for name in names:
            full, rel = os.path.join(dirpath, name), os.path.join(rel_dir, name)
            try:
                st = os.lstat(full)
                if entry(full, rel, name, st, depth + 1):
                    subdirs.append((full, rel, depth + 1))
            except FileNotFoundError:
                continue    # gone while the diff ran: not a change any more
            except OSError as exc:
                if exc.errno in (errno.ELOOP, errno.ENOTDIR):
                    raise DiffRefused(f"{rel!r} changed type while the diff read it (a process of the "
                                      "agent still writing?)") from None
                raise
        stack.extend(reversed(subdirs))
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
            os.symlink(os.fsencode(c.get("data") or b""), os.fsencode(full))   # any bytes
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
    path: these helpers run in the node's view of the filesystem); never blocking on a FIFO put
    there since it was looked at (O_NONBLOCK changes nothing for a regular file)."""
    return os.fdopen(os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK), "rb")


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
