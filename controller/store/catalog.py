"""The committed-row catalog: which (rollout_id, attempt, fencing_token) keys are committed.

The controller decides that an attempt is committed (its fencing token was current when the
result arrived) and records the key here -- only once the queue's transaction committing it
is durable (controller/broker/ledger.py), and `reconcile` makes the catalog equal to the
queue's committed rows at start (rebuilding it when it lists a key the queue lacks). `commit` buffers; `flush` appends the buffered keys
as one new, small file `catalog/commit-<seq:06d>.parquet` (written to a `.tmp` name, fsynced,
then hard-linked into place so an existing file is never overwritten). Old files are never
rewritten (a rebuild renames them `retired-commit-*`, which no reader lists). On start the
catalog reads what is on disk, so the numbering continues and a key committed before a
restart is not written again.

Invariants: a key is written at most once (committing it again is a no-op); a rollout has at
most one committed attempt (committing a different attempt or token for an already committed
rollout raises `CatalogConflict`: committed is a terminal state).

DuckDB views (controller/analysis/query.py) show only shard rows whose key appears here.

Compaction (`compact`) merges the small per-attempt shards of committed attempts into
`<table>/compact-<seq>.parquet` files. The catalog follows: a record
`catalog/compact-<seq>.parquet` lists (table, source, target). Order of a compaction: write
the target as `.tmp` and fsync; write the record (hard link, never overwrites); rename the
target into place (the commit point); unlink the sources. Readers hide a record's sources only
once its target exists, so at every instant each row is visible exactly once; a crash at any
point is finished by the next `compact` (a `.tmp` target whose record exists is complete).

Live readers (controller/analysis/query.py) flock the `catalog/` directory shared (`reader_hold`);
compaction unlinks sources only under it exclusively, never waiting (`_unlink_unread`): else they
stay, hidden by their record, for a later `compact`. A file a reader listed never vanishes.

Must not import: zmq, duckdb (it does no network I/O).
"""
from __future__ import annotations

import fcntl
import functools
import importlib
import json
import logging
import os
import re
import threading
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import TYPE_CHECKING, Mapping

from controller.contracts.shardnames import SHARD_TABLES, shard_suffix
from controller.ondisk.fileio import atomic_write_with, fsync_dir
from controller.store.faults import CATALOG_AFTER_LINK, CATALOG_BEFORE_LINK, FaultHook, no_fault

if TYPE_CHECKING:
    import pyarrow as pa
    import pyarrow.parquet as pq
else:
    class _Deferred:
        """A module imported at its first use. pyarrow is about a third of the controller's
        import time: deferred, the controller serves (and commits) while a thread loads it
        with the catalog (controller/broker/daemon.py)."""

        def __init__(self, name: str):
            self._name = name

        def __getattr__(self, attr: str):
            return getattr(importlib.import_module(self._name), attr)

    pa, pq = _Deferred("pyarrow"), _Deferred("pyarrow.parquet")

log = logging.getLogger(__name__)

CATALOG_DIR = "catalog"
_SHARD_TABLE_SET = frozenset(SHARD_TABLES)
_SHARD_COLUMNS = tuple((t, f"{t}_shard") for t in SHARD_TABLES)


@functools.cache
def _catalog_schema() -> "pa.Schema":
    return pa.schema([
        pa.field("rollout_id", pa.string(), nullable=False),
        pa.field("attempt", pa.int32(), nullable=False),
        pa.field("fencing_token", pa.int64(), nullable=False),
        pa.field("rollouts_shard", pa.string(), nullable=True),
        pa.field("steps_shard", pa.string(), nullable=True),
        pa.field("checks_shard", pa.string(), nullable=True),
        pa.field("spans_shard", pa.string(), nullable=True),
        pa.field("egress_shard", pa.string(), nullable=True),
        pa.field("committed_at", pa.timestamp("us", tz="UTC"), nullable=False),
    ])


_COMMIT_FILE = re.compile(r"^commit-(\d{6,})\.parquet$")
RETIRED_PREFIX = "retired-"  # a commit file a rebuild replaced (kept for forensics, unread)
COMPACT_PREFIX = "compact-"
_COMPACT_FILE = re.compile(r"^compact-(\d{6,})\.parquet$")


@functools.cache
def _compact_record_schema() -> "pa.Schema":
    return pa.schema([
        pa.field("table", pa.string(), nullable=False),
        pa.field("source", pa.string(), nullable=False),
        pa.field("target", pa.string(), nullable=False),
        pa.field("rows", pa.int64(), nullable=False),
    ])


