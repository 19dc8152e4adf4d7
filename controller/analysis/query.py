"""DuckDB views over a run's trajectory store and the run summary (`paddock query` is
controller/cli/analysis.py).

`connect(run_dir)` opens an in-memory DuckDB connection with views `rollouts`, `steps`,
`checks`, `spans`, `egress`, `model_calls` (one row per model call through the node's gateway:
its shards are read through the catalog's committed keys), `catalog`, `infra_attempts` and `bad_shards`. A shard row appears in a view only if its (rollout_id, attempt,
fencing_token) is in the catalog of the same run directory: a shard with no catalog entry
(crashed node, attempt still in flight) or a stale token never appears. A table with no
shards yet is an empty view with the schema's columns. `run_dir` may also be a parent
directory (such as `runs/`) holding several runs; the views then cover all of them.

The set of shard files is listed when `connect` is called: a connection is a snapshot.
Files ending in `.tmp` (a writer in progress) are never read. A truncated or wrong-schema
shard is left out and listed in `bad_shards`; it never hides the good ones. Files replaced by
a finished compaction are hidden (see controller/store/catalog.py).

A live run may be compacted under a connection: `connect` holds each run's readers lock
(`reader_hold`: a shared flock on its catalog/) from before it reads the compaction records
until the connection object is gone, so no file the views name is unlinked; a target put in
place after that read is not read (its sources are): each row is in the views exactly once.

Read-only by construction (docs/trajectories.md, "Read-only queries"): a connection from
`connect` has DuckDB's external access disabled, file access limited to the run directories
(`allowed_directories`) and its configuration locked, so SQL cannot read host files
(`read_csv('/etc/shadow')`), attach databases, install or load extensions, or undo the lock
(`SET`, `RESET`, `PRAGMA`). `execute` also accepts only SELECT and EXPLAIN statements (and CREATE MACRO): a COPY,
INSERT, CREATE, DROP, ATTACH or any other is refused with a QueryError before it runs (with
`allow_write`, COPY ... TO and EXPORT DATABASE may write into `write_dir` and nowhere else).

`export` writes a real snapshot: every view copied into tables of a new DuckDB file, which
keeps working after the run directory is compacted, moved or deleted.

Must not import: zmq, sqlite3 (it never writes to the run directory).
"""
from __future__ import annotations

import csv
import json
import logging
import math
import os
import shlex
import sys
import weakref
from datetime import date, datetime, time
from decimal import Decimal
from pathlib import Path
from typing import Any, TextIO

import duckdb
import pyarrow as pa
import pyarrow.parquet as pq
from rich.console import Console
from rich.table import Table

from controller.analysis.defences import defence_lines, defences
from controller.analysis.sqlguard import QueryError, check_statements, lock_down, query_deadline
from controller.contracts.states import OUTCOMES
from controller.contracts.trajectory import KEY_COLUMNS, SCHEMAS, SHARD_TABLES, shard_suffix
from controller.store.catalog import CATALOG_DIR, CATALOG_SCHEMA, COMPACT_PREFIX, reader_hold, span_summary_path

CATALOG_KEYS = ("rollout_id", "attempt", "fencing_token")

log = logging.getLogger(__name__)

FORMATS = ("table", "csv", "json")
RUN_MARKERS = (*SHARD_TABLES, CATALOG_DIR, "run.json")
EXAMPLE_SQL = ("SELECT task_family, policy_version, count(*) AS n, "
               "avg((outcome = 'pass')::INT) AS pass_rate FROM rollouts "
               "WHERE outcome <> 'infra_error' GROUP BY ALL ORDER BY ALL")

# The run directory of a shard or catalog file: strip "/<table>/<file>" from its path.
_RUN_OF = "regexp_replace({col}, '/[^/]+/[^/]+$', '')"


class RunNotFound(QueryError):
    """The run directory does not exist (or no run directory could be chosen)."""


# -- views ----------------------------------------------------------------------------------

