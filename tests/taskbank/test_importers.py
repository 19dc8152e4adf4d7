"""Importers: HumanEval/MBPP/math JSONL and SWE-style repository tasks (a real git repo)."""
from __future__ import annotations

import io
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from controller.taskbank.bank import TaskBank, write_package
from controller.taskbank.importers import ImportSourceError, import_source

HUMANEVAL = {
    "task_id": "HumanEval/0",
    "prompt": 'def add(a: int, b: int) -> int:\n    """Return a + b."""\n',
    "canonical_solution": "    return a + b\n",
    "test": "def check(candidate):\n    assert candidate(1, 2) == 3\n    assert candidate(-1, 1) == 0\n",
    "entry_point": "add",
}
MBPP = {
    "task_id": 11, "text": "Write a function to double a number.",
    "code": "def double(x):\n    return 2 * x\n",
    "test_list": ["assert double(2) == 4", "assert double(0) == 0"],
}

# the shapes of the public files: original MBPP (CRLF code, a helper defined before the tested
# function, setup code), the sanitized split (prompt, test_imports), HumanEval with a helper
# in the prompt and METADATA in the test
MBPP_HELPER_FIRST = {
    "task_id": 901, "text": "Write a function to sum the squares of a list.",
    "code": "import math\r\ndef square(x):\r\n  return x * x\r\ndef sum_squares(xs):\r\n  return sum(square(x) for x in xs) ",
    "test_list": ["assert sum_squares([1, 2]) == 5", "assert sum_squares([]) == 0"],
    "test_setup_code": "", "challenge_test_list": [],
}
MBPP_SANITIZED = {
    "source_file": "Benchmark Questions Verification V2.ipynb", "task_id": 902,
    "prompt": "Write a function to find the shared elements from the given two lists.",
    "code": "def similar_elements(a, b):\n    return tuple(set(a) & set(b))\n",
    "test_imports": ["import math"],
    "test_list": ["assert set(similar_elements((3, 4, 5, 6), (5, 7, 4, 10))) == set((4, 5))"],
}
HUMANEVAL_HELPER = {
    "task_id": "HumanEval/903",
    "prompt": ('def is_even(n: int) -> bool:\n    """Test if n is even."""\n    return n % 2 == 0\n\n\n'
               'def count_even(xs: list) -> int:\n    """Count the even numbers in xs.\n    >>> count_even([1, 2, 4])\n'
               '    2\n    """\n'),
    "canonical_solution": "    return sum(1 for x in xs if is_even(x))\n",
    "test": ("\n\nMETADATA = {\n    'author': 'x',\n    'dataset': 'test'\n}\n\n\ndef check(candidate):\n"
             "    assert candidate([]) == 0\n    assert candidate([1, 2, 4]) == 2\n    assert is_even(2)\n"),
    "entry_point": "count_even",
}


def _jsonl(path: Path, *records) -> Path:
    path.write_text("\n".join(json.dumps(r) for r in records) + "\n")
    return path


def _pytest(workdir: Path, files: dict, tests: list[str]) -> int:
    for rel, content in files.items():
        target = workdir / rel
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_bytes(content.encode() if isinstance(content, str) else content)
    return subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", *tests],
                          cwd=workdir, capture_output=True, timeout=120).returncode


@pytest.mark.parametrize("kind, record", [("humaneval", HUMANEVAL), ("mbpp", MBPP), ("humaneval", HUMANEVAL_HELPER),
                                          ("mbpp", MBPP_HELPER_FIRST), ("mbpp", MBPP_SANITIZED)])
def test_python_importers_reference_passes_and_stub_fails(tmp_path, kind, record):
    [task] = import_source(kind, _jsonl(tmp_path / "src.jsonl", record))
    assert task.family == "python" and task.checker["tests"] == ["test_hidden.py"]
    tests = ["test_hidden.py"]
    stub_dir, ref_dir = tmp_path / "stub", tmp_path / "ref"
    stub_dir.mkdir(), ref_dir.mkdir()
    assert _pytest(stub_dir, {**task.files, **task.hidden}, tests) != 0
    ref = {**task.files, **task.hidden, "solution.py": task.hidden["reference.py"]}
    assert _pytest(ref_dir, ref, tests) == 0


