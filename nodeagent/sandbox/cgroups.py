"""Per-sandbox resource caps through cgroups, or rlimits where the host allows no cgroup.

At start, `CgroupManager.detect()` picks one mechanism per cap and says which (`CapsReport`):

- cgroup v2, when this process's own v2 cgroup is a delegated subtree: writable, with
  `memory`, `pids` and `cpu` enabled in its `cgroup.subtree_control`;
- cgroup v1, per controller, when this process may create a child of its own cgroup in the
  `memory`, `pids` and `cpu` hierarchies (root on this machine, or a delegated v1 tree);
- otherwise rlimits: memory → `RLIMIT_AS`, pids → `RLIMIT_NPROC` (per uid: every sandbox has
  its own id slice). A CPU quota has no rlimit equivalent: it is a cap the host cannot enforce
  here; `nodeagent.sandbox.usercaps.upgrade` gives such caps their user-space mechanism.

Layout: one node directory per runtime, `paddock-node-<pid>-<starttime>-<random>` (the agent's
PID and start time, so a directory whose owner is gone is recognised and swept at the next start),
with one child per sandbox. The agent opens each sandbox cgroup's `cgroup.procs` and hands the
open files to the node holder, where a spare builder joins by writing "0" (itself; its init
inherits) or a builder writes its init's PID: the permission check uses the opener's
credentials, so no sandbox process needs write access to cgroupfs, and none gets any.

Only the standard library; no Paddock imports.
"""
from __future__ import annotations

import errno
import logging
import os
import signal
import time
from dataclasses import dataclass, field

log = logging.getLogger(__name__)

CAPS = ("memory", "pids", "cpu")
CPU_PERIOD_US = 100_000
CPU_WEIGHT = {1: ("cpu.shares", "1024"), 2: ("cpu.weight", "100")}   # the kernel's default (file, value)
NODE_PREFIX = "paddock-node-"


class CapsError(Exception):
    """A cap the host cannot enforce, or a cgroup operation that failed."""


@dataclass(frozen=True)
class CapsReport:
    """How each cap is enforced on this host: 'cgroup-v2', 'cgroup-v1', 'rlimit' or None."""
    mechanism: dict[str, str | None]
    dirs: dict[str, str] = field(default_factory=dict)    # controller -> node cgroup directory
    swap_accounted: bool = False

    @property
    def mode(self) -> str:
        kinds = {m for m in self.mechanism.values() if m}
        return "+".join(sorted(kinds)) or "none"

    def unenforceable(self, caps) -> list[str]:
        return [c for c in caps if not self.mechanism.get(c)]

    def __str__(self) -> str:
        parts = [f"{c}={self.mechanism.get(c) or 'NOT ENFORCEABLE'}" for c in CAPS]
        return f"caps: {' '.join(parts)} (node cgroups: {self.dirs or 'none'})"


def _own_cgroups() -> dict[str, str]:
    """controller name (or '' for v2) -> this process's cgroup path, from /proc/self/cgroup."""
    out = {}
    with open("/proc/self/cgroup") as f:
        for line in f:
            _, ctrls, path = line.rstrip("\n").split(":", 2)
            for c in ctrls.split(",") if ctrls else [""]:
                out[c] = path
    return out


def _mounts() -> list[tuple[str, str, set[str]]]:
    """(mount point, fstype, super options) of every cgroup/cgroup2 mount."""
    res = []
    with open("/proc/self/mountinfo") as f:
        for line in f:
            left, right = line.rstrip("\n").split(" - ", 1)
            fstype, _src, sopts = right.split(" ", 2)
            if fstype in ("cgroup", "cgroup2"):
                res.append((left.split()[4], fstype, set(sopts.split(","))))
    return res


def _starttime(pid: int) -> str | None:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[19]
    except (OSError, IndexError):
        return None


def _write(path: str, value: str) -> None:
    """One write of `value` (cgroupfs takes a value per write; no buffered file object)."""
    fd = os.open(path, os.O_WRONLY | os.O_CLOEXEC)
    try:
        os.write(fd, value.encode())
    finally:
        os.close(fd)


