"""The native sandbox runtime, as the node agent sees it.

`SandboxRuntime` owns one node namespace holder (`nodeagent.zygote`): a user namespace that
maps the agent's subordinate-id range, in which each image is mounted once (squashfuse) and
from which every sandbox is forked with its own disjoint id slice. `Sandbox` is one sandbox:
`exec`, `write_files`, `read_file`, `diff`, `destroy`. Sandboxes are one-shot.

Every infrastructure failure (the holder or a monitor died, a mount failed) raises
`SandboxError`; a command that fails inside the sandbox is an `ExecResult`, not an error.
Must not import zmq or the controller.
"""
from __future__ import annotations

import itertools
import logging
import os
import pwd
import shutil
import socket
import subprocess
import sys
import tempfile
import threading
from dataclasses import dataclass, field
from pathlib import Path

from nodeagent import framing

log = logging.getLogger(__name__)

SIF_MAGIC_OFFSET, SIF_MAGIC = 32, b"SIF_MAGIC\0"
DEFAULT_SLICE_SIZE = 1024
DEFAULT_USER = "paddock"


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
    kind: str          # added | modified | deleted | symlink
    data: bytes | None
    mode: int


@dataclass(frozen=True)
class SandboxSpec:
    image: Path
    limits: dict = field(default_factory=lambda: {"memory_mb": 256, "pids": 64, "disk_mb": 64, "nofile": 256})
    files: dict = field(default_factory=dict)     # relative to /work -> bytes, owned by the agent
    hostname: str = "sandbox"


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
        from layers import sif   # the layers package owns the SIF format
        info = sif.read_sif(path)
        offset = info.primary_partition_offset
    elif head[:4] == b"hsqs":
        offset = 0
    else:
        raise SandboxError(f"image {path} is neither a SIF file nor a squashfs image")
    st = os.stat(path)
    key = path.stem if len(path.stem) == 64 else f"{st.st_dev:x}-{st.st_ino:x}-{int(st.st_mtime)}"
    return key, offset


class SandboxRuntime:
    """One node's sandbox factory. Start it from a long-lived thread (PDEATHSIG follows the thread)."""

    def __init__(self, state_dir: str | None = None, subids: tuple[int, int] | None = None,
                 slice_size: int = DEFAULT_SLICE_SIZE, user: str | None = None):
        self.subids = subids or subid_range(user)
        self.slice_size = slice_size
        self.slots = self.subids[1] // slice_size - 1   # slice 0 is the holder's own root
        if self.slots < 1:
            raise SandboxError(f"subordinate range {self.subids} is too small for slices of {slice_size}")
        self._own_state = state_dir is None
        self.state_dir = state_dir or tempfile.mkdtemp(prefix="paddock-node-")
        self._lock = threading.Lock()
        self._free_slices = list(range(1, self.slots + 1))
        self._images: dict[str, str] = {}
        self._ids = itertools.count(1)
        self._proc: subprocess.Popen | None = None
        self._ctl: socket.socket | None = None

    # -- lifecycle --------------------------------------------------------------------------
    def start(self) -> "SandboxRuntime":
        os.chmod(self.state_dir, 0o755)
        ours, theirs = socket.socketpair()
        self._proc = subprocess.Popen(
            [sys.executable, "-m", "nodeagent.zygote", "--ctl-fd", str(theirs.fileno()),
             "--state", self.state_dir],
            pass_fds=(theirs.fileno(),), stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE, cwd="/", env=_clean_env())
        theirs.close()
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
        log.info("sandbox runtime up: subids=%s slots=%d uid_map=%s", self.subids, self.slots,
                 msg.get("uid_map", "").strip())
        return self

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
        if self._ctl:
            self._ctl.close()
            self._ctl = None
        if self._proc:
            if self._proc.poll() is None:
                self._proc.kill()
            self._proc.wait()
            if self._proc.stderr:
                self._proc.stderr.close()
            self._proc = None
        if self._own_state:
            shutil.rmtree(self.state_dir, ignore_errors=True)

    def __enter__(self) -> "SandboxRuntime":
        return self.start()

    def __exit__(self, *exc) -> None:
        self.close()

    @property
    def holder_pid(self) -> int | None:
        return self._proc.pid if self._proc else None

    # -- requests to the holder -------------------------------------------------------------
    def _call(self, req: dict, fds: list[int] | None = None) -> dict:
        with self._lock:
            if self._ctl is None:
                raise SandboxError("sandbox runtime is not running")
            try:
                framing.send_msg(self._ctl, req, fds)
                reply = framing.recv_msg(self._ctl, max_bytes=1 << 20)
            except (framing.FramingError, OSError) as exc:
                raise SandboxError(f"node namespace holder is gone: {exc}; {self._stderr_tail()}") from None
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

    def mount_image(self, image: Path) -> str:
        image = Path(image).resolve()
        key, offset = image_partition(image)
        if key not in self._images:
            self._call({"op": "mount_image", "key": key, "path": str(image), "offset": offset})
            self._images[key] = str(image)
        return key

    def mounted_images(self) -> list[str]:
        return sorted(self._call({"op": "ping"})["images"])

    def create(self, spec: SandboxSpec) -> "Sandbox":
        key = self.mount_image(spec.image)
        with self._lock:
            if not self._free_slices:
                raise SandboxError(f"no free id slice: all {self.slots} sandboxes of this node are in use")
            slice_no = self._free_slices.pop(0)
        sid = f"s{next(self._ids)}"
        ours, theirs = socket.socketpair()
        try:
            req = {"op": "create", "id": sid, "image_key": key, "slice_base": slice_no * self.slice_size,
                   "slice_size": self.slice_size, "limits": spec.limits, "hostname": spec.hostname,
                   "files": {k: (v.encode() if isinstance(v, str) else v) for k, v in spec.files.items()}}
            pid = self._call(req, [theirs.fileno()])["pid"]
            theirs.close()
            reply = framing.recv_msg(ours, max_bytes=1 << 20)
            if not reply.get("ok"):
                raise SandboxError(reply.get("error", "sandbox setup failed"))
        except (SandboxError, framing.FramingError, OSError) as exc:
            theirs.close()
            ours.close()
            self._release(slice_no)
            raise SandboxError(f"sandbox {sid} failed to start: {exc}") from None
        return Sandbox(self, sid, ours, slice_no, pid, reply.get("uid_map", ""), spec)

    def _release(self, slice_no: int) -> None:
        with self._lock:
            self._free_slices.append(slice_no)


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


