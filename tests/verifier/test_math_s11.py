"""Math checking, red team s11 (issue 24): restatements of the computation, and spellings of a
right answer the checker refused. Each case names the rule it rests on (docs/verifier.md, "Math
equivalence", "Restatements") or the public case it follows."""
from __future__ import annotations

import pytest

from nodeagent.verifier import mathform, mathops
from nodeagent.verifier.mathanswer import math_verdict


def _box(s: str) -> str:
    return f"The answer is $\\boxed{{{s}}}$."


# (gold, answer, instruction): must earn nothing
WRONG = [
    # a big operator the gold does not carry: the computation, not its value
    ("5050", "\\sum_{k=1}^{100} k", None), ("5050", "\\displaystyle\\sum\\limits_{k=1}^{100} k", None),
    ("1", "\\sum_{k=1}^{\\infty} \\frac{1}{2^k}", None), ("120", "\\prod_{k=1}^{5} k", None),
    ("120", "\\binom{10}{3}", None), ("120", "\\dbinom{10}{3}", None), ("120", "{10 \\choose 3}", None),
    ("120", "\\frac{10!}{3!\\,7!}", None), ("120", "5!", None), ("48", "6!!", None), ("120", "5 \\cdot 4!", None),
    ("120", "\\Gamma(6)", None), ("120", "\\Gamma\\left(6\\right)", None), ("\\frac{1}{2}", "\\int_0^1 x\\,dx", None),
    ("1", "\\lim_{x\\to 0}\\frac{\\sin x}{x}", None), ("6", "\\gcd(12,18)", None), ("12", "\\operatorname{lcm}(4,6)", None),
    ("7", "\\max(3,7)", None), ("7", "\\lfloor 7.5 \\rfloor", None), ("7", "\\lceil 6.5 \\rceil", None),
    ("2", "17 \\bmod 5", None), ("-2", "\\det\\begin{pmatrix}1&2\\\\3&4\\end{pmatrix}", None),
    ("-2", "\\begin{vmatrix}1&2\\\\3&4\\end{vmatrix}", None), ("6", "\\left.\\frac{d}{dx}x^2\\right|_{x=3}", None),
    ("120", "C(10,3)", None), ("120", "{}_{10}C_3", None), ("20", "P(5,2)", None),
    ("120", "\\binom{10}{3} = \\frac{10!}{3!7!}", None), ("120", "\\binom{10}{3} = 121", None),
    ("1", "\\frac{\\pi}{\\pi}", None), ("1", "e^{0}", None), ("-1", "e^{i\\pi}", None), ("-1", "i^2", None),
    ("1", "\\sum_{k=1}^{1} 1", None), ("5050", "\\operatorname*{sum}(1,\\ldots,100)", None),
    # variables that cancel, for a gold without any (the holdout of red team s11 found these)
    ("1", "\\cos^2 x + \\sin^2 x", None), ("1", "\\frac{x}{x}", None), ("3", "x - x + 3", None),
    ("3x^2", "\\frac{d}{dx} x^3", None), ("x^2 + C", "\\int 2x\\,dx", None), ("2^n", "\\sum_{k=0}^{n} \\binom{n}{k}", None),
    # an elementary function at a constant, the gold without a function
    ("\\frac{1}{2}", "\\sin 30^\\circ", None), ("\\frac{1}{2}", "\\cos\\frac{\\pi}{3}", None), ("3", "\\log_2 8", None),
    ("2", "\\lg 100", None), ("0", "\\ln 1", None), ("\\frac{\\pi}{4}", "\\arctan 1", None),
    ("\\frac{\\pi}{3}", "\\cos^{-1}\\frac{1}{2}", None), ("5", "e^{\\ln 5}", None), ("3", "\\text{log}_2 8", None),
    ("\\frac{1}{2}", "\\operatorname{sin}(\\pi/6)", None), ("\\pi", "4\\arctan(1)", None),
    # a radical or an absolute value where the gold is a rational number
    ("2", "\\sqrt{4}", None), ("3", "\\sqrt[3]{27}", None), ("2", "4^{1/2}", None), ("2", "\\frac{\\sqrt{8}}{\\sqrt{2}}", None),
    ("5", "|{-5}|", None), ("5", "\\left|-5\\right|", None), ("5", "\\lvert -5 \\rvert", None),
    # the instruction's own expression, or an expression of its numbers only
    ("391", "17 \\times 23", "What is $17 \\times 23$?"), ("391", "23 \\times 17", "What is $17 \\times 23$?"),
    ("\\frac{5}{6}", "\\frac{1}{2}+\\frac{1}{3}", "What is $\\frac{1}{2}+\\frac{1}{3}$?"),
    ("1024", "2^{10}", "Compute $2^{10}$."), ("5\\sqrt{2}", "\\sqrt{50}", "Simplify $\\sqrt{50}$."),
    ("x+1", "\\frac{x^2-1}{x-1}", "Simplify $\\frac{x^2-1}{x-1}$ for $x \\ne 1$."),
    ("\\frac{\\sqrt{2}}{2}", "\\frac{1}{\\sqrt{2}}", "Rationalize the denominator: $\\frac{1}{\\sqrt{2}}$."),
    ("12", "15\\% \\cdot 80", "What is $15\\%$ of 80?"), ("8", "\\frac{3+5}{1}", "There are 3 red and 5 blue balls. How many?"),
    ("4", "\\frac{12}{3}", "Find $x$ if $3x = 12$."), ("2", "\\frac42", "Compute $4 \\div 2$."), ("\\frac{1}{2}", "\\frac{4}{8}", "Simplify $\\frac{4}{8}$."),
    # the instruction asks for a form or a rounding the answer does not give
    ("3.14", "3.14159", "Round $3.14159$ to the nearest hundredth."), ("3.14", "\\pi", "Round $\\pi$ to the nearest hundredth."),
    ("33.3", "\\frac{100}{3}", "Give your answer to the nearest tenth."),
    ("\\frac{2}{5}", "0.4", "Express $0.4$ as a common fraction."),
    ("\\frac{1}{4}", "0.25", "What is the probability? Express your answer as a common fraction."),
    ("\\frac{2}{5}", "40\\%", "Express your answer as a common fraction."),
    ("\\frac{1}{3}", "0.\\overline{3}", "Express $0.\\overline{3}$ as a common fraction."),
    ("12", "\\frac{15}{100}\\cdot 80", "What is $15\\%$ of 80?"),
    ("0.125", "\\frac{1}{8}", "Express $\\frac{1}{8}$ as a decimal."),
    # another quantity: a unit against the gold's mark, a hedge word, arithmetic on infinity
    ("30^\\circ", "30\\text{ rad}", None), ("\\$12", "12\\text{ cents}", None), ("\\$12", "12\\text{ euros}", None), ("\\$12", "£12", None), ("12", "12^\\circ\\text{F}^2", None),
    ("5050", "5050\\text{-ish}", None), ("5050", "\\text{roughly } 5050", None), ("\\infty", "\\infty - 1", None),
    ("5050", "\\infty - \\infty + 5050", None),
    # an inequality is an interval only against a gold that is one for sure, and then exactly that one
    ("(3, 4)", "3 < x < 4", None), ("(-\\infty, 3)", "x \\le 3", None), ("(-\\infty, 3)", "x > 3", None),
    ("(-\\infty, 3)", "3 < x", None), ("[1, 2)", "1 < x \\le 2", None), ("(-\\infty, 3)", "\\{x : x > 3\\}", None),
    ("(-\\infty, 3)", "x < 3 < 4", None), ("(-\\infty, \\infty)", "\\mathbb{Z}", None),
    # a colour over part of the answer stays a mark; the empty set is not a set holding it
    ("5", "\\textcolor{white}{6}5", None), ("5", "{\\color{red}5}6", None), ("\\emptyset", "\\{\\emptyset\\}", None),
    # scientific notation read exactly: another exponent or fewer digits is another number
    ("6.02 \\times 10^{23}", "6.02 \\times 10^{22}", None), ("6.02 \\times 10^{23}", "6.0 \\times 10^{23}", None),
    ("6.02 \\times 10^{23}", "6.2e23", None),
]

