"""SIF (Singularity Image Format) writer and reader: pure byte layout, no processes.

Writes a real SIF v1 file (the layout apptainer's `sif` library produces: 128-byte global
header, 48 descriptors of 585 bytes at offset 4096, objects from offset 32176) holding one
squashfs as the primary system partition, aligned to 4096 so it lands at offset 32768, plus an
optional GenericJSON object with Paddock metadata (recipe, source). Reads such files back and
locates the primary squashfs partition, distinguishing a foreign file (`NotSifError`) from a
damaged SIF (`CorruptSifError`) and from a SIF whose primary partition is not squashfs
(`NotSquashfsError`). `check_arch` refuses an image built for another architecture
(`ArchMismatchError`, naming both).

In deterministic mode (the default) the file is a pure function of its content: the header and
descriptor timestamps are fixed (`SOURCE_DATE_EPOCH`, else 0) and the image UUID is derived from
the sha256 of the squashfs partition and the metadata.

The facts come from /work/shared/notes/sif-format.md. All integers are little-endian.

Must not import: subprocess, zmq, controller, layers other than layers.sif.
"""

from __future__ import annotations

import hashlib
import json
import os
import platform
import struct
import time
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Any, BinaryIO

SIF_MAGIC = b"SIF_MAGIC\0"
SIF_VERSION = b"01\0"
LAUNCH_SCRIPT = b"#!/usr/bin/env run-singularity\n"
HEADER_SIZE_BYTES = 128
DESCRIPTOR_SIZE_BYTES = 585
DEFAULT_DESCRIPTORS_TOTAL = 48
DEFAULT_DESCRIPTORS_OFFSET = 4096
PARTITION_ALIGN_BYTES = 4096
SQUASHFS_MAGIC = b"hsqs"
DEFAULT_GROUP_ID = 1
GROUP_MASK = 0xF0000000

# DataType values (sif.go)
DATA_DEFFILE = 0x4001
DATA_ENVVAR = 0x4002
DATA_LABELS = 0x4003
DATA_PARTITION = 0x4004
DATA_SIGNATURE = 0x4005
DATA_GENERIC_JSON = 0x4006
DATA_GENERIC = 0x4007
DATA_TYPE_NAMES = {
    0x4001: "Deffile", 0x4002: "EnvVar", 0x4003: "Labels", 0x4004: "Partition",
    0x4005: "Signature", 0x4006: "GenericJSON", 0x4007: "Generic", 0x4008: "CryptoMessage",
    0x4009: "SBOM", 0x400A: "OCIRootIndex", 0x400B: "OCIBlob",
}
FSTYPE_SQUASHFS = 1
FSTYPE_NAMES = {1: "Squashfs", 2: "Ext3", 3: "ImmuObj", 4: "Raw", 5: "EncryptedSquashfs",
                6: "GocryptfsSquashfs"}
PARTTYPE_SYSTEM = 1
PARTTYPE_PRIMSYS = 2
PARTTYPE_NAMES = {1: "System", 2: "PrimSys", 3: "Data", 4: "Overlay"}

ARCH_CODES = {
    "unknown": b"00", "386": b"01", "amd64": b"02", "arm": b"03", "arm64": b"04",
    "ppc64": b"05", "ppc64le": b"06", "mips": b"07", "mipsle": b"08", "mips64": b"09",
    "mips64le": b"10", "s390x": b"11", "riscv64": b"12", "loong64": b"13",
}
ARCH_NAMES = {code.decode(): name for name, code in ARCH_CODES.items()}
# platform.machine() -> SIF arch name (the Go GOARCH names apptainer uses)
MACHINE_ARCH = {
    "x86_64": "amd64", "amd64": "amd64", "i386": "386", "i486": "386", "i586": "386",
    "i686": "386", "aarch64": "arm64", "arm64": "arm64", "armv6l": "arm", "armv7l": "arm",
    "ppc64": "ppc64", "ppc64le": "ppc64le", "mips": "mips", "mipsel": "mipsle",
    "mips64": "mips64", "mips64el": "mips64le", "s390x": "s390x", "riscv64": "riscv64",
    "loongarch64": "loong64",
}
SOURCE_DATE_EPOCH_ENV = "SOURCE_DATE_EPOCH"
# Namespace of the content-derived image UUIDs (uuid5 over the content's sha256 hex).
IMAGE_ID_NAMESPACE = uuid.UUID("6f1d2a43-7c1b-5a0e-9d3c-5061646f636b")
METADATA_NAME = "paddock.json"

