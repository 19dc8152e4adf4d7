"""Specification of layers/: SIF files, sanitised image builds, the content-addressed store,
the built-in images and the `image` CLI. Real mksquashfs, squashfuse and fcntl locks."""

from __future__ import annotations

import argparse
import contextlib
import hashlib
import io
import multiprocessing
import os
import shutil
import socket
import stat
import struct
import subprocess
import tarfile
from pathlib import Path

import pytest

from controller.cli import image as cli
from layers import build
from layers.builtin import default_store_root, ensure_builtin_image, ensure_busybox_image, python_image_recipe
from layers.sif import CorruptSifError, NotSifError, NotSquashfsError, content_uuid, read_sif, write_sif
from layers.store import ImageNotFound, ImageStore, InvalidImageRef, recipe_hash

needs_root = pytest.mark.skipif(os.geteuid() != 0, reason="needs root (mknod, squashfuse)")
DEADLINE_S = 60.0


# ------------------------------------------------------------------ helpers

def sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


@contextlib.contextmanager
def mounted(sif: Path, mnt: Path):
    """squashfuse the SIF's primary partition at `mnt`; always unmount."""
    offset = read_sif(sif).primary_partition_offset
    mnt.mkdir(exist_ok=True)
    subprocess.run(["squashfuse", "-o", f"offset={offset}", str(sif), str(mnt)], check=True)
    try:
        yield mnt
    finally:
        subprocess.run(["fusermount3", "-u", str(mnt)], check=True)


def listing(sif: Path) -> dict[str, str]:
    """path -> `ls -l`-style mode string, with numeric owner, from unsquashfs."""
    offset = read_sif(sif).primary_partition_offset
    out = subprocess.run(["unsquashfs", "-lln", "-o", str(offset), str(sif)], check=True,
                         capture_output=True, text=True).stdout
    result = {}
    for line in out.splitlines():
        parts = line.split(None, 5)
        if len(parts) == 6 and parts[5].startswith("squashfs-root"):
            name = parts[5].split(" -> ")[0].removeprefix("squashfs-root") or "/"
            result[name] = f"{parts[0]} {parts[1]}"
    return result


def tiny_squashfs(tmp_path: Path) -> Path:
    root = tmp_path / "tiny"
    root.mkdir()
    (root / "hello.txt").write_text("hello\n")
    return build.make_squashfs(root, tmp_path / "tiny.sqfs")


@pytest.fixture(scope="module")
def busybox_sif(tmp_path_factory) -> Path:
    store = ImageStore(tmp_path_factory.mktemp("bbstore"))
    return ensure_busybox_image(store)[1]


# ------------------------------------------------------------------ SIF format

def test_sif_round_trip_puts_squashfs_at_32768_as_primary_system_partition(tmp_path):
    sqfs = tiny_squashfs(tmp_path)
    sif = write_sif(tmp_path / "x.sif", sqfs, metadata={"recipe": {"kind": "t"}, "source": "s"})
    info = read_sif(sif)
    assert (info.version, info.arch, info.descriptors_total) == ("01", "amd64", 48)
    assert (info.descriptors_offset, info.data_offset) == (4096, 4096 + 48 * 585)
    assert info.primary_partition_offset == 32768
    assert info.primary_partition_size == sqfs.stat().st_size
    raw = sif.read_bytes()
    assert raw[32768:32768 + sqfs.stat().st_size] == sqfs.read_bytes()
    assert raw[32:42] == b"SIF_MAGIC\0"
    part = info.descriptors[0]
    assert (part.type_name, part.partition_fields()) == ("Partition", (1, 2, "amd64"))
    assert info.metadata == {"recipe": {"kind": "t"}, "source": "s"}
    assert info.squashfs_compression == "zstd"
    assert info.data_size == info.file_size_bytes - info.data_offset


def test_deterministic_sif_is_byte_identical_and_random_one_is_not(tmp_path, monkeypatch):
    monkeypatch.delenv("SOURCE_DATE_EPOCH", raising=False)
    sqfs = tiny_squashfs(tmp_path)
    a = write_sif(tmp_path / "a.sif", sqfs)
    b = write_sif(tmp_path / "b.sif", sqfs)
    c = write_sif(tmp_path / "c.sif", sqfs, deterministic=False)
    d = write_sif(tmp_path / "d.sif", sqfs, metadata={"other": "content"})
    assert a.read_bytes() == b.read_bytes()
    assert read_sif(a).created_at == 0
    assert read_sif(a).id == str(content_uuid(sqfs, b"")), "uuid derived from content"
    assert read_sif(d).id != read_sif(a).id
    assert read_sif(c).id != read_sif(a).id and read_sif(c).created_at > 0


