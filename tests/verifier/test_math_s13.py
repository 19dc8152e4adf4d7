"""Red team s13m, Part A (nodeagent/verifier/mathbox.py and the rules it feeds): a \\boxed{} counts
only when it stands as the answer; long answers and golds are read whole; an instruction's
precision count is read whole; base subscripts, a \\pm inside an expression, condition words on
an answer line, primes on letters, value-changing words, named tuples, '..' ranges and colour
names. Each class: its wrong answers fail, its right answers pass."""
from __future__ import annotations

import pytest

from nodeagent.verifier import mathnorm
from nodeagent.verifier.mathanswer import math_verdict

PAD = "\\," * 100
POLY = " + ".join(f"{k}x^{{{k}}}" for k in range(1, 30))

WRONG = [
    # A1: something in the same formula, or a word right next to it, operates on the box
    ("A1", "5", "x \\ne \\boxed{5}"), ("A1", "5", "The answer is not \\boxed{5}."), ("A1", "5", "10-\\boxed{5}"),
    ("A1", "5", "-\\boxed{5}"), ("A1", "5", "\\boxed{5}^2"), ("A1", "5", "\\frac{1}{\\boxed{5}}"), ("A1", "5", "\\boxed{5}0"),
    ("A1", "5", "\\boxed{5}!"), ("A1", "5", "\\boxed{5}\\%"), ("A1", "5", "\\boxed{5}\\times 10^3"),
    ("A1", "5", "\\boxed{5}\\text{ (or 6)}"), ("A1", "5", "\\boxed{5}\\text{ thousand}"), ("A1", "5", "x > \\boxed{5}"),
    ("A1", "5", "\\not\\boxed{5}"), ("A1", "5", "\\pm\\boxed{5}"), ("A1", "5", "\\boxed{5}_{8}"), ("A1", "5", "\\boxed{5} or not"),
    ("A1", "5", "$$x \\ne \\boxed{5}$$"), ("A1", "5", "\\[10 - \\boxed{5}\\]"), ("A1", "5", "\\boxed{5}/2"),
    ("A1", "5", "\\frac{\\boxed{5}}{2}"), ("A1", "5", "\\fbox{5}^2"), ("A1", "5", "at least \\boxed{5}"),
    ("A1", "5", "$\\boxed{5}$ (for odd $n$)"), ("A1", "5", "\\boxed{5}\\text{ cm}^{-1}"), ("A1", "5", "2\\boxed{5}"),
    ("A1", "5", "So \\boxed{5}.\n\nWait, that is wrong. The answer is 6."),
    # A2: a long bare answer is read whole, never as its first number
    ("A2", "5", "5" + PAD + "^{2}"), ("A2", "5", "5" + PAD + "!"), ("A2", "5", "5" + PAD + "+1"),
    ("A2", "5", "5" + "{}" * 100 + "0"), ("A2", "2", "2^{" * 100 + "2" + "}" * 100),
    # A2b: a long gold is read whole
    ("A2b", POLY, "\\boxed{29}"), ("A2b", POLY, "29"), ("A2b", POLY, POLY.replace("15x^{15}", "16x^{15}")),
    # A3: base subscripts
    ("A3", "1010_2", "1010_7"), ("A3", "1010_2", "1010_{16}"), ("A3", "1010_2", "1010_{1}"), ("A3", "1010_2", "1010_{x}"),
    ("A3", "12_3", "12"), ("A3", "12_3", "12_4"),
    # A4: a \pm inside an expression
    ("A4", "2", "(\\pm 2)^2"), ("A4", "2", "(\\pm 2)+1"), ("A4", "2", "(\\pm 1)\\cdot 2"), ("A4", "2", "\\left(\\pm 2\\right)^{2}"),
    # A5/A6: bound, condition and hijack words on an answer line or in a box
    ("A5", "5", "Answer: at least 5"), ("A5", "5", "Answer: no more than 5"), ("A5", "5", "Answer: 5 maximum"),
    ("A5", "5", "Answer: 5 (minimum)"), ("A5", "5", "#### at least 5"), ("A5", "5", "5 \\text{ if } n \\text{ is odd}"),
    ("A5", "5", "\\boxed{5 \\text{ if } n \\text{ even}}"), ("A6", "2", "Answer: 5 when x = 2"),
    ("A6", "2", "Answer: 5 assuming a=2"), ("A6", "2", "The answer is 5 when $x = 2$."), ("A6", "2", "Answer: $5$, with $x=2$"),
    # A7: primes on letters
    ("A7", "f(x)", "f'(x)"), ("A7", "x", "x'"), ("A7", "a+b", "a'+b"), ("A7", "x", "(x)'"), ("A7", "f'(x)", "f(x)"),
    # A8: words that change the value
    ("A8", "5", "5 \\text{ negative}"), ("A8", "5", "5\\text{ (minus)}"), ("A8", "5", "5 \\text{ inverse}"),
    ("A8", "5", "5\\text{ hundredths}"), ("A8", "5", "5 \\text{ tens}"), ("A8", "5", "5\\text{ ppm}"), ("A8", "90", "90 \\text{ rad}"),
    # A9: a named tuple, swapped
    ("A9", "x=1, y=2", "(x,y)=(2,1)"), ("A9", "x=1, y=2", "(y,x)=(1,2)"),
    # A11, A12: a '..' range; a colour over part of the answer
    ("RR", "\\frac{1}{2}", "{1 \\over 3}"), ("RR", "5", "5\\hspace{1cm}6"), ("A11", "3", "3..5"),
    ("A14", "56", "\u202e56"), ("A14", "56", "\\boxed{\u202e56}"), ("A11", "1", "1..2"), ("A12", "5", "5\\color{white}{6}"), ("A12", "5", "5{\\color{white}6}"),
    ("A12", "5", "5\\textcolor{white}{6}"), ("A12", "\\frac{1}{2}", "\\frac{1}{2}\\textcolor{white}{3}"),
]