# (gold, answer, instruction): must pass
RIGHT = [
    ("\\binom{10}{3}", "120", None), ("\\frac{10!}{3!7!}", "\\binom{10}{3}", None), ("10!", "3628800", None),
    ("\\log_2 3", "\\frac{\\ln 3}{\\ln 2}", None), ("\\sin 10^\\circ", "\\cos 80^\\circ", None), ("n!", "n!", None),
    ("120", "\\binom{10}{3} = 120", None), ("120", "120 = \\binom{10}{3}", None),
    ("8\\sqrt{3}", "\\sqrt{192}", None), ("4.123105625617661", "\\sqrt{17}", None),   # Math-Verify test_all (a decimal gold)
    ("10", "(9+1)", None),                                                          # Math-Verify test_latex_notation
    ("\\frac{40}{9}", "4 + 4/9", None),                                             # Math-Verify mixed-number tests
    ("33.3", "\\frac{100}{3}", None), ("120", "\\frac{10\\cdot 9\\cdot 8}{6}", None),
    ("x \\neq 3", "x != 3", None),                                                  # Math-Verify test_relations_math[4]
    ("391", "391", "What is $17 \\times 23$?"), ("3.14", "3.14", "Round $3.14159$ to the nearest hundredth."),
    ("\\frac{2}{5}", "\\frac{4}{10}", "Express $0.4$ as a common fraction."), ("2", "2", "Solve $2x + 3 = 7$ for $x$."),
    ("2^{10}", "2^{10}", "Which is larger, $2^{10}$ or $10^3$?"), ("x+1", "1+x", "Simplify $\\frac{x^2-1}{x-1}$."),
    ("\\frac{1}{2}", "1/2", "The probability of heads is $1/2$ for a fair coin. What is it for this coin?"),
    ("1500", "1.5 \\times 10^3", "Write 1500 in scientific notation (a power of 10, here 3)."),
    ("\\frac{5}{2}", "2\\frac{1}{2}", "Write 5/2 as a mixed number; 1 and 2 are digits."),
    ("0.125", "0.1250", "Express $\\frac{1}{8}$ as a decimal."),
    ("\\emptyset", "\\varnothing", None), ("\\varnothing", "\\emptyset", None), ("\\emptyset", "\\{\\}", None),
    ("\\emptyset", "∅", None),
    ("(-\\infty, 3)", "x < 3", None), ("(-\\infty, 3)", "3 > x", None), ("[1, 2)", "1 \\le x < 2", None),
    ("(0, \\infty)", "x > 0", None), ("(-\\infty, \\infty)", "\\mathbb{R}", None), ("[1, 2)", "2 > x \\geq 1", None),
    ("(-1, 1)", "-1 < x < 1", "Express your answer in interval notation."),
    ("(-\\infty, 3)", "\\{x \\mid x < 3\\}", "Solve $2x < 6$."),
    ("5050", "\\textcolor{red}{5050}", None), ("5050", "{\\color{blue}5050}", None), ("5050", "\\color{blue}{5050}", None),
    ("\\frac{1}{2}", "\\textcolor{red}{\\textcolor{blue}{\\frac{1}{2}}}", None),
    ("1+i", "1+\\mathrm{i}", None), ("3+4i", "3 + 4\\,i", None), ("e^2", "\\mathrm{e}^2", None),
    ("6.02 \\times 10^{23}", "6.02e23", None), ("6.02 \\times 10^{23}", "6.020 \\cdot 10^{23}", None),
    ("0.0015", "1.5 \\times 10^{-3}", None), ("1500", "1.5E+3", None),
    ("\\text{(B)}", "\\text{B}", None), ("\\text{(B)}", "\\mathrm{B}", None),
    ("\\infty", "∞", None), ("(-\\infty, 3)", "(-∞,3)", None), ("\\infty", "+\\infty", None),
    ("30^\\circ", "30\\text{ degrees}", None), ("\\$12", "12 \\text{ dollars}", None), ("5050", "5050 + 0i", None), ("2\\pi", "\\frac{4\\pi}{2}", None),
    ("\\begin{pmatrix}2\\\\4\\end{pmatrix}", "2\\begin{pmatrix}1\\\\2\\end{pmatrix}", None),
    ("\\cos x", "\\sin\\left(\\frac{\\pi}{2} - x\\right)", None), ("\\frac{n^2+n}{2}", "\\frac{n(n+1)}{2}", None),
    ("10", "10 \\text{ m/s}", None), ("1 \\le x \\le 2", "[1, 2]", None), ("-1, 1", "x = -1 \\text{ or } x = 1", None),   # Math-Verify test_matrix_extraction[5]
]


