"""The sandbox vocabulary both backends share: what a sandbox is asked for and what it answers.

`SandboxSpec` (image, layers, limits, visible files, hostname, egress socket) is the request;
`SetupError` (a SandboxError) is a task setup command that failed;
`ExecResult` is a command's outcome (a command that fails inside the sandbox is an ExecResult,
never an error); `Change` is one entry of a writable layer's diff; `SandboxError` is every
infrastructure failure (the sandbox could not be made, or died under us, or refused a call).
`changes_to_tar` / `tar_to_changes` are the diff's archive form (deletions as `.wh.<name>`
entries, as in OCI layers), so a diff of either backend applies to the other.

Pure data and tar encoding: no processes, no sockets, no mounts. Must not import: zmq,
controller, nodeagent other than nodeagent.sandbox.spec.
"""
from __future__ import annotations

import io
import os
import tarfile
from dataclasses import dataclass, field
from pathlib import Path

WHITEOUT_PREFIX = ".wh."
DEFAULT_LIMITS = {"memory_mb": 256, "pids": 64, "disk_mb": 64, "nofile": 256}


class SandboxError(Exception):
    """Infrastructure failure: the sandbox could not be created or died under us."""


class DiffRefused(SandboxError):
    """`diff()` refused what the agent left under its prefix (too large, too deep, too many
    entries, a path too long, changed while read): the message names the path and the limit.
    The agent's doing, not the sandbox's: a rollout grades it as its own failure. Both
    backends raise it in one form, `diff_refused`."""


def diff_refused(sandbox: str, why: str) -> DiffRefused:
    """The refusal of a diff of `sandbox`, for either backend: `why` names the path and the
    limit (the native init's helper sends it in its reply; apptainer's `diff` says it)."""
    return DiffRefused(f"sandbox {sandbox}: diff refused: {why}")


BYTECODE_DIR, BYTECODE_SUFFIXES = "__pycache__", (".pyc", ".pyo")


def is_bytecode(name: str, is_dir: bool) -> bool:
    """A diff entry named `name` (a directory when `is_dir`) is Python bytecode, what running
    the tests leaves and a grader never applies: a `__pycache__` tree, a `*.pyc` or `*.pyo`."""
    return name == BYTECODE_DIR if is_dir else name.endswith(BYTECODE_SUFFIXES)


def in_bytecode(path: str, is_dir: bool) -> bool:
    """`is_bytecode` of the entry at `path`, or of a directory above it (a `__pycache__` tree)."""
    *dirs, name = path.rstrip("/").split("/")
    return BYTECODE_DIR in dirs or is_bytecode(name, is_dir)


class SetupError(SandboxError):
    """A task's setup command failed (`nodeagent.sandbox.setuplayer`): the task's environment is
    broken, not the agent's work. The caller records the rollout as infra_error and quarantines
    the task. Carries the command, its exit code (124: timed out) and the tail of its output."""

    def __init__(self, command: str, exit_code: int, output_tail: str, timed_out: bool = False):
        self.command, self.exit_code, self.output_tail, self.timed_out = command, exit_code, output_tail, timed_out
        how = "timed out" if timed_out else f"exited {exit_code}"
        super().__init__(f"setup command {command!r} {how}; output (tail):\n{output_tail}")


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
    limits: dict = field(default_factory=lambda: dict(DEFAULT_LIMITS))
    files: dict = field(default_factory=dict)     # relative to /work -> bytes, owned by the agent
    hostname: str = "sandbox"
    egress_socket: str | None = None   # host path of the node egress proxy's Unix socket
    # Read-only layers (squashfs files of `layers.treelayer`), bottom first: layers[0] lies just
    # above the image, the last just below the sandbox's writable layer. Shared by every
    # sandbox of the node that names them, never copied per sandbox; diff() sees none of them.
    layers: tuple = ()


def changes_to_tar(changes: list[Change]) -> bytes:
    """A diff as a tar archive: files carry their kind in a PAX header, deletions are empty
    `.wh.<name>` entries."""
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
                ti.type, ti.linkname = tarfile.SYMTYPE, os.fsdecode(c.data or b"")   # any bytes
                tar.addfile(ti)
            else:
                ti.size = len(c.data or b"")
                ti.pax_headers = {"PADDOCK.kind": c.kind}
                tar.addfile(ti, io.BytesIO(c.data or b""))
    return buf.getvalue()


def tar_to_changes(data: bytes) -> list[Change]:
    """The inverse of `changes_to_tar`; an unreadable archive or an entry of another type
    (device, hard link, fifo) is a SandboxError."""
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
                    out.append(Change("/" + ti.name, "symlink", os.fsencode(ti.linkname), 0o777))
                elif ti.isfile():
                    f = tar.extractfile(ti)
                    kind = ti.pax_headers.get("PADDOCK.kind", "added")
                    out.append(Change("/" + ti.name, kind, f.read() if f else b"", ti.mode))
                else:
                    raise SandboxError(f"diff archive entry {ti.name!r} has an unsupported type")
    except tarfile.TarError as exc:
        raise SandboxError(f"diff archive is not a readable tar: {exc}") from None
    return out
