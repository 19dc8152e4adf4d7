"""Specification of image sources: every accepted format builds the same image from the same
content (reproducible digests), the architecture is read from the rootfs and checked at use,
bad input gets a clear error, and concurrent builders of one source build it once.

Real mksquashfs, zstd, unsquashfs and processes; tiny rootfs trees from busybox-static."""

from __future__ import annotations

import hashlib
import io
import json
import os
import shutil
import struct
import subprocess
import sys
import tarfile
from pathlib import Path

import pytest

from controller.cli import image as cli
from layers import build
from layers.sif import (
    ArchMismatchError,
    CorruptSifError,
    NotSifError,
    NotSquashfsError,
    check_arch,
    host_arch,
    read_sif,
)
from layers.staging import detect_arch, elf_arch
from layers.store import ImageStore

BUSYBOX = Path("/bin/busybox")
DEADLINE_S = 60.0
ROOT = Path(__file__).resolve().parents[2]


def sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


@pytest.fixture(autouse=True)
def _no_epoch(monkeypatch):
    monkeypatch.delenv("SOURCE_DATE_EPOCH", raising=False)


def tiny_rootfs(base: Path, name: str = "root") -> Path:
    """busybox + /bin/sh link + a merged-usr style /usr/bin -> /bin link + a few files."""
    root = base / name
    for d in ("bin", "etc", "work", "tmp", "usr"):
        (root / d).mkdir(parents=True)
    shutil.copy2(BUSYBOX, root / "bin/busybox")
    (root / "bin/sh").symlink_to("busybox")
    (root / "usr/bin").symlink_to("/bin")
    (root / "etc/passwd").write_text("root:x:0:0:root:/root:/bin/sh\n")
    (root / "etc/motd").write_text("hello\n")
    os.chmod(root / "tmp", 0o1777)
    for p in [root / "etc/passwd", root / "etc/motd"]:
        os.utime(p, (1_600_000_000, 1_600_000_000))
    return root


def tar_of(root: Path, out: Path, mode: str) -> Path:
    with tarfile.open(out, mode) as tf:
        tf.add(root, arcname=".")
    return out


def files_of(sif: Path) -> dict[str, str]:
    """path -> 'mode owner mtime' from unsquashfs (times in UTC)."""
    offset = read_sif(sif).primary_partition_offset
    out = subprocess.run(["unsquashfs", "-lln", "-UTC", "-o", str(offset), str(sif)],
                         check=True, capture_output=True, text=True).stdout
    result = {}
    for line in out.splitlines():
        parts = line.split(None, 5)
        if len(parts) == 6 and parts[5].startswith("squashfs-root"):
            name = parts[5].split(" -> ")[0].removeprefix("squashfs-root") or "/"
            result[name] = f"{parts[0]} {parts[1]} {parts[3]} {parts[4]}"
    return result


# ------------------------------------------------------------------ reproducible digests

def test_rebuilding_a_directory_gives_the_same_digest_wherever_it_lives(tmp_path):
    a = tiny_rootfs(tmp_path)
    first = build.build_image(a, tmp_path / "1.sif", workdir=tmp_path)
    again = build.build_image(a, tmp_path / "2.sif", workdir=tmp_path)
    moved = tmp_path / "elsewhere with spaces;"
    subprocess.run(["cp", "-a", str(a), str(moved)], check=True)
    third = build.build_image(moved, tmp_path / "3.sif", workdir=tmp_path)
    assert sha256(first) == sha256(again) == sha256(third)
    assert read_sif(first).id == read_sif(third).id != "00000000-0000-0000-0000-000000000000"


def test_changed_content_changes_the_digest(tmp_path):
    a = tiny_rootfs(tmp_path)
    first = build.build_image(a, tmp_path / "1.sif", workdir=tmp_path)
    (a / "etc/motd").write_text("changed\n")
    os.utime(a / "etc/motd", (1_600_000_000, 1_600_000_000))
    assert sha256(build.build_image(a, tmp_path / "2.sif", workdir=tmp_path)) != sha256(first)