def test_foreign_file_is_not_sif_and_names_the_magic(tmp_path):
    f = tmp_path / "notes.txt"
    f.write_text("just some text, long enough to have bytes at offset thirty-two\n")
    with pytest.raises(NotSifError, match=r"notes.txt is not a SIF file \(magic"):
        read_sif(f)
    empty = tmp_path / "empty"
    empty.write_bytes(b"")
    with pytest.raises(NotSifError):
        read_sif(empty)


def _set_descriptor_field(raw: bytearray, fmt: str, field_offset: int, value) -> None:
    struct.pack_into(fmt, raw, 4096 + field_offset, value)


CORRUPTIONS = {
    "bad version": (lambda raw: raw.__setitem__(slice(42, 45), b"99\0"), "version"),
    "truncated descriptors": (lambda raw: raw.__delitem__(slice(5000, None)), "truncated"),
    "partition past end": (lambda raw: _set_descriptor_field(raw, "<q", 25, 1 << 40),
                           "past the end"),
    "no primary partition": (lambda raw: _set_descriptor_field(raw, "<i", 201 + 4, 3),
                             "no primary system partition"),
    "not squashfs fstype": (lambda raw: _set_descriptor_field(raw, "<i", 201, 2),
                            "not squashfs"),
    "superblock magic": (lambda raw: raw.__setitem__(slice(32768, 32772), b"XXXX"),
                         "is not squashfs"),
}


@pytest.mark.parametrize("kind", sorted(CORRUPTIONS))
def test_damaged_sif_is_corrupt_not_foreign(tmp_path, kind):
    good = write_sif(tmp_path / "good.sif", tiny_squashfs(tmp_path))
    raw = bytearray(good.read_bytes())
    mutate, message = CORRUPTIONS[kind]
    mutate(raw)
    bad = tmp_path / "bad.sif"
    bad.write_bytes(bytes(raw))
    with pytest.raises(CorruptSifError, match=message) as e:
        read_sif(bad)
    assert isinstance(e.value, NotSquashfsError) == (kind in ("not squashfs fstype",
                                                              "superblock magic"))


def test_write_sif_refuses_a_payload_that_is_not_squashfs(tmp_path):
    junk = tmp_path / "junk"
    junk.write_bytes(b"not a filesystem")
    with pytest.raises(ValueError, match="not a squashfs"):
        write_sif(tmp_path / "x.sif", junk)


# ------------------------------------------------------------------ building

@needs_root
def test_squashfuse_at_offset_32768_shows_the_image_files(busybox_sif, tmp_path):
    assert read_sif(busybox_sif).primary_partition_offset == 32768
    with mounted(busybox_sif, tmp_path / "mnt") as mnt:
        assert (mnt / "bin/busybox").is_file()
        assert os.readlink(mnt / "bin/sh") == "/bin/busybox"
        assert stat.S_IMODE((mnt / "tmp").stat().st_mode) == 0o1777
        assert (mnt / "work").is_dir()
        assert (mnt / "etc/passwd").read_text().startswith("root:x:0:0:")
    assert not os.path.ismount(tmp_path / "mnt")


def hostile_rootfs(base: Path) -> Path:
    """A rootfs with a setuid file, a setgid dir, a fifo, a char device, a socket, a foreign
    owner, an xattr and a hard link."""
    root = base / "hostile"
    (root / "bin").mkdir(parents=True)
    (root / "bin/su").write_bytes(b"#!/bin/sh\n")
    os.chmod(root / "bin/su", 0o4755)
    (root / "shared").mkdir()
    os.chmod(root / "shared", 0o2775)
    (root / "shared/data").write_text("x")
    os.link(root / "shared/data", root / "shared/data-link")
    os.chown(root / "shared/data", 1234, 1234)
    os.setxattr(root / "shared/data", "user.paddock", b"secret")
    os.mkfifo(root / "fifo")
    (root / "dev").mkdir()
    os.mknod(root / "dev/null", 0o666 | stat.S_IFCHR, os.makedev(1, 3))
    with socket.socket(socket.AF_UNIX) as s:
        s.bind(str(root / "sock"))
    return root


