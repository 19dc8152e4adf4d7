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
from nodeagent.verifier.grade import graded_task
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
    return make_clones(tmp_path)


def make_clones(tmp_path, symlink=True):
    repo = tmp_path / "clones" / "acme" / "calc"
    (repo / "tests").mkdir(parents=True)
    _git(repo, "init", "-q", "-b", "main")
    (repo / "calc.py").write_text("def add(a, b):\n    return abs(a) + abs(b)\n")
    (repo / "tests" / "test_calc.py").write_text("from calc import add\n\n\ndef test_add():\n    assert add(1, 2) == 3\n")
    (repo / "conftest.py").write_text("")        # puts the repository root on sys.path, as projects do
    (repo / "tests" / "__init__.py").write_text("")
    (repo / "setup.cfg").write_text("[tool:pytest]\nfilterwarnings =\n    ignore:calc.old:DeprecationWarning\n")
    (repo / "run.sh").write_text("#!/bin/sh\necho hi\n")
    (repo / "run.sh").chmod(0o755)
    if symlink:
        os.symlink("calc.py", repo / "alias.py")
    _git(repo, "add", "-A"), _git(repo, "commit", "-qm", "initial")
    return {"dir": tmp_path / "clones", "base": _git(repo, "rev-parse", "HEAD")}


def _record(clones, instance="acme__calc-1", **extra):
    return {"instance_id": instance, "repo": "acme/calc", "base_commit": clones["base"],
            "problem_statement": "add() is wrong for negative numbers.", "test_patch": TEST_PATCH,
            "patch": GOLD, "FAIL_TO_PASS": ["test_add_negative[2]", "tests/test_calc.py::test_add_negative"],
            "PASS_TO_PASS": ["tests/test_calc.py::test_add"], **extra}


def _import(tmp_path, clones, *records, name="swe.jsonl", store=None, inline=False):
    src = tmp_path / "data" / name
    src.parent.mkdir(exist_ok=True)
    src.write_text("".join(json.dumps(r) + "\n" for r in records))
    store = store or ImageStore(tmp_path / "store")
    return import_source("swe", src, SweContext(store=None if inline else store, repos_dir=clones["dir"])), store


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
    files, answer = reference_of(graded_task(dict(task.canonical())))
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


# -- verify, validate and rescore on the task's own image and layers ----------------------------

def _task_dict(task):
    return dict(task.canonical(), task_id=task.task_id)


def test_a_patch_solution_of_an_inlined_repository_task_keeps_its_binary_files(tmp_path):
    from controller.cli.verify import solution_changes
    clones = make_clones(tmp_path, symlink=False)
    (task,), _ = _import(tmp_path, clones, _record(clones), inline=True)
    assert any(isinstance(v, dict) for v in task.canonical()["files"].values()), "the .git index is binary"
    patch = tmp_path / "gold.patch"
    patch.write_text(GOLD)
    changes, answer = solution_changes(graded_task(_task_dict(task)), patch)
    assert [(c.path, c.kind, c.data) for c in changes] == [("/work/calc.py", "modified",
                                                            b"def add(a, b):\n    return a + b\n")]


def test_verify_applies_a_patch_to_the_task_layers_in_the_task_own_image(tmp_path, capsys, python_image):
    from controller.cli.verify import layer_files
    from tests.verifier.test_checkers import paddock as main
    store = ImageStore(python_image.parent.parent)
    digest = "sha256:" + python_image.stem
    clones = make_clones(tmp_path)
    (task,), _ = _import(tmp_path, clones, _record(clones, image=digest), store=store)
    assert task.image == digest
    layers = tuple(store.layer(d) for d in task.layers)
    assert layer_files(layers, ["calc.py", "nope.py"]) == {"calc.py": b"def add(a, b):\n    return abs(a) + abs(b)\n"}
    (tmp_path / "task.json").write_text(json.dumps(_task_dict(task)))
    (tmp_path / "gold.patch").write_text(GOLD)
    argv = ["verify", "--task", str(tmp_path / "task.json"), "--image-store", str(store.root)]
    assert main([*argv, "--solution", str(tmp_path / "gold.patch")]) == 0
    out = json.loads(capsys.readouterr().out)
    assert (out["outcome"], out["reward"]) == ("pass", 1.0)
    missing = dict(_task_dict(task), image="sha256:" + "0" * 64)
    del missing["task_id"]          # another task (its id would no longer match its content)
    (tmp_path / "missing.json").write_text(json.dumps(missing))
    assert main(["verify", "--task", str(tmp_path / "missing.json"), "--image-store", str(store.root),
                 "--solution", str(tmp_path / "gold.patch")]) == 2
    assert "0" * 64 in capsys.readouterr().err, "the task's own image is looked for, not the default"


