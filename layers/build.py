"""Image building: sanitised root filesystem -> squashfs -> SIF.

Sources: a root filesystem directory, a tarball (any compression Python's tarfile reads), an
OCI image layout (layers applied in order, whiteouts honoured), or a Debian recipe
(`debootstrap --variant=minbase`, then slimmed). Every source is first materialised into a
*sanitised staging tree*: setuid/setgid bits cleared, device nodes, fifos and sockets dropped,
tar members that would escape the tree refused. mksquashfs then packs it with
`-no-xattrs -all-root -comp zstd -noappend`, and `layers.sif` wraps it in a SIF file.

Every external command goes through `run_command`, whose failure is a `CommandFailed` carrying
argv, exit code and the tail of stderr.

Must not import: zmq, controller.*, layers.store (the store calls the builder, not the reverse).
"""

from __future__ import annotations

import glob
import hashlib
import json
import logging
import os
import re
import shutil
import signal
import stat
import subprocess
import tarfile
import tempfile
from pathlib import Path
from typing import Any, Callable, Iterable, Sequence

from layers.sif import write_sif

log = logging.getLogger(__name__)

# Bump when the build rules change: it is part of every recipe hash, so old images are rebuilt.
BUILD_RULES_VERSION = 1
STDERR_TAIL_BYTES = 4096
MKSQUASHFS_TIMEOUT_S = 1800.0
DEBOOTSTRAP_TIMEOUT_S = 3600.0
SLIM_GLOBS = ("var/cache/apt/archives/*.deb", "var/cache/apt/*.bin", "var/lib/apt/lists/*",
              "usr/share/doc/*", "usr/share/locale/*", "usr/share/man/*", "usr/share/info/*",
              "var/log/*.log", "var/log/apt/*", "debootstrap")
SPECIAL_MODE_BITS = stat.S_ISUID | stat.S_ISGID

Progress = Callable[[str], None]


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
                env: dict[str, str] | None = None) -> None:
    """Run argv; stream its stdout lines to `progress`; raise CommandFailed on failure."""
    progress = progress or _noop
    with tempfile.TemporaryFile() as err:
        try:
            proc = subprocess.Popen(list(argv), stdout=subprocess.PIPE, stderr=err,
                                    stdin=subprocess.DEVNULL, env=env, text=True,
                                    errors="replace", start_new_session=True)
        except OSError as e:
            raise CommandFailed(argv, None, f"cannot start: {e}") from e
        assert proc.stdout is not None
        for line in proc.stdout:
            if line.strip():
                progress(line.rstrip())
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


# ---------------------------------------------------------------- sanitised staging

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


def _extract_members(tf: tarfile.TarFile, dest: Path, members: Iterable[tarfile.TarInfo]) -> None:
    for m in members:
        if m.ischr() or m.isblk() or m.isfifo():
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


def stage_tarball(tarball: Path, dest: Path) -> None:
    """Extract a rootfs tarball into `dest`, sanitised (see module docstring)."""
    try:
        with tarfile.open(tarball) as tf:
            _extract_members(tf, dest, tf)
    except (tarfile.TarError, OSError, EOFError) as e:
        raise BuildError(f"cannot read tarball {tarball}: {e}") from e
    sanitise_tree(dest)


def _apply_oci_layer(tf: tarfile.TarFile, dest: Path) -> None:
    """Whiteouts apply to lower layers only, so delete first, then extract the rest."""
    members = tf.getmembers()
    keep = []
    for m in members:
        base = os.path.basename(m.name.rstrip("/"))
        parent = os.path.dirname(m.name.rstrip("/"))
        if base == ".wh..wh..opq":
            d = _safe_target(dest, os.path.join(parent, "x")).parent
            if d.is_dir() and not d.is_symlink():
                for child in d.iterdir():
                    _remove(child)
        elif base.startswith(".wh."):
            victim = _safe_target(dest, os.path.join(parent, base[len(".wh."):]))
            if victim.exists() or victim.is_symlink():
                _remove(victim)
        else:
            keep.append(m)
    _extract_members(tf, dest, keep)


def _oci_blob(layout: Path, digest: str) -> Path:
    algo, _, hexd = digest.partition(":")
    p = layout / "blobs" / algo / hexd
    if not p.is_file():
        raise BuildError(f"OCI layout {layout}: missing blob {digest}")
    return p


def _oci_manifest(layout: Path) -> dict[str, Any]:
    try:
        index = json.loads((layout / "index.json").read_text())
        desc = index["manifests"][0]
        doc = json.loads(_oci_blob(layout, desc["digest"]).read_text())
        if "manifests" in doc:              # nested image index: take its first manifest
            doc = json.loads(_oci_blob(layout, doc["manifests"][0]["digest"]).read_text())
        doc["layers"]  # noqa: B018 - presence check
        return doc
    except (OSError, ValueError, KeyError, IndexError) as e:
        raise BuildError(f"OCI layout {layout}: cannot read index/manifest: {e!r}") from e


