"""Shared fixtures: the image store, the built-in images and a node's sandbox runtime."""
from __future__ import annotations

import os
import shutil

import pytest

pytest_plugins = ["tests.slurm_fixture"]


def sandbox_prerequisites() -> str | None:
    """Why real sandboxes cannot run here, or None when they can."""
    if not shutil.which("squashfuse"):
        return "squashfuse is not installed (run `make setup`)"
    if not os.access("/dev/fuse", os.R_OK | os.W_OK) or (os.stat("/dev/fuse").st_mode & 0o006) != 0o006:
        return "/dev/fuse is not usable by unprivileged users (run `make setup`)"
    try:
        from nodeagent.sandbox.runtime import subid_range
        subid_range()
    except Exception as exc:  # noqa: BLE001 - reported as the skip reason
        return str(exc)
    return None


@pytest.fixture(scope="session")
def image_store():
    from layers.builtin import default_store_root
    from layers.store import ImageStore
    return ImageStore(default_store_root())


@pytest.fixture(scope="session")
def busybox_image(image_store):
    from layers.builtin import ensure_busybox_image
    return ensure_busybox_image(image_store)[1]


@pytest.fixture(scope="session")
def python_image(image_store):
    from layers.builtin import ensure_builtin_image
    return ensure_builtin_image(image_store)[1]


@pytest.fixture(scope="session")
def runtime():
    reason = sandbox_prerequisites()
    if reason:
        pytest.fail(f"sandbox prerequisites missing: {reason}")
    from nodeagent.sandbox.runtime import SandboxRuntime
    rt = SandboxRuntime().start()
    yield rt
    rt.close()
