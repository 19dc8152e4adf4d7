"""The on-disk write discipline every part of Paddock shares: a reader never sees half a file.

`atomic_write(path, data)` writes `data` to a temporary name in the same directory, optionally
fsyncs it, sets its mode and renames it into place (`os.replace`), then (with `fsync`) fsyncs the
directory so the rename survives a crash. `atomic_write_with(path, write)` does the same for a
writer that needs a path (pyarrow, DuckDB, mksquashfs). `sha256_file` hashes a file in 1 MiB
chunks.

It lives in `controller.ondisk` (beside the vocabulary, not in it) because the rule it implements
is part of the on-disk contract between writers (node agents, controller, image builder) and
readers (DuckDB views, the bank, the image store). No sockets, no database, no processes.
Must not import: anything of Paddock.
"""
from __future__ import annotations

import hashlib
import itertools
import os
from pathlib import Path
from typing import Any, Callable

CHUNK_BYTES = 1 << 20
_SEQ = itertools.count()   # a temporary name is unique per process, thread and call


def _tmp_name(path: Path) -> Path:
    return path.with_name(f".{path.name}.{os.getpid()}.{next(_SEQ)}.tmp")


def fsync_dir(directory: os.PathLike | str) -> None:
    """Make a rename or a new name in `directory` durable."""
    fd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def atomic_write_with(path: os.PathLike | str, write: Callable[[Path], Any], *, fsync: bool = True,
                      mode: int | None = None) -> Path:
    """Call `write(tmp)` to make the file under a temporary name, then rename it onto `path`.
    On any exception the temporary file is removed and the exception propagates; `path` is
    then untouched (the old content, or absent)."""
    final = Path(path)
    tmp = _tmp_name(final)
    try:
        write(tmp)
        if mode is not None:
            os.chmod(tmp, mode)
        if fsync:
            fd = os.open(tmp, os.O_RDONLY)
            try:
                os.fsync(fd)
            finally:
                os.close(fd)
        os.replace(tmp, final)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    if fsync:
        fsync_dir(final.parent)
    return final


def atomic_write(path: os.PathLike | str, data: bytes | str, *, fsync: bool = True,
                 mode: int | None = None) -> Path:
    """Write `data` (str is UTF-8) to `path` atomically."""
    raw = data.encode() if isinstance(data, str) else data
    return atomic_write_with(path, lambda tmp: tmp.write_bytes(raw), fsync=fsync, mode=mode)


def sha256_file(path: os.PathLike | str) -> str:
    """Hex SHA-256 of a file's bytes."""
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(CHUNK_BYTES), b""):
            h.update(chunk)
    return h.hexdigest()