def connect(run_dir: str | Path, database: str = ":memory:", lock: bool = True,
            write_dir: str | Path | None = None) -> duckdb.DuckDBPyConnection:
    """A DuckDB connection with committed-only views over one run (or a runs/ dir).

    Views: one per table in SCHEMAS (rollouts, steps, checks, spans, egress), `catalog`,
    `infra_attempts` (every infra_error attempt, committed or not, with its reason) and
    `bad_shards` (files skipped because they are truncated or have the wrong schema).
    `database`: in memory (default), or a new DuckDB file. `lock`: make the connection
    read-only to the file system (see the module docstring); `write_dir`: the one directory
    besides the run directories that it may touch (COPY ... TO with --allow-write).
    """
    runs = _run_dirs(Path(run_dir))
    con = duckdb.connect(database)
    holds = [fd for run in runs if (fd := reader_hold(run)) is not None]  # before the records
    weakref.finalize(con, _let_go, holds)   # compaction may unlink files once the connection is gone
    try:
        con.execute("SET TimeZone = 'UTC'")
    except duckdb.Error:  # ICU missing: timestamps still read correctly, shown in local time
        pass
    bad: list[tuple[str, str]] = []
    try:
        moved = _Compacted(runs, bad)
        _create_catalog_view(con, runs, moved, bad)
        trusted = _trusted_files(runs, moved)
        for table, schema in SCHEMAS.items():
            _create_table_view(con, table, schema, runs, moved, bad, trusted)
        _create_infra_view(con, runs, moved, trusted)
        _create_span_summary_views(con, runs, moved, trusted)
        _table(con, "_bad_shards", pa.table({"file": [b[0] for b in bad],
                                               "error": [b[1] for b in bad]},
                                              schema=pa.schema([("file", pa.string()),
                                                                ("error", pa.string())])))
        con.execute("CREATE VIEW bad_shards AS SELECT * FROM _bad_shards")
        if lock:
            lock_down(con, runs, write_dir)
    except duckdb.Error as exc:
        con.close()
        raise QueryError(f"cannot open the trajectory store at {run_dir}: {_one_line(exc)}") \
            from None
    return con


def _let_go(holds: list[int]) -> None:
    for fd in holds:
        os.close(fd)
    holds.clear()


def _table(con: duckdb.DuckDBPyConnection, name: str, data: pa.Table) -> None:
    """Make an Arrow table visible as `name`: registered in memory, or stored in a file
    database (a registration would not outlive the connection)."""
    if con.execute("SELECT current_database() = 'memory'").fetchall()[0][0]:
        con.register(name, data)
    else:
        con.register("_arrow_in", data)
        con.execute(f'CREATE OR REPLACE TABLE "{name}" AS SELECT * FROM _arrow_in')
        con.unregister("_arrow_in")


EXPORTED_VIEWS = (*SCHEMAS, "catalog", "infra_attempts", "bad_shards")


def export(run_dir: str | Path, path: str | Path) -> Path:
    """Write a DuckDB database file holding a snapshot of the committed rows of `run_dir`: each
    view of `connect` (rollouts, steps, checks, spans, egress, model_calls, catalog,
    infra_attempts, bad_shards) copied into a table of the same name, plus `export_info`
    (source run directories, time). The file depends on nothing else: it keeps working after
    the run is compacted, moved or deleted. Open it with your own DuckDB (`duckdb FILE`).
    Written under a temporary name and renamed, so a reader never sees half a file."""
    path = Path(path)
    if not path.parent.is_dir():
        raise QueryError(f"cannot write {path}: directory {path.parent} does not exist")
    runs = _run_dirs(Path(run_dir))
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    tmp.unlink(missing_ok=True)
    con = connect(run_dir, lock=False)
    try:
        con.execute(f"ATTACH '{_sql_str(tmp)}' AS snap")
        for name in EXPORTED_VIEWS:
            con.execute(f'CREATE TABLE snap."{name}" AS SELECT * FROM "{name}"')
        con.execute("CREATE TABLE snap.export_info AS SELECT unnest(?::VARCHAR[]) AS run_dir, "
                    "now() AS exported_at", [[str(r) for r in runs]])
        con.execute("DETACH snap")
        os.replace(tmp, path)
    except duckdb.Error as exc:
        raise QueryError(f"cannot export {run_dir} to {path}: {_one_line(exc)}") from None
    finally:
        con.close()
        tmp.unlink(missing_ok=True)
        tmp.with_name(tmp.name + ".wal").unlink(missing_ok=True)
    return path


