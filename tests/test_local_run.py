"""The local farm run end to end, at a smaller count: real processes, ZeroMQ, sandboxes, Parquet."""
from __future__ import annotations

import json

import pytest

from controller.query import connect, summary
from controller.run import ConfigError, RunConfig, run_local

pytestmark = [pytest.mark.slow, pytest.mark.sandbox]

ROLLOUT_COLUMNS = {"run_id", "rollout_id", "attempt", "task_id", "task_family", "policy_version", "outcome",
                   "reward", "node", "started_at", "finished_at", "wall_s"}


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory, python_image):
    runs = tmp_path_factory.mktemp("runs")
    return run_local(RunConfig(versions=2, tasks_limit=16, runs_dir=str(runs), heartbeat_interval_s=0.5))


def test_every_requested_rollout_is_committed_once(run_dir):
    con = connect(run_dir)
    n, distinct = con.execute("SELECT count(*), count(DISTINCT rollout_id) FROM rollouts").fetchone()
    assert n == distinct == 2 * 16


def test_rollouts_view_has_the_stable_columns(run_dir):
    cols = {d[0] for d in connect(run_dir).execute("SELECT * FROM rollouts LIMIT 0").description}
    assert ROLLOUT_COLUMNS <= cols


def test_both_node_agents_ran_rollouts_and_none_was_an_infra_error(run_dir):
    con = connect(run_dir)
    nodes = {r[0] for r in con.execute("SELECT DISTINCT node FROM rollouts").fetchall()}
    assert nodes == {"local-1", "local-2"}
    assert con.execute("SELECT count(*) FROM rollouts WHERE outcome = 'infra_error'").fetchone()[0] == 0


def test_cheats_never_score(run_dir):
    con = connect(run_dir)
    rows = con.execute("SELECT s.content, r.reward FROM rollouts r JOIN steps s USING (rollout_id, attempt) "
                       "WHERE s.step = 0").fetchall()
    plans = {}
    for content, reward in rows:
        plans.setdefault(content.splitlines()[0], []).append(reward)
    for plan, rewards in plans.items():
        if any(c in plan for c in ("edit_tests", "delete_tests", "fake_pass", "claim_passed", "peek")):
            assert set(rewards) == {0.0}, plan


def test_summary_counts_match_the_views(run_dir):
    s = summary(run_dir)
    assert s["rollouts"] == 32
    meta = json.loads((run_dir / "run.json").read_text())
    assert meta["taskset"] == "builtin-v1"


def test_invalid_config_names_the_key(tmp_path):
    bad = tmp_path / "cfg.yaml"
    bad.write_text("versions: 3\nslotz: 2\n")
    with pytest.raises(ConfigError, match="slotz"):
        RunConfig.load(str(bad), {})
    with pytest.raises(ConfigError, match="versions"):
        RunConfig.load(None, {"versions": 0})