@needs_root
def test_build_strips_setuid_setgid_devices_fifos_sockets_owners_and_xattrs(tmp_path):
    src = hostile_rootfs(tmp_path)
    sif = build.build_image(src, tmp_path / "h.sif", workdir=tmp_path)
    with mounted(sif, tmp_path / "mnt") as mnt:
        assert stat.S_IMODE((mnt / "bin/su").stat().st_mode) == 0o755
        assert stat.S_IMODE((mnt / "shared").stat().st_mode) == 0o775
        for gone in ("fifo", "dev/null", "sock"):
            assert not os.path.lexists(mnt / gone), gone
        data = (mnt / "shared/data").stat()
        assert (data.st_uid, data.st_gid) == (0, 0)
        assert data.st_nlink == 2, "hard link kept as a hard link"
        assert os.listxattr(mnt / "shared/data") == []
    assert stat.S_IMODE((src / "bin/su").stat().st_mode) == 0o4755, "source left untouched"
    assert read_sif(sif).metadata["source"] == "dir", "no path: digests are by content"


def _add(tf: tarfile.TarFile, name: str, kind=tarfile.REGTYPE, mode=0o644, data=b"",
         linkname="") -> None:
    ti = tarfile.TarInfo(name)
    ti.type, ti.mode, ti.size, ti.linkname = kind, mode, len(data), linkname
    tf.addfile(ti, io.BytesIO(data) if kind == tarfile.REGTYPE else None)


def test_tarball_build_strips_setuid_and_drops_device_nodes(tmp_path):
    tar = tmp_path / "root.tar.gz"
    with tarfile.open(tar, "w:gz") as tf:
        _add(tf, "bin", tarfile.DIRTYPE, 0o755)
        _add(tf, "bin/passwd", mode=0o6755, data=b"x")
        _add(tf, "tmp", tarfile.DIRTYPE, 0o1777)
        _add(tf, "dev", tarfile.DIRTYPE, 0o755)
        _add(tf, "dev/sda", tarfile.BLKTYPE, 0o660)
        _add(tf, "dev/tty", tarfile.CHRTYPE, 0o666)
        _add(tf, "etc/localtime", tarfile.SYMTYPE, linkname="/usr/share/zoneinfo/UTC")
    files = listing(build.build_image(tar, tmp_path / "t.sif", workdir=tmp_path))
    assert files["/bin/passwd"] == "-rwxr-xr-x 0/0"
    assert files["/tmp"] == "drwxrwxrwt 0/0"
    assert files["/etc/localtime"].startswith("lrwxrwxrwx")
    assert "/dev" in files and "/dev/sda" not in files and "/dev/tty" not in files


@pytest.mark.parametrize("members", [
    [("../escape", tarfile.REGTYPE, "")],
    [("/etc/../../escape", tarfile.REGTYPE, "")],
    [("link", tarfile.SYMTYPE, "/"), ("link/escape", tarfile.REGTYPE, "")],
], ids=["dotdot", "absolute-dotdot", "through-symlink"])
def test_tarball_members_escaping_the_rootfs_are_refused(tmp_path, members):
    tar = tmp_path / "evil.tar"
    with tarfile.open(tar, "w") as tf:
        for name, kind, link in members:
            _add(tf, name, kind, linkname=link)
    with pytest.raises(build.BuildError, match="unsafe tar member"):
        build.build_image(tar, tmp_path / "e.sif", workdir=tmp_path)
    assert not (tmp_path / "escape").exists()


def write_oci_layout(path: Path, layers: list[list[tuple]]) -> Path:
    """An OCI image layout whose layers (gzip tars) hold the given members."""
    from tests.layers.test_image_sources import oci_layout
    raws = []
    for members in layers:
        buf = io.BytesIO()
        with tarfile.open(fileobj=buf, mode="w") as tf:
            for name, kind, data in members:
                _add(tf, name, kind, 0o755 if kind == tarfile.DIRTYPE else 0o644, data)
        raws.append(buf.getvalue())
    return oci_layout(path, raws)