def test_plain_gzip_and_zstd_tarballs_of_one_tree_give_one_digest(tmp_path):
    root = tiny_rootfs(tmp_path)
    plain = tar_of(root, tmp_path / "r.tar", "w")
    gz = tar_of(root, tmp_path / "r.tar.gz", "w:gz")
    zst = tmp_path / "r.tar.zst"
    subprocess.run(["zstd", "-q", "-o", str(zst), str(plain)], check=True)
    digests = {sha256(build.build_image(src, tmp_path / f"{src.name}.sif", workdir=tmp_path))
               for src in (plain, gz, zst)}
    assert len(digests) == 1
    rebuilt = build.build_image(gz, tmp_path / "again.sif", workdir=tmp_path)
    assert {sha256(rebuilt)} == digests
    files = files_of(rebuilt)
    assert files["/etc/motd"].endswith("2020-09-13 12:26"), "file mtime from the source"
    assert files["/bin/sh"].startswith("lrwxrwxrwx 0/0")


def test_directories_a_tarball_does_not_list_get_the_epoch_and_0755_whatever_the_umask(
        tmp_path):
    tar = tmp_path / "implicit.tar"
    with tarfile.open(tar, "w") as tf:
        ti = tarfile.TarInfo("deep/er/file")
        ti.size, ti.mtime = 1, 1_600_000_000
        tf.addfile(ti, io.BytesIO(b"x"))
    digests = set()
    for umask in (0o022, 0o077):
        old = os.umask(umask)
        try:
            sif = build.build_image(tar, tmp_path / f"i{umask:o}.sif", workdir=tmp_path)
        finally:
            os.umask(old)
        files = files_of(sif)
        assert files["/deep"] == "drwxr-xr-x 0/0 1970-01-01 00:00"
        assert files["/deep/er"] == "drwxr-xr-x 0/0 1970-01-01 00:00"
        assert files["/"].startswith("drwxr-xr-x")
        digests.add(sha256(sif))
    assert len(digests) == 1


def test_source_date_epoch_clamps_every_time_and_the_sif_header(tmp_path, monkeypatch):
    root = tiny_rootfs(tmp_path)
    os.utime(root / "etc/motd", (2_000_000_000, 2_000_000_000))
    monkeypatch.setenv("SOURCE_DATE_EPOCH", "1000000000")
    sif = build.build_image(root, tmp_path / "e.sif", workdir=tmp_path)
    files = files_of(sif)
    assert files["/etc/motd"].endswith("2001-09-09 01:46"), "newer than the epoch: clamped"
    assert files["/etc/passwd"].endswith("2001-09-09 01:46")
    assert read_sif(sif).created_at == 1_000_000_000
    assert (root / "etc/motd").stat().st_mtime == 2_000_000_000, "source untouched"


def test_a_bad_source_date_epoch_is_named(tmp_path, monkeypatch):
    monkeypatch.setenv("SOURCE_DATE_EPOCH", "yesterday")
    with pytest.raises(ValueError, match="SOURCE_DATE_EPOCH='yesterday'"):
        build.build_image(tiny_rootfs(tmp_path), tmp_path / "x.sif", workdir=tmp_path)


# ------------------------------------------------------------------ OCI layouts

def oci_layout(path: Path, layers: list[bytes], index_extra: dict | None = None,
               compress: str = "gzip") -> Path:
    """An OCI image layout from raw tar bytes per layer (gzip- or zstd-compressed)."""
    blobs = path / "blobs/sha256"
    blobs.mkdir(parents=True)

    def blob(data: bytes) -> str:
        h = hashlib.sha256(data).hexdigest()
        (blobs / h).write_bytes(data)
        return f"sha256:{h}"

    descs = []
    for raw in layers:
        if compress == "zstd":
            data = subprocess.run(["zstd", "-q", "-c"], input=raw, capture_output=True,
                                  check=True).stdout
        else:
            buf = io.BytesIO()
            with tarfile.open(fileobj=buf, mode="w:gz") as tf:
                for m in tarfile.open(fileobj=io.BytesIO(raw)):
                    tf.addfile(m, tarfile.open(fileobj=io.BytesIO(raw)).extractfile(m.name)
                               if m.isfile() else None)
            data = buf.getvalue()
        descs.append({"mediaType": f"application/vnd.oci.image.layer.v1.tar+{compress}",
                      "digest": blob(data), "size": len(data)})
    manifest = json.dumps({"schemaVersion": 2, "config": {"digest": blob(b"{}"), "size": 2},
                           "layers": descs}).encode()
    entry = {"mediaType": "application/vnd.oci.image.manifest.v1+json",
             "digest": blob(manifest), "size": len(manifest), **(index_extra or {})}
    (path / "index.json").write_text(json.dumps({"schemaVersion": 2, "manifests": [entry]}))
    (path / "oci-layout").write_text('{"imageLayoutVersion": "1.0.0"}')
    return path


