"""The job a GPU cluster's user submits (issue 25): model servers started in the allocation
(slurm/servers.py), the gateway spreading rollouts over their replicas, weight updates reaching
every replica, node-agent supervision (slurm/supervise.py). The parts here run without Slurm:
real server processes (the scripted policy server over HTTP), real sockets, real signals. The
end-to-end job on the in-test cluster is in tests/slurm/test_slurm_cluster_gpu.py.

Run: PYTHONPATH=. .venv/bin/python -m pytest -q tests/slurm/test_slurm_gpu.py
"""
from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import threading
import time
import urllib.request
from pathlib import Path

import pytest

from nodeagent.gateway.session import replica
from slurm.servers import (
    ReloadError,
    RemotePolicy,
    ServerError,
    ServerStep,
    published,
    reload_replicas,
    run_server,
    stop_servers,
    wait_servers,
)
from tests.conftest import wait_for

ROOT = Path(__file__).resolve().parents[2]
SCRIPTED = f"{sys.executable} -m controller.demo.scripted_server --host 127.0.0.1 --port $PADDOCK_SERVER_PORT"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start_server_step(run_dir: Path, node_port: int, **kw) -> tuple[threading.Thread, dict]:
    """run_server in a thread (it is the step's main function); its exit status lands in `out`."""
    step = ServerStep(component=kw.pop("component", "inference"), run_dir=str(run_dir), deployment="d1",
                      command=kw.pop("command", SCRIPTED), port=node_port, health=kw.pop("health", "/v1/models"),
                      reload=kw.pop("reload", "/admin/policies"), poll_s=0.1, **kw)
    out: dict = {}
    t = threading.Thread(target=lambda: out.setdefault("rc", _run_in_thread(step)), daemon=True)
    t.start()
    return t, out


def _run_in_thread(step: ServerStep) -> int:
    return run_server(step, "127.0.0.1", stopping={"signal": None})   # signal handlers: main thread only


@pytest.fixture
def env_path(monkeypatch):
    monkeypatch.setenv("PYTHONPATH", str(ROOT))
    monkeypatch.delenv("SLURM_RESTART_COUNT", raising=False)


def test_a_server_comes_up_publishes_its_endpoint_takes_a_weight_update_and_stops(tmp_path, env_path):
    # one replica per host (its record is named after the node); two replicas on two nodes: the
    # end-to-end job in tests/slurm/test_slurm_cluster_gpu.py
    port = free_port()
    t, out = start_server_step(tmp_path, port)
    got = wait_servers(tmp_path, {"inference": 1}, "d1", 60)
    rec = got["inference"][0]
    assert rec["url"] == f"http://127.0.0.1:{port}/v1" and rec["reload"] == "/admin/policies"
    assert json.loads((tmp_path / "servers.json").read_text())["inference"][0]["url"] == rec["url"]
    models = json.load(urllib.request.urlopen(rec["url"] + "/models", timeout=5))
    assert models["object"] == "list"
    # a weight update reaches the replica: the scripted server now serves version 3
    policy = RemotePolicy(got["inference"])
    from controller.demo.policy_server import default_params
    assert policy.set_policy(3, default_params())
    ids = [m["id"] for m in json.load(urllib.request.urlopen(rec["url"] + "/models", timeout=5))["data"]]
    assert "scripted-v3" in ids
    stop_servers(tmp_path, "d1")
    t.join(60)
    assert out.get("rc") == 0
    with pytest.raises(OSError):
        urllib.request.urlopen(rec["url"] + "/models", timeout=2)


def test_a_weight_update_that_misses_a_replica_names_it(tmp_path, env_path):
    port = free_port()
    t, out = start_server_step(tmp_path, port)
    live = wait_servers(tmp_path, {"inference": 1}, "d1", 60)["inference"][0]
    dead = dict(live, node="gpu-node-9", base=f"http://127.0.0.1:{free_port()}")
    with pytest.raises(ReloadError, match="gpu-node-9"):
        from controller.demo.policy_server import default_params
        reload_replicas([live, dead], {"version": 1, "params": default_params()}, timeout_s=5)
    stop_servers(tmp_path, "d1")
    t.join(60)