def _sql_str(value: str | Path) -> str:
    return str(value).replace("'", "''")


def bad_shards(con: duckdb.DuckDBPyConnection) -> list[tuple[str, str]]:
    """(file, error) of every shard `connect` skipped."""
    return con.execute("SELECT file, error FROM bad_shards ORDER BY file").fetchall()


def require_run(root: str | Path) -> list[Path]:
    """The run directories of `root` (a run, or a directory of runs); RunNotFound when it is
    missing, or holds no run at all (an empty directory included): for commands that write
    something about a run (export, compact), where an empty answer would hide a wrong path."""
    runs = _run_dirs(Path(root))
    if not any((r / m).exists() for r in runs for m in RUN_MARKERS):
        raise RunNotFound(f"{Path(root).resolve()} is not a run directory (no run.json, catalog/ or "
                          f"shard tables), nor a directory of runs")
    return runs


def _run_dirs(root: Path) -> list[Path]:
    if not root.is_dir():
        raise RunNotFound(f"run directory not found: {root}")
    root = root.resolve()
    if any((root / m).exists() for m in RUN_MARKERS):
        return [root]
    children = sorted(p for p in root.iterdir()
                      if p.is_dir() and any((p / m).exists() for m in RUN_MARKERS))
    if not children and not any(root.iterdir()):
        return [root]               # a run that has written nothing yet: empty views
    if not children:
        raise RunNotFound(f"{root} is not a run directory (no run.json, catalog/ or shard "
                          f"tables), nor a directory of runs")
    return children


def _parquet_files(runs: list[Path], table: str) -> list[str]:
    files: list[str] = []
    for run in runs:
        d = run / table
        if d.is_dir():
            files.extend(str(p) for p in sorted(d.glob("*.parquet")) if p.is_file())
    return files


# Footer checks are cached per (path, size, mtime): a shard is immutable once renamed in.
_FOOTER_CACHE: dict[tuple[str, int, int], tuple[frozenset[str], str | None]] = {}


def check_shard(path: str, schema: pa.Schema,
                keys: tuple[str, ...] = KEY_COLUMNS) -> tuple[frozenset[str], str | None]:
    """(columns present, error or None) of one shard file, from its Parquet footer."""
    try:
        st = os.stat(path)
    except OSError as exc:
        return frozenset(), f"cannot stat: {exc.strerror}"
    key = (path, st.st_size, st.st_mtime_ns)
    hit = _FOOTER_CACHE.get(key)
    if hit is not None:
        return hit
    try:
        found = pq.read_schema(path)
    except (OSError, pa.ArrowException) as exc:
        result = (frozenset(), f"unreadable Parquet (truncated?): {_one_line(exc)}")
    else:
        result = (frozenset(found.names), _schema_mismatch(found, schema, keys))
    if len(_FOOTER_CACHE) > 200_000:
        _FOOTER_CACHE.clear()
    _FOOTER_CACHE[key] = result
    return result


def _schema_mismatch(found: pa.Schema, want: pa.Schema, keys: tuple[str, ...]) -> str | None:
    for name in keys:
        if name not in found.names:
            return f"wrong schema: key column {name!r} is missing"
    for field in want:
        idx = found.get_field_index(field.name)
        if idx < 0:
            continue
        got = found.field(idx).type
        if not (got.equals(field.type) or (pa.types.is_string(field.type)
                                           and pa.types.is_large_string(got))):
            return f"wrong schema: column {field.name!r} is {got}, expected {field.type}"
    return None


def _valid_files(files: list[str], schema: pa.Schema, bad: list,
                 keys: tuple[str, ...] = KEY_COLUMNS) -> tuple[list[str], bool]:
    """The readable files with a compatible schema, and whether all have every column."""
    good, complete = [], True
    for f in files:
        cols, error = check_shard(f, schema, keys)
        if error:
            bad.append((f, error))
            log.warning("skipping bad shard %s: %s", f, error)
            continue
        good.append(f)
        complete = complete and set(schema.names) <= cols
    return good, complete


