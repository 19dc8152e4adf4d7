"""`paddock query` is read-only, `query --export` is a real snapshot and compaction merges every
table, model_calls included. Runs are real: rollouts whose model calls went through a gateway
session to the scripted policy server, written by the node's shard writer and committed in
the catalog (tests/analysis/test_export.py's `real_run`).
"""
from __future__ import annotations

import os
import shutil
from pathlib import Path

import duckdb
import pytest

from controller.analysis.query import QueryError, execute, export
from controller.cli.main import main
from controller.store.catalog import compact
from tests.analysis.test_export import policy, real_run  # noqa: F401 - the fixture is used by name

TABLES = ("rollouts", "steps", "checks", "spans", "egress", "model_calls")


def tree(root: Path) -> dict[str, int]:
    return {str(p.relative_to(root)): p.stat().st_size for p in sorted(root.rglob("*"))}


@pytest.fixture
def run(tmp_path, policy):  # noqa: F811 - the fixture
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    real_run(run_dir, policy, n=3)
    return run_dir


def counts(run_dir: Path) -> dict[str, int]:
    return {t: execute(run_dir, f"SELECT count(*) FROM {t}")[1][0][0] for t in TABLES}


DESTRUCTIVE = [
    ("COPY (SELECT * FROM rollouts) TO '{run}/leak.csv'", "COPY"),
    ("COPY (SELECT * FROM rollouts) TO '{out}/leak.parquet' (FORMAT parquet)", "COPY"),
    ("EXPORT DATABASE '{out}/dump'", "EXPORT"),
    ("ATTACH '{out}/x.duckdb' AS x", "ATTACH"),
    ("INSERT INTO rollouts SELECT * FROM rollouts", "INSERT"),
    ("CREATE TABLE t AS SELECT 1", "CREATE"),
    ("CREATE OR REPLACE VIEW rollouts AS SELECT 1 AS x", "CREATE"),
    ("DROP VIEW rollouts", "DROP"),
    ("DELETE FROM rollouts", "DELETE"),
    ("UPDATE rollouts SET reward = 1", "UPDATE"),
    ("INSTALL httpfs", "LOAD"),
    ("LOAD httpfs", "LOAD"),
    ("SET enable_external_access = true", "SET"),
    ("RESET lock_configuration", "SET"),
    ("PRAGMA enable_profiling", "PRAGMA"),
    ("SELECT 1; COPY (SELECT 1) TO '{out}/second.csv'", "COPY"),
]


@pytest.mark.parametrize("sql,kind", DESTRUCTIVE, ids=[k + str(i) for i, (_s, k) in enumerate(DESTRUCTIVE)])
def test_a_statement_that_is_not_a_query_is_refused_and_writes_nothing(run, tmp_path, sql, kind, capsys, monkeypatch):
    out = tmp_path / "out"
    out.mkdir()
    monkeypatch.chdir(out)
    before_run, before_out = tree(run), tree(out)
    code = main(["query", "--run", str(run), sql.format(run=run, out=out)])
    err = capsys.readouterr().err
    assert code == 2, err
    assert f"read-only: a {kind} statement is refused" in err, err
    assert tree(run) == before_run and tree(out) == before_out
    assert counts(run)["rollouts"] == 3


@pytest.mark.parametrize("sql", ["SELECT * FROM read_csv('/etc/shadow')", "SELECT * FROM read_text('/etc/passwd')",
                                 "SELECT * FROM glob('/etc/*')", "SELECT * FROM read_parquet('/tmp/*.parquet')",
                                 "SELECT * FROM read_json('https://example.com/x.json')",
                                 "SELECT * FROM sqlite_scan('/etc/x.db', 't')"])
def test_a_query_cannot_read_files_outside_the_run(run, sql, capsys):
    code = main(["query", "--run", str(run), sql])
    err = capsys.readouterr().err
    assert code == 2, err
    assert "paddock query: error:" in err and "Traceback" not in err


def test_queries_and_explain_still_work(run, capsys):
    assert main(["query", "--run", str(run), "--format", "csv",
                 "SELECT count(*) AS n FROM model_calls WHERE status = 'ok'"]) == 0
    assert capsys.readouterr().out.splitlines()[1] != "0"
    assert main(["query", "--run", str(run), "EXPLAIN SELECT * FROM rollouts"]) == 0


def test_allow_write_copies_into_the_current_directory_only(run, tmp_path, monkeypatch, capsys):
    here = tmp_path / "here"
    here.mkdir()
    monkeypatch.chdir(here)
    assert main(["query", "--run", str(run), "--allow-write",
                 "COPY (SELECT rollout_id FROM rollouts) TO 'ids.csv'"]) == 0, capsys.readouterr().err
    assert len((here / "ids.csv").read_text().splitlines()) == 4
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    assert main(["query", "--run", str(run), "--allow-write",
                 f"COPY (SELECT 1) TO '{elsewhere}/x.csv'"]) == 2
    assert main(["query", "--run", str(run), "--allow-write", "ATTACH 'x.duckdb'"]) == 2
    assert "read-only: a ATTACH statement" in capsys.readouterr().err
    assert list(elsewhere.iterdir()) == [] and sorted(p.name for p in here.iterdir()) == ["ids.csv"]


def test_export_is_a_snapshot_that_survives_moving_and_compacting_the_run(run, tmp_path):
    want = counts(run)
    assert want["model_calls"] > 3
    snap = export(run, tmp_path / "snap.duckdb")
    moved = tmp_path / "moved"
    shutil.move(str(run), moved)
    compact(moved, min_sources=2)
    shutil.rmtree(moved)
    con = duckdb.connect(str(snap), read_only=True)
    try:
        got = {t: con.execute(f"SELECT count(*) FROM {t}").fetchone()[0] for t in TABLES}
        assert got == want
        assert con.execute("SELECT count(*) FROM catalog").fetchone()[0] == 3
    finally:
        con.close()


def test_export_into_a_missing_directory_fails_and_creates_nothing(run, tmp_path):
    with pytest.raises(QueryError, match="does not exist"):
        export(run, tmp_path / "nope" / "snap.duckdb")
    assert not (tmp_path / "nope").exists()


def test_compaction_merges_model_calls_and_loses_no_row(run):
    want = counts(run)
    before = sorted(os.listdir(run / "model_calls"))
    assert len(before) == 3
    compact(run)
    after = sorted(os.listdir(run / "model_calls"))
    assert len(after) == 1 and after[0].startswith("compact-"), after
    for t in TABLES:
        files = [p for p in (run / t).glob("*.parquet")]
        assert len(files) == 1, (t, files)
    assert counts(run) == want


@pytest.mark.parametrize("argv", [["query", "--run", "{missing}", "SELECT 1"],
                                  ["query", "--run", "{plain}", "SELECT 1"],
                                  ["query", "--run", "{missing}", "--export", "{tmp}/x.duckdb"]])
def test_query_on_a_missing_or_non_run_directory_fails_and_creates_nothing(tmp_path, argv, capsys):
    plain = tmp_path / "plain"
    plain.mkdir()
    (plain / "notes.txt").write_text("hello")
    before = tree(tmp_path)
    args = [a.format(missing=tmp_path / "missing", plain=plain, tmp=tmp_path) for a in argv]
    assert main(args) == 2
    assert "paddock query: error:" in capsys.readouterr().err
    assert tree(tmp_path) == before
