"""The trajectory store: shards by node agents, the controller's catalog, DuckDB views, summary.

Real Parquet files on disk read by real DuckDB; no mocks.
"""
from __future__ import annotations

import argparse
import csv
import io
import json
import os
import re
import subprocess
import sys
from datetime import datetime, timedelta, timezone
from pathlib import Path

import pyarrow.parquet as pq
import pytest

from controller.analysis.query import (
    QueryError,
    RunNotFound,
    connect,
    execute,
    print_summary,
    query_command,
    run_query,
    summary,
)
from controller.cli.analysis import cmd_query, register
from controller.contracts.trajectory import CHECKS_SCHEMA, ROLLOUTS_SCHEMA, STEPS_SCHEMA, shard_name
from controller.store.catalog import Catalog, CatalogConflict
from nodeagent.store.writer import SchemaError, write_attempt

T0 = datetime(2025, 1, 2, 3, 4, 5, tzinfo=timezone.utc)


def rollout_row(rollout_id="r1", attempt=1, token=1, *, outcome="pass", reward=None,
                family="python", policy_version=0, wall_s=10.0, node="n1", **extra) -> dict:
    if reward is None and outcome != "infra_error":
        reward = 1.0 if outcome == "pass" else 0.0
    row = dict(
        run_id="run-a", rollout_id=rollout_id, attempt=attempt, fencing_token=token,
        batch_id="b0", task_id=f"sha256:{rollout_id}", task_name=f"task-{family}",
        task_family=family, taskset_hash="sha256:set", image_digest="sha256:img",
        verifier_version="v1", policy_version=policy_version, seed=7, node=node,
        outcome=outcome, reward=reward, reward_components={"tests": reward},
        tampered=False, infra_reason="sandbox died" if outcome == "infra_error" else None,
        started_at=T0, finished_at=T0 + timedelta(seconds=wall_s), wall_s=wall_s,
        agent_s=wall_s * 0.8, verify_s=wall_s * 0.2, steps=1, prompt_tokens=100,
        completion_tokens=20, limits={"memory_mb": 256}, answer="done", diff_bytes=12,
    )
    row.update(extra)
    return row


def step_row(step=0, **extra) -> dict:
    row = dict(step=step, role="assistant", content="ls", tool_name="bash",
               tool_args={"cmd": "ls"}, observation="a.py", exit_code=0, started_at=T0,
               wall_s=1.5, model_s=1.0, tool_s=0.5, prompt_tokens=100, completion_tokens=20,
               logprobs=None)
    row.update(extra)
    return row


def check_row(name="test_a", verdict="pass", **extra) -> dict:
    row = dict(check=name, verdict=verdict, detail=None, wall_s=0.25)
    row.update(extra)
    return row


def write(run_dir, node="n1", **kw) -> dict:
    return write_attempt(run_dir, node, rollout_row(node=node, **kw), [step_row(0), step_row(1)],
                         [check_row()])


def commit_and_flush(run_dir, *keys_and_shards):
    cat = Catalog(run_dir)
    for (rid, attempt, token), shards in keys_and_shards:
        cat.commit(rid, attempt, token, shards, committed_at=T0)
    cat.flush()
    return cat


def scalar(run_dir, sql):
    return execute(run_dir, sql)[1][0][0]


# -- writer ---------------------------------------------------------------------------------

def test_write_attempt_writes_one_named_shard_per_table(tmp_path):
    shards = write(tmp_path, rollout_id="r1", attempt=2, token=9)
    name = "n1-r1-a2-t9.parquet"
    assert shards == {t: f"{t}/{name}" for t in ("rollouts", "steps", "checks", "spans", "egress")}
    assert pq.read_schema(tmp_path / shards["rollouts"]).equals(ROLLOUTS_SCHEMA)
    assert pq.read_schema(tmp_path / shards["steps"]).equals(STEPS_SCHEMA)
    assert pq.read_schema(tmp_path / shards["checks"]).equals(CHECKS_SCHEMA)
    assert pq.read_table(tmp_path / shards["steps"]).num_rows == 2


