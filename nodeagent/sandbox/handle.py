"""One native sandbox, as its holder's caller sees it: `Sandbox` (a `SandboxHandle`).

`exec` talks to the sandbox's init directly over its own socket (framing records, see
`nodeagent.sandbox.sbxinit`); file operations (`write_files`, `read_file`, `diff`, `apply`,
`usage`) go through the runtime to a helper of the node holder in the sandbox's mount namespace;
`destroy` kills the init through its pidfd and hands the rest of the teardown to the runtime
(`SandboxRuntime.settle`). The runtime is passed in: this module never imports it.

Must not import: zmq, controller.*, nodeagent.agent, nodeagent.harness, nodeagent.verifier,
nodeagent.sandbox.runtime.
"""
from __future__ import annotations

import os
import select
import signal
import threading

from nodeagent.sandbox import framing, sbxinit
from nodeagent.sandbox.interface import SandboxHandle
from nodeagent.sandbox.spec import Change, ExecResult, SandboxError, changes_to_tar, diff_refused, tar_to_changes

EXEC_GRACE_S = 30.0   # past an exec's own timeout, a silent init is declared dead
DESTROY_TIMEOUT_S = 10.0


class Sandbox(SandboxHandle):
    """One sandbox. `exec` talks to the sandbox's init directly; file operations go through the
    node holder (a helper in the sandbox's mount namespace); `destroy` asks the holder to kill."""

    def __init__(self, runtime, sid, sock, slice_no, init_pid, uid_map, spec, image_key=None, pidfd=None):
        self.runtime, self.id, self._sock, self.slice_no = runtime, sid, sock, slice_no
        self._pidfd = pidfd   # the init's: destroy kills through it and waits on it
        self.init_pid, self.uid_map, self.spec = init_pid, uid_map, spec
        self.image_key = image_key
        self.layer_keys: tuple[str, ...] = ()   # the node's references on its layers (bottom first)
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
                        req["output_cap"], req["uid"], self.spec.egress_socket is not None,
                        req.get("oom_score_adj")))
                    reply = sbxinit.checked_exec_reply(
                        framing.recv_records(self._sock, max_bytes=sbxinit.INIT_REPLY_MAX_BYTES))
                except (framing.FramingError, OSError) as exc:
                    raise SandboxError(f"sandbox {self.id} init is gone: {exc}") from None
        if not reply.get("ok"):
            if reply.get("refused") and req["op"] == "diff":     # the node holder's helper, not the init
                raise diff_refused(self.id, reply.get("error", "no reason given"))
            raise SandboxError(f"sandbox {self.id}: {reply.get('error', 'unknown error')}")
        return reply

    def exec(self, argv: list[str], stdin: bytes = b"", timeout_s: float = 30.0, cwd: str = "/work",
             env: dict | None = None, output_cap: int = 65536, uid: int | None = None,
             oom_score_adj: int | None = None) -> ExecResult:
        """Run `argv` in the sandbox. `uid`: an in-sandbox uid (0 ≤ uid < slice size) other than the
        agent's root, e.g. a checker that does not own /work; its gid is the same number.
        `oom_score_adj`: see `sbxinit.exec_records` (default: 1000, the OOM killer's first choice)."""
        if uid is not None and not (0 <= int(uid) < self.runtime.slice_size):
            raise ValueError(f"uid {uid} is outside the sandbox's id slice [0, {self.runtime.slice_size})")
        r = self._call({"op": "exec", "argv": list(argv) if isinstance(argv, (list, tuple)) else argv,
                        "stdin": stdin, "timeout_s": timeout_s, "cwd": cwd, "env": env or {},
                        "output_cap": output_cap, "uid": uid, "oom_score_adj": oom_score_adj})
        return ExecResult(r["exit_code"], r["stdout"], r["stderr"], r["timed_out"], r["truncated"], r["wall_s"])

    def write_files(self, files: dict, owner: str = "agent", mode: int = 0o644) -> None:
        if owner not in ("agent", "system"):
            raise ValueError(f"owner must be 'agent' or 'system', not {owner!r}")
        data = {k: (v.encode() if isinstance(v, str) else v) for k, v in files.items()}
        self._call({"op": "write_files", "files": data, "owner": owner, "mode": mode})

    def read_file(self, path: str, max_bytes: int = 1 << 20) -> bytes:
        return self._call({"op": "read_file", "path": path, "max_bytes": max_bytes})["data"]

    def diff(self, prefix: str = "/", max_bytes: int = 8 << 20, skip_bytecode: bool = False) -> list[Change]:
        """The writable layer's changes under `prefix`, parents before children: files (added or
        modified, with mode), directories (kind 'dir', with mode), symlinks, and deletions
        (whiteouts; an opaque directory is a deletion followed by 'dir'). What cannot be carried
        (content past `max_bytes`, the `sbxinit.DIFF_MAX_*` limits) raises DiffRefused naming
        the path and the limit. `skip_bytecode`: Python bytecode written (`__pycache__/`, `*.pyc`)
        is left out (a grader never applies it)."""
        changes = self._call({"op": "diff", "prefix": prefix, "max_bytes": max_bytes,
                              "skip_bytecode": skip_bytecode})["changes"]
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