def layer(*members: tuple[str, str, bytes]) -> bytes:
    """A tar of (name, kind 'f'|'d'|'l', data-or-link-target) members, mtime 1_500_000_000."""
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as tf:
        for name, kind, data in members:
            ti = tarfile.TarInfo(name)
            ti.mtime = 1_500_000_000
            if kind == "d":
                ti.type, ti.mode = tarfile.DIRTYPE, 0o755
                tf.addfile(ti)
            elif kind == "l":
                ti.type, ti.linkname = tarfile.SYMTYPE, data.decode()
                tf.addfile(ti)
            else:
                ti.size, ti.mode = len(data), 0o644
                tf.addfile(ti, io.BytesIO(data))
    return buf.getvalue()


def test_oci_zstd_layers_apply_in_order_with_whiteouts_and_opaque_dirs(tmp_path):
    base = layer(("etc", "d", b""), ("etc/keep", "f", b"1"), ("etc/gone", "f", b"1"),
                 ("opt", "d", b""), ("opt/a", "f", b"1"), ("opt/sub", "d", b""),
                 ("opt/sub/b", "f", b"1"), ("link", "l", b"/etc/keep"))
    top = layer(("etc/.wh.gone", "f", b""), ("opt/.wh..wh..opq", "f", b""),
                ("opt/new", "f", b"2"), ("link", "f", b"now a file"))
    layout = oci_layout(tmp_path / "oci", [base, top], compress="zstd")
    sif = build.build_image(layout, tmp_path / "o.sif", workdir=tmp_path)
    files = files_of(sif)
    assert {"/etc/keep", "/opt/new", "/link"} <= set(files)
    assert not {"/etc/gone", "/opt/a", "/opt/sub", "/opt/sub/b"} & set(files)
    assert not [f for f in files if ".wh." in f], "whiteout markers never enter the image"
    assert files["/link"].startswith("-rw-r--r--"), "a later layer replaced the symlink"
    again = build.build_image(layout, tmp_path / "o2.sif", workdir=tmp_path)
    assert sha256(again) == sha256(sif)


def test_oci_index_for_several_platforms_picks_this_hosts(tmp_path):
    layout = oci_layout(tmp_path / "oci", [layer(("mine", "f", b"x"))],
                        {"platform": {"architecture": host_arch(), "os": "linux"}})
    index = json.loads((layout / "index.json").read_text())
    other = oci_layout(tmp_path / "other", [layer(("theirs", "f", b"y"))])
    other_manifest = json.loads((other / "index.json").read_text())["manifests"][0]
    for p in (other / "blobs/sha256").iterdir():
        shutil.copy(p, layout / "blobs/sha256" / p.name)
    index["manifests"].insert(0, {**other_manifest, "platform": {"architecture": "s390x"}})
    (layout / "index.json").write_text(json.dumps(index))
    files = files_of(build.build_image(layout, tmp_path / "p.sif", workdir=tmp_path))
    assert "/mine" in files and "/theirs" not in files


def test_an_oci_blob_whose_bytes_do_not_match_its_digest_is_refused(tmp_path):
    layout = oci_layout(tmp_path / "oci", [layer(("a", "f", b"x"))])
    manifest = json.loads((layout / "index.json").read_text())["manifests"][0]["digest"]
    layer_digest = json.loads((layout / "blobs/sha256" / manifest.split(":")[1])
                              .read_text())["layers"][0]["digest"]
    blob = layout / "blobs/sha256" / layer_digest.split(":")[1]
    blob.write_bytes(blob.read_bytes()[:-3] + b"xyz")
    with pytest.raises(build.BuildError, match=f"blob {layer_digest} is corrupt"):
        build.build_image(layout, tmp_path / "x.sif", workdir=tmp_path)


def test_an_oci_layout_missing_a_blob_names_it(tmp_path):
    layout = oci_layout(tmp_path / "oci", [layer(("a", "f", b"x"))])
    manifest = json.loads((layout / "index.json").read_text())["manifests"][0]["digest"]
    (layout / "blobs/sha256" / manifest.split(":")[1]).unlink()
    with pytest.raises(build.BuildError, match=f"missing blob {manifest}"):
        build.build_image(layout, tmp_path / "x.sif", workdir=tmp_path)