class _Compacted:
    """The runs' compactions as the records show them once (read under the readers lock):
    `targets` in place, the sources they `moved` (absolute paths), and the `moves`
    (run, source, target) the catalog view follows."""

    def __init__(self, runs: list[Path], bad: list):
        self.moved: set[str] = set()
        self.targets: set[str] = set()
        self.moves: list[tuple[str, str, str]] = []
        for run in runs:
            for rec in sorted((run / CATALOG_DIR).glob(f"{COMPACT_PREFIX}*.parquet")):
                try:
                    rows = pq.read_table(rec, columns=["source", "target"]).to_pylist()
                except (OSError, pa.ArrowException) as exc:
                    bad.append((str(rec), f"unreadable compaction record: {_one_line(exc)}"))
                    continue
                targets = {r["target"] for r in rows}
                if all((run / t).is_file() for t in targets):
                    self.targets.update(str(run / t) for t in targets)
                    self.moved.update(str(run / r["source"]) for r in rows)
                    self.moves.extend((str(run), r["source"], r["target"]) for r in rows)

    def __contains__(self, path: object) -> bool:
        """A shard file the views do not read: a source a compaction replaced, or a
        compaction target put in place after the records were read (its sources are read)."""
        return isinstance(path, str) and (path in self.moved or (
            Path(path).name.startswith(COMPACT_PREFIX) and path not in self.targets))


def _sql_list(paths: list[str]) -> str:
    return "[" + ", ".join("'" + p.replace("'", "''") + "'" for p in paths) + "]"


def _create_catalog_view(con: duckdb.DuckDBPyConnection, runs: list[Path], moved: _Compacted,
                         bad: list) -> None:
    files = [f for f in _parquet_files(runs, CATALOG_DIR) if Path(f).name.startswith("commit-")]
    files, complete = _valid_files(files, CATALOG_SCHEMA, bad, CATALOG_KEYS)
    empty = CATALOG_SCHEMA.empty_table().append_column("filename", pa.array([], pa.string()))
    _table(con, "_empty_catalog", empty)
    if files:
        source = f"read_parquet({_sql_list(files)}, union_by_name = true, filename = true)"
        if not complete:
            source = f"(SELECT * FROM {source} UNION ALL BY NAME SELECT * FROM _empty_catalog)"
    else:
        source = "_empty_catalog"
    con.execute(f"CREATE VIEW _catalog AS SELECT *, {_RUN_OF.format(col='filename')} AS _run "
                f"FROM {source}")
    # Compaction moved some shards: the catalog view shows where each row lives now.
    moves = moved.moves
    _table(con, "_moves", pa.table({"run": [m[0] for m in moves],
                                     "source": [m[1] for m in moves],
                                     "target": [m[2] for m in moves]},
                                    schema=pa.schema([("run", pa.string()), ("source", pa.string()),
                                                      ("target", pa.string())])))
    shard_cols = ", ".join(
        f"coalesce((SELECT m.target FROM _moves m WHERE m.run = c._run AND m.source = "
        f"c.{t}_shard), c.{t}_shard) AS {t}_shard" for t in SHARD_TABLES)
    con.execute(f"CREATE VIEW catalog AS SELECT c.rollout_id, c.attempt, c.fencing_token, "
                f"{shard_cols}, c.committed_at, c._run AS run_dir FROM _catalog c")