def test_mbpp_stub_and_instruction_name_the_function_the_tests_call(tmp_path):
    helper_first, sanitized = import_source("mbpp", _jsonl(tmp_path / "m.jsonl", MBPP_HELPER_FIRST, MBPP_SANITIZED))
    assert helper_first.files["solution.py"].startswith("def sum_squares(xs):")
    assert "`sum_squares(xs)`" in helper_first.instruction and "\r" not in helper_first.hidden["reference.py"]
    assert sanitized.instruction.startswith("Write a function to find the shared elements")
    assert sanitized.hidden["test_hidden.py"].startswith("import math\n")


def test_an_mbpp_record_without_a_description_names_the_fields(tmp_path):
    record = {k: v for k, v in MBPP.items() if k != "text"}
    with pytest.raises(ImportSourceError, match="m.jsonl:1: needs a non-empty 'text' .or 'prompt'."):
        import_source("mbpp", _jsonl(tmp_path / "m.jsonl", record))


def test_math_importer_accepts_question_or_problem(tmp_path):
    src = _jsonl(tmp_path / "m.jsonl", {"question": "1+1?", "answer": "2"},
                 {"problem": "2+2?", "answer": 4, "id": "four"})
    a, b = import_source("math", src)
    assert a.checker == {"kind": "math", "answer": "2"} and a.hidden["answer.txt"] == "2"
    assert b.name == "math/four" and "\\boxed" in b.instruction


def test_math_gold_answers_from_gsm8k_and_math_records(tmp_path):
    gsm8k = {"question": "Natalia sold 48 clips in April and half as many in May. How many in all?",
             "answer": "In May she sold 48/2 = <<48/2=24>>24 clips.\nIn all 48+24 = <<48+24=72>>72.\n#### 72"}
    big = {"question": "q", "answer": "It is 1,000 + 234 = 1234.\n#### 1,234"}
    math_record = {"problem": "What is $\\frac{1}{2} + \\frac{1}{4}$?", "level": "Level 1", "type": "Algebra",
                   "solution": "First $\\boxed{x}$ is a distractor; the sum is $\\boxed{\\frac{3}{4}}$."}
    a, b, c = import_source("math", _jsonl(tmp_path / "m.jsonl", gsm8k, big, math_record))
    assert a.checker["answer"] == "72" and b.checker["answer"] == "1234"
    assert c.checker["answer"] == "\\frac{3}{4}" and c.hidden["answer.txt"] == "\\frac{3}{4}"
    with pytest.raises(ImportSourceError, match="m2.jsonl:1: no 'answer', and 'solution' has no"):
        import_source("math", _jsonl(tmp_path / "m2.jsonl", {"problem": "p", "solution": "it is 3"}))


@pytest.mark.parametrize("line, message", [
    ("{not json", "src.jsonl:2: not valid JSON"),
    (json.dumps({"answer": "1"}), "src.jsonl:2: needs a non-empty 'question'"),
    (json.dumps({"question": "q"}), "src.jsonl:2: missing field 'answer'"),
])
def test_a_bad_record_names_file_and_line(tmp_path, line, message):
    src = tmp_path / "src.jsonl"
    src.write_text(json.dumps({"question": "ok", "answer": "1"}) + "\n" + line + "\n")
    with pytest.raises(ImportSourceError, match=message.replace("'", ".").replace("(", ".")):
        import_source("math", src)


def test_package_directory_import(tmp_path):
    [task] = import_source("humaneval", _jsonl(tmp_path / "h.jsonl", HUMANEVAL))
    write_package(task, tmp_path / "pkgs" / "one")
    [again] = import_source("package", tmp_path / "pkgs")
    assert again.task_id == task.task_id


