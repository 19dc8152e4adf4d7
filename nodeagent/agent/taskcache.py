"""The node's task cache: a reference lease's content fetched by digest, verified, kept.

A lease names its task by reference (`controller.ondisk.taskblobs`): `blob = {"root",
"digest", "bytes"}` on shared storage. `TaskCache.resolve(task)` returns the full `LeaseTask`:
from the node's cache directory if this node fetched it before, else read from the shared
root, its SHA-256 checked against the digest, copied into the cache (atomically) and decoded.
A missing, corrupt or oversized blob is a `TaskError` naming the digest (the attempt is
infra_error "task: ..."). Decoded tasks are kept in a small in-memory LRU (`max_tasks`).

`task_layers(image, digests)` resolves a task's layer digests to squashfs files in the image
store that holds `image` (`<store>/sha256/<hex>.sif` → `<store>/layers/sha256/<hex>.sqfs`).

Must not import zmq, nodeagent.agent.daemon, nodeagent.agent.core.
"""
from __future__ import annotations

import json
import os
import tempfile
import threading
from collections import OrderedDict
from pathlib import Path
from typing import Sequence

from controller.contracts.tasks import LeaseTask, TaskError
from controller.ondisk.fileio import atomic_write
from controller.ondisk.taskblobs import blob_path, read_blob
from layers.store import ImageStore, ImageStoreError

CACHE_ENV = "PADDOCK_TASK_CACHE"
MAX_TASKS_IN_MEMORY = 64


def default_cache_dir() -> Path:
    return Path(os.environ.get(CACHE_ENV) or Path(tempfile.gettempdir()) / f"paddock-taskcache-{os.getuid()}")


class TaskCache:
    """Blobs by digest under `directory` (node-local), decoded tasks in memory."""

    def __init__(self, directory: str | os.PathLike | None = None, max_tasks: int = MAX_TASKS_IN_MEMORY):
        self.dir = Path(directory) if directory is not None else default_cache_dir()
        self.max_tasks = max_tasks
        self._decoded: OrderedDict[str, dict] = OrderedDict()
        self._lock = threading.Lock()
        self.fetched = 0          # blobs read from shared storage (not from this node's cache)

    def content(self, digest: str, root: str) -> dict:
        """The task content of blob `digest` (verified), from memory, the node cache or `root`."""
        with self._lock:
            hit = self._decoded.get(digest)
            if hit is not None:
                self._decoded.move_to_end(digest)
                return hit
        local = blob_path(self.dir, digest)
        try:
            data = read_blob(local, digest)
        except TaskError:
            data = read_blob(blob_path(root, digest), digest)
            self._keep(local, data)
            self.fetched += 1
        try:
            content = json.loads(data)
        except ValueError as exc:
            raise TaskError(f"task blob {digest} is not JSON: {exc}") from None
        if not isinstance(content, dict):
            raise TaskError(f"task blob {digest} must hold a JSON object")
        with self._lock:
            self._decoded[digest] = content
            while len(self._decoded) > self.max_tasks:
                self._decoded.popitem(last=False)
        return content

    def _keep(self, local: Path, data: bytes) -> None:
        try:
            local.parent.mkdir(parents=True, exist_ok=True)
            atomic_write(local, data, fsync=False)
        except OSError:
            pass            # a cache that cannot be written only costs a re-fetch

    def resolve(self, task: LeaseTask) -> LeaseTask:
        """`task` itself when its lease carried the content, else the full task from its blob."""
        if task.blob is None:
            return task
        return task.with_content(self.content(task.blob["digest"], task.blob["root"]))


def task_layers(image: Path, digests: Sequence[str]) -> tuple[Path, ...]:
    """The squashfs files of `digests` in the store holding `image`. Raises TaskError."""
    if not digests:
        return ()
    store = ImageStore(Path(image).parent.parent)
    out = []
    for d in digests:
        try:
            out.append(store.layer(d))
        except ImageStoreError as exc:
            raise TaskError(f"task layer {d} is not in the image store at {store.root}: {exc}") from None
    return tuple(out)


_default: TaskCache | None = None


def default_cache() -> TaskCache:
    global _default
    if _default is None:
        _default = TaskCache()
    return _default