def test_oci_layout_layers_apply_in_order_with_whiteouts(tmp_path):
    D, F = tarfile.DIRTYPE, tarfile.REGTYPE
    layout = write_oci_layout(tmp_path / "oci", [
        [("a", D, b""), ("a/x", F, b"1"), ("a/y", F, b"1"), ("d", D, b""),
         ("d/old", F, b"1"), ("f", F, b"old")],
        [("a/.wh.x", F, b""), ("d/.wh..wh..opq", F, b""), ("d/new", F, b"2"),
         ("f", F, b"new")],
    ])
    sif = build.build_image(layout, tmp_path / "o.sif", workdir=tmp_path)
    files = listing(sif)
    assert {"/a/y", "/d/new", "/f"} <= set(files)
    assert not {"/a/x", "/d/old", "/a/.wh.x", "/d/.wh..wh..opq"} & set(files)
    assert read_sif(sif).metadata["source"].startswith("oci:sha256:")


def test_failed_command_carries_argv_exit_code_and_stderr(tmp_path):
    argv = ["mksquashfs", str(tmp_path / "missing"), str(tmp_path / "out.sqfs")]
    with pytest.raises(build.CommandFailed) as e:
        build.run_command(argv, timeout_s=60)
    assert e.value.argv == argv
    assert e.value.exit_code not in (0, None)
    assert "missing" in e.value.stderr
    assert "mksquashfs" in str(e.value)


def test_missing_program_is_a_command_failure_not_a_crash(tmp_path):
    with pytest.raises(build.CommandFailed, match="cannot start"):
        build.run_command(["/nonexistent/tool"], timeout_s=5)


@needs_root
def test_mounts_left_under_a_build_tree_are_detached_before_it_is_deleted(tmp_path):
    point = tmp_path / "root dir" / "proc"
    point.mkdir(parents=True)
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=1m", "tmpfs", str(point)], check=True)
    try:
        assert os.path.ismount(point)
        build.unmount_under(tmp_path / "root dir")
        assert not os.path.ismount(point)
    finally:
        if os.path.ismount(point):
            subprocess.run(["umount", "-l", str(point)])


def test_apt_mirror_reads_deb822_sources_skipping_security(tmp_path):
    d = tmp_path / "sources.list.d"
    d.mkdir()
    (d / "debian.sources").write_text(
        "Types: deb\nURIs: http://deb.example.org/debian-security\nSuites: x\n\n"
        "Types: deb\nURIs: http://deb.example.org/debian\nSuites: bookworm\n")
    assert build.apt_mirror(d, tmp_path / "none") == "http://deb.example.org/debian"
    legacy = tmp_path / "sources.list"
    legacy.write_text("# c\ndeb [arch=amd64] http://mirror.example/debian bookworm main\n")
    assert build.apt_mirror(tmp_path / "empty", legacy) == "http://mirror.example/debian"
    with pytest.raises(build.BuildError, match="no Debian mirror"):
        build.apt_mirror(tmp_path / "empty", tmp_path / "none")


# ------------------------------------------------------------------ store

def test_store_names_images_by_sha256_of_their_bytes_readable_by_everyone(tmp_path,
                                                                          busybox_sif):
    old_umask = os.umask(0o077)
    try:
        store = ImageStore(tmp_path / "a" / "store")
        digest, path = store.add(busybox_sif)
    finally:
        os.umask(old_umask)
    assert digest == f"sha256:{sha256(busybox_sif)}"
    assert path == tmp_path / "a/store/sha256" / f"{sha256(busybox_sif)}.sif"
    assert stat.S_IMODE(path.stat().st_mode) == 0o644
    for d in (tmp_path / "a", store.root, store.root / "sha256", store.root / "recipes"):
        assert stat.S_IMODE(d.stat().st_mode) == 0o755, d
    assert sorted(p.name for p in path.parent.iterdir()) == [path.name], "no temp files left"
    assert store.get(digest) == path == store.resolve(digest)
    assert store.digests() == [digest]


