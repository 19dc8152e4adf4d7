"""Record and replay: committed rollouts of a small local run re-executed from their records
reach the same verdict in fresh sandboxes."""
from __future__ import annotations

import json

import pytest

from controller.analysis.query import connect
from controller.analysis.replay import ReplayError, load, replay
from controller.demo.localrun import RunConfig, run_local
from nodeagent.agent.replay import ReplayModel, reexecute
from nodeagent.harness.model import ModelError
from nodeagent.verifier.validate import validate_for_run

pytestmark = [pytest.mark.slow, pytest.mark.sandbox]


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory, python_image):
    runs = tmp_path_factory.mktemp("runs")
    return run_local(validate=validate_for_run, cfg=RunConfig(versions=1, tasks_limit=4, runs_dir=str(runs), heartbeat_interval_s=0.5))


def test_a_sample_of_the_run_replays_to_the_same_verdict(run_dir, runtime):
    con = connect(run_dir)
    ids = [r[0] for r in con.execute("SELECT rollout_id FROM rollouts ORDER BY rollout_id").fetchall()]
    con.close()
    assert len(ids) >= 2    # tasks whose reference fails are quarantined before the run
    for rid in ids[::2]:
        report = replay(run_dir, rid, reexecute, runtime=runtime)
        assert report.same_verdict, report.line()
        assert report.steps_replayed == report.steps_recorded and report.infra_reason is None, report.line()


def test_the_replay_model_serves_the_recorded_messages_in_order_then_refuses(run_dir):
    con = connect(run_dir)
    rid = con.execute("SELECT rollout_id FROM steps WHERE tool_name IS NOT NULL LIMIT 1").fetchone()[0]
    con.close()
    rec = load(run_dir, rid)
    model = ReplayModel(rec.steps)
    first = model.complete({}, 1.0)["choices"][0]["message"]
    assert first["content"] == rec.steps[0]["content"]
    assert [c["function"]["name"] for c in first["tool_calls"]] == rec.steps[0]["tool_name"].split(",")
    assert json.loads(rec.steps[0]["tool_args"])[0]["arguments"] == first["tool_calls"][0]["function"]["arguments"]
    for _ in rec.steps[1:]:
        model.complete({}, 1.0)
    with pytest.raises(ModelError, match="replay diverged"):
        model.complete({}, 1.0)


def test_cli_replays_and_an_unknown_rollout_is_a_clear_error(run_dir, capsys):
    from controller.cli.main import main
    con = connect(run_dir)
    rid = con.execute("SELECT rollout_id FROM rollouts ORDER BY rollout_id LIMIT 1").fetchone()[0]
    con.close()
    assert main(["replay", rid, "--run", str(run_dir)]) == 0
    assert "same verdict" in capsys.readouterr().out
    assert main(["replay", "no-such-rollout", "--run", str(run_dir)]) == 2
    assert "no committed attempt" in capsys.readouterr().err
    with pytest.raises(ReplayError):
        load(run_dir, "no-such-rollout")


def test_a_step_recorded_with_a_bare_argument_object_replays_as_one_call():
    model = ReplayModel([{"step": 0, "content": "x", "tool_name": "shell", "tool_args": '{"command": "ls"}',
                          "prompt_tokens": 3, "completion_tokens": 2, "logprobs": None}])
    msg = model.complete({}, 1.0)["choices"][0]["message"]
    assert msg["tool_calls"] == [{"id": "call_0", "type": "function",
                                  "function": {"name": "shell", "arguments": '{"command": "ls"}'}}]