def _trusted_files(runs: list[Path], moved: _Compacted) -> set[str]:
    """Shard files whose rows are all committed, so the views read them with no row filter:
    compaction targets (compaction merges committed rows only) and per-attempt shards that
    a catalog row names, when the file name carries that row's key."""
    trusted: set[str] = set(moved.targets)
    for run in runs:
        for path in sorted((run / CATALOG_DIR).glob("commit-*.parquet")):
            try:
                present = pq.read_schema(path).names
                shard_cols = [f"{t}_shard" for t in SHARD_TABLES if f"{t}_shard" in present]
                cat = pq.read_table(path, columns=shard_cols)
            except (OSError, pa.ArrowException):
                continue        # reported as a bad shard by the catalog view
            keys = None
            for t in SHARD_TABLES:
                col = f"{t}_shard"
                if col not in cat.column_names or cat[col].null_count == len(cat):
                    continue
                if keys is None:
                    k = pq.read_table(path, columns=list(CATALOG_KEYS))
                    keys = list(zip(k["rollout_id"].to_pylist(), k["attempt"].to_pylist(),
                                    k["fencing_token"].to_pylist()))
                for key, rel in zip(keys, cat[col].to_pylist()):
                    if rel and rel.endswith("-" + shard_suffix(*key)):
                        full = str(run / rel)
                        if full not in moved:
                            trusted.add(full)
    return trusted


def _create_table_view(con: duckdb.DuckDBPyConnection, table: str, schema: pa.Schema,
                       runs: list[Path], moved: _Compacted, bad: list,
                       trusted: set[str] = frozenset(), view: str | None = None,
                       exclude: set[str] = frozenset()) -> str | None:
    """Create the committed-only view of `table`; return its row source (None: no files).

    Trusted files (all rows committed) are read as they are; every other file through a
    semi-join with the catalog on (rollout_id, attempt, fencing_token)."""
    view = view or table
    files = [f for f in _parquet_files(runs, table) if f not in moved]
    files, _ = _valid_files(files, schema, bad)
    files = [f for f in files if f not in exclude]
    _table(con, f"_empty_{table}", schema.empty_table())
    if not files:
        con.execute(f"CREATE VIEW {view} AS SELECT * FROM _empty_{table}")
        return None
    columns = ", ".join(f's."{n}"' for n in schema.names)
    parts = []
    sure = [f for f in files if f in trusted]
    rest = [f for f in files if f not in trusted]
    if sure:
        parts.append(f"SELECT {columns} FROM {_source(table, schema, sure)} s")
    if rest:
        same_run = (f" AND c._run = {_RUN_OF.format(col='s.filename')}" if len(runs) > 1 else "")
        parts.append(
            f"SELECT {columns} FROM {_source(table, schema, rest)} s "
            f"WHERE EXISTS (SELECT 1 FROM _catalog c WHERE c.rollout_id = s.rollout_id "
            f"AND c.attempt = s.attempt AND c.fencing_token = s.fencing_token{same_run})")
    con.execute(f"CREATE VIEW {view} AS " + " UNION ALL ".join(parts))
    return _source(table, schema, files)


def _source(table: str, schema: pa.Schema, files: list[str]) -> str:
    """read_parquet over `files` with every schema column (missing ones NULL) and filename."""
    source = f"read_parquet({_sql_list(files)}, union_by_name = true, filename = true)"
    complete = all(set(schema.names) <= check_shard(f, schema)[0] for f in files)
    if not complete:
        empty = f"(SELECT *, NULL::VARCHAR AS filename FROM _empty_{table})"
        source = f"(SELECT * FROM {source} UNION ALL BY NAME SELECT * FROM {empty})"
    return source


def _create_span_summary_views(con: duckdb.DuckDBPyConnection, runs: list[Path],
                               moved: _Compacted, trusted: set[str]) -> None:
    """`_span_summaries(path)`: HDR summaries of compacted spans files; `_spans_rest`: the
    committed spans rows those summaries do not cover (controller/analysis/report.py merges both)."""
    covered, summaries = set(), []
    for f in _parquet_files(runs, "spans"):
        if f in trusted and Path(f).name.startswith(COMPACT_PREFIX):
            summary = span_summary_path(Path(f))
            if summary.is_file():
                covered.add(f)
                summaries.append(str(summary))
    _table(con, "_span_summaries", pa.table({"path": pa.array(summaries, pa.string())}))
    _create_table_view(con, "spans", SCHEMAS["spans"], runs, moved, [], trusted,
                       view="_spans_rest", exclude=covered)