def test_a_file_that_is_not_a_tarball_is_named(tmp_path):
    junk = tmp_path / "rootfs.tar.gz"
    junk.write_bytes(b"this is not an archive at all" * 100)
    with pytest.raises(build.BuildError, match="rootfs.tar.gz is not a tar archive"):
        build.build_image(junk, tmp_path / "x.sif", workdir=tmp_path)
    assert not (tmp_path / "x.sif").exists()


# ------------------------------------------------------------------ architecture

def fake_elf(machine: int, is64: bool = True, little: bool = True) -> bytes:
    order = "<" if little else ">"
    return (b"\x7fELF" + bytes([2 if is64 else 1, 1 if little else 2, 1]) + bytes(9)
            + struct.pack(order + "HH", 2, machine) + bytes(64))


@pytest.mark.parametrize("machine,is64,little,arch", [
    (62, True, True, "amd64"), (183, True, True, "arm64"), (3, False, True, "386"),
    (21, True, True, "ppc64le"), (21, True, False, "ppc64"), (8, False, False, "mips"),
    (243, True, True, "riscv64"), (22, True, False, "s390x"), (9999, True, True, None),
])
def test_elf_header_names_the_architecture(tmp_path, machine, is64, little, arch):
    f = tmp_path / "bin"
    f.write_bytes(fake_elf(machine, is64, little))
    assert elf_arch(f) == arch


def test_arch_is_read_through_absolute_symlinks_inside_the_rootfs_not_the_host(tmp_path):
    root = tmp_path / "root"
    (root / "usr/lib/arm").mkdir(parents=True)
    (root / "usr/lib/arm/dash").write_bytes(fake_elf(183))
    (root / "bin").symlink_to("usr/bin")
    (root / "usr/bin").mkdir()
    (root / "usr/bin/sh").symlink_to("/usr/lib/arm/../arm/dash")
    assert detect_arch(root) == "arm64"
    (root / "usr/bin/sh").unlink()
    (root / "usr/bin/sh").symlink_to("/bin/sh")          # a loop inside the tree
    assert detect_arch(root) == "unknown"


def test_an_image_for_another_arch_is_refused_naming_both(tmp_path, capsys):
    root = tmp_path / "root"
    (root / "bin").mkdir(parents=True)
    (root / "bin/sh").write_bytes(fake_elf(183))
    sif = build.build_image(root, tmp_path / "arm.sif", workdir=tmp_path)
    info = read_sif(sif)
    assert info.arch == "arm64" and info.descriptors[0].partition_fields()[2] == "arm64"
    with pytest.raises(ArchMismatchError, match="built for arm64, but this host is amd64"):
        check_arch(sif, host="amd64")
    assert check_arch(sif, host="arm64") == "arm64"
    assert run_cli(["image", "inspect", str(sif)]) == 0
    out = capsys.readouterr().out
    assert "Squashfs PrimSys arm64" in out
    if host_arch() != "arm64":
        assert f"cannot run on this host ({host_arch()}): built for arm64" in out


def test_the_host_runs_its_own_images_and_ones_of_unknown_arch(tmp_path):
    sif = build.build_image(tiny_rootfs(tmp_path), tmp_path / "bb.sif", workdir=tmp_path)
    assert read_sif(sif).arch == host_arch() == check_arch(sif)
    scripts = tmp_path / "scripts"
    (scripts / "bin").mkdir(parents=True)
    (scripts / "bin/sh").write_text("#!/nowhere\n")
    plain = build.build_image(scripts, tmp_path / "s.sif", workdir=tmp_path)
    assert check_arch(plain, host="riscv64") == "unknown"
    forced = build.build_image(scripts, tmp_path / "f.sif", workdir=tmp_path, arch="arm64")
    with pytest.raises(ArchMismatchError):
        check_arch(forced, host="amd64")
    with pytest.raises(build.BuildError, match="unknown architecture 'z80'"):
        build.build_image(scripts, tmp_path / "z.sif", workdir=tmp_path, arch="z80")


# ------------------------------------------------------------------ inspect: distinct errors

def run_cli(argv: list[str]) -> int:
    import argparse
    parser = argparse.ArgumentParser(prog="paddock")
    cli.register(parser.add_subparsers(dest="cmd", required=True))
    args = parser.parse_args(argv)
    return args.func(args)


