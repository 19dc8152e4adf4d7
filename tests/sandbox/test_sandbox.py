"""The native sandbox, on real namespaces, mounts and processes (what every backend must do is in
tests/sandbox/test_conformance.py)."""
from __future__ import annotations

import os
import re
import select
import signal
import socket
import time

import psutil
import pytest

from nodeagent.sandbox.runtime import SandboxError, SandboxRuntime, SandboxSpec

pytestmark = pytest.mark.sandbox


@pytest.fixture
def sb(runtime, busybox_image):
    box = runtime.create(SandboxSpec(image=busybox_image, files={"hello.txt": b"hi\n"},
                                     limits={"memory_mb": 128, "pids": 32, "disk_mb": 16, "nofile": 128}))
    yield box
    box.destroy()


def sh(box, script, **kw):
    return box.exec(["sh", "-c", script], **kw)


def test_writes_past_the_disk_cap_fail_with_enospc(sb):
    r = sh(sb, "dd if=/dev/zero of=/tmp/big bs=1M count=64")
    assert r.exit_code != 0
    assert b"No space left on device" in r.stderr


def test_inode_cap_stops_file_floods(runtime, busybox_image):
    box = runtime.create(SandboxSpec(image=busybox_image, limits={"disk_mb": 16, "inodes": 200}))
    try:
        r = sh(box, "i=0; while [ $i -lt 1000 ]; do touch /tmp/f$i || exit 3; i=$((i+1)); done")
        assert r.exit_code == 3
        assert b"No space left on device" in r.stderr
    finally:
        box.destroy()


def test_no_network_route_only_loopback(sb):
    r = sh(sb, "cat /proc/net/dev | tail -n +3 | cut -d: -f1 | tr -d ' '; cat /proc/net/route | wc -l")
    ifaces, route_lines = r.stdout.decode().split()[:-1], r.stdout.decode().split()[-1]
    assert ifaces == ["lo"]
    assert route_lines == "1"   # header only: no route anywhere


def test_host_loopback_service_is_unreachable(sb):
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen(1)
    port = server.getsockname()[1]
    try:
        r = sh(sb, f"nc -w 1 127.0.0.1 {port} </dev/null; echo rc=$?")
        assert b"rc=0" not in r.stdout
        server.settimeout(0.2)
        with pytest.raises(socket.timeout):
            server.accept()
    finally:
        server.close()


def test_own_pid_namespace(sb):
    r = sh(sb, "echo $$; ls /proc | grep -c '^[0-9]'")
    pid, nprocs = r.stdout.decode().split()
    assert int(nprocs) <= 4   # init, sh, ls, grep: no host process is visible


def test_image_is_read_only_for_the_sandbox(sb):
    r = sh(sb, "echo x > /bin/busybox; echo rc=$?")
    assert b"rc=0" not in r.stdout
    assert sh(sb, "echo ok > /work/new && cat /work/new").stdout == b"ok\n"


def test_subuid_mapping_is_visible_and_not_the_host_root(sb, runtime):
    inside = sh(sb, "cat /proc/self/uid_map").stdout.split()
    assert inside[0] == b"0" and int(inside[2]) == runtime.slice_size
    host_map = open(f"/proc/{_sandbox_init_pid(sb)}/uid_map").read().split()
    base, count = runtime.subids
    assert host_map[0] == "0"
    assert base <= int(host_map[1]) < base + count
    assert int(host_map[1]) != 0 and int(host_map[1]) != os.getuid()


def test_sandboxes_get_disjoint_id_slices(runtime, busybox_image):
    a = runtime.create(SandboxSpec(image=busybox_image))
    b = runtime.create(SandboxSpec(image=busybox_image))
    try:
        ma = open(f"/proc/{_sandbox_init_pid(a)}/uid_map").read().split()
        mb = open(f"/proc/{_sandbox_init_pid(b)}/uid_map").read().split()
        assert ma[1] != mb[1]
    finally:
        a.destroy()
        b.destroy()


