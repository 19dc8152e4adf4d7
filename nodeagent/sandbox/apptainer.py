"""The Apptainer sandbox backend: the native backend's interface, run by `apptainer`.

The command lines are PURE functions of (SandboxSpec, ApptainerConfig, ...) returning argv lists
(never a shell string; `display()` renders one with `shlex.join` for logs), pinned by golden
files in tests/golden/apptainer/. Which spec field becomes which flag:

    isolation "userns" | "fakeroot"   -> --userns | --fakeroot
    always                            -> --containall --no-home --cleanenv --net --network none
    spec.hostname                     -> --hostname NAME
    limits.disk_mb, writable overlay  -> `apptainer overlay create --size N --sparse` + --overlay IMG
    writable "tmpfs"                  -> --writable-tmpfs (size: apptainer.conf `sessiondir max size`)
    limits.memory_mb / pids / cpus    -> --memory NM / --pids-limit N / --cpus X (cgroups v2)
    limits.nofile                     -> `prlimit --nofile=N:N --` before apptainer (inherited)
    spec.egress_socket                -> --bind SOCK:/run/paddock/egress.sock
    config.binds                      -> --bind SRC:DST:ro|rw
    exec cwd / env                    -> --pwd DIR / `env NAME=VALUE ...` inside the container

A sandbox is an Apptainer *instance* (`instance start` at create, `exec instance://NAME` per
command, `instance stop` at destroy), so the agent's many commands share one writable layer.
`diff()` compares a tar of the prefix taken inside the sandbox with the same prefix extracted
from the image's squashfs (once per image), since the overlay's upper layer lives inside an ext3
image the host cannot read without mounting it.

`ApptainerRuntime` and `ApptainerSandbox` implement `nodeagent.sandbox.interface` (SandboxBackend,
SandboxHandle), warm pools included (`nodeagent.sandbox.warmpool.PooledBackend`);
tests/sandbox/test_conformance.py holds them to the same contract as the native backend.

Every failure of `apptainer` itself is a SandboxError carrying argv, exit code and stderr.
Must not import: zmq, controller.*, nodeagent.agent, nodeagent.harness, nodeagent.verifier,
nodeagent.sandbox.runtime (the native backend).
"""
from __future__ import annotations

import hashlib
import io
import itertools
import os
import re
import shlex
import shutil
import signal
import stat
import subprocess
import tarfile
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath

from layers import sif  # refuses foreign-arch, corrupt and non-SIF files; finds the partition
from nodeagent.sandbox import cgroups, warmpool
from nodeagent.sandbox.interface import EXIT_TIMEOUT, SandboxBackend, SandboxHandle
from nodeagent.sandbox.spec import (
    Change,
    ExecResult,
    SandboxError,
    SandboxSpec,
    changes_to_tar,
    diff_refused,
    in_bytecode,
    tar_to_changes,
)

ISOLATIONS = ("userns", "fakeroot")
WRITABLE_MODES = ("overlay", "tmpfs")
EGRESS_SOCKET_IN_SANDBOX = "/run/paddock/egress.sock"
INSTANCE_PREFIX = "paddock-"
STDERR_TAIL_BYTES = 4096
OVERLAY_CREATE_TIMEOUT_S = 120.0
INSTANCE_TIMEOUT_S = 120.0
_ENV_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
_INSTANCE_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,62}$")
_HOSTNAME = re.compile(r"^[A-Za-z0-9]([A-Za-z0-9-]{0,61}[A-Za-z0-9])?$")


@dataclass(frozen=True)
class Bind:
    """A host path made visible in the sandbox (read-only unless `writable`)."""
    src: str
    dst: str
    writable: bool = False