def _create_infra_view(con: duckdb.DuckDBPyConnection, runs: list[Path], moved: _Compacted,
                       trusted: set[str]) -> None:
    """Every infra_error attempt in the shards, committed or not (retried ones are not)."""
    schema = SCHEMAS["rollouts"]
    files, _ = _valid_files([f for f in _parquet_files(runs, "rollouts") if f not in moved],
                            schema, [])
    cols = ("s.run_id, s.rollout_id, s.attempt, s.fencing_token, s.node, s.task_id, "
            "s.task_name, s.infra_reason, s.infra_code, s.started_at")
    sure = [f for f in files if f in trusted]
    rest = [f for f in files if f not in trusted]
    parts = [f"SELECT {cols}, TRUE AS committed FROM _empty_rollouts s"]
    if sure:
        parts.append(f"SELECT {cols}, TRUE AS committed FROM {_source('rollouts', schema, sure)} s "
                     f"WHERE s.outcome = 'infra_error'")
    if rest:
        same_run = f" AND c._run = {_RUN_OF.format(col='s.filename')}" if len(runs) > 1 else ""
        parts.append(
            f"SELECT {cols}, EXISTS (SELECT 1 FROM _catalog c WHERE c.rollout_id = s.rollout_id "
            f"AND c.attempt = s.attempt AND c.fencing_token = s.fencing_token{same_run}) "
            f"AS committed FROM {_source('rollouts', schema, rest)} s "
            f"WHERE s.outcome = 'infra_error'")
    con.execute("CREATE VIEW infra_attempts AS " + " UNION ALL ".join(parts))


# -- queries --------------------------------------------------------------------------------

def execute(run_dir: str | Path, sql: str, allow_write: bool = False,
            write_dir: str | Path | None = None) -> tuple[list[str], list[tuple]]:
    """Run `sql` (queries only; see `check_statements`) against the run's views; return
    (column names, rows). Raises QueryError. `allow_write`: COPY ... TO / EXPORT DATABASE may
    write into `write_dir` (default: the current directory)."""
    if allow_write and write_dir is None:
        write_dir = Path.cwd()
    con = connect(run_dir, write_dir=write_dir if allow_write else None)
    try:
        check_statements(con, sql, allow_write)
        try:
            with query_deadline(con):
                cur = con.execute(sql)
                columns = [d[0] for d in cur.description or ()]
                return columns, (cur.fetchall() if columns else [])
        except duckdb.Error as exc:
            raise QueryError(_one_line(exc)) from None
    finally:
        con.close()


def run_query(run_dir: str | Path, sql: str, fmt: str = "table",
              out: TextIO | None = None, allow_write: bool = False) -> int:
    """Run `sql` and print the result as a rich table, CSV (with header) or a JSON array.

    Returns the number of rows printed. Raises QueryError (bad SQL) or RunNotFound.
    """
    if fmt not in FORMATS:
        raise ValueError(f"format {fmt!r} is not one of {', '.join(FORMATS)}")
    out = sys.stdout if out is None else out
    columns, rows = execute(run_dir, sql, allow_write=allow_write)
    if fmt == "csv":
        writer = csv.writer(out, lineterminator="\n")
        writer.writerow(columns)
        writer.writerows([["" if v is None else _plain(v) for v in row] for row in rows])
    elif fmt == "json":
        out.write(json.dumps([{c: _plain(v) for c, v in zip(columns, row)} for row in rows],
                             indent=1, allow_nan=False))
        out.write("\n")
    else:
        console = _console(out)
        cells = [["NULL" if v is None else str(_plain(v)) for v in row] for row in rows]
        if _table_width(columns, cells) > console.width:
            _print_records(console, columns, cells)
        else:
            table = Table(show_lines=False)
            for c in columns:
                table.add_column(c, overflow="fold")
            for row in cells:
                table.add_row(*row)
            console.print(table)
    return len(rows)


MIN_CELL_CHARS = 8      # a column narrower than this (or its header) is unreadable


def _table_width(columns: list[str], cells: list[list[str]]) -> int:
    """The width a table needs with every column at least readable: its header, or its widest
    value, up to MIN_CELL_CHARS (rich folds longer values), plus borders."""
    need = 1
    for i, c in enumerate(columns):
        widest = max((len(r[i]) for r in cells), default=0)
        need += max(len(c), min(widest, MIN_CELL_CHARS)) + 3
    return need