def test_a_spare_builder_that_dies_is_replaced_at_once_and_held_nothing(busybox_image):
    with SandboxRuntime() as runtime:   # its own: its spares are not shared with other tests
        spares = runtime.spare_builders()
        assert len(spares) == 2
        free = len(runtime._free_slices)
        victim = runtime.host_pid(spares[0])
        pidfd = os.pidfd_open(victim)
        os.kill(victim, signal.SIGKILL)
        select.select([pidfd], [], [], 10)   # it is gone
        os.close(pidfd)
        deadline = time.monotonic() + 10
        while spares[0] in (now := runtime.spare_builders()) or len(now) < 2:
            assert time.monotonic() < deadline, f"the holder still lists {now}"
        assert len(runtime._free_slices) == free   # a spare holds no id slice ...
        assert all(not [e for e in os.scandir(d) if e.is_dir()]   # ... and no cgroup
                   for d in runtime.cgroups.report.dirs.values())
        with runtime.create(SandboxSpec(image=busybox_image, hostname="after")) as sb:
            assert sb.exec(["hostname"]).stdout == b"after\n"


def test_spares_are_forks_of_the_native_factory_and_a_dead_factory_only_costs_speed(busybox_image):
    with SandboxRuntime() as runtime:   # its own: kills its factory
        spares = [psutil.Process(runtime.host_pid(p)) for p in runtime.spare_builders()]
        factory = spares[0].parent()
        assert {s.parent().pid for s in spares} == {factory.pid} and factory.cmdline()[1] == "factory"
        assert len(os.listdir(f"/proc/{spares[0].pid}/fd")) == 6   # stdio, 2 sockets, the seccomp program
        factory.kill()
        factory.wait(10)
        for _ in range(3):   # each create uses a spare; its replacement is spawned now
            with runtime.create(SandboxSpec(image=busybox_image)) as sb:
                assert sb.exec(["true"]).exit_code == 0
        assert len(runtime.spare_builders()) == 2


def test_a_failed_create_names_the_call_and_errno_and_leaves_nothing(busybox_image):
    with SandboxRuntime() as runtime:   # its own: counts every directory and cgroup of the node
        free = len(runtime._free_slices)
        with pytest.raises(SandboxError, match=r"sethostname x+: Invalid argument \(errno 22\)"):
            runtime.create(SandboxSpec(image=busybox_image, hostname="x" * 100))
        runtime.settle()
        assert runtime._call({"op": "ping"})["sbx_dirs"] == []
        assert len(runtime._free_slices) == free and runtime.active_sandboxes() == 0
        assert all(not [e for e in os.scandir(d) if e.is_dir()] for d in runtime.cgroups.report.dirs.values())
        with runtime.create(SandboxSpec(image=busybox_image)) as sb:   # and the node still works
            assert sb.exec(["true"]).exit_code == 0


def test_a_sandbox_sees_no_host_path_in_its_mountinfo(runtime, busybox_image):
    with runtime.create(SandboxSpec(image=busybox_image)) as sb:
        info = sb.exec(["cat", "/proc/self/mountinfo"]).stdout.decode()
    assert " - overlay " in info and "lowerdir=" in info   # the root is there, options and all
    assert runtime.state_dir not in info and runtime.run_root not in info


def test_image_mounted_once_and_shared(runtime, busybox_image):
    boxes = [runtime.create(SandboxSpec(image=busybox_image)) for _ in range(3)]
    try:
        holder = psutil.Process(runtime.holder_pid)
        fuse = []
        for p in holder.children(recursive=True):   # builders and spares come and go meanwhile
            try:
                fuse += [p] if p.name().startswith("squashfuse") else []
            except psutil.NoSuchProcess:
                pass
        assert len(fuse) == len(runtime.mounted_images())
    finally:
        for b in boxes:
            b.destroy()


def test_fork_bomb_is_contained_by_the_pids_cap(sb):
    r = sh(sb, "i=0; while [ $i -lt 200 ]; do sleep 5 & i=$((i+1)); done; wait", timeout_s=3)
    assert b"can't fork" in r.stderr or b"Resource temporarily unavailable" in r.stderr


