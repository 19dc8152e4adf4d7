"""Real SWE-bench-shaped instances from real projects' source distributions, and their image.

Two instances, each a real bug made by reverse-applying a small real fix, graded by the
project's own tests:
- `humanize` 4.10.0 (~1 MB tree, the sdist ships here: humanize-4.10.0.tar.gz): the 4.10 fix
  of `metric()` with a precision below the exponent's digits (`max(0, ...)`: metric(1.5123,
  precision=0) raised "Format specifier missing precision"); FAIL_TO_PASS are parametrised ids.
- `babel` 2.14.0 (~38 MB tree, the CLDR data; the sdist is fetched by `pip download`, not
  shipped): the U+00A0 group-separator heuristic of babel issue 637 (`parse_decimal("12 345.123",
  locale="fi")` failed).

`make_repo(spec, sdist, workdir)` unpacks the sdist into a git repository whose one commit is
the buggy base (the gold patch and the test patch reverse-applied) and returns (repo, base).
`record(spec, repo, base, image)` is the JSONL record `paddock tasks import swe` takes.
`test_image(store, python_image)` is an image with the projects' test dependencies: the
built-in python image's tree plus `pip install --target` of TEST_REQUIREMENTS into
/usr/local/lib/python3.11/dist-packages, a `.pth` that puts /work/src first on sys.path and
the projects' dist-info (what an editable install leaves), built with `layers.build.build_image`, cached in the store by
a recipe of (python image digest, requirements, .pth): made once per store.

Must not import: zmq, controller.broker, nodeagent.agent (a test and benchmark helper).
"""
from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tarfile
import tempfile
from pathlib import Path

from layers import build as imagebuild
from layers.store import ImageStore

HERE = Path(__file__).resolve().parent
TEST_REQUIREMENTS = ("freezegun==1.4.0", "python-dateutil==2.9.0.post0", "six==1.16.0", "pytz==2024.1")
# humanize's pytest config names coverage's warning class (pytest imports it to parse the
# filter); the real coverage package builds frozen dataclasses at import, which the grader's
# audit hook refuses (generated `<string>` code), so the image ships only that class.
COVERAGE_STUB = "class CoverageWarning(Warning):\n    pass\n"
SITE_DIR = "usr/local/lib/python3.11/dist-packages"
SRC_PTH = "import sys; sys.path.insert(0, '/work/src')\n"
SIF_PARTITION_OFFSET = 32768      # layers.sif: the squashfs partition of a built image
IMAGE_RULES = 1

INSTANCES = {
    "humanize": {
        "instance_id": "python-humanize__humanize-metric-precision", "repo": "python-humanize/humanize",
        "sdist": "humanize-4.10.0.tar.gz", "pip": "humanize==4.10.0", "dist": ("humanize", "4.10.0"),
        "gold": "humanize-metric.gold.patch", "test": "humanize-metric.test.patch",
        "problem_statement": "humanize.metric(1.5123, precision=0) raises ValueError: Format specifier "
                             "missing precision (so do metric(10, '', 1) and metric(100, '', 2)).",
        "FAIL_TO_PASS": ["tests/test_number.py::test_metric[[1.5123, '', 0]-2]",
                         "tests/test_number.py::test_metric[[100, '', 2]-100]"],
        "PASS_TO_PASS": ["tests/test_number.py::test_metric[[1, '', 2]-1.0]",
                         "test_metric[[1000, '', 3]-1.00 k]", "tests/test_number.py::test_ordinal",
                         "test_intcomma"],
        "wrong": ("src/humanize/number.py", '% max(0, precision - (exponent % 3) - 1))',
                  '% abs(precision - (exponent % 3) - 1))'),
    },
    "babel": {
        "instance_id": "python-babel__babel-637", "repo": "python-babel/babel", "sdist": "Babel-2.14.0.tar.gz",
        "pip": "babel==2.14.0", "gold": "babel-nbsp.gold.patch", "test": "babel-nbsp.test.patch",
        "problem_statement": "parse_decimal('12 345.123', locale='fi') raises NumberFormatError: locales "
                             "whose group separator is U+00A0 reject the plain space users type.",
        "FAIL_TO_PASS": ["tests/test_numbers.py::test_parse_decimal_nbsp_heuristics"],
        "PASS_TO_PASS": ["tests/test_numbers.py::test_format_decimal_precision[1.1-1.1]",
                         "tests/test_numbers.py::NumberParsingTestCase::test_can_parse_decimals",
                         "test_parse_decimal_strict_mode"],
        "wrong": ("babel/numbers.py", "        ' ' in string  # but it does contain a space instead,\n",
                  "        '  ' in string  # but it does contain a space instead,\n"),
    },
}


