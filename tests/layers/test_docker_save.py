"""Specification of image archives: what `docker save` writes (the classic `manifest.json` +
`<id>/layer.tar` form and the OCI-layout-in-a-tarball form of Docker 25+) builds, through
`paddock image build`, into a SIF whose /bin/sh runs in a real sandbox; a tarball that is a
root filesystem stays one; a corrupt layer is named.

No Docker daemon: the archives are written the way `docker save` writes them, from a small
busybox rootfs in two layers (the second deletes a file of the first with a whiteout)."""
from __future__ import annotations

import argparse
import gzip
import hashlib
import io
import json
import os
import shutil
import tarfile
from pathlib import Path

import pytest

from controller.cli import image as cli
from layers import archives, build
from nodeagent.sandbox.runtime import SandboxSpec

BUSYBOX = Path("/bin/busybox")


def _tar_bytes(members: list[tuple[str, str, bytes, int]]) -> bytes:
    """A layer tar of (name, kind 'f'|'d'|'l', data or link target, mode)."""
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=tarfile.USTAR_FORMAT) as tf:
        for name, kind, data, mode in members:
            ti = tarfile.TarInfo(name)
            ti.mtime, ti.mode = 1_500_000_000, mode
            if kind == "d":
                ti.type = tarfile.DIRTYPE
                tf.addfile(ti)
            elif kind == "l":
                ti.type, ti.linkname = tarfile.SYMTYPE, data.decode()
                tf.addfile(ti)
            else:
                ti.size = len(data)
                tf.addfile(ti, io.BytesIO(data))
    return buf.getvalue()


def busybox_layers() -> list[bytes]:
    base = [("bin", "d", b"", 0o755), ("bin/busybox", "f", BUSYBOX.read_bytes(), 0o755),
            ("etc", "d", b"", 0o755), ("etc/passwd", "f", b"root:x:0:0:root:/root:/bin/sh\n", 0o644),
            ("etc/old", "f", b"deleted by the next layer\n", 0o644),
            ("tmp", "d", b"", 0o1777), ("work", "d", b"", 0o755)]
    base += [(f"bin/{a}", "l", b"busybox", 0o777) for a in ("sh", "echo", "cat", "ls")]
    top = [("etc", "d", b"", 0o755), ("etc/.wh.old", "f", b"", 0o644),
           ("etc/motd", "f", b"from layer two\n", 0o644)]
    return [_tar_bytes(base), _tar_bytes(top)]


def _sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def _add(tf: tarfile.TarFile, name: str, data: bytes) -> None:
    ti = tarfile.TarInfo(name)
    ti.size, ti.mode, ti.mtime = len(data), 0o644, 1_500_000_000
    tf.addfile(ti, io.BytesIO(data))


def docker_save_classic(out: Path, layers: list[bytes]) -> Path:
    """`docker save` before Docker 25: <id>/layer.tar, <config>.json, manifest.json, repositories."""
    config = json.dumps({"architecture": "amd64", "os": "linux", "config": {"Cmd": ["sh"]},
                         "rootfs": {"type": "layers", "diff_ids": [f"sha256:{_sha(x)}" for x in layers]}}).encode()
    ids = [_sha(x + str(i).encode()) for i, x in enumerate(layers)]
    with tarfile.open(out, "w") as tf:
        for lid, data in zip(ids, layers):
            _add(tf, f"{lid}/VERSION", b"1.0")
            _add(tf, f"{lid}/json", json.dumps({"id": lid}).encode())
            _add(tf, f"{lid}/layer.tar", data)
        _add(tf, f"{_sha(config)}.json", config)
        _add(tf, "manifest.json", json.dumps([{"Config": f"{_sha(config)}.json", "RepoTags": ["bb:latest"],
                                               "Layers": [f"{lid}/layer.tar" for lid in ids]}]).encode())
        _add(tf, "repositories", json.dumps({"bb": {"latest": ids[-1]}}).encode())
    return out


