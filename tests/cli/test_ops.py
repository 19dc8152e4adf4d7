"""The ops view, on real parts: a controller (ROUTER loop, SQLite queue) and node agents (DEALER)
over ZeroMQ on 127.0.0.1, the health sampler, the JSON-lines stream, the CLI commands, and the
Prometheus endpoint scraped over HTTP and parsed with prometheus_client's parser."""
from __future__ import annotations

import io
import json
import select
import subprocess
import sys
import threading
import time
import urllib.request
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families

from controller.broker.daemon import Controller
from controller.broker.metrics import serve_metrics
from controller.cli import ops
from controller.cli.main import main as cli_main
from controller.client.api import Client
from controller.ondisk.keys import read_key_file
from nodeagent.agent.daemon import NodeAgent
from nodeagent.agent.health import HealthSampler
from tests.conftest import wait_for

ROOT = Path(__file__).resolve().parents[2]
HB_S = 0.1
LIVENESS = 3
HEALTH_KEYS = {"ts", "node", "agent_version", "draining", "slots", "slots_used", "slots_free",
               "sandboxes_active", "warm_pool", "rollouts_total", "rollouts_per_s", "cpu_percent",
               "mem_used_mb", "mem_free_mb", "tmpfs_used_mb", "disk_used_mb", "disk_free_mb",
               "image_mounts", "errors"}



class Farm:
    """A controller thread and node-agent threads, with a run directory the ops commands read."""

    def __init__(self, run_dir: Path, nodes: tuple[str, ...]):
        self.run_dir = run_dir
        self.deployment = "ops-test"
        (run_dir / "health").mkdir(parents=True)
        (run_dir / "run.json").write_text(json.dumps({"run_id": run_dir.name, "deployment": self.deployment}))
        self.ctl = Controller("tcp://127.0.0.1:0", self.deployment, str(run_dir), run_dir.name, {},
                              str(run_dir / "controller.db"), heartbeat_interval_s=HB_S, liveness=LIVENESS)
        (run_dir / "controller.endpoint").write_text(self.ctl.endpoint)
        self.ctl_thread = threading.Thread(target=self.ctl.serve, daemon=True)
        self.ctl_thread.start()
        keys = read_key_file(self.ctl.key_file)
        self.agents = {n: NodeAgent(n, self.ctl.endpoint, self.deployment, 2, None, None,
                                    heartbeat_interval_s=HB_S, liveness=LIVENESS, keys=keys)
                       for n in nodes}
        self.threads = {n: threading.Thread(target=a.run, daemon=True) for n, a in self.agents.items()}
        for t in self.threads.values():
            t.start()

    def status(self) -> list[dict]:
        with Client(self.ctl.endpoint, self.deployment, timeout_s=2, retries=1,
                    key_file=self.ctl.key_file) as c:
            return list(c.status().nodes)

    def states(self) -> dict[str, str]:
        return {n["node"]: n["state"] for n in self.status()}

    def silence(self, node: str) -> None:
        """The agent stops without a word (as if killed): the controller hears nothing more."""
        self.agents[node].stopped = True
        self.threads[node].join(5)

    def stop(self) -> None:
        try:
            with Client(self.ctl.endpoint, self.deployment, timeout_s=2, retries=1,
                    key_file=self.ctl.key_file) as c:
                c.shutdown("test over")
        finally:
            for n, a in self.agents.items():
                a.stopped = True
                self.threads[n].join(5)
            self.ctl_thread.join(5)


@pytest.fixture
def farm(tmp_path):
    f = Farm(tmp_path / "run1", ("n1", "n2"))
    try:
        wait_for(lambda: f.states() == {"n1": "live", "n2": "live"}, 10, "both agents live")
        yield f
    finally:
        f.stop()


def cli(*argv: str, capsys) -> tuple[int, str, str]:
    rc = cli_main(list(argv))
    out = capsys.readouterr()
    return rc, out.out, out.err


# ------------------------------------------------------------------ health sampler
def _bare_agent(node="n1") -> NodeAgent:
    return NodeAgent(node, "tcp://127.0.0.1:1", "d", 2, None, None)


