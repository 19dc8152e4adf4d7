"""A query on a live run while compaction replaces its shards: every committed row once, no
"No files found" (controller/store/catalog.py: the readers lock; controller/analysis/query.py).
The interleavings are injected: the compaction runs between `connect` (the file list) and the
query's read, or inside `connect` between reading the records and listing the shards. Real
Parquet, DuckDB, flock and (once) a real `paddock compact` process."""
from __future__ import annotations

import os
import subprocess
import sys

import controller.analysis.query as query
from controller.analysis.query import connect
from controller.store.catalog import Catalog, compact, compaction_holder
from tests.store.test_trajstore import _snapshot, attempt

COUNTS = "SELECT (SELECT count(*) FROM rollouts), (SELECT count(*) FROM steps), " \
         "(SELECT count(*) FROM checks), (SELECT count(*) FROM spans), (SELECT count(*) FROM egress)"


def _run(tmp_path, n=6):
    cat = Catalog(tmp_path)
    for i in range(n):
        attempt(tmp_path, f"r{i}", cat=cat)
    attempt(tmp_path, "late", commit=False, cat=cat)      # uncommitted: never visible, never moved
    cat.flush()
    return cat


def _shards(run):
    return sorted(p.relative_to(run).as_posix() for t in ("rollouts", "steps", "checks", "spans", "egress")
                  for p in (run / t).glob("*.parquet"))


def test_a_compaction_process_between_connect_and_the_query_loses_and_doubles_nothing(tmp_path):
    _run(tmp_path)
    before = _snapshot(tmp_path)
    con = connect(tmp_path)                 # the views name the per-attempt shards
    out = subprocess.run([sys.executable, "-m", "controller.cli", "compact", "--run", str(tmp_path)],
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert "compacted 30 shards into 5 files" in out.stdout
    # the query reads the files its connection listed: all still there, each row once
    assert con.execute(COUNTS).fetchone() == (6, 12, 6, 24, 12)
    assert sorted(con.execute("SELECT * FROM rollouts").fetchall(), key=repr) == before["rollouts"]
    assert con.execute("SELECT count(*) FROM bad_shards").fetchone()[0] == 0
    con.close()
    del con                                 # the connection is gone: its files may go
    assert _snapshot(tmp_path) == before    # a new connection reads the compacted files
    result = compact(tmp_path)
    assert (result.recovered, result.deferred) == (5, 0)      # the replaced sources unlinked now
    assert [s for s in _shards(tmp_path) if "compact-" not in s] == \
        sorted(f"{t}/{n}" for t in ("rollouts", "steps", "checks", "spans", "egress")
               for n in [p.name for p in (tmp_path / t).glob("*late*.parquet")])
    assert _snapshot(tmp_path) == before


def test_sources_a_reader_may_read_are_left_and_hidden_then_unlinked_by_the_next_compaction(tmp_path):
    _run(tmp_path)
    before = _snapshot(tmp_path)
    con = connect(tmp_path)
    result = compact(tmp_path)
    assert (result.sources, result.targets, result.deferred) == (30, 5, 5)
    listed = _shards(tmp_path)
    assert sum("compact-" in s for s in listed) == 5 and len(listed) == 5 + 30 + 5   # sources still there
    assert _snapshot(tmp_path) == before    # a second reader hides them (their record says so)
    assert con.execute(COUNTS).fetchone() == (6, 12, 6, 24, 12)
    assert compact(tmp_path).deferred == 5  # still held by `con`
    del con
    assert compact(tmp_path).deferred == 0
    assert len(_shards(tmp_path)) == 5 + 5
    assert _snapshot(tmp_path) == before


def test_a_compaction_finishing_while_connect_lists_the_shards_shows_each_row_once(tmp_path, monkeypatch):
    """The records are read, then a compaction puts its targets in place (its sources stay: the
    reader holds the lock), then the shards are listed: the new targets must not be read too."""
    _run(tmp_path)
    before = _snapshot(tmp_path)
    real = query._trusted_files
    seen = []

    def compact_then_list(runs, moved):
        seen.append(compact(tmp_path))
        return real(runs, moved)

    monkeypatch.setattr(query, "_trusted_files", compact_then_list)
    con = connect(tmp_path)
    monkeypatch.undo()
    assert seen[0].targets == 5
    assert con.execute(COUNTS).fetchone() == (6, 12, 6, 24, 12)
    assert sorted(con.execute("SELECT * FROM steps").fetchall(), key=repr) == before["steps"]
    # the catalog view still names the shards this connection reads
    assert con.execute("SELECT count(*) FROM catalog WHERE steps_shard LIKE '%compact-%'").fetchone()[0] == 0
    del con
    assert _snapshot(tmp_path) == before


def test_the_compaction_lock_names_its_holder(tmp_path, monkeypatch):
    """`compaction_holder` (what `paddock run` waits on, controller/farm/assemble.py) sees a
    running compaction, with its pid and host, and nothing once it is done."""
    import controller.store.catalog as catalog_mod
    _run(tmp_path, n=2)
    assert compaction_holder(tmp_path) is None
    seen = []
    real_group = catalog_mod._compact_group

    def during(*a, **kw):
        seen.append(compaction_holder(tmp_path))
        return real_group(*a, **kw)

    monkeypatch.setattr(catalog_mod, "_compact_group", during)
    compact(tmp_path)
    assert seen and seen[0] == (os.getpid(), os.uname().nodename)
    assert compaction_holder(tmp_path) is None
