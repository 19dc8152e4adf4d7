"""The native sandbox init (`sbxinit.c`): built once per source version, on first use.

`init_binary()` returns the path of `paddock-sbxinit-<hash>` in the cache directory
(`$PADDOCK_NATIVE_DIR`, else `$XDG_CACHE_HOME/paddock/native`, else `~/.cache/paddock/native`),
where `<hash>` covers the source and the compiler flags: an edited source gets a new binary,
a stale one is never run (and is removed once the new one is in place). It is compiled into a
temporary name and renamed into place with mode 0755 (`controller.ondisk.fileio.
atomic_write_with`, whose temporary name is per process; within one process builds take turns),
so concurrent first uses (several agents on a node, several threads) never see a partial file. A missing compiler
is a `NativeBuildError` naming the packages to install; `scripts/setup.sh` builds it ahead.

The node agent opens the binary once and hands the open file to its node holder, which execs
it through `/proc/self/fd/N`: the sandbox's ids need no access to the cache directory.
`fuse_shim()` builds `fuseshim.c` the same way (`paddock-fuseshim-<hash>.so`), a library the
holder preloads into its squashfuse_ll daemons through `/proc/self/fd/N` likewise.
Standard library and controller.ondisk.fileio only. Must not import: zmq, controller
other than controller.contracts and controller.ondisk, nodeagent other than nodeagent.sandbox.native.
"""
from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import threading
from pathlib import Path

from controller.ondisk.fileio import atomic_write_with

SOURCE = Path(__file__).with_name("sbxinit.c")
CFLAGS = ("-O2", "-Wall", "-Wextra", "-Werror", "-pthread", "-static")   # static: a spare starts in half the CPU
# The node's squashfuse_ll daemon preloads it (see fuseshim.c): fewer FUSE round trips per sandbox.
SHIM_SOURCE = Path(__file__).with_name("fuseshim.c")
SHIM_CFLAGS = ("-O2", "-Wall", "-Wextra", "-Werror", "-shared", "-fPIC")
COMPILERS = ("cc", "gcc")
_BUILD_LOCK = threading.Lock()   # one build at a time in this process (the temporary name is per process)


class NativeBuildError(Exception):
    """The native init could not be built (no compiler, or the compiler failed)."""


def cache_dir() -> Path:
    if os.environ.get("PADDOCK_NATIVE_DIR"):
        return Path(os.environ["PADDOCK_NATIVE_DIR"])
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "paddock" / "native"


def _name(prefix: str, src: bytes, flags: tuple[str, ...], suffix: str = "") -> str:
    digest = hashlib.sha256(src + "\0".join(flags).encode()).hexdigest()[:16]
    return f"{prefix}-{digest}{suffix}"


def binary_name(source: bytes | None = None) -> str:
    return _name("paddock-sbxinit", SOURCE.read_bytes() if source is None else source, CFLAGS)


def shim_name(source: bytes | None = None) -> str:
    return _name("paddock-fuseshim", SHIM_SOURCE.read_bytes() if source is None else source, SHIM_CFLAGS, ".so")


def init_binary(directory: Path | None = None) -> Path:
    """The built init for the current source, compiling it if it is missing."""
    return _built(SOURCE, CFLAGS, "paddock-sbxinit", "", "gcc and libc6-dev", directory)


def fuse_shim(directory: Path | None = None) -> Path:
    """The squashfuse_ll preload library for the current source, compiling it if it is missing
    (needs libfuse 3's headers: libfuse3-dev)."""
    return _built(SHIM_SOURCE, SHIM_CFLAGS, "paddock-fuseshim", ".so", "gcc and libfuse3-dev", directory)


def _built(source: Path, flags: tuple[str, ...], prefix: str, suffix: str, packages: str,
           directory: Path | None) -> Path:
    directory = directory or cache_dir()
    src = source.read_bytes()
    path = directory / _name(prefix, src, flags, suffix)
    if _usable(path):
        return path
    cc = next((shutil.which(c) for c in COMPILERS if shutil.which(c)), None)
    if cc is None:
        raise NativeBuildError(f"no C compiler ({' or '.join(COMPILERS)}) to build {source}: install "
                               f"{packages} (`make setup`, or `apt-get install {packages.replace(' and ', ' ')}`)")
    directory.mkdir(parents=True, exist_ok=True)
    with _BUILD_LOCK:
        if _usable(path):   # another thread built it meanwhile
            return path
        # atomic: a concurrent builder's identical binary is replaced, never torn
        atomic_write_with(path, lambda tmp: _compile(cc, flags, source, tmp, packages), fsync=False, mode=0o755)
        for old in directory.glob(f"{prefix}-*"):   # other versions (a runtime using one holds it open)
            if old != path:
                old.unlink(missing_ok=True)
    return path


def _usable(path: Path) -> bool:
    return path.is_file() and os.access(path, os.X_OK)


def _compile(cc: str, flags: tuple[str, ...], source: Path, out: Path, packages: str) -> None:
    argv = [cc, *flags, "-o", str(out), str(source)]
    res = subprocess.run(argv, capture_output=True, text=True)
    if res.returncode != 0:
        raise NativeBuildError(f"{' '.join(argv)} failed (exit {res.returncode}; it needs {packages}): "
                               f"{res.stderr.strip()[-2000:]}")