def test_write_attempt_leaves_no_tmp_files(tmp_path):
    write(tmp_path, rollout_id="r1")
    write(tmp_path, rollout_id="r2")
    assert [p for p in tmp_path.rglob("*") if p.name.endswith(".tmp")] == []


def test_shard_name_escapes_path_separators():
    assert "/" not in shard_name("n/1", "../r 1", 1, 2)
    assert shard_name("n/1", "r", 1, 2).startswith("n%2F1-r-a1-t2")


def test_missing_column_is_a_schema_error_naming_it(tmp_path):
    row = rollout_row()
    del row["taskset_hash"]
    with pytest.raises(SchemaError, match=r"rollouts\.taskset_hash: missing"):
        write_attempt(tmp_path, "n1", row, [], [])
    assert not (tmp_path / "rollouts").exists()


def test_unknown_column_is_a_schema_error_naming_it(tmp_path):
    with pytest.raises(SchemaError, match="unknown column.*rewrad"):
        write_attempt(tmp_path, "n1", rollout_row(rewrad=1.0), [], [])


def test_missing_step_column_names_table_and_column(tmp_path):
    step = step_row()
    del step["model_s"]
    with pytest.raises(SchemaError, match=r"steps\.model_s: missing"):
        write_attempt(tmp_path, "n1", rollout_row(), [step], [])


def test_wrong_type_is_a_schema_error_naming_the_column(tmp_path):
    with pytest.raises(SchemaError, match=r"rollouts\.policy_version"):
        write_attempt(tmp_path, "n1", rollout_row(policy_version="v3"), [], [])


def test_null_in_non_nullable_column_is_a_schema_error(tmp_path):
    with pytest.raises(SchemaError, match=r"checks\.verdict.*not nullable"):
        write_attempt(tmp_path, "n1", rollout_row(), [], [check_row(verdict=None)])


def test_infra_error_must_have_null_reward(tmp_path):
    with pytest.raises(SchemaError, match=r"rollouts\.reward"):
        write_attempt(tmp_path, "n1", rollout_row(outcome="infra_error", reward=0.0), [], [])


def test_unknown_outcome_is_rejected(tmp_path):
    with pytest.raises(SchemaError, match=r"rollouts\.outcome"):
        write_attempt(tmp_path, "n1", rollout_row(outcome="error"), [], [])


def test_step_keys_that_disagree_with_the_rollout_are_rejected(tmp_path):
    with pytest.raises(SchemaError, match=r"steps\.fencing_token"):
        write_attempt(tmp_path, "n1", rollout_row(token=3), [step_row(fencing_token=2)], [])


def test_json_columns_accept_objects_and_store_json_text(tmp_path):
    shards = write(tmp_path)
    row = pq.read_table(tmp_path / shards["rollouts"]).to_pylist()[0]
    assert json.loads(row["reward_components"]) == {"tests": 1.0}
    assert row["started_at"] == T0


# -- catalog --------------------------------------------------------------------------------

def test_flush_writes_numbered_commit_files_and_never_rewrites(tmp_path):
    cat = Catalog(tmp_path)
    cat.commit("r1", 1, 1, {}, committed_at=T0)
    first = cat.flush()
    cat.commit("r2", 1, 2, {}, committed_at=T0)
    second = cat.flush()
    assert (first.name, second.name) == ("commit-000000.parquet", "commit-000001.parquet")
    assert pq.read_table(first).column("rollout_id").to_pylist() == ["r1"]
    assert cat.flush() is None