def _clean_env() -> dict:
    keep = ("PATH", "LANG", "PYTHONPATH", "VIRTUAL_ENV")
    return {k: v for k, v in os.environ.items() if k in keep}


class Sandbox:
    def __init__(self, runtime, sid, sock, slice_no, monitor_pid, uid_map, spec):
        self.runtime, self.id, self._sock, self.slice_no = runtime, sid, sock, slice_no
        self.monitor_pid, self.uid_map, self.spec = monitor_pid, uid_map, spec
        self._lock = threading.Lock()
        self.destroyed = False

    @property
    def monitor_pid_host(self) -> int:
        """The monitor's PID in the agent's PID namespace (ops and tests look it up)."""
        return self.runtime.host_pid(self.monitor_pid)

    def _call(self, req: dict) -> dict:
        with self._lock:
            if self.destroyed:
                raise SandboxError(f"sandbox {self.id} is destroyed")
            try:
                framing.send_msg(self._sock, req)
                reply = framing.recv_msg(self._sock)
            except (framing.FramingError, OSError) as exc:
                raise SandboxError(f"sandbox {self.id} monitor is gone: {exc}") from None
        if not reply.get("ok"):
            raise SandboxError(f"sandbox {self.id}: {reply.get('error', 'unknown error')}")
        return reply

    def exec(self, argv: list[str], stdin: bytes = b"", timeout_s: float = 30.0, cwd: str = "/work",
             env: dict | None = None, output_cap: int = 65536) -> ExecResult:
        r = self._call({"op": "exec", "argv": list(argv), "stdin": stdin, "timeout_s": timeout_s,
                        "cwd": cwd, "env": env or {}, "output_cap": output_cap, "limits": self.spec.limits})
        return ExecResult(r["exit_code"], r["stdout"], r["stderr"], r["timed_out"], r["truncated"], r["wall_s"])

    def write_files(self, files: dict, owner: str = "agent", mode: int = 0o644) -> None:
        data = {k: (v.encode() if isinstance(v, str) else v) for k, v in files.items()}
        self._call({"op": "write_files", "files": data, "owner": owner, "mode": mode})

    def read_file(self, path: str, max_bytes: int = 1 << 20) -> bytes:
        return self._call({"op": "read_file", "path": path, "max_bytes": max_bytes})["data"]

    def diff(self, prefix: str = "/", max_bytes: int = 8 << 20) -> list[Change]:
        changes = self._call({"op": "diff", "prefix": prefix, "max_bytes": max_bytes})["changes"]
        return [Change(c["path"], c["kind"], c["data"], c["mode"]) for c in changes]

    def usage(self) -> dict:
        r = self._call({"op": "usage"})
        return {"disk_used_bytes": r["disk_used_bytes"]}

    def destroy(self) -> None:
        if self.destroyed:
            return
        try:
            self._call({"op": "destroy"})
        except SandboxError:
            pass
        finally:
            self.destroyed = True
            self._sock.close()
            self.runtime._release(self.slice_no)

    def __enter__(self) -> "Sandbox":
        return self

    def __exit__(self, *exc) -> None:
        self.destroy()
