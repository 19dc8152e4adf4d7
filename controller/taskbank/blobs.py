"""Publishing a task set for a run: task content as blobs on shared storage, leases by reference.

`publish(taskset, images, blob_root)` writes each task's content once (content-addressed:
`controller.ondisk.taskblobs`) and returns the tasks file (`tasks.json` of the run dir:
task ref, by id and by name, -> the small reference a lease carries). A task whose content is
over `max_blob_bytes` is refused here, naming it. `blob_root(bank, taskset, run_dir)` says where
a run publishes: `<bank>/blobs` for a set stored in the bank, shared by every run of the bank (a
task already there is not written again: the blob's name is its hash), `<run_dir>/blobs` only
for a set that is not in the bank (the built-in one) or a bank that cannot be written.

Must not import zmq, nodeagent.
"""
from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from controller.contracts.tasks import TaskError
from controller.ondisk.taskblobs import MAX_BLOB_BYTES, canonical_bytes, reference, write_blob
from controller.taskbank.bank import TaskBank

BLOBS_DIR = "blobs"


def blob_root(bank: str | os.PathLike | None, taskset, run_dir: str | os.PathLike) -> Path:
    """Where a run's task blobs go: `<bank>/blobs` when `taskset` is stored in the bank at `bank`
    (the default bank if empty), else `<run_dir>/blobs`. The bank must be on storage every
    node reads (it is, for a Slurm run: the head and the agents read the same paths)."""
    store = TaskBank(bank or None)
    try:
        in_bank = store.manifest_path(taskset.name).is_file()
    except TaskError:           # a name no bank set can have (the built-in set's is fine)
        in_bank = False
    if in_bank:
        root = store.root / BLOBS_DIR
        try:
            root.mkdir(exist_ok=True)
            if os.access(root, os.W_OK | os.X_OK):
                return root
        except OSError:
            pass                # a read-only bank: this run keeps its own copy
    return Path(run_dir) / BLOBS_DIR


def publish(taskset, images: str | dict[str, tuple[str, Path]], blob_root: str | os.PathLike,
            max_blob_bytes: int = MAX_BLOB_BYTES) -> dict[str, dict[str, Any]]:
    """Task ref (id and name) -> lease reference. `images`: one image digest for every task, or
    task id -> (digest, path). Raises TaskError naming a task that is too large."""
    root = str(Path(blob_root).resolve())
    out: dict[str, dict[str, Any]] = {}
    for t in taskset.tasks:
        content = t.canonical()
        data = canonical_bytes(content)
        if len(data) > max_blob_bytes:
            raise TaskError(f"task {t.name!r} ({t.task_id}): its content is {len(data)} bytes, over the "
                            f"{max_blob_bytes}-byte limit (put a repository in a layer: `paddock tasks "
                            "import swe` does)")
        digest = write_blob(root, data)
        digest_image = images if isinstance(images, str) else images[t.task_id][0]
        ref = reference(t.task_id, content, {"root": root, "digest": digest, "bytes": len(data)},
                        image_digest=digest_image, taskset_hash=taskset.manifest_hash,
                        split="heldout" if t.task_id in taskset.heldout else "train")
        out[t.task_id] = ref
        out[t.name] = ref
    return out