def test_health_sample_has_the_documented_keys_and_a_rate_from_the_injected_clock(tmp_path):
    agent, now = _bare_agent(), [100.0]
    s = HealthSampler(agent, tmp_path, clock=lambda: now[0], wall=lambda: 1.7e9)
    first = s.sample()
    assert HEALTH_KEYS <= set(first) and first["rollouts_per_s"] is None
    agent.completed, now[0] = 6, 104.0
    second = s.sample()
    assert second["rollouts_per_s"] == 1.5 and second["rollouts_total"] == 6
    assert second["slots"] == 2 and second["slots_free"] == 2 and second["ts"] == 1.7e9
    lines = (tmp_path / "n1.jsonl").read_text().splitlines()
    assert [json.loads(ln)["rollouts_total"] for ln in lines] == [0, 6]


def test_health_stream_is_rotated_past_its_size_limit(tmp_path):
    s = HealthSampler(_bare_agent(), tmp_path, max_jsonl_bytes=600)
    for _ in range(6):
        s.sample()
    assert (tmp_path / "n1.jsonl.1").exists()
    assert (tmp_path / "n1.jsonl").stat().st_size <= 600 + 1200


def test_draining_agent_reports_no_free_slots(tmp_path):
    agent = _bare_agent()
    agent.draining = True
    assert HealthSampler(agent).sample()["slots_free"] == 0


@pytest.mark.sandbox
def test_health_counts_live_sandboxes_their_writable_layer_and_image_mounts(runtime, busybox_image):
    from nodeagent.sandbox.runtime import SandboxSpec
    agent = NodeAgent("n1", "tcp://127.0.0.1:1", "d", 2, None, runtime)
    try:
        s = HealthSampler(agent, slow_every_s=0)
        before = s.sample()
        sb = runtime.create(SandboxSpec(image=busybox_image, limits={"memory_mb": 64, "disk_mb": 16,
                                                                     "pids": 16, "nofile": 64}))
        try:
            assert sb.exec(["sh", "-c", "dd if=/dev/zero of=/tmp/x bs=1M count=6"], timeout_s=10).exit_code == 0
            during = s.sample()
        finally:
            sb.destroy()
        after = s.sample()
    finally:
        agent.pool.shutdown()
    assert during["sandboxes_active"] == before["sandboxes_active"] + 1 == after["sandboxes_active"] + 1
    assert during["tmpfs_used_mb"] >= before["tmpfs_used_mb"] + 6 > after["tmpfs_used_mb"] + 5
    assert during["image_mounts"] >= 1


# ------------------------------------------------------------------ agents, top, lost nodes
def test_agents_lists_each_node_live_with_its_version(farm, capsys):
    rc, out, _ = cli("agents", "--run", str(farm.run_dir), "--json", capsys=capsys)
    rows = {r["node"]: r for r in json.loads(out)}
    assert rc == 0 and set(rows) == {"n1", "n2"}
    assert {r["state"] for r in rows.values()} == {"live"}
    assert all(r["version"] for r in rows.values())


def test_a_silent_agent_shows_lost_within_the_liveness_window_with_its_last_seen_time(farm, capsys):
    farm.silence("n2")
    silenced_at = time.time()
    window_s = HB_S * LIVENESS + 1.0      # liveness window plus one sweep and a status round trip
    wait_for(lambda: farm.states().get("n2") == "lost", window_s, "n2 to be lost")
    rc, out, _ = cli("agents", "--run", str(farm.run_dir), "--json", capsys=capsys)
    rows = {r["node"]: r for r in json.loads(out)}
    assert rows["n2"]["state"] == "lost" and rows["n1"]["state"] == "live"
    lost = next(n for n in farm.status() if n["node"] == "n2")
    assert silenced_at - 1.0 <= lost["last_seen"] <= silenced_at + 0.5
    rc, out, _ = cli("agents", "--run", str(farm.run_dir), capsys=capsys)
    assert rc == 0 and any(ln.split()[:2] == ["n2", "lost"] and "ago" in ln for ln in out.splitlines())


def test_top_once_prints_every_node_sorted_by_the_chosen_column(farm, capsys):
    rc, out, _ = cli("top", "--run", str(farm.run_dir), "--once", "--sort", "node", "--desc",
                     "--width", "200", capsys=capsys)
    assert rc == 0
    rows = [ln for ln in out.splitlines() if "│ n" in ln]
    assert [r.split("│")[1].strip() for r in rows] == ["n2", "n1"]


def test_top_refuses_an_unknown_sort_column_and_lists_the_columns(farm, capsys):
    rc, _, err = cli("top", "--run", str(farm.run_dir), "--once", "--sort", "bogus", capsys=capsys)
    assert rc == 2 and "bogus" in err and "last_seen" in err