@dataclass(frozen=True)
class ApptainerConfig:
    binary: str = "apptainer"
    isolation: str = "userns"              # userns: no privilege at all; fakeroot: root-mapped
    writable: str = "overlay"              # overlay: ext3 image capped at disk_mb; tmpfs
    cgroup_limits: bool = True             # --memory/--pids-limit/--cpus (need cgroups v2)
    binds: tuple[Bind, ...] = ()
    workdir: str | None = None             # overlay images and the image-prefix cache

    def __post_init__(self) -> None:
        if self.isolation not in ISOLATIONS:
            raise ValueError(f"apptainer.isolation: {self.isolation!r} is not one of {ISOLATIONS}")
        if self.writable not in WRITABLE_MODES:
            raise ValueError(f"apptainer.writable: {self.writable!r} is not one of "
                             f"{WRITABLE_MODES}")
        for b in self.binds:
            _check_bind_path(b.src, "apptainer.binds src")
            _check_bind_path(b.dst, "apptainer.binds dst")


def _check_bind_path(path: str, what: str) -> None:
    """Apptainer's --bind syntax splits on ':' and ','; such paths cannot be expressed."""
    if not path.startswith("/"):
        raise ValueError(f"{what} {path!r} must be an absolute path")
    if any(c in path for c in ":,\n\0"):
        raise ValueError(f"{what} {path!r} contains ':', ',' or a newline, which apptainer's "
                         f"--bind syntax cannot carry; use another path")


def _positive(limits: dict, key: str) -> float | None:
    value = limits.get(key)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)) or value <= 0:
        raise ValueError(f"limits.{key} must be a positive number, not {value!r}")
    return value


# ---------------------------------------------------------------- pure command lines

def display(argv: list[str]) -> str:
    """The argv as one shell-safe line (for logs and the golden files)."""
    return shlex.join(argv)


def overlay_create_argv(overlay: str, size_mb: int, cfg: ApptainerConfig) -> list[str]:
    """`apptainer overlay create`: a sparse ext3 image of size_mb, with /work made."""
    argv = [cfg.binary, "overlay", "create", "--size", str(int(size_mb)), "--sparse",
            "--create-dir", "/work"]
    if cfg.isolation == "fakeroot":
        argv.append("--fakeroot")
    return argv + [overlay]


def _prlimit(limits: dict) -> list[str]:
    nofile = _positive(limits, "nofile")
    return ["prlimit", f"--nofile={int(nofile)}:{int(nofile)}", "--"] if nofile else []


def container_flags(spec: SandboxSpec, cfg: ApptainerConfig, overlay: str | None) -> list[str]:
    """The isolation, writable-layer, network, limit and bind flags for one sandbox."""
    if not _HOSTNAME.match(spec.hostname):
        raise ValueError(f"spec.hostname {spec.hostname!r} is not a valid hostname")
    flags = [f"--{cfg.isolation}", "--containall", "--no-home", "--cleanenv",
             "--net", "--network", "none", "--hostname", spec.hostname]
    if cfg.writable == "overlay":
        if overlay is None:
            raise ValueError("writable 'overlay' needs an overlay image path")
        _check_bind_path(overlay, "overlay image")
        flags += ["--overlay", overlay]
    else:
        flags.append("--writable-tmpfs")
    if cfg.cgroup_limits:
        if (mem := _positive(spec.limits, "memory_mb")) is not None:
            flags += ["--memory", f"{int(mem)}M"]
        if (pids := _positive(spec.limits, "pids")) is not None:
            flags += ["--pids-limit", str(int(pids))]
        if (cpus := _positive(spec.limits, "cpus")) is not None:
            flags += ["--cpus", f"{cpus:g}"]
    binds = list(cfg.binds)
    if spec.egress_socket:
        binds.append(Bind(spec.egress_socket, EGRESS_SOCKET_IN_SANDBOX, writable=True))
    for b in binds:
        _check_bind_path(b.src, "bind src")
        _check_bind_path(b.dst, "bind dst")
        flags += ["--bind", f"{b.src}:{b.dst}:{'rw' if b.writable else 'ro'}"]
    return flags


