"""The task set's references on disk, read when a lease needs one: `TaskIndex`.

A run's tasks file (`tasks.json`, `controller.ondisk.taskblobs.write_tasks_file`) lists
every task's small lease reference; held whole in a dict, 1.2 million of them cost about
1.7 GB and half a minute before the first lease. `build(tasks_json)` writes an SQLite file
beside it once (streamed, a chunk of entries at a time; `tasks.json.index`), keyed by
reference (the task id, and the task's name as an alias, as `broker.core.admit_tasks` admits
them), with each refused entry's reason (`taskblobs.check_reference`) and a dense number per
task for uniform sampling. `open_index(tasks_json)` builds it when missing or older than the
file, then opens it: a start reads no entry. `TaskIndex` is a read-only Mapping
(reference -> the entry, as the tasks file holds it), with the last `cache_size` entries
read kept decoded.

Must not import: zmq, controller.broker, controller.cli, nodeagent.
"""
from __future__ import annotations

import json
import logging
import os
import sqlite3
from collections import OrderedDict
from pathlib import Path
from typing import Iterator, Mapping, Optional, Sequence

from controller.ondisk.taskblobs import NotOneEntryPerLine, check_reference, iter_tasks_chunks, load_tasks_file

log = logging.getLogger(__name__)

INDEX_SUFFIX = ".index"
FORMAT = 1
_SCHEMA = """
CREATE TABLE meta (key TEXT PRIMARY KEY, value TEXT NOT NULL);
CREATE TABLE tasks (n INTEGER PRIMARY KEY, task_id TEXT NOT NULL UNIQUE, ref TEXT NOT NULL,
                    entry TEXT NOT NULL);
CREATE TABLE entries (key TEXT PRIMARY KEY, n INTEGER NOT NULL) WITHOUT ROWID;
CREATE TABLE refused (key TEXT PRIMARY KEY, reason TEXT NOT NULL) WITHOUT ROWID;
"""
_COMPACT = json.JSONEncoder(separators=(",", ":"))


class TaskIndexError(RuntimeError):
    """The index file cannot be built or read (names the file)."""


def index_path(tasks_json: str | os.PathLike) -> Path:
    return Path(str(tasks_json) + INDEX_SUFFIX)


def _source_stamp(tasks_json: Path) -> str:
    st = tasks_json.stat()
    return f"{FORMAT}:{st.st_size}:{st.st_mtime_ns}"


def build(tasks_json: str | os.PathLike, out: Optional[str | os.PathLike] = None) -> Path:
    """Write the index of `tasks_json` (to `out`, default beside it), atomically; returns its
    path. Raises ValueError for a tasks file that is not a JSON object, OSError."""
    src = Path(tasks_json)
    dst = Path(out) if out is not None else index_path(src)
    stamp = _source_stamp(src)
    tmp = dst.with_name(f".{dst.name}.{os.getpid()}.tmp")
    tmp.unlink(missing_ok=True)
    db = sqlite3.connect(tmp, isolation_level=None)
    try:
        db.execute("PRAGMA journal_mode=OFF")
        db.execute("PRAGMA synchronous=OFF")
        db.execute("PRAGMA cache_size=-262144")   # 256 MiB: the keys are hashes, inserted at random
        db.executescript(_SCHEMA)
        db.execute("BEGIN")
        try:
            n = _fill(db, iter_tasks_chunks(src, share=False))
        except NotOneEntryPerLine:
            db.execute("ROLLBACK")
            db.executescript("DELETE FROM tasks; DELETE FROM entries; DELETE FROM refused;")
            db.execute("BEGIN")
            n = _fill(db, iter([load_tasks_file(src)]))
        _aliases(db)
        db.execute("INSERT INTO meta VALUES ('source', ?), ('tasks', ?)", (stamp, str(n)))
        db.execute("COMMIT")
    except BaseException:
        db.close()
        tmp.unlink(missing_ok=True)
        raise
    db.close()
    os.replace(tmp, dst)
    return dst


def _fill(db: sqlite3.Connection, chunks) -> int:
    """Insert every entry of `chunks` (dicts key -> entry); returns the number of tasks. A
    task listed by its id is also known, and leased, by its name (`broker.core.admit_tasks`):
    an explicit key always wins over a name alias of the same text."""
    n = 0
    for chunk in chunks:
        rows, keys, aliases, refused = [], [], [], []
        for key, entry in chunk.items():
            key = str(key)
            try:
                text = _COMPACT.encode(entry)
            except (TypeError, ValueError):
                text = None
            why = check_reference(key, entry, encoded=text)
            name = entry.get("name") if isinstance(entry, dict) else None
            alias = name if isinstance(name, str) and name and key == entry.get("task_id") else None
            if why is not None:
                log.error("refused when loading the task set: %s", why)
                refused.append((key, why))
                if alias is not None:
                    refused.append((alias, why))
                continue
            n += 1
            rows.append((n, entry["task_id"], alias or key, text))
            keys.append((key, n))
            if alias is not None:
                aliases.append((alias, n))
        db.executemany("INSERT OR IGNORE INTO tasks VALUES (?, ?, ?, ?)", rows)
        db.executemany("INSERT OR REPLACE INTO entries VALUES (?, ?)", keys)
        db.executemany("INSERT OR IGNORE INTO entries VALUES (?, ?)", aliases)
        db.executemany("INSERT OR IGNORE INTO refused VALUES (?, ?)", refused)
    return n


def _aliases(db: sqlite3.Connection) -> None:
    """A name alias that lost to an explicit key of the same text: the task is leased by id."""
    db.execute("""
        UPDATE tasks SET ref = task_id WHERE ref != task_id
          AND NOT EXISTS (SELECT 1 FROM entries e WHERE e.key = tasks.ref AND e.n = tasks.n)""")