def __getattr__(name: str):
    """`CATALOG_SCHEMA`, `COMPACT_RECORD_SCHEMA`: built (pyarrow imported) when first asked."""
    if name == "CATALOG_SCHEMA":
        return _catalog_schema()
    if name == "COMPACT_RECORD_SCHEMA":
        return _compact_record_schema()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


class CatalogError(RuntimeError):
    """The catalog on disk cannot be read or written; the message names the file."""


class CatalogConflict(CatalogError):
    """A rollout already has a different committed (attempt, fencing_token)."""


class Catalog:
    """Append-only catalog of committed keys for one run directory (single writer)."""

    def __init__(self, run_dir: str | os.PathLike, fault: FaultHook = no_fault):
        self.run_dir = Path(run_dir)
        self.fault = fault  # called at the commit path's fault points (store/faults.py)
        self.dir = self.run_dir / CATALOG_DIR
        self.dir.mkdir(parents=True, exist_ok=True)
        self._lock = threading.Lock()
        self._pending: list[dict] = []
        self._by_rollout: dict[str, tuple[int, int]] = {}  # rollout id -> (attempt, token)
        self._next_seq = 0
        self._load()

    # -- public API -------------------------------------------------------------------------

    def commit(self, rollout_id: str, attempt: int, fencing_token: int,
               shards: Mapping[str, str], committed_at: datetime | float) -> bool:
        """Buffer a committed key; return False if this exact key is already committed.

        `shards` maps table name → shard path relative to the run directory (as returned by
        nodeagent.store.writer.write_attempt). `committed_at` is an aware datetime or epoch
        seconds from the caller's wall clock.
        """
        rollout_id, key = str(rollout_id), (int(attempt), int(fencing_token))
        if shards and not _SHARD_TABLE_SET.issuperset(shards):
            unknown = sorted(set(shards) - _SHARD_TABLE_SET)
            raise ValueError(f"unknown shard table(s) {unknown}; valid: {SHARD_TABLES}")
        at = _as_utc(committed_at).timestamp() if isinstance(committed_at, datetime) \
            else float(committed_at)
        with self._lock:
            existing = self._by_rollout.get(rollout_id)
            if existing == key:
                return False
            if existing is not None:
                raise CatalogConflict(
                    f"rollout {rollout_id} is already committed as attempt {existing[0]} "
                    f"token {existing[1]}; refusing attempt {key[0]} token {key[1]}")
            self._by_rollout[rollout_id] = key
            # A tuple per key (the row is built at flush: one commit per rollout is hot).
            self._pending.append((rollout_id, key, dict(shards) if shards else None, at))
        # Per-rollout detail: debug (at thousands of commits a second INFO would flood the log).
        log.debug("committed rollout_id=%s attempt=%d token=%d", rollout_id, *key)
        return True

    def flush(self) -> Path | None:
        """Write buffered keys as the next commit file; return its path (None if nothing)."""
        with self._lock:
            if not self._pending:
                return None
            rows = list(self._pending)
            seq = self._next_seq
            path = self.dir / f"commit-{seq:06d}.parquet"
            table = _table(rows)
            self._write_new(table, path)
            self._next_seq = seq + 1
            del self._pending[:len(rows)]
        log.info("catalog flush seq=%d rows=%d", seq, len(rows))
        return path

    def committed_count(self) -> int:
        """Distinct committed keys, flushed or still buffered."""
        with self._lock:
            return len(self._by_rollout)

    def pending_count(self) -> int:
        """Keys accepted by `commit` but not yet flushed (not yet visible to queries)."""
        with self._lock:
            return len(self._pending)

    def is_committed(self, rollout_id: str, attempt: int, fencing_token: int) -> bool:
        with self._lock:
            return self._by_rollout.get(rollout_id) == (int(attempt), int(fencing_token))

    def keys(self) -> dict[str, tuple[int, int]]:
        """rollout id -> its committed (attempt, fencing_token), flushed or buffered."""
        with self._lock:
            return dict(self._by_rollout)

    def rebuild(self, rows: list[dict]) -> Path:
        """Replace the catalog by exactly `rows` (the queue's committed rows: `rollout_id`,
        `attempt`, `token`, `shards`, `at`): written as the next commit file, then the older
        commit files are retired (renamed `retired-commit-*`, which no reader lists). A crash
        in between leaves keys listed twice, never a key missing; the next start rebuilds
        again. Used at start when the catalog shows a key the queue did not commit."""
        with self._lock:
            old = [p for p in self.dir.iterdir() if _COMMIT_FILE.match(p.name)]
            seq = self._next_seq
            path = self.dir / f"commit-{seq:06d}.parquet"
            self._write_new(_table([(r["rollout_id"], (r["attempt"], r["token"]),
                                     r["shards"] or None, r["at"]) for r in rows]), path)
            self._next_seq = seq + 1
            for p in old:
                os.replace(p, p.with_name(RETIRED_PREFIX + p.name))
            fsync_dir(self.dir)
            self._pending.clear()
            self._by_rollout = {r["rollout_id"]: (int(r["attempt"]), int(r["token"]))
                                for r in rows}
        log.warning("catalog rebuilt from the queue: %d keys in %s, %d files retired",
                    len(rows), path.name, len(old))
        return path

    def close(self) -> None:
        self.flush()

    def __enter__(self) -> "Catalog":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    # -- internals --------------------------------------------------------------------------

    def _load(self) -> None:
        max_seq = -1
        for entry in sorted(os.listdir(self.dir)):
            path = self.dir / entry
            if entry.endswith(".tmp"):
                # Single writer: a leftover .tmp is from a flush that crashed before the link.
                path.unlink(missing_ok=True)
                continue
            m = _COMMIT_FILE.match(entry)
            if not m:
                continue
            max_seq = max(max_seq, int(m.group(1)))
            try:
                table = pq.read_table(path, columns=["rollout_id", "attempt", "fencing_token"])
            except (OSError, pa.ArrowException) as exc:
                raise CatalogError(f"cannot read catalog file {path}: {exc}") from exc
            for row in table.to_pylist():
                self._by_rollout.setdefault(row["rollout_id"],
                                            (row["attempt"], row["fencing_token"]))
        self._next_seq = max_seq + 1

    def _write_new(self, table: pa.Table, path: Path) -> None:
        tmp = path.with_name(path.name + ".tmp")
        try:
            with open(tmp, "wb") as fh:
                pq.write_table(table, fh)
                fh.flush()
                os.fsync(fh.fileno())
            self.fault(CATALOG_BEFORE_LINK)
            os.link(tmp, path)  # fails if the file exists: old files are never rewritten
            self.fault(CATALOG_AFTER_LINK)
        except FileExistsError:
            raise CatalogError(f"catalog file {path} already exists; is a second controller "
                               f"writing this run?") from None
        except OSError as exc:
            raise CatalogError(f"cannot write catalog file {path}: {exc}") from exc
        finally:
            tmp.unlink(missing_ok=True)
        fsync_dir(self.dir)