# -- SWE-style: a real repository ------------------------------------------------------------

def _git(cwd: Path, *argv: str) -> str:
    env = {**os.environ, "GIT_AUTHOR_NAME": "t", "GIT_AUTHOR_EMAIL": "t@x", "GIT_COMMITTER_NAME": "t",
           "GIT_COMMITTER_EMAIL": "t@x", "HOME": str(cwd)}
    return subprocess.run(["git", *argv], cwd=cwd, env=env, check=True, capture_output=True,
                          text=True).stdout.strip()


TEST_PATCH = """diff --git a/tests/test_calc.py b/tests/test_calc.py
--- a/tests/test_calc.py
+++ b/tests/test_calc.py
@@ -3,3 +3,7 @@ from calc import add
 
 def test_add():
     assert add(1, 2) == 3
+
+
+def test_add_negative():
+    assert add(-1, -2) == -3
"""


@pytest.fixture
def swe_repo(tmp_path) -> dict:
    repo = tmp_path / "upstream"
    (repo / "tests").mkdir(parents=True)
    _git(repo, "init", "-q", "-b", "main")
    (repo / "calc.py").write_text("def add(a, b):\n    return abs(a) + abs(b)\n")
    (repo / "tests" / "test_calc.py").write_text(
        "from calc import add\n\n\ndef test_add():\n    assert add(1, 2) == 3\n")
    _git(repo, "add", "-A"), _git(repo, "commit", "-qm", "initial")
    _git(repo, "tag", "v0.1")
    (repo / "README").write_text("calc\n")
    _git(repo, "add", "-A"), _git(repo, "commit", "-qm", "readme")
    base = _git(repo, "rev-parse", "HEAD")
    (repo / "calc.py").write_text("def add(a, b):\n    return a + b  # THE-FUTURE-FIX\n")
    _git(repo, "commit", "-qam", "fix negative add")
    future = _git(repo, "rev-parse", "HEAD")
    _git(repo, "tag", "v0.2")
    _git(repo, "remote", "add", "origin", "https://example.invalid/calc.git")
    _git(repo, "branch", "feature", future)
    spec = {"instance_id": "calc__calc-1", "repo": "upstream", "base_commit": base,
            "problem_statement": "add() is wrong for negative numbers.", "test_patch": TEST_PATCH,
            "FAIL_TO_PASS": ["tests/test_calc.py::test_add_negative"],
            "PASS_TO_PASS": ["tests/test_calc.py::test_add"]}
    return {"src": _jsonl(tmp_path / "swe.jsonl", spec), "base": base, "future": future}


def test_swe_import_scrubs_history_beyond_base_tags_remotes_and_reflogs(tmp_path, swe_repo):
    [task] = import_source("swe", swe_repo["src"])
    assert task.family == "swe" and task.name == "swe/calc__calc-1"
    assert task.checker["fail_to_pass"] == ["tests/test_calc.py::test_add_negative"]
    assert task.protected == ("tests/test_calc.py",)
    assert "test_add_negative" in task.hidden["tests/test_calc.py"]
    assert "test_add_negative" not in task.files["tests/test_calc.py"]
    blob = b"".join(v if isinstance(v, bytes) else v.encode() for v in task.files.values())
    assert b"THE-FUTURE-FIX" not in blob
    # Materialise the package's visible tree and ask git itself.
    bank = TaskBank(tmp_path / "bank")
    pkg = bank.put_task(task)
    work = pkg / "files"
    assert _git(work, "rev-parse", "HEAD") == swe_repo["base"]
    assert _git(work, "log", "--format=%s") == "readme\ninitial"
    assert _git(work, "tag", "-l") == "" and _git(work, "remote") == ""
    assert _git(work, "for-each-ref", "--format=%(refname)") == "refs/heads/main"
    assert not (work / ".git" / "logs").exists() and not (work / ".git" / "hooks").exists()
    missing = subprocess.run(["git", "cat-file", "-e", swe_repo["future"]], cwd=work,
                             capture_output=True)
    assert missing.returncode != 0
    assert _git(work, "status", "--porcelain") == ""
    # The hidden test fails on the base commit: fail-to-pass really fails before a fix.
    run = tmp_path / "run"
    run.mkdir()
    files = {k: v for k, v in task.files.items() if not k.startswith(".git/")}
    assert _pytest(run, {**files, **{k: v for k, v in task.hidden.items() if k.endswith(".py")}},
                   ["tests/test_calc.py"]) != 0


