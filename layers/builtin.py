"""The built-in images, built once per store and then reused by recipe hash.

- "python": Debian bookworm minbase + python3 + python3-pytest (the built-in task set's image).
- "busybox": a busybox-static rootfs, about 1 MiB, built in well under a second (fast tests).

Must not import: zmq, controller.*.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Callable

from layers import build
from layers.store import ImageStore

DEFAULT_STORE_ROOT = Path("/var/tmp/paddock/images")
STORE_ROOT_ENV = "PADDOCK_IMAGE_STORE"
PYTHON_IMAGE_SUITE = "bookworm"
PYTHON_IMAGE_PACKAGES = ("python3", "python3-pytest")


def default_store_root() -> Path:
    """$PADDOCK_IMAGE_STORE, else /var/tmp/paddock/images."""
    return Path(os.environ.get(STORE_ROOT_ENV) or DEFAULT_STORE_ROOT)


def python_image_recipe() -> dict:
    return build.debian_recipe(PYTHON_IMAGE_SUITE, PYTHON_IMAGE_PACKAGES)


def ensure_builtin_image(store: ImageStore,
                         progress: Callable[[str], None] | None = None) -> tuple[str, Path]:
    """The "python" image: (digest "sha256:<hex>", path of the SIF in the store)."""
    def builder(out: Path) -> None:
        build.build_debian(out, PYTHON_IMAGE_SUITE, PYTHON_IMAGE_PACKAGES,
                           workdir=store.root / "tmp", progress=progress)
    return store.build_or_reuse(python_image_recipe(), builder, progress)


def ensure_busybox_image(store: ImageStore, progress: Callable[[str], None] | None = None,
                         busybox: Path = Path("/bin/busybox")) -> tuple[str, Path]:
    """The "busybox" image: (digest, path)."""
    def builder(out: Path) -> None:
        build.build_busybox(out, busybox, workdir=store.root / "tmp", progress=progress)
    return store.build_or_reuse(build.busybox_recipe(busybox), builder, progress)