def test_catalog_restart_continues_numbering_and_remembers_keys(tmp_path):
    cat = Catalog(tmp_path)
    cat.commit("r1", 1, 1, {}, committed_at=T0)
    cat.flush()
    restarted = Catalog(tmp_path)
    assert restarted.committed_count() == 1
    assert restarted.commit("r1", 1, 1, {}, committed_at=T0) is False
    restarted.commit("r2", 1, 1, {}, committed_at=T0)
    assert restarted.flush().name == "commit-000001.parquet"


def test_committing_the_same_key_twice_writes_it_once(tmp_path):
    cat = Catalog(tmp_path)
    assert cat.commit("r1", 1, 5, {}, committed_at=T0) is True
    assert cat.commit("r1", 1, 5, {}, committed_at=T0) is False
    cat.flush()
    assert cat.commit("r1", 1, 5, {}, committed_at=T0) is False
    assert cat.flush() is None
    assert cat.committed_count() == 1
    rows = sum(pq.read_table(p).num_rows for p in (tmp_path / "catalog").glob("*.parquet"))
    assert rows == 1


def test_a_second_committed_attempt_for_a_rollout_is_a_conflict(tmp_path):
    cat = Catalog(tmp_path)
    cat.commit("r1", 1, 5, {}, committed_at=T0)
    with pytest.raises(CatalogConflict, match="r1"):
        cat.commit("r1", 2, 6, {}, committed_at=T0)


def test_pending_keys_are_counted_until_flushed(tmp_path):
    cat = Catalog(tmp_path)
    cat.commit("r1", 1, 1, {}, committed_at=T0)
    assert (cat.committed_count(), cat.pending_count()) == (1, 1)
    cat.flush()
    assert cat.pending_count() == 0


# -- views ----------------------------------------------------------------------------------

def test_views_show_only_committed_attempts(tmp_path):
    stale = write(tmp_path, node="n1", rollout_id="r1", attempt=1, token=1, outcome="fail")
    current = write(tmp_path, node="n2", rollout_id="r1", attempt=2, token=2)
    r2 = write(tmp_path, rollout_id="r2", attempt=1, token=3)
    write(tmp_path, rollout_id="r3", attempt=1, token=4)  # written, never committed
    assert stale != current
    commit_and_flush(tmp_path, (("r1", 2, 2), current), (("r2", 1, 3), r2))
    cols, rows = execute(tmp_path, "SELECT rollout_id, attempt, fencing_token, node "
                                   "FROM rollouts ORDER BY rollout_id")
    assert rows == [("r1", 2, 2, "n2"), ("r2", 1, 3, "n1")]
    assert scalar(tmp_path, "SELECT count(*) FROM steps") == 4
    assert scalar(tmp_path, "SELECT count(*) FROM checks") == 2


def test_a_stale_token_for_a_committed_attempt_is_excluded(tmp_path):
    old = write(tmp_path, node="n1", rollout_id="r1", attempt=1, token=1, outcome="fail")
    new = write(tmp_path, node="n1", rollout_id="r1", attempt=1, token=2)
    assert old["rollouts"] != new["rollouts"]
    commit_and_flush(tmp_path, (("r1", 1, 2), new))
    assert execute(tmp_path, "SELECT fencing_token, outcome FROM rollouts")[1] == [(2, "pass")]
    assert scalar(tmp_path, "SELECT count(DISTINCT fencing_token) FROM steps") == 1


def test_unflushed_commits_are_not_visible(tmp_path):
    shards = write(tmp_path, rollout_id="r1")
    Catalog(tmp_path).commit("r1", 1, 1, shards, committed_at=T0)
    assert scalar(tmp_path, "SELECT count(*) FROM rollouts") == 0


def test_empty_run_has_empty_views_with_schema_columns(tmp_path):
    con = connect(tmp_path)
    for table, schema in (("rollouts", ROLLOUTS_SCHEMA), ("steps", STEPS_SCHEMA),
                          ("checks", CHECKS_SCHEMA)):
        cols = [r[0] for r in con.execute(f"DESCRIBE {table}").fetchall()]
        assert cols == schema.names
        assert con.execute(f"SELECT count(*) FROM {table}").fetchone() == (0,)
    con.close()


