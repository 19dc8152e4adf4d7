"""The committed-row catalog: which (rollout_id, attempt, fencing_token) keys are committed.

The controller decides that an attempt is committed (its fencing token was current when the
result arrived) and records the key here. `commit` buffers; `flush` appends the buffered keys
as one new, small file `catalog/commit-<seq:06d>.parquet` (written to a `.tmp` name, fsynced,
then hard-linked into place so an existing file is never overwritten). Old files are never
rewritten. On start the catalog reads what is on disk, so the numbering continues and a key
committed before a restart is not written again.

Invariants: a key is written at most once (committing it again is a no-op); a rollout has at
most one committed attempt (committing a different attempt or token for an already committed
rollout raises `CatalogConflict`: committed is a terminal state).

DuckDB views (controller/query.py) show only shard rows whose key appears here.

Must not import zmq or duckdb; it does no network I/O.
"""
from __future__ import annotations

import logging
import os
import re
import threading
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import Mapping

import pyarrow as pa
import pyarrow.parquet as pq

log = logging.getLogger(__name__)

CATALOG_DIR = "catalog"
SHARD_TABLES = ("rollouts", "steps", "checks")

CATALOG_SCHEMA = pa.schema([
    pa.field("rollout_id", pa.string(), nullable=False),
    pa.field("attempt", pa.int32(), nullable=False),
    pa.field("fencing_token", pa.int64(), nullable=False),
    pa.field("rollouts_shard", pa.string(), nullable=True),
    pa.field("steps_shard", pa.string(), nullable=True),
    pa.field("checks_shard", pa.string(), nullable=True),
    pa.field("committed_at", pa.timestamp("us", tz="UTC"), nullable=False),
])

_COMMIT_FILE = re.compile(r"^commit-(\d{6,})\.parquet$")


class CatalogError(RuntimeError):
    """The catalog on disk cannot be read or written; the message names the file."""


class CatalogConflict(CatalogError):
    """A rollout already has a different committed (attempt, fencing_token)."""


@dataclass(frozen=True)
class CommitKey:
    rollout_id: str
    attempt: int
    fencing_token: int


class Catalog:
    """Append-only catalog of committed keys for one run directory (single writer)."""

    def __init__(self, run_dir: str | os.PathLike):
        self.run_dir = Path(run_dir)
        self.dir = self.run_dir / CATALOG_DIR
        self.dir.mkdir(parents=True, exist_ok=True)
        self._lock = threading.Lock()
        self._pending: list[dict] = []
        self._by_rollout: dict[str, CommitKey] = {}
        self._next_seq = 0
        self._load()

    # -- public API -------------------------------------------------------------------------

    def commit(self, rollout_id: str, attempt: int, fencing_token: int,
               shards: Mapping[str, str], committed_at: datetime | float) -> bool:
        """Buffer a committed key; return False if this exact key is already committed.

        `shards` maps table name → shard path relative to the run directory (as returned by
        nodeagent.trajwriter.write_attempt). `committed_at` is an aware datetime or epoch
        seconds from the caller's wall clock.
        """
        key = CommitKey(str(rollout_id), int(attempt), int(fencing_token))
        unknown = sorted(set(shards) - set(SHARD_TABLES))
        if unknown:
            raise ValueError(f"unknown shard table(s) {unknown}; valid: {SHARD_TABLES}")
        with self._lock:
            existing = self._by_rollout.get(key.rollout_id)
            if existing == key:
                return False
            if existing is not None:
                raise CatalogConflict(
                    f"rollout {key.rollout_id} is already committed as attempt "
                    f"{existing.attempt} token {existing.fencing_token}; refusing attempt "
                    f"{key.attempt} token {key.fencing_token}")
            self._by_rollout[key.rollout_id] = key
            self._pending.append({
                "rollout_id": key.rollout_id, "attempt": key.attempt,
                "fencing_token": key.fencing_token,
                **{f"{t}_shard": shards.get(t) for t in SHARD_TABLES},
                "committed_at": _as_utc(committed_at),
            })
        log.info("committed rollout_id=%s attempt=%d token=%d", key.rollout_id, key.attempt,
                 key.fencing_token)
        return True

    def flush(self) -> Path | None:
        """Write buffered keys as the next commit file; return its path (None if nothing)."""
        with self._lock:
            if not self._pending:
                return None
            rows = list(self._pending)
            seq = self._next_seq
            path = self.dir / f"commit-{seq:06d}.parquet"
            table = pa.Table.from_pylist(rows, schema=CATALOG_SCHEMA)
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
            return self._by_rollout.get(rollout_id) == CommitKey(
                rollout_id, int(attempt), int(fencing_token))

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
                key = CommitKey(row["rollout_id"], row["attempt"], row["fencing_token"])
                self._by_rollout.setdefault(key.rollout_id, key)
        self._next_seq = max_seq + 1

    def _write_new(self, table: pa.Table, path: Path) -> None:
        tmp = path.with_name(path.name + ".tmp")
        try:
            with open(tmp, "wb") as fh:
                pq.write_table(table, fh)
                fh.flush()
                os.fsync(fh.fileno())
            os.link(tmp, path)  # fails if the file exists: old files are never rewritten
        except FileExistsError:
            raise CatalogError(f"catalog file {path} already exists; is a second controller "
                               f"writing this run?") from None
        except OSError as exc:
            raise CatalogError(f"cannot write catalog file {path}: {exc}") from exc
        finally:
            tmp.unlink(missing_ok=True)
        dir_fd = os.open(self.dir, os.O_RDONLY)
        try:
            os.fsync(dir_fd)
        finally:
            os.close(dir_fd)


def _as_utc(value: datetime | float) -> datetime:
    if isinstance(value, datetime):
        if value.tzinfo is None:
            raise ValueError("committed_at: naive datetime; pass a timezone-aware one (UTC)")
        return value.astimezone(timezone.utc)
    return datetime.fromtimestamp(float(value), tz=timezone.utc)
