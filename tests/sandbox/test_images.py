"""Image mounts: one per digest per node, counted by sandboxes, unmounted after a grace period
(injected clock); the kernel path chosen at start; the fuse-overlayfs path; bad images."""
from __future__ import annotations

import errno
import hashlib
import logging
import os

import pytest

from nodeagent.sandbox import native
from nodeagent.sandbox.runtime import SandboxError, SandboxRuntime, SandboxSpec, choose_overlay

pytestmark = pytest.mark.sandbox


class Clock:
    def __init__(self):
        self.t = 1000.0

    def __call__(self) -> float:
        return self.t


def test_one_mount_per_image_counted_and_unmounted_after_the_grace_period(busybox_image):
    clock = Clock()
    with SandboxRuntime(image_grace_s=30.0, clock=clock) as rt:
        a = rt.create(SandboxSpec(image=busybox_image))
        b = rt.create(SandboxSpec(image=busybox_image))
        (key,) = rt.mounted_images()
        assert rt.image_refs() == {key: 2}
        a.destroy()
        assert rt.image_refs() == {key: 1}
        b.destroy()
        assert rt.image_refs() == {key: 0}
        clock.t += 29.9
        assert rt.reap_images() == [] and rt.mounted_images() == [key]   # still in its grace period
        c = rt.create(SandboxSpec(image=busybox_image))                   # reused, not remounted
        c.destroy()
        clock.t += 30.0
        assert rt.reap_images() == [key]
        assert rt.mounted_images() == [] and rt.image_refs() == {}
        with rt.create(SandboxSpec(image=busybox_image)) as d:              # mounts again on demand
            assert d.exec(["true"]).exit_code == 0
            assert rt.mounted_images() == [key]


XATTR_PROBE = """
import os
for call in (lambda: os.getxattr('/usr/bin', 'user.paddock'), lambda: os.listxattr('/usr/bin'),
             lambda: os.getxattr(os.path.realpath('/usr/bin/env'), 'user.paddock')):
    try:
        call()
        print('answered')
    except OSError as exc:
        print(exc.errno)
print(os.readlink('/bin') if os.path.islink('/bin') else 'dir')
"""


def test_the_image_daemon_is_asked_for_no_xattrs_and_the_image_still_reads(runtime, python_image):
    """The FUSE shim (native/fuseshim.c) answers getxattr/listxattr with ENOSYS once: the kernel
    then answers EOPNOTSUPP itself, with no round trip (ENODATA would mean the daemon was asked)."""
    with runtime.create(SandboxSpec(image=python_image)) as sb:
        r = sb.exec(["python3", "-c", XATTR_PROBE])
        assert r.exit_code == 0, r
        lines = r.stdout.decode().split()
        assert lines[:3] == [str(errno.EOPNOTSUPP)] * 3, r
        again = sb.exec(["python3", "-c", XATTR_PROBE])   # symlinks read from the kernel's cache
        assert again.stdout == r.stdout


def test_without_the_fuse_shim_images_mount_as_before_and_the_agent_says_so(busybox_image, monkeypatch, caplog):
    def no_headers(*_a, **_k):
        raise native.NativeBuildError("fuse3/fuse_lowlevel.h: No such file (it needs gcc and libfuse3-dev)")
    monkeypatch.setattr(native, "fuse_shim", no_headers)
    with caplog.at_level(logging.WARNING, logger="nodeagent.sandbox.runtime"):
        with SandboxRuntime() as rt, rt.create(SandboxSpec(image=busybox_image)) as sb:
            assert sb.exec(["sh", "-c", "readlink /bin/sh && cat /etc/passwd >/dev/null"]).exit_code == 0
    assert "without the FUSE shim" in caplog.text and "libfuse3-dev" in caplog.text


def test_files_read_whole_and_at_offsets_from_a_fresh_image_mount_match_the_image(rw_image):
    """Without OPEN requests (the shim answers ENOSYS once) every read is served by the daemon's
    own open + read + release: a cold page cache, whole files and partial reads stay exact."""
    want = hashlib.sha256(open("/bin/busybox", "rb").read()).hexdigest()
    tail = open("/bin/busybox", "rb").read()[300000:300100]
    with SandboxRuntime() as rt, rt.create(SandboxSpec(image=rw_image)) as sb:
        r = sb.exec(["sh", "-c", "sha256sum /bin/busybox; tail -c +300001 /bin/busybox | head -c 100; "
                                 "cat /data/missing; cat /data/keep.txt"])
        assert r.stdout.split()[0].decode() == want, r
        assert r.stdout.split(b"\n", 1)[1] == tail + b"keep\n", r
        assert b"No such file" in r.stderr