def stage_oci_layout(layout: Path, dest: Path, progress: Progress | None = None) -> None:
    """Apply an OCI image layout's layers in order into `dest`, sanitised."""
    progress = progress or _noop
    layers = _oci_manifest(layout)["layers"]
    for i, layer in enumerate(layers):
        media = layer.get("mediaType", "")
        if "zstd" in media:
            raise BuildError(f"OCI layer {layer['digest']}: zstd layers are not supported")
        progress(f"applying layer {i + 1}/{len(layers)} {layer['digest']}")
        blob = _oci_blob(layout, layer["digest"])
        try:
            with tarfile.open(blob) as tf:
                _apply_oci_layer(tf, dest)
        except (tarfile.TarError, OSError, EOFError) as e:
            raise BuildError(f"OCI layer {layer['digest']}: {e}") from e
    sanitise_tree(dest)


def is_oci_layout(path: Path) -> bool:
    return (path / "oci-layout").is_file() and (path / "index.json").is_file()


# ---------------------------------------------------------------- squashfs + SIF

def make_squashfs(rootfs: Path, out_sqfs: Path, mkfs_time_s: int = 0,
                  progress: Progress | None = None) -> Path:
    """Pack a (sanitised) tree with the fixed Paddock options."""
    argv = ["mksquashfs", str(rootfs), str(out_sqfs), "-no-xattrs", "-all-root",
            "-comp", "zstd", "-noappend", "-no-progress", "-quiet",
            "-mkfs-time", str(mkfs_time_s)]
    run_command(argv, MKSQUASHFS_TIMEOUT_S, progress)
    return out_sqfs


def tree_to_sif(rootfs: Path, out_sif: Path, metadata: dict[str, Any],
                progress: Progress | None = None) -> Path:
    """Sanitise `rootfs` in place (it must be a tree the caller owns), pack, wrap."""
    progress = progress or _noop
    sanitise_tree(rootfs)
    progress("mksquashfs")
    sqfs = out_sif.with_name(out_sif.name + ".sqfs.tmp")
    try:
        make_squashfs(rootfs, sqfs, progress=progress)
        progress("writing SIF")
        write_sif(out_sif, sqfs, metadata=metadata)
    finally:
        sqfs.unlink(missing_ok=True)
    return out_sif


def build_image(src: Path | str, out_sif: Path | str, workdir: Path | str | None = None,
                progress: Progress | None = None,
                metadata: dict[str, Any] | None = None) -> Path:
    """Build a SIF from a rootfs directory, a tarball or an OCI layout directory."""
    src, out_sif = Path(src), Path(out_sif)
    progress = progress or _noop
    if not src.exists():
        raise BuildError(f"image source {src} does not exist")
    kind = "oci" if src.is_dir() and is_oci_layout(src) else "dir" if src.is_dir() else "tar"
    meta = {"source": f"{kind}:{src.resolve()}", "build_rules": BUILD_RULES_VERSION}
    meta.update(metadata or {})
    with tempfile.TemporaryDirectory(prefix="paddock-build-", dir=workdir) as tmp:
        root = Path(tmp) / "rootfs"
        root.mkdir(mode=0o755)
        progress(f"staging {kind} source {src}")
        if kind == "oci":
            stage_oci_layout(src, root, progress)
        elif kind == "dir":
            stage_directory(src, root)
        else:
            stage_tarball(src, root)
        return tree_to_sif(root, out_sif, meta, progress)


# ---------------------------------------------------------------- Debian recipe

def _mounts_under(root: Path) -> list[str]:
    prefix = str(root.resolve()) + "/"
    points = []
    with open("/proc/self/mountinfo") as f:
        for line in f:
            point = re.sub(r"\\([0-7]{3})", lambda m: chr(int(m.group(1), 8)),
                           line.split()[4])
            if point.startswith(prefix):
                points.append(point)
    return sorted(points, key=len, reverse=True)


def unmount_under(root: Path) -> None:
    """Detach whatever a failed debootstrap left mounted (proc, sys, dev binds) under root,
    so deleting the tree can never walk into the host's /proc or /dev."""
    for point in _mounts_under(root):
        run_command(["umount", "-l", point], timeout_s=60)
    if left := _mounts_under(root):
        raise BuildError(f"mounts still present under {root}: {left}; not deleting it")


