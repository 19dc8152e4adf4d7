"""The grader's report path under coverage-guided fuzzing (atheris), bounded for CI, plus the
inputs the fuzzer found as plain regression tests.

`fuzz_grader_report.py` runs in a child process (atheris exits the process when it stops) for
FUZZ_RUNS inputs with a fixed seed; an exception that escapes `grader_plugin._verified_events`
or `grade.grade_report` (other than VerifierInfraError), an unsigned event accepted, or a report
graded pass that does not show every required test passed, makes the child fail and so this
test. The fuzz run is skipped, with the reason, when atheris is not installed.
"""
from __future__ import annotations

import json
import os
import socket
import struct
import subprocess
import sys
from pathlib import Path

import pytest

from nodeagent.verifier import callbridge, grader_plugin
from nodeagent.verifier.grade import VerifierInfraError, grade_report

FUZZ_RUNS = 4000
FUZZ_DEADLINE_S = 180
TARGET = Path(__file__).resolve().parent / "fuzz_grader_report.py"
ROOT = TARGET.parents[2]


def test_report_parsing_survives_fuzzing_and_never_grades_a_forged_report_pass(tmp_path):
    pytest.importorskip("atheris", reason="atheris is not installed (pip install atheris)")
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")])))
    proc = subprocess.run(
        [sys.executable, str(TARGET), f"-atheris_runs={FUZZ_RUNS}", "-max_len=512", "-len_control=0",
         "-seed=1", f"-artifact_prefix={tmp_path}/"],
        cwd=tmp_path, env=env, capture_output=True, text=True, timeout=FUZZ_DEADLINE_S)
    tail = (proc.stdout + proc.stderr)[-4000:]
    assert proc.returncode == 0, tail
    assert f"Done {FUZZ_RUNS}" in tail, tail


@pytest.mark.parametrize("raw", [b'{"events": [1e999]}', b'{"events": ["start", "end"]}', b"[1]", b'"events"',
                                 b'{"events": ' + b"[" * 100_000 + b"]" * 100_000 + b"}"])
def test_a_report_that_is_not_a_list_of_event_objects_is_malformed_not_a_crash(raw):
    with pytest.raises(VerifierInfraError, match="malformed grader report"):
        grade_report(raw, ["t.py::test_a"], {})


def test_a_line_nested_past_the_parsers_depth_is_malformed_and_the_report_still_written():
    key = bytes(32)
    body = json.dumps({"ev": "start"}, sort_keys=True)
    good = json.dumps({"ev": {"ev": "start"}, "mac": grader_plugin._mac(key, 0, body)}).encode()
    events, bad, forged = grader_plugin._verified_events([(-1, b"[" * 100_000), (7, good)], key)
    assert (events, bad, forged) == ([{"ev": "start"}], 1, 0)


def test_a_callee_reply_nested_past_the_parsers_depth_kills_the_bridge_not_the_test():
    mine, callee = socket.socketpair()
    bridge = callbridge.Bridge(mine.detach(), 1.0)
    payload = b"[" * 200_000
    callee.sendall(struct.pack(">I", len(payload)) + payload)
    with pytest.raises(callbridge.CallBoundaryError, match="RecursionError"):
        bridge.request({"op": "lookup", "module": "solution", "name": "f"})
    with pytest.raises(callbridge.CallBoundaryError):
        bridge.request({"op": "lookup", "module": "solution", "name": "f"})
    callee.close()
    bridge.sock.close()
