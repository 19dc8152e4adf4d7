"""The native sandbox init (nodeagent/sandbox/native): built on first use under a content-hashed name,
a clear error without a compiler; its wire format (framing records) and the agent's checks of
what an init sends back."""
from __future__ import annotations

import os
import socket

import pytest

from nodeagent.sandbox import framing, native, sbxinit
from nodeagent.sandbox.runtime import SandboxSpec


def test_the_init_is_built_once_per_source_version_into_the_cache_dir(tmp_path):
    path = native.init_binary(tmp_path)
    assert path.parent == tmp_path and path.name == native.binary_name()
    assert os.access(path, os.X_OK) and path.read_bytes()[:4] == b"\x7fELF"
    built_at = path.stat().st_mtime_ns
    assert native.init_binary(tmp_path) == path and path.stat().st_mtime_ns == built_at   # not rebuilt
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".build-")]   # no temporary left
    (tmp_path / "paddock-sbxinit-0000000000000000").write_bytes(b"an older version")
    path.unlink()
    assert native.init_binary(tmp_path) == path
    assert sorted(p.name for p in tmp_path.iterdir()) == [path.name]   # the older one is gone


def test_the_squashfuse_preload_is_built_once_per_source_version_beside_the_init(tmp_path):
    path = native.fuse_shim(tmp_path)
    assert path.name == native.shim_name() and path.name.endswith(".so")
    assert path.read_bytes()[:4] == b"\x7fELF" and path.read_bytes()[16] == 3   # ET_DYN: a library
    built_at = path.stat().st_mtime_ns
    assert native.fuse_shim(tmp_path) == path and path.stat().st_mtime_ns == built_at
    assert native.shim_name(native.SHIM_SOURCE.read_bytes() + b"\n") != path.name


def test_an_edited_source_gets_another_binary_name():
    src = native.SOURCE.read_bytes()
    assert native.binary_name(src + b"\n/* edited */\n") != native.binary_name(src)
    assert native.binary_name(src) == native.binary_name()


def test_without_a_compiler_the_error_names_the_packages(tmp_path, monkeypatch):
    monkeypatch.setenv("PATH", str(tmp_path))   # no cc, no gcc
    with pytest.raises(native.NativeBuildError, match=r"no C compiler \(cc or gcc\).*gcc and libc6-dev"):
        native.init_binary(tmp_path / "cache")


def test_records_round_trip_and_a_truncated_record_is_refused():
    recs = [("a", b"sh"), ("e", b""), ("a", b"-c"), ("i", bytes(range(256)))]
    frame = framing.encode_records(recs)
    assert framing.decode_records(frame[4:]) == {"a": [b"sh", b"-c"], "i": [bytes(range(256))], "e": [b""]}
    with pytest.raises(framing.FramingError, match="runs past its frame"):
        framing.decode_records(frame[4:-1])
    with pytest.raises(framing.FramingError, match="truncated record header"):
        framing.decode_records(frame[4:7])
    with pytest.raises(framing.FramingError, match="exceeds the limit"):
        a, b = socket.socketpair()
        with a, b:
            a.sendall(frame)
            framing.recv_records(b, max_bytes=8)


def test_an_exec_request_with_a_nul_byte_or_a_bad_argv_is_refused_by_name():
    with pytest.raises(ValueError, match="argv entry 'a\\\\x00b' contains a NUL byte"):
        sbxinit.exec_records(["a\0b"], b"", 1.0, "/work", {}, 100, None, False)
    with pytest.raises(ValueError, match="argv must be a non-empty list of strings"):
        sbxinit.exec_records([], b"", 1.0, "/work", {}, 100, None, False)
    with pytest.raises(ValueError, match="environment variable name 'A=B'"):
        sbxinit.exec_records(["true"], b"", 1.0, "/work", {"A=B": "1"}, 100, None, False)


def test_a_malformed_reply_from_an_init_is_reported_not_trusted():
    assert sbxinit.checked_exec_reply({"x": [b"not a number"]})["ok"] is False
    assert sbxinit.checked_exec_reply({"1": [b"out"]})["ok"] is False   # no exit code
    good = sbxinit.checked_exec_reply({"x": [b"3"], "1": [b"o"], "2": [b"e"], "T": [b"0"], "r": [b"1"], "w": [b"1500"]})
    assert good == {"ok": True, "exit_code": 3, "stdout": b"o", "stderr": b"e", "timed_out": False,
                    "truncated": True, "wall_s": 0.0015}


def test_the_init_answers_a_request_it_cannot_parse_and_keeps_serving(runtime, busybox_image):
    with runtime.create(SandboxSpec(image=busybox_image)) as sb:
        framing.send_records(sb._sock, [("Z", b"unknown field")])
        reply = sbxinit.checked_exec_reply(framing.recv_records(sb._sock))
        assert reply["exit_code"] == 126 and b"unknown field" in reply["stderr"]
        assert sb.exec(["echo", "still here"]).stdout == b"still here\n"


def test_the_sandbox_runs_no_interpreter_per_sandbox(runtime, busybox_image):
    with runtime.create(SandboxSpec(image=busybox_image)) as sb:
        exe = os.readlink(f"/proc/{sb.init_pid_host}/exe")
    assert "python" not in exe and "paddock-sbxinit" in exe
