"""Contamination check quality on public labelled pairs (tests/data/contamination): the
calibration rule, and the defaults' recall and false-positive rate on held-out rephrasings."""
from __future__ import annotations

import pytest

from controller.cli.tasks import SandboxExecutor
from controller.taskbank import contamination_eval as ev
from controller.taskbank import semantic
from tests.conftest import sandbox_prerequisites


def _scored(label: bool, cos: float, domain: str = "math", passed: float = -1.0) -> ev.Scored:
    return ev.Scored("x", domain, "rephrase", label, minhash=0.0, ngram=0.0, semantic=cos,
                     execution=passed)


def test_calibration_picks_the_lowest_threshold_within_the_false_positive_target():
    negs = [_scored(False, c / 100) for c in range(50, 70)] + [_scored(False, 0.9)]
    pos = [_scored(True, 0.95), _scored(True, 0.75)]
    assert ev.calibrate(negs + pos, "semantic", max_fpr=0.05) == 0.70   # 1/21 negatives at 0.9
    assert ev.calibrate(negs + pos, "semantic", max_fpr=0.0) == 0.91


def test_code_rows_use_the_code_threshold():
    flag = ev.flag_stage({"semantic": 0.9, "semantic_code": 0.8}, "semantic")
    assert flag(_scored(True, 0.85, "code")) and not flag(_scored(True, 0.85, "math"))


def test_code_thresholds_are_chosen_together_with_execution():
    """Copies pass the tests at cosines 0.30-0.49; one clean item's neighbour passes them at
    0.45, and clean items reach cosine 0.59: with no false positive allowed, execution must
    start above 0.45 and the semantic threshold above 0.59."""
    pos = [_scored(True, (30 + c) / 100, "code", passed=(30 + c) / 100) for c in range(20)]
    neg = [_scored(False, c / 100, "code") for c in range(40, 60)] + [_scored(False, 0.45, "code", 0.45)]
    fitted = ev.calibrate_all(pos + neg, max_fpr=0.0)
    assert fitted["semantic_code"] >= 0.60 and fitted["execution"] == 0.46, fitted
    assert ev.rates(pos + neg, ev.flag_any({**ev.defaults(), **fitted}))[:2] == (0.2, 0.0)


def test_every_pair_row_is_labelled_split_and_sourced():
    rows = ev.load_pairs()
    assert {r["split"] for r in rows} == {"calib", "test"}
    assert {(r["domain"], r["variant"]) for r in rows} >= {("math", "rephrase"), ("code", "rephrase")}
    assert all(r["heldout"] and r["copy"] and r["heldout"] != r["copy"] for r in rows)


def heldout_rates(domain: str, cache_dir, executor=None):
    """(recall, FPR, positives, negatives) of the defaults on `domain`'s held-out rephrased pairs."""
    try:
        semantic.load_embedder()
    except semantic.SemanticUnavailable as exc:
        pytest.skip(str(exc))
    rows = [r for r in ev.load_pairs() if (r["domain"], r["variant"], r["split"]) == (domain, "rephrase", "test")]
    return ev.rates(ev.stage_scores(rows, cache_dir=cache_dir, executor=executor),
                    ev.flag_any(ev.defaults()))


@pytest.mark.slow
def test_the_defaults_catch_held_out_gsm8k_rephrasings_at_a_low_false_positive_rate(tmp_path):
    recall, fpr, npos, nneg = heldout_rates("math", tmp_path)
    assert (npos, nneg) == (199, 199)          # one source rephrasing is empty
    assert recall >= 0.85 and fpr <= 0.05      # measured: 0.930 and 0.020 (docs/tasks.md)


@pytest.mark.slow
def test_the_defaults_catch_held_out_humaneval_rephrasings_by_prose_shape_and_execution(tmp_path, python_image):
    """The held-out HumanEval tasks as the importer makes them (hidden tests included); their
    tests run in the farm's sandbox against the nearest training neighbours' code."""
    why = sandbox_prerequisites()
    if why:
        pytest.skip(why)
    with SandboxExecutor(str(python_image)) as executor:
        recall, fpr, npos, nneg = heldout_rates("code", tmp_path, executor)
    assert (npos, nneg) == (74, 74)
    assert recall >= 0.88 and fpr <= 0.055     # measured: 0.905 and 0.041 (docs/tasks.md)


@pytest.mark.slow
def test_without_a_sandbox_the_code_defaults_keep_a_low_false_positive_rate(tmp_path):
    recall, fpr, npos, nneg = heldout_rates("code", tmp_path)
    assert (npos, nneg) == (74, 74)
    assert recall >= 0.75 and fpr <= 0.085     # measured: 0.824 and 0.068 (docs/tasks.md)
