"""Content-addressed image store on (possibly shared) disk.

Layout under `root` (directories 0755, files 0644, so the unprivileged subordinate uid a
sandbox runs as can read every image):

    sha256/<hex>.sif        an image; <hex> = sha256 of the SIF file's bytes
    layers/sha256/<hex>.sqfs  a layer (a squashfs stacked above an image; `layers.treelayer`)
    recipes/<recipe_hash>   text "sha256:<hex>\\n": the image a recipe produced
    locks/<recipe_hash>.lock  fcntl lock held while that recipe is being built
    tmp/                    partial files; renamed into place atomically (same filesystem)

Building a recipe that is already indexed (and whose image is present) reuses the image.
Concurrent builders of one recipe serialise on the recipe's lock; the later one finds the
index entry written by the earlier one and does not build.

Must not import: zmq, controller other than controller.ondisk.fileio, layers.build (builders are
passed in as callables).
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import logging
import os
import re
import tempfile
from pathlib import Path
from typing import Any, Callable

from controller.ondisk.fileio import atomic_write_with, sha256_file  # noqa: F401 (sha256_file: the store's digest)

log = logging.getLogger(__name__)

DIR_MODE = 0o755
FILE_MODE = 0o644
HASH_CHUNK_BYTES = 1 << 20
_HEX64 = re.compile(r"^[0-9a-f]{64}$")

Builder = Callable[[Path], Any]          # writes a SIF file at the given path
StoreProgress = Callable[[str], None]


class ImageStoreError(Exception):
    """Base class of store errors."""


class ImageNotFound(ImageStoreError):
    def __init__(self, ref: str, root: Path):
        self.ref = ref
        super().__init__(f"image {ref} not found in store {root}: build it with `paddock image "
                         f"build SRC --store {root}`, or set $PADDOCK_IMAGE_STORE to the store "
                         f"that has it")


class InvalidImageRef(ImageStoreError):
    """A reference that is neither `sha256:<64 hex>` nor an existing path."""


def recipe_hash(recipe: dict[str, Any]) -> str:
    """sha256 hex of the recipe's canonical JSON."""
    canon = json.dumps(recipe, sort_keys=True, separators=(",", ":"), ensure_ascii=True)
    return hashlib.sha256(canon.encode()).hexdigest()


def _makedirs(path: Path) -> None:
    """mkdir -p with every directory we create set to 0755 regardless of umask."""
    missing = []
    p = path
    while not p.exists():
        missing.append(p)
        p = p.parent
    for d in reversed(missing):
        try:
            d.mkdir()
        except FileExistsError:
            continue
        os.chmod(d, DIR_MODE)


def _hex_of(digest: str) -> str:
    hexd = digest.removeprefix("sha256:")
    if not _HEX64.match(hexd):
        raise InvalidImageRef(f"invalid image digest {digest!r}: want sha256:<64 hex digits>")
    return hexd


