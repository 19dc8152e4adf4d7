"""Image sources -> a sanitised, reproducible staging tree on local disk.

Sources: a root filesystem directory, a tarball (plain, gzip, bzip2, xz or zstd), or an OCI
image layout (index.json -> manifest -> layers applied in order, whiteouts `.wh.NAME` and opaque
directories `.wh..wh..opq` honoured, every blob checked against its digest). The staging tree
is *sanitised*: setuid/setgid bits cleared; device nodes, fifos and sockets dropped; tar members
that would escape the tree (`..`, absolute names, a symlinked parent) refused.

Times are made reproducible here: file and symlink mtimes come from the source, directory
mtimes come from the source where it records them and are the epoch otherwise (so the moment of
extraction never leaks into the image), and `clamp_times` caps every time at an epoch.

`detect_arch` reads the image's CPU architecture from the ELF header of /bin/sh (or another
common binary), resolving symlinks inside the tree, never on the host.

Every external command goes through `run_command`, whose failure is a `CommandFailed` carrying
argv, exit code and the tail of stderr.

Must not import: zmq, controller other than controller.ondisk.fileio, layers.store, layers.build.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import shutil
import signal
import stat
import subprocess
import tarfile
import tempfile
from pathlib import Path
from typing import Any, Callable, Iterable, Iterator, Sequence

from controller.ondisk.fileio import sha256_file
from layers.sif import host_arch

STDERR_TAIL_BYTES = 4096
SPECIAL_MODE_BITS = stat.S_ISUID | stat.S_ISGID
DEFAULT_DIR_MODE = 0o755
ZSTD_MAGIC = b"\x28\xb5\x2f\xfd"
ZSTD_TIMEOUT_S = 1800.0
OCI_WHITEOUT_PREFIX = ".wh."
OCI_OPAQUE_MARKER = ".wh..wh..opq"
# Binaries whose ELF header tells the image's architecture, in order of preference.
ARCH_PROBES = ("bin/sh", "usr/bin/sh", "bin/busybox", "usr/bin/env", "bin/ls", "usr/bin/ls",
               "sbin/init", "usr/bin/python3")
SYMLINK_HOPS_MAX = 40
# ELF e_machine -> SIF arch name; (e_machine, 64-bit?, little-endian?) for the ambiguous ones.
_ELF_MACHINES = {3: "386", 62: "amd64", 40: "arm", 183: "arm64", 22: "s390x",
                 243: "riscv64", 258: "loong64"}
_ELF_VARIANTS = {(21, True, False): "ppc64", (21, True, True): "ppc64le",
                 (8, False, False): "mips", (8, False, True): "mipsle",
                 (8, True, False): "mips64", (8, True, True): "mips64le"}

Progress = Callable[[str], None]
Times = dict[Path, int]          # staged path -> mtime to set once staging is complete


class BuildError(Exception):
    """An image could not be built (bad source, unsafe content, failed command)."""


class CommandFailed(BuildError):
    """An external command exited non-zero (or could not start, or timed out)."""

    def __init__(self, argv: Sequence[str], exit_code: int | None, stderr: str):
        self.argv = list(argv)
        self.exit_code = exit_code
        self.stderr = stderr
        super().__init__(f"command failed (exit {exit_code}): {subprocess.list2cmdline(argv)}"
                         f"\n--- stderr (tail) ---\n{stderr.strip()}")


def _noop(_msg: str) -> None:
    pass


def run_command(argv: Sequence[str], timeout_s: float, progress: Progress | None = None,
                env: dict[str, str] | None = None, stdout_path: Path | None = None) -> None:
    """Run argv; stream its stdout lines to `progress` (or write stdout to `stdout_path`);
    raise CommandFailed on failure. The command runs in its own process group, killed whole
    on timeout."""
    progress = progress or _noop
    with tempfile.TemporaryFile() as err, \
            (open(stdout_path, "wb") if stdout_path else contextlib.nullcontext()) as out:
        try:
            proc = subprocess.Popen(list(argv), stdout=out or subprocess.PIPE, stderr=err,
                                    stdin=subprocess.DEVNULL, env=env,
                                    start_new_session=True)
        except OSError as e:
            raise CommandFailed(argv, None, f"cannot start: {e}") from e
        if proc.stdout is not None:
            for line in proc.stdout:
                progress(line.decode(errors="replace").rstrip())
        try:
            code = proc.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)     # the whole group (debootstrap's dpkg)
            proc.wait()
            raise CommandFailed(argv, None, f"timed out after {timeout_s} s")
        if code != 0:
            err.seek(0, os.SEEK_END)
            err.seek(max(0, err.tell() - STDERR_TAIL_BYTES))
            raise CommandFailed(argv, code, err.read().decode(errors="replace"))


# ---------------------------------------------------------------- sanitising

def _is_dropped(mode: int) -> bool:
    """Device nodes, fifos and sockets never enter an image."""
    return stat.S_ISCHR(mode) or stat.S_ISBLK(mode) or stat.S_ISFIFO(mode) \
        or stat.S_ISSOCK(mode)


def sanitise_tree(root: Path) -> int:
    """In place: clear setuid/setgid bits and delete special files. Returns changes made."""
    changes = 0
    for dirpath, dirnames, filenames in os.walk(root):
        for name in dirnames + filenames:
            p = os.path.join(dirpath, name)
            st = os.lstat(p)
            if _is_dropped(st.st_mode):
                os.unlink(p)
                changes += 1
            elif not stat.S_ISLNK(st.st_mode) and st.st_mode & SPECIAL_MODE_BITS:
                os.chmod(p, stat.S_IMODE(st.st_mode) & ~SPECIAL_MODE_BITS)
                changes += 1
    return changes


# ---------------------------------------------------------------- times

def _walk_all(root: Path) -> Iterator[str]:
    """Every path under root (root included), children before their directory."""
    for dirpath, dirnames, filenames in os.walk(root, topdown=False):
        for name in filenames + dirnames:
            yield os.path.join(dirpath, name)
    yield str(root)


def apply_times(root: Path, times: Times, default_s: int) -> None:
    """Set recorded mtimes (symlinks too). A directory without a record (one the archive did
    not list, made implicitly with a umask-dependent mode) gets default_s and mode 0755."""
    for p in _walk_all(root):
        path = Path(p)
        if path in times:
            t = times[path]
        elif path.is_dir() and not path.is_symlink():
            t = default_s
            os.chmod(p, DEFAULT_DIR_MODE)
        else:
            continue
        os.utime(p, ns=(t * 10**9, t * 10**9), follow_symlinks=False)


def clamp_times(root: Path, epoch_s: int) -> int:
    """Cap every mtime under root at epoch_s (the reproducible-builds clamp). Returns count."""
    changed = 0
    for p in _walk_all(root):
        if os.lstat(p).st_mtime > epoch_s:
            os.utime(p, ns=(epoch_s * 10**9, epoch_s * 10**9), follow_symlinks=False)
            changed += 1
    return changed


# ---------------------------------------------------------------- directory source

def stage_directory(src: Path, dest: Path) -> None:
    """Copy a rootfs directory into `dest` (hard links, symlinks, mtimes kept), sanitised."""
    src = Path(src)
    if not src.is_dir():
        raise BuildError(f"rootfs source {src} is not a directory")
    shutil.copytree(src, dest, symlinks=True, copy_function=_HardlinkCopier().copy,
                    ignore=lambda d, names: [n for n in names
                                             if _is_dropped(os.lstat(os.path.join(d, n)).st_mode)],
                    dirs_exist_ok=True)
    sanitise_tree(dest)


class _HardlinkCopier:
    """copy_function for copytree that keeps hard links as hard links."""

    def __init__(self) -> None:
        self.seen: dict[tuple[int, int], str] = {}

    def copy(self, s: str, d: str) -> str:
        st = os.lstat(s)
        key = (st.st_dev, st.st_ino)
        if st.st_nlink > 1 and key in self.seen:
            os.link(self.seen[key], d)
            return d
        shutil.copy2(s, d, follow_symlinks=False)
        self.seen[key] = d
        return d


# ---------------------------------------------------------------- tarballs

def _safe_target(dest: Path, name: str) -> Path:
    """The path a tar member named `name` extracts to, refusing escapes through `..`,
    absolute names or symlinked parent directories."""
    rel = os.path.normpath(name.lstrip("/"))
    if rel in (".", "") or rel.startswith(".."):
        raise BuildError(f"unsafe tar member {name!r}: outside the root filesystem")
    cur = dest
    for part in Path(rel).parts[:-1]:
        cur = cur / part
        if cur.is_symlink():
            raise BuildError(f"unsafe tar member {name!r}: parent {cur.relative_to(dest)} "
                             f"is a symlink")
    return dest / rel


def _remove(path: Path) -> None:
    if path.is_symlink() or not path.is_dir():
        path.unlink(missing_ok=True)
    else:
        shutil.rmtree(path)


def _extract_members(tf: tarfile.TarFile, dest: Path, members: Iterable[tarfile.TarInfo],
                     times: Times) -> None:
    """Extract sanitised members; record directory and symlink mtimes in `times` (tarfile
    cannot set a symlink's time, and later members change their directory's time)."""
    for m in members:
        if m.ischr() or m.isblk() or m.isfifo():
            continue
        if os.path.normpath(m.name.lstrip("/")) in (".", ""):
            if m.isdir():
                times[dest] = int(m.mtime)
            continue
        target = _safe_target(dest, m.name)
        if m.islnk():
            _safe_target(dest, m.linkname)
        if target.exists() or target.is_symlink():
            if not (m.isdir() and target.is_dir() and not target.is_symlink()):
                _remove(target)
        m = m.replace(name=str(target.relative_to(dest)),
                      mode=m.mode & ~SPECIAL_MODE_BITS, deep=False)
        if m.islnk():
            m = m.replace(linkname=os.path.normpath(m.linkname.lstrip("/")), deep=False)
        tf.extract(m, dest, set_attrs=True, numeric_owner=True, filter="fully_trusted")
        if m.isdir() or m.issym():
            times[target] = int(m.mtime)
        else:
            times.pop(target, None)         # a directory or link of a lower layer replaced


@contextlib.contextmanager
def open_tar(path: Path, scratch: Path) -> Iterator[tarfile.TarFile]:
    """Open a tar archive, plain or compressed (gzip, bzip2, xz through tarfile; zstd through
    the `zstd` tool into a scratch file)."""
    with open(path, "rb") as f:
        magic = f.read(4)
    if magic == ZSTD_MAGIC:
        fd, plain_name = tempfile.mkstemp(prefix="layer-", suffix=".tar", dir=scratch)
        os.close(fd)
        plain = Path(plain_name)
        try:
            run_command(["zstd", "-d", "-c", "-q", "--", str(path)], ZSTD_TIMEOUT_S,
                        stdout_path=plain)
            with tarfile.open(plain) as tf:
                yield tf
        finally:
            plain.unlink(missing_ok=True)
        return
    try:
        tf = tarfile.open(path)
    except tarfile.ReadError as e:
        raise BuildError(f"{path} is not a tar archive (plain, gzip, bzip2, xz or zstd): "
                         f"{e}") from e
    with tf:
        yield tf


def stage_tarball(tarball: Path, dest: Path, epoch_s: int = 0) -> None:
    """Extract a rootfs tarball into `dest`, sanitised, with reproducible times."""
    times: Times = {}
    try:
        with open_tar(tarball, dest.parent) as tf:
            _extract_members(tf, dest, tf, times)
    except (tarfile.TarError, OSError, EOFError) as e:
        raise BuildError(f"cannot read tarball {tarball}: {e}") from e
    sanitise_tree(dest)
    apply_times(dest, times, epoch_s)


# ---------------------------------------------------------------- OCI image layouts

def _apply_oci_layer(tf: tarfile.TarFile, dest: Path, times: Times) -> None:
    """Whiteouts apply to lower layers only, so delete first, then extract the rest."""
    keep = []
    for m in tf.getmembers():
        base = os.path.basename(m.name.rstrip("/"))
        parent = os.path.dirname(m.name.rstrip("/"))
        if base == OCI_OPAQUE_MARKER:
            d = _safe_target(dest, os.path.join(parent, "x")).parent
            if d.is_dir() and not d.is_symlink():
                for child in d.iterdir():
                    _remove(child)
        elif base.startswith(OCI_WHITEOUT_PREFIX):
            victim = _safe_target(dest, os.path.join(parent, base[len(OCI_WHITEOUT_PREFIX):]))
            if victim.exists() or victim.is_symlink():
                _remove(victim)
        else:
            keep.append(m)
    _extract_members(tf, dest, keep, times)


def oci_blob(layout: Path, digest: str, verify: bool = True) -> Path:
    """Path of a blob of the layout; with `verify`, its bytes must hash to its digest."""
    algo, _, hexd = str(digest).partition(":")
    p = layout / "blobs" / algo / hexd
    if algo != "sha256" or "/" in hexd or not p.is_file():
        raise BuildError(f"OCI layout {layout}: missing blob {digest}")
    if verify and sha256_file(p) != hexd:
        raise BuildError(f"OCI layout {layout}: blob {digest} is corrupt (its content does not "
                         f"hash to its digest)")
    return p


def _pick_manifest(manifests: list[dict[str, Any]], arch: str) -> dict[str, Any]:
    """The manifest for this architecture when the index names platforms, else the first."""
    for m in manifests:
        if m.get("platform", {}).get("architecture") == arch:
            return m
    return manifests[0]


def oci_manifest(layout: Path) -> tuple[str, dict[str, Any]]:
    """(digest, manifest) of the layout's image, through nested indexes."""
    try:
        index = json.loads((layout / "index.json").read_text())
        desc = _pick_manifest(index["manifests"], host_arch())
        doc = json.loads(oci_blob(layout, desc["digest"]).read_text())
        while "manifests" in doc:           # nested image index
            desc = _pick_manifest(doc["manifests"], host_arch())
            doc = json.loads(oci_blob(layout, desc["digest"]).read_text())
        if not isinstance(doc["layers"], list):
            raise ValueError("manifest 'layers' is not a list")
        return desc["digest"], doc
    except (OSError, ValueError, KeyError, IndexError, TypeError) as e:
        raise BuildError(f"OCI layout {layout}: cannot read index/manifest: {e!r}") from e