def test_sort_rows_puts_unknown_values_last():
    rows = [{"node": "a", "cpu": None}, {"node": "b", "cpu": 50.0}, {"node": "c", "cpu": 10.0}]
    assert [r["node"] for r in ops.sort_rows(rows, "cpu", descending=True)] == ["b", "c", "a"]


def test_drain_puts_the_node_in_draining_and_an_unknown_node_is_refused(farm, capsys):
    rc, out, _ = cli("drain", "n1", "--run", str(farm.run_dir), capsys=capsys)
    assert rc == 0 and "draining" in out
    wait_for(lambda: farm.states().get("n1") in ("draining", "drained"), 5, "n1 to drain")
    assert farm.states()["n2"] == "live"
    rc, _, err = cli("drain", "n9", "--run", str(farm.run_dir), capsys=capsys)
    assert rc == 2 and "n9" in err and "n2" in err


def test_ops_commands_without_a_controller_say_what_is_missing(tmp_path, capsys):
    rc, _, err = cli("agents", "--run", str(tmp_path), capsys=capsys)
    assert rc == 2 and "controller.endpoint" in err


# ------------------------------------------------------------------ health stream
def test_agents_append_health_lines_that_health_prints_per_node(farm, capsys):
    for a in farm.agents.values():   # the farm's agents got their samplers before the dir was known
        a.__dict__["_health_sampler"] = HealthSampler(a, farm.run_dir / "health")
    wait_for(lambda: all((farm.run_dir / "health" / f"{n}.jsonl").exists() for n in ("n1", "n2")),
             5, "health files of both agents")
    buf = io.StringIO()
    args = type("A", (), {"run": str(farm.run_dir), "node": "n1", "follow": False})()
    assert ops.cmd_health(args, out=buf) == 0
    samples = [json.loads(ln) for ln in buf.getvalue().splitlines()]
    assert samples and {s["node"] for s in samples} == {"n1"} and HEALTH_KEYS <= set(samples[0])


def test_health_follow_prints_lines_appended_after_it_started(tmp_path):
    run = tmp_path / "run"
    (run / "health").mkdir(parents=True)
    stream = run / "health" / "n7.jsonl"
    stream.write_text(json.dumps({"node": "n7", "seq": 0}) + "\n")
    proc = subprocess.Popen([sys.executable, "-m", "controller.cli", "health", "--follow", "--node", "n7",
                             "--run", str(run)], stdout=subprocess.PIPE, text=True, cwd=ROOT)
    try:
        def next_line() -> dict:
            ready, _, _ = select.select([proc.stdout], [], [], 10)
            assert ready, "no line from paddock health --follow within 10s"
            return json.loads(proc.stdout.readline())
        assert next_line()["seq"] == 0
        with open(stream, "a") as f:
            f.write(json.dumps({"node": "n7", "seq": 1}) + "\n")
        assert next_line()["seq"] == 1
    finally:
        proc.terminate()
        proc.wait(5)


# ------------------------------------------------------------------ Prometheus
def test_metrics_endpoint_serves_node_states_and_queue_counts_in_prometheus_text(farm):
    server, _thread = serve_metrics(farm.ctl.snapshot, 0, "127.0.0.1")
    try:
        url = f"http://127.0.0.1:{server.server_address[1]}/metrics"

        def scrape() -> dict:
            text = urllib.request.urlopen(url, timeout=5).read().decode()
            return {(s.name, tuple(sorted(s.labels.items()))): s.value
                    for fam in text_string_to_metric_families(text) for s in fam.samples}
        samples = wait_for(lambda: (m := scrape()).get(("paddock_nodes", (("state", "live"),))) == 2 and m,
                           5, "two live nodes in the metrics")
        assert samples[("paddock_node_up", (("node", "n1"), ("state", "live")))] == 1.0
        assert ("paddock_node_last_seen_timestamp_seconds", (("node", "n2"),)) in samples
        assert samples[("paddock_node_slots", (("node", "n1"),))] == 2.0
        assert any(name == "paddock_node_cpu_percent" for name, _ in samples)
        farm.silence("n2")
        wait_for(lambda: scrape().get(("paddock_node_up", (("node", "n2"), ("state", "lost")))) == 0.0,
                 HB_S * LIVENESS + 2.0, "n2 lost in the metrics")
    finally:
        server.shutdown()


