"""The sandbox interface's contract (nodeagent/sandbox/interface.py), run against every backend so
they cannot drift: native always; Apptainer where `apptainer` is on PATH (skipped otherwise, with
the reason). Backend-specific behaviour (mounts, id slices, cgroups, the holder; command lines)
stays in tests/sandbox/test_sandbox.py, tests/sandbox/test_*.py and tests/sandbox/test_apptainer.py."""
from __future__ import annotations

import os

import psutil
import pytest

from nodeagent.sandbox.apptainer import ApptainerConfig, ApptainerRuntime, apptainer_available
from nodeagent.sandbox.interface import CAPS_REPORT_KEYS, SandboxBackend, SandboxHandle
from nodeagent.sandbox.spec import SandboxError, SandboxSpec

pytestmark = pytest.mark.sandbox

BACKENDS = [
    pytest.param("native", id="native"),
    pytest.param("apptainer", id="apptainer", marks=pytest.mark.skipif(
        apptainer_available() is not None, reason=f"the Apptainer backend: {apptainer_available()}")),
]
LIMITS = {"memory_mb": 128, "pids": 32, "disk_mb": 16, "nofile": 128}
# The diff round trip: in the lower layer's /data, a file edited, one deleted, a directory
# replaced, a new directory with modes, a symlink made and one deleted.
EDIT = ("echo changed > /data/keep.txt && rm /data/gone.txt && rm -r /data/sub && mkdir /data/sub && "
        "echo fresh > /data/sub/new.txt && mkdir -m 0750 /data/newdir && echo x > /data/newdir/f && "
        "chmod 0755 /data/newdir/f && ln -sf sub/new.txt /data/link2 && rm /data/link")
STATE = ("cat /data/keep.txt; ls /data; ls /data/sub; stat -c '%a' /data/newdir /data/newdir/f; "
         "readlink /data/link2; cat /data/gone.txt 2>&1 | head -c 0")


@pytest.fixture(scope="module", params=BACKENDS)
def backend(request, tmp_path_factory):
    if request.param == "native":
        yield request.getfixturevalue("runtime")   # the session's node runtime (tests/conftest.py)
        return
    with ApptainerRuntime(ApptainerConfig(workdir=str(tmp_path_factory.mktemp("apptainer")))) as rt:
        yield rt


def spec(image, **kw) -> SandboxSpec:
    return SandboxSpec(**{"image": image, "limits": dict(LIMITS), **kw})


@pytest.fixture
def sb(backend, busybox_image):
    box = backend.create(spec(busybox_image, files={"hello.txt": b"hi\n"}))
    yield box
    box.destroy()


def sh(box, script, **kw):
    return box.exec(["sh", "-c", script], **kw)


def test_the_backend_and_its_sandboxes_implement_the_named_interface(backend, sb):
    assert isinstance(backend, SandboxBackend) and isinstance(sb, SandboxHandle)


def test_command_runs_in_work_with_visible_files(sb):
    r = sh(sb, "pwd; cat hello.txt")
    assert r.exit_code == 0
    assert r.stdout == b"/work\nhi\n"


def test_exit_code_and_stderr_are_returned(sb):
    r = sh(sb, "echo oops >&2; exit 7")
    assert (r.exit_code, r.stderr) == (7, b"oops\n")


def test_timeout_kills_everything_and_reports_124(sb):
    r = sh(sb, "sleep 100 & sleep 100", timeout_s=0.5)
    assert r.exit_code == 124 and r.timed_out
    assert sh(sb, "ps | grep -c '[s]leep 100' || true").stdout.strip() == b"0"


def test_output_is_capped(sb):
    r = sh(sb, "yes | head -c 1000000", output_cap=1000)
    assert r.truncated and len(r.stdout) == 1000


def test_stderr_is_capped_like_stdout(sb):
    r = sh(sb, "yes | head -c 1000000 >&2", output_cap=1000)
    assert r.truncated and len(r.stderr) == 1000 and r.stdout == b""


def test_written_files_read_back_byte_for_byte(sb):
    data = bytes(range(256)) * 4
    sb.write_files({"/work/deep/dir/blob.bin": data, "/work/text.txt": "text\n"})
    assert sb.read_file("/work/deep/dir/blob.bin") == data
    assert sb.read_file("/work/text.txt") == b"text\n"
    assert sh(sb, "wc -c < /work/deep/dir/blob.bin").stdout.strip() == b"1024"


def test_diff_reports_changes_under_work(sb):
    sh(sb, "echo new > /work/a.py; echo changed > /work/hello.txt; mkdir -p /work/d; echo z > /work/d/z")
    changes = {c.path: c for c in sb.diff("/work")}
    assert changes["/work/a.py"].data == b"new\n"
    assert changes["/work/hello.txt"].data == b"changed\n"
    assert changes["/work/d/z"].kind == "added"


