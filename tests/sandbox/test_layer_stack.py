"""Layers stacked between the image and a sandbox's writable layer: what the workload sees (its
own files: modes, executable bits and symlinks kept, setuid stripped), what diff() reports
(only the sandbox's changes), apply() onto a sandbox with the same layers, sharing and release
on the node, and set-up once (a layer made from setup commands; a failing one is a SetupError).
Real sandboxes, real squashfs layers built from trees."""
from __future__ import annotations

import os
import shutil
import tempfile
from pathlib import Path

import pytest

from layers import treelayer
from layers.store import ImageStore
from nodeagent.sandbox import setuplayer
from nodeagent.sandbox.runtime import SandboxError, SandboxRuntime, SandboxSpec
from nodeagent.sandbox.spec import SetupError

pytestmark = pytest.mark.sandbox


@pytest.fixture(scope="module")
def base():
    d = Path(tempfile.mkdtemp(prefix="paddock-layers-", dir="/tmp"))   # reachable by subuids
    os.chmod(d, 0o755)
    yield d
    shutil.rmtree(d, ignore_errors=True)


@pytest.fixture(scope="module")
def store(base):
    return ImageStore(base / "store")


def repo_tree(root: Path, n_files: int = 50) -> Path:
    """A small repository: packages of files, an executable script, a symlink, a setuid file."""
    (root / "pkg" / "sub").mkdir(parents=True)
    for i in range(n_files):
        (root / "pkg" / f"m{i}.py").write_text(f"VALUE = {i}\n")
    (root / "pkg" / "sub" / "deep.txt").write_text("deep\n")
    (root / "run.sh").write_text("#!/bin/sh\necho ran\n")
    os.chmod(root / "run.sh", 0o755)
    (root / "suid").write_text("x")
    os.chmod(root / "suid", 0o4755)
    os.symlink("pkg/m1.py", root / "link")
    return root


@pytest.fixture(scope="module")
def repo_layer(base, store):
    return treelayer.ensure_tree_layer(store, repo_tree(base / "repo"), "/work/repo")[1]


def test_a_layer_tree_is_the_sandbox_roots_own_with_modes_and_symlinks_kept(runtime, rw_image, repo_layer):
    with runtime.create(SandboxSpec(image=rw_image, layers=(repo_layer,))) as sb:
        r = sb.exec(["sh", "-c", "stat -c '%a %u %n' /work/repo /work/repo/run.sh /work/repo/suid "
                                 "/work/repo/pkg/m3.py; readlink /work/repo/link; /work/repo/run.sh"])
        assert r.exit_code == 0, r.stderr
        assert r.stdout.decode().splitlines() == [
            "755 0 /work/repo", "755 0 /work/repo/run.sh", "755 0 /work/repo/suid",
            "644 0 /work/repo/pkg/m3.py", "pkg/m1.py", "ran"]
        assert sb.exec(["sh", "-c", "echo more >> /work/repo/pkg/m3.py && mkdir /work/repo/new"]).exit_code == 0


def test_a_one_line_edit_is_one_change_and_a_deleted_layer_file_is_a_whiteout(runtime, rw_image, repo_layer):
    with runtime.create(SandboxSpec(image=rw_image, layers=(repo_layer,))) as sb:
        assert sb.diff("/work") == []
        r = sb.exec(["sh", "-c", "echo 'VALUE = 99' > /work/repo/pkg/m7.py && rm /work/repo/pkg/sub/deep.txt"])
        assert r.exit_code == 0, r.stderr
        changes = sb.diff("/work")
    assert [(c.path, c.kind) for c in changes] == [("/work/repo/pkg/m7.py", "modified"),
                                                  ("/work/repo/pkg/sub/deep.txt", "deleted")]
    assert changes[0].data == b"VALUE = 99\n"


def test_a_diff_applies_onto_a_fresh_sandbox_with_the_same_layers(runtime, rw_image, repo_layer):
    edit = "echo fixed > /work/repo/pkg/m2.py && rm /work/repo/run.sh && echo new > /work/repo/pkg/n.py"
    state = "cat /work/repo/pkg/m2.py /work/repo/pkg/n.py; ls /work/repo"
    with runtime.create(SandboxSpec(image=rw_image, layers=(repo_layer,))) as a:
        assert a.exec(["sh", "-c", edit]).exit_code == 0
        archive, expected = a.diff_archive("/work"), a.exec(["sh", "-c", state]).stdout
    with runtime.create(SandboxSpec(image=rw_image, layers=(repo_layer,))) as b:
        b.apply(archive)
        assert b.exec(["sh", "-c", state]).stdout == expected
        assert [c.kind for c in b.diff("/work")] == ["modified", "added", "deleted"]


def test_the_upper_layer_wins_over_the_lower_one(runtime, rw_image, base, store, repo_layer):
    top = base / "top"
    (top / "pkg").mkdir(parents=True)
    (top / "pkg" / "m1.py").write_text("VALUE = 'top'\n")
    top_layer = treelayer.ensure_tree_layer(store, top, "/work/repo")[1]
    with runtime.create(SandboxSpec(image=rw_image, layers=(repo_layer, top_layer))) as sb:
        assert sb.exec(["cat", "/work/repo/pkg/m1.py", "/work/repo/pkg/m2.py"]).stdout == b"VALUE = 'top'\nVALUE = 2\n"