def test_validation_runs_in_the_task_own_image_and_builds_its_setup_layer(tmp_path, runtime, python_image):
    from nodeagent.verifier.validate import validate_task
    store = ImageStore(python_image.parent.parent)
    clones = make_clones(tmp_path)
    helper = "--- a/calc.py\n+++ b/calc.py\n@@ -1,2 +1,3 @@\n+import helper\n def add(a, b):\n-    return abs(a) + abs(b)\n+    return helper.plus(a, b)\n"
    rec = _record(clones, patch=helper, setup=["printf 'def plus(a, b):\\n    return a + b\\n' > helper.py"])
    (task,), _ = _import(tmp_path, clones, rec, store=store)
    v = validate_task(runtime, python_image, _task_dict(task), quick=True)
    assert v.ok, v.reasons          # the gold patch imports what only the set-up layer holds
    assert v.cases["reference"]["outcome"] == "pass" and v.cases["null"]["outcome"] == "fail"
    bad = validate_task(runtime, python_image, dict(_task_dict(task), setup=["exit 3"]), quick=True)
    assert not bad.ok and "set-up failed" in bad.reasons[0]
    own = validate_task(runtime, python_image, dict(_task_dict(task), image="sha256:" + "1" * 64), quick=True)
    assert not own.ok and "1" * 64 in own.reasons[0], "the task's own image is used, not the one handed in"


def test_rescore_stacks_the_task_layers(tmp_path, runtime, python_image):
    from nodeagent.agent.attempt import Attempt, write_changes
    from nodeagent.sandbox.runtime import Change
    from nodeagent.verifier.rescore import regrade
    store = ImageStore(python_image.parent.parent)
    clones = make_clones(tmp_path)
    (task,), _ = _import(tmp_path, clones, _record(clones), store=store)
    run = tmp_path / "run"
    run.mkdir()
    gold = [Change("/work/calc.py", "modified", b"def add(a, b):\n    return a + b\n", 0o644)]
    a = Attempt("run-r", str(run), "r1", 1, 1, "b0", 0, {}, 0, "", "")
    row = {"rollout_id": "r1", "attempt": 1, "fencing_token": 1, "task_id": task.task_id, "task_name": task.name,
           "outcome": "fail", "reward": 0.0, "verifier_version": "v-old", "answer": None,
           "changes_path": write_changes(str(run), "n1", a, gold), "image_digest": task.image}
    out = regrade(row, run, {task.task_id: _task_dict(task)}, runtime, lambda digest: python_image)
    assert (out["outcome"], out["reward"], out["infra_reason"]) == ("pass", 1.0, None)


# -- a real instance: humanize 4.10.0 with its metric() precision fix reverse-applied ----------

@pytest.mark.slow
def test_a_real_instance_is_imported_validated_and_graded_in_its_own_image(tmp_path, capsys, runtime, python_image):
    """Gold passes, no change and a wrong fix fail, graded by the project's own (parametrised)
    tests in an image holding its test dependencies."""
    from controller.cli.main import main
    from nodeagent.verifier.validate import validate_task
    from tests.data.swe import instances
    store = ImageStore(python_image.parent.parent)
    try:
        image = instances.test_image(store, python_image)
    except subprocess.CalledProcessError as exc:      # pip cannot reach the package index
        pytest.skip(f"cannot build the test-dependency image: {exc.stderr!r:.300}")
    spec = instances.INSTANCES["humanize"]
    repo, base = instances.make_repo(spec, instances.sdist_path(spec, tmp_path), tmp_path)
    (tmp_path / "swe.jsonl").write_text(json.dumps(instances.record(spec, repo, base, image)) + "\n")
    bank = tmp_path / "bank"
    assert main(["tasks", "--bank", str(bank), "import", "swe", str(tmp_path / "swe.jsonl"), "--set", "real",
                 "--store", str(store.root), "--no-contamination"]) == 0
    [task] = TaskBank(bank).load_set("real").tasks
    assert task.image == image and len(task.layers) == 1
    v = validate_task(runtime, python_image, _task_dict(task), quick=True)
    assert v.ok, v.reasons
    assert (v.cases["reference"]["outcome"], v.cases["null"]["outcome"]) == ("pass", "fail")
    (tmp_path / "wrong.patch").write_text(instances.wrong_patch(spec, repo))
    (tmp_path / "gold.patch").write_text(task.hidden["gold.patch"])
    argv = ["verify", "--task", task.task_id, "--bank", str(bank), "--image-store", str(store.root)]
    capsys.readouterr()
    assert main([*argv, "--solution", str(tmp_path / "gold.patch")]) == 0
    gold = json.loads(capsys.readouterr().out)
    assert (gold["outcome"], gold["components"]["fail_to_pass"], gold["components"]["pass_to_pass"]) == ("pass", 1.0, 1.0)
    assert main([*argv, "--solution", str(tmp_path / "wrong.patch")]) == 1
    wrong = json.loads(capsys.readouterr().out)
    assert (wrong["outcome"], wrong["reward"], wrong["components"]["fail_to_pass"]) == ("fail", 0.0, 0.0)
