"""diff(): added, modified and deleted files (whiteouts), directories, symlinks and modes, as a
list or a tar archive, applied to a fresh sandbox with apply(); on both overlay paths."""
from __future__ import annotations

import pytest

from nodeagent.sandbox.runtime import Change, SandboxError, SandboxRuntime, SandboxSpec

pytestmark = pytest.mark.sandbox

EDIT = ("echo changed > /data/keep.txt && rm /data/gone.txt && rm -r /data/sub && mkdir /data/sub && "
        "echo fresh > /data/sub/new.txt && mkdir -m 0750 /data/newdir && echo x > /data/newdir/f && "
        "chmod 0755 /data/newdir/f && ln -sf sub/new.txt /data/link2 && rm /data/link")
STATE = ("cat /data/keep.txt; ls /data; ls /data/sub; stat -c '%a' /data/newdir /data/newdir/f; "
         "readlink /data/link2; cat /data/gone.txt 2>&1 | head -c 0")


def _edit_and_check(rt, image):
    with rt.create(SandboxSpec(image=image)) as a:
        r = a.exec(["sh", "-c", EDIT])
        assert r.exit_code == 0, r.stderr
        expected = a.exec(["sh", "-c", STATE]).stdout
        changes = a.diff("/data")
        archive = a.diff_archive("/data")
    kinds = {(c.path, c.kind) for c in changes}
    assert {("/data/keep.txt", "modified"), ("/data/gone.txt", "deleted"), ("/data/link", "deleted"),
            ("/data/sub", "deleted"), ("/data/sub", "dir"), ("/data/sub/new.txt", "added"),
            ("/data/newdir", "dir"), ("/data/newdir/f", "added"), ("/data/link2", "symlink")} <= kinds
    modes = {c.path: c.mode for c in changes if c.kind != "deleted"}
    assert modes["/data/newdir"] == 0o750 and modes["/data/newdir/f"] == 0o755
    for payload in (changes, archive):
        with rt.create(SandboxSpec(image=image)) as b:
            b.apply(payload)
            assert b.exec(["sh", "-c", STATE]).stdout == expected
            assert b.exec(["sh", "-c", "ls /data/sub"]).stdout == b"new.txt\n"   # inner.txt stays gone


def test_diff_round_trips_through_apply_on_the_kernel_overlay(runtime, rw_image):
    _edit_and_check(runtime, rw_image)


def test_diff_round_trips_through_apply_on_fuse_overlayfs(rw_image):
    with SandboxRuntime(overlay="fuse-overlayfs") as rt:
        _edit_and_check(rt, rw_image)


def test_apply_refuses_paths_that_escape_and_unknown_kinds(runtime, rw_image):
    with runtime.create(SandboxSpec(image=rw_image)) as sb:
        with pytest.raises(SandboxError, match="without '..'"):
            sb.apply([Change("/work/../../etc/x", "added", b"x", 0o644)])
        with pytest.raises(SandboxError, match="unknown kind"):
            sb.apply([Change("/work/x", "hardlink", b"x", 0o644)])
        with pytest.raises(SandboxError, match="not a readable tar"):
            sb.apply(b"this is not a tar archive" * 40)


def test_applied_setuid_bits_are_dropped(runtime, rw_image):
    with runtime.create(SandboxSpec(image=rw_image)) as sb:
        sb.apply([Change("/work/tool", "added", b"#!/bin/sh\n", 0o4755)])
        assert sb.exec(["stat", "-c", "%a", "/work/tool"]).stdout == b"755\n"


def test_exec_as_another_uid_cannot_write_the_agents_files(runtime, rw_image):
    with runtime.create(SandboxSpec(image=rw_image, files={"sol.py": b"x = 1\n"})) as sb:
        sb.write_files({"/work/report/.keep": b""}, owner="system", mode=0o644)
        r = sb.exec(["sh", "-c", "id -u; cat /work/sol.py; echo y >> /work/sol.py; echo rc=$?; "
                                 "echo z > /work/report/out; echo rc=$?"], uid=1000)
        lines = r.stdout.decode().split()
        assert lines[0] == "1000" and "x" in lines
        assert lines.count("rc=0") == 0
        assert sb.read_file("/work/sol.py") == b"x = 1\n"
        with pytest.raises(ValueError, match="outside the sandbox's id slice"):
            sb.exec(["true"], uid=runtime.slice_size)