def test_a_server_that_exits_before_it_is_healthy_fails_the_step_and_the_head_at_once(tmp_path, env_path, capsys):
    t, out = start_server_step(tmp_path, free_port(), command="echo no GPU here >&2; exit 3")
    t.join(30)
    assert out["rc"] == 5
    assert "exited with 3 before" in capsys.readouterr().err
    assert published(tmp_path, "inference", "d1") == []
    t0 = time.monotonic()
    with pytest.raises(ServerError, match=r"exited with 3 before .*logs/inference.log"):
        wait_servers(tmp_path, {"inference": 2}, "d1", 60)
    assert time.monotonic() - t0 < 5          # not after its 60 s: a failed replica is final


def test_a_server_never_healthy_is_stopped_at_its_deadline(tmp_path, env_path, capsys):
    t, out = start_server_step(tmp_path, free_port(), command="exec sleep 300", ready_wait_s=1.0)
    t.join(30)
    assert out["rc"] == 5 and "did not answer 200 within 1s" in capsys.readouterr().err


def test_the_head_names_the_component_short_of_replicas(tmp_path):
    with pytest.raises(ServerError, match=r"judge 0 of 1.*logs/judge.log"):
        wait_servers(tmp_path, {"judge": 1}, "d1", 0.3)


def test_a_previous_runs_endpoint_is_not_taken_for_this_runs(tmp_path, monkeypatch):
    d = tmp_path / "servers" / "inference"
    d.mkdir(parents=True)
    (d / "node2.json").write_text(json.dumps({"url": "http://x/v1", "deployment": "d1", "incarnation": "0"}))
    monkeypatch.setenv("SLURM_RESTART_COUNT", "1")
    assert published(tmp_path, "inference", "d1") == []


def test_the_gateway_spreads_rollouts_over_the_replicas_and_each_keeps_its_own():
    eps = "http://10.0.0.2:8000/v1 http://10.0.0.3:8000/v1"
    picks = [replica(eps, k) for k in range(6)]
    assert picks.count("http://10.0.0.2:8000/v1") == picks.count("http://10.0.0.3:8000/v1") == 3
    assert replica("http://10.0.0.2:8000/v1", 5) == "http://10.0.0.2:8000/v1"


def test_a_session_calls_one_replica_for_all_its_calls(tmp_path):
    from nodeagent.gateway.session import GatewayBudgets, Session, Upstream
    seen = []

    class Fake:
        def __init__(self, ep):
            self.ep = ep

        def complete(self, payload, timeout_s):
            seen.append(self.ep)
            return {"choices": [{"message": {"role": "assistant", "content": "hi"}, "finish_reason": "stop"}],
                    "usage": {"prompt_tokens": 1, "completion_tokens": 1}}
    sessions = [Session(Upstream(0, "http://a/v1 http://b/v1", "m"), GatewayBudgets(10, 10_000, 60),
                        client=Fake) for _ in range(2)]
    for s in sessions:
        for _ in range(3):
            s.complete({"messages": [{"role": "user", "content": "x"}]}, 5)
    assert len(set(seen[:3])) == 1 and len(set(seen[3:])) == 1 and seen[0] != seen[3]


# ------------------------------------------------------------------ supervision (slurm/supervise.py)
from slurm.supervise import (  # noqa: E402
    BACKOFF,
    EXIT_NODE_DRAINED,
    FATAL,
    RUNNING,
    STOPPED,
    STOPPING,
    TRANSITIONS,
    Policy,
    Supervisor,
)
from tests.conftest import FakeClock  # noqa: E402


class Spawner:
    """Spawns real processes: each `script` entry is the shell command of the next spawn."""

    def __init__(self, *script: str) -> None:
        self.script, self.procs = list(script), []

    def __call__(self) -> subprocess.Popen:
        p = subprocess.Popen(["/bin/sh", "-c", self.script.pop(0) if self.script else "exec sleep 300"])
        self.procs.append(p)
        return p


def sleeping_clock():
    clock = FakeClock(0.0)
    return clock, (lambda dt: (clock.advance(dt), time.sleep(0.01)))   # time passes on the fake clock


def test_an_agent_that_crashes_is_restarted_after_its_backoff_and_the_step_ends_cleanly():
    clock, sleep = sleeping_clock()
    spawn = Spawner("kill -9 $$", "exit 0")                   # crashes (SIGKILL), then runs to its end
    restarts = []
    sup = Supervisor("node4", spawn, Policy(backoff_base_s=2.0), clock=clock, sleep=sleep,
                     on_restart=lambda r: restarts.append(clock()), poll_s=0.05)
    assert sup.run() == 0
    assert sup.state == STOPPED and sup.report.restarts == 1 and len(spawn.procs) == 2
    assert sup.report.failures[0]["exit"] == -9
    assert restarts[0] >= 2.0                                  # not before its backoff


