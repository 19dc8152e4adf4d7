"""Image building: source -> sanitised staging tree -> squashfs -> SIF.

Sources are staged by `layers.staging` (rootfs directory, tarball, OCI image layout), or built
here from a Debian recipe (`debootstrap --variant=minbase`, then slimmed) or busybox-static.
mksquashfs packs the sanitised tree with `-no-xattrs -all-root -comp zstd -noappend`, and
`layers.sif` wraps it in a SIF file whose arch is read from the tree (`staging.detect_arch`).

Reproducible: the image is a function of the source's content (see `layers.staging` for the
times). The squashfs mkfs time and the SIF timestamps are the epoch ($SOURCE_DATE_EPOCH, else
0), the SIF UUID is derived from content, and the metadata names the source's kind, never its
path. (debootstrap output is not reproducible: it is keyed by recipe in the store instead.)

Must not import: zmq, controller.*, layers.store (the store calls the builder, not the reverse).
"""

from __future__ import annotations

import glob
import hashlib
import logging
import os
import re
import shutil
import subprocess
import tempfile
from pathlib import Path
from typing import Any, Sequence

from layers import archives
from layers.sif import ARCH_CODES, SOURCE_DATE_EPOCH_ENV, source_date_epoch, write_sif
from layers.staging import (  # noqa: F401 - re-exported: build.* is the public API
    STDERR_TAIL_BYTES,
    BuildError,
    CommandFailed,
    Progress,
    _remove,
    clamp_times,
    detect_arch,
    is_oci_layout,
    run_command,
    sanitise_tree,
    stage_directory,
    stage_oci_layout,
    stage_tarball,
)
from layers.staging import source_content_key as _tree_content_key
from layers.staging import source_kind as _shape_kind

log = logging.getLogger(__name__)

# Bump when the build rules change: it is part of every recipe hash, so old images are rebuilt.
BUILD_RULES_VERSION = 1
MKSQUASHFS_TIMEOUT_S = 1800.0
DEBOOTSTRAP_TIMEOUT_S = 3600.0
SLIM_GLOBS = ("var/cache/apt/archives/*.deb", "var/cache/apt/*.bin", "var/lib/apt/lists/*",
              "usr/share/doc/*", "usr/share/locale/*", "usr/share/man/*", "usr/share/info/*",
              "var/log/*.log", "var/log/apt/*", "debootstrap")


def _noop(_msg: str) -> None:
    pass


def source_kind(src: Path) -> str:
    """"oci", "dir", "docker-archive", "oci-archive" or "tar" (a root filesystem tarball)."""
    kind = _shape_kind(Path(src))
    if kind == "tar":
        kind = archives.archive_kind(Path(src)) or "tar"
    return kind


def source_content_key(src: Path) -> dict[str, Any]:
    """What identifies a source's content (the store's recipe key for `--store` builds):
    `staging.source_content_key`, or for an image archive its kind and sha256."""
    kind = source_kind(Path(src))
    if kind in (archives.DOCKER_ARCHIVE, archives.OCI_ARCHIVE):
        return archives.archive_content_key(Path(src), kind)
    return _tree_content_key(Path(src))


# ---------------------------------------------------------------- squashfs + SIF

def make_squashfs(rootfs: Path, out_sqfs: Path, mkfs_time_s: int = 0,
                  progress: Progress | None = None) -> Path:
    """Pack a (sanitised) tree with the fixed Paddock options. File times are taken from the
    tree; $SOURCE_DATE_EPOCH is not passed on (mksquashfs would refuse it next to -mkfs-time;
    `tree_to_sif` applies it as a clamp instead)."""
    argv = ["mksquashfs", str(rootfs), str(out_sqfs), "-no-xattrs", "-all-root",
            "-comp", "zstd", "-noappend", "-no-progress", "-quiet",
            "-mkfs-time", str(mkfs_time_s)]
    env = {k: v for k, v in os.environ.items() if k != SOURCE_DATE_EPOCH_ENV}
    run_command(argv, MKSQUASHFS_TIMEOUT_S, progress, env=env)
    return out_sqfs