class CgroupManager:
    """Creates, fills and removes the per-sandbox cgroups of one runtime."""

    def __init__(self, enabled: bool = True, mountinfo=_mounts, own=_own_cgroups):
        self.enabled = enabled
        self._mountinfo, self._own = mountinfo, own
        self.node_name = f"{NODE_PREFIX}{os.getpid()}-{_starttime(os.getpid())}-{os.urandom(3).hex()}"
        self.report = CapsReport({"memory": "rlimit", "pids": "rlimit", "cpu": None})
        self.version = 0

    # -- detection --------------------------------------------------------------------------
    def detect(self) -> CapsReport:
        """Pick the mechanism, create the node directory (after sweeping stale ones)."""
        if not self.enabled:
            return self.report
        mounts, own = self._mountinfo(), self._own()
        v2 = next((m for m, t, _ in mounts if t == "cgroup2"), None)
        if v2 and "" in own and self._try_v2(os.path.join(v2, own[""].lstrip("/"))):
            return self.report
        self._try_v1(mounts, own)
        return self.report

    def _try_v2(self, mine: str) -> bool:
        try:
            with open(os.path.join(mine, "cgroup.subtree_control")) as f:
                enabled = set(f.read().split())
        except OSError:
            return False
        if not set(CAPS) <= enabled or not os.access(mine, os.W_OK):
            return False
        node = self._make_node(mine)
        if node is None:
            return False
        self.version = 2
        _write(os.path.join(node, "cgroup.subtree_control"), " ".join(f"+{c}" for c in CAPS))
        self.report = CapsReport({c: "cgroup-v2" for c in CAPS}, {"": node},
                                 os.path.exists(os.path.join(node, "memory.swap.max")))
        return True

    def _try_v1(self, mounts, own) -> None:
        mech, dirs = dict(self.report.mechanism), {}
        for ctrl in CAPS:
            mnt = next((m for m, t, o in mounts if t == "cgroup" and ctrl in o), None)
            if mnt is None or ctrl not in own:
                continue
            node = self._make_node(os.path.join(mnt, own[ctrl].lstrip("/")))
            if node is not None:
                mech[ctrl], dirs[ctrl] = "cgroup-v1", node
        if dirs:
            self.version = 1
        swap = "memory" in dirs and os.path.exists(os.path.join(dirs["memory"], "memory.memsw.limit_in_bytes"))
        self.report = CapsReport(mech, dirs, swap)

    def _make_node(self, parent: str) -> str | None:
        sweep_stale(parent)
        node = os.path.join(parent, self.node_name)
        try:
            os.mkdir(node, 0o755)
        except FileExistsError:
            pass
        except OSError as exc:
            log.info("cgroup %s not usable: %s", parent, exc)
            return None
        return node

    # -- per sandbox ------------------------------------------------------------------------
    def create(self, sid: str, limits: dict) -> list[int]:
        """Make the sandbox's cgroups, apply `limits`; return open `cgroup.procs` fds to join."""
        fds: list[int] = []
        try:
            for ctrl, node in self.report.dirs.items():
                d = os.path.join(node, sid)
                os.mkdir(d, 0o755)
                self._apply(ctrl, d, limits)
                fds.append(os.open(os.path.join(d, "cgroup.procs"), os.O_WRONLY | os.O_CLOEXEC))
        except OSError as exc:
            for fd in fds:
                os.close(fd)
            self.remove(sid)
            raise CapsError(f"cannot set up the cgroup of sandbox {sid}: {exc}") from None
        return fds

    def _apply(self, ctrl: str, d: str, limits: dict) -> None:
        mem = int(limits.get("memory_mb") or 0) << 20
        pids = int(limits.get("pids") or 0)
        cpu = float(limits.get("cpu") or 0)
        if self.version == 2:
            if mem:
                _write(f"{d}/memory.max", str(mem))
                if self.report.swap_accounted:
                    _write(f"{d}/memory.swap.max", "0")
            if pids:
                _write(f"{d}/pids.max", str(pids))
            if cpu:
                _write(f"{d}/cpu.max", f"{int(cpu * CPU_PERIOD_US)} {CPU_PERIOD_US}")
            return
        if ctrl == "memory" and mem:
            _write(f"{d}/memory.limit_in_bytes", str(mem))
            if self.report.swap_accounted:
                _write(f"{d}/memory.memsw.limit_in_bytes", str(mem))   # memory + swap: no swap
        elif ctrl == "pids" and pids:
            _write(f"{d}/pids.max", str(pids))
        elif ctrl == "cpu" and cpu:   # the period is the kernel's default (100 ms) in a new cgroup
            _write(f"{d}/cpu.cfs_quota_us", str(int(cpu * CPU_PERIOD_US)))

    def stat(self, sid: str) -> dict:
        """Usage and cap hits of a sandbox's cgroups (for tests and ops)."""
        out = {}
        for ctrl, node in self.report.dirs.items():
            d = os.path.join(node, sid)
            for name in ("memory.failcnt", "memory.max_usage_in_bytes", "pids.current", "pids.events",
                         "cpu.stat", "memory.events", "memory.peak", "memory.oom_control"):
                try:
                    with open(os.path.join(d, name)) as f:
                        out[name] = f.read().strip()
                except OSError:
                    pass
        return out

    def paths(self, sid: str) -> dict[str, str]:
        """controller ('' for v2) -> the sandbox's cgroup directory."""
        return {ctrl: os.path.join(node, sid) for ctrl, node in self.report.dirs.items()}

    def try_remove(self, sid: str) -> bool:
        """Remove the sandbox's cgroups if they are empty, without waiting: False while a task of
        it is still exiting (EBUSY), True once none is left."""
        for d in self.paths(sid).values():
            try:
                os.rmdir(d)
            except FileNotFoundError:
                pass
            except OSError as exc:
                if exc.errno == errno.EBUSY:
                    return False
                raise CapsError(f"cannot remove cgroup {d}: {exc}") from None
        return True

    def remove(self, sid: str, timeout_s: float = 5.0) -> None:
        for d in self.paths(sid).values():
            _rmdir_cgroup(d, timeout_s)

    def close(self) -> None:
        for node in self.report.dirs.values():
            for child in _children(node):
                _rmdir_cgroup(os.path.join(node, child), 5.0)
            _rmdir_cgroup(node, 5.0)


