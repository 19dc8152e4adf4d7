"""Zero leaks: after destroy(), and after SIGKILL of the node agent then a restart, no mount,
namespace, process, cgroup or state directory of Paddock remains. Counted, not assumed."""
from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time

import psutil
import pytest

from nodeagent.sandbox.cgroups import NODE_PREFIX
from nodeagent.sandbox.runtime import SandboxError, SandboxRuntime, SandboxSpec, subid_range

pytestmark = pytest.mark.sandbox
NS_KINDS = ("mnt", "pid", "net", "ipc", "uts", "user", "cgroup")


def ns_ids(pid: int) -> set[str]:
    out = set()
    for kind in NS_KINDS:
        try:
            out.add(os.readlink(f"/proc/{pid}/ns/{kind}"))
        except OSError:
            pass
    return out


def live_ns_ids(started_before: float | None = None) -> set[str]:
    """Namespaces held by live processes. Namespace inode numbers are reused once freed, so a
    check after a kill looks only at processes that already existed (`started_before`)."""
    out = set()
    for p in psutil.process_iter(["create_time"]):
        if started_before is None or (p.info["create_time"] or 0) < started_before:
            out |= ns_ids(p.pid)
    return out


def host_mounts_under(prefix: str) -> list[str]:
    with open("/proc/self/mountinfo") as f:
        return [ln.split()[4] for ln in f if ln.split()[4].startswith(prefix)]


def cgroup_dirs(name_part: str) -> list[str]:
    found = []
    for ctrl in ("memory", "pids", "cpu"):
        for dirpath, dirnames, _ in os.walk(f"/sys/fs/cgroup/{ctrl}"):
            found += [os.path.join(dirpath, d) for d in dirnames if name_part in d]
    return found


@pytest.fixture
def run_root():
    d = tempfile.mkdtemp(prefix="paddock-test-nodes-", dir="/tmp")
    os.chmod(d, 0o755)
    yield d
    shutil.rmtree(d, ignore_errors=True)


def held_ns(pid: int) -> set[str]:
    """Namespaces a process holds open by fd (the node init keeps each sandbox's mount ns)."""
    out = set()
    for fd in os.listdir(f"/proc/{pid}/fd"):
        try:
            link = os.readlink(f"/proc/{pid}/fd/{fd}")
        except OSError:
            continue
        if link.split(":")[0] in NS_KINDS:
            out.add(link)
    return out


def test_destroy_leaves_no_process_namespace_mount_or_cgroup(runtime, busybox_image):
    held_before = held_ns(psutil.Process(runtime.holder_pid).children()[0].pid)
    sb = runtime.create(SandboxSpec(image=busybox_image))
    sb.exec(["sh", "-c", "sleep 1000 >/dev/null 2>&1 &"])
    init = psutil.Process(sb.init_pid_host)
    tree = [init] + init.children(recursive=True)
    assert len(tree) >= 2   # init, the stray sleep
    node_init = psutil.Process(runtime.holder_pid).children()[0].pid
    sandbox_ns = set().union(*(ns_ids(p.pid) for p in tree)) - ns_ids(node_init)
    held = held_ns(node_init) - held_before   # the builder's mount ns (tmpfs, overlay, /dev), the init's
    cgroups = list(sb.cgroup_paths.values())
    assert len(sandbox_ns) >= 7 and len(held) == 2 and all(os.path.isdir(d) for d in cgroups)
    destroyed_at = time.time()
    sb.destroy()
    runtime.settle()   # the defined point: everything below is gone once it returns
    assert runtime.destroying() == 0
    assert not [p for p in tree if p.is_running() and p.status() != psutil.STATUS_ZOMBIE]
    live = live_ns_ids(started_before=destroyed_at - 0.05) | held_ns(node_init)
    assert not (sandbox_ns | held) & live   # its namespaces, and the mounts in them, are gone
    assert not [d for d in cgroups if os.path.exists(d)]


def test_destroy_returns_before_the_teardown_and_settle_completes_it(busybox_image, run_root):
    """One id slice: each create needs the slice of the sandbox destroyed just before,
    reclaimed without a wait if its cgroup is empty, else by settling."""
    base, _ = subid_range()
    with SandboxRuntime(subids=(base, 2 * 1024), run_root=run_root) as rt:
        for i in range(6):
            sb = rt.create(SandboxSpec(image=busybox_image))
            assert sb.exec(["sh", "-c", "sleep 1000 >/dev/null 2>&1 &"]).exit_code == 0
            init = psutil.Process(sb.init_pid_host)
            tree = [init] + init.children(recursive=True)
            sb.destroy()
            with pytest.raises(SandboxError, match="destroyed"):
                sb.exec(["true"])
        rt.settle()
        assert rt.destroying() == 0 and rt.active_sandboxes() == 0
        assert not [p for p in tree if p.is_running() and p.status() != psutil.STATUS_ZOMBIE]
        node_dirs = rt.cgroups.report.dirs.values()
        for d in node_dirs:   # spare builders hold no cgroup
            assert not [e.name for e in os.scandir(d) if e.is_dir()]
        assert len(rt._free_slices) == rt.slots   # every slice back
        node_init = psutil.Process(rt.holder_pid).children()[0].pid
        assert held_ns(node_init) == set()   # no destroyed sandbox's mount namespace is kept


def _agent_script(run_root: str) -> str:
    return f"""
import sys
from nodeagent.sandbox.runtime import SandboxRuntime, SandboxSpec
rt = SandboxRuntime(run_root={run_root!r}).start()
boxes = [rt.create(SandboxSpec(image={{img!r}})) for _ in range(2)]
for b in boxes:
    b.exec(["sh", "-c", "sleep 1000 >/dev/null 2>&1 &"])
print(rt.holder_pid, rt.state_dir, rt.cgroups.node_name, flush=True)
sys.stdin.read()
"""


def test_sigkilled_agent_leaves_nothing_after_the_next_start(busybox_image, run_root):
    script = _agent_script(run_root).replace("{img!r}", repr(str(busybox_image)))
    agent = subprocess.Popen([sys.executable, "-c", script], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                             cwd=os.getcwd())
    try:
        holder_pid, state_dir, node_name = agent.stdout.readline().decode().split()
        holder = psutil.Process(int(holder_pid))
        tree = [holder] + holder.children(recursive=True)
        assert len(tree) >= 7   # holder, node init, squashfuse, 2 × (init, sleep)
        their_ns = set().union(*(ns_ids(p.pid) for p in tree)) - ns_ids(os.getpid())
        assert cgroup_dirs(node_name)
        killed_at = time.time()
        os.kill(agent.pid, signal.SIGKILL)
        agent.wait()
        psutil.wait_procs(tree, timeout=10)
        assert not [p for p in tree if p.is_running() and p.status() != psutil.STATUS_ZOMBIE]
        assert not their_ns & live_ns_ids(started_before=killed_at - 0.05)
        assert not host_mounts_under(state_dir)
        # Left behind by the kill: the empty state dir and the (empty) cgroups. The next start sweeps.
        with SandboxRuntime(run_root=run_root) as rt:
            assert state_dir in rt.swept
            assert not os.path.exists(state_dir)
            assert not cgroup_dirs(node_name)
        assert os.listdir(run_root) == []
        assert not cgroup_dirs(NODE_PREFIX + str(agent.pid) + "-")
    finally:
        if agent.poll() is None:
            agent.kill()
            agent.wait()
