"""Caps held from user space, for the common case of no cgroup delegation (a Slurm job's cgroup,
an ordinary user): each cap no cgroup holds gets a mechanism that still holds it per sandbox.

- memory: `MemoryMonitor`, a thread of the runtime that sums the anonymous resident memory of
  each sandbox's processes (the init's process tree, from /proc) every `interval_s` and, at the
  cap, SIGKILLs every process of that sandbox but its init (as the cgroup OOM killer would kill
  the hog: the command ends with 137, the sandbox stays usable) — long before the job's own
  cgroup would OOM-kill the agent. RLIMIT_AS per process stays in place under it.
- pids: RLIMIT_NPROC, which counts per uid: every sandbox has its own subordinate id slice, so
  the limit is per sandbox.
- cpu: affinity to a slice of the CPUs the agent may use (`CpuSlices`, ceil(cpu) CPUs each,
  handed out round-robin) plus SCHED_BATCH at nice 10, so sandboxes never starve the agent or
  one another's slices; the sandbox init applies them to itself before anything runs.

The agent may signal and inspect its sandboxes' processes without root: it owns the user
namespace they live in. Only the standard library and nodeagent.sandbox.cgroups. Must not
import: zmq, controller.*, nodeagent.agent, nodeagent.harness, nodeagent.verifier.
"""
from __future__ import annotations

import logging
import math
import os
import signal
import threading
from dataclasses import dataclass, field

from nodeagent.sandbox.cgroups import CapsReport

log = logging.getLogger(__name__)

MECHANISMS = {"memory": "monitor+rlimit", "pids": "rlimit-per-id-slice", "cpu": "affinity+sched-batch"}
SANDBOX_NICE = 10
MONITOR_INTERVAL_S = 0.05


def upgrade(report: CapsReport) -> CapsReport:
    """`report` with every cap no cgroup holds given its user-space mechanism."""
    mech = {cap: (how if how and how.startswith("cgroup") else MECHANISMS[cap])
            for cap, how in report.mechanism.items()}
    return CapsReport(mech, dict(report.dirs), report.swap_accounted)


def held_in_user_space(report: CapsReport, cap: str) -> bool:
    return report.mechanism.get(cap) == MECHANISMS[cap]


class CpuSlices:
    """Slices of the CPUs this process may run on, ceil(cpu) CPUs each, round-robin."""

    def __init__(self, allowed: set[int] | None = None):
        self.allowed = sorted(allowed if allowed is not None else os.sched_getaffinity(0))
        self._next = 0
        self._lock = threading.Lock()

    def take(self, cpu: float) -> list[int]:
        """The CPUs of the next sandbox with a cap of `cpu` CPUs (all of them for no cap)."""
        if not cpu or cpu <= 0:
            return list(self.allowed)
        n = min(len(self.allowed), max(1, math.ceil(cpu)))
        with self._lock:
            start, self._next = self._next, (self._next + n) % len(self.allowed)
        return sorted({self.allowed[(start + i) % len(self.allowed)] for i in range(n)})


def sched_specs(cpus: list[int]) -> list[str]:
    """The init's scheduling settings, as `NAME=VALUE` specs beside its rlimits (sbxinit.c)."""
    return ["sched=batch", f"nice={SANDBOX_NICE}", "cpus=" + ",".join(str(c) for c in cpus)]


def _children(pid: int) -> list[int]:
    out: list[int] = []
    try:
        for tid in os.listdir(f"/proc/{pid}/task"):
            with open(f"/proc/{pid}/task/{tid}/children") as f:
                out += [int(c) for c in f.read().split()]
    except (OSError, ValueError):
        pass
    return out


def process_tree(root: int) -> list[int]:
    """`root` and its descendants (a sandbox's orphans are reparented to its init, its PID 1)."""
    seen, todo = [], [root]
    while todo:
        pid = todo.pop()
        seen.append(pid)
        todo += _children(pid)
    return seen


def held_bytes(pid: int, seen: set) -> int:
    """What process `pid` holds in memory: its private and shared anonymous pages and mapped
    memfd/tmpfs pages (status: RssAnon + RssShmem), and memfds it holds open but has not mapped
    (their blocks; each file once across the sandbox, `seen` holds their identities). Memory
    kept in shared pages or files is memory all the same (a cgroup would charge it)."""
    total = 0
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith(("RssAnon:", "RssShmem:")):
                    total += int(line.split()[1]) * 1024
        with open(f"/proc/{pid}/maps") as f:
            mapped = {int(parts[4]) for parts in (ln.split() for ln in f) if len(parts) > 5 and "/memfd:" in parts[5]}
        fds = os.listdir(f"/proc/{pid}/fd")
    except (OSError, ValueError, IndexError):
        return total
    for fd in fds:
        try:
            if not os.readlink(f"/proc/{pid}/fd/{fd}").startswith("/memfd:"):
                continue
            st = os.stat(f"/proc/{pid}/fd/{fd}")
        except OSError:
            continue
        key = (st.st_dev, st.st_ino)
        if st.st_ino not in mapped and key not in seen:
            seen.add(key)
            total += st.st_blocks * 512
    return total


@dataclass
class Watched:
    """One sandbox under the monitor."""
    sid: str
    init_pid: int      # in this PID namespace
    limit_bytes: int
    kills: int = 0
    peak_bytes: int = 0
    killed_pids: list[int] = field(default_factory=list)


class MemoryMonitor:
    """Sums each watched sandbox's memory and kills its processes (not its init) at the cap."""

    def __init__(self, interval_s: float = MONITOR_INTERVAL_S, kill=os.kill):
        self.interval_s, self._kill = interval_s, kill
        self._watched: dict[str, Watched] = {}
        self._cond = threading.Condition()
        self._stop = False
        self._thread: threading.Thread | None = None

    def watch(self, sid: str, init_pid: int, limit_bytes: int) -> None:
        with self._cond:
            self._watched[sid] = Watched(sid, init_pid, limit_bytes)
            if self._thread is None:
                self._thread = threading.Thread(target=self._run, name="paddock-memory-monitor", daemon=True)
                self._thread.start()
            self._cond.notify_all()

    def forget(self, sid: str) -> Watched | None:
        with self._cond:
            return self._watched.pop(sid, None)

    def get(self, sid: str) -> Watched | None:
        with self._cond:
            return self._watched.get(sid)

    def close(self) -> None:
        with self._cond:
            self._stop = True
            self._cond.notify_all()
            thread = self._thread
        if thread is not None:
            thread.join(timeout=5.0)

    def _run(self) -> None:
        while True:
            with self._cond:
                while not self._stop and not self._watched:
                    self._cond.wait()
                if self._stop:
                    return
                watched = list(self._watched.values())
            for w in watched:
                self.check(w)
            with self._cond:
                if self._stop:
                    return
                self._cond.wait(self.interval_s)

    def check(self, w: Watched) -> int:
        """One pass over sandbox `w`: its memory now; its processes killed if over the cap."""
        tree = process_tree(w.init_pid)
        seen: set = set()
        used = sum(held_bytes(p, seen) for p in tree)
        w.peak_bytes = max(w.peak_bytes, used)
        if used <= w.limit_bytes:
            return used
        victims = [p for p in tree if p != w.init_pid]
        for pid in victims:
            try:
                self._kill(pid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass
        w.kills += 1
        w.killed_pids += victims
        log.warning("sandbox %s used %d MiB, over its memory cap of %d MiB: killed %d process(es)",
                    w.sid, used >> 20, w.limit_bytes >> 20, len(victims))
        return used