def _command(argv: list[str], env: dict | None) -> list[str]:
    if not argv:
        raise ValueError("argv is empty")
    if not env:
        return list(argv)
    for name in env:
        if not _ENV_NAME.match(name):
            raise ValueError(f"environment variable name {name!r} is invalid")
    if "=" in argv[0]:
        raise ValueError(f"argv[0] {argv[0]!r} contains '=' (env would read it as a variable)")
    return ["env"] + [f"{k}={v}" for k, v in sorted(env.items())] + list(argv)


def _image(spec: SandboxSpec) -> str:
    image = str(spec.image)
    if not image.startswith("/"):
        raise ValueError(f"spec.image {image!r} must be an absolute path")
    return image


def _cwd(cwd: str) -> str:
    if not cwd.startswith("/") or "\0" in cwd:
        raise ValueError(f"cwd {cwd!r} must be an absolute path")
    return cwd


def exec_argv(spec: SandboxSpec, argv: list[str], cfg: ApptainerConfig, *,
              overlay: str | None = None, cwd: str = "/work", env: dict | None = None) -> list[str]:
    """One-shot `apptainer exec`: a fresh container for a single command."""
    return (_prlimit(spec.limits) + [cfg.binary, "exec"] + container_flags(spec, cfg, overlay)
            + ["--pwd", _cwd(cwd), _image(spec)] + _command(argv, env))


def instance_start_argv(spec: SandboxSpec, name: str, cfg: ApptainerConfig, *,
                        overlay: str | None = None) -> list[str]:
    """`apptainer instance start`: the long-lived sandbox (its processes inherit the caps)."""
    _check_instance(name)
    return (_prlimit(spec.limits) + [cfg.binary, "instance", "start"]
            + container_flags(spec, cfg, overlay) + [_image(spec), name])


def instance_exec_argv(name: str, argv: list[str], cfg: ApptainerConfig, *, cwd: str = "/work",
                       env: dict | None = None) -> list[str]:
    """A command inside a running instance (namespaces and overlay are the instance's)."""
    _check_instance(name)
    return ([cfg.binary, "exec", "--cleanenv", "--pwd", _cwd(cwd), f"instance://{name}"]
            + _command(argv, env))


def instance_stop_argv(name: str, cfg: ApptainerConfig) -> list[str]:
    _check_instance(name)
    return [cfg.binary, "instance", "stop", "--force", name]


def _check_instance(name: str) -> None:
    if not _INSTANCE_NAME.match(name):
        raise ValueError(f"instance name {name!r} must match {_INSTANCE_NAME.pattern}")


# ---------------------------------------------------------------- diff (pure comparison)

@dataclass(frozen=True)
class Entry:
    kind: str            # file | dir | symlink
    mode: int
    data: bytes | None   # file bytes or link target; None for dirs


def tar_entries(raw: bytes, prefix: str) -> dict[str, Entry]:
    """path -> Entry for a tar taken with `tar -C / -cf - PREFIX`: the strict descendants of
    PREFIX (absolute, normalised)."""
    out: dict[str, Entry] = {}
    under = prefix.rstrip("/") + "/"
    with tarfile.open(fileobj=io.BytesIO(raw)) as tf:
        for m in tf:
            path = "/" + os.path.normpath(m.name).lstrip("/")
            if not path.startswith(under) or path == under:
                continue
            if m.isdir():
                out[path] = Entry("dir", stat.S_IMODE(m.mode), None)
            elif m.issym():
                out[path] = Entry("symlink", 0o777, os.fsencode(m.linkname))   # any bytes
            elif m.isfile():
                f = tf.extractfile(m)
                out[path] = Entry("file", stat.S_IMODE(m.mode), f.read() if f else b"")
    return out