def test_shards_without_any_catalog_give_empty_views(tmp_path):
    write(tmp_path, rollout_id="r1")
    assert scalar(tmp_path, "SELECT count(*) FROM rollouts") == 0


def test_a_tmp_file_lying_around_is_ignored(tmp_path):
    shards = write(tmp_path, rollout_id="r1")
    commit_and_flush(tmp_path, (("r1", 1, 1), shards))
    (tmp_path / "rollouts" / "n9-r1-a1-t1.parquet.tmp").write_bytes(b"PAR1 half a file")
    (tmp_path / "catalog" / "commit-000009.parquet.tmp").write_bytes(b"garbage")
    assert scalar(tmp_path, "SELECT count(*) FROM rollouts") == 1


def test_views_read_a_parent_directory_of_runs(tmp_path):
    for run in ("a", "b"):
        shards = write(tmp_path / run, rollout_id="r1")
        commit_and_flush(tmp_path / run, (("r1", 1, 1), shards))
    write(tmp_path / "c", rollout_id="r1")  # run c never committed r1
    assert scalar(tmp_path, "SELECT count(*) FROM rollouts") == 2


def test_views_work_on_a_hostile_path(tmp_path):
    run = tmp_path / "it's a \"run\"; rm -rf x"
    shards = write(run, rollout_id="r1")
    commit_and_flush(run, (("r1", 1, 1), shards))
    assert scalar(run, "SELECT count(*) FROM rollouts") == 1


# -- run_query ------------------------------------------------------------------------------

@pytest.fixture
def small_run(tmp_path):
    for i, outcome in enumerate(["pass", "fail", "pass"]):
        shards = write(tmp_path, rollout_id=f"r{i}", token=i + 1, outcome=outcome)
        commit_and_flush(tmp_path, ((f"r{i}", 1, i + 1), shards))
    return tmp_path


def test_run_query_csv_parses_back(small_run):
    out = io.StringIO()
    n = run_query(small_run, "SELECT rollout_id, outcome, reward, started_at FROM rollouts "
                             "ORDER BY rollout_id", fmt="csv", out=out)
    rows = list(csv.DictReader(io.StringIO(out.getvalue())))
    assert n == 3
    assert [(r["rollout_id"], r["outcome"], float(r["reward"])) for r in rows] == [
        ("r0", "pass", 1.0), ("r1", "fail", 0.0), ("r2", "pass", 1.0)]
    assert datetime.fromisoformat(rows[0]["started_at"]) == T0


def test_run_query_json_parses_back(small_run):
    out = io.StringIO()
    run_query(small_run, "SELECT outcome, count(*) AS n FROM rollouts GROUP BY outcome "
                         "ORDER BY outcome", fmt="json", out=out)
    assert json.loads(out.getvalue()) == [{"outcome": "fail", "n": 1}, {"outcome": "pass", "n": 2}]


def test_run_query_table_prints_columns_and_values(small_run):
    out = io.StringIO()
    run_query(small_run, "SELECT rollout_id FROM rollouts ORDER BY 1", fmt="table", out=out)
    assert "rollout_id" in out.getvalue() and "r2" in out.getvalue()


def test_bad_sql_is_a_query_error(small_run):
    with pytest.raises(QueryError, match="syntax error"):
        run_query(small_run, "SELEC nonsense", out=io.StringIO())


def test_missing_run_dir_is_run_not_found(tmp_path):
    with pytest.raises(RunNotFound, match="not found"):
        run_query(tmp_path / "nope", "SELECT 1", out=io.StringIO())


def _parse(argv):
    parser = argparse.ArgumentParser(prog="paddock")
    register(parser.add_subparsers())
    return parser.parse_args(argv)