@pytest.mark.parametrize("gold,answer,instruction", WRONG)
def test_a_restatement_or_another_value_earns_nothing(gold, answer, instruction):
    verdict = math_verdict(gold, _box(answer), instruction)
    assert verdict["ok"] is False, verdict


@pytest.mark.parametrize("gold,answer,instruction", RIGHT)
def test_a_right_answer_in_an_unusual_spelling_passes(gold, answer, instruction):
    verdict = math_verdict(gold, _box(answer), instruction)
    assert verdict["ok"] is True, verdict


@pytest.mark.parametrize("gold,text", [
    ("5050", "The answer is **5050**."), ("\\text{(B)}", "$\\boxed{\\text{B.}}$"),
    ("-2, 1", "$\\boxed{x=-2 \\text{ and } x=1}$"), ("5050", "The answer is $\\boxed{\\boxed{5050}}$."),
])
def test_a_whole_response_in_an_unusual_spelling_passes(gold, text):
    assert math_verdict(gold, text)["ok"] is True


@pytest.mark.parametrize("gold,text", [
    ("2", "$\\boxed{x=2 \\text{ and } x=3}$"), ("5050", "The answer is **5051**."),
    ("p = 5, q = 2 \\text{ and } p = 7, q = 2", "$\\boxed{p = 5, q = 2}$"),
])
def test_a_whole_response_with_another_value_fails(gold, text):
    assert math_verdict(gold, text)["ok"] is False