def tree_entries(root: Path, prefix: str) -> dict[str, Entry]:
    """The same, for a directory holding the image's files (an unsquashfs extraction of
    `root`/PREFIX)."""
    out: dict[str, Entry] = {}
    base = root / prefix.lstrip("/")
    if not base.exists():
        return out
    for dirpath, dirnames, filenames in os.walk(base):
        for name in dirnames + filenames:
            p = Path(dirpath) / name
            st = p.lstat()
            path = "/" + str(p.relative_to(root))
            if stat.S_ISLNK(st.st_mode):
                out[path] = Entry("symlink", 0o777, os.fsencode(os.readlink(p)))
            elif stat.S_ISDIR(st.st_mode):
                out[path] = Entry("dir", stat.S_IMODE(st.st_mode), None)
            elif stat.S_ISREG(st.st_mode):
                out[path] = Entry("file", stat.S_IMODE(st.st_mode), p.read_bytes())
    return out


def compare(lower: dict[str, Entry], current: dict[str, Entry]) -> list[Change]:
    """The changes that turn `lower` into `current`, parents before children; a path whose
    type changed is a deletion followed by its new content."""
    changes: list[Change] = []
    for path in sorted(set(lower) | set(current), key=lambda p: PurePosixPath(p).parts):
        old, new = lower.get(path), current.get(path)
        if old == new:
            continue
        if new is None:
            if not _parent_deleted(path, lower, current):
                changes.append(Change(path, "deleted", None, old.mode))
            continue
        if old is not None and old.kind != new.kind:
            changes.append(Change(path, "deleted", None, old.mode))
            old = None
        if new.kind == "dir":
            changes.append(Change(path, "dir", None, new.mode))
        elif new.kind == "symlink":
            changes.append(Change(path, "symlink", new.data, new.mode))
        else:
            changes.append(Change(path, "added" if old is None else "modified", new.data,
                                  new.mode))
    return changes


def _parent_deleted(path: str, lower: dict, current: dict) -> bool:
    """Some ancestor directory of `path` is gone (or no longer a directory): its deletion
    already covers `path`."""
    for parent in map(str, PurePosixPath(path).parents):
        if parent in lower and (parent not in current or current[parent].kind != "dir"):
            return True
    return False


# ---------------------------------------------------------------- runtime (runs apptainer)

def _run(argv: list[str], timeout_s: float, stdin: bytes = b"") -> subprocess.CompletedProcess:
    try:
        r = subprocess.run(argv, input=stdin, capture_output=True, timeout=timeout_s)
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise SandboxError(f"{display(argv)}: {exc}") from None
    if r.returncode != 0:
        raise SandboxError(f"{display(argv)} failed (exit {r.returncode}): "
                           f"{r.stderr[-STDERR_TAIL_BYTES:].decode(errors='replace').strip()}")
    return r


def apptainer_available(binary: str = "apptainer") -> str | None:
    """Why the Apptainer backend cannot run here, or None when it can."""
    if shutil.which(binary) is None:
        return f"{binary} is not on PATH (install apptainer to use this backend)"
    return None