def apt_mirror(sources_dir: Path = Path("/etc/apt/sources.list.d"),
               sources_list: Path = Path("/etc/apt/sources.list")) -> str:
    """The Debian mirror apt is configured with (first deb URI that is not -security)."""
    candidates: list[str] = []
    for f in sorted(glob.glob(str(sources_dir / "*.sources"))):
        for line in Path(f).read_text(errors="replace").splitlines():
            if line.startswith("URIs:"):
                candidates += line.split()[1:]
    if sources_list.is_file():
        for line in sources_list.read_text(errors="replace").splitlines():
            parts = line.split()
            if parts and parts[0] == "deb":
                uris = [p for p in parts[1:] if "://" in p]
                candidates += uris[:1]
    for uri in candidates:
        if "security" not in uri:
            return uri
    raise BuildError(f"no Debian mirror found in {sources_dir}/*.sources or {sources_list}")


def slim_rootfs(root: Path) -> None:
    """Remove package caches, apt lists, docs, locales, man/info pages and logs."""
    for pattern in SLIM_GLOBS:
        for p in glob.glob(str(root / pattern)):
            _remove(Path(p))


def debian_recipe(suite: str = "bookworm", packages: Sequence[str] = ()) -> dict[str, Any]:
    """The canonical recipe of a Debian image (what the store's recipe hash covers)."""
    return {"kind": "debian", "suite": suite, "variant": "minbase",
            "packages": sorted(set(packages)), "build_rules": BUILD_RULES_VERSION}


def build_debian(out_sif: Path | str, suite: str = "bookworm", packages: Sequence[str] = (),
                 mirror: str | None = None, workdir: Path | str | None = None,
                 progress: Progress | None = None) -> Path:
    """debootstrap a minbase Debian with `packages`, slim it and write it as a SIF."""
    out_sif = Path(out_sif)
    mirror = mirror or apt_mirror()
    recipe = debian_recipe(suite, packages)
    with tempfile.TemporaryDirectory(prefix="paddock-debian-", dir=workdir) as tmp:
        root = Path(tmp) / "rootfs"
        argv = ["debootstrap", "--variant=minbase"]
        if recipe["packages"]:
            argv.append("--include=" + ",".join(recipe["packages"]))
        argv += [suite, str(root), mirror]
        try:
            run_command(argv, DEBOOTSTRAP_TIMEOUT_S, progress)
        finally:
            unmount_under(root)
        slim_rootfs(root)
        for d, mode in (("work", 0o755), ("tmp", 0o1777)):
            (root / d).mkdir(exist_ok=True)
            os.chmod(root / d, mode)
        meta = {"recipe": recipe, "source": f"debootstrap:{mirror}",
                "build_rules": BUILD_RULES_VERSION}
        return tree_to_sif(root, out_sif, meta, progress)


# ---------------------------------------------------------------- busybox recipe

def busybox_recipe(busybox: Path = Path("/bin/busybox")) -> dict[str, Any]:
    digest = hashlib.sha256(Path(busybox).read_bytes()).hexdigest()
    return {"kind": "busybox", "busybox_sha256": digest, "build_rules": BUILD_RULES_VERSION}


def build_busybox(out_sif: Path | str, busybox: Path = Path("/bin/busybox"),
                  workdir: Path | str | None = None, progress: Progress | None = None) -> Path:
    """A tiny rootfs of busybox-static with applet symlinks, /tmp 1777, /work, root user."""
    out_sif = Path(out_sif)
    with tempfile.TemporaryDirectory(prefix="paddock-busybox-", dir=workdir) as tmp:
        root = Path(tmp) / "rootfs"
        for d in ("bin", "sbin", "usr/bin", "usr/sbin", "proc", "sys", "dev", "etc", "root",
                  "work", "tmp"):
            (root / d).mkdir(parents=True, exist_ok=True)
        os.chmod(root / "tmp", 0o1777)
        shutil.copy2(busybox, root / "bin/busybox")
        os.chmod(root / "bin/busybox", 0o755)
        (root / "etc/passwd").write_text("root:x:0:0:root:/root:/bin/sh\n")
        (root / "etc/group").write_text("root:x:0:\n")
        applets = _busybox_applets(root / "bin/busybox")
        for applet in applets:
            link = root / applet.lstrip("/")
            if not link.exists() and not link.is_symlink():
                link.parent.mkdir(parents=True, exist_ok=True)
                link.symlink_to("/bin/busybox")
        meta = {"recipe": busybox_recipe(busybox), "source": f"busybox:{busybox}",
                "build_rules": BUILD_RULES_VERSION}
        return tree_to_sif(root, out_sif, meta, progress)


def _busybox_applets(busybox: Path) -> list[str]:
    argv = [str(busybox), "--list-full"]
    r = subprocess.run(argv, capture_output=True, text=True)
    if r.returncode != 0:
        raise CommandFailed(argv, r.returncode, r.stderr[-STDERR_TAIL_BYTES:])
    return [a for a in r.stdout.split() if a]
