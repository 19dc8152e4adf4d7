"""Math answers (`nodeagent.verifier.mathanswer`): judged like the best public graders, and
never fooled by the tricks a policy finds (sprays, near integers, lists read as numbers)."""
from __future__ import annotations

import json
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

pytest.importorskip("math_verify", reason="math-verify is not installed")

from nodeagent.verifier import mathanswer  # noqa: E402
from nodeagent.verifier.checks import CheckRunner  # noqa: E402

CASES = Path(__file__).resolve().parents[1] / "data" / "math_cases"


def _cases(name: str) -> list[dict]:
    rows = [json.loads(line) for line in (CASES / f"{name}.jsonl").read_text().splitlines() if line.strip()]
    return [r for r in rows if not r.get("excluded")]


def _box(s: str) -> str:
    return f"so the answer is $\\boxed{{{s}}}$."


# -- the public labelled cases ----------------------------------------------------------------

PUBLIC_SETS = ("math_verify", "hendrycks", "qwen", "lighteval", "nemo_skills", "mv_mixed")
MIN_AGREEMENT = 0.97
MAX_FALSE_POSITIVES_PER_50 = 1


def test_public_labelled_cases_agree_at_least_97_percent_with_at_most_one_wrong_accept_per_50(capsys):
    rows = [r for name in PUBLIC_SETS for r in _cases(name)]
    verdicts = [(r, mathanswer.math_equal(r["gold"], r["pred"])) for r in rows]
    agree = sum(v == r["expected"] for r, v in verdicts)
    rejects = sum(not r["expected"] for r in rows)
    false_pos = [r["origin"] for r, v in verdicts if v and not r["expected"]]
    with capsys.disabled():
        print(f"\nmath agreement on {len(rows)} public labelled cases ({', '.join(PUBLIC_SETS)}): "
              f"{agree}/{len(rows)} = {agree / len(rows):.3f}; wrong answers accepted: "
              f"{len(false_pos)}/{rejects} {false_pos}")
    assert len(rows) >= 390
    assert agree / len(rows) >= MIN_AGREEMENT, f"{agree}/{len(rows)}"
    assert len(false_pos) * 50 <= MAX_FALSE_POSITIVES_PER_50 * rejects, false_pos


def test_every_adversarial_case_is_judged_as_labelled():
    wrong = [(r["why"], r["gold"], r["pred"]) for r in _cases("adversarial")
             if mathanswer.math_equal(r["gold"], r["pred"]) is not r["expected"]]
    assert not wrong
    assert sum(not r["expected"] for r in _cases("adversarial")) >= 50


# -- the adversarial classes of issue 24 (one test per case: each fails alone if it is accepted) ---

ADVERSARIAL_CLASSES = _cases("adversarial_classes")


@pytest.mark.parametrize("case", ADVERSARIAL_CLASSES,
                         ids=[f"{r['class']}-{i}" for i, r in enumerate(ADVERSARIAL_CLASSES)])
def test_adversarial_class_case(case):
    t0 = time.monotonic()
    got = mathanswer.math_equal(case["gold"], case["pred"], case.get("instruction"))
    assert got is case["expected"], f"{case['why']}: gold={case['gold']!r} pred={case['pred'][:200]!r}"
    assert time.monotonic() - t0 < mathanswer.CHECK_BUDGET_S + 2 * mathanswer.VERIFY_TIMEOUT_S


def test_the_adversarial_set_covers_every_class_and_accepts_no_wrong_answer(capsys):
    must_reject = [r for r in ADVERSARIAL_CLASSES if not r["expected"]]
    accepted = [(r["class"], r["why"]) for r in must_reject
                if mathanswer.math_equal(r["gold"], r["pred"], r.get("instruction"))]
    classes = {r["class"] for r in must_reject}
    with capsys.disabled():
        print(f"\nmath adversarial set: {len(must_reject)} wrong answers in {len(classes)} classes, "
              f"{len(accepted)} accepted {accepted}")
    assert len(must_reject) >= 60
    assert classes >= {"multi-valued", "case", "relation", "tolerance", "list-set-interval", "option-letters",
                       "units-percent", "latex-tricks", "unicode", "huge"}
    assert not accepted


# -- the named failures of the old checker ----------------------------------------------------

@pytest.mark.parametrize("gold,pred", [
    ("10!", _box("3628803")), ("\\text{(E)}", _box("\\text{(B)}")), ("12", _box("1, 2")),
    ("2", _box("\\frac{1+\\sqrt{5}}{2}")), ("1234", _box("12,34")), ("(1,2)", _box("(2,1)")),
    ("[0,1)", _box("[0,1]")), ("\\{1,2\\}", _box("\\{1,2,3\\}")), ("\\frac{1}{3}", _box("0.3")),
    ("\\frac{1}{3}", _box("\\frac{333333}{1000000}")), ("10\\%", _box("20\\%")),
    ("\\frac{2}{3}", _box("0.67")), ("\\frac{1}{7}", _box("0.14")), ("\\frac{2}{3}", _box("0.6667")),
    ("3628800", _box("10!")),   # the computation restated, not done (docs/verifier.md, "Restatements")
])
def test_clearly_different_answers_are_rejected(gold, pred):
    assert not mathanswer.math_equal(gold, pred)


