"""An answer must be read whole (nodeagent/verifier/mathleft.py) and the rules for units, currency,
named assignments, percent and indeterminate forms (docs/verifier.md, "An answer is read whole").
Each class: its wrong answers fail, its right answers pass."""
from __future__ import annotations

import pytest

from nodeagent.verifier.mathanswer import math_verdict

WRONG = [
    # A: a mixed number with a vulgar fraction is never one fraction
    ("A", "\\frac{11}{2}", "1½"), ("A", "\\frac{23}{4}", "2¾"), ("A", "5.5", "1½"), ("A", "\\frac{11}{2}", "Answer: 1½"),
    # B: an unknown command is not dropped with its argument
    ("B", "5", "5\\textsuperscript{2}"), ("B", "5", "5\\textsubscript{2}"), ("B", "5", "5\\todo{6}"),
    ("B", "5", "5\\marginpar{6}"), ("B", "5", "5\\ensuremath{^2}"), ("B", "5", "\\textsuperscript{6}"),
    ("B", "5", "5\\unskip{}^2"), ("B", "5", "The answer is \\boxed{5\\sidenote{6}}."),
    # C: an unknown prefix symbol is not dropped
    ("C", "5", "\\neg 5"), ("C", "5", "\\exists 5"), ("C", "5", "\\forall 5"), ("C", "5", "\\setminus 5"),
    ("C", "5", "\\emptyset 5"), ("C", "5", "\\varnothing 5"), ("C", "5", "\\mod 5"), ("C", "5", "\\aleph 5"),
    ("C", "5", "\\S 5"), ("C", "5", "\\#5"), ("C", "5", "\\dagger 5"),
    # D: a dangling operator is not ignored
    ("D", "5", "5-"), ("D", "5", "5+"), ("D", "5", "5/"), ("D", "5", "5^"), ("D", "5", "5 \\times"),
    ("D", "5", "5 \\cdot"), ("D", "5", "5 \\div"), ("D", "5", "5 \\pm"), ("D", "5", "5 *"), ("D", "5", "\\times 5"),
    ("D", "5", "/5"), ("D", "5", "\u202e5-"), ("D", "-5", "\u202e5-"), ("D", "(5, 6)", "(5-, 6)"),
    # E: a unit to a power, or a rate, is not the unit
    ("E", "5\\text{ m}", "5\\text{ m}^{-1}"), ("E", "5\\text{ m}", "5\\,\\mathrm{m}^{-1}"),
    ("E", "5 \\text{ cm}", "5\\text{ cm}^{-1}"), ("E", "5\\text{ hours}", "5\\text{ per hour}"),
    ("E", "5\\text{ hours}", "5\\text{ /h}"), ("E", "5\\text{ m}^2", "5\\text{ m}^{-2}"),
    # F: cents are not dollars, both ways, in every spelling
    ("F", "5\\text{ cents}", "\\$5"), ("F", "5\\text{ cents}", "5\\$"), ("F", "\\$5", "5¢"), ("F", "\\$5", "5\\cent"),
    ("F", "\\$5", "5\\textcent"), ("F", "\\$5", "5₽"),
    # G: named values are bound to their names, in the gold's order
    ("G", "x=1, y=2", "(2,1)"), ("G", "x=1, y=2", "2, 1"), ("G", "x=1, y=2", "\\{2,1\\}"),
    ("G", "m=4, n=9", "(9, 4)"), ("G", "x=1, y=2, z=3", "(3,2,1)"), ("G", "x=1, y=2", "y=1, x=2"),
    # H: a percent of a proportion is a hundred times smaller
    ("H", "0.25", "0.25\\%"), ("H", "0.5", "0.5\\%"), ("H", "0.25", "0.25 \\text{ percent}"),
    ("H", "\\frac{1}{4}", "\\frac{1}{4}\\%"), ("H", "0.5", "0.5 \\text{ per cent}"), ("H", "0.02", "0.02\\%"),
    # I: an indeterminate form or arithmetic with infinity is not a value
    ("I", "1", "0^0"), ("I", "0", "0^0"), ("I", "0", "\\frac{1}{\\infty}"), ("I", "0", "\\frac{5}{\\infty}"),
    ("I", "1", "\\infty^0"), ("I", "1", "1^{\\infty}"), ("I", "0", "0 \\cdot \\infty"), ("I", "0", "\\infty^{-1}"),
    # J: an arrow statement is not its right side
    ("J", "5", "6 \\mapsto 5"), ("J", "5", "x \\to 5"), ("J", "5", "f: 6 \\mapsto 5"), ("J", "5", "x \\searrow 5"),
    ("J", "5", "n \\rightarrow 5"), ("J", "5", "x \\downarrow 5"), ("J", "5", "6 → 5"),
    # K: a prime mark is not dropped
    ("K", "5", "5′"), ("K", "5", "5″"), ("K", "5", "5‴"), ("K", "5", "5ʹ"), ("K", "5^\\circ", "5′"),
    ("K", "5 \\text{ feet}", "5″"),
    # a lone surrogate or another unknown character is not dropped
    ("X", "5", "\\boxed{5\udcff}"), ("X", "5", "5\u2020"),
    # the same class, other spellings: an unclosed bracket, a command without its arguments, a stray symbol
    ("X", "5", "\\lbrace 5"), ("X", "5", "\\langle 5"), ("X", "5", "\\Big( 5"), ("X", "5", "\\frac 5"), ("X", "5", "5\\sqrt"),
    ("X", "5", "5\\circ"), ("X", "5", "\\ast 5"), ("X", "5", "\\ldots 5"), ("X", "5", "5#"), ("X", "5", "5&"), ("X", "5", "5;"),
    ("X", "5", "5\\\\"), ("X", "5", "5\\&"), ("X", "5", "\\deg 5"), ("X", "5", "\\e 5"),
]

