"""The operator's view of a local run: `paddock run` writes the node agents' health stream and
serves metrics when asked (`--metrics-port`); `paddock health` says when there is no stream
instead of hanging; a node that drained and left is shown as drained (not LOST) and holds no
busy slot. One real local run (controller, two node agents, sandboxes, the scripted policy).
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from controller.demo.localrun import RunConfig, run_local
from nodeagent.verifier.validate import validate_for_run
from tests.cli.test_ops import _frame, _node

ROOT = Path(__file__).resolve().parents[2]


def paddock(*argv: str, timeout: float = 60) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "controller.cli.main", *argv], cwd=ROOT, timeout=timeout,
                          env=dict(os.environ, PYTHONPATH=str(ROOT)), capture_output=True, text=True)


@pytest.fixture(scope="module")
def local_run(tmp_path_factory, python_image):
    runs = tmp_path_factory.mktemp("runs")
    return run_local(validate=validate_for_run,
                     cfg=RunConfig(versions=1, tasks_limit=4, runs_dir=str(runs), heartbeat_interval_s=0.5,
                                   metrics_port=0, validate="off"))


def test_the_local_run_writes_a_health_stream_per_node_agent(local_run):
    files = sorted(p.name for p in (local_run / "health").glob("*.jsonl"))
    assert files == ["local-1.jsonl", "local-2.jsonl"]
    for f in files:
        samples = [json.loads(ln) for ln in (local_run / "health" / f).read_text().splitlines()]
        assert samples and samples[0]["node"] == f.removesuffix(".jsonl") and "slots_free" in samples[0]
    proc = paddock("health", "--run", str(local_run), "--node", "local-1")
    assert proc.returncode == 0 and json.loads(proc.stdout.splitlines()[0])["node"] == "local-1"


def test_health_follow_on_a_finished_run_prints_the_stream_and_ends(local_run):
    t0 = time.monotonic()
    proc = paddock("health", "--run", str(local_run), "--follow", timeout=30)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.count("\n") >= 2 and "controller stopped" in proc.stderr
    assert time.monotonic() - t0 < 20


def test_the_local_run_served_metrics_on_the_port_it_was_given(local_run):
    url = (local_run / "controller.endpoint.metrics").read_text().strip()
    assert url.startswith("http://127.0.0.1:") and url.endswith("/metrics")


def test_run_accepts_metrics_port_and_refuses_a_bad_one(tmp_path):
    proc = paddock("run", "--metrics-port", "70000", "--runs-dir", str(tmp_path / "runs"))
    assert proc.returncode == 2 and "--metrics-port" in proc.stderr and "usage: paddock run" in proc.stderr
    assert not (tmp_path / "runs").exists()


def test_health_on_a_run_without_a_stream_says_so_at_once(tmp_path):
    run = tmp_path / "run"
    run.mkdir()
    (run / "run.json").write_text("{}")
    for argv in (["health", "--run", str(run)], ["health", "--run", str(run), "--follow"]):
        t0 = time.monotonic()
        proc = paddock(*argv, timeout=20)
        assert proc.returncode == 2, proc.stderr
        assert "no health stream" in proc.stderr and "not running" in proc.stderr
        assert time.monotonic() - t0 < 10
    assert sorted(p.name for p in run.iterdir()) == ["run.json"]


def test_health_follow_on_a_running_run_without_a_stream_waits_a_bounded_time_and_says_why(tmp_path):
    run = tmp_path / "run"
    run.mkdir()
    (run / "controller.endpoint").write_text("tcp://127.0.0.1:1\n")
    proc = paddock("health", "--run", str(run), "--follow", "--wait-s", "1", timeout=20)
    assert proc.returncode == 2
    assert "waiting up to 1s" in proc.stderr and "no health sample" in proc.stderr


def test_top_shows_a_drained_node_as_drained_with_no_busy_slot():
    drained = dict(_node(2, "drained"), slots_free=0)
    screen = _frame([_node(1), drained], 80, 24)
    rows = {ln.split("│")[1].strip(): [c.strip() for c in ln.split("│")[2:-1]]
            for ln in screen if ln.startswith("│ node")}
    assert rows["node-02"][:2] == ["drained", "0/4"]
    assert "LOST" not in "\n".join(screen) and "lost" not in screen[0]
    assert "drained 1" in screen[0] and "slots 3/4 busy" in screen[0]


def test_top_sorts_by_every_column_it_lists(tmp_path):
    from controller.cli.ops import TOP_SORTS
    from controller.cli.top import TopView
    assert "images" in TOP_SORTS
    for col in TOP_SORTS:
        TopView("r", col).rows([_node(1), _node(2)], 1000.0, 5.0)