class ImageStore:
    def __init__(self, root: os.PathLike | str):
        self.root = Path(root)
        for sub in ("sha256", "recipes", "locks", "tmp", "layers/sha256"):
            _makedirs(self.root / sub)

    # ------------------------------------------------------------ lookup
    def path_of(self, digest: str, kind: str = "image") -> Path:
        """Where the image (kind "image") or layer (kind "layer") with this digest lives."""
        if kind == "layer":
            return self.root / "layers" / "sha256" / f"{_hex_of(digest)}.sqfs"
        return self.root / "sha256" / f"{_hex_of(digest)}.sif"

    def has(self, digest: str, kind: str = "image") -> bool:
        return self.path_of(digest, kind).is_file()

    def layer(self, digest: str) -> Path:
        """Path of the layer with this digest; missing -> ImageNotFound."""
        p = self.path_of(digest, "layer")
        if not p.is_file():
            raise ImageNotFound(f"layer sha256:{_hex_of(digest)}", self.root)
        return p

    def get(self, digest: str) -> Path:
        """Path of the image with this digest (`sha256:<hex>` or bare hex)."""
        p = self.path_of(digest)
        if not p.is_file():
            raise ImageNotFound(f"sha256:{_hex_of(digest)}", self.root)
        return p

    def resolve(self, ref: str | os.PathLike) -> Path:
        """`sha256:<hex>` -> the stored image; anything else is a path that must exist."""
        s = os.fspath(ref)
        if s.startswith("sha256:"):
            return self.get(s)
        p = Path(s)
        if not p.is_file():
            raise ImageNotFound(s, self.root)
        return p

    def digests(self) -> list[str]:
        return sorted(f"sha256:{p.stem}" for p in (self.root / "sha256").glob("*.sif")
                      if _HEX64.match(p.stem))

    def lookup_recipe(self, recipe: dict[str, Any], kind: str = "image") -> str | None:
        """The digest a recipe built earlier, if that image (or layer) is still present."""
        idx = self.root / "recipes" / recipe_hash(recipe)
        try:
            digest = idx.read_text().strip()
        except FileNotFoundError:
            return None
        return digest if self.has(digest, kind) else None

    # ------------------------------------------------------------ writing
    def _atomic_write(self, final: Path, write: Callable[[Path], Any]) -> None:
        atomic_write_with(final, write, mode=FILE_MODE)

    def add(self, sif_path: os.PathLike | str, kind: str = "image") -> tuple[str, Path]:
        """Copy a SIF file (or, kind "layer", a squashfs layer) into the store. Returns
        ("sha256:<hex>", stored path)."""
        src = Path(sif_path)
        hexd = sha256_file(src)
        final = self.path_of(hexd, kind)
        if not final.is_file():
            def copy(tmp: Path) -> None:
                with open(src, "rb") as i, open(tmp, "wb") as o:
                    while chunk := i.read(HASH_CHUNK_BYTES):
                        o.write(chunk)
            self._atomic_write(final, copy)
        return f"sha256:{hexd}", final

    def _index_recipe(self, recipe: dict[str, Any], digest: str) -> None:
        final = self.root / "recipes" / recipe_hash(recipe)
        self._atomic_write(final, lambda tmp: tmp.write_text(digest + "\n"))

    def build_or_reuse(self, recipe: dict[str, Any], builder: Builder,
                       progress: StoreProgress | None = None, kind: str = "image") -> tuple[str, Path]:
        """Return the image (or, kind "layer", the layer) of `recipe`, building it with
        `builder(out_path)` only if no earlier build (by this or any concurrent process)
        produced it."""
        progress = progress or (lambda _m: None)
        rh = recipe_hash(recipe)
        if (digest := self.lookup_recipe(recipe, kind)) is not None:
            progress(f"reusing {digest} for recipe {rh[:12]}")
            return digest, self.path_of(digest, kind)
        lock_path = self.root / "locks" / f"{rh}.lock"
        fd = os.open(lock_path, os.O_RDWR | os.O_CREAT, FILE_MODE)
        try:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                progress(f"waiting for another builder of recipe {rh[:12]}")
                fcntl.flock(fd, fcntl.LOCK_EX)
            if (digest := self.lookup_recipe(recipe, kind)) is not None:
                progress(f"reusing {digest} for recipe {rh[:12]} (built concurrently)")
                return digest, self.path_of(digest, kind)
            progress(f"building recipe {rh[:12]}")
            with tempfile.TemporaryDirectory(prefix="build-", dir=self.root / "tmp") as tmp:
                out = Path(tmp) / ("layer.sqfs" if kind == "layer" else "image.sif")
                builder(out)
                digest, path = self.add(out, kind)
            self._index_recipe(recipe, digest)
            log.info("built %s %s for recipe %s", kind, digest, rh)
            return digest, path
        finally:
            os.close(fd)           # releases the flock
