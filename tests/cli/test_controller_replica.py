"""`paddock controller --replica-dir`: the replica knob reaches the queue, and an unusable
replica directory is a clear error (exit 2, the path named), not a traceback."""
from __future__ import annotations

import json
import subprocess
import sys


def _controller(tmp_path, replica) -> subprocess.CompletedProcess:
    run = tmp_path / "run"
    run.mkdir()
    (run / "tasks.json").write_text(json.dumps({}))
    return subprocess.run([sys.executable, "-m", "controller.cli.main", "controller", "--deployment", "d",
                           "--run-dir", str(run), "--tasks-json", str(run / "tasks.json"),
                           "--endpoint-file", str(run / "ep"), "--insecure", "--replica-dir", str(replica)],
                          capture_output=True, text=True, timeout=60)


def test_a_missing_replica_directory_is_named_and_exits_2(tmp_path):
    r = _controller(tmp_path, tmp_path / "not-there")
    assert r.returncode == 2, r.stderr
    assert f"replica directory {tmp_path / 'not-there'} does not exist" in r.stderr
    assert "Traceback" not in r.stderr


def test_a_replica_inside_the_run_directory_is_refused(tmp_path):
    (tmp_path / "run" / "copy").mkdir(parents=True)
    run = tmp_path / "run"
    (run / "tasks.json").write_text("{}")
    r = subprocess.run([sys.executable, "-m", "controller.cli.main", "controller", "--deployment", "d",
                        "--run-dir", str(run), "--tasks-json", str(run / "tasks.json"),
                        "--endpoint-file", str(run / "ep"), "--insecure", "--replica-dir", str(run / "copy")],
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 2 and "Traceback" not in r.stderr, r.stderr
    assert str(run / "copy") in r.stderr