def test_kernel_path_is_detected_from_the_release():
    assert choose_overlay("auto", "6.18.44-fc") == "kernel"
    assert choose_overlay("auto", "6.1.0-13-amd64") == "fuse-overlayfs"
    with pytest.raises(SandboxError, match="needs Linux ≥ 6.5"):
        choose_overlay("kernel", "5.15.0")
    with pytest.raises(SandboxError, match="not one of"):
        choose_overlay("btrfs")


def test_an_old_kernel_without_fuse_overlayfs_falls_back_to_an_extracted_lower():
    def without(name):
        return None if name == "fuse-overlayfs" else "/usr/bin/" + name
    assert choose_overlay("auto", "6.1.0-13-amd64", which=without) == "extracted"
    with pytest.raises(SandboxError, match="unsquashfs.*apt-get install squashfs-tools"):
        choose_overlay("extracted", "6.1.0", which=lambda name: None)


def test_extracted_path_unpacks_once_per_image_shares_it_and_removes_it_with_the_mount(rw_image):
    clock = Clock()
    with SandboxRuntime(overlay="extracted", image_grace_s=1.0, clock=clock) as rt:
        assert rt.caps_report()["overlay"] == "extracted"
        extracted = os.path.join(rt.state_dir, "extracted")
        a = rt.create(SandboxSpec(image=rw_image, files={"a.txt": b"a"}))
        b = rt.create(SandboxSpec(image=rw_image))
        (key,) = rt.mounted_images()
        assert os.listdir(extracted) == [key]   # one copy for both sandboxes
        r = a.exec(["sh", "-c", "echo b > /work/b.txt && rm /data/gone.txt && cat /work/a.txt /work/b.txt; "
                                "echo x > /bin/busybox; echo rc=$?"])
        assert r.stdout.startswith(b"ab\n") and b"rc=0" not in r.stdout
        assert b.exec(["cat", "/data/gone.txt"]).exit_code == 0   # a's deletion is a's alone
        changes = {(c.path, c.kind) for c in a.diff("/")}
        assert ("/work/b.txt", "added") in changes and ("/data/gone.txt", "deleted") in changes
        info = a.exec(["cat", "/proc/self/mountinfo"]).stdout.decode()
        assert rt.state_dir not in info
        a.destroy()
        b.destroy()
        clock.t += 1.0
        assert rt.reap_images() == [key]
        assert os.listdir(extracted) == []   # removed with its last reference


def test_fuse_overlayfs_path_gives_a_working_writable_root(rw_image):
    with SandboxRuntime(overlay="fuse-overlayfs") as rt:
        assert rt.caps_report()["overlay"] == "fuse-overlayfs"
        with rt.create(SandboxSpec(image=rw_image, files={"a.txt": b"a"})) as sb:
            r = sb.exec(["sh", "-c", "echo b > /work/b.txt && rm /data/gone.txt && cat /work/a.txt /work/b.txt; "
                                     "echo x > /bin/busybox; echo rc=$?"])
            assert r.stdout.startswith(b"ab\n") and b"rc=0" not in r.stdout
            changes = {(c.path, c.kind) for c in sb.diff("/")}
            assert ("/work/b.txt", "added") in changes and ("/data/gone.txt", "deleted") in changes


def test_missing_image_names_the_fix(runtime, tmp_path):
    with pytest.raises(SandboxError, match="does not exist: build it with `paddock image build`"):
        runtime.create(SandboxSpec(image=tmp_path / "nope.sif"))


def test_corrupt_sif_is_a_clear_error(runtime, busybox_image, tmp_path):
    bad = tmp_path / "corrupt.sif"
    data = bytearray(busybox_image.read_bytes()[:4096])
    bad.write_bytes(bytes(data))   # a SIF header whose partition is cut off
    with pytest.raises(SandboxError, match=r"cannot be used: .*truncated.*rebuild it with `paddock image build`"):
        runtime.create(SandboxSpec(image=bad))


def test_subuid_range_missing_or_too_small_names_the_fix():
    with pytest.raises(SandboxError, match="has no range in /etc/subuid: run `make setup`"):
        SandboxRuntime(user="no-such-user-for-paddock")
    with pytest.raises(SandboxError, match="too small.*usermod --add-subuids"):
        SandboxRuntime(subids=(100000, 1024))


def test_host_without_squashfuse_or_usable_fuse_device_names_the_fix(tmp_path):
    from nodeagent.sandbox.runtime import host_problems
    dev = tmp_path / "fuse"
    dev.write_bytes(b"")
    os.chmod(dev, 0o600)
    problems = host_problems(str(dev), which=lambda name: None)
    assert problems[0].startswith("squashfuse is not installed: run `make setup`")
    assert f"chmod 0666 {dev}" in problems[1]
    assert "modprobe fuse" in host_problems(str(tmp_path / "absent"), which=lambda n: "/bin/x")[0]
    assert host_problems("/dev/fuse") == []