def reconcile(catalog: Catalog, committed: list[dict]) -> tuple[list[str], list[str]]:
    """Make the catalog show exactly the queue's `committed` rows (`committed_rows()`), at
    start. A key the queue committed that the catalog lacks (a crash between the COMMIT and
    the catalog's flush) is written; a key the catalog shows that the queue did not commit
    (a catalog written ahead of the queue by an older controller) makes the catalog rebuilt
    from the queue. Returns (ahead, behind): the rollout ids of each kind."""
    queue_keys = {r["rollout_id"]: (int(r["attempt"]), int(r["token"])) for r in committed}
    have = catalog.keys()
    ahead = sorted(rid for rid, key in have.items() if queue_keys.get(rid) != key)
    behind = sorted(rid for rid, key in queue_keys.items() if have.get(rid) != key)
    for rid in ahead[:20]:
        log.error("catalog anomaly: rollout %s is in the catalog as attempt %d token %d but "
                  "the queue has %s: the catalog is rebuilt from the queue", rid, *have[rid],
                  "it uncommitted" if rid not in queue_keys else
                  "attempt %d token %d" % queue_keys[rid])
    if ahead:
        catalog.rebuild(committed)
    elif behind:
        wanted = set(behind)
        for r in committed:
            if r["rollout_id"] in wanted:
                catalog.commit(r["rollout_id"], r["attempt"], r["token"], r["shards"], r["at"])
        catalog.flush()
        log.info("catalog: %d keys the queue committed were written at start", len(behind))
    return ahead, behind


