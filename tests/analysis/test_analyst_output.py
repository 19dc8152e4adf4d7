"""What an analyst reads must not mislead (issue 27, item 5): `SELECT *` in the table format
shows values, band-movement lists say how many names they leave out, the "no hack suspects"
sentence says which families the effort rule exempts, pass@k takes any k, a span chart's ticks
never read "1e+03 ms", `verify --answer` needs no `--solution`, a bad task `.json` is a usage
error (exit 2) naming the file, `export -o` works as the README writes it. Real runs (the
gateway's model calls to the scripted policy, written by the node's shard writer).
"""
from __future__ import annotations

import io
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from controller.analysis import report_render
from controller.analysis.charts import fmt_tick, nice_ticks, time_scale
from controller.cli.main import main
from tests.analysis.test_export import policy, real_run  # noqa: F401 - the fixture is used by name

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture
def run(tmp_path, policy):  # noqa: F811 - the fixture
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    real_run(run_dir, policy, n=3)
    return run_dir


def test_select_star_in_the_table_format_shows_every_value(run, capsys):
    assert main(["query", "--run", str(run), "SELECT * FROM rollouts ORDER BY rollout_id"]) == 0
    out = capsys.readouterr().out
    for value in ("rollout_id", "r0", "r2", "task-python", "sha256:img", "outcome", "pass"):
        assert value in out, out[:2000]


def test_a_narrow_result_is_still_a_table(run, capsys):
    assert main(["query", "--run", str(run), "SELECT rollout_id, outcome FROM rollouts ORDER BY 1"]) == 0
    out = capsys.readouterr().out
    assert "┃ rollout_id ┃ outcome ┃" in out and "│ r1         │ pass    │" in out


def test_band_movement_lists_say_how_many_names_they_leave_out():
    row = {"policy_version": 3, "entered": 11, "left": 2, "entered_from": {"too_hard": 11},
           "left_to": {"too_easy": 2}, "entered_tasks": [f"t{i}" for i in range(8)],
           "left_tasks": ["a", "b"], "entered_unlisted": 3, "left_unlisted": 0}
    buf = io.StringIO()
    report_render._text_movement({"band_movement": [row]}, buf.write)
    text = buf.getvalue()
    assert "t7, … and 3 more" in text and "out: a, b\n" in text
    assert report_render.listed_names(["x"], 1) == "x"


def test_no_hack_suspects_says_which_families_the_effort_rule_exempts():
    rep = {"pass_rates": [], "band_occupancy": [], "hack_suspects": [], "span_percentiles": [],
           "hack_rule": {"min_reward": 1.0, "max_steps": 2, "max_diff_bytes": 64, "answer_families": ["math"]}}
    line = next(ln for ln in report_render.glance(rep) if ln.startswith("hack suspects"))
    assert "math family is exempt" in line
    assert "math family is exempt" in report_render.empty_sentence("hack_suspects", rep)


def test_pass_at_k_for_any_k(run, capsys):
    assert main(["report", "--run", str(run), "--json", "--k", "2,3"]) == 0
    rep = json.loads(capsys.readouterr().out)
    assert sorted({r["k"] for r in rep["pass_at_k"]}) == [2, 3]
    assert all(r["pass_at_k"] == 1.0 for r in rep["pass_at_k"])
    with pytest.raises(SystemExit) as exc:
        main(["report", "--run", str(run), "--k", "0"])
    assert exc.value.code == 2


def test_span_chart_ticks_never_use_an_exponent():
    assert fmt_tick(1000.0, "ms") == "1,000 ms"
    assert fmt_tick(25000.0) == "25,000"
    assert fmt_tick(0.25, "s") == "0.25 s"
    # a 0.95 s p99 draws ticks up to 1 s: the chart's unit is the top tick's
    assert time_scale(nice_ticks(0.95)[-1]) == (1.0, "s")


def test_export_dash_o_as_the_readme_writes_it(run, tmp_path):
    out = tmp_path / "samples.parquet"
    proc = subprocess.run([sys.executable, "-m", "controller.cli.main", "export", "--run", str(run),
                           "--format", "hf", "-o", str(out)], cwd=ROOT, capture_output=True, text=True,
                          env=dict(os.environ, PYTHONPATH=str(ROOT)), timeout=60)
    assert proc.returncode == 0, proc.stderr
    assert out.is_file() and json.loads(proc.stdout)["out"] == str(out)


MATH_TASK = {"name": "one-plus-one", "family": "math", "instruction": "What is 1+1?",
             "checker": {"kind": "math", "answer": "2"}}


def _verify(*argv: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "controller.cli.main", "verify", *argv], cwd=ROOT,
                          capture_output=True, text=True, env=dict(os.environ, PYTHONPATH=str(ROOT)), timeout=120)


def test_verify_grades_an_answer_alone(tmp_path, python_image):
    task = tmp_path / "task.json"
    task.write_text(json.dumps(MATH_TASK))
    proc = _verify("--task", str(task), "--answer", "\\boxed{2}")
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout)["outcome"] == "pass"
    proc = _verify("--task", str(task))
    assert proc.returncode == 2 and "--solution PATH, --answer TEXT" in proc.stderr


@pytest.mark.parametrize("content,needle", [("[1, 2]", "must be a JSON object"),
                                            ("{", "not valid JSON"),
                                            (json.dumps(dict(MATH_TASK, limits={"pids": 0})), "'pids'"),
                                            (json.dumps(dict(MATH_TASK, family="poetry")), "'family'"),
                                            (json.dumps({"name": "x"}), "not a valid task")])
def test_a_bad_task_json_is_a_usage_error_naming_the_file(tmp_path, content, needle):
    task = tmp_path / "bad.json"
    task.write_text(content)
    proc = _verify("--task", str(task), "--answer", "2")
    assert proc.returncode == 2, (proc.returncode, proc.stdout, proc.stderr)
    assert str(task) in proc.stderr and needle in proc.stderr and "Traceback" not in proc.stderr
