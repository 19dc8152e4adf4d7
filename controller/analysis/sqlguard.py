"""The read-only guard of analysts' DuckDB connections (controller/analysis/query.py uses it).

`lock_down(con, runs, write_dir)` leaves a connection that can read the run directories and
nothing else of the file system (`enable_external_access = false`, `allowed_directories`),
install or load no extension, and change no setting (`lock_configuration = true`: `SET`,
`RESET` and `PRAGMA` that set are refused by DuckDB itself). `check_statements(con, sql)`
refuses, before anything runs, every statement of `sql` that is not a query: only SELECT,
EXPLAIN and CREATE MACRO pass; with `allow_write`, COPY and EXPORT too (and `lock_down` was
given the one directory they may write into). A locked connection may use at most
`PADDOCK_QUERY_MEMORY_MB` of memory (default: a quarter of the machine's, at most 8 GiB: an
analyst's query on a shared login node must not take the node), and `query_deadline(con)`
interrupts a query past `PADDOCK_QUERY_TIMEOUT_S` seconds (default 600) with a clear error.

Must not import: zmq, sqlite3, controller.store, controller.broker.
"""
from __future__ import annotations

import contextlib
import os
import re
import threading
from pathlib import Path
from typing import Iterator

import duckdb
import psutil


class QueryError(RuntimeError):
    """A query cannot be answered: bad SQL or an unreadable store. One-line message."""


def _sql_list(paths: list[str]) -> str:
    return "[" + ", ".join("'" + p.replace("'", "''") + "'" for p in paths) + "]"


def _one_line(exc: BaseException) -> str:
    text = " ".join(str(exc).split())
    return text[:500] + ("…" if len(text) > 500 else "")


_MACRO = re.compile(r"\s*CREATE\s+(?:OR\s+REPLACE\s+)?(?:TEMP(?:ORARY)?\s+)?MACRO\s", re.I)


def lock_down(con: duckdb.DuckDBPyConnection, runs: list[Path], write_dir: str | Path | None) -> None:
    """No file access outside the run directories (and `write_dir`), no extensions, and a
    configuration no statement can change."""
    dirs = [str(r).rstrip("/") + "/" for r in runs]
    if write_dir is not None:
        dirs.append(str(Path(write_dir).resolve()).rstrip("/") + "/")
    con.execute(f"SET allowed_directories = {_sql_list(dirs)}")
    con.execute("SET enable_external_access = false")
    con.execute("SET autoinstall_known_extensions = false")
    con.execute("SET autoload_known_extensions = false")
    con.execute(f"SET memory_limit = '{_limit('PADDOCK_QUERY_MEMORY_MB', _default_memory_mb())}MB'")
    con.execute("SET lock_configuration = true")


def _default_memory_mb() -> int:
    return int(min(psutil.virtual_memory().total / 4, 8 << 30)) >> 20


def _limit(env: str, default: float) -> float:
    raw = os.environ.get(env)
    if raw is None:
        return default
    try:
        value = float(raw)
    except ValueError:
        value = float("nan")
    if not 0 < value < float("inf"):
        raise QueryError(f"{env} must be a positive number, got {raw!r}")
    return int(value) if value == int(value) else value


@contextlib.contextmanager
def query_deadline(con: duckdb.DuckDBPyConnection) -> Iterator[None]:
    """Interrupt what `con` runs once it passes `PADDOCK_QUERY_TIMEOUT_S` (default 600 s)."""
    seconds = _limit("PADDOCK_QUERY_TIMEOUT_S", 600)
    fired = threading.Event()

    def stop() -> None:
        fired.set()
        con.interrupt()
    timer = threading.Timer(seconds, stop)
    timer.daemon = True
    timer.start()
    try:
        yield
    except duckdb.Error:
        if fired.is_set():
            raise QueryError(f"the query ran past {seconds:g} s and was stopped "
                             f"(PADDOCK_QUERY_TIMEOUT_S sets the limit)") from None
        raise
    finally:
        timer.cancel()


READ_ONLY_STATEMENTS = ("SELECT", "EXPLAIN")
WRITE_STATEMENTS = ("COPY", "EXPORT")       # with allow_write: into write_dir only


_MACRO = re.compile(r"\s*CREATE\s+(?:OR\s+REPLACE\s+)?(?:TEMP(?:ORARY)?\s+)?MACRO\s", re.I)


def check_statements(con: duckdb.DuckDBPyConnection, sql: str, allow_write: bool = False) -> None:
    """Refuse, before anything runs, every statement of `sql` that is not a query."""
    try:
        statements = con.extract_statements(sql)
    except duckdb.Error as exc:
        raise QueryError(_one_line(exc)) from None
    if not statements:
        raise QueryError("no SQL statement given")
    allowed = READ_ONLY_STATEMENTS + (WRITE_STATEMENTS if allow_write else ())
    for st in statements:
        kind = st.type.name
        if kind == "CREATE" and _MACRO.match(st.query):
            continue            # a function of the session (pass_at_k in the docs): no data, no file
        if kind not in allowed:
            hint = (" (COPY ... TO and EXPORT DATABASE need --allow-write, and write only into the "
                    "current directory)" if kind in WRITE_STATEMENTS else "")
            raise QueryError(f"read-only: a {kind} statement is refused ({' '.join(st.query.split())[:80]!r}); "
                             f"paddock query runs {' and '.join(allowed)} statements only{hint}")