def test_a_percent_ending_its_line_inside_the_box_hides_nothing():
    assert math_verdict("5050", "The answer is $\\boxed{5050%\n}$.")["ok"] is True
    assert math_verdict("0.5", "The answer is $\\boxed{50%\n}$.")["ok"] is True      # the percent it was meant as
    assert math_verdict("5", "The answer is $\\boxed{5 %\n 6}$.")["ok"] is False      # TeX shows 5 6
    assert math_verdict("5", "$\\boxed{6 %}$\n5}")["ok"] is False                       # the comment hides the brace


def test_restated_names_the_operation_and_leaves_golds_that_carry_it_alone():
    assert mathops.restated("5050", "\\sum_{k=1}^{100} k", None, None) is not None
    assert mathops.restated("\\sum_{k=1}^{n} k", "\\sum_{k=1}^{n} k", None, None) is None
    assert mathops.restated("\\log_2 x", "\\frac{\\ln x}{\\ln 2}", None, None) is None   # the gold has the function
    assert mathops.restated("3 \\log_2 x", "\\log_2 x^3", None, None) is None
    assert mathops.restated("(-\\infty, 3)", "\\{x \\mid x < 3\\}", None, None) is None  # a condition names its variable twice
    assert mathops.restated("x \\ne 3", "x != 3", None, None) is None                # != is no factorial
    assert mathops.restated("11111111100", "11,\\!111", None, None) is None          # \\! is a thin space


def test_as_interval_reads_one_variable_inequalities_only():
    assert mathops.as_interval("x < 3") == "(-\\infty, 3)"
    assert mathops.as_interval("x \\geq -2") == "[-2, \\infty)"
    assert mathops.as_interval("1 \\le x < 2") == "[1, 2)"
    assert mathops.as_interval("2 > x > 1") == "(1, 2)"
    assert mathops.as_interval("\\{x : x \\le 5\\}") == "(-\\infty, 5]"
    assert mathops.as_interval("\\mathbb{R}") == "(-\\infty, \\infty)"
    assert mathops.as_interval("1 < x > 2") is None and mathops.as_interval("x < y < z < 3") is None
    assert mathops.as_interval("x = 3") is None


def test_uncoloured_drops_only_a_colour_over_the_whole_answer():
    assert mathform.uncoloured("\\textcolor{red}{5}") == "5"
    assert mathform.uncoloured("{\\color{blue}5}") == "5"
    assert mathform.uncoloured("\\color{red} 5") == " 5"
    assert mathform.uncoloured("\\textcolor{white}{6}5") == "\\textcolor{white}{6}5"
    assert mathform.uncoloured("{\\color{white}6}5") == "{\\color{white}6}5"
    assert mathform.uncoloured("\\color{red}5}6") == "\\color{red}5}6"


def test_an_inequality_with_many_commands_is_read_in_linear_time():
    import time
    answer = "1 < x < " + "\\abcdefgh" * 200 + " < < 5"
    start = time.perf_counter()
    assert mathops.as_interval(answer) is None
    assert time.perf_counter() - start < 1.0       # the bound's pattern once backtracked exponentially here
