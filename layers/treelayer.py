"""Layers: read-only directory trees stacked above an image, below a sandbox's writable layer.

A layer is a plain squashfs file (no SIF wrapper: it is never run on its own) holding a tree
whose paths are absolute in the sandbox (a repository built with prefix `/work` holds
`work/...`). Built reproducibly, like an image: the tree is copied into scratch space and
sanitised (setuid/setgid bits cleared, devices, fifos and sockets dropped; mode bits,
executable bits, symlinks and hard links kept), every mtime set to LAYER_MTIME_S, then packed
with `mksquashfs -all-root -no-xattrs -comp zstd -mkfs-time 0`: owned by root inside, so the
same tree gives the same bytes wherever it lives and whenever it is built.

Deletions (a layer captured from a sandbox's writable layer: `layer_from_archive`) are OCI
whiteouts, kept as files in the squashfs: `.wh.NAME` deletes NAME of the layers below;
`.wh.NAME` next to a directory NAME of the same layer, or `.wh..wh..opq` inside it, makes NAME
opaque (nothing below shows through). The node turns them into the kernel overlay's whiteouts
when it mounts the layer (`nodeagent.sandbox.layerfs`).

Stored content-addressed in the image store: `layers/sha256/<hex>.sqfs`, <hex> = sha256 of the
file; `recipes/<hash>` maps what it was built from (the tree's content key, or the archive's
sha256 and the caller's key) to the digest; built once under the recipe's lock
(`ImageStore.build_or_reuse(kind="layer")`), concurrent builders wait and reuse.

Must not import: zmq, controller.*, nodeagent.* (the node mounts layers; this only builds them).
"""

from __future__ import annotations

import hashlib
import io
import os
import tarfile
import tempfile
from pathlib import Path
from typing import Any

from layers.build import make_squashfs
from layers.staging import BuildError, Progress, _extract_members, sanitise_tree, source_content_key, stage_directory
from layers.store import ImageStore

LAYER_RULES_VERSION = 1   # part of every layer recipe: bump when the rules above change
LAYER_MTIME_S = 0
DEFAULT_PREFIX = "/work"


class LayerError(BuildError):
    """A layer could not be built (bad tree, bad archive, failed mksquashfs)."""


def _check_prefix(prefix: str) -> str:
    rel = os.path.normpath(prefix).lstrip("/")
    if not prefix.startswith("/") or rel.startswith("..") or "\n" in prefix:
        raise LayerError(f"layer prefix {prefix!r} must be an absolute path inside the sandbox")
    return "" if rel == "." else rel


def _fix_times(root: Path) -> None:
    t = LAYER_MTIME_S * 10**9
    for dirpath, dirnames, filenames in os.walk(root):
        for name in dirnames + filenames:
            os.utime(os.path.join(dirpath, name), ns=(t, t), follow_symlinks=False)
    os.utime(root, ns=(t, t))


def _pack(root: Path, out: Path, progress: Progress | None) -> Path:
    """Sanitise, fix the times, mksquashfs `root` into `out` (atomically)."""
    sanitise_tree(root)
    os.chmod(root, 0o755)
    _fix_times(root)
    partial = out.with_name(f".{out.name}.{os.getpid()}.tmp")
    try:
        make_squashfs(root, partial, mkfs_time_s=0, progress=progress)
        os.chmod(partial, 0o644)
        os.replace(partial, out)
    finally:
        partial.unlink(missing_ok=True)
    return out


def build_layer_file(tree: Path | str, out: Path | str, prefix: str = DEFAULT_PREFIX,
                     workdir: Path | str | None = None, progress: Progress | None = None) -> Path:
    """A layer file at `out` holding the directory `tree` at `prefix` (the tree is not
    modified). Directories the prefix adds above the tree are 0755."""
    tree, out = Path(tree), Path(out)
    if not tree.is_dir():
        raise LayerError(f"layer source {tree} is not a directory")
    rel = _check_prefix(prefix)
    with tempfile.TemporaryDirectory(prefix="paddock-layer-", dir=workdir or out.parent) as tmp:
        root = Path(tmp) / "root"
        target = root / rel if rel else root
        target.parent.mkdir(parents=True, exist_ok=True)
        for d in [root, *[p for p in target.parents if root in p.parents]]:
            os.chmod(d, 0o755)
        stage_directory(tree, target)
        return _pack(root, out, progress)


def layer_recipe(tree: Path | str, prefix: str = DEFAULT_PREFIX) -> dict[str, Any]:
    """What a tree layer is keyed by in the store: the tree's content and the prefix."""
    key = source_content_key(Path(tree))
    return {"kind": "layer-tree", "tree_sha256": key["tree_sha256"], "prefix": prefix,
            "rules": LAYER_RULES_VERSION}


def ensure_tree_layer(store: ImageStore, tree: Path | str, prefix: str = DEFAULT_PREFIX,
                      progress: Progress | None = None) -> tuple[str, Path]:
    """The layer of `tree` at `prefix`: ("sha256:<hex>", its path in the store), built once."""
    def builder(out: Path) -> None:
        build_layer_file(tree, out, prefix, workdir=store.root / "tmp", progress=progress)
    return store.build_or_reuse(layer_recipe(tree, prefix), builder, progress, kind="layer")


def build_layer_from_archive(archive: bytes, out: Path | str, workdir: Path | str | None = None,
                             progress: Progress | None = None) -> Path:
    """A layer file from a tar archive of absolute sandbox paths (a sandbox's `diff_archive()`:
    deletions as `.wh.NAME` entries, kept as the layer's whiteouts). Hard links, devices and
    members that would escape are refused or dropped as for any tar source."""
    out = Path(out)
    with tempfile.TemporaryDirectory(prefix="paddock-layer-", dir=workdir or out.parent) as tmp:
        root = Path(tmp) / "root"
        root.mkdir()
        try:
            with tarfile.open(fileobj=io.BytesIO(archive), mode="r:") as tf:
                members = [m for m in tf if m.isfile() or m.isdir() or m.issym()]
                _extract_members(tf, root, members, {})
        except tarfile.TarError as e:
            raise LayerError(f"layer archive is not a readable tar: {e}") from e
        return _pack(root, out, progress)


def archive_recipe(archive: bytes, key: dict[str, Any]) -> dict[str, Any]:
    return {"kind": "layer-archive", "sha256": hashlib.sha256(archive).hexdigest(), "key": key,
            "rules": LAYER_RULES_VERSION}


def ensure_archive_layer(store: ImageStore, archive: bytes, key: dict[str, Any],
                         progress: Progress | None = None) -> tuple[str, Path]:
    """The layer of a diff archive, stored once: (digest, path)."""
    def builder(out: Path) -> None:
        build_layer_from_archive(archive, out, workdir=store.root / "tmp", progress=progress)
    return store.build_or_reuse(archive_recipe(archive, key), builder, progress, kind="layer")


def lookup_layer(store: ImageStore, recipe: dict[str, Any]) -> Path | None:
    """The stored layer a recipe built earlier, if it is still present."""
    digest = store.lookup_recipe(recipe, kind="layer")
    return store.path_of(digest, "layer") if digest else None
