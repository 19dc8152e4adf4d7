"""`paddock image ...` subcommands: build a SIF image, inspect a SIF file.

Thin: parses arguments, calls layers.build / layers.store / layers.sif, renders with rich.
Operating errors (a foreign, corrupt or non-squashfs file, a failed build) print one line to
stderr and return exit code 2.

Must not import: zmq, controller.* other than controller.ondisk.fileio (the atomic write).
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
from pathlib import Path
from typing import Any, Callable

from rich.console import Console
from rich.progress import Progress, SpinnerColumn, TextColumn, TimeElapsedColumn
from rich.table import Table

from controller.ondisk.fileio import atomic_write_with
from layers import build
from layers.sif import (
    ARCH_CODES,
    DATA_PARTITION,
    FSTYPE_NAMES,
    PARTTYPE_NAMES,
    ArchMismatchError,
    SifError,
    check_arch,
    read_sif,
)
from layers.store import ImageStore, ImageStoreError, sha256_file

EXIT_OK = 0
EXIT_ERROR = 2


def register(subparsers: argparse._SubParsersAction) -> argparse.ArgumentParser:
    """Add the `image` command (with `build` and `inspect`) to a subparsers object."""
    image = subparsers.add_parser("image", help="build and inspect SIF images")
    sub = image.add_subparsers(dest="image_cmd", required=True)
    b = sub.add_parser("build", help="build a SIF image (squashfs root filesystem)")
    b.add_argument("src", help="rootfs directory, tarball, OCI layout directory, or "
                               "debian:SUITE[:pkg,pkg,...]")
    b.add_argument("-o", "--output", type=Path, help="SIF file to write")
    b.add_argument("--store", type=Path, default=None,
                   help="also (or only) put it in this content-addressed store, building once "
                        "per source content even when several processes ask at once")
    b.add_argument("--arch", choices=sorted(ARCH_CODES), default=None,
                   help="record this architecture (default: read from the rootfs's /bin/sh)")
    b.add_argument("--mirror", default=None, help="Debian mirror (default: apt's)")
    b.add_argument("-v", "--verbose", action="store_true",
                   help="print every build step to stderr, also when it is not a terminal")
    b.set_defaults(func=cmd_build)
    i = sub.add_parser("inspect", help="print a SIF file's header, descriptors and digest")
    i.add_argument("file", type=Path)
    i.set_defaults(func=cmd_inspect)
    return image


def parse_debian_src(src: str) -> tuple[str, list[str]] | None:
    """`debian:SUITE[:pkg,pkg]` -> (suite, packages); None if src is not a debian: ref."""
    if not src.startswith("debian:"):
        return None
    _, _, rest = src.partition(":")
    suite, _, pkgs = rest.partition(":")
    if not suite:
        raise build.BuildError(f"bad Debian source {src!r}: want debian:SUITE[:pkg,pkg]")
    return suite, [p for p in pkgs.split(",") if p]


def _err(msg: str) -> int:
    print(f"error: {' '.join(msg.split())}", file=sys.stderr)
    return EXIT_ERROR


def _builder(args: argparse.Namespace, progress: Callable[[str], None]
             ) -> tuple[dict[str, Any], Callable[[Path], Any]]:
    """(recipe identifying the source's content, function writing the SIF at a path)."""
    deb = parse_debian_src(args.src)
    if deb is not None:
        recipe = build.debian_recipe(deb[0], deb[1])
        return recipe, lambda out: build.build_debian(out, deb[0], deb[1], mirror=args.mirror,
                                                      progress=progress)
    src = Path(args.src)
    if not src.exists():
        raise build.BuildError(f"image source {src} does not exist")
    recipe = {"source": build.source_content_key(src), "arch": args.arch,
              "build_rules": build.BUILD_RULES_VERSION}
    return recipe, lambda out: build.build_image(src, out, progress=progress, arch=args.arch)


def _copy_atomically(src: Path, dest: Path) -> None:
    atomic_write_with(dest, lambda tmp: shutil.copyfile(src, tmp))


def cmd_build(args: argparse.Namespace) -> int:
    if args.output is None and args.store is None:
        return _err("image build: give -o OUT, --store DIR, or both")
    err_console = Console(stderr=True)
    columns = (SpinnerColumn(), TextColumn("{task.description}"), TimeElapsedColumn())
    bar = Progress(*columns, console=err_console, transient=True,
                   disable=not err_console.is_terminal)
    task = bar.add_task(f"building {args.src}")

    def progress(msg: str) -> None:
        """Each step: a finished line above the live spinner line (terminals only)."""
        bar.update(task, description=f"{args.src}: {msg[:100]}")
        if err_console.is_terminal:
            bar.console.print(f"[dim]{msg[:200]}[/dim]", highlight=False)
        elif args.verbose:
            print(f"paddock image build: {msg[:200]}", file=sys.stderr, flush=True)
    try:
        recipe, builder = _builder(args, progress)
        with bar:
            if args.store is None:
                builder(args.output)
                digest, path = f"sha256:{sha256_file(args.output)}", args.output
            else:
                store = ImageStore(args.store)
                digest, path = store.build_or_reuse(recipe, builder, progress)
                if args.output is not None:
                    _copy_atomically(path, args.output)
                    path = args.output
    except build.CommandFailed as e:
        tail = e.stderr.strip().splitlines()[-1:] or [""]
        return _err(f"build failed: exit {e.exit_code} from {' '.join(e.argv)}: {tail[0]}")
    except (build.BuildError, ImageStoreError, OSError, ValueError) as e:
        return _err(f"build failed: {e}")
    print(f"{path} {digest}")
    return EXIT_OK


def cmd_inspect(args: argparse.Namespace) -> int:
    try:
        info = read_sif(args.file)
        digest = sha256_file(args.file)
    except (SifError, OSError) as e:
        return _err(str(e))
    print(f"file:      {info.path}")
    print(f"digest:    sha256:{digest}")
    print(f"version:   {info.version}   arch: {info.arch}   id: {info.id}")
    try:
        check_arch(info)
    except ArchMismatchError as e:
        print(f"warning:   cannot run on this host ({e.host_arch}): built for {e.image_arch}")
    print(f"created:   {info.created_at}   modified: {info.modified_at}")
    print(f"descriptors: {info.descriptors_total - info.descriptors_free} used of "
          f"{info.descriptors_total} at offset {info.descriptors_offset}; data at "
          f"{info.data_offset} ({info.data_size} bytes)")
    print(f"primary partition: offset {info.primary_partition_offset} size "
          f"{info.primary_partition_size} (squashfs, {info.squashfs_compression})")
    table = Table("id", "type", "name", "offset", "size", "group", "details")
    for d in info.descriptors:
        details = ""
        if d.data_type == DATA_PARTITION:
            fs, part, arch = d.partition_fields()
            details = f"{FSTYPE_NAMES.get(fs, fs)} {PARTTYPE_NAMES.get(part, part)} {arch}"
        table.add_row(str(d.id), d.type_name, d.name, str(d.offset), str(d.size),
                      hex(d.group_id), details)
    Console(width=max(100, Console().width)).print(table)
    if info.metadata is not None:
        print(json.dumps(info.metadata, indent=2, sort_keys=True))
    return EXIT_OK


def main(argv: list[str] | None = None) -> int:
    """`python -m controller.cli.image image ...`: only the image commands (no other library loaded)."""
    parser = argparse.ArgumentParser(prog="paddock")
    register(parser.add_subparsers(dest="cmd", required=True))
    args = parser.parse_args(argv)
    return args.func(args)


if __name__ == "__main__":
    sys.exit(main())
