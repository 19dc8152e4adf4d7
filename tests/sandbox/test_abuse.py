"""Abuse and escape attempts, each asserting the safe outcome. Every attack runs only after the
sandbox's caps (cgroup memory, pids, cpu; tmpfs size and inodes) are read back and verified."""
from __future__ import annotations

import hashlib
import os
import socket

import psutil
import pytest

from nodeagent.sandbox.runtime import Change, SandboxError, SandboxSpec

pytestmark = pytest.mark.sandbox

LIMITS = {"memory_mb": 128, "pids": 32, "cpu": 0.5, "disk_mb": 16, "inodes": 300, "nofile": 128}
EPERM = 1


def _verify_caps(sb) -> None:
    paths = sb.cgroup_paths
    read = lambda ctrl, f: open(os.path.join(paths[ctrl], f)).read().strip()  # noqa: E731
    assert read("memory", "memory.limit_in_bytes") == str(LIMITS["memory_mb"] << 20)
    assert read("pids", "pids.max") == str(LIMITS["pids"])
    assert read("cpu", "cpu.cfs_quota_us") == str(int(LIMITS["cpu"] * 100000))
    df = sb.exec(["sh", "-c", "df -k / | tail -1"]).stdout.split()
    assert int(df[1]) <= LIMITS["disk_mb"] * 1024


@pytest.fixture
def box(runtime, busybox_image):
    sb = runtime.create(SandboxSpec(image=busybox_image, limits=LIMITS))
    _verify_caps(sb)
    yield sb
    sb.destroy()


@pytest.fixture
def pybox(runtime, python_image):
    sb = runtime.create(SandboxSpec(image=python_image, limits=dict(LIMITS, inodes=4096)))
    _verify_caps(sb)
    yield sb
    sb.destroy()


def sh(sb, script, **kw):
    return sb.exec(["sh", "-c", script], **kw)


def syscall_errno(pybox, nr: int, *args: int) -> int:
    code = ("import ctypes, sys; libc = ctypes.CDLL(None, use_errno=True); "
            f"rc = libc.syscall({nr}, {', '.join(map(str, args)) or '0'}); "
            "print(ctypes.get_errno() if rc == -1 else 'ok')")
    out = pybox.exec(["python3", "-c", code], timeout_s=10).stdout.strip()
    return -1 if out == b"ok" else int(out)


# -- resources -------------------------------------------------------------------------------
def test_fork_bomb_hits_the_pids_cap_and_leaves_the_sandbox_usable(box):
    r = sh(box, "bomb() { bomb | bomb & }; bomb; wait", timeout_s=2)
    assert "max" in box.cgroup_stat()["pids.events"] and box.cgroup_stat()["pids.events"] != "max 0"
    assert b"can't fork" in r.stderr
    assert int(box.cgroup_stat()["pids.current"]) <= LIMITS["pids"]
    assert sh(box, "echo ok").stdout == b"ok\n"   # the init reclaims the pids the bomb holds
    assert int(box.cgroup_stat()["pids.current"]) <= 2


def test_memory_hog_is_oom_killed_inside_its_cgroup(pybox):
    r = pybox.exec(["python3", "-c", "x = []\nwhile True: x.append(bytearray(16 << 20))"], timeout_s=20)
    assert r.exit_code == 137
    assert "oom_kill 1" in pybox.cgroup_stat()["memory.oom_control"]
    assert pybox.exec(["true"]).exit_code == 0


def test_disk_fill_by_bytes_stops_at_the_tmpfs_size(box):
    r = sh(box, "for i in 1 2 3; do dd if=/dev/zero of=/work/fill$i bs=1M count=10 || exit 3; done")
    assert r.exit_code == 3 and b"No space left on device" in r.stderr


def test_disk_fill_by_inodes_stops_at_nr_inodes(box):
    r = sh(box, "i=0; while [ $i -lt 2000 ]; do touch /work/f$i || exit 3; i=$((i+1)); done")
    assert r.exit_code == 3 and b"No space left on device" in r.stderr


def test_cpu_burn_is_killed_at_the_wall_limit_and_throttled_by_the_quota(runtime, busybox_image):
    with runtime.create(SandboxSpec(image=busybox_image, limits=dict(LIMITS, cpu=0.05))) as sb:
        assert open(os.path.join(sb.cgroup_paths["cpu"], "cpu.cfs_quota_us")).read().strip() == "5000"
        r = sh(sb, "while :; do :; done", timeout_s=1.0)
        assert r.timed_out and r.exit_code == 124
        stat = dict(ln.split() for ln in sb.cgroup_stat()["cpu.stat"].splitlines())
        assert int(stat["nr_throttled"]) > 0
        assert int(stat.get("throttled_time", 1)) > 0
        assert sh(sb, "ps -o pid,comm | grep -c '[s]h -c while' || true").stdout.strip() == b"0"


