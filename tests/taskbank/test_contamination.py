"""Contamination check: MinHash LSH near-duplicates and Bloom n-gram overlap between sets."""
from __future__ import annotations

import io

import pytest

from controller.contracts.tasks import Task
from controller.taskbank.bank import TaskBank, make_set
from controller.taskbank.builtin import builtin_taskset
from controller.taskbank.contamination import ContaminationConfig, check

BUILTIN = builtin_taskset()
MATH = [t for t in BUILTIN.tasks if t.family == "math"]
PY = [t for t in BUILTIN.tasks if t.family == "python"]


def _math(name: str, question: str, answer: str = "1") -> Task:
    return Task(name=name, family="math", hidden={"answer.txt": answer},
                instruction="Solve the following problem. Put only the final answer in "
                            "\\boxed{...}.\n\n" + question, checker={"kind": "math", "answer": answer})


LONG_Q = ("A farmer has a rectangular field whose length is three times its width. He walks "
          "around the whole field once and covers four hundred metres. What is the area of the "
          "field in square metres?")


def test_a_reworded_copy_is_a_suspected_pair_and_unrelated_tasks_are_not():
    train = make_set("train", PY + [_math("math/field", LONG_Q)])
    copy = _math("held/field", LONG_Q.replace("A farmer", "Some farmer"), "7500")
    fresh = _math("held/primes", "How many prime numbers are there below one hundred?", "25")
    report = check(train, make_set("held", [copy, fresh], "heldout"))
    assert report.checked == 2
    [s] = report.suspects
    assert (s.heldout_name, s.train_name) == ("held/field", "math/field")
    assert s.jaccard >= 0.5 and s.ngram_overlap >= 0.5


def test_text_stitched_from_several_training_tasks_is_caught_by_ngram_overlap_alone():
    a, b = PY[0], PY[1]
    stitched = Task(name="held/stitched", family="python",
                    instruction=a.instruction + "\n" + b.instruction,
                    files={**a.files}, hidden={"test_hidden.py": a.hidden["test_hidden.py"]
                                               + b.hidden["test_hidden.py"]},
                    checker={"kind": "pytest", "tests": ["test_hidden.py"]})
    cfg = ContaminationConfig(jaccard_threshold=0.9, overlap_threshold=0.6)
    report = check(make_set("train", PY), make_set("held", [stitched], "heldout"), cfg)
    assert [s.heldout_name for s in report.suspects] == ["held/stitched"]
    assert report.suspects[0].ngram_overlap >= 0.6


def test_thresholds_are_configurable_and_validated():
    train = make_set("train", [_math("math/field", LONG_Q)])
    half = _math("held/half", " ".join(LONG_Q.split()[:18]) + " then multiply by nine hundred.")
    loose = check(train, make_set("h", [half], "heldout"),
                  ContaminationConfig(jaccard_threshold=0.2, overlap_threshold=0.3))
    strict = check(train, make_set("h", [half], "heldout"),
                   ContaminationConfig(jaccard_threshold=0.95, overlap_threshold=0.95,
                                       cosine_threshold=0.95))
    assert loose.suspects and not strict.suspects
    with pytest.raises(ValueError, match="jaccard_threshold"):
        ContaminationConfig(jaccard_threshold=0)


def test_cli_prints_pairs_with_scores_and_writes_the_report(tmp_path):
    from controller.cli.main import build_parser
    bank = TaskBank(tmp_path / "bank")
    bank.put_set(make_set("train", MATH + [_math("math/field", LONG_Q)]))
    bank.put_set(make_set("held", [_math("held/field", LONG_Q)], "heldout"))
    out = io.StringIO()
    args = build_parser().parse_args(["tasks", "--bank", str(bank.root), "contamination", "train",
                                      "held", "--jaccard", "0.6"])
    assert args.func(args, out=out) == 0
    text = out.getvalue()
    assert "1 suspect(s) among 1 held-out tasks" in text
    assert "held/field  ~  math/field  jaccard 1.000  ngram_overlap 1.000" in text
    assert (bank.root / "contamination" / "held--train.json").exists()
    args = build_parser().parse_args(["tasks", "--bank", str(bank.root), "contamination", "train",
                                      "nope"])
    assert args.func(args, out=io.StringIO()) == 2


def test_the_semantic_score_blends_prose_and_shape_for_code_and_is_the_cosine_otherwise():
    cfg = ContaminationConfig(code_cosine_threshold=0.54, code_prose_threshold=0.74,
                              code_structure_weight=0.5)
    assert cfg.semantic_score("math", 0.8, None) == 0.8
    assert cfg.semantic_score("python", 0.6, 1.0) == pytest.approx(0.8)
    assert cfg.semantic_score("python", 0.6, 0.0) == pytest.approx(0.3)
    # no comparable shape (a translation): the prose cosine at its own threshold
    assert cfg.semantic_score("swe", 0.74, None) == pytest.approx(cfg.code_cosine_threshold)
    assert cfg.semantic_score("swe", 0.70, None) < cfg.code_cosine_threshold
    with pytest.raises(ValueError, match="code_structure_weight"):
        ContaminationConfig(code_structure_weight=1.0)
    with pytest.raises(ValueError, match="code_prose_threshold"):
        ContaminationConfig(code_prose_threshold=0.0)