RIGHT = [
    ("A", "\\frac{3}{2}", "1½"), ("A", "\\frac{11}{4}", "2¾"), ("A", "\\frac{17}{8}", "2⅛"), ("A", "\\frac{1}{2}", "½"),
    ("B", "5", "\\boxed{5}"), ("B", "5", "\\mathrm{5}"), ("B", "5", "\\relax 5"), ("B", "5", "\\displaystyle 5"),
    ("B", "\\frac{1}{2}", "\\left(\\dfrac{1}{2}\\right)"), ("B", "5", "$5$"), ("B", "5", "\\quad 5\\,"),
    ("C", "\\mathbb{R} \\setminus \\{0\\}", "\\mathbb{R}\\setminus\\{0\\}"), ("C", "\\emptyset", "\\varnothing"),
    ("C", "2\\pi", "2\\pi"), ("C", "\\alpha", "\\alpha"),
    ("D", "-5", "-5"), ("D", "[-1, 1]", "[-1,1]"), ("D", "(-\\infty, 3)", "(-\\infty, 3)"), ("D", "92", "hence **92**."),
    ("D", "\\pm 2", "\\pm 2"), ("D", "-5", "–5"),
    ("E", "5\\text{ m}", "5\\text{ m}"), ("E", "5\\text{ m}^2", "5 \\text{ m}^2"), ("E", "5\\text{ km/h}", "5\\text{ km per hour}"),
    ("E", "5\\text{ hours}", "5 \\text{ h}"),
    ("F", "\\$5", "5\\text{ dollars}"), ("F", "\\$5", "\\$5"), ("F", "5\\text{ cents}", "5 \\text{ cents}"),
    ("G", "x=1, y=2", "(1,2)"), ("G", "x=1, y=2", "x=1, y=2"), ("G", "x=1, y=2", "y=2, x=1"),
    ("G", "x=1, y=2, z=3", "(1, 2, 3)"),
    ("H", "0.25", "25\\%"), ("H", "50", "50\\%"), ("H", "0.005", "0.5\\%"), ("H", "0.25", "0.25"),
    ("I", "1", "1"), ("I", "\\infty", "\\infty"), ("I", "0", "0"),
    ("J", "5", "x = 5"), ("J", "x \\to 5", "x \\to 5"), ("J", "5", "x \\equiv 5"), ("J", "5", "x ≡ 5"),
    ("X", "\\frac{1}{2}", "\\frac12"), ("X", "(1, 2]", "(1, 2]"), ("X", "1, 2, 3", "1, 2, 3"), ("X", "5", "\\text{5}"), ("X", "(1,2,3)", "\\langle 1,2,3\\rangle"),
    ("X", "\\begin{pmatrix}1 & 2\\\\ 3 & 4\\end{pmatrix}", "\\begin{pmatrix}1&2\\\\3&4\\end{pmatrix}"),
    ("K", "5^\\circ", "5^\\circ"), ("K", "5^\\circ", "5^{\\circ}"), ("K", "\\sqrt{3}", "√3"), ("K", "2\\sqrt{3}", "2√3"),
]


@pytest.mark.parametrize("cls,gold,pred", WRONG, ids=[f"{c}:{p}" for c, _, p in WRONG])
def test_a_wrong_answer_of_each_class_fails(cls, gold, pred):
    verdict = math_verdict(gold, pred)
    assert verdict["ok"] is False, f"{cls}: {pred!r} accepted for {gold!r}: {verdict['detail']}"
    assert "error" not in verdict["detail"]          # a reward 0 for the answer, never an infrastructure error


@pytest.mark.parametrize("cls,gold,pred", RIGHT, ids=[f"{c}:{p}" for c, _, p in RIGHT])
def test_a_right_answer_of_each_class_passes(cls, gold, pred):
    verdict = math_verdict(gold, pred)
    assert verdict["ok"] is True, f"{cls}: {pred!r} rejected for {gold!r}: {verdict['detail']}"


def test_the_detail_names_what_was_left_over():
    assert "\\textsuperscript" in math_verdict("5", "5\\textsuperscript{2}")["detail"]
    assert "dangling operator" in math_verdict("5", "5 \\times")["detail"]
    assert "PRIME" in math_verdict("5", "5′")["detail"]


def test_a_percent_of_a_whole_number_gold_is_still_read_as_the_count():
    assert math_verdict("2", "2\\%")["ok"] is True          # Hendrycks' rule: "what percent" golds are counts
    assert math_verdict("0.25", "0.25\\%", "What percent of the class passed?")["ok"] is True


def test_an_infinity_arithmetic_verdict_does_not_depend_on_time():
    for _ in range(3):
        assert math_verdict("0", "\\frac{1}{\\infty}")["ok"] is False