def test_resolve_accepts_a_digest_or_a_path_and_names_a_missing_digest(tmp_path, busybox_sif):
    store = ImageStore(tmp_path / "store")
    assert store.resolve(str(busybox_sif)) == busybox_sif
    missing = "sha256:" + "ab" * 32
    with pytest.raises(ImageNotFound, match=missing):
        store.get(missing)
    with pytest.raises(ImageNotFound, match=missing):
        store.resolve(missing)
    with pytest.raises(ImageNotFound, match="nowhere.sif"):
        store.resolve(tmp_path / "nowhere.sif")
    with pytest.raises(InvalidImageRef):
        store.get("sha256:xyz")


def test_building_the_same_recipe_twice_builds_once(tmp_path, busybox_sif):
    store = ImageStore(tmp_path / "store")
    calls = []

    def builder(out: Path) -> None:
        calls.append(out)
        shutil.copy(busybox_sif, out)

    first = store.build_or_reuse({"kind": "test", "n": 1}, builder)
    second = store.build_or_reuse({"n": 1, "kind": "test"}, builder)
    assert first == second and len(calls) == 1
    index = store.root / "recipes" / recipe_hash({"kind": "test", "n": 1})
    assert index.read_text().strip() == first[0]
    store.build_or_reuse({"kind": "test", "n": 2}, builder)
    assert len(calls) == 2


def test_a_failed_build_stores_nothing_and_the_next_attempt_builds(tmp_path, busybox_sif):
    store = ImageStore(tmp_path / "store")

    def broken(out: Path) -> None:
        out.write_bytes(b"partial")
        raise build.BuildError("boom")

    with pytest.raises(build.BuildError, match="boom"):
        store.build_or_reuse({"kind": "test"}, broken)
    assert store.digests() == [] and store.lookup_recipe({"kind": "test"}) is None
    assert list((store.root / "tmp").iterdir()) == []
    digest, _ = store.build_or_reuse({"kind": "test"},
                                     lambda out: shutil.copy(busybox_sif, out))
    assert store.digests() == [digest]


def test_an_index_entry_whose_image_vanished_is_rebuilt(tmp_path, busybox_sif):
    store = ImageStore(tmp_path / "store")
    calls = []

    def builder(out):
        calls.append(1)
        shutil.copy(busybox_sif, out)

    digest, path = store.build_or_reuse({"kind": "test"}, builder)
    path.unlink()
    assert store.build_or_reuse({"kind": "test"}, builder) == (digest, path)
    assert len(calls) == 2 and path.is_file()


def _concurrent_builder(root, name, log, sif, building, waiting, results, hold_for_waiter):
    store = ImageStore(root)
    seen = []

    def builder(out: Path) -> None:
        with open(log, "a") as f:
            f.write(name + "\n")
        building.set()
        if hold_for_waiter and not waiting.wait(DEADLINE_S):
            raise RuntimeError("the second builder never waited on the recipe lock")
        shutil.copy(sif, out)

    def progress(msg: str) -> None:
        seen.append(msg)
        if msg.startswith("waiting for another builder"):
            waiting.set()

    digest, _ = store.build_or_reuse({"kind": "concurrent"}, builder, progress)
    results.put((name, digest, seen))


def test_two_concurrent_builders_of_one_recipe_build_once(tmp_path, busybox_sif):
    ctx = multiprocessing.get_context("fork")
    building, waiting, results = ctx.Event(), ctx.Event(), ctx.Queue()
    log = tmp_path / "builds.log"
    root = tmp_path / "store"
    common = (root, log, busybox_sif, building, waiting, results)
    a = ctx.Process(target=_concurrent_builder, args=(common[0], "A", *common[1:], True))
    a.start()
    assert building.wait(DEADLINE_S), "first builder never started building"
    b = ctx.Process(target=_concurrent_builder, args=(common[0], "B", *common[1:], False))
    b.start()
    out = {name: (digest, seen) for name, digest, seen in
           (results.get(timeout=DEADLINE_S) for _ in range(2))}
    a.join(DEADLINE_S)
    b.join(DEADLINE_S)
    assert (a.exitcode, b.exitcode) == (0, 0)
    assert log.read_text() == "A\n", "only the first builder built"
    assert out["A"][0] == out["B"][0]
    assert any("built concurrently" in m for m in out["B"][1])
    assert ImageStore(root).digests() == [out["A"][0]]


# ------------------------------------------------------------------ built-in images