def test_cmd_query_bad_sql_exits_2_with_one_line(small_run):
    err = io.StringIO()
    args = _parse(["query", "--run", str(small_run), "SELECT FROM WHERE"])
    assert args.func(args, out=io.StringIO(), err=err) == 2
    assert err.getvalue().count("\n") == 1 and "error" in err.getvalue()


def test_cmd_query_missing_run_exits_2(tmp_path):
    err = io.StringIO()
    args = _parse(["query", "--run", str(tmp_path / "nope"), "SELECT 1"])
    assert cmd_query(args, out=io.StringIO(), err=err) == 2
    assert "run directory not found" in err.getvalue()


def test_cmd_query_defaults_to_newest_run(tmp_path, monkeypatch):
    for name, mtime in (("old", 1_000), ("new", 2_000)):
        shards = write(tmp_path / "runs" / name, rollout_id=name)
        commit_and_flush(tmp_path / "runs" / name, ((name, 1, 1), shards))
        os.utime(tmp_path / "runs" / name, (mtime, mtime))
    monkeypatch.chdir(tmp_path)
    out = io.StringIO()
    args = _parse(["query", "--format", "csv", "SELECT rollout_id FROM rollouts"])
    assert cmd_query(args, out=out) == 0
    assert out.getvalue().splitlines() == ["rollout_id", "new"]


# -- summary --------------------------------------------------------------------------------

@pytest.fixture
def hand_built_run(tmp_path):
    """6 committed rollouts (one infra_error), one uncommitted pass, one stale-token pass."""
    rows = [  # (id, outcome, family, policy_version, wall_s)
        ("r1", "pass", "python", 0, 1.0),
        ("r2", "fail", "python", 0, 2.0),
        ("r3", "pass", "math", 1, 3.0),
        ("r4", "timeout", "math", 1, 4.0),
        ("r5", "pass", "python", 1, 5.0),
        ("r6", "infra_error", "python", 1, 100.0),
    ]
    cat = Catalog(tmp_path)
    for i, (rid, outcome, family, pv, wall) in enumerate(rows):
        shards = write(tmp_path, rollout_id=rid, token=10 + i, outcome=outcome, family=family,
                       policy_version=pv, wall_s=wall)
        cat.commit(rid, 1, 10 + i, shards, committed_at=T0)
    write(tmp_path, rollout_id="r7", token=50, outcome="pass")           # never committed
    write(tmp_path, rollout_id="r1", token=9, outcome="pass", wall_s=9)  # stale token
    cat.flush()
    return tmp_path


def test_summary_numbers_are_exact(hand_built_run):
    s = summary(hand_built_run)
    assert s["rollouts"] == 6
    assert s["outcomes"] == {"pass": 3, "fail": 1, "timeout": 1, "infra_error": 1, "judge_failed": 0}
    assert s["infra_errors"] == 1
    assert s["pass_rate"] == pytest.approx(3 / 5)  # infra_error is masked, not scored
    assert s["wall_s"]["p50"] == pytest.approx(3.5)  # median of 1,2,3,4,5,100
    assert s["wall_s"]["p99"] == pytest.approx(5 + 0.95 * 95)  # interpolated


def test_summary_groups_by_family_and_policy_version(hand_built_run):
    s = summary(hand_built_run)
    fam = {r["task_family"]: (r["rollouts"], r["passed"], r["pass_rate"]) for r in s["by_family"]}
    assert fam == {"math": (2, 1, 0.5), "python": (4, 2, pytest.approx(2 / 3))}
    ver = {r["policy_version"]: r["pass_rate"] for r in s["by_policy_version"]}
    assert ver == {0: 0.5, 1: pytest.approx(2 / 3)}
    fv = {(r["task_family"], r["policy_version"]): r["pass_rate"] for r in s["by_family_version"]}
    assert fv == {("math", 1): 0.5, ("python", 0): 0.5, ("python", 1): 1.0}