@pytest.mark.parametrize("gold,pred", [
    ("0.1", ".1"), ("\\frac{1}{2}", "\\frac{1}{2}"), ("10!", _box("3628800")), ("5050", "answer: 5,050"),
    ("14916", _box("14{,}916")), ("33.3", _box("\\frac{100}{3}")),
    ("\\text{(C)}", _box("\\text{C}")), ("\\{1,2\\}", _box("\\{2,1\\}")), ("10\\%", _box("10")),
    ("15\\mbox{ cm}^2", _box("15")), ("[-1, 2)", _box("[-1,2)")), ("x = 6", _box("6")),
])
def test_equivalent_answers_are_accepted(gold, pred):
    assert mathanswer.math_equal(gold, pred)


@pytest.mark.parametrize("text,ok", [
    (r"\boxed{3} or \boxed{5} or \boxed{4}", False),
    (r"\boxed{4} \boxed{7}", False),
    ("answer: 3\nanswer: 4", False),
    (r"so \boxed{4}. Final: \boxed{4}", True),
    (r"\boxed{\frac{8}{2}} = \boxed{4.0}", True),
])
def test_several_different_final_answers_pass_only_if_every_one_is_right(text, ok):
    assert mathanswer.math_equal("4", text) is ok


def test_a_set_gold_accepts_its_values_boxed_one_by_one():
    assert mathanswer.math_equal("\\{1,2,3\\}", r"\boxed{1}, \boxed{2}, \boxed{3}")
    assert not mathanswer.math_equal("\\{1,2,3\\}", r"\boxed{1}, \boxed{2}, \boxed{4}")


# -- the contract of checkers.answer_verdict ("math") -----------------------------------------

@pytest.mark.parametrize("gold,pred,ok", [
    ("1/2", "\\boxed{0.5}", True), ("3/8", "\\boxed{\\frac{3}{8}}", True), ("2\\sqrt{2}", "\\boxed{\\sqrt{8}}", True),
    ("1+\\sqrt{2}", "\\boxed{\\sqrt{2}+1}", True), ("720", "\\boxed{720^\\circ}", True),
    ("6", "x = 6, so \\boxed{x=6}", True), ("5050", "\\boxed{5051}", False), ("3/8", "\\boxed{3/7}", False),
    ("2\\sqrt{2}", "\\boxed{2\\sqrt{3}}", False), ("6", "passed", False),
])
def test_the_checkers_math_cases_hold(gold, pred, ok):
    assert mathanswer.math_equal(gold, pred) is ok


def test_a_verdict_is_ok_and_detail_and_says_why_nothing_was_found():
    assert mathanswer.math_verdict("5", "I cannot say") == {"ok": False, "detail": mathanswer.UNPARSEABLE}
    assert mathanswer.math_verdict("5", None)["detail"] == "no answer given"
    assert mathanswer.math_verdict("5", "   ") == {"ok": False, "detail": "no answer given"}
    v = mathanswer.math_verdict("5", _box("5"))
    assert v["ok"] is True and "extracted='5'" in v["detail"]


# -- bounded time, any thread -----------------------------------------------------------------

@pytest.mark.parametrize("pred", [_box("10^{10^{10^{10}}}"), "\\boxed{" * 5000, "x" * 1_000_000,
                                  _box("(1," * 300 + "2" + ")" * 300)])
def test_pathological_answers_fail_within_the_budget(pred):
    t0 = time.monotonic()
    assert mathanswer.math_verdict("5", pred)["ok"] is False
    assert time.monotonic() - t0 < mathanswer.CHECK_BUDGET_S + 2 * mathanswer.VERIFY_TIMEOUT_S


def test_checks_off_the_main_thread_work_without_signals():
    with ThreadPoolExecutor(2) as pool:
        got = list(pool.map(lambda p: (threading.current_thread() is threading.main_thread(),
                                       mathanswer.math_equal("\\frac{1}{2}", p)), [_box("0.5"), _box("0.6")]))
    assert got == [(False, True), (False, False)]


def test_the_isolated_check_runner_runs_it():
    with CheckRunner(preload=("nodeagent.verifier.mathanswer", "math_verify")) as runner:
        res = runner.run("nodeagent.verifier.mathanswer:math_verdict", ["10!", "\\boxed{3628800}"], timeout_s=30)
    assert res.outcome == "ok" and res.value["ok"] is True


# -- the built-in math tasks: the gold passes, a hedge around it does not ----------------------

def _builtin_math_golds() -> list[tuple[str, str]]:
    from controller.taskbank.builtin import builtin_taskset  # noqa: PLC0415 - only this test needs it
    return [(t.name, t.checker["answer"]) for t in builtin_taskset().tasks if t.family == "math"]


HEDGES = (r"\boxed{{{g} \lor {o}}}", r"\boxed{{x = {g}, x = {o}}}", r"\boxed{{\begin{{cases}} {g} \\ {o} \end{{cases}}}}",
          r"\boxed{{{g} (or {o})}}", r"answer: {o} \lor {g}", r"\boxed{{{o} = {g}}}", r"\boxed{{{g} \approx {o}}}",
          r"\boxed{{{g} \text{{ or }} {o}}}", r"\boxed{{\boxed{{{g}}} {o}}}")


@pytest.mark.parametrize("name,gold", _builtin_math_golds())
def test_builtin_math_gold_passes_and_no_hedge_around_it_does(name, gold):
    assert mathanswer.math_equal(gold, _box(gold)), name
    other = "1000003"
    accepted = [h for h in HEDGES if mathanswer.math_equal(gold, h.format(g=gold, o=other))]
    assert not accepted, (name, accepted)
