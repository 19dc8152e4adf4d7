"""The abuse suite as an ordinary user (issue 16): the attacks of tests/sandbox/test_abuse.py run
in sandboxes of `paddock-u1` (and `paddock-u2` for the cross-user ones) whose caps are held
from user space, with no cgroup delegation (nodeagent.sandbox.usercaps). Each cap is checked
from outside, as root, through /proc before any attack runs (`_verify_caps`: RLIMIT_AS under
the memory monitor, RLIMIT_NPROC of the sandbox's id slice, the CPU slice and SCHED_BATCH at
nice 10, the tmpfs size), and each attack asserts its safe outcome from outside as well: the
memory bomb is killed by the monitor at the cap (137) while the runtime and another sandbox
live on, the fork flood stops at the pids cap, a CPU hog stays on its slice at SCHED_BATCH,
disk fill hits ENOSPC, escapes are refused.

The sandbox bodies run in tests/sandbox/abuseworker.py under `runuser` with the world-readable
interpreter (test_users.py's prerequisites; skipped, saying why, without them). Every worker
started here is stopped by its PID; its state dir is removed.
"""
from __future__ import annotations

import json
import math
import os
import pwd
import shutil
import socket
import subprocess
from pathlib import Path

import pytest

from nodeagent.sandbox.usercaps import SANDBOX_NICE
from tests.conftest import alive
from tests.sandbox.test_users import RUNUSER, USERS, VENV_PY, _env, _rmdir_if_empty, _why_not, run_as

pytestmark = [pytest.mark.sandbox, pytest.mark.skipif(_why_not() is not None, reason=str(_why_not()))]

WORKER = Path(__file__).with_name("abuseworker.py").read_text()
LIMITS = {"memory_mb": 128, "pids": 32, "cpu": 1, "disk_mb": 16, "inodes": 300, "nofile": 128}
USER_CAPS = {"memory": "monitor+rlimit", "pids": "rlimit-per-id-slice", "cpu": "affinity+sched-batch"}
SCHED_BATCH = 3
EPERM, EACCES = os.strerror(1), os.strerror(13)


class AbuseWorker:
    """abuseworker.py running as `user`: one runtime, named sandboxes, JSON requests on stdin."""

    def __init__(self, user: str):
        self.user = user
        self.proc = subprocess.Popen([RUNUSER, "-u", user, "--", VENV_PY, "-c", WORKER], env=_env(user),
                                     cwd="/tmp", stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                     stderr=subprocess.PIPE, text=True)
        self.facts: dict = {}
        self.facts = self.read()

    def read(self) -> dict:
        line = self.proc.stdout.readline()
        if not line:
            raise AssertionError(f"worker of {self.user} died: {self.proc.stderr.read()[-3000:]}")
        return json.loads(line)

    def ask(self, op: str, **req) -> dict:
        self.proc.stdin.write(json.dumps(dict(req, op=op)) + "\n")
        self.proc.stdin.flush()
        out = self.read()
        assert "error" not in out, (op, req, out)
        return out

    def sh(self, name: str, script: str, timeout_s: float = 10) -> dict:
        return self.ask("exec", name=name, argv=["sh", "-c", script], timeout_s=timeout_s)

    def stop(self) -> None:
        if self.proc.poll() is None:
            try:
                self.proc.stdin.write(json.dumps({"op": "quit"}) + "\n")
                self.proc.stdin.flush()
                self.proc.wait(timeout=30)
            except (OSError, subprocess.TimeoutExpired, ValueError):
                self.proc.kill()   # by its PID: the holder follows (PDEATHSIG)
                self.proc.wait()
        for f in (self.proc.stdin, self.proc.stdout, self.proc.stderr):
            f.close()
        if self.facts.get("state_dir") and os.path.exists(self.facts["state_dir"]):
            shutil.rmtree(self.facts["state_dir"], ignore_errors=True)
        _rmdir_if_empty(self.facts.get("run_root"))


@pytest.fixture(scope="module")
def worker():
    w = AbuseWorker(USERS[0])
    yield w
    w.stop()


def _proc_limits(pid: int) -> dict:
    with open(f"/proc/{pid}/limits") as f:
        rows = f.read().splitlines()[1:]
    return {r[:26].strip(): r[26:47].strip() for r in rows}


def _stat(pid: int) -> str:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read()[:120]
    except OSError as exc:
        return f"{pid}: {exc}"