def test_controller_process_serves_metrics_when_given_a_port(tmp_path):
    run = tmp_path / "run"
    run.mkdir()
    (run / "tasks.json").write_text("{}")
    ep = run / "controller.endpoint"
    proc = subprocess.Popen([sys.executable, "-m", "controller.broker", "--deployment", "m", "--run-dir", str(run),
                             "--tasks-json", str(run / "tasks.json"), "--endpoint-file", str(ep),
                             "--metrics-port", "0", "--metrics-addr", "127.0.0.1"], cwd=ROOT,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        wait_for(lambda: ep.exists() or proc.poll() is not None, 20, "the controller endpoint")
        assert proc.poll() is None, "controller exited"
        url = Path(str(ep) + ".metrics").read_text()
        assert url.startswith("http://127.0.0.1:")
        fams = {f.name for f in text_string_to_metric_families(urllib.request.urlopen(url, timeout=5).read().decode())}
        assert {"paddock_rollouts", "paddock_nodes", "paddock_controller_events"} <= fams
        with Client(ep.read_text(), "m", timeout_s=5, retries=1,
                    key_file=run / "controller.key") as c:
            c.shutdown("test over")
        assert proc.wait(10) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def test_process_tree_figures_are_refreshed_at_most_every_slow_interval(tmp_path):
    # Walking /proc for the tree RSS and the sandboxes' tmpfs costs 100-200 ms on a busy node:
    # they are cached between heartbeats for `slow_every_s` of the injected clock.
    now = [0.0]
    s = HealthSampler(_bare_agent(), clock=lambda: now[0], slow_every_s=5.0)
    calls = []
    real = s._tree_rss
    s._tree_rss = lambda: calls.append(now[0]) or real()
    for t in (0.0, 1.0, 4.9, 5.0, 6.0, 10.5):
        now[0] = t
        assert s.sample()["rss_mb"] > 0
    assert calls == [0.0, 5.0, 10.5]


# ------------------------------------------------------------------ the top screen (pure)
def _frame(nodes, width, height, **kw) -> list[str]:
    from rich.console import Console

    from controller.cli.top import TopView
    console = Console(width=width, height=height, record=True, file=io.StringIO(), color_system=None)
    console.print(TopView("run1", **kw).render(nodes, {"queued": 3}, width, height, now_wall=1000.0,
                                               now_mono=5.0))
    return console.export_text().rstrip("\n").split("\n")


def _node(i, state="live"):
    return {"node": f"node-{i:02d}", "state": state, "slots": 4, "slots_free": 1, "last_seen": 998.5,
            "health": {"sandboxes_active": 3, "mem_free_mb": 2048, "disk_free_mb": 512,
                       "rollouts_per_s": 0.5, "errors": {"bad_frames": 0, "infra_errors": 2}}}


def test_top_fits_a_hundred_nodes_into_80x24_and_says_how_many_are_not_shown():
    screen = _frame([_node(i, "lost" if i == 99 else "live") for i in range(100)], 80, 24)
    assert len(screen) <= 24 and max(map(len, screen)) <= 80
    assert "nodes 100: live 99, lost 1" in screen[0]
    assert any("more nodes (lost 1, draining 0)" in ln for ln in screen)


def test_top_marks_lost_and_draining_nodes_and_shows_headroom_and_heartbeat_age():
    screen = _frame([_node(1), _node(2, "draining"), _node(3, "lost")], 80, 24)
    rows = {ln.split("│")[1].strip(): [c.strip() for c in ln.split("│")[2:-1]]
            for ln in screen if ln.startswith("│ node")}
    assert rows["node-01"][:7] == ["live", "3/4", "3", "2.0G", "512M", "1.5s", "0.50"]
    assert rows["node-02"][0] == "DRAIN" and rows["node-03"][0] == "LOST"


def test_top_error_rate_is_per_minute_between_frames():
    from controller.cli.top import TopView
    view, n = TopView("r"), _node(1)
    assert view.rows([n], 1000.0, 0.0)[0]["err_per_min"] is None
    n["health"]["errors"] = {"infra_errors": 5}
    assert view.rows([n], 1010.0, 30.0)[0]["err_per_min"] == pytest.approx(6.0)


def test_an_agent_records_one_health_sample_as_it_stops_even_before_its_first_heartbeat():
    """A run shorter than one heartbeat still leaves the node's last state on record."""
    samples: list[int] = []
    agent = NodeAgent("n1", "tcp://127.0.0.1:1", "d", 2, None, None, insecure=True,
                      health=lambda: samples.append(1) or {})
    agent.stopped = True
    assert agent.run() == 0
    assert samples == [1]