def stage_oci_layout(layout: Path, dest: Path, progress: Progress | None = None,
                     epoch_s: int = 0) -> str:
    """Apply an OCI image layout's layers in order into `dest`, sanitised. Returns the
    manifest digest."""
    progress = progress or _noop
    digest, manifest = oci_manifest(layout)
    layers = manifest["layers"]
    times: Times = {}
    for i, layer in enumerate(layers):
        progress(f"applying layer {i + 1}/{len(layers)} {layer['digest']}")
        blob = oci_blob(layout, layer["digest"])
        try:
            with open_tar(blob, dest.parent) as tf:
                _apply_oci_layer(tf, dest, times)
        except (tarfile.TarError, OSError, EOFError) as e:
            raise BuildError(f"OCI layer {layer['digest']}: {e}") from e
    sanitise_tree(dest)
    apply_times(dest, {p: t for p, t in times.items() if os.path.lexists(p)}, epoch_s)
    return digest


def is_oci_layout(path: Path) -> bool:
    return (path / "oci-layout").is_file() and (path / "index.json").is_file()


def source_kind(src: Path) -> str:
    """"oci", "dir" or "tar" for an existing source path."""
    if src.is_dir():
        return "oci" if is_oci_layout(src) else "dir"
    return "tar"


def source_content_key(src: Path) -> dict[str, Any]:
    """What identifies a source's content (the store's recipe key for `--store` builds):
    the manifest digest of an OCI layout, the sha256 of a tarball, or a hash over a
    directory tree's names, modes, mtimes, link targets and file bytes."""
    kind = source_kind(src)
    if kind == "oci":
        return {"kind": "oci", "manifest": oci_manifest(src)[0]}
    if kind == "tar":
        return {"kind": "tar", "sha256": sha256_file(src)}
    h = hashlib.sha256()
    for dirpath, dirnames, filenames in os.walk(src):
        dirnames.sort()
        for name in sorted(dirnames + filenames):
            p = os.path.join(dirpath, name)
            st = os.lstat(p)
            rel = os.path.relpath(p, src)
            h.update(f"{rel}\0{st.st_mode:o}\0{int(st.st_mtime)}\0".encode(errors="surrogateescape"))
            if stat.S_ISLNK(st.st_mode):
                h.update(os.readlink(p).encode(errors="surrogateescape"))
            elif stat.S_ISREG(st.st_mode):
                h.update(sha256_file(Path(p)).encode())
            h.update(b"\n")
    return {"kind": "dir", "tree_sha256": h.hexdigest()}