def _table(rows: list[tuple]) -> pa.Table:
    """The buffered keys (rollout_id, (attempt, token), shards or None, epoch seconds) as a
    catalog table, built column by column."""
    cols = {"rollout_id": [r[0] for r in rows], "attempt": [r[1][0] for r in rows],
            "fencing_token": [r[1][1] for r in rows]}
    for t, col in _SHARD_COLUMNS:
        cols[col] = [r[2].get(t) if r[2] else None for r in rows]
    cols["committed_at"] = pa.array([round(r[3] * 1e6) for r in rows], pa.int64()).cast(
        _catalog_schema().field("committed_at").type)
    return pa.table(cols, schema=_catalog_schema())


def _as_utc(value: datetime | float) -> datetime:
    if isinstance(value, datetime):
        if value.tzinfo is None:
            raise ValueError("committed_at: naive datetime; pass a timezone-aware one (UTC)")
        return value.astimezone(timezone.utc)
    return datetime.fromtimestamp(float(value), tz=timezone.utc)


# -- compaction -----------------------------------------------------------------------------

@dataclass(frozen=True)
class CompactionResult:
    sources: int          # shard files merged (and removed)
    targets: int          # compacted files written
    rows: int             # rows moved
    recovered: int        # unfinished compactions completed
    deferred: int = 0     # compactions whose replaced sources stay for a reader (a later compact unlinks them)


COMPACT_LOCK = "compact.lock"   # in catalog/: held (flock) by the one compactor, which writes its pid in it