# <32s launch, 10s magic, 3s version, 3s arch, 16s id, 8 x int64
_HEADER = struct.Struct("<32s10s3s3s16sqqqqqqqq")
# <int32 type, bool used, uint32 id, group, link, 8 x int64, 128s name, 384s extra
_DESCRIPTOR = struct.Struct("<i?IIIqqqqqqq128s384s")
_PARTITION_EXTRA = struct.Struct("<ii3s")
assert _HEADER.size == HEADER_SIZE_BYTES
assert _DESCRIPTOR.size == DESCRIPTOR_SIZE_BYTES


class SifError(Exception):
    """Base class of SIF reading errors; the message ends with the fix (`fix`)."""
    fix = ""

    def __init__(self, message: str):
        super().__init__(f"{message}; {self.fix}" if self.fix else message)


class NotSifError(SifError):
    """The file is not a SIF file at all (wrong magic): a foreign file."""
    fix = "give a SIF file, e.g. one built by `paddock image build SRC -o OUT`"


class CorruptSifError(SifError):
    """The file claims to be SIF but its structure is damaged or unusable for Paddock."""
    fix = "the file is damaged: copy it again, or rebuild it with `paddock image build`"


class NotSquashfsError(CorruptSifError):
    """A well-formed SIF whose primary partition is not a squashfs filesystem."""
    fix = "Paddock runs squashfs images only: rebuild it with `paddock image build`"


class ArchMismatchError(SifError):
    """The image was built for another CPU architecture than this host's."""

    def __init__(self, path: Path, image_arch: str, host_arch: str):
        self.path, self.image_arch, self.host_arch = path, image_arch, host_arch
        super().__init__(f"image {path} is built for {image_arch}, but this host is "
                         f"{host_arch}: rebuild it from a {host_arch} root filesystem "
                         f"(`paddock image build SRC -o OUT` on a {host_arch} machine)")


def host_arch() -> str:
    """This machine's architecture as a SIF arch name ("unknown" if unmapped)."""
    return MACHINE_ARCH.get(platform.machine().lower(), "unknown")


def source_date_epoch(default: int = 0) -> int:
    """$SOURCE_DATE_EPOCH (reproducible-builds convention), else `default`."""
    raw = os.environ.get(SOURCE_DATE_EPOCH_ENV, "").strip()
    if not raw:
        return default
    if not raw.isdigit():
        raise ValueError(f"{SOURCE_DATE_EPOCH_ENV}={raw!r} is not a non-negative integer "
                         f"(Unix seconds)")
    return int(raw)


@dataclass(frozen=True)
class SifDescriptor:
    slot: int
    data_type: int
    used: bool
    id: int
    group_id: int
    linked_id: int
    offset: int
    size: int
    size_with_padding: int
    created_at: int
    modified_at: int
    name: str
    extra: bytes

    @property
    def type_name(self) -> str:
        return DATA_TYPE_NAMES.get(self.data_type, hex(self.data_type))

    def partition_fields(self) -> tuple[int, int, str]:
        """(fstype, parttype, arch name) of a Partition descriptor."""
        fstype, parttype, arch = _PARTITION_EXTRA.unpack_from(self.extra)
        return fstype, parttype, ARCH_NAMES.get(arch.rstrip(b"\0").decode(errors="replace"),
                                                "unknown")


@dataclass(frozen=True)
class SifInfo:
    path: Path
    launch_script: str
    version: str
    arch: str
    id: str
    created_at: int
    modified_at: int
    descriptors_free: int
    descriptors_total: int
    descriptors_offset: int
    descriptors_size: int
    data_offset: int
    data_size: int
    file_size_bytes: int
    descriptors: tuple[SifDescriptor, ...]      # used descriptors only
    primary_partition_offset: int
    primary_partition_size: int
    squashfs_compression: str
    metadata: dict[str, Any] | None             # the Paddock GenericJSON object, if any


def _pad(data: bytes, size: int) -> bytes:
    assert len(data) <= size, (data, size)
    return data + b"\0" * (size - len(data))


def _align(value: int, alignment: int) -> int:
    return (value + alignment - 1) // alignment * alignment


