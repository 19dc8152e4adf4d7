"""Sandbox exec stdin: every byte reaches the command up to the documented cap
(`nodeagent.sandbox.sbxinit.STDIN_MAX_BYTES`, 8 MiB); more is a ValueError naming the cap."""
from __future__ import annotations

import hashlib
import os

import pytest

from nodeagent.sandbox.runtime import SandboxSpec
from nodeagent.sandbox.sbxinit import STDIN_MAX_BYTES


def test_a_1_mb_stdin_reaches_the_command_whole(runtime, busybox_image):
    data = os.urandom(1 << 20)
    with runtime.create(SandboxSpec(image=busybox_image)) as sb:
        r = sb.exec(["sh", "-c", "cat > /tmp/in; wc -c < /tmp/in; md5sum /tmp/in"], stdin=data, timeout_s=30)
        assert r.exit_code == 0, r.stderr
        size, digest = r.stdout.split(b"\n")[0].strip(), r.stdout.split(b"\n")[1].split()[0]
        assert int(size) == len(data)
        assert digest.decode() == hashlib.md5(data).hexdigest()


def test_stdin_at_the_cap_arrives_and_one_byte_more_is_refused_naming_the_cap(runtime, busybox_image):
    with runtime.create(SandboxSpec(image=busybox_image, limits={"memory_mb": 256, "pids": 64,
                                                                 "disk_mb": 64, "nofile": 256})) as sb:
        r = sb.exec(["sh", "-c", "wc -c"], stdin=b"x" * STDIN_MAX_BYTES, timeout_s=30)
        assert int(r.stdout) == STDIN_MAX_BYTES, r.stderr
        with pytest.raises(ValueError, match=f"cap of {STDIN_MAX_BYTES} bytes"):
            sb.exec(["sh", "-c", "wc -c"], stdin=b"x" * (STDIN_MAX_BYTES + 1))
        assert sb.exec(["true"]).exit_code == 0      # the sandbox still serves


def test_a_command_that_reads_no_stdin_ends_without_hanging(runtime, busybox_image):
    with runtime.create(SandboxSpec(image=busybox_image)) as sb:
        r = sb.exec(["sh", "-c", "echo done"], stdin=b"y" * (1 << 20), timeout_s=10)
        assert (r.exit_code, r.stdout, r.timed_out) == (0, b"done\n", False)
        r = sb.exec(["sh", "-c", "head -c 10"], stdin=b"z" * (1 << 20), timeout_s=10)
        assert (r.exit_code, r.stdout) == (0, b"z" * 10)