class ApptainerRuntime(warmpool.PooledBackend, SandboxBackend):
    """Creates Apptainer-backed sandboxes: the native SandboxRuntime's interface."""

    def __init__(self, cfg: ApptainerConfig | None = None):
        self.cfg = cfg or ApptainerConfig()
        self._own_workdir = self.cfg.workdir is None
        self.workdir = Path(self.cfg.workdir or tempfile.mkdtemp(prefix="paddock-apptainer-"))
        self._ids = itertools.count(1)
        self._lower_cache: dict[tuple[str, str], Path] = {}
        self._lock = threading.Lock()   # the warm pools
        self._init_pools()

    def start(self) -> "ApptainerRuntime":
        if (why := apptainer_available(self.cfg.binary)) is not None:
            raise SandboxError(why)
        return self

    def close(self) -> None:
        self._stop_pools()
        if self._own_workdir:
            shutil.rmtree(self.workdir, ignore_errors=True)

    def caps_report(self) -> dict:
        """Caps are apptainer's cgroup flags (when `cgroup_limits`), nofile a prlimit, disk the
        overlay image's size (or apptainer.conf's sessiondir size for tmpfs)."""
        cgroup = "apptainer --memory/--pids-limit/--cpus" if self.cfg.cgroup_limits else None
        caps = {cap: cgroup for cap in cgroups.CAPS}
        return {"caps": caps, "mode": "apptainer-cgroups" if cgroup else "none",
                "degraded": [cap for cap, how in caps.items() if not how],
                "isolation": self.cfg.isolation, "writable": self.cfg.writable}

    def settle(self, timeout_s: float = 10.0) -> None:
        """Nothing to wait for: `destroy` returns once `instance stop` has stopped the instance."""

    def create(self, spec: SandboxSpec) -> "ApptainerSandbox":
        try:
            sif.check_arch(spec.image)
        except (sif.SifError, OSError) as exc:
            raise SandboxError(f"image {spec.image}: {exc}") from None
        name = f"{INSTANCE_PREFIX}{os.getpid()}-{next(self._ids)}"
        overlay = None
        if self.cfg.writable == "overlay":
            overlay = str(self.workdir / f"{name}.img")
            size_mb = int(_positive(spec.limits, "disk_mb") or 64)
            _run(overlay_create_argv(overlay, size_mb, self.cfg), OVERLAY_CREATE_TIMEOUT_S)
        try:
            _run(instance_start_argv(spec, name, self.cfg, overlay=overlay), INSTANCE_TIMEOUT_S)
        except SandboxError:
            if overlay:
                Path(overlay).unlink(missing_ok=True)
            raise
        sb = ApptainerSandbox(self, name, spec, overlay)
        if spec.files:
            sb.write_files({f"/work/{k}": v for k, v in spec.files.items()})
        return sb

    def image_lower(self, image: Path, prefix: str) -> Path:
        """The image's files under `prefix`, extracted once per (image, prefix)."""
        key = (str(image), prefix)
        if key not in self._lower_cache:
            offset = sif.read_sif(image).primary_partition_offset
            dest = self.workdir / f"lower-{hashlib.sha256(repr(key).encode()).hexdigest()[:16]}"
            argv = ["unsquashfs", "-no-xattrs", "-quiet", "-no-progress", "-o", str(offset),
                    "-d", str(dest), str(image)]
            if prefix.strip("/"):
                argv.append(prefix)
            _run(argv, INSTANCE_TIMEOUT_S)
            self._lower_cache[key] = dest
        return self._lower_cache[key]