def write_sif(out_path: os.PathLike | str, squashfs_path: os.PathLike | str, arch: str = "amd64",
              created_at: int | None = None, deterministic: bool = True,
              metadata: dict[str, Any] | None = None) -> Path:
    """Write a SIF file holding `squashfs_path` as its primary system partition.

    `created_at` is Unix seconds; it defaults to $SOURCE_DATE_EPOCH (else 0) when
    `deterministic` (which also derives the image UUID from the content, so identical inputs
    give identical bytes) and to the current time (and a random UUID) otherwise.
    `metadata` (JSON-serialisable) is stored as a GenericJSON object named paddock.json.
    """
    out_path, squashfs_path = Path(out_path), Path(squashfs_path)
    if arch not in ARCH_CODES:
        raise ValueError(f"unknown SIF arch {arch!r}; valid: {sorted(ARCH_CODES)}")
    with open(squashfs_path, "rb") as f:
        if f.read(4) != SQUASHFS_MAGIC:
            raise ValueError(f"{squashfs_path} is not a squashfs image (no 'hsqs' magic)")
    if created_at is None:
        created_at = source_date_epoch() if deterministic else int(time.time())
    meta_bytes = b"" if metadata is None else \
        json.dumps(metadata, sort_keys=True, separators=(",", ":")).encode()
    image_id = (content_uuid(squashfs_path, meta_bytes) if deterministic
                else uuid.uuid4()).bytes
    descs_size = DEFAULT_DESCRIPTORS_TOTAL * DESCRIPTOR_SIZE_BYTES
    data_offset = DEFAULT_DESCRIPTORS_OFFSET + descs_size
    sqfs_size = squashfs_path.stat().st_size
    part_offset = _align(data_offset, PARTITION_ALIGN_BYTES)
    group = DEFAULT_GROUP_ID | GROUP_MASK
    arch_code = ARCH_CODES[arch] + b"\0"
    descriptors = [_DESCRIPTOR.pack(
        DATA_PARTITION, True, 1, group, 0, part_offset, sqfs_size,
        part_offset - data_offset + sqfs_size, created_at, created_at, 0, 0,
        _pad(b"rootfs", 128),
        _pad(_PARTITION_EXTRA.pack(FSTYPE_SQUASHFS, PARTTYPE_PRIMSYS, arch_code), 384))]
    end = part_offset + sqfs_size
    if metadata is not None:
        descriptors.append(_DESCRIPTOR.pack(
            DATA_GENERIC_JSON, True, 2, group, 0, end, len(meta_bytes), len(meta_bytes),
            created_at, created_at, 0, 0, _pad(METADATA_NAME.encode(), 128), bytes(384)))
        end += len(meta_bytes)
    used = len(descriptors)
    header = _HEADER.pack(
        _pad(LAUNCH_SCRIPT, 32), SIF_MAGIC, SIF_VERSION, arch_code, image_id,
        created_at, created_at, DEFAULT_DESCRIPTORS_TOTAL - used, DEFAULT_DESCRIPTORS_TOTAL,
        DEFAULT_DESCRIPTORS_OFFSET, descs_size, data_offset, end - data_offset)
    with open(out_path, "wb") as out:
        out.write(header)
        out.write(b"\0" * (DEFAULT_DESCRIPTORS_OFFSET - HEADER_SIZE_BYTES))
        out.write(b"".join(descriptors))
        out.write(b"\0" * ((DEFAULT_DESCRIPTORS_TOTAL - used) * DESCRIPTOR_SIZE_BYTES))
        out.write(b"\0" * (part_offset - data_offset))
        with open(squashfs_path, "rb") as src:
            while chunk := src.read(1 << 20):
                out.write(chunk)
        out.write(meta_bytes)
    return out_path


def content_uuid(squashfs_path: Path, meta_bytes: bytes) -> uuid.UUID:
    """The deterministic image UUID: uuid5 over the sha256 of the partition and metadata."""
    h = hashlib.sha256()
    with open(squashfs_path, "rb") as f:
        while chunk := f.read(1 << 20):
            h.update(chunk)
    h.update(meta_bytes)
    return uuid.uuid5(IMAGE_ID_NAMESPACE, h.hexdigest())


def _read_exact(f: BinaryIO, offset: int, size: int, what: str, path: Path) -> bytes:
    f.seek(offset)
    data = f.read(size)
    if len(data) != size:
        raise CorruptSifError(f"{path}: truncated {what}: wanted {size} bytes at offset "
                              f"{offset}, file has only {len(data)} there")
    return data


def _parse_descriptors(raw: bytes, total: int) -> list[SifDescriptor]:
    out = []
    for slot in range(total):
        (dtype, used, did, group, link, offset, size, padded, created, modified, _uid, _gid,
         name, extra) = _DESCRIPTOR.unpack_from(raw, slot * DESCRIPTOR_SIZE_BYTES)
        if not used:
            continue
        out.append(SifDescriptor(
            slot=slot, data_type=dtype, used=used, id=did, group_id=group, linked_id=link,
            offset=offset, size=size, size_with_padding=padded, created_at=created,
            modified_at=modified, name=name.rstrip(b"\0").decode(errors="replace"),
            extra=extra))
    return out


_SQUASHFS_COMPRESSION = {1: "zlib", 2: "lzma", 3: "lzo", 4: "xz", 5: "lz4", 6: "zstd"}