def test_swe_import_with_an_unknown_base_commit_names_it(tmp_path, swe_repo):
    rec = json.loads(swe_repo["src"].read_text())
    rec["base_commit"] = "0" * 40
    src = _jsonl(tmp_path / "bad.jsonl", rec)
    with pytest.raises(ImportSourceError, match="base commit '0000"):
        import_source("swe", src)


def test_cli_import_heldout_runs_the_contamination_check(tmp_path):
    from controller.cli.main import build_parser
    bank = tmp_path / "bank"
    train = _jsonl(tmp_path / "train.jsonl", HUMANEVAL, {**HUMANEVAL, "task_id": "HumanEval/1",
                                                         "entry_point": "add", "test": HUMANEVAL["test"] + "\n"})
    held = _jsonl(tmp_path / "held.jsonl", {**HUMANEVAL, "task_id": "Held/0"})
    for src, name, split in ((train, "he-train", "train"), (held, "he-held", "heldout")):
        out = io.StringIO()
        args = build_parser().parse_args(["tasks", "--bank", str(bank), "import", "humaneval",
                                          str(src), "--set", name, "--split", split])
        assert args.func(args, out=out) == 0
    assert "contamination he-held vs he-train: 2 suspect(s)" in out.getvalue()
    report = json.loads((bank / "contamination" / "he-held--he-train.json").read_text())
    assert report["suspects"][0]["heldout_name"] == "humaneval/Held_0"


def test_swe_test_ids_may_be_json_encoded_strings_as_in_the_public_files(tmp_path, swe_repo):
    rec = json.loads(swe_repo["src"].read_text())
    rec["repo"] = str(swe_repo["src"].parent / rec["repo"])
    rec["FAIL_TO_PASS"] = json.dumps(rec["FAIL_TO_PASS"])
    rec["PASS_TO_PASS"] = "[]"
    [task] = import_source("swe", _jsonl(tmp_path / "swe.jsonl", rec))
    assert task.checker["fail_to_pass"] == ["tests/test_calc.py::test_add_negative"]
    assert task.checker["pass_to_pass"] == []
    rec["FAIL_TO_PASS"] = "tests/test_calc.py::test_add_negative"      # not a JSON list
    with pytest.raises(ImportSourceError, match="bad.jsonl:1: 'FAIL_TO_PASS' is a string but not a JSON list"):
        import_source("swe", _jsonl(tmp_path / "bad.jsonl", rec))


def test_gzipped_jsonl_is_read_and_a_binary_file_is_a_named_error(tmp_path):
    import gzip
    plain = _jsonl(tmp_path / "he.jsonl", HUMANEVAL)
    gz = tmp_path / "HumanEval.jsonl.gz"
    gz.write_bytes(gzip.compress(plain.read_bytes()))
    assert [t.task_id for t in import_source("humaneval", gz)] == [t.task_id for t in import_source("humaneval", plain)]
    junk = tmp_path / "junk.jsonl"
    junk.write_bytes(b"\xff\xfe\x00binary")
    with pytest.raises(ImportSourceError, match="junk.jsonl: not UTF-8 JSON lines"):
        import_source("humaneval", junk)
    truncated = tmp_path / "cut.jsonl.gz"
    truncated.write_bytes(gz.read_bytes()[:20])
    with pytest.raises(ImportSourceError, match="cut.jsonl.gz: not UTF-8 JSON lines"):
        import_source("humaneval", truncated)