def _verify_caps(w: AbuseWorker, name: str, limits: dict) -> list[int]:
    """Each cap of sandbox `name` read back from outside (root, /proc) and from the runtime; the
    CPUs of its slice."""
    assert w.facts["caps"] == USER_CAPS and w.facts["degraded"] == [], w.facts
    init = w.ask("tree", name=name)["pids"][0]
    lim = _proc_limits(init)
    assert lim["Max address space"] == str(limits["memory_mb"] << 20), lim
    assert lim["Max processes"] == str(limits["pids"]), lim
    assert lim["Max file size"] == str(limits["disk_mb"] << 20), lim
    watch = w.ask("watch", name=name)
    assert watch["watched"] and watch["limit_bytes"] == limits["memory_mb"] << 20, watch
    cpus = sorted(os.sched_getaffinity(init))
    assert set(cpus) <= set(w.facts["allowed_cpus"])
    assert len(cpus) == min(len(w.facts["allowed_cpus"]), math.ceil(limits["cpu"])), cpus
    assert os.sched_getscheduler(init) == SCHED_BATCH
    assert os.getpriority(os.PRIO_PROCESS, init) == SANDBOX_NICE
    with open(f"/proc/{init}/status") as f:
        uid = int(next(ln for ln in f if ln.startswith("Uid:")).split()[1])
    assert uid not in (0, w.facts["uid"])   # its own subordinate id slice (RLIMIT_NPROC counts per uid)
    df = w.sh(name, "df -k / | tail -1")["stdout"].split()
    assert int(df[1]) <= limits["disk_mb"] * 1024, df
    return cpus


@pytest.fixture
def make_box(worker, busybox_image, python_image):
    """Sandboxes of `worker`, caps verified before they are handed out; destroyed at the end,
    and none of their processes left."""
    made: list[tuple[str, list[int]]] = []

    def make(name: str, python: bool = False, **over) -> list[int]:
        limits = dict(LIMITS, **over)
        worker.ask("create", name=name, image=str(python_image if python else busybox_image), limits=limits)
        made.append((name, [worker.ask("tree", name=name)["pids"][0]]))
        return _verify_caps(worker, name, limits)
    yield make
    for name, pids in made:
        pids += worker.ask("tree", name=name)["pids"]
        worker.ask("destroy", name=name)
        left = [p for p in pids if alive(p)]
        assert not left, f"processes of {name} outlived it: {[_stat(p) for p in left]}"


# -- resources -------------------------------------------------------------------------------
def test_memory_bomb_is_killed_by_the_monitor_at_the_cap_and_nothing_else_dies(worker, make_box):
    make_box("other")
    sleeper = int(worker.sh("other", "sleep 1000 >/dev/null 2>&1 & echo $!")["stdout"])
    other_pids = worker.ask("tree", name="other")["pids"]
    make_box("mem")
    r = worker.sh("mem", "for i in 1 2 3 4; do (x=$(head -c 40000000 /dev/zero | tr '\\0' a); sleep 60) & "
                         "done; wait; echo survived", timeout_s=30)
    assert r["exit"] == 137 and not r["timed_out"] and "survived" not in r["stdout"], r
    watch = worker.ask("watch", name="mem")
    cap = LIMITS["memory_mb"] << 20
    assert watch["kills"] >= 1 and cap < watch["peak_bytes"] < 2 * cap, watch   # killed at the cap
    assert not set(watch["killed_pids"]) & set(other_pids)
    assert worker.sh("mem", "echo ok")["stdout"] == "ok\n"
    assert worker.sh("other", f"kill -0 {sleeper} && echo ok")["stdout"] == "ok\n"
    assert all(alive(p) for p in other_pids)
    assert worker.proc.poll() is None and alive(worker.facts["holder"])   # the runtime lives on


def test_fork_flood_stops_at_the_pids_cap(worker, make_box):
    make_box("fork")
    r = worker.sh("fork", "i=0; while [ $i -lt 100 ]; do sleep 1000 >/dev/null 2>&1 & i=$((i+1)); done; echo done")
    assert "can't fork" in r["stderr"], r
    held = worker.ask("tree", name="fork")["pids"]
    assert LIMITS["pids"] - 3 <= len(held) <= LIMITS["pids"], len(held)   # up to the cap, not past it
    worker.sh("fork", "kill -9 -1; echo ok")   # the held sleepers go: the bomb below starts with the slice empty
    r = worker.sh("fork", "bomb() { bomb | bomb & }; bomb; wait", timeout_s=2)
    assert "can't fork" in r["stderr"]
    assert worker.sh("fork", "echo ok")["stdout"] == "ok\n"
    assert worker.proc.poll() is None