def _git(cwd: Path, *argv: str) -> str:
    env = {**os.environ, "GIT_AUTHOR_NAME": "paddock", "GIT_AUTHOR_EMAIL": "paddock@example.invalid",
           "GIT_COMMITTER_NAME": "paddock", "GIT_COMMITTER_EMAIL": "paddock@example.invalid",
           "GIT_AUTHOR_DATE": "2024-01-01T00:00:00Z", "GIT_COMMITTER_DATE": "2024-01-01T00:00:00Z"}
    return subprocess.run(["git", *argv], cwd=cwd, check=True, capture_output=True, text=True, env=env).stdout.strip()


def sdist_path(spec: dict, cache: Path) -> Path:
    """The instance's sdist: shipped here, else in `cache`, else `pip download`ed into it."""
    for p in (HERE / spec["sdist"], cache / spec["sdist"]):
        if p.is_file():
            return p
    cache.mkdir(parents=True, exist_ok=True)
    subprocess.run([sys.executable, "-m", "pip", "download", "-q", "--no-deps", "--no-binary", ":all:",
                    "-d", str(cache), spec["pip"]], check=True, capture_output=True, timeout=600)
    return cache / spec["sdist"]


def _ours(member: tarfile.TarInfo, dest: str) -> tarfile.TarInfo:
    """The `tar` filter, owned by us (git refuses a repository of another owner)."""
    return tarfile.tar_filter(member, dest).replace(uid=os.getuid(), gid=os.getgid(), uname="", gname="")


def make_repo(spec: dict, sdist: Path, workdir: Path) -> tuple[Path, str]:
    """A git repository of the sdist with the fix and its tests reverse-applied: (path, base)."""
    with tarfile.open(sdist) as tf:
        top = tf.getnames()[0].split("/")[0]
        tf.extractall(workdir, filter=_ours)
    repo = workdir / top
    for name in (spec["gold"], spec["test"]):
        subprocess.run(["patch", "-p1", "-R", "--batch", "--silent", "-i", str(HERE / name)], cwd=repo, check=True)
    _git(repo, "init", "-q", "-b", "main")
    _git(repo, "add", "-A")
    _git(repo, "commit", "-qm", "base")
    return repo, _git(repo, "rev-parse", "HEAD")


def record(spec: dict, repo: Path, base: str, image: str) -> dict:
    return {"instance_id": spec["instance_id"], "repo": str(repo), "base_commit": base, "image": image,
            "problem_statement": spec["problem_statement"], "patch": (HERE / spec["gold"]).read_text(),
            "test_patch": (HERE / spec["test"]).read_text(), "FAIL_TO_PASS": spec["FAIL_TO_PASS"],
            "PASS_TO_PASS": spec["PASS_TO_PASS"]}


def wrong_patch(spec: dict, repo: Path) -> str:
    """A plausible but wrong fix: the gold patch's file with one line changed the wrong way."""
    rel, good, bad = spec["wrong"]
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp) / "w"
        shutil.copytree(repo, work, symlinks=True)
        subprocess.run(["patch", "-p1", "--batch", "--silent", "-i", str(HERE / spec["gold"])], cwd=work, check=True)
        text = (work / rel).read_text()
        assert text.count(good) == 1, (rel, good)
        (work / rel).write_text(text.replace(good, bad))
        return _git(work, "diff")


def test_image(store: ImageStore, python_image: Path) -> str:
    """The digest of the test-dependency image (see the module docstring), built once per store."""
    recipe = {"kind": "swe-test-image", "python_image": python_image.stem, "pip": list(TEST_REQUIREMENTS),
              "pth": SRC_PTH, "coverage_stub": COVERAGE_STUB, "dists": sorted(s["dist"] for s in INSTANCES.values() if "dist" in s),
              "rules": IMAGE_RULES}

    def builder(out: Path) -> None:
        with tempfile.TemporaryDirectory(prefix="paddock-swe-image-", dir=store.root / "tmp") as tmp:
            rootfs = Path(tmp) / "rootfs"
            subprocess.run(["unsquashfs", "-q", "-n", "-o", str(SIF_PARTITION_OFFSET), "-d", str(rootfs),
                            str(python_image)], check=True, capture_output=True)
            site = rootfs / SITE_DIR
            subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--no-compile", "--no-deps",
                            "--target", str(site), *TEST_REQUIREMENTS],
                           check=True, capture_output=True, timeout=600)
            (site / "00-paddock-work-src.pth").write_text(SRC_PTH)
            (site / "coverage").mkdir()
            (site / "coverage" / "__init__.py").write_text("")
            (site / "coverage" / "exceptions.py").write_text(COVERAGE_STUB)
            for spec in INSTANCES.values():     # the metadata an editable install leaves
                if "dist" in spec:
                    name, version = spec["dist"]
                    meta = site / f"{name}-{version}.dist-info"
                    meta.mkdir()
                    (meta / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n")
            imagebuild.build_image(rootfs, out)
    (store.root / "tmp").mkdir(parents=True, exist_ok=True)
    digest, _path = store.build_or_reuse(recipe, builder)
    return digest
