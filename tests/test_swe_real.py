"""Repository tasks as layers: the swe importer on SWE-bench-shaped records, and their grading."""
from __future__ import annotations

import json
import os
import subprocess

import pytest

from controller.taskbank.bank import TaskBank, load_package
from controller.taskbank.importers import SweContext, import_source
from layers.store import ImageStore
from nodeagent.verifier import grade
from nodeagent.verifier.validate import reference_of

pytestmark = pytest.mark.skipif(subprocess.run(["which", "mksquashfs"], capture_output=True).returncode != 0,
                                reason="needs mksquashfs")

TEST_PATCH = """--- a/tests/test_calc.py
+++ b/tests/test_calc.py
@@ -4,3 +4,9 @@ from calc import add
 
 def test_add():
     assert add(1, 2) == 3
+
+
+import pytest
+@pytest.mark.parametrize("n", [1, 2, 3])
+def test_add_negative(n):
+    assert add(-n, -n) == -2 * n
"""
GOLD = """--- a/calc.py
+++ b/calc.py
@@ -1,2 +1,2 @@
 def add(a, b):
-    return abs(a) + abs(b)
+    return a + b
"""


def _git(cwd, *argv):
    return subprocess.run(["git", *argv], cwd=cwd, check=True, capture_output=True, text=True,
                          env={**os.environ, "GIT_AUTHOR_NAME": "a", "GIT_AUTHOR_EMAIL": "a@b",
                               "GIT_COMMITTER_NAME": "a", "GIT_COMMITTER_EMAIL": "a@b"}).stdout.strip()


@pytest.fixture
def clones(tmp_path):
    repo = tmp_path / "clones" / "acme" / "calc"
    (repo / "tests").mkdir(parents=True)
    _git(repo, "init", "-q", "-b", "main")
    (repo / "calc.py").write_text("def add(a, b):\n    return abs(a) + abs(b)\n")
    (repo / "tests" / "test_calc.py").write_text("from calc import add\n\n\ndef test_add():\n    assert add(1, 2) == 3\n")
    (repo / "run.sh").write_text("#!/bin/sh\necho hi\n")
    (repo / "run.sh").chmod(0o755)
    os.symlink("calc.py", repo / "alias.py")
    _git(repo, "add", "-A"), _git(repo, "commit", "-qm", "initial")
    return {"dir": tmp_path / "clones", "base": _git(repo, "rev-parse", "HEAD")}


def _record(clones, instance="acme__calc-1", **extra):
    return {"instance_id": instance, "repo": "acme/calc", "base_commit": clones["base"],
            "problem_statement": "add() is wrong for negative numbers.", "test_patch": TEST_PATCH,
            "patch": GOLD, "FAIL_TO_PASS": ["test_add_negative[2]", "tests/test_calc.py::test_add_negative"],
            "PASS_TO_PASS": ["tests/test_calc.py::test_add"], **extra}


def _import(tmp_path, clones, *records, name="swe.jsonl"):
    src = tmp_path / "data" / name
    src.parent.mkdir(exist_ok=True)
    src.write_text("".join(json.dumps(r) + "\n" for r in records))
    store = ImageStore(tmp_path / "store")
    return import_source("swe", src, SweContext(store=store, repos_dir=clones["dir"])), store


def test_a_layered_import_is_deterministic_and_shares_one_layer_per_commit(tmp_path, clones):
    (a, b), store = _import(tmp_path, clones, _record(clones), _record(clones, "acme__calc-2"))
    (again, _c), _ = _import(tmp_path, clones, _record(clones), _record(clones, "acme__calc-2"), name="again.jsonl")
    assert again.task_id == a.task_id, "re-importing the same record gives the same task id"
    assert a.layers == b.layers and len(a.layers) == 1 and store.layer(a.layers[0]).is_file()
    assert a.files == {} and a.limits.disk_mb >= 1024
    assert "test_add_negative" in a.hidden["tests/test_calc.py"]
    pkg = TaskBank(tmp_path / "bank").put_task(a)
    assert load_package(pkg).task_id == a.task_id


def test_the_gold_patch_is_the_hidden_reference(tmp_path, clones):
    (task,), _ = _import(tmp_path, clones, _record(clones))
    assert task.hidden["gold.patch"] == GOLD
    files, answer = reference_of(dict(task.canonical()))
    assert files == {"calc.py": "def add(a, b):\n    return a + b\n"} and answer is None


def test_a_relative_repo_path_is_resolved_against_the_jsonl_file(tmp_path, clones):
    rec = _record(clones, repo="../clones/acme/calc")
    (task,), _ = _import(tmp_path, clones, rec)
    assert task.name == "swe/acme__calc-1"


def test_parametrised_class_qualified_and_fileless_ids_are_matched():
    results = {"tests/t.py::test_x[1]": ["passed"], "tests/t.py::test_x[2]": ["failed"],
               "tests/t.py::TestA::test_y": ["passed"]}
    assert grade.match_outcomes("test_x[1]", results) == ["passed"]
    assert grade.match_outcomes("tests/t.py::test_x", results) == ["passed", "failed"]
    assert grade.match_outcomes("TestA::test_y", results) == ["passed"]
    assert grade.match_outcomes("test_y", results) == ["passed"]
    assert grade.match_outcomes("tests/t.py::test_z", results) == []


def test_a_missing_dependency_is_an_environment_error_not_a_failure():
    err = {"ev": "collect_error", "id": "tests/test_calc.py",
           "detail": "tests/test_calc.py:1: in <module>\nE   ModuleNotFoundError: No module named 'numpy'"}
    assert "numpy" in grade.environment_error([err], changed={"calc.py"})
    assert grade.environment_error([err], changed={"tests/test_calc.py"}) is None
    raw = json.dumps({"events": [{"ev": "start"}, err, {"ev": "end"}]}).encode()
    with pytest.raises(grade.VerifierInfraError, match="cannot import a dependency"):
        grade.grade_report(raw, ["tests/test_calc.py::test_add"], {}, changed={"calc.py"})