def docker_save_oci(out: Path, layers: list[bytes]) -> Path:
    """`docker save` from Docker 25: an OCI layout (oci-layout, index.json, blobs/sha256/...)
    plus a manifest.json naming the same blobs."""
    config = json.dumps({"architecture": "amd64", "os": "linux",
                         "rootfs": {"type": "layers", "diff_ids": [f"sha256:{_sha(x)}" for x in layers]}}).encode()
    manifest = json.dumps({"schemaVersion": 2, "mediaType": "application/vnd.oci.image.manifest.v1+json",
                           "config": {"mediaType": "application/vnd.oci.image.config.v1+json",
                                      "digest": f"sha256:{_sha(config)}", "size": len(config)},
                           "layers": [{"mediaType": "application/vnd.oci.image.layer.v1.tar",
                                       "digest": f"sha256:{_sha(x)}", "size": len(x)} for x in layers]}).encode()
    index = json.dumps({"schemaVersion": 2, "manifests": [
        {"mediaType": "application/vnd.oci.image.manifest.v1+json", "digest": f"sha256:{_sha(manifest)}",
         "size": len(manifest), "annotations": {"io.containerd.image.name": "docker.io/library/bb:latest"}}]}).encode()
    with tarfile.open(out, "w") as tf:
        for blob in (*layers, config, manifest):
            _add(tf, f"blobs/sha256/{_sha(blob)}", blob)
        _add(tf, "index.json", index)
        _add(tf, "oci-layout", b'{"imageLayoutVersion": "1.0.0"}')
        _add(tf, "manifest.json", json.dumps([{"Config": f"blobs/sha256/{_sha(config)}", "RepoTags": ["bb:latest"],
                                               "Layers": [f"blobs/sha256/{_sha(x)}" for x in layers]}]).encode())
    return out


def run_cli(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="paddock")
    cli.register(parser.add_subparsers(dest="cmd", required=True))
    args = parser.parse_args(argv)
    return args.func(args)


@pytest.fixture()
def scratch():
    base = Path(os.path.realpath("/tmp")) / f"paddock-dsave-{os.getpid()}"   # reachable by subuids
    base.mkdir(mode=0o755)
    os.chmod(base, 0o755)
    yield base
    shutil.rmtree(base, ignore_errors=True)


@pytest.mark.parametrize("writer, kind", [(docker_save_classic, archives.DOCKER_ARCHIVE),
                                          (docker_save_oci, archives.OCI_ARCHIVE)])
def test_a_docker_save_archive_builds_an_image_whose_shell_runs(scratch, runtime, writer, kind):
    archive = writer(scratch / "bb.tar", busybox_layers())
    assert build.source_kind(archive) == kind
    out = scratch / "bb.sif"
    assert run_cli(["image", "build", str(archive), "-o", str(out)]) == 0
    os.chmod(out, 0o644)
    with runtime.create(SandboxSpec(image=out)) as sb:
        r = sb.exec(["/bin/sh", "-c", "echo ok"])
        assert (r.exit_code, r.stdout) == (0, b"ok\n"), r.stderr
        assert sb.exec(["cat", "/etc/motd"]).stdout == b"from layer two\n"
        assert sb.exec(["/bin/sh", "-c", "test -e /etc/old || echo gone"]).stdout == b"gone\n"
        assert sb.exec(["ls", "/"]).stdout.split().count(b"manifest.json") == 0


def test_a_docker_archive_gzipped_builds_the_same_image(scratch):
    plain = docker_save_classic(scratch / "bb.tar", busybox_layers())
    gz = scratch / "bb.tar.gz"
    gz.write_bytes(gzip.compress(plain.read_bytes(), mtime=0))
    assert build.source_kind(gz) == archives.DOCKER_ARCHIVE
    a = build.build_image(plain, scratch / "a.sif", workdir=scratch)
    b = build.build_image(gz, scratch / "b.sif", workdir=scratch)
    assert hashlib.sha256(a.read_bytes()).digest() == hashlib.sha256(b.read_bytes()).digest()


def test_a_rootfs_tarball_is_still_a_rootfs(scratch):
    root = scratch / "root"
    (root / "bin").mkdir(parents=True)
    shutil.copy(BUSYBOX, root / "bin/busybox")
    with tarfile.open(scratch / "root.tar", "w") as tf:
        tf.add(root, arcname=".")
    assert build.source_kind(scratch / "root.tar") == "tar"


def test_a_docker_archive_layer_that_does_not_match_its_diff_id_is_named(scratch):
    layers = busybox_layers()
    archive = docker_save_classic(scratch / "bb.tar", layers)
    tampered = scratch / "bad.tar"
    with tarfile.open(archive) as src, tarfile.open(tampered, "w") as dst:
        for m in src:
            data = src.extractfile(m).read() if m.isfile() else None
            if m.name.endswith("layer.tar") and data == layers[1]:
                data = _tar_bytes([("etc", "d", b"", 0o755), ("etc/evil", "f", b"x", 0o644)])
                m.size = len(data)
            dst.addfile(m, io.BytesIO(data) if data is not None else None)
    with pytest.raises(build.BuildError, match="does not hash to its diff_id"):
        build.build_image(tampered, scratch / "x.sif", workdir=scratch)


def test_the_store_key_of_an_archive_is_its_kind_not_a_rootfs_tarball(scratch):
    archive = docker_save_oci(scratch / "bb.tar", busybox_layers())
    assert build.source_content_key(archive)["kind"] == archives.OCI_ARCHIVE