def test_sandboxes_share_one_node_copy_released_after_the_grace_period(rw_image, repo_layer):
    now = [0.0]
    with SandboxRuntime(image_grace_s=30.0, clock=lambda: now[0]) as rt:
        a = rt.create(SandboxSpec(image=rw_image, layers=(repo_layer,)))
        b = rt.create(SandboxSpec(image=rw_image, layers=(repo_layer,)))
        [key] = rt.mounted_layers()
        assert rt.image_refs()[key] == 2
        a.destroy()
        b.destroy()
        now[0] = 10.0
        assert rt.reap_images() == [] and rt.mounted_layers() == [key]
        now[0] = 100.0
        assert key in rt.reap_images() and rt.mounted_layers() == []


def test_a_missing_layer_is_named_and_takes_no_reference(runtime, rw_image, base):
    def held():     # an unreferenced image may be reaped meanwhile (its grace period ended)
        return {k: n for k, n in runtime.image_refs().items() if n}
    before = held()
    with pytest.raises(SandboxError, match="layer .*nope.sqfs does not exist"):
        runtime.create(SandboxSpec(image=rw_image, layers=(base / "nope.sqfs",)))
    assert held() == before


def test_the_same_tree_anywhere_gives_the_same_layer(base):
    a = repo_tree(base / "twin-a", 5)
    b = base / "twin-b"
    shutil.copytree(a, b, symlinks=True)
    os.utime(b / "pkg" / "m1.py", (1, 1))
    la = treelayer.build_layer_file(a, base / "a.sqfs", "/work/repo")
    lb = treelayer.build_layer_file(b, base / "b.sqfs", "/work/repo")
    assert la.read_bytes() == lb.read_bytes()


def test_setup_runs_once_and_its_layer_serves_every_sandbox(runtime, rw_image, store, repo_layer):
    cmds = ["echo built >> /work/repo/setup.log && rm /work/repo/pkg/m0.py && echo scratch > /tmp/x"]
    layer = setuplayer.ensure_setup_layer(runtime, store, rw_image, [repo_layer], cmds,
                                          limits={"memory_mb": 256, "pids": 64, "disk_mb": 64})
    again = setuplayer.ensure_setup_layer(runtime, store, rw_image, [repo_layer], cmds)
    assert again == layer
    for _ in range(2):
        with runtime.create(SandboxSpec(image=rw_image, layers=(repo_layer, layer))) as sb:
            r = sb.exec(["sh", "-c", "cat /work/repo/setup.log; ls /work/repo/pkg | grep -c m0.py; ls /tmp"])
            assert r.stdout == b"built\n0\n", r.stderr
            assert sb.diff("/work") == []


def test_a_failing_setup_is_a_setup_error_with_the_command_exit_code_and_output(runtime, rw_image, store, repo_layer):
    cmds = ["true", "echo about to fail; echo oops >&2; exit 3"]
    with pytest.raises(SetupError) as info:
        setuplayer.ensure_setup_layer(runtime, store, rw_image, [repo_layer], cmds)
    err = info.value
    assert isinstance(err, SandboxError)
    assert (err.command, err.exit_code, err.timed_out) == (cmds[1], 3, False)
    assert "about to fail" in err.output_tail and "oops" in err.output_tail
    assert treelayer.lookup_layer(store, setuplayer.setup_recipe(Path(rw_image), [repo_layer], cmds)) is None


def test_layers_on_fuse_overlayfs_are_refused_saying_why(rw_image, repo_layer):
    with SandboxRuntime(overlay="fuse-overlayfs") as rt:
        with pytest.raises(SandboxError, match="layers need the kernel overlay"):
            rt.create(SandboxSpec(image=rw_image, layers=(repo_layer,)))
        assert rt.settle() is None


@pytest.fixture(scope="module")
def sdist_tree(base):
    """A real repository: sympy 1.12's source distribution (pip download; skipped offline)."""
    import subprocess
    import sys
    import tarfile
    cache = Path(os.environ.get("PADDOCK_SDIST_CACHE", "/var/tmp/paddock/sdists"))
    tree = cache / "sympy-1.12"
    if not tree.is_dir():
        cache.mkdir(parents=True, exist_ok=True)
        r = subprocess.run([sys.executable, "-m", "pip", "download", "--no-deps", "--no-binary", ":all:",
                            "sympy==1.12", "-d", str(cache), "-q"], capture_output=True, text=True)
        if r.returncode != 0:
            pytest.skip(f"cannot download the sympy sdist: {r.stderr[-300:]}")
        with tarfile.open(cache / "sympy-1.12.tar.gz") as tf:
            tf.extractall(cache, filter="data")
    return tree


@pytest.mark.slow
def test_a_real_repository_layer_gives_a_one_change_diff_for_a_one_line_edit(runtime, rw_image, store, sdist_tree):
    layer = treelayer.ensure_tree_layer(store, sdist_tree, "/work/repo")[1]
    with runtime.create(SandboxSpec(image=rw_image, layers=(layer,))) as sb:
        r = sb.exec(["sh", "-c", "echo '# fixed' >> /work/repo/sympy/core/numbers.py && "
                                 "test -x /work/repo/bin/isympy && ls /work/repo/sympy | wc -l"])
        assert r.exit_code == 0, r.stderr
        assert int(r.stdout) > 30
        changes = sb.diff("/work")
    assert [(c.path, c.kind) for c in changes] == [("/work/repo/sympy/core/numbers.py", "modified")]
    assert changes[0].data.endswith(b"# fixed\n")
