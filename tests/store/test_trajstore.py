"""Trajectory store, five tables: spans and egress, provenance on every row, bad shards,
the infra view, and compaction that never loses or duplicates a row. Real Parquet + DuckDB."""
from __future__ import annotations

import io
import os
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from controller.analysis.query import bad_shards, connect
from controller.cli.analysis import cmd_query, register
from controller.store.catalog import Catalog, compact
from nodeagent.store.writer import SchemaError, write_attempt
from tests.store.test_store import T0, check_row, rollout_row, step_row

SPANS = [{"kind": "sandbox_start", "name": "native", "step": None, "start_s": 0.0, "duration_s": 0.2},
         {"kind": "model_call", "name": "m", "step": 0, "start_s": 0.2, "duration_s": 1.0},
         {"kind": "tool_call", "name": "shell", "step": 0, "start_s": 1.2, "duration_s": 0.3},
         {"kind": "verification", "name": "pytest", "step": None, "start_s": 1.6, "duration_s": 0.5}]
EGRESS = [{"sandbox": "sb1", "host": "pypi.org", "port": 443, "address": "127.0.0.9",
           "verdict": "allow", "reason": "allowlisted", "ts": 1_700_000_000.0},
          {"sandbox": "sb1", "host": "evil.example", "port": "80", "address": None,
           "verdict": "deny", "reason": "not allowlisted", "ts": T0}]


def attempt(run, rid, attempt=1, token=1, node="n1", commit=True, cat=None, **kw):
    shards = write_attempt(run, node, rollout_row(rid, attempt, token, node=node, **kw),
                           [step_row(0), step_row(1)], [check_row()], spans=SPANS, egress=EGRESS)
    if commit:
        cat.commit(rid, attempt, token, shards, committed_at=T0)
    return shards


def q(run, sql):
    con = connect(run)
    try:
        return con.execute(sql).fetchall()
    finally:
        con.close()


def test_spans_and_egress_are_written_and_every_child_row_carries_provenance(tmp_path):
    cat = Catalog(tmp_path)
    attempt(tmp_path, "r1", cat=cat, policy_version=3)
    cat.flush()
    assert q(tmp_path, "SELECT kind, step, duration_s FROM spans ORDER BY start_s") == [
        ("sandbox_start", None, 0.2), ("model_call", 0, 1.0), ("tool_call", 0, 0.3),
        ("verification", None, 0.5)]
    assert q(tmp_path, "SELECT host, port, verdict FROM egress ORDER BY ts") == [
        ("pypi.org", 443, "allow"), ("evil.example", 80, "deny")]
    for table in ("steps", "checks", "spans", "egress"):
        rows = q(tmp_path, f"SELECT DISTINCT taskset_hash, task_id, image_digest, verifier_version, "
                           f"policy_version, limits ->> 'memory_mb' FROM {table}")
        assert rows == [("sha256:set", "sha256:r1", "sha256:img", "v1", 3, "256")], table


def test_a_span_of_an_unknown_kind_is_a_schema_error(tmp_path):
    with pytest.raises(SchemaError, match="spans.kind .row 0.: 'gpu'"):
        write_attempt(tmp_path, "n1", rollout_row("r1"), [], [],
                      spans=[{"kind": "gpu", "start_s": 0.0, "duration_s": 1.0}])
    assert not (tmp_path / "rollouts").exists()


def test_a_stale_token_attempt_never_appears_in_any_table(tmp_path):
    cat = Catalog(tmp_path)
    attempt(tmp_path, "r1", token=1, commit=False, cat=cat)      # lease expired
    attempt(tmp_path, "r1", token=2, cat=cat)                    # the current lease
    cat.flush()
    for table in ("rollouts", "steps", "checks", "spans", "egress"):
        assert q(tmp_path, f"SELECT DISTINCT fencing_token FROM {table}") == [(2,)], table


def test_infra_attempts_view_shows_uncommitted_retried_failures_with_their_reason(tmp_path):
    cat = Catalog(tmp_path)
    attempt(tmp_path, "r1", 1, 1, node="n2", commit=False, cat=cat, outcome="infra_error",
            infra_reason="sandbox_start: ENOSPC")
    attempt(tmp_path, "r1", 2, 2, cat=cat)                       # the retry passed
    cat.flush()
    assert q(tmp_path, "SELECT count(*) FROM rollouts WHERE outcome = 'infra_error'") == [(0,)]
    assert q(tmp_path, "SELECT node, infra_reason, committed FROM infra_attempts") == [
        ("n2", "sandbox_start: ENOSPC", False)]


