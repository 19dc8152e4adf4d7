"""Task blobs: a task's content, content-addressed on shared storage, and the lease reference.

Tasks travel by reference. The content of a task (`Task.canonical()` as canonical JSON) is
written once to `<root>/sha256/<hh>/<hex>.json`, where `<hex>` is the SHA-256 of the bytes; a
lease carries only the task's *reference*: its id and small metadata (`REF_KEYS`) plus
`blob = {"root", "digest", "bytes"}`. The node reads the blob by digest, checks its hash and
size (`read_blob`), caches it (nodeagent/agent/taskcache.py) and decodes it into the full
`LeaseTask`. The controller never holds task content: `check_reference` refuses, naming the
task, any entry of the tasks file that is not a small, well-formed reference.

The tasks file (`tasks.json` of a run) lists each task once, by id, one entry per line
(`write_tasks_file`): still one JSON object for any reader, and `load_tasks_file` reads it line
by line, sharing the strings and limits every task repeats, so 450,000 tasks load in a few
hundred MB (docs/operations.md, sizing). The broker adds each task's name as an alias.

No I/O beyond reading and writing blob files and the tasks file. Must not import: zmq, sqlite3, socket,
subprocess.
"""
from __future__ import annotations

import hashlib
import itertools
import json
import os
import re
import sys
import tempfile
from pathlib import Path
from typing import Any, Iterator, Mapping

from controller.contracts.tasks import TaskError

BLOB_DIR = "sha256"
MAX_REFERENCE_BYTES = 16 * 1024          # one entry of the tasks file (what a lease carries)
MAX_BLOB_BYTES = 256 * 1024 * 1024       # one task's content (a repository is a layer, not a blob)
REF_KEYS = ("task_id", "name", "family", "image_digest", "taskset_hash", "split", "limits", "blob")
_DIGEST = re.compile(r"sha256:[0-9a-f]{64}")
LOAD_CHUNK = 10_000                      # tasks-file lines parsed at once
_COMPACT = json.JSONEncoder(separators=(",", ":"))


def canonical_bytes(content: Mapping[str, Any]) -> bytes:
    return json.dumps(content, sort_keys=True, separators=(",", ":")).encode()


def _check_digest(digest: Any) -> None:
    if not isinstance(digest, str) or not _DIGEST.fullmatch(digest):
        raise TaskError(f"task blob digest must be 'sha256:<64 hex digits>', got {digest!r}")


def blob_path(root: str | os.PathLike, digest: str) -> Path:
    _check_digest(digest)
    hex_ = digest[7:]
    return Path(root) / BLOB_DIR / hex_[:2] / f"{hex_}.json"


def write_blob(root: str | os.PathLike, data: bytes) -> str:
    """Store `data` (idempotent: an existing blob is kept); return its digest."""
    digest = "sha256:" + hashlib.sha256(data).hexdigest()
    path = blob_path(root, digest)
    if path.exists() and path.stat().st_size == len(data):
        return digest
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=".blob-", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise
    return digest


def read_blob(path: str | os.PathLike, digest: str, max_bytes: int = MAX_BLOB_BYTES) -> bytes:
    """The bytes at `path`, checked against `digest` and `max_bytes`. Raises TaskError."""
    try:
        size = os.stat(path).st_size
        if size > max_bytes:
            raise TaskError(f"task blob {digest} is {size} bytes; the limit is {max_bytes}")
        data = Path(path).read_bytes()
    except OSError as exc:
        raise TaskError(f"task blob {digest} cannot be read at {path}: {exc.strerror or exc}") from None
    got = "sha256:" + hashlib.sha256(data).hexdigest()
    if got != digest:
        raise TaskError(f"task blob at {path} hashes to {got}, not {digest} (corrupt or replaced)")
    return data


def reference(task_id: str, content: Mapping[str, Any], blob: Mapping[str, Any], **meta: Any) -> dict:
    """A lease's task reference: id, the small metadata of `content`, and the blob."""
    ref = {"task_id": task_id, "name": content.get("name", ""), "family": content.get("family", ""),
           "limits": dict(content.get("limits") or {}), "blob": dict(blob)}
    ref.update({k: v for k, v in meta.items() if k in REF_KEYS})
    return ref


def check_reference(key: str, entry: Any, max_bytes: int = MAX_REFERENCE_BYTES,
                    encoded: str | None = None) -> str | None:
    """Why the tasks-file entry `key` cannot be leased (None if it can): not an object, no
    task id, larger than `max_bytes` as JSON (a task inlined instead of referenced).
    `encoded`: the entry as compact JSON, when the caller has it already."""
    if type(entry) is not dict and not isinstance(entry, Mapping):  # type(): the common case, fast
        return f"task {key!r}: entry must be an object, got {type(entry).__name__}"
    if not isinstance(entry.get("task_id"), str) or not entry["task_id"]:
        return f"task {key!r}: entry has no 'task_id'"
    try:
        size = len(encoded if encoded is not None else _COMPACT.encode(entry))
    except (TypeError, ValueError) as exc:
        return f"task {key!r}: entry is not JSON data: {exc}"
    if size > max_bytes:
        return (f"task {key!r} ({entry.get('name') or entry['task_id']}): its lease entry is {size} bytes, over "
                f"the {max_bytes}-byte limit: a lease carries a reference (task id, metadata, blob digest), "
                "not the task's content")
    blob = entry.get("blob")
    if blob is not None:
        if type(blob) is not dict and not isinstance(blob, Mapping) or not isinstance(blob.get("root"), str):
            return f"task {key!r}: 'blob' must be an object with 'root', 'digest' and 'bytes'"
        try:
            _check_digest(blob.get("digest"))
        except TaskError as exc:
            return f"task {key!r}: {exc}"
    return None