def test_memory_cap_stops_a_memory_hog(sb):
    r = sh(sb, "awk 'BEGIN{s=\"x\"; while(1) s=s s}'; echo rc=$?", timeout_s=20)
    # The cgroup's OOM killer stops the hog (usually awk itself: rc=137; now and then the shell
    # around it, which then exits 137), never the sandbox, and within the cap.
    assert b"rc=137" in r.stdout or (r.exit_code == 137 and not r.timed_out), r
    assert re.search(r"oom_kill [1-9]", sb.cgroup_stat()["memory.oom_control"])
    assert sh(sb, "echo alive").stdout == b"alive\n"


def test_proc_sensitive_paths_are_masked_and_sysctl_is_read_only(sb):
    masked = [n for n in ("kcore", "keys", "timer_list", "sysrq-trigger") if os.path.exists(f"/proc/{n}")]
    assert masked
    for name in masked:
        assert sh(sb, f"cat /proc/{name} | wc -c").stdout.strip() == b"0", name
    r = sh(sb, "echo 1 > /proc/sys/kernel/printk; echo rc=$?")
    assert b"rc=0" not in r.stdout


def test_cannot_mount_or_unshare_further_mounts(sb):
    r = sh(sb, "mount -t tmpfs none /tmp; echo rc=$?")
    assert b"rc=0" not in r.stdout


def test_system_files_written_by_the_runtime_are_read_only_to_the_agent(sb):
    sb.write_files({"/work/secret_test.py": b"assert True\n"}, owner="system")
    r = sh(sb, "echo hacked > /work/secret_test.py; echo rc=$?; cat /work/secret_test.py")
    assert b"rc=0" not in r.stdout and b"assert True" in r.stdout


def test_write_files_refuses_paths_that_escape(sb):
    with pytest.raises(SandboxError):
        sb.write_files({"/work/../../etc/passwd": b"x"})
    sh(sb, "ln -s / /work/escape")
    with pytest.raises(SandboxError):
        sb.write_files({"/work/escape/etc/evil": b"x"}, owner="system")


def test_destroy_leaves_nothing(runtime, busybox_image):
    box = runtime.create(SandboxSpec(image=busybox_image))
    sh(box, "sleep 1000 >/dev/null 2>&1 &")
    init = psutil.Process(_sandbox_init_pid(box))
    tree = [init] + init.children(recursive=True)
    before = _mount_count(init.pid)
    box.destroy()
    psutil.wait_procs(tree, timeout=5)
    assert not [p for p in tree if p.is_running() and p.status() != psutil.STATUS_ZOMBIE]
    assert before > 0
    with pytest.raises(SandboxError):
        box.exec(["true"])


def test_sandbox_of_a_missing_image_is_an_infrastructure_error(runtime, tmp_path):
    bogus = tmp_path / "not-an-image.sif"
    bogus.write_bytes(b"garbage" * 100)
    with pytest.raises(SandboxError, match="neither a SIF file nor a squashfs"):
        runtime.create(SandboxSpec(image=bogus))


def test_killing_the_runtime_leaves_no_process_or_mount(busybox_image):
    rt = SandboxRuntime().start()
    box = rt.create(SandboxSpec(image=busybox_image))
    sh(box, "sleep 1000 >/dev/null 2>&1 &")
    holder = psutil.Process(rt.holder_pid)
    tree = [holder] + holder.children(recursive=True)
    assert len(tree) >= 4
    holder.kill()   # what a SIGKILLed agent does to its holder: PDEATHSIG chains from here
    gone, alive = psutil.wait_procs(tree, timeout=5)
    assert not [p for p in alive if p.status() != psutil.STATUS_ZOMBIE]
    rt.close()
    with open("/proc/self/mountinfo") as f:
        assert rt.state_dir not in f.read()


def _sandbox_init_pid(box) -> int:
    """Host PID of the sandbox's init (PID 1 of its PID namespace)."""
    return box.init_pid_host


def _mount_count(pid: int) -> int:
    with open(f"/proc/{pid}/mountinfo") as f:
        return sum(1 for line in f if "paddock" in line)
