"""diff() on whatever the workload left behind: what it cannot carry is a `DiffRefused` naming the
path and the limit (the agent's doing, never a plain SandboxError), and what it can carry it
carries faithfully: names and symlink targets that are not UTF-8 (bytes), deep trees (walked
without recursion), and a prefix the workload replaced by a symlink (never followed)."""
from __future__ import annotations

import pytest

from nodeagent.sandbox import sbxinit
from nodeagent.sandbox.runtime import DiffRefused, SandboxError, SandboxSpec
from nodeagent.sandbox.spec import diff_refused, in_bytecode

pytestmark = pytest.mark.sandbox


def _sh(sb, script: str) -> None:
    r = sb.exec(["sh", "-c", script], cwd="/")
    assert r.exit_code == 0, r.stderr


def _nest(levels: int) -> str:
    return f'i=0; p=/work/deep; while [ $i -lt {levels} ]; do p=$p/d; i=$((i+1)); done; mkdir -p "$p" && echo x > "$p/f"'


def test_content_past_max_bytes_is_refused_naming_the_file_and_the_cap(runtime, rw_image):
    with runtime.create(SandboxSpec(image=rw_image)) as sb:
        sb.write_files({"/work/small.txt": b"s" * 100, "/work/zbig.bin": b"b" * 5000})
        with pytest.raises(DiffRefused, match=r"/work/zbig\.bin.*4096 bytes"):
            sb.diff("/work", max_bytes=4096)
        assert {c.path for c in sb.diff("/work", max_bytes=8192)} >= {"/work/small.txt", "/work/zbig.bin"}


def test_a_tree_deeper_than_the_limit_is_refused_and_one_within_it_round_trips(runtime, rw_image):
    depth = sbxinit.DIFF_MAX_DEPTH
    with runtime.create(SandboxSpec(image=rw_image)) as sb:
        _sh(sb, _nest(depth + 50))
        with pytest.raises(DiffRefused, match=f"more than {depth} levels"):
            sb.diff("/work")
    with runtime.create(SandboxSpec(image=rw_image)) as sb:
        _sh(sb, _nest(depth - 10))
        changes = sb.diff("/work")
    deepest = max(changes, key=lambda c: c.path.count("/"))
    assert deepest.path.endswith("/d/f") and deepest.data == b"x\n"
    with runtime.create(SandboxSpec(image=rw_image)) as b:
        b.apply(changes)
        r = b.exec(["sh", "-c", "cat /work/deep" + "/d" * (depth - 10) + "/f"])
        assert r.stdout == b"x\n", r.stderr


def test_names_and_symlink_targets_that_are_not_utf8_round_trip_as_bytes(runtime, rw_image):
    with runtime.create(SandboxSpec(image=rw_image)) as sb:
        _sh(sb, "echo data > \"$(printf '/work/caf\\351.txt')\" && ln -s \"$(printf '/tmp/\\377')\" /work/cache")
        changes = sb.diff("/work")
        archive = sb.diff_archive("/work")
    by_path = {c.path: c for c in changes}
    assert by_path["/work/cache"].data == b"/tmp/\xff"
    assert by_path["/work/caf\udce9.txt"].data == b"data\n"
    for payload in (changes, archive):
        with runtime.create(SandboxSpec(image=rw_image)) as b:
            b.apply(payload)
            r = b.exec(["sh", "-c", "readlink /work/cache; cat \"$(printf '/work/caf\\351.txt')\""])
            assert r.stdout == b"/tmp/\xff\ndata\n", r.stderr


def test_a_prefix_that_is_a_symlink_is_carried_as_one_never_followed(runtime, rw_image):
    # followed, it would read the node's /etc (the diff runs in the node's view of the files)
    with runtime.create(SandboxSpec(image=rw_image)) as sb:
        _sh(sb, "ln -s /etc /work/sub")
        changes = sb.diff("/work/sub")
    assert [(c.path, c.kind, c.data) for c in changes] == [("/work/sub", "symlink", b"/etc")]


def test_a_refusal_is_a_sandbox_error_subclass_and_other_failures_are_not_refusals(runtime, rw_image):
    assert issubclass(DiffRefused, SandboxError)
    with runtime.create(SandboxSpec(image=rw_image)) as sb:
        sb.write_files({"/work/a.txt": b"a"})
        assert [c.path for c in sb.diff("/work/nothing-here")] == []
        with pytest.raises(SandboxError) as err:
            sb.read_file("/work/missing.txt")
        assert not isinstance(err.value, DiffRefused)