def open_index(tasks_json: str | os.PathLike, cache_size: int = 65_536) -> "TaskIndex":
    """The index of `tasks_json`, built first when missing or not of this file's version."""
    src = Path(tasks_json)
    path = index_path(src)
    stamp = _source_stamp(src)
    if not path.exists() or _stamp_of(path) != stamp:
        log.info("indexing the task set %s", src)
        build(src, path)
    return TaskIndex(path, cache_size)


def _stamp_of(path: Path) -> Optional[str]:
    try:
        db = sqlite3.connect(f"file:{path}?mode=ro", uri=True)
        try:
            row = db.execute("SELECT value FROM meta WHERE key = 'source'").fetchone()
        finally:
            db.close()
    except sqlite3.Error:
        return None
    return row[0] if row else None


class TaskIndex(Mapping[str, dict]):
    """Reference -> lease entry, from the index file (read-only). `refused` maps each refused
    reference to its reason; `task_count()`, `ref_of_id()` and `task_id_at()` serve the
    curriculum and the broker without reading every entry."""

    def __init__(self, path: str | os.PathLike, cache_size: int = 65_536):
        self.path = Path(path)
        try:
            self._db = sqlite3.connect(f"file:{self.path}?mode=ro", uri=True, check_same_thread=False)
            self._count = int(self._db.execute("SELECT value FROM meta WHERE key = 'tasks'").fetchone()[0])
            self.refused: dict[str, str] = dict(self._db.execute("SELECT key, reason FROM refused"))
        except (sqlite3.Error, TypeError) as exc:
            raise TaskIndexError(f"task index {self.path}: {exc}") from None
        self._cache: OrderedDict[str, dict] = OrderedDict()
        self._cache_size = cache_size
        self._keys: Optional[int] = None

    def close(self) -> None:
        self._db.close()

    def __getitem__(self, key: str) -> dict:
        hit = self._cache.get(key)
        if hit is not None:
            self._cache.move_to_end(key)
            return hit
        row = self._db.execute("SELECT t.entry FROM entries e JOIN tasks t ON t.n = e.n"
                               " WHERE e.key = ?", (key,)).fetchone()
        if row is None:
            raise KeyError(key)
        entry = json.loads(row[0])
        self._cache[key] = entry
        if len(self._cache) > self._cache_size:
            self._cache.popitem(last=False)
        return entry

    def __contains__(self, key: object) -> bool:
        if key in self._cache:
            return True
        return isinstance(key, str) and self._db.execute(
            "SELECT 1 FROM entries WHERE key = ?", (key,)).fetchone() is not None

    def __iter__(self) -> Iterator[str]:
        for (key,) in self._db.execute("SELECT key FROM entries ORDER BY key"):
            yield key

    def __len__(self) -> int:
        if self._keys is None:
            self._keys = self._db.execute("SELECT COUNT(*) FROM entries").fetchone()[0]
        return self._keys

    def task_count(self) -> int:
        """How many tasks (each once, however many references name it)."""
        return self._count

    def task_ids(self) -> Iterator[str]:
        for (tid,) in self._db.execute("SELECT task_id FROM tasks ORDER BY n"):
            yield tid

    def ref_of_id(self, task_id: str) -> Optional[str]:
        """The reference a lease of `task_id` names (its name when it has one)."""
        row = self._db.execute("SELECT ref FROM tasks WHERE task_id = ?", (task_id,)).fetchone()
        return row[0] if row else None

    def task_id_at(self, n: int) -> str:
        """The task numbered `n` (1 .. task_count()): uniform sampling without a list."""
        row = self._db.execute("SELECT task_id FROM tasks WHERE n = ?", (n,)).fetchone()
        if row is None:
            raise IndexError(n)
        return row[0]

    def has_task_id(self, task_id: str) -> bool:
        return self._db.execute("SELECT 1 FROM tasks WHERE task_id = ?", (task_id,)).fetchone() is not None

    @property
    def ids(self) -> "TaskIds":
        """Every task id, as a lazy sequence (what the curriculum samples from)."""
        return TaskIds(self)


class TaskIds(Sequence[str]):
    """The task ids of an index in its order, read on demand (len, position, membership)."""

    def __init__(self, index: TaskIndex):
        self._index = index

    def __len__(self) -> int:
        return self._index.task_count()

    def __getitem__(self, i):  # type: ignore[override]
        if isinstance(i, slice):
            return [self[j] for j in range(*i.indices(len(self)))]
        if i < 0:
            i += len(self)
        if not 0 <= i < len(self):
            raise IndexError(i)
        return self._index.task_id_at(i + 1)

    def __contains__(self, task_id: object) -> bool:
        return isinstance(task_id, str) and self._index.has_task_id(task_id)

    def many(self, positions: Sequence[int]) -> list[str]:
        """The ids at `positions` (0-based), in that order, in one query."""
        rows = self._index._db.execute(
            "SELECT t.task_id FROM json_each(?) j JOIN tasks t ON t.n = j.value + 1 ORDER BY j.key",
            (json.dumps(list(positions)),)).fetchall()
        if len(rows) != len(positions):
            raise IndexError(f"positions out of range: {positions}")
        return [r[0] for r in rows]

    def present(self, task_ids: Sequence[str]) -> set[str]:
        """Which of `task_ids` are tasks of this index, in one query (a lookup per id from
        Python costs ~10 us; the curriculum asks this for every task with a record)."""
        rows = self._index._db.execute(
            "SELECT t.task_id FROM json_each(?) j JOIN tasks t ON t.task_id = j.value",
            (json.dumps(list(task_ids)),)).fetchall()
        return {r[0] for r in rows}

    def __iter__(self) -> Iterator[str]:
        return self._index.task_ids()
