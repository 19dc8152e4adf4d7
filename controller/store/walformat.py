"""SQLite's write-ahead log, read from outside SQLite: the WAL file's header and frame headers,
the wal-index header (the -shm file; where the committed log ends, its commit counter) and
the log's running checksum, as sqlite.org/fileformat2.html ("WAL file format") and
sqlite.org/walformat.html describe them and SQLite's recovery checks them. Used by the
replica (replica.py) to ship exactly the frames SQLite counts as committed.

Must not import: zmq, controller.broker, controller.cli, controller.store.queue, nodeagent.
"""
from __future__ import annotations

import struct
import sys
from dataclasses import dataclass
from typing import Optional

WAL_HEADER = struct.Struct(">IIIIIIII")  # magic, version, page size, ckpt seq, salt1, salt2, cksum
FRAME_HEADER = struct.Struct(">IIIIII")  # page number, db size after commit (0: none), salts, cksum
WAL_MAGICS = (0x377F0682, 0x377F0683)
WAL_VERSION = 3007000  # the WAL header's and the wal-index's format version
# The wal-index header (the -shm file's first 48 bytes, twice; native byte order): version,
# unused, change counter, is-init, big-endian checksums, page size, mxFrame (the last
# committed frame), database pages, the last frame's checksum, salts (the WAL header's bytes,
# big-endian), the header's own checksum.
WAL_INDEX_HEADER = struct.Struct("=IIIBBHIIIIIIII")
WAL_INDEX_HEADER_SIZE = WAL_INDEX_HEADER.size


@dataclass(frozen=True)
class WalHeader:
    page_size: int
    big_endian: bool  # the checksums' word order (the magic's low bit)
    salts: tuple[int, int]
    cksum: tuple[int, int]  # the header's own checksum: the seed of the first frame's


def wal_header(header: bytes) -> Optional[WalHeader]:
    """The WAL header's fields, or None when it is not one SQLite would read (short, wrong
    magic or version, a bad page size, a checksum that does not match: a torn header)."""
    if len(header) < WAL_HEADER.size:
        return None
    magic, version, page_size, _, s1, s2, c1, c2 = WAL_HEADER.unpack(header)
    if magic not in WAL_MAGICS or version != WAL_VERSION or page_size < 512 \
            or page_size > 65536 or page_size & (page_size - 1):
        return None
    big = bool(magic & 1)
    if _checksum(header[:24], big, (0, 0)) != (c1, c2):
        return None
    return WalHeader(page_size, big, (s1, s2), (c1, c2))


@dataclass(frozen=True)
class WalIndex:
    change: int  # iChange: counts the commits that wrote frames
    frames: int  # mxFrame: the last frame of the last commit (0: none in the log)
    pages: int  # the database's size in pages after it
    cksum: tuple[int, int]  # that frame's running checksum
    salts: tuple[int, int]


def wal_index(raw: bytes) -> Optional[WalIndex]:
    """The wal-index header from the -shm file's first bytes, or None (short, not
    initialised, an unknown version, its two copies differing, a bad checksum)."""
    if len(raw) < 2 * WAL_INDEX_HEADER.size or raw[:48] != raw[48:96]:
        return None
    (version, _, change, is_init, _, _, mx_frame, pages, f1, f2, _, _,
     c1, c2) = WAL_INDEX_HEADER.unpack_from(raw)
    if version != WAL_VERSION or not is_init:
        return None
    if _checksum(raw[:40], sys.byteorder == "big", (0, 0)) != (c1, c2):
        return None
    salts = struct.unpack_from(">II", raw, 32)  # the WAL header's bytes, copied as they are
    return WalIndex(change, mx_frame, pages, (f1, f2), salts)


def _checksum(data: bytes, big_endian: bool, seed: tuple[int, int]) -> tuple[int, int]:
    """SQLite's WAL checksum (walChecksumBytes) of `data` continuing `seed`."""
    words = struct.unpack(f"{'>' if big_endian else '<'}{len(data) // 4}I", data)
    s1, s2 = seed
    for i in range(0, len(words), 2):
        s1 = (s1 + words[i] + s2) & 0xFFFFFFFF
        s2 = (s2 + words[i + 1] + s1) & 0xFFFFFFFF
    return s1, s2


_COEFFS: dict[int, tuple] = {}
CHUNK_FRAMES = 256


def frame_checksums(data: bytes, page_size: int, big_endian: bool,
                     seed: tuple[int, int]) -> list[tuple[int, int]]:
    """The running checksum after each whole frame of `data` (each over the frame header's
    first 8 bytes and the page), chained from `seed`: what each frame must carry to be valid.

    The checksum is linear: a pair of words (a, b) maps (s1, s2) to M(s1, s2) + (a, a + b)
    with M = [[1, 1], [1, 2]], so a frame of P pairs adds sum_i M^(P-1-i) (a_i, a_i + b_i)
    to M^P(seed): one matrix product over all frames (numpy, wrapping modulo 2^64, a multiple
    of 2^32), then one step per frame to chain them."""
    frame = FRAME_HEADER.size + page_size
    n = len(data) // frame
    if n == 0:
        return []
    import numpy as np  # here: only a replicating controller pays its import
    pairs = (8 + page_size) // 8
    if page_size not in _COEFFS:
        mask = 0xFFFFFFFF
        powers = [(1, 0, 1)]  # M^k as (p, q, r): [[p, q], [q, r]]
        for _ in range(pairs):
            p, q, r = powers[-1]
            powers.append(((p + q) & mask, (p + 2 * q) & mask, (q + 2 * r) & mask))
        rev = powers[pairs - 1::-1]  # the pair i's M^(P-1-i)
        coef = np.array([[p + q, q, q + r, r] for p, q, r in rev], dtype=np.uint64) & mask
        _COEFFS[page_size] = (coef, powers[pairs])
    coef, (mp, mq, mr) = _COEFFS[page_size]
    words = np.frombuffer(data, dtype=">u4" if big_endian else "<u4",
                          count=n * frame // 4).reshape(n, frame // 4)
    d1: list[int] = []
    d2: list[int] = []
    for at in range(0, n, CHUNK_FRAMES):  # a large commit's frames a few MiB at a time
        chunk = words[at:at + CHUNK_FRAMES].astype(np.uint64)
        summed = np.concatenate([chunk[:, :2], chunk[:, FRAME_HEADER.size // 4:]], axis=1)
        a, b = summed[:, 0::2], summed[:, 1::2]
        d1 += (a @ coef[:, 0] + b @ coef[:, 1]).tolist()
        d2 += (a @ coef[:, 2] + b @ coef[:, 3]).tolist()
    s1, s2 = seed
    out = []
    for x, y in zip(d1, d2):
        s1, s2 = (mp * s1 + mq * s2 + x) & 0xFFFFFFFF, (mq * s1 + mr * s2 + y) & 0xFFFFFFFF
        out.append((s1, s2))
    return out