# ---------------------------------------------------------------- architecture

def _resolve_in_root(root: Path, rel: str) -> Path | None:
    """Follow `rel` inside root as if root were `/` (absolute links restart at root, `..`
    stops at root). None if it does not exist or loops."""
    parts = list(Path(rel.lstrip("/")).parts)
    cur: list[str] = []
    hops = 0
    while parts:
        part = parts.pop(0)
        if part in ("", "."):
            continue
        if part == "..":
            cur = cur[:-1]
            continue
        p = root.joinpath(*cur, part)
        if p.is_symlink():
            hops += 1
            if hops > SYMLINK_HOPS_MAX:
                return None
            target = os.readlink(p)
            if target.startswith("/"):
                cur = []
            parts = list(Path(target.lstrip("/")).parts) + parts
            continue
        if not p.exists():
            return None
        cur.append(part)
    return root.joinpath(*cur)


def elf_arch(path: Path) -> str | None:
    """The SIF arch name of an ELF binary, None if not ELF or an unknown machine."""
    try:
        with open(path, "rb") as f:
            head = f.read(20)
    except OSError:
        return None
    if len(head) < 20 or head[:4] != b"\x7fELF" or head[4] not in (1, 2) \
            or head[5] not in (1, 2):
        return None
    is64, little = head[4] == 2, head[5] == 1
    machine = int.from_bytes(head[18:20], "little" if little else "big")
    return _ELF_MACHINES.get(machine) or _ELF_VARIANTS.get((machine, is64, little))


def detect_arch(root: Path) -> str:
    """The architecture of a staged tree: from the first of ARCH_PROBES that is an ELF
    binary of a known machine; "unknown" if none is."""
    for probe in ARCH_PROBES:
        p = _resolve_in_root(root, probe)
        if p is not None and p.is_file() and (arch := elf_arch(p)):
            return arch
    return "unknown"