@dataclass
class ApptainerSandbox(SandboxHandle):
    runtime: ApptainerRuntime
    name: str
    spec: SandboxSpec
    overlay: str | None
    destroyed: bool = field(default=False)

    def _check_live(self) -> None:
        if self.destroyed:
            raise SandboxError(f"sandbox {self.name} is destroyed")

    def exec(self, argv: list[str], stdin: bytes = b"", timeout_s: float = 30.0,
             cwd: str = "/work", env: dict | None = None, output_cap: int = 65536) -> ExecResult:
        self._check_live()
        cmd = instance_exec_argv(self.name, argv, self.runtime.cfg, cwd=cwd, env=env)
        start = time.monotonic()
        proc = subprocess.Popen(cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE, start_new_session=True)
        try:
            out, err = proc.communicate(stdin, timeout=timeout_s)
            timed_out, code = False, proc.returncode
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            out, err = proc.communicate()
            timed_out, code = True, EXIT_TIMEOUT
        truncated = len(out) > output_cap or len(err) > output_cap
        return ExecResult(code, out[:output_cap], err[:output_cap], timed_out, truncated,
                          time.monotonic() - start)

    def _must(self, argv: list[str], stdin: bytes = b"", max_bytes: int = 1 << 20) -> bytes:
        r = self.exec(argv, stdin=stdin, timeout_s=INSTANCE_TIMEOUT_S, cwd="/",
                      output_cap=max_bytes)
        if r.exit_code != 0 or r.truncated:
            raise SandboxError(f"sandbox {self.name}: {display(argv)} failed (exit "
                               f"{r.exit_code}{', output truncated' if r.truncated else ''}): "
                               f"{r.stderr.decode(errors='replace').strip()}")
        return r.stdout

    def write_files(self, files: dict, mode: int = 0o644) -> None:
        """Each file through stdin; the path is an argument, never part of a script."""
        script = 'mkdir -p "$(dirname "$1")" && cat > "$1" && chmod "$2" "$1"'
        for path, data in files.items():
            if not str(path).startswith("/"):
                raise ValueError(f"sandbox path {path!r} must be absolute")
            data = data.encode() if isinstance(data, str) else data
            self._must(["/bin/sh", "-c", script, "sh", str(path), f"{mode:o}"], stdin=data)

    def read_file(self, path: str, max_bytes: int = 1 << 20) -> bytes:
        if not str(path).startswith("/"):
            raise ValueError(f"sandbox path {path!r} must be absolute")
        return self._must(["cat", path], max_bytes=max_bytes)

    def diff(self, prefix: str = "/work", max_bytes: int = 8 << 20, skip_bytecode: bool = False) -> list[Change]:
        """The whole tree under `prefix` as a tar, compared with the image's; a tree whose tar
        passes `max_bytes` is DiffRefused (the workload's doing), bytecode included."""
        r = self.exec(["tar", "-C", "/", "-cf", "-", prefix.strip("/") or "."], timeout_s=INSTANCE_TIMEOUT_S,
                      cwd="/", output_cap=max_bytes)
        if r.truncated:
            raise diff_refused(self.name, f"the tree under {prefix} passes {max_bytes} bytes as a tar "
                               "(the diff's max_bytes)")
        if r.exit_code != 0:
            raise SandboxError(f"sandbox {self.name}: tar of {prefix} failed (exit {r.exit_code}): "
                               f"{r.stderr.decode(errors='replace').strip()}")
        lower = tree_entries(self.runtime.image_lower(self.spec.image, prefix), prefix)
        changes = compare(lower, tar_entries(r.stdout, prefix))
        if skip_bytecode:
            changes = [c for c in changes if c.kind == "deleted" or not in_bytecode(c.path, c.kind == "dir")]
        return changes

    def diff_archive(self, prefix: str = "/work", max_bytes: int = 8 << 20) -> bytes:
        """`diff()` as the native backend's archive (deletions as `.wh.<name>` entries)."""
        return changes_to_tar(self.diff(prefix, max_bytes))

    def apply(self, changes: "list[Change] | bytes") -> None:
        """Apply a `diff()` (or `diff_archive()`) of either backend, in order."""
        self._check_live()
        if isinstance(changes, (bytes, bytearray)):
            changes = tar_to_changes(bytes(changes))
        for c in changes:
            if not c.path.startswith("/"):
                raise ValueError(f"change path {c.path!r} must be absolute")
            if c.kind == "deleted":
                self._must(["rm", "-rf", c.path])
            elif c.kind == "dir":
                self._must(["mkdir", "-p", c.path])
                self._must(["chmod", f"{c.mode & 0o7777:o}", c.path])
            elif c.kind == "symlink":
                self._must(["ln", "-sfn", "--", (c.data or b"").decode(), c.path])
            else:
                self.write_files({c.path: c.data or b""}, mode=c.mode & 0o7777)

    def destroy(self) -> None:
        if self.destroyed:
            return
        self.destroyed = True
        try:
            _run(instance_stop_argv(self.name, self.runtime.cfg), INSTANCE_TIMEOUT_S)
        finally:
            if self.overlay:
                Path(self.overlay).unlink(missing_ok=True)