# -- filesystem --------------------------------------------------------------------------------
def test_writes_to_the_image_fail_and_the_image_file_is_unchanged(box, busybox_image):
    before = hashlib.sha256(busybox_image.read_bytes()).hexdigest()
    r = sh(box, "echo x > /bin/busybox; echo rc=$?; rm -f /bin/sh; echo rc=$?; touch /etc/evil; echo rc=$?")
    assert b"rc=0" not in r.stdout
    assert hashlib.sha256(busybox_image.read_bytes()).hexdigest() == before


def test_another_sandboxs_files_are_unreachable(runtime, busybox_image, box):
    with runtime.create(SandboxSpec(image=busybox_image, files={"secret.txt": b"TOPSECRET"})) as other:
        assert other.exec(["cat", "/work/secret.txt"]).stdout == b"TOPSECRET"
        assert sh(other, "echo TOPSECRET > /dev/shm/s; echo x > /dev/evil; cat /dev/shm/s").stdout == b"TOPSECRET\n"
        r = sh(box, "grep -rs TOPSECRET / --exclude-dir=proc --exclude-dir=sys; "
                    "cat /proc/*/root/work/secret.txt /dev/shm/* 2>/dev/null; ls /dev")
        assert b"TOPSECRET" not in r.stdout and b"evil" not in r.stdout


def test_setuid_binaries_do_not_raise_privileges(box):
    r = sh(box, "cp /bin/busybox /work/id && chmod 4755 /work/id && stat -c %a /work/id")
    assert r.stdout.strip() in (b"4755", b"755")
    r = box.exec(["/work/id", "-u"], uid=1000)
    assert r.stdout == b"1000\n", r.stderr   # nosuid mount + no_new_privs: the bit is inert


def test_device_nodes_cannot_be_created(box):
    r = sh(box, "mknod /tmp/mem c 1 1; echo rc=$?; mknod /work/sda b 8 0; echo rc=$?")
    assert r.stdout == b"rc=1\nrc=1\n"


def test_proc_sys_writes_fail_and_host_values_are_unchanged(box):
    host = {p: open(p).read() for p in ("/proc/sys/net/ipv4/ip_forward", "/proc/sys/kernel/hostname",
                                        "/proc/sys/vm/swappiness")}
    r = sh(box, "echo 1 > /proc/sys/net/ipv4/ip_forward; echo rc=$?; echo evil > /proc/sys/kernel/hostname; "
                "echo rc=$?; echo 100 > /proc/sys/vm/swappiness; echo rc=$?; sysctl -w kernel.domainname=x; "
                "echo rc=$?; hostname evil; echo rc=$?")
    assert b"rc=0" not in r.stdout
    assert {p: open(p).read() for p in host} == host


# -- network -----------------------------------------------------------------------------------
def test_tcp_to_the_host_loopback_is_refused(box):
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen(1)
    server.settimeout(0.2)
    try:
        r = sh(box, f"nc -w 1 127.0.0.1 {server.getsockname()[1]} </dev/null; echo rc=$?")
        assert b"rc=0" not in r.stdout
        with pytest.raises(socket.timeout):
            server.accept()
    finally:
        server.close()


def test_dns_resolution_fails_without_leaving_the_sandbox(pybox):
    r = pybox.exec(["python3", "-c", "import socket\ntry:\n socket.getaddrinfo('example.com', 80)\n"
                                     " print('resolved')\nexcept OSError as e:\n print('failed', e)"],
                   timeout_s=15)
    assert r.stdout.startswith(b"failed")


# -- seccomp: each denied call returns EPERM --------------------------------------------------
@pytest.mark.parametrize("name,nr,args", [
    ("mount", 165, (0, 0, 0, 0, 0)), ("unshare", 272, (0x10000000,)), ("setns", 308, (0, 0)),
    ("ptrace", 101, (0,)), ("keyctl", 250, (0, 0)), ("add_key", 248, (0, 0, 0, 0, 0)),
    ("bpf", 321, (0, 0, 0)), ("io_uring_setup", 425, (1, 0)), ("perf_event_open", 298, (0, 0, -1, -1, 0)),
    ("userfaultfd", 323, (0,)), ("open_by_handle_at", 304, (0, 0, 0)), ("kexec_load", 246, (0, 0, 0, 0)),
    ("init_module", 175, (0, 0, 0)), ("pivot_root", 155, (0, 0)), ("fsopen", 430, (0, 0)),
    ("personality", 135, (0x0040000,)),
])
def test_dangerous_syscalls_fail_with_eperm(pybox, name, nr, args):
    if os.uname().machine != "x86_64":
        pytest.skip("syscall numbers in this test are x86_64's")
    assert syscall_errno(pybox, nr, *args) == EPERM, name


def test_mount_and_unshare_commands_are_refused(box):
    r = sh(box, "mount -t tmpfs none /tmp; echo rc=$?; unshare -U true; echo rc=$?")
    assert b"rc=0" not in r.stdout