def test_too_many_failures_in_the_window_give_the_node_up_and_report_it():
    clock, sleep = sleeping_clock()
    fatal = []
    sup = Supervisor("node5", Spawner("exit 1", "exit 1", "exit 1", "exit 0"),
                     Policy(max_failures=3, window_s=60, backoff_base_s=1.0), clock=clock, sleep=sleep,
                     on_fatal=fatal.append, poll_s=0.05)
    assert sup.run() == EXIT_NODE_DRAINED
    assert sup.state == FATAL and fatal and "failed 3 times within 60s" in fatal[0].reason
    assert [f["exit"] for f in fatal[0].failures] == [1, 1, 1]


def test_failures_spread_beyond_the_window_do_not_give_the_node_up():
    clock, sleep = sleeping_clock()
    spawn = Spawner("exit 1", "exit 1", "exit 1", "exit 0")
    sup = Supervisor("node6", spawn, Policy(max_failures=3, window_s=60, backoff_base_s=40.0, backoff_max_s=40.0),
                     clock=clock, sleep=sleep, poll_s=0.05)
    assert sup.run() == 0 and sup.report.restarts == 3


def test_an_agent_that_refuses_its_arguments_is_not_restarted():
    clock, sleep = sleeping_clock()
    spawn = Spawner("exit 2")
    sup = Supervisor("node7", spawn, clock=clock, sleep=sleep, poll_s=0.05)
    assert sup.run() == 2 and sup.state == FATAL and len(spawn.procs) == 1


def test_the_jobs_drain_signal_stops_the_agent_and_no_restart_follows():
    clock, sleep = sleeping_clock()
    spawn = Spawner("trap 'exit 0' TERM; while :; do sleep 0.05; done")
    sup = Supervisor("node8", spawn, clock=clock, sleep=sleep, poll_s=0.05)
    t = threading.Thread(target=lambda: setattr(sup, "rc", sup.run()))
    t.start()
    wait_for(lambda: sup.state == RUNNING, 10, "the agent to run")
    sup.request_stop("WINCH")
    t.join(10)
    assert sup.rc == 0 and sup.state == STOPPED and len(spawn.procs) == 1


def test_the_state_table_allows_only_the_documented_transitions():
    assert TRANSITIONS[RUNNING] == {STOPPED, BACKOFF, FATAL, STOPPING}
    assert TRANSITIONS[STOPPED] == TRANSITIONS[FATAL] == set()
    sup = Supervisor("n", Spawner())
    sup.state = STOPPED
    with pytest.raises(AssertionError, match="illegal supervisor transition STOPPED -> RUNNING"):
        sup._move(RUNNING)


# ------------------------------------------------------------------ --sandbox native|apptainer
def test_the_agent_runs_the_apptainer_backend_when_asked_and_says_why_it_cannot_here(tmp_path):
    import shutil
    cp = subprocess.run([sys.executable, "-m", "controller.cli", "agent", "--controller", "tcp://127.0.0.1:1",
                         "--insecure", "--deployment", "d", "--image-store", str(tmp_path), "--sandbox", "apptainer"],
                        capture_output=True, text=True, timeout=60, env=dict(os.environ, PYTHONPATH=str(ROOT)))
    if shutil.which("apptainer"):
        pytest.skip("apptainer is installed: the conformance tests (tests/sandbox) run the backend itself")
    assert cp.returncode == 2
    assert "cannot start the apptainer sandbox runtime: apptainer is not on PATH" in cp.stderr


def test_an_unknown_sandbox_backend_is_refused_by_the_agent_and_the_job_description():
    cp = subprocess.run([sys.executable, "-m", "controller.cli", "agent", "--controller", "tcp://127.0.0.1:1",
                         "--insecure", "--deployment", "d", "--image-store", "/tmp", "--sandbox", "docker"],
                        capture_output=True, text=True, timeout=60, env=dict(os.environ, PYTHONPATH=str(ROOT)))
    assert cp.returncode == 2 and "invalid choice: 'docker'" in cp.stderr
    from slurm.sbatch import ParamError, render
    with pytest.raises(ParamError, match="'sandbox' must be one of native, apptainer"):
        render(dict(run_dir="/r", env_nodes=1, sandbox="docker"))
    text = render(dict(run_dir="/r", env_nodes=1, sandbox="apptainer"))
    agent = [ln for ln in text.splitlines() if "job agent" in ln][0]
    assert agent.endswith("--sandbox apptainer \\")


