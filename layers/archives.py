"""Image archives: what `docker save` writes, and OCI image layouts packed in a tarball.

Two shapes of one tar file (plain, or gzip/bzip2/xz-compressed) are recognised by their
top-level names, never by the file's name:

- **docker-archive** (`docker save` before Docker 25): `manifest.json` is a list of
  `{"Config": "<id>.json", "RepoTags": [...], "Layers": ["<id>/layer.tar", ...]}`; the first
  entry is the image. Its layers are applied in order (whiteouts honoured, as OCI layers);
  a plain layer tar is checked against the config's `rootfs.diff_ids`.
- **oci-archive** (`docker save` from Docker 25, `skopeo copy ... oci-archive:`): `oci-layout`
  and `index.json` at the top (a `manifest.json` beside them is ignored): staged exactly as
  an OCI layout directory (`layers.staging.stage_oci_layout`), every blob checked.

Any other tarball is a root filesystem (`layers.staging.stage_tarball`). Before this module a
tarred layout was staged as a root filesystem: the image held `manifest.json` and `blobs/`
and no `/bin/sh`, so it built but could run nothing.

The archive is unpacked into scratch space first (members sanitised as any tar source:
nothing escapes the scratch directory). Must not import: zmq, controller.*, layers.store,
layers.build.
"""

from __future__ import annotations

import hashlib
import json
import os
import tarfile
from pathlib import Path
from typing import Any

from layers.staging import (
    BuildError,
    Progress,
    Times,
    _apply_oci_layer,
    _extract_members,
    _noop,
    apply_times,
    open_tar,
    sanitise_tree,
    stage_oci_layout,
)

DOCKER_ARCHIVE = "docker-archive"
OCI_ARCHIVE = "oci-archive"
HASH_CHUNK_BYTES = 1 << 20
TOP_NAMES_SCANNED_MAX = 100_000   # members looked at to classify a tarball


def _top(name: str) -> str:
    return os.path.normpath(name.lstrip("/")).removeprefix("./")


def archive_kind(path: Path) -> str | None:
    """DOCKER_ARCHIVE or OCI_ARCHIVE when `path` is a tarball of that shape, else None (a
    root filesystem tarball, or not a tar file this module reads)."""
    names: set[str] = set()
    try:
        with tarfile.open(path) as tf:
            for i, m in enumerate(tf):
                if i >= TOP_NAMES_SCANNED_MAX:
                    break
                top = _top(m.name)
                if "/" not in top:
                    names.add(top)
    except (tarfile.TarError, OSError, EOFError):
        return None
    if {"oci-layout", "index.json"} <= names:
        return OCI_ARCHIVE
    if "manifest.json" in names:
        return DOCKER_ARCHIVE
    return None


def unpack_archive(path: Path, scratch: Path) -> Path:
    """The archive's members under `scratch/archive` (sanitised, no escapes)."""
    dest = scratch / "archive"
    dest.mkdir()
    try:
        with open_tar(path, scratch) as tf:
            _extract_members(tf, dest, (m for m in tf if m.isfile() or m.isdir()), {})
    except (tarfile.TarError, OSError, EOFError) as e:
        raise BuildError(f"cannot read image archive {path}: {e}") from e
    return dest


def _docker_manifest(unpacked: Path, path: Path) -> tuple[list[str], list[str]]:
    """(layer paths, diff_ids) of the first image of a docker-archive."""
    try:
        entries = json.loads((unpacked / "manifest.json").read_text())
        entry = entries[0]
        layers = [str(p) for p in entry["Layers"]]
        config = json.loads((unpacked / entry["Config"]).read_text())
        diff_ids = list(config.get("rootfs", {}).get("diff_ids") or [])
    except (OSError, ValueError, KeyError, IndexError, TypeError) as e:
        raise BuildError(f"docker archive {path}: cannot read manifest.json / its config: {e!r}") from e
    return layers, diff_ids


def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(HASH_CHUNK_BYTES):
            h.update(chunk)
    return "sha256:" + h.hexdigest()


def _is_plain_tar(path: Path) -> bool:
    with open(path, "rb") as f:
        head = f.read(512)
    return len(head) == 512 and head[257:262] == b"ustar"


def stage_docker_archive(unpacked: Path, dest: Path, path: Path, progress: Progress,
                         epoch_s: int = 0) -> str:
    """Apply a docker-archive's layers in order into `dest`. Returns the config's digest."""
    layers, diff_ids = _docker_manifest(unpacked, path)
    times: Times = {}
    for i, rel in enumerate(layers):
        blob = unpacked / _top(rel)
        if not blob.is_file() or ".." in Path(_top(rel)).parts:
            raise BuildError(f"docker archive {path}: layer {rel} is missing")
        if i < len(diff_ids) and _is_plain_tar(blob) and _sha256(blob) != diff_ids[i]:
            raise BuildError(f"docker archive {path}: layer {rel} is corrupt (does not hash to "
                             f"its diff_id {diff_ids[i]})")
        progress(f"applying layer {i + 1}/{len(layers)} {rel}")
        try:
            with open_tar(blob, dest.parent) as tf:
                _apply_oci_layer(tf, dest, times)
        except (tarfile.TarError, OSError, EOFError) as e:
            raise BuildError(f"docker archive {path}: layer {rel}: {e}") from e
    sanitise_tree(dest)
    apply_times(dest, {p: t for p, t in times.items() if os.path.lexists(p)}, epoch_s)
    entry = json.loads((unpacked / "manifest.json").read_text())[0]
    return _sha256(unpacked / entry["Config"])


def stage_archive(path: Path, dest: Path, kind: str, progress: Progress | None = None,
                  epoch_s: int = 0) -> str:
    """Stage an image archive of `kind` into `dest` (scratch space beside it); returns the
    `source` metadata: `oci-archive:<manifest digest>` or `docker-archive:<config digest>`."""
    progress = progress or _noop
    scratch = dest.parent
    progress(f"unpacking {kind} {path}")
    unpacked = unpack_archive(path, scratch)
    if kind == OCI_ARCHIVE:
        return f"{OCI_ARCHIVE}:{stage_oci_layout(unpacked, dest, progress, epoch_s)}"
    return f"{DOCKER_ARCHIVE}:{stage_docker_archive(unpacked, dest, path, progress, epoch_s)}"


def archive_content_key(path: Path, kind: str) -> dict[str, Any]:
    """The store's recipe key of an archive: its kind and the sha256 of the file (a kind of its
    own, so an image staged as a root filesystem before this module is never reused)."""
    return {"kind": kind, "sha256": _sha256(path).removeprefix("sha256:")}