def tree_to_sif(rootfs: Path, out_sif: Path, metadata: dict[str, Any],
                progress: Progress | None = None, arch: str | None = None) -> Path:
    """Sanitise `rootfs` in place (it must be a tree the caller owns), pack, wrap.
    `arch` None: detected from the tree."""
    progress = progress or _noop
    sanitise_tree(rootfs)
    epoch_s = source_date_epoch()
    if os.environ.get(SOURCE_DATE_EPOCH_ENV):
        clamp_times(rootfs, epoch_s)
    if arch is None:
        arch = detect_arch(rootfs)
    elif arch not in ARCH_CODES:
        raise BuildError(f"unknown architecture {arch!r}; valid: {', '.join(sorted(ARCH_CODES))}")
    progress(f"mksquashfs ({arch})")
    sqfs = out_sif.with_name(f".{out_sif.name}.{os.getpid()}.sqfs.tmp")
    partial = out_sif.with_name(f".{out_sif.name}.{os.getpid()}.tmp")
    try:
        make_squashfs(rootfs, sqfs, mkfs_time_s=epoch_s, progress=progress)
        progress("writing SIF")
        write_sif(partial, sqfs, arch=arch, created_at=epoch_s, metadata=metadata)
        os.chmod(partial, 0o644)
        os.replace(partial, out_sif)           # atomic: readers never see a partial SIF
    finally:
        sqfs.unlink(missing_ok=True)
        partial.unlink(missing_ok=True)
    return out_sif


def build_image(src: Path | str, out_sif: Path | str, workdir: Path | str | None = None,
                progress: Progress | None = None,
                metadata: dict[str, Any] | None = None, arch: str | None = None) -> Path:
    """Build a SIF from a rootfs directory, a tarball, an OCI layout directory, or an image
    archive (`docker save` output, a tarred OCI layout: `layers.archives`)."""
    src, out_sif = Path(src), Path(out_sif)
    progress = progress or _noop
    if not src.exists():
        raise BuildError(f"image source {src} does not exist")
    kind = source_kind(src)
    epoch_s = source_date_epoch()
    with tempfile.TemporaryDirectory(prefix="paddock-build-", dir=workdir) as tmp:
        root = Path(tmp) / "rootfs"
        root.mkdir()
        os.chmod(root, 0o755)                  # whatever the umask (a source may override)
        progress(f"staging {kind} source {src}")
        source = kind
        if kind == "oci":
            source = f"oci:{stage_oci_layout(src, root, progress, epoch_s)}"
        elif kind in (archives.DOCKER_ARCHIVE, archives.OCI_ARCHIVE):
            source = archives.stage_archive(src, root, kind, progress, epoch_s)
        elif kind == "dir":
            stage_directory(src, root)
        else:
            stage_tarball(src, root, epoch_s)
        meta = {"source": source, "build_rules": BUILD_RULES_VERSION}
        meta.update(metadata or {})
        return tree_to_sif(root, out_sif, meta, progress, arch)


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
        for dirpath, _dirs, _files in os.walk(root):     # modes independent of the umask
            os.chmod(dirpath, 0o755)
        os.chmod(root / "tmp", 0o1777)
        for f in ("etc/passwd", "etc/group"):
            os.chmod(root / f, 0o644)
        applets = _busybox_applets(root / "bin/busybox")
        for applet in applets:
            link = root / applet.lstrip("/")
            if not link.exists() and not link.is_symlink():
                link.parent.mkdir(parents=True, exist_ok=True)
                link.symlink_to("/bin/busybox")
        clamp_times(root, 0)           # synthesised now: fixed times, reproducible
        meta = {"recipe": busybox_recipe(busybox), "source": f"busybox:{busybox}",
                "build_rules": BUILD_RULES_VERSION}
        return tree_to_sif(root, out_sif, meta, progress)


def _busybox_applets(busybox: Path) -> list[str]:
    argv = [str(busybox), "--list-full"]
    r = subprocess.run(argv, capture_output=True, text=True)
    if r.returncode != 0:
        raise CommandFailed(argv, r.returncode, r.stderr[-STDERR_TAIL_BYTES:])
    return [a for a in r.stdout.split() if a]