def test_default_store_root_comes_from_the_environment(monkeypatch):
    monkeypatch.delenv("PADDOCK_IMAGE_STORE", raising=False)
    assert default_store_root() == Path("/var/tmp/paddock/images")
    monkeypatch.setenv("PADDOCK_IMAGE_STORE", "/srv/images")
    assert default_store_root() == Path("/srv/images")


def test_busybox_image_is_built_once_and_reused(tmp_path):
    store = ImageStore(tmp_path / "store")
    first = ensure_busybox_image(store)
    messages = []
    assert ensure_busybox_image(store, progress=messages.append) == first
    assert messages and messages[0].startswith("reusing")
    assert read_sif(first[1]).metadata["recipe"]["kind"] == "busybox"


def test_python_image_recipe_is_bookworm_minbase_with_python3_and_pytest():
    recipe = python_image_recipe()
    assert (recipe["suite"], recipe["variant"]) == ("bookworm", "minbase")
    assert recipe["packages"] == ["python3", "python3-pytest"]


@pytest.mark.slow
@needs_root
def test_builtin_python_image_runs_python_with_pytest(tmp_path):
    store = ImageStore(os.environ.get("PADDOCK_TEST_IMAGE_STORE", tmp_path / "store"))
    digest, sif = ensure_builtin_image(store)
    assert digest == f"sha256:{sha256(sif)}"
    assert stat.S_IMODE(sif.stat().st_mode) == 0o644
    with mounted(sif, tmp_path / "mnt") as mnt:
        assert stat.S_IMODE((mnt / "tmp").stat().st_mode) == 0o1777
        assert (mnt / "work").is_dir()
        assert not list((mnt / "usr/share/doc").iterdir())
        r = subprocess.run(["chroot", str(mnt), "python3", "-c",
                            "import pytest, sys; print(pytest.__version__, sys.version_info[0])"],
                           capture_output=True, text=True, timeout=60)
        assert r.returncode == 0, r.stderr
        assert r.stdout.split()[1] == "3"
    assert ensure_builtin_image(store) == (digest, sif)


# ------------------------------------------------------------------ CLI

def run_cli(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="paddock")
    cli.register(parser.add_subparsers(dest="cmd", required=True))
    args = parser.parse_args(argv)
    return args.func(args)


def test_cli_inspect_prints_header_descriptors_and_digest(busybox_sif, capsys):
    assert run_cli(["image", "inspect", str(busybox_sif)]) == 0
    out = capsys.readouterr().out
    assert f"sha256:{sha256(busybox_sif)}" in out
    assert "offset 32768" in out
    assert "Squashfs PrimSys amd64" in out and "paddock.json" in out


@pytest.mark.parametrize("content,message", [
    (b"\x7fELF" + b"\0" * 200, "is not a SIF file"),
    (None, "not squashfs"),
], ids=["foreign", "corrupt"])
def test_cli_inspect_of_a_bad_file_is_one_line_and_exit_2(tmp_path, busybox_sif, capsys,
                                                           content, message):
    bad = tmp_path / "bad.sif"
    if content is None:
        raw = bytearray(busybox_sif.read_bytes())
        raw[32768:32772] = b"XXXX"
        content = bytes(raw)
    bad.write_bytes(content)
    assert run_cli(["image", "inspect", str(bad)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and message in err and err.startswith("error: ")


def test_cli_build_from_a_directory_writes_a_sif_and_prints_its_digest(tmp_path, capsys):
    src = tmp_path / "root"
    (src / "etc").mkdir(parents=True)
    (src / "etc/hostname").write_text("paddock\n")
    out = tmp_path / "img.sif"
    assert run_cli(["image", "build", str(src), "-o", str(out)]) == 0
    assert f"sha256:{sha256(out)}" in capsys.readouterr().out
    assert "/etc/hostname" in listing(out)


def test_cli_build_of_a_missing_source_is_one_line_and_exit_2(tmp_path, capsys):
    assert run_cli(["image", "build", str(tmp_path / "nope"), "-o",
                    str(tmp_path / "x.sif")]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "does not exist" in err


def test_debian_source_syntax():
    assert cli.parse_debian_src("debian:bookworm") == ("bookworm", [])
    assert cli.parse_debian_src("debian:bookworm:python3,git") == ("bookworm",
                                                                   ["python3", "git"])
    assert cli.parse_debian_src("/some/dir") is None
    with pytest.raises(build.BuildError):
        cli.parse_debian_src("debian:")