def test_more_entries_than_the_limit_are_refused(runtime, python_image):
    n = sbxinit.DIFF_MAX_ENTRIES + 10
    with runtime.create(SandboxSpec(image=python_image, limits={"inodes": n + 1000, "disk_mb": 256})) as sb:
        r = sb.exec(["python3", "-c", f"import os\nos.mkdir('/work/m')\nfor i in range({n}): open(f'/work/m/{{i}}', 'w').close()"])
        assert r.exit_code == 0, r.stderr
        with pytest.raises(DiffRefused, match=f"more than {sbxinit.DIFF_MAX_ENTRIES} entries"):
            sb.diff("/work")


def test_a_path_longer_than_the_limit_is_refused(runtime, python_image):
    with runtime.create(SandboxSpec(image=python_image)) as sb:
        r = sb.exec(["python3", "-c", "import os\nos.chdir('/work')\nfor i in range(13):\n"
                                      "    os.mkdir('n' * 250); os.chdir('n' * 250)\nopen('f', 'w').write('x')"])
        assert r.exit_code == 0, r.stderr
        with pytest.raises(DiffRefused, match=f"longer than {sbxinit.DIFF_MAX_PATH_BYTES} bytes"):
            sb.diff("/work")


def test_skip_bytecode_leaves_written_bytecode_out_of_the_diff_and_its_cap(runtime, rw_image):
    with runtime.create(SandboxSpec(image=rw_image)) as sb:
        sb.write_files({"/work/pkg/__pycache__/m.cpython-311.pyc": b"c" * 5000, "/work/old.pyc": b"o" * 5000,
                        "/work/pkg/m.py": b"x = 1\n"})
        with pytest.raises(DiffRefused):
            sb.diff("/work", max_bytes=4096)
        kept = sb.diff("/work", max_bytes=4096, skip_bytecode=True)
    assert [c.path for c in kept if c.kind != "dir"] == ["/work/pkg/m.py"]


def test_both_backends_leave_the_same_bytecode_out(runtime, rw_image):
    """apptainer filters a whole tree with `spec.in_bytecode`; the native walk skips as it goes:
    over the same tree (bytecode at several depths, names that only look like bytecode) both
    keep the same entries."""
    with runtime.create(SandboxSpec(image=rw_image)) as sb:
        sb.write_files({"/work/pkg/__pycache__/m.cpython-311.pyc": b"c", "/work/pkg/__pycache__/sub/x.txt": b"x",
                        "/work/old.pyc": b"o", "/work/old.pyo": b"o", "/work/pkg/m.py": b"x = 1\n",
                        "/work/z.pyc/inside.txt": b"i", "/work/not__pycache__/a.py": b"a",
                        "/work/pyc": b"p", "/work/a.pyc.txt": b"t"})
        _sh(sb, "echo f > /work/__pycache__ && mkdir -p /work/d && echo b > /work/d/b.pyc")
        whole = sb.diff("/work")
        skipped = sb.diff("/work", skip_bytecode=True)
    assert [c for c in whole if c.kind == "deleted" or not in_bytecode(c.path, c.kind == "dir")] == skipped
    kept = {c.path for c in skipped}
    assert {"/work/z.pyc/inside.txt", "/work/not__pycache__/a.py", "/work/pyc", "/work/a.pyc.txt",
            "/work/__pycache__", "/work/pkg/m.py"} <= kept
    assert not kept & {"/work/old.pyc", "/work/old.pyo", "/work/d/b.pyc", "/work/pkg/__pycache__/sub/x.txt"}


def test_a_refusal_reads_the_same_from_either_backend(runtime, rw_image):
    with runtime.create(SandboxSpec(image=rw_image)) as sb:
        sb.write_files({"/work/big.bin": b"b" * 5000})
        with pytest.raises(DiffRefused) as native:
            sb.diff("/work", max_bytes=4096)
    assert str(native.value).startswith(f"sandbox {sb.id}: diff refused: '/work/big.bin'")
    assert str(diff_refused("paddock-x", "the tree under /work passes 4096 bytes")) == \
        "sandbox paddock-x: diff refused: the tree under /work passes 4096 bytes"
