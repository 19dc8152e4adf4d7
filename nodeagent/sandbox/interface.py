"""The named interface both sandbox backends implement: `SandboxBackend` (a node's factory of
sandboxes) and `SandboxHandle` (one sandbox). `nodeagent.sandbox.runtime.SandboxRuntime` with
`nodeagent.sandbox.handle.Sandbox` (native) and `nodeagent.sandbox.apptainer.ApptainerRuntime`
with `ApptainerSandbox` subclass them; a backend that misses a method cannot be instantiated, and
`tests/sandbox/test_conformance.py` runs the same contract against each.

The contract (what callers may rely on, whatever the backend):
- `start()` checks the host and returns the backend, ready; `close()` stops its pools and
  releases everything; both work as a context manager (`with Backend(...) as rt`).
- `create(spec)` makes a fresh sandbox with `spec.files` under /work; `pool(spec, target)`
  keeps `target` ready ones in the background; `acquire(spec)` hands out a ready one (or a fresh
  one) with `spec.files` written. Sandboxes are one-shot: never handed out twice.
- `caps_report()` is a dict with at least "caps" (cap name -> how it is enforced, None when it
  is not), "mode" (the enforcement mechanism, a string) and "degraded" (the list of requested
  caps that are not enforced).
- `settle()` returns once every destroyed sandbox is wholly gone (SandboxError names a leak).
- `exec(argv, stdin, timeout_s, cwd, env, output_cap)` returns an ExecResult: the command's
  exit code; stdout and stderr each cut at `output_cap` bytes (`truncated`); a command still
  running at `timeout_s` is killed with everything it started and reports exit code 124
  (`timed_out`). `stdin` reaches the command whole, up to 8 MiB (the native backend's
  `sbxinit.STDIN_MAX_BYTES`); more is a ValueError naming the cap.
- `write_files({abs path: bytes})`, `read_file(path)`; `diff(prefix)` the writable layer's
  changes under `prefix`, parents before children; `diff_archive(prefix)` the same as a tar;
  `apply(changes or archive)` replays either form (of either backend) so the tree under the
  prefix ends up the same.
- `destroy()` is idempotent and leaves no process of the sandbox; afterwards every call
  (exec, files, diff, apply) raises SandboxError.

Must not import: zmq, controller, nodeagent other than nodeagent.sandbox.spec.
"""
from __future__ import annotations

import abc

from nodeagent.sandbox.spec import Change, ExecResult, SandboxSpec

CAPS_REPORT_KEYS = ("caps", "mode", "degraded")
EXIT_TIMEOUT = 124   # the exit code of a command killed at its timeout (as coreutils `timeout`)


class SandboxHandle(abc.ABC):
    """One sandbox, used by one rollout and destroyed after it."""

    destroyed: bool

    @abc.abstractmethod
    def exec(self, argv: list[str], stdin: bytes = b"", timeout_s: float = 30.0, cwd: str = "/work",
             env: dict | None = None, output_cap: int = 65536) -> ExecResult:
        """Run `argv` in the sandbox (see the module docstring for caps and timeouts)."""

    @abc.abstractmethod
    def write_files(self, files: dict, *, mode: int = 0o644) -> None:
        """Write {absolute path: bytes or str} into the sandbox."""

    @abc.abstractmethod
    def read_file(self, path: str, max_bytes: int = 1 << 20) -> bytes:
        """The bytes of the file at `path` in the sandbox."""

    @abc.abstractmethod
    def diff(self, prefix: str, max_bytes: int = 8 << 20, skip_bytecode: bool = False) -> list[Change]:
        """The writable layer's changes under `prefix`, parents before children. What it cannot
        carry (past `max_bytes`, ...) is DiffRefused naming it; `skip_bytecode` leaves Python
        bytecode written there out."""

    @abc.abstractmethod
    def diff_archive(self, prefix: str, max_bytes: int = 8 << 20) -> bytes:
        """`diff()` as a tar archive (`spec.changes_to_tar`)."""

    @abc.abstractmethod
    def apply(self, changes: "list[Change] | bytes") -> None:
        """Replay a `diff()` or `diff_archive()` of either backend here."""

    @abc.abstractmethod
    def destroy(self) -> None:
        """Idempotent: kill every process of the sandbox; later calls raise SandboxError."""

    def __enter__(self):
        return self

    def __exit__(self, *exc) -> None:
        self.destroy()


class SandboxBackend(abc.ABC):
    """One node's factory of sandboxes."""

    @abc.abstractmethod
    def start(self) -> "SandboxBackend":
        """Check the host and get ready; raises SandboxError saying what is missing."""

    @abc.abstractmethod
    def close(self) -> None:
        """Stop the pools, destroy what they hold, release the node's state."""

    @abc.abstractmethod
    def create(self, spec: SandboxSpec) -> SandboxHandle:
        """A fresh sandbox of `spec`, its files written."""

    @abc.abstractmethod
    def pool(self, spec: SandboxSpec, target: int):
        """Keep `target` ready sandboxes of `spec` (a `warmpool.WarmPool`)."""

    @abc.abstractmethod
    def acquire(self, spec: SandboxSpec, timeout_s: float = 30.0) -> SandboxHandle:
        """A ready sandbox of `spec` from its pool, else a fresh one. Use once."""

    @abc.abstractmethod
    def caps_report(self) -> dict:
        """How caps are enforced: at least the keys of CAPS_REPORT_KEYS."""

    @abc.abstractmethod
    def settle(self, timeout_s: float = 10.0) -> None:
        """Return once every destroyed sandbox is wholly gone."""

    def __enter__(self):
        return self.start()

    def __exit__(self, *exc) -> None:
        self.close()