def read_sif(path: os.PathLike | str) -> SifInfo:
    """Parse a SIF file and locate its primary squashfs partition.

    Raises NotSifError for a file without the SIF magic, CorruptSifError for a SIF whose
    version, header, descriptors or primary partition are invalid, OSError if unreadable.
    """
    path = Path(path)
    file_size = path.stat().st_size
    with open(path, "rb") as f:
        head = f.read(HEADER_SIZE_BYTES)
        magic = head[32:42]
        if magic != SIF_MAGIC:
            raise NotSifError(f"{path} is not a SIF file (magic {magic!r} at offset 32, "
                              f"expected {SIF_MAGIC!r})")
        if len(head) < HEADER_SIZE_BYTES:
            raise CorruptSifError(f"{path}: truncated SIF header ({len(head)} of "
                                  f"{HEADER_SIZE_BYTES} bytes)")
        (launch, _magic, version, arch, image_id, created, modified, free, total, d_off,
         d_size, data_off, data_size) = _HEADER.unpack(head)
        if version != SIF_VERSION:
            raise CorruptSifError(f"{path}: unsupported SIF version {version!r} "
                                  f"(only {SIF_VERSION!r} exists)")
        if total <= 0 or total > 1 << 16 or d_size != total * DESCRIPTOR_SIZE_BYTES \
                or d_off < HEADER_SIZE_BYTES:
            raise CorruptSifError(f"{path}: invalid descriptor table (total={total}, "
                                  f"offset={d_off}, size={d_size})")
        raw = _read_exact(f, d_off, d_size, "descriptor table", path)
        descriptors = _parse_descriptors(raw, total)
        primary = [d for d in descriptors if d.data_type == DATA_PARTITION
                   and d.partition_fields()[1] == PARTTYPE_PRIMSYS]
        if not primary:
            raise CorruptSifError(f"{path}: no primary system partition (no used Partition "
                                  f"descriptor with Parttype PrimSys)")
        part = primary[0]
        fstype = part.partition_fields()[0]
        if fstype != FSTYPE_SQUASHFS:
            raise NotSquashfsError(f"{path}: primary partition is "
                                   f"{FSTYPE_NAMES.get(fstype, fstype)}, not squashfs")
        if part.offset < 0 or part.size <= 0 or part.offset + part.size > file_size:
            raise CorruptSifError(f"{path}: primary partition [{part.offset}, "
                                  f"{part.offset + part.size}) lies past the end of the file "
                                  f"({file_size} bytes): the file is truncated")
        superblock = _read_exact(f, part.offset, 22, "squashfs superblock", path)
        if superblock[:4] != SQUASHFS_MAGIC:
            raise NotSquashfsError(f"{path}: primary partition at offset {part.offset} is not "
                                   f"squashfs (magic {superblock[:4]!r}, expected 'hsqs')")
        compression = _SQUASHFS_COMPRESSION.get(
            struct.unpack_from("<H", superblock, 20)[0], "unknown")
        metadata = None
        for d in descriptors:
            if d.data_type == DATA_GENERIC_JSON and d.name == METADATA_NAME \
                    and d.offset + d.size <= file_size:
                try:
                    metadata = json.loads(_read_exact(f, d.offset, d.size, "metadata", path))
                except ValueError as e:
                    raise CorruptSifError(f"{path}: {METADATA_NAME} is not JSON: {e}") from e
    return SifInfo(
        path=path, launch_script=launch.rstrip(b"\0").decode(errors="replace"),
        version=version.rstrip(b"\0").decode(), arch=ARCH_NAMES.get(
            arch.rstrip(b"\0").decode(errors="replace"), "unknown"),
        id=str(uuid.UUID(bytes=image_id)), created_at=created, modified_at=modified,
        descriptors_free=free, descriptors_total=total, descriptors_offset=d_off,
        descriptors_size=d_size, data_offset=data_off, data_size=data_size,
        file_size_bytes=file_size, descriptors=tuple(descriptors),
        primary_partition_offset=part.offset, primary_partition_size=part.size,
        squashfs_compression=compression, metadata=metadata)


def check_arch(image: os.PathLike | str | SifInfo, host: str | None = None) -> str:
    """The image's architecture, if this host (or `host`) can run it; else ArchMismatchError.

    An image whose arch is "unknown" (no ELF binary found at build time) is accepted.
    Also raises what `read_sif` raises when given a path.
    """
    info = image if isinstance(image, SifInfo) else read_sif(image)
    host = host or host_arch()
    if info.arch not in ("unknown", host) and host != "unknown":
        raise ArchMismatchError(info.path, info.arch, host)
    return info.arch