def test_diff_round_trips_through_apply_with_deletes_and_symlinks(backend, rw_sif):
    with backend.create(spec(rw_sif)) as a:
        r = a.exec(["sh", "-c", EDIT])
        assert r.exit_code == 0, r.stderr
        expected = a.exec(["sh", "-c", STATE]).stdout
        changes = a.diff("/data")
        archive = a.diff_archive("/data")
    assert {("/data/gone.txt", "deleted"), ("/data/link", "deleted"), ("/data/link2", "symlink"),
            ("/data/keep.txt", "modified"), ("/data/sub/new.txt", "added")} <= {(c.path, c.kind) for c in changes}
    for payload in (changes, archive):
        with backend.create(spec(rw_sif)) as b:
            b.apply(payload)
            assert b.exec(["sh", "-c", STATE]).stdout == expected
            assert b.exec(["sh", "-c", "ls /data/sub"]).stdout == b"new.txt\n"   # inner.txt stays gone


def test_destroy_leaves_no_process_and_the_sandbox_refuses_every_later_call(backend, busybox_image):
    token = str(900000 + int.from_bytes(os.urandom(3), "big") % 99999)   # names this test's sleeper
    box = backend.create(spec(busybox_image))
    sh(box, f"sleep {token} >/dev/null 2>&1 &")
    tree = _processes_naming(token)
    assert tree   # forked before the shell returned: there, as a shell or already as sleep
    box.destroy()
    _, alive = psutil.wait_procs(tree, timeout=10)
    assert not [p for p in alive if p.status() != psutil.STATUS_ZOMBIE]
    for call in (lambda: box.exec(["true"]), lambda: box.read_file("/work/x"),
                 lambda: box.write_files({"/work/x": b"x"}), lambda: box.diff("/work"), lambda: box.apply([])):
        with pytest.raises(SandboxError):
            call()
    box.destroy()   # idempotent


def test_the_caps_report_says_how_each_cap_is_enforced(backend):
    report = backend.caps_report()
    assert set(CAPS_REPORT_KEYS) <= set(report)
    assert isinstance(report["mode"], str) and report["caps"]
    assert all(isinstance(cap, str) and (how is None or isinstance(how, str)) for cap, how in report["caps"].items())
    assert set(report["degraded"]) <= set(report["caps"])
    assert report["degraded"] == [cap for cap, how in report["caps"].items() if not how]


def test_a_pool_hands_out_ready_sandboxes_once_each_with_the_spec_files(backend, busybox_image):
    ready = spec(busybox_image, hostname="pooled")
    pool = backend.pool(ready, target=2)
    taken = []
    try:
        assert pool.wait_ready(2, timeout_s=60)
        taken = [backend.acquire(ready), backend.acquire(ready)]
        assert taken[0] is not taken[1] and all(isinstance(t, SandboxHandle) for t in taken)
        assert taken[0].exec(["hostname"]).stdout == b"pooled\n"
        with_files = backend.acquire(spec(busybox_image, hostname="pooled", files={"t.txt": b"task"}))
        taken.append(with_files)
        assert with_files.read_file("/work/t.txt") == b"task"
    finally:
        for box in taken:
            box.destroy()
        pool.stop()
        backend._pools.clear()
    backend.settle()


def test_the_same_sif_runs_with_the_same_interface(backend, busybox_image):
    rt = backend
    sb = rt.create(spec(busybox_image, files={"hello.txt": b"hi\n"}))
    try:
        r = sb.exec(["cat", "/work/hello.txt"])
        assert (r.exit_code, r.stdout) == (0, b"hi\n")
        assert sb.exec(["hostname"]).stdout.strip() == b"sandbox"
        net = sb.exec(["cat", "/proc/net/dev"]).stdout.decode()
        assert [ln.split(":")[0].strip() for ln in net.splitlines()[2:]] == ["lo"]
        sb.write_files({"/work/new.txt": b"new"})
        assert sb.read_file("/work/new.txt") == b"new"
        kinds = {(c.path, c.kind) for c in sb.diff("/work")}
        assert {("/work/hello.txt", "added"), ("/work/new.txt", "added")} <= kinds
        assert sb.exec(["sleep", "10"], timeout_s=0.5).timed_out
        fresh = rt.create(spec(busybox_image))
        try:
            fresh.apply(sb.diff_archive("/work"))
            assert fresh.read_file("/work/new.txt") == b"new"
        finally:
            fresh.destroy()
    finally:
        sb.destroy()


def _processes_naming(token: str) -> list[psutil.Process]:
    """Every process on the host whose command line contains `token`."""
    found = []
    for p in psutil.process_iter():
        try:
            if token in " ".join(p.cmdline()):
                found.append(p)
        except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):
            pass
    return found