def test_packet_sockets_are_refused(pybox):
    r = pybox.exec(["python3", "-c", "import socket\ntry:\n socket.socket(17, 3)\n print('ok')\n"
                                     "except OSError as e:\n print(e.errno)"])
    assert r.stdout.strip() == b"1"


# -- processes ---------------------------------------------------------------------------------
def test_signals_cannot_reach_host_processes_or_the_agent(box, runtime):
    me, holder = os.getpid(), runtime.holder_pid
    sh(box, f"kill -9 {me}; echo rc=$?; kill -9 {holder}; echo rc=$?; kill -9 -1; echo done")
    assert psutil.pid_exists(me) and psutil.Process(holder).status() != psutil.STATUS_ZOMBIE
    assert sh(box, "echo alive").stdout == b"alive\n"


def test_a_process_that_daemonizes_does_not_outlive_its_sandbox(runtime, busybox_image):
    sb = runtime.create(SandboxSpec(image=busybox_image, limits=LIMITS))
    _verify_caps(sb)
    sh(sb, "setsid sh -c 'trap \"\" HUP TERM; sleep 1000' </dev/null >/dev/null 2>&1 & "
           "until ps -o comm | grep -qx sleep; do :; done")
    init = psutil.Process(sb.init_pid_host)
    tree = [init] + init.children(recursive=True)
    assert any(p.name() == "sleep" for p in tree)
    cgroups = list(sb.cgroup_paths.values())
    sb.destroy()
    runtime.settle()
    assert not [p for p in tree if p.is_running() and p.status() != psutil.STATUS_ZOMBIE]
    assert not [d for d in cgroups if os.path.exists(d)]


def test_a_sandbox_init_holds_no_fd_of_another_sandbox(runtime, busybox_image, box):
    with runtime.create(SandboxSpec(image=busybox_image, limits=LIMITS)) as other:
        _verify_caps(other)
        for sb in (box, other):
            pid = sb.init_pid_host
            links = [os.readlink(f"/proc/{pid}/fd/{fd}") for fd in os.listdir(f"/proc/{pid}/fd")]
            assert all(ln.startswith(("socket:", "pipe:", "/dev/null")) for ln in links), links


def test_symlinks_planted_by_the_workload_do_not_reach_host_files(box):
    sh(box, "ln -s /etc/hostname /work/link; mkdir -p /work/d; ln -s /etc /work/d/up")
    with pytest.raises(SandboxError):
        box.read_file("/work/link")
    with pytest.raises(SandboxError):
        box.read_file("/work/d/up/hostname")
    with pytest.raises(SandboxError):
        box.write_files({"/work/d/up/evil": b"x"})
    box.apply([Change("/work/link", "dir", None, 0o700)])   # replaces the link, never chmods its target
    assert sh(box, "stat -c %F /work/link").stdout == b"directory\n"


def test_host_wide_proc_entries_are_masked_hidden_or_read_only(box):
    r = sh(box, "cat /proc/kallsyms /proc/keys /proc/timer_list 2>&1 | wc -c; ls /proc/acpi | wc -l; "
                "echo 1 > /proc/irq/default_smp_affinity; echo rc=$?; touch /proc/fs/x; echo rc=$?")
    out = r.stdout.split()
    assert out[:2] == [b"0", b"0"] and b"rc=0" not in r.stdout


def test_hostname_is_the_specs_and_cannot_be_changed(runtime, busybox_image):
    for name in ("verifier", "sandbox"):   # a spare prepared for one hostname serves the other
        with runtime.create(SandboxSpec(image=busybox_image, hostname=name, limits=LIMITS)) as sb:
            r = sh(sb, "hostname; hostname evil; echo rc=$?; hostname")
            assert r.stdout.split() == [name.encode(), b"rc=1", name.encode()]


# -- the init's memory ---------------------------------------------------------------------------
MEM_PROBE = ("import os, sys\n"
             "for pid in sys.argv[1:]:\n"
             "    for mode in (os.O_RDONLY, os.O_RDWR):\n"
             "        try:\n"
             "            os.close(os.open(f'/proc/{pid}/mem', mode)); print(pid, mode, 'open')\n"
             "        except OSError as e:\n"
             "            print(pid, mode, e.errno)\n")


def test_no_command_reaches_the_init_s_memory_even_after_earlier_commands(pybox):
    """The init (pid 1) is never readable or writable through /proc/1/mem by what it runs: not by
    the first command, and not after many (a vfork child once set the init's own mm dumpable)."""
    for _ in range(3):
        out = pybox.exec(["python3", "-c", MEM_PROBE, "1"], timeout_s=10).stdout.decode()
        assert "open" not in out, out
        assert out.split() == ["1", "0", "13", "1", "2", "13"], out   # EACCES both ways
    grep = pybox.exec(["sh", "-c", "grep CapBnd /proc/self/status"]).stdout.decode()
    assert not int(grep.split()[1], 16) & (1 << 19), grep   # CAP_SYS_PTRACE left the bounding set