def inflate(entry: Mapping[str, Any]) -> dict:
    """A tasks-file entry with its content: a reference's blob read (verified) and merged under
    the reference's metadata; an inline entry as is (runs written before references)."""
    blob = entry.get("blob")
    if not isinstance(blob, Mapping):
        return dict(entry)
    content = json.loads(read_blob(blob_path(blob["root"], blob["digest"]), blob["digest"]))
    meta = {k: v for k, v in entry.items() if k != "blob"}
    return {**content, **meta, "limits": content.get("limits", meta.get("limits"))}


def write_tasks_file(path: str | os.PathLike, refs: Mapping[str, Mapping[str, Any]]) -> Path:
    """Write the tasks file: each reference once, keyed by its task id, one per line
    (entries of `refs` under another key, its name, are the same task and are skipped)."""
    path = Path(path)
    lines = [json.dumps(key) + ":" + json.dumps(ref, separators=(",", ":"))
             for key, ref in refs.items()
             if not (isinstance(ref, Mapping) and ref.get("task_id") != key and ref.get("task_id") in refs)]
    fd, tmp = tempfile.mkstemp(prefix=".tasks-", dir=path.parent)
    with os.fdopen(fd, "w") as f:
        f.write("{\n" + ",\n".join(lines) + "\n}\n")
    os.replace(tmp, path)
    return path


_SHARED_KEYS = ("family", "split", "taskset_hash", "image_digest")


class _Sharer:
    """One object for every equal string a task repeats (family, split, set hash, image,
    blob root) and every equal limits dict: the tasks file's entries are parsed one by one."""

    def __init__(self):
        self.limits: dict[tuple, dict] = {}

    def entry(self, e: Any) -> Any:
        if not isinstance(e, dict):
            return e
        for k in _SHARED_KEYS:
            if isinstance(e.get(k), str):
                e[k] = sys.intern(e[k])
        lim = e.get("limits")
        if isinstance(lim, dict):
            try:
                e["limits"] = self.limits.setdefault(tuple(sorted(lim.items())), lim)
            except TypeError:                     # an unhashable value: kept as it is
                pass
        blob = e.get("blob")
        if isinstance(blob, dict) and isinstance(blob.get("root"), str):
            blob["root"] = sys.intern(blob["root"])
        return e


class NotOneEntryPerLine(ValueError):
    """The tasks file is not in `write_tasks_file`'s form (one entry per line): parse it whole."""


def iter_tasks_chunks(path: str | os.PathLike, share: bool = True) -> Iterator[dict[str, Any]]:
    """The entries of a tasks file in `write_tasks_file`'s form, `LOAD_CHUNK` lines per dict
    (its text is never held whole: C-speed json.loads per chunk, bounded memory). Raises
    NotOneEntryPerLine, possibly after some chunks, when the file is not in that form (a
    hand-written or indented file: `load_tasks_file` parses it whole), OSError otherwise.
    `share`: one object for the strings and limits entries repeat (for entries kept in memory)."""
    sharer = _Sharer() if share else None
    with open(path) as f:
        if f.readline().strip() != "{":
            raise NotOneEntryPerLine(f"{path}: not one entry per line")
        while True:
            lines = [ln.rstrip().removesuffix(",") for ln in itertools.islice(f, LOAD_CHUNK)]
            if not lines:
                raise NotOneEntryPerLine(f"{path}: no closing '}}'")   # truncated: parsed whole, it fails
            done = "}" in lines
            body = ",".join(ln for ln in (lines[:lines.index("}")] if done else lines) if ln)
            try:
                chunk = json.loads("{" + body + "}")
            except ValueError as exc:
                raise NotOneEntryPerLine(f"{path}: {exc}") from None
            yield {key: sharer.entry(value) for key, value in chunk.items()} if sharer else chunk
            if done:
                return


def load_tasks_file(path: str | os.PathLike) -> dict[str, Any]:
    """The tasks file: key -> entry. A file of `write_tasks_file` is parsed an entry at a time
    (`iter_tasks_chunks`); any other JSON object (older runs, hand-written files) is parsed
    whole. Raises ValueError (json.JSONDecodeError) or OSError."""
    out: dict[str, Any] = {}
    try:
        for chunk in iter_tasks_chunks(path):
            out.update(chunk)
        return out
    except NotOneEntryPerLine:
        pass                # not one entry per line (indented by hand): parsed whole
    share = _Sharer()
    with open(path) as f:
        data = json.loads(f.read())
    if not isinstance(data, dict):
        raise ValueError(f"{path}: the tasks file must hold a JSON object, not {type(data).__name__}")
    return {k: share.entry(v) for k, v in data.items()}