def test_foreign_truncated_and_non_squashfs_files_get_three_distinct_errors(tmp_path, capsys):
    good = build.build_image(tiny_rootfs(tmp_path), tmp_path / "g.sif", workdir=tmp_path)
    raw = good.read_bytes()
    foreign = tmp_path / "foreign.sif"
    foreign.write_bytes(BUSYBOX.read_bytes()[:200_000])
    truncated = tmp_path / "truncated.sif"
    truncated.write_bytes(raw[:len(raw) // 2])
    ext3 = tmp_path / "ext3.sif"
    patched = bytearray(raw)
    struct.pack_into("<i", patched, 4096 + 201, 2)            # Fstype 2 = Ext3
    ext3.write_bytes(bytes(patched))
    expected = {foreign: (NotSifError, "is not a SIF file"),
                truncated: (CorruptSifError, "truncated"),
                ext3: (NotSquashfsError, "primary partition is Ext3, not squashfs")}
    errors = []
    for path, (kind, message) in expected.items():
        with pytest.raises(kind, match=message) as e:
            read_sif(path)
        assert type(e.value) is kind
        assert run_cli(["image", "inspect", str(path)]) == 2
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and message in err and path.name in err
        errors.append(err)
    assert len(set(errors)) == 3


# ------------------------------------------------------------------ the store, concurrently

def test_three_processes_building_one_source_into_a_store_build_it_once(tmp_path):
    src = tar_of(tiny_rootfs(tmp_path), tmp_path / "root.tar.gz", "w:gz")
    store = tmp_path / "store"
    argv = [sys.executable, "-m", "controller.cli.image", "image", "build", str(src), "--store",
            str(store), "--verbose"]
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    procs = [subprocess.Popen(argv + (["-o", str(tmp_path / f"out{i}.sif")] if i == 0 else []),
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                              cwd=ROOT, env=env) for i in range(3)]
    outs = [p.communicate(timeout=DEADLINE_S) for p in procs]
    assert [p.returncode for p in procs] == [0, 0, 0], outs
    digests = {out.split()[-1] for out, _ in outs}
    assert len(digests) == 1
    digest = digests.pop()
    steps = "".join(err for _, err in outs)
    assert steps.count("building recipe") == 1, steps
    assert steps.count("mksquashfs") == 1, steps
    assert steps.count("reusing sha256:") == 2, steps
    images = ImageStore(store).digests()
    assert images == [digest], "one image, stored under its own sha256"
    assert sha256(ImageStore(store).get(digest)) == digest.split(":")[1]
    assert sha256(tmp_path / "out0.sif") == digest.split(":")[1]
    assert sorted(p.name for p in (store / "tmp").iterdir()) == [], "no partial files left"
    again = subprocess.run(argv, capture_output=True, text=True, cwd=ROOT, env=env,
                           timeout=DEADLINE_S)
    assert again.returncode == 0 and again.stdout.split()[-1] == digest


def test_a_store_build_of_a_missing_source_is_one_line(tmp_path, capsys):
    assert run_cli(["image", "build", str(tmp_path / "nope"), "--store",
                    str(tmp_path / "s")]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "does not exist" in err
    assert run_cli(["image", "build", str(tmp_path)]) == 2
    assert "give -o OUT, --store DIR, or both" in capsys.readouterr().err


def test_the_native_sandbox_refuses_a_foreign_arch_image_before_mounting_it(tmp_path):
    from nodeagent.sandbox.runtime import image_partition
    root = tmp_path / "root"
    (root / "bin").mkdir(parents=True)
    foreign = "s390x" if host_arch() != "s390x" else "amd64"
    machine = {"s390x": (22, True, False), "amd64": (62, True, True)}[foreign]
    (root / "bin/sh").write_bytes(fake_elf(*machine))
    sif = build.build_image(root, tmp_path / "foreign.sif", workdir=tmp_path)
    with pytest.raises(ArchMismatchError, match=f"built for {foreign}, but this host is "
                                                f"{host_arch()}"):
        image_partition(sif)
    native = build.build_image(tiny_rootfs(tmp_path, "native"), tmp_path / "native.sif",
                               workdir=tmp_path)
    assert image_partition(native)[1] == 32768


def test_the_busybox_builtin_image_is_reproducible(tmp_path):
    a = build.build_busybox(tmp_path / "a.sif", workdir=tmp_path)
    b = build.build_busybox(tmp_path / "b.sif", workdir=tmp_path)
    assert sha256(a) == sha256(b)
    assert files_of(a)["/bin/sh"].endswith("1970-01-01 00:00")
