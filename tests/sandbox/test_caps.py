"""Caps through cgroups (v1 here), the report of what enforces them, and refusal to run without."""
from __future__ import annotations

import os

import pytest

from nodeagent.sandbox.runtime import SandboxError, SandboxRuntime, SandboxSpec

pytestmark = pytest.mark.sandbox

LIMITS = {"memory_mb": 96, "pids": 24, "cpu": 0.5, "disk_mb": 16, "nofile": 128}


def test_caps_report_names_the_mechanism_of_every_cap(runtime):
    rep = runtime.caps_report()
    assert set(rep["caps"]) == {"memory", "pids", "cpu"}
    assert all(m in ("cgroup-v1", "cgroup-v2") for m in rep["caps"].values()), rep
    assert rep["degraded"] == [] and rep["overlay"] == "kernel"


def test_each_sandbox_gets_its_own_cgroups_with_the_spec_limits(runtime, busybox_image):
    with runtime.create(SandboxSpec(image=busybox_image, limits=LIMITS)) as sb:
        paths = sb.cgroup_paths
        assert set(paths) == {"memory", "pids", "cpu"}
        read = lambda p, f: open(os.path.join(p, f)).read().strip()  # noqa: E731
        assert read(paths["memory"], "memory.limit_in_bytes") == str(96 << 20)
        assert read(paths["pids"], "pids.max") == "24"
        assert read(paths["cpu"], "cpu.cfs_quota_us") == "50000"
        r = sb.exec(["sh", "-c", "sleep 60 & echo $!"])
        assert r.exit_code == 0
        procs = read(paths["pids"], "cgroup.procs").split()
        assert len(procs) >= 2   # the init and the stray sleep are both inside
    runtime.settle()   # the defined point: destroy's teardown is complete
    assert not any(os.path.exists(p) for p in paths.values())


def test_sandboxes_run_at_the_default_cpu_weight(runtime, busybox_image):
    from nodeagent.sandbox.cgroups import CPU_WEIGHT
    read = lambda p, f: open(os.path.join(p, f)).read().strip()  # noqa: E731
    name, default = CPU_WEIGHT[runtime.cgroups.version]
    ctrl = "cpu" if runtime.cgroups.version == 1 else ""
    with runtime.create(SandboxSpec(image=busybox_image, limits=LIMITS)) as sb:
        assert read(sb.cgroup_paths[ctrl], name) == default


def test_the_sandbox_sees_its_cgroup_as_the_root(runtime, busybox_image):
    with runtime.create(SandboxSpec(image=busybox_image)) as sb:
        lines = sb.exec(["cat", "/proc/self/cgroup"]).stdout.decode().split()
    per_ctrl = {ln.split(":")[1]: ln.split(":")[2] for ln in lines}
    assert per_ctrl["memory"] == "/" and per_ctrl["pids"] == "/"


def test_a_cap_the_host_cannot_enforce_is_refused_by_name(busybox_image):
    with pytest.raises(SandboxError, match=r"cap\(s\) cpu cannot be enforced.*degrade=True"):
        SandboxRuntime(use_cgroups=False, user_space_caps=False).start()


def test_degrade_runs_on_rlimits_and_says_so(busybox_image):
    with SandboxRuntime(use_cgroups=False, user_space_caps=False, degrade=True) as rt:
        rep = rt.caps_report()
        assert rep["caps"] == {"memory": "rlimit", "pids": "rlimit", "cpu": None}
        assert rep["degraded"] == ["cpu"]
        with rt.create(SandboxSpec(image=busybox_image, limits={"memory_mb": 64, "pids": 16})) as sb:
            r = sb.exec(["sh", "-c", "ulimit -v; ulimit -u"])
            assert r.stdout.split() == [str(64 * 1024).encode(), b"16"]
            assert sb.cgroup_paths == {}
            r = sb.exec(["sh", "-c", "unshare -U true; echo rc=$?"])   # seccomp holds here too
            assert b"rc=0" not in r.stdout and b"Operation not permitted" in r.stderr


def test_the_report_says_whether_joining_a_cgroup_waits_for_rcu(runtime, tmp_path):
    from nodeagent.sandbox.runtime import cgroup_migration_is_fast
    fast = tmp_path / "fast"
    fast.write_text("cgroup2 /sys/fs/cgroup/unified cgroup2 rw,relatime,favordynmods 0 0\n")
    slow = tmp_path / "slow"
    slow.write_text("cgroup2 /sys/fs/cgroup/unified cgroup2 rw,relatime 0 0\n"
                    "cgroup /sys/fs/cgroup/pids cgroup rw,relatime,pids 0 0\n")
    assert cgroup_migration_is_fast(str(fast)) and not cgroup_migration_is_fast(str(slow))
    assert runtime.caps_report()["cgroup_migration"] in ("fast (favordynmods)", "waits for an RCU grace period")


HOLD_100_MIB = {   # how a workload may hold memory: every way is counted by the user-space cap
    "private": "b = bytearray(100 << 20)\nfor i in range(0, len(b), 4096): b[i] = 1",
    "shared_mapping": "import mmap\nm = mmap.mmap(-1, 100 << 20)\nfor i in range(0, 100 << 20, 4096): m[i] = 1",
    "memfd_unmapped": "import os\nfd = os.memfd_create('x')\nfor _ in range(100): os.write(fd, bytes(1 << 20))",
    "memfd_mapped": ("import mmap, os\nfd = os.memfd_create('x')\nos.ftruncate(fd, 100 << 20)\n"
                     "m = mmap.mmap(fd, 100 << 20)\nfor i in range(0, 100 << 20, 4096): m[i] = 1"),
}


@pytest.mark.parametrize("how", sorted(HOLD_100_MIB))
def test_the_user_space_memory_cap_counts_memory_held_in_shared_pages_and_memfds(how):
    """Without a memory cgroup the monitor sums what the sandbox's processes hold: shared
    anonymous pages and memfds (mapped or not) count like private memory, once each."""
    import subprocess
    import sys

    from nodeagent.sandbox.usercaps import MemoryMonitor, Watched
    proc = subprocess.Popen([sys.executable, "-c", HOLD_100_MIB[how] + "\nprint('ready', flush=True)\ninput()"],
                            stdout=subprocess.PIPE, stdin=subprocess.PIPE, text=True)
    try:
        assert proc.stdout.readline() == "ready\n"
        killed: list[int] = []
        monitor = MemoryMonitor(kill=lambda pid, sig: killed.append(pid))
        under = Watched("s1", proc.pid, 200 << 20)
        assert 95 << 20 <= monitor.check(under) <= 160 << 20 and under.kills == 0
        over = Watched("s2", proc.pid, 64 << 20)
        assert monitor.check(over) > 64 << 20 and over.kills == 1
    finally:
        proc.kill()
        proc.wait()