RIGHT = [
    ("A1", "5", "Therefore the answer is \\boxed{5}."), ("A1", "5", "$x = \\boxed{5}$"), ("A1", "5", "\\[ \\boxed{5} \\]"),
    ("A1", "5", "The answer is $\\boxed{5}$."), ("A1", "5", "\\fbox{5}"), ("A1", "5", "**Answer:** \\boxed{5}"),
    ("A1", "\\{2, 3\\}", "The roots are \\boxed{2} and \\boxed{3}."), ("A1", "5", "\\text{Answer: }\\boxed{5}"),
    ("A1", "5", "$$\\boxed{5}$$"), ("A1", "5", "\\boxed{5} \\text{ apples}"), ("A1", "90^\\circ", "\\boxed{90} degrees"),
    ("A1", "5", "\\textbf{\\boxed{5}}"), ("A1", "5", "**\\boxed{5}**"), ("A1", "9", "$129^{34} \\equiv \\boxed{9} \\pmod{11}$"),
    ("A1", "5", "\\boxed{5}\n\nThe answer is 5."), ("A1", "4", "\\boxed{\\frac{8}{2}} = \\boxed{4.0}"),
    ("A1", "\\{2, 3\\}", "\\boxed{2} or \\boxed{3}"), ("A1", "\\{2, 3\\}", "$x = \\boxed{2}$ or $x = \\boxed{3}$"),
    ("A1", "5", "so there are $\\boxed{5}$ distinct possible values for $B$."), ("A1", "5", "is \\(\\boxed{5}\\).</think> Done"),
    ("A2", "5", "5" + PAD), ("A2b", POLY, POLY), ("A2b", POLY, "\\boxed{" + POLY + "}"),
    ("A3", "1010_2", "1010_{2}"), ("A3", "12_3", "5"), ("A3", "12_3", "12_3"),
    ("A5", "5", "Answer: 5"), ("A5", "5", "#### 5"), ("A5", "5", "Answer: $5$ apples"),
    ("A5", "19", "Final Answer: The maximum number of points in the domain of $f(x)$ is 19."),
    ("RR", "\\frac{1}{2}", "{1 \\over 2}"), ("RR", "5", "5\\hspace{1cm}"), ("RR", "5", "5\\kern1em"), ("RR", "5", "5\\mkern3mu"),
    ("A14", "5", "\u202e5\u202c"), ("A14", "5", "\u20665\u2069"), ("A7", "f'(x)", "f'(x)"), ("A9", "x=1, y=2", "(x,y)=(1,2)"), ("A4", "\\pm 2", "\\pm 2"),
]


@pytest.mark.parametrize("cls,gold,pred", WRONG)
def test_a_wrong_answer_of_each_s13_class_fails(cls, gold, pred):
    assert math_verdict(gold, pred)["ok"] is False, (cls, gold, pred)


@pytest.mark.parametrize("cls,gold,pred", RIGHT)
def test_a_right_answer_of_each_s13_class_passes(cls, gold, pred):
    assert math_verdict(gold, pred)["ok"] is True, (cls, gold, pred)


@pytest.mark.parametrize("instruction,places,sig", [
    ("Give your answer to 100 decimal places.", 100, None), ("to 110 decimal places", 110, None),
    ("to 1000 decimal places", 1000, None), ("to 100 significant figures", None, 100), ("to 3 decimal places", 3, None),
])
def test_an_instructions_precision_count_is_read_whole(instruction, places, sig):
    asked = mathnorm.asked_precision(instruction)
    assert asked is not None and (asked.places, asked.sig) == (places, sig)


@pytest.mark.parametrize("gold,pred", [("\\pi", "3"), ("\\sqrt{2}", "1"), ("\\frac{1}{3}", "0"), ("\\pi", "3.1415926536")])
def test_a_coarse_approximation_fails_a_100_place_instruction(gold, pred):
    assert math_verdict(gold, pred, "Give your answer to 100 decimal places.")["ok"] is False


def test_a_gold_too_long_to_read_whole_is_a_gold_error_not_one_of_its_numbers():
    gold = " + ".join(f"{k}x^{{{k}}}" for k in range(1, 400))       # > MAX_ANSWER_CHARS
    verdict = math_verdict(gold, "\\boxed{399}")
    assert verdict["ok"] is False and "unparseable gold" in verdict["detail"]
