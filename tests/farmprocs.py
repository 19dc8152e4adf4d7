"""Census of a farm's processes from /proc, for the tests that assert none of them runs as root
(issue 16: no root anywhere in the job path). Not a test module (no test_ prefix).

"The farm's processes" are precise: every descendant of the farm's root processes (the `paddock
run` process; for a Slurm job, the job's slurmstepd processes, themselves excluded: slurmd and
slurmstepd are root by design and start the job as its user), plus every process whose uid lies in
the user's subordinate range (the node holders, native factories and sandbox inits, wherever
they were reparented). A process counts as root if any of its real, effective, saved or
filesystem uids is 0. The setuid helpers an admin installs for the user (newuidmap, newgidmap,
fusermount) are named apart: they run as root by design for a moment, like slurmstepd.

`FarmWatch.sample()` is called from the test's own waiting loop (no extra sleeps); the sets it
keeps grow over the run. Standard library only.
"""
from __future__ import annotations

import os
import re
from dataclasses import dataclass, field

SETUID_HELPERS = frozenset({"newuidmap", "newgidmap", "fusermount", "fusermount3"})
SLURM_DAEMONS = frozenset({"slurmd", "slurmstepd"})


@dataclass(frozen=True)
class Proc:
    pid: int
    ppid: int
    start_ticks: int
    uids: tuple[int, int, int, int]     # real, effective, saved, filesystem
    comm: str
    cmdline: str


def read_proc(pid: int) -> Proc | None:
    try:
        stat = open(f"/proc/{pid}/stat").read()
        status = open(f"/proc/{pid}/status").read()
        cmdline = open(f"/proc/{pid}/cmdline", "rb").read().replace(b"\0", b" ").decode(errors="replace").strip()
    except OSError:   # gone meanwhile
        return None
    comm = stat[stat.index("(") + 1:stat.rindex(")")]
    fields = stat[stat.rindex(")") + 2:].split()
    uids = tuple(int(x) for x in re.search(r"^Uid:\s+(.*)$", status, re.M).group(1).split())
    return Proc(pid, int(fields[1]), int(fields[19]), uids, comm, cmdline)


def snapshot() -> dict[int, Proc]:
    out = {}
    for name in os.listdir("/proc"):
        if name.isdigit() and (p := read_proc(int(name))) is not None:
            out[p.pid] = p
    return out


def descendants(table: dict[int, Proc], roots: set[int]) -> set[int]:
    children: dict[int, list[int]] = {}
    for p in table.values():
        children.setdefault(p.ppid, []).append(p.pid)
    seen, todo = set(), list(roots)
    while todo:
        for c in children.get(todo.pop(), []):
            if c not in seen:
                seen.add(c)
                todo.append(c)
    return seen


def subid_range(user: str) -> tuple[int, int]:
    """(first, count) of `user` in /etc/subuid."""
    for line in open("/etc/subuid"):
        name, first, count = line.strip().split(":")
        if name == user:
            return int(first), int(count)
    raise LookupError(f"{user} has no range in /etc/subuid")


def stepd_pids(table: dict[int, Proc], job_ids: set[str]) -> set[int]:
    """The slurmstepd processes of these job ids (`slurmstepd: [<id>.<step>]`)."""
    want = re.compile(r"slurmstepd: \[(\d+)[.+]")
    return {p.pid for p in table.values()
            if p.comm == "slurmstepd" and (m := want.match(p.cmdline)) and m.group(1) in job_ids}


@dataclass
class FarmWatch:
    """What a farm ran, sampled over its life: processes by (pid, start time)."""
    user: str
    seen: dict[tuple[int, int], Proc] = field(default_factory=dict)      # last sample with a cmdline
    rooted: dict[tuple[int, int], Proc] = field(default_factory=dict)    # any sample with a uid 0

    def __post_init__(self) -> None:
        self.sub_first, self.sub_count = subid_range(self.user)

    def in_subrange(self, p: Proc) -> bool:
        return self.sub_first <= p.uids[0] < self.sub_first + self.sub_count

    def sample(self, roots: set[int], exclude_roots: bool = False) -> None:
        """One census: the descendants of `roots` (and the roots, unless excluded), and every
        process of the subordinate range."""
        self._collect(snapshot(), roots, exclude_roots)

    def sample_job(self, job_ids: set[str]) -> None:
        """One census of a Slurm job: under its slurmstepd processes (those excluded)."""
        table = snapshot()
        self._collect(table, stepd_pids(table, job_ids), exclude_roots=True)

    def _collect(self, table: dict[int, Proc], roots: set[int], exclude_roots: bool) -> None:
        pids = descendants(table, roots) | (set() if exclude_roots else roots & set(table))
        pids |= {p.pid for p in table.values() if self.in_subrange(p)}
        for pid in pids:
            p = table[pid]
            if p.comm in SLURM_DAEMONS:
                continue
            key = (p.pid, p.start_ticks)
            # the last sample with a cmdline: a child sampled between its fork and its exec shows
            # its parent's command line, its exec the real one (a zombie has no cmdline left)
            if key not in self.seen or p.cmdline:
                self.seen[key] = p
            if 0 in p.uids and p.comm not in SETUID_HELPERS:
                self.rooted.setdefault(key, p)

    def as_root(self) -> list[Proc]:
        """Farm processes seen with a uid 0 (the setuid helpers aside)."""
        return list(self.rooted.values())

    def foreign(self, uid: int) -> list[Proc]:
        """Seen processes running neither as `uid` nor as one of its subordinate ids. A setuid
        helper the user started (real uid `uid`, effective 0 for a moment) is the user's."""
        return [p for p in self.seen.values()
                if not (set(p.uids) == {uid} or self.in_subrange(p)
                        or (p.comm in SETUID_HELPERS and p.uids[0] == uid))]

    def matching(self, pattern: str) -> list[Proc]:
        """Seen processes whose command line matches `pattern`. A child caught between its fork
        and its exec (a Popen `preexec_fn` running) shows its parent's command line: it is
        that parent's, not another process of the kind."""
        by_pid = {p.pid: p for p in self.seen.values()}
        return [p for p in self.seen.values() if re.search(pattern, p.cmdline)
                and not ((q := by_pid.get(p.ppid)) is not None and q.cmdline == p.cmdline)]

    def sandbox_side(self) -> list[Proc]:
        """Holders, factories and inits: processes running as ids of the subordinate range."""
        return [p for p in self.seen.values() if self.in_subrange(p)]

    def describe(self, procs: list[Proc]) -> str:
        return "\n".join(f"  pid {p.pid} uids {p.uids} {p.comm}: {p.cmdline[:160]}" for p in procs)
