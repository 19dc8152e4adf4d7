"""Publishing a task set for a run: task content as blobs on shared storage, leases by reference.

`publish(taskset, images, blob_root)` writes each task's content once (content-addressed:
`controller.contracts.taskblobs`) and returns the tasks file (`tasks.json` of the run dir:
task ref, by id and by name, -> the small reference a lease carries). A task whose content is
over `max_blob_bytes` is refused here, naming it. The default blob root is `<bank>/blobs`,
shared by every run of the bank (the same task is written once).

Must not import zmq, nodeagent.
"""
from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from controller.contracts.taskblobs import MAX_BLOB_BYTES, canonical_bytes, reference, write_blob
from controller.contracts.tasks import TaskError

BLOBS_DIR = "blobs"


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
