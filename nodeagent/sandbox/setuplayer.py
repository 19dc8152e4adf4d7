"""Set-up once: a task's setup commands run in one sandbox, their result kept as a layer.

`ensure_setup_layer(backend, store, image, layers, commands)` runs the commands (each as
`/bin/sh -c CMD` in /work, in order, stopping at the first failure) in a fresh sandbox of
`image` + `layers`, captures what they changed (`diff_archive("/")`, deletions as whiteouts,
`/tmp` left out) and stores it as a layer (`layers.treelayer.ensure_archive_layer`). The layer
is keyed by the image's digest, the input layers' digests and the commands (`setup_recipe`),
so it is made once per store (under the recipe's lock: concurrent callers wait and reuse) and
reused by every rollout and by the grading sandbox: both are created with
`layers=(*layers, setup_layer)`.

A command that exits non-zero or times out raises `SetupError` (a SandboxError: infra_error for
the rollout, quarantine for the task) with the command, exit code and the tail of its output;
nothing is stored, so the next attempt runs the set-up again.

Must not import: zmq, controller.*, nodeagent.agent, nodeagent.harness, nodeagent.verifier.
"""
from __future__ import annotations

import io
import logging
import os
import tarfile
from pathlib import Path
from typing import Any, Sequence

from layers import treelayer
from layers.store import ImageStore, sha256_file
from nodeagent.sandbox.interface import SandboxBackend
from nodeagent.sandbox.spec import SandboxSpec, SetupError

log = logging.getLogger(__name__)

SETUP_RULES_VERSION = 1
DEFAULT_SETUP_TIMEOUT_S = 1800.0
OUTPUT_TAIL_BYTES = 4096
SETUP_OUTPUT_CAP_BYTES = 1 << 20
SETUP_DIFF_MAX_BYTES = 2 << 30
EXCLUDED_PREFIXES = ("tmp/",)   # scratch of the set-up, never part of the layer
DEFAULT_SETUP_LIMITS = {"memory_mb": 2048, "pids": 512, "disk_mb": 4096, "nofile": 1024}


def file_digest(path: Path) -> str:
    """`sha256:<hex>` of an image or layer file: its store name when it is stored by content,
    else the hash of its bytes."""
    stem = Path(path).stem
    if len(stem) == 64 and all(c in "0123456789abcdef" for c in stem):
        return f"sha256:{stem}"
    return f"sha256:{sha256_file(Path(path))}"


def setup_recipe(image: Path, layers: Sequence[Path], commands: Sequence[str]) -> dict[str, Any]:
    """What a set-up layer is keyed by: the image, the input layers (bottom first), the commands."""
    return {"kind": "setup", "image": file_digest(image), "layers": [file_digest(p) for p in layers],
            "commands": list(commands), "rules": SETUP_RULES_VERSION}


def _tail(result) -> str:
    out = (result.stdout or b"") + (result.stderr or b"")
    return out[-OUTPUT_TAIL_BYTES:].decode(errors="replace")


def _without_scratch(archive: bytes) -> bytes:
    """The diff archive minus EXCLUDED_PREFIXES."""
    src = tarfile.open(fileobj=io.BytesIO(archive), mode="r:")
    buf = io.BytesIO()
    with src, tarfile.open(fileobj=buf, mode="w", format=tarfile.PAX_FORMAT) as dst:
        for ti in src:
            name = ti.name.lstrip("/")
            if name.rstrip("/") == "tmp" or any(name.startswith(p) for p in EXCLUDED_PREFIXES) \
                    or os.path.basename(name) == ".wh.tmp":
                continue
            dst.addfile(ti, src.extractfile(ti) if ti.isfile() else None)
    return buf.getvalue()


def run_setup(backend: SandboxBackend, image: Path, layers: Sequence[Path], commands: Sequence[str],
              limits: dict | None = None, timeout_s: float = DEFAULT_SETUP_TIMEOUT_S) -> bytes:
    """Run `commands` in a fresh sandbox; the diff archive of what they changed. SetupError on
    the first command that fails."""
    spec = SandboxSpec(image=Path(image), layers=tuple(Path(p) for p in layers),
                       limits=dict(limits or DEFAULT_SETUP_LIMITS), hostname="setup")
    with backend.create(spec) as sb:
        for cmd in commands:
            r = sb.exec(["/bin/sh", "-c", cmd], timeout_s=timeout_s, cwd="/work",
                        output_cap=SETUP_OUTPUT_CAP_BYTES)
            if r.exit_code != 0 or r.timed_out:
                raise SetupError(cmd, r.exit_code, _tail(r), r.timed_out)
        return _without_scratch(sb.diff_archive("/", max_bytes=SETUP_DIFF_MAX_BYTES))


def ensure_setup_layer(backend: SandboxBackend, store: ImageStore, image: Path, layers: Sequence[Path],
                       commands: Sequence[str], limits: dict | None = None,
                       timeout_s: float = DEFAULT_SETUP_TIMEOUT_S) -> Path | None:
    """The set-up layer of (image, layers, commands), made once per store; None when there are
    no commands. Raises SetupError (see the module docstring)."""
    commands = [str(c) for c in commands]
    if not commands:
        return None
    recipe = setup_recipe(Path(image), [Path(p) for p in layers], commands)
    found = treelayer.lookup_layer(store, recipe)
    if found is not None:
        return found

    def builder(out: Path) -> None:
        archive = run_setup(backend, image, layers, commands, limits, timeout_s)
        treelayer.build_layer_from_archive(archive, out, workdir=store.root / "tmp")
    digest, path = store.build_or_reuse(recipe, builder, kind="layer")
    log.info("set-up layer %s for image %s (%d commands)", digest, recipe["image"], len(commands))
    return path
