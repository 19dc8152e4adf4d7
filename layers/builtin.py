"""The built-in images, built once per store and then reused by recipe hash.

- "python": Debian bookworm minbase + python3 + python3-pytest (the built-in task set's image).
- "busybox": a busybox-static rootfs, about 1 MiB, built in well under a second (fast tests).
- "browser": Debian bookworm minbase + chromium + python3 (web tasks, `nodeagent/browser/`).

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



BROWSER_IMAGE_SUITE = "bookworm"
# debootstrap's own resolver fails configuring chromium's desktop dependencies (dconf-service)
# when they are --include'd, so the image is a minbase with python3 (the task's web app:
# standard-library http.server + sqlite3), then apt-get inside the tree adds the rest without
# recommends: chromium (the headless browser) and one font so that pages render text.
BROWSER_IMAGE_BASE = ("python3",)
BROWSER_IMAGE_APT = ("chromium", "fonts-dejavu-core")
APT_TIMEOUT_S = 1800


def browser_image_recipe() -> dict:
    recipe = build.debian_recipe(BROWSER_IMAGE_SUITE, BROWSER_IMAGE_BASE)
    return {**recipe, "apt_install": sorted(BROWSER_IMAGE_APT), "recommends": False}


def build_browser(out: Path, workdir: Path | None = None, mirror: str | None = None,
                  progress: Callable[[str], None] | None = None) -> Path:
    """debootstrap minbase + python3, then `apt-get install --no-install-recommends chromium
    fonts-dejavu-core` in a chroot (with /proc and /dev bound for the maintainer scripts), slim,
    pack as SIF. Every command failure is `CommandFailed` with argv and stderr."""
    import tempfile
    mirror = mirror or build.apt_mirror()
    with tempfile.TemporaryDirectory(prefix="paddock-browser-", dir=workdir) as tmp:
        root = Path(tmp) / "rootfs"
        try:
            build.run_command(["debootstrap", "--variant=minbase", "--include=" + ",".join(BROWSER_IMAGE_BASE),
                               BROWSER_IMAGE_SUITE, str(root), mirror], build.DEBOOTSTRAP_TIMEOUT_S, progress)
            build.run_command(["mount", "-t", "proc", "proc", str(root / "proc")], 60, progress)
            build.run_command(["mount", "--bind", "/dev", str(root / "dev")], 60, progress)
            env = "DEBIAN_FRONTEND=noninteractive"
            build.run_command(["chroot", str(root), "env", env, "apt-get", "-q", "-y", "update"], APT_TIMEOUT_S, progress)
            build.run_command(["chroot", str(root), "env", env, "apt-get", "-q", "-y", "install",
                               "--no-install-recommends", *BROWSER_IMAGE_APT], APT_TIMEOUT_S, progress)
        finally:
            build.unmount_under(root)
        build.slim_rootfs(root)
        for d, mode in (("work", 0o755), ("tmp", 0o1777)):
            (root / d).mkdir(exist_ok=True)
            os.chmod(root / d, mode)
        meta = {"recipe": browser_image_recipe(), "source": f"debootstrap:{mirror}",
                "build_rules": build.BUILD_RULES_VERSION}
        return build.tree_to_sif(root, out, meta, progress)


def ensure_browser_image(store: ImageStore,
                         progress: Callable[[str], None] | None = None) -> tuple[str, Path]:
    """The "browser" image (web tasks): Debian bookworm minbase + python3 + chromium."""
    def builder(out: Path) -> None:
        build_browser(out, workdir=store.root / "tmp", progress=progress)
    return store.build_or_reuse(browser_image_recipe(), builder, progress)