def reader_hold(run_dir: str | os.PathLike) -> int | None:
    """Hold the run's readers lock (a shared flock on its `catalog/` directory: no file to make)
    from before reading the compaction records: while the returned descriptor is open,
    compaction unlinks no file of the run. None when the run has no catalog/ (nothing
    committed: nothing to compact)."""
    try:
        fd = os.open(Path(run_dir) / CATALOG_DIR, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    except OSError:
        return None
    try:
        fcntl.flock(fd, fcntl.LOCK_SH)
    except OSError:
        os.close(fd)
        raise
    return fd


def compaction_holder(run_dir: str | os.PathLike) -> tuple[int, str] | None:
    """(pid, host) of the compaction running on `run_dir` (holding `catalog/compact.lock`, in
    which it wrote them; (0, "") until it has), or None when none runs."""
    path = Path(run_dir) / CATALOG_DIR / COMPACT_LOCK
    try:
        fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    except OSError:
        return None
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            pid, _, host = os.pread(fd, 300, 0).decode(errors="replace").strip().partition(" ")
            return (int(pid), host) if pid.isdigit() else (0, "")
        return None
    finally:
        os.close(fd)


def compact(run_dir: str | os.PathLike, max_shard_bytes: int = 1 << 20,
            max_rows_per_file: int = 1_000_000, min_sources: int = 2) -> CompactionResult:
    """Merge small shards of committed attempts; never loses or duplicates a visible row.

    Only shards named by a committed catalog row are merged (an uncommitted attempt's shard
    stays where it is: it may still be committed, or is evidence of an infra failure).
    Unreadable shards are left alone. One compactor per run (an flock on catalog/compact.lock).
    """
    run_dir = Path(run_dir)
    cat_dir = run_dir / CATALOG_DIR
    if not run_dir.is_dir():            # never make a run out of a wrong path
        raise CatalogError(f"run directory {run_dir} does not exist")
    if not cat_dir.is_dir():
        if (run_dir / "run.json").exists() or any((run_dir / t).is_dir() for t in _SHARD_TABLE_SET):
            return CompactionResult(0, 0, 0, 0)        # nothing committed yet
        raise CatalogError(f"{run_dir} is not a run directory (no run.json, {CATALOG_DIR}/ or shard tables)")
    with open(os.open(cat_dir / COMPACT_LOCK, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600),
              "r+") as lock:
        try:
            fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            raise CatalogError(f"another compaction of {run_dir} is running") from None
        lock.truncate(0)
        lock.write(f"{os.getpid()} {os.uname().nodename}\n")     # who holds it (compaction_holder)
        lock.flush()
        for stale in cat_dir.glob("*.ctmp"):
            stale.unlink(missing_ok=True)       # a record write that crashed before its link
        recovered, deferred = _finish_unfinished(run_dir)
        moved = _recorded_sources(run_dir)
        seq = _next_compact_seq(run_dir)
        committed, keys = _committed_shards(run_dir)
        n_src = n_tgt = n_rows = 0
        for table, schema in _shard_schemas().items():
            candidates, others = [], []
            directory = run_dir / table
            listed = sorted(f"{table}/{p.name}" for p in directory.glob("*.parquet")) \
                if directory.is_dir() else []
            # model_calls: the catalog names no shard of it; its per-attempt shards carry the
            # committed key in their name like the others (nodeagent/store/writer.py)
            named = committed.get(table) if table in _SHARD_TABLE_SET else _named_by_key(listed, keys)
            named = named or set()
            for rel in listed:
                path = run_dir / rel
                if rel in moved or path.name.startswith(COMPACT_PREFIX):
                    continue
                if rel in named and path.stat().st_size <= max_shard_bytes:
                    candidates.append(rel)
                else:
                    others.append(rel)
            for group in _groups(run_dir, candidates, schema, max_rows_per_file):
                if len(group) < min_sources:
                    continue
                rows = _compact_group(run_dir, table, schema, group, seq)
                seq += 1
                n_src, n_tgt, n_rows = n_src + len(group), n_tgt + 1, n_rows + rows
                deferred += not _unlink_unread(run_dir, [run_dir / rel for rel, _ in group])
            for rel in others:
                rows = _promote(run_dir, table, rel, keys, seq)
                if rows:
                    seq += 1
                    n_src, n_tgt, n_rows = n_src + 1, n_tgt + 1, n_rows + rows
                    deferred += not _unlink_unread(run_dir, [run_dir / rel])
    log.info("compaction run=%s sources=%d targets=%d rows=%d recovered=%d deferred=%d",
             run_dir, n_src, n_tgt, n_rows, recovered, deferred)
    return CompactionResult(n_src, n_tgt, n_rows, recovered, deferred)


def _unlink_unread(run_dir: Path, paths: list[Path]) -> bool:
    """Unlink replaced sources (their target is in place) if no reader holds the run's
    readers lock; else leave them (hidden by their record) for a later compaction. Returns
    whether they were unlinked."""
    fd = os.open(run_dir / CATALOG_DIR, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            log.info("compaction leaves %d replaced file(s) for a reader, e.g. %s", len(paths),
                     paths[0])
            return False
        for path in paths:
            path.unlink(missing_ok=True)
        for parent in {p.parent for p in paths}:
            fsync_dir(parent)
        return True
    finally:
        os.close(fd)       # lets go of the lock


def _shard_schemas() -> dict:
    """The shard tables' Arrow schemas (only compaction needs them)."""
    from controller.contracts.trajectory import SCHEMAS
    return SCHEMAS


def _committed_shards(run_dir: Path) -> tuple[dict[str, set[str]], pa.Table]:
    """Per table, the per-attempt shards committed catalog rows name (under their own key),
    and every committed key as a table (rollout_id, attempt, fencing_token)."""
    out: dict[str, set[str]] = {}
    key_tables = []
    for path in sorted((run_dir / CATALOG_DIR).glob("commit-*.parquet")):
        if not _COMMIT_FILE.match(path.name):
            continue
        try:
            table = pq.read_table(path)
        except (OSError, pa.ArrowException) as exc:
            raise CatalogError(f"cannot read catalog file {path}: {exc}") from exc
        key_tables.append(table.select(["rollout_id", "attempt", "fencing_token"]))
        keys = None
        for t in SHARD_TABLES:
            col = f"{t}_shard"
            if col not in table.column_names or table[col].null_count == len(table):
                continue
            if keys is None:
                keys = list(zip(table["rollout_id"].to_pylist(), table["attempt"].to_pylist(),
                                table["fencing_token"].to_pylist()))
            out.setdefault(t, set()).update(
                rel for key, rel in zip(keys, table[col].to_pylist())
                if rel and rel.endswith("-" + shard_suffix(*key)))
    keys_table = (pa.concat_tables([k.cast(k.schema) for k in key_tables]) if key_tables else
                  pa.table({"rollout_id": pa.array([], pa.string()),
                            "attempt": pa.array([], pa.int32()),
                            "fencing_token": pa.array([], pa.int64())}))
    return out, keys_table


_ATTEMPT_SUFFIX = re.compile(r"-a(\d+)-t(\d+)\.parquet$")


def _named_by_key(listed: list[str], keys: pa.Table) -> set[str]:
    """The per-attempt shards among `listed` whose name ends with a committed key's suffix."""
    by_attempt: dict[tuple[int, int], set[str]] = {}
    for rid, attempt, token in zip(keys["rollout_id"].to_pylist(), keys["attempt"].to_pylist(),
                                   keys["fencing_token"].to_pylist()):
        by_attempt.setdefault((int(attempt), int(token)), set()).add("-" + shard_suffix(rid, attempt, token))
    named = set()
    for rel in listed:
        m = _ATTEMPT_SUFFIX.search(rel)
        if m and any(rel.endswith(sfx) for sfx in by_attempt.get((int(m.group(1)), int(m.group(2))), ())):
            named.add(rel)
    return named


def _promote(run_dir: Path, table: str, rel: str, keys: pa.Table, seq: int) -> int:
    """Make a shard whose rows are all committed (a bulk shard) a compaction target, without
    copying: record it, hard-link it under the target name (the commit point), unlink it."""
    path = run_dir / rel
    try:
        data = pq.read_table(path, columns=["rollout_id", "attempt", "fencing_token"])
    except (OSError, pa.ArrowException, KeyError) as exc:
        log.warning("compaction skips unreadable shard %s: %s", path, exc)
        return 0
    if data.num_rows == 0:
        return 0
    cols = ["rollout_id", "attempt", "fencing_token"]
    distinct = data.cast(keys.schema).group_by(cols).aggregate([])
    missing = distinct.join(keys, keys=cols, join_type="left anti")
    if missing.num_rows:
        return 0                      # some rows are not committed (yet): leave it alone
    target_rel = f"{table}/{COMPACT_PREFIX}{seq:06d}.parquet"
    target = run_dir / target_rel
    if table == "spans":
        _write_span_summary(pq.read_table(path), target)
    _write_record(run_dir, table, [(rel, data.num_rows)], target_rel, seq)
    os.link(path, target)                       # the commit point
    fsync_dir(target.parent)
    return data.num_rows                        # the caller unlinks the source (_unlink_unread)


def span_summary_path(target: Path) -> Path:
    """The HDR summary written next to a compacted spans file."""
    return target.with_name(target.name.removesuffix(".parquet") + ".hdr.json")


SPAN_SUMMARY_FORMAT = 2
HDR_MAX_US = 24 * 3600 * 10**6
HDR_DIGITS = 2                # p50/p99 within 1% (durations are bucketed to 2 digits anyway)
BUCKET_DIGITS = 2


def bucket_us(us):
    """Durations in µs (numpy int64 array) rounded to BUCKET_DIGITS significant digits."""
    import numpy as np
    us = np.clip(us, 1, HDR_MAX_US)
    scale = np.power(10.0, np.maximum(np.floor(np.log10(us)) - (BUCKET_DIGITS - 1), 0))
    return np.minimum((np.rint(us / scale) * scale).astype(np.int64), HDR_MAX_US)


def _write_span_summary(spans: pa.Table, target: Path) -> None:
    """Per (node, kind) HDR histogram of the spans' durations, encoded, as JSON."""
    # numpy and hdrh only for compaction: lazy, so the controller's start does not pay them
    import numpy as np
    from hdrh.histogram import HdrHistogram
    us = np.rint(spans["duration_s"].to_numpy(zero_copy_only=False) * 1e6).astype(np.int64)
    node = spans["node"] if "node" in spans.column_names else pa.nulls(spans.num_rows, pa.string())
    grouped = pa.table({"node": node.fill_null("?"), "kind": spans["kind"],
                        "b": bucket_us(us)}).group_by(["node", "kind", "b"]).aggregate(
                            [([], "count_all")])
    hists: dict[tuple[str, str], HdrHistogram] = {}
    for n, k, b, c in zip(*(grouped[c].to_pylist() for c in ("node", "kind", "b", "count_all"))):
        h = hists.get((n, k))
        if h is None:
            h = hists[(n, k)] = HdrHistogram(1, HDR_MAX_US, HDR_DIGITS)
        h.record_value(b, c)
    doc = {"format": SPAN_SUMMARY_FORMAT, "rows": spans.num_rows,
           "histograms": [{"node": n, "kind": k, "hdr": h.encode().decode()}
                          for (n, k), h in sorted(hists.items())]}
    atomic_write_with(span_summary_path(target), lambda tmp: tmp.write_text(json.dumps(doc)))


def _write_record(run_dir: Path, table: str, sources: list[tuple[str, int]], target_rel: str,
                  seq: int) -> None:
    record = pa.Table.from_pylist(
        [{"table": table, "source": rel, "target": target_rel, "rows": n} for rel, n in sources],
        schema=_compact_record_schema())
    rec_path = run_dir / CATALOG_DIR / f"{COMPACT_PREFIX}{seq:06d}.parquet"
    rec_tmp = rec_path.with_name(rec_path.name + ".ctmp")
    with open(rec_tmp, "wb") as fh:
        pq.write_table(record, fh)
        fh.flush()
        os.fsync(fh.fileno())
    try:
        os.link(rec_tmp, rec_path)
    finally:
        rec_tmp.unlink(missing_ok=True)
    fsync_dir(rec_path.parent)


def _records(run_dir: Path) -> list[tuple[Path, list[dict]]]:
    out = []
    for path in sorted((run_dir / CATALOG_DIR).glob(f"{COMPACT_PREFIX}*.parquet")):
        if _COMPACT_FILE.match(path.name):
            out.append((path, pq.read_table(path).to_pylist()))
    return out


def _recorded_sources(run_dir: Path) -> set[str]:
    return {r["source"] for _, rows in _records(run_dir) for r in rows}


def _next_compact_seq(run_dir: Path) -> int:
    seqs = [int(m.group(1)) for p in (run_dir / CATALOG_DIR).iterdir()
            if (m := _COMPACT_FILE.match(p.name))]
    return max(seqs, default=-1) + 1


def _finish_unfinished(run_dir: Path) -> tuple[int, int]:
    """Complete compactions whose record exists: rename the target, unlink the sources (not
    while a reader holds the readers lock). Returns (completed, left for a reader)."""
    done = deferred = 0
    for _record, rows in _records(run_dir):
        targets = {r["target"] for r in rows}
        unfinished = False
        for t in targets:
            target = run_dir / t
            tmp = target.with_name(target.name + ".tmp")
            sources = [run_dir / r["source"] for r in rows if r["target"] == t]
            if not target.exists() and tmp.exists():
                os.rename(tmp, target)                  # a merge: its target was complete
                fsync_dir(target.parent)
                unfinished = True
            elif not target.exists() and len(sources) == 1 and sources[0].exists():
                os.link(sources[0], target)             # a promotion: link the shard
                fsync_dir(target.parent)
                unfinished = True
        if not all((run_dir / t).exists() for t in targets):
            continue    # cannot happen unless someone deleted files; sources stay visible
        left = [src for r in rows if (src := run_dir / r["source"]).exists()]
        if left and _unlink_unread(run_dir, left):
            unfinished = True
        elif left:
            deferred += 1
        done += unfinished
    return done, deferred


def _groups(run_dir: Path, rels: list[str], schema: pa.Schema, max_rows: int):
    group, rows = [], 0
    for rel in rels:
        try:
            n = pq.read_metadata(run_dir / rel).num_rows
        except (OSError, pa.ArrowException) as exc:
            log.warning("compaction skips unreadable shard %s: %s", run_dir / rel, exc)
            continue
        if group and rows + n > max_rows:
            yield group
            group, rows = [], 0
        group.append((rel, n))
        rows += n
    if group:
        yield group


def _conform(table: pa.Table, schema: pa.Schema) -> pa.Table:
    """`table` with exactly `schema`'s columns (missing optional columns as NULL)."""
    arrays = []
    for field in schema:
        if field.name in table.column_names:
            arrays.append(table[field.name].cast(field.type))
        else:
            arrays.append(pa.nulls(table.num_rows, field.type))
    return pa.Table.from_arrays(arrays, schema=schema)


def _compact_group(run_dir: Path, table: str, schema: pa.Schema,
                   group: list[tuple[str, int]], seq: int) -> int:
    parts = [_conform(pq.read_table(run_dir / rel), schema) for rel, _ in group]
    merged = pa.concat_tables(parts)
    target_rel = f"{table}/{COMPACT_PREFIX}{seq:06d}.parquet"
    target = run_dir / target_rel
    tmp = target.with_name(target.name + ".tmp")
    with open(tmp, "wb") as fh:
        pq.write_table(merged, fh, compression="zstd")
        fh.flush()
        os.fsync(fh.fileno())
    if table == "spans":
        _write_span_summary(merged, target)
    _write_record(run_dir, table, group, target_rel, seq)
    os.rename(tmp, target)                      # the commit point
    fsync_dir(target.parent)
    return merged.num_rows                      # the caller unlinks the sources (_unlink_unread)