def test_cpu_hogs_stay_on_their_slice_at_sched_batch(worker, make_box):
    first, second = make_box("hog"), make_box("hog2")
    if len(worker.facts["allowed_cpus"]) >= 2:
        assert not set(first) & set(second)   # round-robin slices: one hog box cannot take the other's CPU
    worker.sh("hog", "for i in 1 2 3; do (while :; do :; done) >/dev/null 2>&1 & done; echo started")
    hogs = worker.ask("tree", name="hog")["pids"][1:]
    assert len(hogs) >= 3
    for pid in hogs:
        assert sorted(os.sched_getaffinity(pid)) == first, pid
        assert os.sched_getscheduler(pid) == SCHED_BATCH and os.getpriority(os.PRIO_PROCESS, pid) == SANDBOX_NICE
    r = worker.sh("hog2", "while :; do :; done", timeout_s=1.0)
    assert r["timed_out"] and r["exit"] == 124


def test_a_workload_cannot_leave_its_cpu_slice_or_sched_batch(worker, make_box):
    cpus = make_box("py", python=True, inodes=4096)
    code = ("import os\nfor f in (lambda: os.sched_setaffinity(0, range(os.cpu_count())),\n"
            "          lambda: os.sched_setscheduler(0, os.SCHED_OTHER, os.sched_param(0)),\n"
            "          lambda: os.setpriority(os.PRIO_PROCESS, 0, 0)):\n"
            "    try:\n        f(); print('ok')\n    except OSError as e:\n        print(e.errno)\n"
            "print(','.join(map(str, sorted(os.sched_getaffinity(0)))), os.sched_getscheduler(0), os.getpriority(0, 0))")
    r = worker.ask("exec", name="py", argv=["python3", "-c", code])
    lines = r["stdout"].splitlines()
    assert "ok" not in lines[:3], r
    assert lines[3].split() == [",".join(map(str, cpus)), str(SCHED_BATCH), str(SANDBOX_NICE)], r


def test_disk_fill_by_bytes_and_by_inodes_stops_at_the_tmpfs_caps(worker, make_box):
    make_box("disk")
    r = worker.sh("disk", "for i in 1 2 3; do dd if=/dev/zero of=/work/fill$i bs=1M count=10 || exit 3; done")
    assert r["exit"] == 3 and "No space left on device" in r["stderr"], r
    r = worker.sh("disk", "rm -f /work/fill*; i=0; while [ $i -lt 2000 ]; do touch /work/f$i || exit 3; i=$((i+1)); done")
    assert r["exit"] == 3 and "No space left on device" in r["stderr"], r


# -- escapes ---------------------------------------------------------------------------------
SYSCALLS = [("mount", 165, (0, 0, 0, 0, 0)), ("unshare", 272, (0x10000000,)), ("setns", 308, (0, 0)),
            ("ptrace", 101, (16, 1)), ("process_vm_readv", 310, (1, 0, 0, 0, 0, 0)), ("bpf", 321, (0, 0, 0)),
            ("pivot_root", 155, (0, 0)), ("fsopen", 430, (0, 0)), ("keyctl", 250, (0, 0)),
            ("sched_setaffinity", 203, (0, 0, 0)), ("sched_setattr", 314, (0, 0, 0))]


def test_namespace_mount_and_trace_syscalls_fail_with_eperm(worker, make_box):
    if os.uname().machine != "x86_64":
        pytest.skip("syscall numbers in this test are x86_64's")
    make_box("sys", python=True, inodes=4096)
    code = ("import ctypes, sys\nlibc = ctypes.CDLL(None, use_errno=True)\n"
            f"for name, nr, args in {SYSCALLS!r}:\n"
            "    rc = libc.syscall(nr, *args)\n"
            "    print(name, ctypes.get_errno() if rc == -1 else 'ok')\n")
    r = worker.ask("exec", name="sys", argv=["python3", "-c", code])
    assert dict(ln.split() for ln in r["stdout"].splitlines()) == {n: "1" for n, _, _ in SYSCALLS}, r
    r = worker.sh("sys", "mount -t tmpfs none /tmp; echo rc=$?; unshare -U true; echo rc=$?")
    assert "rc=0" not in r["stdout"], r


