"""No false negatives on real repositories: the gold patch of a SWE-smith-style task made from each
project of tests/data/real_repos/corpus.yaml passes Paddock's grader, and no change fails.

Each project is a pinned source distribution from the package index (`pip download --no-deps
--no-binary :all:`, cached under $PADDOCK_SDIST_CACHE or /var/tmp/paddock/sdists), unpacked with
one real function broken, imported by the swe importer as a layered task in the corpus image
(the built-in python image plus the test plugins the projects' configurations name), and graded
by `validate_task` (reference and null through `grade.verify`, fresh sandboxes), with the
project's own test files, conftest and configuration. FAIL_TO_PASS / PASS_TO_PASS were measured
with plain pytest in the same image (`benchmarks/real_repos.py --measure`). A project whose
gold patch the grader fails on current code carries `known_false_negative: <diagnosis>` in the
corpus and is a strict xfail here: it fails the day the grader is fixed, so the marker goes.
Skipped (with the reason) when pip cannot reach the package index.
"""
from __future__ import annotations

import subprocess

import pytest

from layers.store import ImageStore
from tests.data.real_repos import repos

pytestmark = [pytest.mark.sandbox, pytest.mark.slow,
              pytest.mark.skipif(subprocess.run(["which", "mksquashfs"], capture_output=True, check=False).returncode != 0,
                                 reason="needs mksquashfs")]

ENTRIES = repos.load_corpus()


@pytest.fixture(scope="module")
def corpus(python_image, tmp_path_factory):
    """(sdists by name, the corpus image's digest, its store)."""
    store = ImageStore(python_image.parent.parent)
    try:
        sdists = repos.fetch_sdists(ENTRIES)
        image = repos.corpus_image(store, python_image, ENTRIES)
    except repos.IndexUnreachable as exc:
        pytest.skip(f"the package index is unreachable: {exc}")
    return sdists, image, store


def test_the_corpus_is_at_least_twenty_projects_covering_the_suite_shapes():
    graded = [e for e in ENTRIES if e.get("fail_to_pass")]
    assert len(graded) >= 20, "issue 24: at least 20 real repositories"
    features = {f for e in graded for f in e.get("features") or ()}
    for shape in ("unittest", "conftest", "conftest-doctest_namespace", "filterwarnings-error",
                  "addopts-doctest-modules", "doctest-module", "src-layout"):
        assert shape in features, f"no project exercises {shape}"
    # PASS_TO_PASS: every test of the graded files that passes with and without the break (five
    # sampled); a project whose every graded test exercises the function has none
    assert sum(bool(e.get("pass_to_pass")) for e in graded) >= 20


def _param(entry):
    marks = []
    if entry.get("known_false_negative"):
        marks.append(pytest.mark.xfail(strict=True, reason=f"known grader false negative: {entry['known_false_negative']}"))
    return pytest.param(entry, id=f"{entry['name']}-{entry['version']}", marks=marks)


@pytest.mark.parametrize("entry", [_param(e) for e in ENTRIES if e.get("fail_to_pass")])
def test_the_gold_patch_of_a_real_project_passes_and_no_change_fails(entry, corpus, runtime, python_image, tmp_path):
    sdists, image, store = corpus
    repo = repos.make_repo(entry, sdists[entry["name"]], tmp_path)
    task = repos.import_task(entry, repo, image, store, tmp_path)
    assert task["checker"]["fail_to_pass"] == entry["fail_to_pass"]
    g = repos.grade_project(runtime, task, python_image, entry)
    assert g.gold == "pass", f"false negative: the gold patch is graded {g.gold}: {g.gold_detail}"
    assert g.null == "fail", f"the null solution is graded {g.null}: {g.null_detail}"
