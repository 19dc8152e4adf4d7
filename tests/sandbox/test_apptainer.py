"""Specification of the Apptainer backend: its command lines are pure functions of the spec,
pinned by golden files (tests/golden/apptainer/*.txt; regenerate with PADDOCK_UPDATE_GOLDEN=1
and review the diff), shell-safe for hostile values; its diff logic runs on a real image and a
real tar. The whole backend runs against real apptainer where it is installed in
tests/sandbox/test_conformance.py, the contract both backends share."""

from __future__ import annotations

import io
import os
import shlex
import shutil
import subprocess
import tarfile
from pathlib import Path

import pytest

from layers import build
from nodeagent.sandbox import apptainer as ap
from nodeagent.sandbox.apptainer import ApptainerConfig, Bind, display
from nodeagent.sandbox.runtime import Change, SandboxSpec

GOLDEN = Path(__file__).parents[1] / "golden" / "apptainer"
IMAGE = Path("/var/tmp/paddock/images/sha256/" + "ab" * 32 + ".sif")
HOSTILE = "/scratch/it's a \"dir\"; rm -rf $HOME `x`\nnext"


def spec(**kw) -> SandboxSpec:
    base = dict(image=IMAGE, limits={"memory_mb": 256, "pids": 64, "disk_mb": 64,
                                     "nofile": 256})
    return SandboxSpec(**{**base, **kw})