def test_a_pause_resume_protocol_posts_its_own_paths_on_every_replica(tmp_path):
    """vLLM's protocol (POST /sleep then /wake_up on each replica) through the same call: two
    real HTTP servers record what reached them."""
    import http.server
    hits: list[tuple[int, str]] = []

    class H(http.server.BaseHTTPRequestHandler):
        def do_POST(self):
            self.rfile.read(int(self.headers.get("Content-Length", 0)))
            hits.append((self.server.server_address[1], self.path))
            self.send_response(200)
            self.send_header("Content-Length", "0")
            self.end_headers()

        def log_message(self, *a):
            pass
    servers = [http.server.ThreadingHTTPServer(("127.0.0.1", 0), H) for _ in range(2)]
    for s in servers:
        threading.Thread(target=s.serve_forever, daemon=True).start()
    try:
        recs = [{"node": f"n{i}", "base": f"http://127.0.0.1:{s.server_address[1]}", "reload": ""}
                for i, s in enumerate(servers)]
        assert reload_replicas(recs, {}, path="/sleep?level=2") == [200, 200]
        assert reload_replicas(recs, {}, path="/wake_up") == [200, 200]
        with pytest.raises(ReloadError, match="no reload path"):
            reload_replicas(recs, {})
    finally:
        for s in servers:
            s.shutdown()
    ports = {s.server_address[1] for s in servers}
    assert sorted(hits) == sorted((p, path) for p in ports for path in ("/sleep?level=2", "/wake_up"))


def test_an_agent_step_that_keeps_failing_drains_its_node_and_reports_it(tmp_path):
    import signal as sig

    from slurm.jobsteps import AgentStep, supervise_agent
    saved = {s: sig.getsignal(s) for s in (sig.SIGWINCH, sig.SIGTERM, sig.SIGUSR2)}
    try:
        step = AgentStep(run_dir=str(tmp_path), deployment="d1", image_store="/x", restart_max_failures=2,
                         restart_window_s=60, restart_backoff_s=0.05)
        rc = supervise_agent(["/bin/sh", "-c", "exit 1"], "node9", tmp_path, "tcp://127.0.0.1:1", step)
    finally:
        for s, h in saved.items():
            sig.signal(s, h)
    assert rc == 6
    report = json.loads((tmp_path / "health" / "node9.supervisor.json").read_text())
    assert report["state"] == "FATAL" and report["restarts"] == 1
    assert [f["exit"] for f in report["failures"]] == [1, 1] and "failed 2 times within 60s" in report["reason"]


def test_your_trainer_gets_the_model_servers_endpoints(tmp_path):
    from controller.farm.assemble import load_taskset
    from slurm.jobsteps import HeadStep, _start_trainer
    (tmp_path / "logs").mkdir()
    servers = {"inference": [{"url": "http://10.0.0.2:8000/v1"}, {"url": "http://10.0.0.3:8000/v1"}],
               "judge": [{"url": "http://10.0.0.4:9000/v1"}]}
    args = HeadStep(run_dir=str(tmp_path), deployment="d1", image_store="/x", agents=1)
    proc = _start_trainer(f"env > {tmp_path}/env.txt", tmp_path, "tcp://h:1", args, load_taskset("builtin", ""),
                          "10.0.0.1", servers)
    assert proc.wait(30) == 0
    env = dict(ln.split("=", 1) for ln in (tmp_path / "env.txt").read_text().splitlines() if "=" in ln)
    assert env["PADDOCK_INFERENCE_ENDPOINTS"] == "http://10.0.0.2:8000/v1 http://10.0.0.3:8000/v1"
    assert env["PADDOCK_JUDGE_ENDPOINTS"] == "http://10.0.0.4:9000/v1"
    assert env["PADDOCK_SERVERS_FILE"] == str(tmp_path / "servers.json")
    assert env["PADDOCK_QUARANTINE_FILE"] == str(tmp_path / "quarantine.json")