def test_host_pid_1_and_other_processes_are_out_of_reach(worker, make_box):
    make_box("proc")
    with open("/proc/1/cmdline", "rb") as f:
        host_init = f.read().split(b"\0")[0].decode()
    r = worker.sh("proc", "tr '\\0' ' ' </proc/1/cmdline; echo; ls /proc | grep -c '^[0-9]'; "
                          "ls /proc/1/root/ >/dev/null && echo listed")
    cmdline, nprocs = r["stdout"].splitlines()[:2]
    assert cmdline.split()[0] != host_init and cmdline.startswith("paddock-sbx"), r   # its own PID 1
    assert int(nprocs) <= 4, r
    me, holder = worker.facts["pid"], worker.facts["holder"]
    r = worker.sh("proc", f"kill -9 {me}; echo rc=$?; kill -9 {holder}; echo rc=$?; kill -9 -1; echo done")
    assert "rc=0" not in r["stdout"], r
    assert worker.proc.poll() is None and alive(holder)
    # the user itself, outside any sandbox, gets nothing of the host's PID 1
    res = worker.ask("access", paths=["/proc/1/root", "/proc/1/environ", "/proc/1/fd"])
    assert res["/proc/1/root"]["list"] == EACCES and res["/proc/1/environ"]["open"] == EACCES, res
    assert res["/proc/1/fd"]["list"] == EACCES, res


def test_the_network_is_the_sandboxs_own_loopback_only(worker, make_box):
    make_box("net", python=True, inodes=4096)
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen(1)
    server.settimeout(0.2)
    try:
        port = server.getsockname()[1]
        code = ("import socket\nfor target in (('127.0.0.1', %d), ('1.1.1.1', 53)):\n"
                "    try:\n        socket.create_connection(target, timeout=2); print('connected')\n"
                "    except OSError as e:\n        print('refused', e.errno)\n"
                "try:\n    socket.getaddrinfo('example.com', 80); print('resolved')\n"
                "except OSError:\n    print('unresolved')\n"
                "print(sorted(l.split(':')[0].strip() for l in open('/proc/net/dev').readlines()[2:]))\n" % port)
        r = worker.ask("exec", name="net", argv=["python3", "-c", code], timeout_s=20)
        lines = r["stdout"].splitlines()
        assert lines[0].startswith("refused") and lines[1].startswith("refused") and lines[2] == "unresolved", r
        assert lines[3] == "['lo']", r
        with pytest.raises(socket.timeout):
            server.accept()
    finally:
        server.close()


def test_another_users_state_dir_and_sandboxes_are_out_of_reach(worker, make_box, busybox_image):
    make_box("mine")
    other = AbuseWorker(USERS[1])
    try:
        other.ask("create", name="theirs", image=str(busybox_image), limits=LIMITS)
        their_init = other.ask("tree", name="theirs")["pids"][0]
        paths = [other.facts["state_dir"], other.facts["run_root"]]
        res = worker.ask("access", paths=paths + [f"/proc/{their_init}/root", f"/proc/{other.facts['holder']}/environ"])
        for p in paths:
            assert res[p]["list"] == EACCES, res
        assert res[f"/proc/{their_init}/root"]["list"] != "ok", res
        assert res[f"/proc/{other.facts['holder']}/environ"]["open"] != "ok", res
        r = worker.sh("mine", f"ls {paths[0]}; echo rc=$?; kill -0 {their_init}; echo rc=$?")
        assert "rc=0" not in r["stdout"], r
        assert other.sh("theirs", "echo ok")["stdout"] == "ok\n"
        other.ask("destroy", name="theirs")
    finally:
        other.stop()
    assert not os.path.exists(other.facts["state_dir"])


def test_sandbox_run_as_the_user_names_each_caps_mechanism(busybox_image):
    r = run_as(USERS[0], [VENV_PY, "-m", "controller.cli", "sandbox", "run", "--show-caps", "--image",
                          str(busybox_image), "--", "true"])
    assert r.returncode == 0, r.stderr
    want = " ".join(f"{cap}={how}" for cap, how in USER_CAPS.items())
    assert r.stderr.splitlines()[0] == f"paddock sandbox run: caps: {want}", r.stderr
    _rmdir_if_empty(f"/tmp/paddock-{pwd.getpwnam(USERS[0]).pw_uid}")