CASES = {
    "exec_userns_overlay": lambda: ap.exec_argv(
        spec(), ["python3", "-c", "print('hi')"], ApptainerConfig(),
        overlay="/var/tmp/paddock/apptainer/paddock-1-1.img"),
    "instance_start_userns_overlay": lambda: ap.instance_start_argv(
        spec(), "paddock-4242-1", ApptainerConfig(),
        overlay="/var/tmp/paddock/apptainer/paddock-4242-1.img"),
    "instance_start_fakeroot_tmpfs_cpus_egress": lambda: ap.instance_start_argv(
        spec(limits={"memory_mb": 1024, "pids": 128, "cpus": 1.5},
             hostname="task-7", egress_socket="/run/paddock/node1/egress.sock"),
        "paddock-4242-2", ApptainerConfig(isolation="fakeroot", writable="tmpfs")),
    "instance_start_no_cgroups_binds": lambda: ap.instance_start_argv(
        spec(limits={"memory_mb": 256, "disk_mb": 32}), "paddock-4242-3",
        ApptainerConfig(cgroup_limits=False, binds=(
            Bind("/srv/datasets/v1", "/data"), Bind("/scratch/out dir", "/out", True))),
        overlay="/tmp/o.img"),
    "instance_exec_env_cwd": lambda: ap.instance_exec_argv(
        "paddock-4242-1", ["pytest", "-q", "tests/test_hidden.py"], ApptainerConfig(),
        cwd="/work/pkg", env={"PYTHONHASHSEED": "0", "LIST": "a,b;c"}),
    "instance_stop": lambda: ap.instance_stop_argv("paddock-4242-1", ApptainerConfig()),
    "overlay_create_fakeroot": lambda: ap.overlay_create_argv(
        "/var/tmp/paddock/apptainer/paddock-4242-2.img", 128,
        ApptainerConfig(isolation="fakeroot")),
    "exec_hostile_values": lambda: ap.exec_argv(
        spec(image=Path(HOSTILE + ".sif")), ["sh", "-c", HOSTILE, "--", "$(id)"],
        ApptainerConfig(binary="/opt/apptainer 1.3/bin/apptainer"), overlay="/tmp/o.img",
        env={"X": HOSTILE}),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_command_line_matches_its_golden_file(case):
    argv = CASES[case]()
    text = display(argv) + "\n"
    golden = GOLDEN / f"{case}.txt"
    if os.environ.get("PADDOCK_UPDATE_GOLDEN"):
        golden.parent.mkdir(parents=True, exist_ok=True)
        golden.write_text(text)
    assert text == golden.read_text(), f"regenerate with PADDOCK_UPDATE_GOLDEN=1: {golden}"


@pytest.mark.parametrize("case", sorted(CASES))
def test_every_rendering_is_a_list_that_a_posix_shell_reads_back_unchanged(case):
    argv = CASES[case]()
    assert isinstance(argv, list) and all(isinstance(a, str) for a in argv)
    assert shlex.split(display(argv)) == argv


def test_the_hostile_rendering_survives_a_real_posix_shell():
    argv = CASES["exec_hostile_values"]()
    out = subprocess.run(["/bin/sh", "-c", "printf '%s\\0' " + display(argv)],
                         capture_output=True, check=True).stdout
    assert out.split(b"\0")[:-1] == [a.encode() for a in argv]


def test_every_golden_file_has_a_case():
    assert sorted(p.stem for p in GOLDEN.glob("*.txt")) == sorted(CASES)


def test_the_flags_the_contract_names_are_all_there():
    argv = CASES["instance_start_userns_overlay"]()
    for flag in ("--userns", "--containall", "--no-home", "--cleanenv", "--overlay"):
        assert flag in argv
    assert argv[argv.index("--net") + 1:argv.index("--net") + 3] == ["--network", "none"]
    assert "--fakeroot" in CASES["instance_start_fakeroot_tmpfs_cpus_egress"]()
    assert "--writable-tmpfs" in CASES["instance_start_fakeroot_tmpfs_cpus_egress"]()


@pytest.mark.parametrize("make,message", [
    (lambda: ApptainerConfig(isolation="root"), "apptainer.isolation: 'root' is not one of"),
    (lambda: ApptainerConfig(writable="disk"), "apptainer.writable: 'disk' is not one of"),
    (lambda: ApptainerConfig(binds=(Bind("/a:b", "/c"),)), "':', ','"),
    (lambda: ApptainerConfig(binds=(Bind("relative", "/c"),)), "must be an absolute path"),
    (lambda: ap.exec_argv(spec(egress_socket="/run/a,b.sock"), ["true"], ApptainerConfig(),
                          overlay="/o.img"), "':', ','"),
    (lambda: ap.exec_argv(spec(hostname="bad host"), ["true"], ApptainerConfig(),
                          overlay="/o.img"), "not a valid hostname"),
    (lambda: ap.exec_argv(spec(limits={"pids": -1}), ["true"], ApptainerConfig(),
                          overlay="/o.img"), "limits.pids must be a positive number"),
    (lambda: ap.exec_argv(spec(), ["true"], ApptainerConfig()), "needs an overlay image"),
    (lambda: ap.exec_argv(spec(image=Path("rel.sif")), ["true"], ApptainerConfig(),
                          overlay="/o.img"), "must be an absolute path"),
    (lambda: ap.instance_exec_argv("x", ["true"], ApptainerConfig(), env={"A B": "1"}),
     "environment variable name 'A B' is invalid"),
    (lambda: ap.instance_exec_argv("x", ["a=b"], ApptainerConfig(), env={"A": "1"}),
     "contains '='"),
    (lambda: ap.instance_exec_argv("x", [], ApptainerConfig()), "argv is empty"),
    (lambda: ap.instance_stop_argv("../etc", ApptainerConfig()), "instance name"),
    (lambda: ap.instance_exec_argv("x", ["true"], ApptainerConfig(), cwd="work"),
     "must be an absolute path"),
], ids=["isolation", "writable", "bind-colon", "bind-relative", "egress-comma", "hostname",
        "negative-limit", "no-overlay", "relative-image", "env-name", "argv0-equals",
        "empty-argv", "instance-name", "relative-cwd"])
def test_bad_input_is_refused_naming_what_is_wrong(make, message):
    with pytest.raises(ValueError, match=message.replace("(", r"\(")):
        make()


# ------------------------------------------------------------------ diff on real bytes

def _tar_of_tree(root: Path, prefix: str) -> bytes:
    """What `tar -C / -cf - work` prints inside the sandbox, from a real directory tree."""
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as tf:
        tf.add(root / prefix.strip("/"), arcname=prefix.strip("/"))
    return buf.getvalue()


def test_diff_compares_the_sandbox_tree_with_the_image_extracted_once(tmp_path):
    src = tmp_path / "src"
    (src / "work/pkg").mkdir(parents=True)
    (src / "work/keep.py").write_text("same\n")
    (src / "work/edit.py").write_text("old\n")
    (src / "work/gone.txt").write_text("bye\n")
    (src / "work/pkg/mod.py").write_text("x = 1\n")
    (src / "work/link").symlink_to("keep.py")
    (src / "etc").mkdir()
    image = build.build_image(src, tmp_path / "img.sif", workdir=tmp_path)
    rt = ap.ApptainerRuntime(ApptainerConfig(workdir=str(tmp_path / "rt")))
    (tmp_path / "rt").mkdir()
    lower_dir = rt.image_lower(image, "/work")
    assert rt.image_lower(image, "/work") == lower_dir, "extracted once per image"
    assert not (lower_dir / "etc").exists(), "only the prefix is extracted"

    now = tmp_path / "now"
    shutil.copytree(src, now, symlinks=True)
    (now / "work/edit.py").write_text("new\n")
    (now / "work/gone.txt").unlink()
    shutil.rmtree(now / "work/pkg")
    (now / "work/pkg").write_text("a file where a directory was\n")
    (now / "work/new").mkdir()
    (now / "work/new/added.py").write_text("print(1)\n")
    os.chmod(now / "work/new/added.py", 0o755)
    (now / "work/link").unlink()
    (now / "work/link").symlink_to("edit.py")

    lower = ap.tree_entries(lower_dir, "/work")
    changes = ap.compare(lower, ap.tar_entries(_tar_of_tree(now, "/work"), "/work"))
    assert changes == [
        Change("/work/edit.py", "modified", b"new\n", 0o644),
        Change("/work/gone.txt", "deleted", None, 0o644),
        Change("/work/link", "symlink", b"edit.py", 0o777),
        Change("/work/new", "dir", None, 0o755),
        Change("/work/new/added.py", "added", b"print(1)\n", 0o755),
        Change("/work/pkg", "deleted", None, 0o755),
        Change("/work/pkg", "added", b"a file where a directory was\n", 0o644),
    ]


def test_an_unchanged_sandbox_has_an_empty_diff(tmp_path):
    src = tmp_path / "src"
    (src / "work/sub").mkdir(parents=True)
    (src / "work/sub/f").write_text("x")
    image = build.build_image(src, tmp_path / "img.sif", workdir=tmp_path)
    rt = ap.ApptainerRuntime(ApptainerConfig(workdir=str(tmp_path)))
    lower = ap.tree_entries(rt.image_lower(image, "/work"), "/work")
    assert ap.compare(lower, ap.tar_entries(_tar_of_tree(src, "/work"), "/work")) == []


def test_creating_a_sandbox_of_a_foreign_arch_image_is_a_sandbox_error(tmp_path):
    root = tmp_path / "root"
    (root / "bin").mkdir(parents=True)
    (root / "bin/sh").write_bytes(b"\x7fELF\x02\x01\x01" + bytes(9) + b"\x02\x00\xb7\x00"
                                  + bytes(64))
    image = build.build_image(root, tmp_path / "arm.sif", workdir=tmp_path)
    rt = ap.ApptainerRuntime(ApptainerConfig(binary="/nonexistent/apptainer",
                                             workdir=str(tmp_path)))
    with pytest.raises(ap.SandboxError, match="built for arm64, but this host is amd64"):
        rt.create(spec(image=image))


def test_the_runtime_says_why_it_cannot_start_without_apptainer(tmp_path):
    rt = ap.ApptainerRuntime(ApptainerConfig(binary="/nonexistent/apptainer",
                                             workdir=str(tmp_path)))
    with pytest.raises(ap.SandboxError, match="/nonexistent/apptainer is not on PATH"):
        rt.start()