def _print_records(console: Console, columns: list[str], cells: list[list[str]]) -> None:
    """Rows too wide for the terminal, one block per row (`column  value` lines), as psql's
    expanded display: never a table of empty, squeezed columns."""
    pad = max((len(c) for c in columns), default=0)
    for n, row in enumerate(cells, 1):
        console.print(f"-[ row {n} ]" + "-" * max(pad - 8, 4), markup=False, highlight=False)
        for c, v in zip(columns, row):
            console.print(f"{c:<{pad}}  {v}", markup=False, highlight=False, soft_wrap=True)
    if not cells:
        console.print(f"(0 rows; columns: {', '.join(columns)})", markup=False, highlight=False,
                      soft_wrap=True)


def _plain(value: Any) -> Any:
    """A value as JSON/CSV can carry it: timestamps as ISO 8601, decimals as floats."""
    if isinstance(value, (datetime, date, time)):
        return value.isoformat()
    if isinstance(value, Decimal):
        return float(value)
    if isinstance(value, float) and not math.isfinite(value):
        return str(value)
    if isinstance(value, (bytes, bytearray, memoryview)):
        return bytes(value).hex()
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    if isinstance(value, dict):
        return {str(k): _plain(v) for k, v in value.items()}
    return value


def _one_line(exc: BaseException) -> str:
    text = " ".join(str(exc).split())
    return text[:500] + ("…" if len(text) > 500 else "")


def _console(out: TextIO) -> Console:
    return Console(file=out, highlight=False, soft_wrap=False,
                   width=None if out is sys.stdout else 160)


# -- summary --------------------------------------------------------------------------------

_PASS = "count(*) FILTER (WHERE outcome = 'pass')"
_SCORED = "count(*) FILTER (WHERE outcome NOT IN ('infra_error', 'judge_failed'))"   # masked outcomes


def summary(run_dir: str | Path) -> dict:
    """Run-level numbers, computed in DuckDB over committed rollouts.

    pass_rate = pass / (pass + fail + timeout): infra_error rollouts are masked, never scored.
    wall_s percentiles are interpolated (quantile_cont) over all committed rollouts.
    """
    con = connect(run_dir)
    try:
        total, infra, passed, scored, p50, p99, mean_reward = con.execute(
            f"SELECT count(*), count(*) FILTER (WHERE outcome = 'infra_error'), {_PASS}, "
            f"{_SCORED}, quantile_cont(wall_s, 0.5), quantile_cont(wall_s, 0.99), "
            f"avg(reward) FROM rollouts").fetchone()
        outcomes = dict.fromkeys(OUTCOMES, 0)
        outcomes.update(dict(con.execute(
            "SELECT outcome, count(*) FROM rollouts GROUP BY outcome").fetchall()))
        result = {
            "run_dir": str(run_dir),
            "run": _run_meta(Path(run_dir)),
            "rollouts": total,
            "scored": scored,
            "passed": passed,
            "pass_rate": _rate(passed, scored),
            "mean_reward": mean_reward,
            "outcomes": outcomes,
            "infra_errors": infra,
            "wall_s": {"p50": p50, "p99": p99},
            "by_family": _grouped(con, ["task_family"]),
            "by_policy_version": _grouped(con, ["policy_version"]),
            "by_family_version": _grouped(con, ["task_family", "policy_version"]),
            "defences": defences(con),
            "model_calls": _model_call_counts(con),
        }
    except duckdb.Error as exc:
        raise QueryError(f"summary failed: {_one_line(exc)}") from None
    finally:
        con.close()
    return result


def _model_call_counts(con: duckdb.DuckDBPyConnection) -> dict:
    """Committed model calls, and how many lack what a trainer needs (the server did not send
    it: recorded as NULL, never invented)."""
    calls, ok, no_prompt, no_completion, no_logprobs, retried = con.execute(
        "SELECT count(*), count(*) FILTER (WHERE status = 'ok'), "
        "count(*) FILTER (WHERE status = 'ok' AND prompt_token_ids IS NULL), "
        "count(*) FILTER (WHERE status = 'ok' AND completion_token_ids IS NULL), "
        "count(*) FILTER (WHERE status = 'ok' AND completion_logprobs IS NULL), "
        "count(*) FILTER (WHERE retries > 0) FROM model_calls").fetchone()
    return {"calls": calls, "answered": ok, "missing_prompt_token_ids": no_prompt,
            "missing_completion_token_ids": no_completion, "missing_logprobs": no_logprobs,
            "retried_for_weight_update": retried}