def test_summary_of_an_empty_run_has_no_rates(tmp_path):
    s = summary(tmp_path)
    assert (s["rollouts"], s["pass_rate"], s["wall_s"]["p50"]) == (0, None, None)


def test_print_summary_ends_with_the_query_command(hand_built_run):
    out = io.StringIO()
    print_summary(summary(hand_built_run), hand_built_run, out)
    text = out.getvalue()
    assert "60.0%" in text
    last = text.strip().splitlines()[-1]
    assert last.startswith(f'paddock query --run {hand_built_run} "SELECT ')


def test_query_command_survives_a_posix_shell(tmp_path):
    run = tmp_path / "it's a $run; `x`"
    sql = "SELECT \"a$b\", 'c\\d', `e` FROM rollouts"
    script = "paddock() { printf '%s\\n' \"$@\"; }; " + query_command(run, sql)
    argv = subprocess.run(["sh", "-c", script], capture_output=True, text=True,
                          check=True).stdout.split("\n")[:-1]
    assert argv == ["query", "--run", str(run), sql]


def test_catalog_flush_leaves_no_tmp_and_restart_removes_a_crashed_one(tmp_path):
    cat = Catalog(tmp_path)
    cat.commit("r1", 1, 1, {}, committed_at=T0)
    cat.flush()
    assert [p.name for p in (tmp_path / "catalog").iterdir()] == ["commit-000000.parquet"]
    (tmp_path / "catalog" / "commit-000001.parquet.tmp").write_bytes(b"crashed mid-write")
    restarted = Catalog(tmp_path)
    restarted.commit("r2", 1, 1, {}, committed_at=T0)
    assert restarted.flush().name == "commit-000001.parquet"
    assert sorted(p.name for p in (tmp_path / "catalog").iterdir()) == [
        "commit-000000.parquet", "commit-000001.parquet"]


def test_store_modules_do_not_import_zmq():
    code = ("import sys, controller.analysis.query, controller.store.catalog, nodeagent.store.writer; "
            "assert 'zmq' not in sys.modules, 'zmq imported'")
    subprocess.run([sys.executable, "-c", code], check=True)


def test_trajwriter_does_not_need_duckdb_or_the_controller():
    """The writer needs the shared base (the schema in controller.contracts, atomic writes in
    controller.ondisk) and nothing else of the controller: no zmq, no duckdb, no queue, broker
    or analysis."""
    code = ("import sys, nodeagent.store.writer; "
            "bad = [m for m in sys.modules if m in ('zmq', 'duckdb') or m.startswith(('zmq.', 'duckdb.')) "
            "or (m.startswith('controller.') and not m.startswith(('controller.contracts', 'controller.ondisk')))]; "
            "assert not bad, bad")
    subprocess.run([sys.executable, "-c", code], check=True)


def test_every_example_query_in_the_docs_runs(hand_built_run):
    doc = (Path(__file__).parents[2] / "docs" / "trajectories.md").read_text()
    queries = re.findall(r"```sql\n(.*?)```", doc, flags=re.S)
    assert len(queries) >= 4
    for sql in queries:
        execute(hand_built_run, sql)  # raises QueryError if the docs drifted from the schema


def test_a_lone_surrogate_the_policy_wrote_is_stored_as_a_replacement_character(tmp_path):
    """JSON lets a tool call's arguments carry "\\ud800", which no UTF-8 column can hold: the
    write must not fail (an attempt whose write fails is an infrastructure error, masked: the
    policy's own output would escape its reward)."""
    import duckdb
    step = step_row(0)
    step["observation"], step["content"] = "out \ud800 x", "\udfff"
    write_attempt(tmp_path, "n1", rollout_row(), [step], [])
    rows = duckdb.sql(f"SELECT observation, content FROM read_parquet('{tmp_path}/steps/*.parquet')").fetchall()
    assert rows == [("out \ufffd x", "\ufffd")]