def _children(d: str) -> list[str]:
    try:
        return [e.name for e in os.scandir(d) if e.is_dir(follow_symlinks=False)]
    except OSError:
        return []


def _rmdir_cgroup(d: str, timeout_s: float) -> None:
    """Kill what is left in `d` (only Paddock's sandboxes live there), then rmdir it."""
    deadline = time.monotonic() + timeout_s
    while True:
        for child in _children(d):
            _rmdir_cgroup(os.path.join(d, child), timeout_s)
        try:
            os.rmdir(d)
            return
        except FileNotFoundError:
            return
        except OSError as exc:
            if exc.errno != errno.EBUSY or time.monotonic() > deadline:
                log.warning("cannot remove cgroup %s: %s", d, exc)
                return
        try:
            with open(os.path.join(d, "cgroup.procs")) as f:
                pids = [int(p) for p in f.read().split()]
        except OSError:
            pids = []
        for pid in pids:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        time.sleep(0.005)   # the kernel frees the cgroup once its last task is reaped


def sweep_stale(parent: str) -> list[str]:
    """Remove node directories under `parent` whose owning runtime is gone. Returns them."""
    swept = []
    for name in _children(parent):
        if not name.startswith(NODE_PREFIX):
            continue
        try:
            pid_s, start = name[len(NODE_PREFIX):].split("-")[:2]
            pid = int(pid_s)
        except ValueError:
            continue
        if _starttime(pid) == start:
            continue   # its runtime is alive (possibly another agent on this host)
        _rmdir_cgroup(os.path.join(parent, name), 5.0)
        swept.append(os.path.join(parent, name))
        log.info("swept stale cgroup %s", os.path.join(parent, name))
    return swept