def _grouped(con: duckdb.DuckDBPyConnection, keys: list[str]) -> list[dict]:
    cols = ", ".join(keys)
    rows = con.execute(
        f"SELECT {cols}, count(*), {_SCORED}, {_PASS} FROM rollouts "
        f"GROUP BY {cols} ORDER BY {cols}").fetchall()
    out = []
    for row in rows:
        n, scored, passed = row[len(keys):]
        out.append({**dict(zip(keys, row[:len(keys)])), "rollouts": n, "scored": scored,
                    "passed": passed, "pass_rate": _rate(passed, scored)})
    return out


def _rate(passed: int, scored: int) -> float | None:
    return passed / scored if scored else None


def _run_meta(run_dir: Path) -> dict | None:
    try:
        return json.loads((run_dir / "run.json").read_text())
    except (OSError, ValueError):
        return None


def query_command(run_dir: str | Path, sql: str = EXAMPLE_SQL) -> str:
    """The shell command that runs `sql` against `run_dir` (quoted for a POSIX shell).

    The SQL goes in double quotes (SQL string literals use single quotes), with the
    characters a shell expands inside double quotes escaped.
    """
    quoted_sql = "".join("\\" + ch if ch in '\\"$`' else ch for ch in sql)
    return f'paddock query --run {shlex.quote(str(run_dir))} "{quoted_sql}"'


def print_summary(summary: dict, run_dir: str | Path, out: TextIO | None = None) -> None:
    """Print a summary (from `summary()`) with rich, ending with the command to query the run."""
    console = _console(sys.stdout if out is None else out)
    pr = summary["pass_rate"]
    console.print(f"Run {run_dir}: {summary['rollouts']} rollouts, pass rate "
                  f"{_pct(pr)} ({summary['passed']}/{summary['scored']} scored), "
                  f"{summary['infra_errors']} infra_error (masked)", markup=False, soft_wrap=True)
    oc = summary["outcomes"]
    console.print("outcomes: " + ", ".join(f"{k}={oc[k]}" for k in oc), markup=False)
    w = summary["wall_s"]
    console.print(f"wall_s: p50 {_num(w['p50'])}  p99 {_num(w['p99'])}", markup=False)
    for line in defence_lines(summary.get("defences") or {}):
        console.print(line, markup=False, soft_wrap=True)
    for title, key, cols in (("by task family", "by_family", ["task_family"]),
                             ("by policy version", "by_policy_version", ["policy_version"]),
                             ("by family x version", "by_family_version",
                              ["task_family", "policy_version"])):
        if not summary[key]:
            continue
        table = Table(title=title)
        for c in cols + ["rollouts", "passed", "pass rate"]:
            table.add_column(c)
        for row in summary[key]:
            table.add_row(*[str(row[c]) for c in cols], str(row["rollouts"]),
                          str(row["passed"]), _pct(row["pass_rate"]))
        console.print(table)
    console.print("Query this run:", markup=False)
    console.print(query_command(run_dir), markup=False, soft_wrap=True)


def _pct(rate: float | None) -> str:
    return "n/a" if rate is None else f"{100 * rate:.1f}%"


def _num(x: float | None) -> str:
    return "n/a" if x is None else f"{x:.3f}"


def newest_run(runs_root: str | Path = "runs") -> Path:
    """The most recently modified directory under `runs_root`."""
    root = Path(runs_root)
    candidates = [p for p in root.iterdir() if p.is_dir()] if root.is_dir() else []
    if not candidates:
        raise RunNotFound(f"no run directories under {root.resolve()}; pass --run DIR")
    return max(candidates, key=lambda p: (p.stat().st_mtime, p.name))