def test_truncated_and_wrong_schema_shards_are_named_and_do_not_hide_good_ones(tmp_path):
    cat = Catalog(tmp_path)
    attempt(tmp_path, "good", cat=cat)
    trunc = attempt(tmp_path, "trunc", cat=cat)
    wrong = attempt(tmp_path, "wrong", cat=cat)
    cat.flush()
    path = tmp_path / trunc["rollouts"]
    path.write_bytes(path.read_bytes()[: path.stat().st_size // 2])
    pq.write_table(pa.table({"run_id": ["run-a"], "rollout_id": ["wrong"], "attempt": ["1"],
                             "fencing_token": [1]}), tmp_path / wrong["steps"])
    assert q(tmp_path, "SELECT rollout_id FROM rollouts ORDER BY 1") == [("good",), ("wrong",)]
    assert q(tmp_path, "SELECT DISTINCT rollout_id FROM steps ORDER BY 1") == [("good",), ("trunc",)]
    con = connect(tmp_path)
    bad = dict(bad_shards(con))
    con.close()
    assert "truncated" in bad[str(path)]
    assert "column 'attempt' is string, expected int32" in bad[str(tmp_path / wrong["steps"])]
    err, out = io.StringIO(), io.StringIO()
    import argparse
    args = argparse.Namespace(run=str(tmp_path), sql="SELECT count(*) FROM rollouts", format="csv")
    assert cmd_query(args, out=out, err=err) == 0
    assert f"skipped {path}" in err.getvalue() and out.getvalue() == "count_star()\n2\n"


def test_shards_written_before_provenance_columns_existed_still_read(tmp_path):
    cat = Catalog(tmp_path)
    shards = attempt(tmp_path, "old", cat=cat)
    attempt(tmp_path, "new", cat=cat)
    cat.flush()
    old = pq.read_table(tmp_path / shards["steps"])
    pq.write_table(old.drop_columns(["taskset_hash", "policy_version"]), tmp_path / shards["steps"])
    assert q(tmp_path, "SELECT rollout_id, taskset_hash FROM steps WHERE step = 0 ORDER BY 1") == [
        ("new", "sha256:set"), ("old", None)]


def _snapshot(run):
    con = connect(run)
    try:
        return {t: sorted(con.execute(f"SELECT * FROM {t}").fetchall(), key=repr)
                for t in ("rollouts", "steps", "checks", "spans", "egress")}
    finally:
        con.close()


def test_compaction_keeps_every_committed_row_once_and_leaves_uncommitted_shards(tmp_path):
    cat = Catalog(tmp_path)
    for i in range(6):
        attempt(tmp_path, f"r{i}", cat=cat)
    pending = attempt(tmp_path, "late", commit=False, cat=cat)
    cat.flush()
    before = _snapshot(tmp_path)
    result = compact(tmp_path)
    assert (result.sources, result.targets) == (30, 5)
    assert _snapshot(tmp_path) == before
    assert sorted(p.name for p in (tmp_path / "steps").iterdir()) == [
        "compact-000001.parquet", Path(pending["steps"]).name]
    # The catalog follows: it points at the compacted files.
    assert q(tmp_path, "SELECT DISTINCT steps_shard FROM catalog") == [("steps/compact-000001.parquet",)]
    # The late commit arrives after compaction and is visible.
    cat.commit("late", 1, 1, pending, committed_at=T0)
    cat.flush()
    assert q(tmp_path, "SELECT count(*) FROM rollouts") == [(7,)]
    assert compact(tmp_path).sources == 0 or q(tmp_path, "SELECT count(*) FROM rollouts") == [(7,)]


@pytest.mark.parametrize("crash_at", ["record", "rename"])
def test_a_compaction_interrupted_at_any_point_shows_each_row_once_and_is_finished_later(
        tmp_path, crash_at, monkeypatch):
    import controller.store.catalog as catalog_mod
    cat = Catalog(tmp_path)
    for i in range(4):
        attempt(tmp_path, f"r{i}", cat=cat)
    cat.flush()
    before = _snapshot(tmp_path)
    real_link, real_rename = os.link, os.rename

    class Crash(Exception):
        pass

    def link(src, dst, *a, **kw):
        if crash_at == "record" and str(dst).endswith(".parquet") and "/catalog/compact-" in str(dst):
            raise Crash()
        return real_link(src, dst, *a, **kw)

    def rename(src, dst, *a, **kw):
        if crash_at == "rename" and str(src).endswith(".parquet.tmp") and "/compact-" in str(dst):
            raise Crash()
        return real_rename(src, dst, *a, **kw)

    monkeypatch.setattr(catalog_mod.os, "link", link)
    monkeypatch.setattr(catalog_mod.os, "rename", rename)
    with pytest.raises(Crash):
        compact(tmp_path)
    monkeypatch.undo()
    assert _snapshot(tmp_path) == before              # nothing lost, nothing doubled
    result = compact(tmp_path)
    assert result.recovered == (1 if crash_at == "rename" else 0)
    assert _snapshot(tmp_path) == before
    leftovers = [p for p in tmp_path.rglob("*") if p.name.endswith((".tmp", ".ctmp"))]
    assert all(p.parent.name != "catalog" for p in leftovers)


def test_cli_compact(tmp_path):
    import argparse
    cat = Catalog(tmp_path)
    for i in range(3):
        attempt(tmp_path, f"r{i}", cat=cat)
    cat.flush()
    ap = argparse.ArgumentParser()
    register(ap.add_subparsers())
    args = ap.parse_args(["compact", "--run", str(tmp_path)])
    out = io.StringIO()
    assert args.func(args, out=out) == 0
    assert out.getvalue().startswith("compacted 15 shards into 5 files")


def test_a_catalog_row_naming_another_attempts_shard_does_not_make_it_visible(tmp_path):
    cat = Catalog(tmp_path)
    stale = attempt(tmp_path, "r1", token=1, commit=False, cat=cat)
    attempt(tmp_path, "r1", token=2, commit=False, cat=cat)
    cat.commit("r1", 1, 2, stale, committed_at=T0)      # wrong shard paths for this key
    cat.flush()
    assert q(tmp_path, "SELECT DISTINCT fencing_token FROM steps") == [(2,)]


def _bulk_spans(keys):
    n = len(keys)
    return pa.table({"run_id": ["run-a"] * n, "rollout_id": [k for k, _ in keys],
                     "attempt": [1] * n, "fencing_token": [t for _, t in keys],
                     "kind": ["model_call"] * n, "start_s": [0.0] * n,
                     "duration_s": [0.01 * (i + 1) for i in range(n)], "node": ["n1"] * n})


def test_write_batch_checks_columns_not_rows_and_names_the_problem(tmp_path):
    from nodeagent.store.writer import write_batch
    good = _bulk_spans([("a", 1)])
    with pytest.raises(SchemaError, match="spans: unknown column.s. colour"):
        write_batch(tmp_path, "spans", good.append_column("colour", pa.array(["red"])), "b.parquet")
    with pytest.raises(SchemaError, match=r"spans.kind: 1 value\(s\) not in"):
        write_batch(tmp_path, "spans", good.set_column(4, "kind", pa.array(["gpu"])), "b.parquet")
    with pytest.raises(SchemaError, match="spans.duration_s: 1 NULL"):
        write_batch(tmp_path, "spans", good.set_column(6, "duration_s", pa.nulls(1, pa.float64())),
                    "b.parquet")
    assert write_batch(tmp_path, "spans", good, "b.parquet") == "spans/b.parquet"


def test_a_bulk_shard_is_promoted_only_once_every_row_is_committed(tmp_path):
    from controller.store.catalog import span_summary_path
    from nodeagent.store.writer import write_batch
    write_batch(tmp_path, "spans", _bulk_spans([("a", 1), ("a", 1), ("b", 1), ("b", 9)]), "bulk.parquet")
    cat = Catalog(tmp_path)
    cat.commit("a", 1, 1, {}, committed_at=T0)
    cat.flush()
    assert compact(tmp_path).targets == 0                   # b is not committed yet
    assert q(tmp_path, "SELECT count(*) FROM spans") == [(2,)]
    cat.commit("b", 1, 1, {}, committed_at=T0)
    cat.flush()
    assert compact(tmp_path).targets == 0                   # (b, token 9) is stale: never promoted
    write_batch(tmp_path, "spans", _bulk_spans([("a", 1), ("b", 1)]), "bulk2.parquet")
    before = _snapshot(tmp_path)
    result = compact(tmp_path)
    assert (result.sources, result.targets, result.rows) == (1, 1, 2)
    assert _snapshot(tmp_path) == before
    assert sorted(p.name for p in (tmp_path / "spans").glob("*.parquet")) == [
        "bulk.parquet", "compact-000000.parquet"]
    assert span_summary_path(tmp_path / "spans" / "compact-000000.parquet").is_file()
