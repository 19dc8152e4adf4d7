"""Math answers are read as TeX renders them (`nodeagent.verifier.mathform`), repeating decimals and
digit notations are read only when well-formed, and a percent is read one way (issue 24, deliverable 3).

Three adversarial classes, each attacked as a class (one test per case: each fails alone):
- TeX that renders otherwise than a parser reads it (conditionals, macro definitions, catcodes,
  invisible or overlapped content, comments, strike-outs, stacked values, tags);
- repeating-decimal and digit notations (bars, dots, parentheses, ellipses, spaced digits);
- doubled or misplaced percent, degree, currency and unit marks, and the percent rule.
"""
from __future__ import annotations

import pytest

pytest.importorskip("math_verify", reason="math-verify is not installed")

from nodeagent.verifier import mathanswer, mathform  # noqa: E402

PERCENT_Q = "What percent of the students passed?"
PROB_Q = "What is the probability that both coins land heads? Express your answer as a decimal."
COUNT_Q = "How many apples are left?"
BASE6_Q = "Express $455_{10}$ in base 6."
TO_BASE10_Q = "Convert $101_2$ to base 10."

# (class, gold, prediction (boxed unless it starts with "RAW:"), expected, instruction or None)
TEX = [
    ("6", "\\iffalse 6 \\fi 5", False), ("5", "\\iffalse 6 \\fi 5", False), ("5", "\\iftrue 5 \\else 6 \\fi", False),
    ("5", "\\ifnum1=1 5\\else 6\\fi", False), ("5", "5\\ifx a a\\fi", False), ("5", "\\ifcase 0 5\\or 6\\fi", False),
    ("5", "\\unless\\iffalse 5\\fi", False), ("5", "\\def\\x{6}\\x", False), ("5", "\\let\\five=6 5", False),
    ("5", "\\edef\\a{5}\\a", False), ("5", "\\newcommand{\\x}{6}5", False), ("5", "\\renewcommand\\boxed[1]{6}5", False),
    ("5", "\\catcode`\\6=14 5", False), ("5", "\\char54 5", False), ("5", "\\romannumeral 5", False),
    ("5", "\\csname six\\endcsname 5", False), ("5", "\\expandafter 5", False), ("5", "\\mathchoice{5}{5}{6}{6}", False),
    ("5", "RAW:\\renewcommand{\\boxed}[1]{6} so the answer is $\\boxed{5}$.", False),
    ("5", "RAW:\\def\\five{6} so the answer is $\\boxed{5}$.", False),
    ("5", "RAW:\\iffalse The answer is $\\boxed{6}$. \\fi The answer is $\\boxed{5}$.", False),
    ("5", "\\phantom{6}5", False), ("5", "5\\phantom{6}", False), ("5", "\\hphantom{6}5", False),
    ("5", "\\vphantom{6}5", False), ("56", "5\\phantom{6}", False), ("5", "5^{\\phantom{6}}", False),
    ("5", "\\smash{6}5", False), ("5", "\\llap{6}5", False), ("5", "\\rlap{6}5", False), ("5", "\\clap{6}5", False),
    ("5", "\\mathrlap{6}5", False), ("5", "6\\mathllap{5}", False), ("5", "\\ooalign{6\\cr5}", False),
    ("5", "\\hspace{-1em}6 5", False), ("5", "\\kern-1em 6 5", False), ("5", "\\mkern-18mu6 5", False),
    ("5", "\\raisebox{0pt}{6}5", False), ("5", "\\makebox[0pt]{6}5", False),
    ("5", "\\color{white}6 5", False), ("5", "{\\color{white}6}5", False), ("5", "\\textcolor{white}{6}5", False),
    ("5", "\\colorbox{white}{6}5", False), ("5", "\\hidden{6}5", False), ("5", "5 % 6", False),
    ("6", "RAW:The answer is $\\boxed{6 %}\n5}$.", False), ("5", "RAW:The answer is $\\boxed{5 % 6\n}$.", False),
    ("5", "RAW:The answer is $\\boxed{6}$.\n% Final answer: 5", False),
    ("5", "\\not 6", False), ("5", "\\not= 6", False), ("5", "\\cancel{6}5", False), ("5", "\\bcancel{5}6", False),
    ("5", "\\xcancel{6}5", False), ("5", "\\sout{6}5", False), ("5", "\\cancelto{5}{6}", False),
    ("5", "\\stackrel{6}{5}", False), ("5", "\\overset{6}{5}", False), ("5", "\\underset{6}{5}", False),
    ("5", "\\overbrace{5}^{6}", False), ("5", "5\\tag{6}", False), ("5", "5 \\tag*{6}", False),
    ("5", "\\text{$6$}5", False), ("5", "\\mbox{6}5", False), ("5", "RAW:$\\boxed{5}$ and $\\boxed{6}$", False),
    ("5", "\\fbox{6}", False), ("5", "\\boxed{6}5", False), ("5", "\\tiny 6", False),
    ("5", "\\htmlStyle{display:none}{6}5", False), ("5", "\\htmlClass{x}{6}5", False), ("5", "\\href{x}{6}5", False),
    ("5", "\\verb|6|5", False), ("5", "\\scriptscriptstyle 6 5", False), ("5", "\\hbox to 0pt{6\\hss}5", False),
    ("5", "6\\!\\!\\!\\!\\!\\!\\!\\!\\!\\!5", False), ("5", "5 \\atop 6", False), ("5", "\\substack{5\\\\6}", False),
    ("5", "\\genfrac{}{}{0pt}{}{5}{6}", False), ("5", "{}^{6}5", False), ("5", "\\prescript{6}{}{5}", False),
    ("5", "\\label{eq6}5", False), ("5", "\\eqref{6}5", False), ("5", "\\footnote{6}5", False),
    ("5", "\\text{5}\\text{6}", False), ("5", "\\emph{6}5", False), ("5", "\\if 55 5\\else 6\\fi", False),
    ("5", "\\begin{comment}6\\end{comment}5", False), ("5", "\\xleftarrow{6}5", False), ("5", "\\mathop{6}5", False),
    ("5", "\\left.6\\right.5", False), ("5", "\\foo{6}5", False), ("5", "\\bm{6}5", False), ("5", "\\mathbb{6}5", False),
    ("5", "\\texttt{6}5", False), ("5", "\\underline{6}5", False), ("5", "\\sqrt[6]{}5", False), ("5", "{6 \\over}5", False),
    ("5", "\\lim_{6}5", False), ("5", "\\displaystyle{6}5", False), ("5", "\\mathrm{6}5", False), ("5", "^{6}5", False),
    ("5", "{6}5", False), ("5", "|6|5", False), ("5", "5\u0336", False), ("5", "6\u03365", False), ("5", "5\u0338", False),
    ("0.3", "0.3\u0305", False), ("5", "\uff3c\\iffalse 6 \\fi 5", False), ("5", "\\\\iffalse 6 \\\\fi 5", False),
    ("5", "\\operatorname{\\iffalse}5", False), ("5", "\\ExplSyntaxOn 5", False), ("5", "\\stepcounter{a}\\thea 5", False),
    ("5", "\\@firstoftwo{6}{5}", False), ("5", "\\@gobble{6}5", False), ("5", "\\directlua{tex.print(6)}5", False),
    ("5", "\\DeclareMathOperator{\\x}{6}5", False), ("5", "\\ifdefined\\x 6\\fi 5", False), ("5", "\\unexpanded{6}5", False),
    ("5", "\\hfill 6 5", False), ("-5", "\\phantom{-}5", False),
    # right: what is shown is the gold
    ("5", "\\phantom{-}5", True), ("5", "\\hphantom{x}5", True), ("5", "\\vphantom{\\int}5", True),
    ("5", "\\smash{5}", True), ("65", "\\smash{6}5", True), ("5", "\\mathstrut 5", True), ("5", "\\text{$5$}", True),
    ("5", "\\fbox{5}", True), ("5", "\\phantom{\\text{six}}5", True), ("5", "\\relax 5", True), ("5", "\\quad 5", True), ("5", "\\mathrm{5}", True), ("5", "RAW:The answer is $\\boxed{5}$. % checked", True),
    ("x \\iff y", "x \\iff y", True), ("\\theta", "\\theta", True), ("5", "x \\stackrel{?}{=} 5", True),
]
DIGITS = [
    ("5", "5.\\overline{0}1", False), ("5.01", "5.\\overline{0}1", False), ("5", "5.(0)1", False),
    ("\\frac{1}{3}", "0.\\overline{3}3", False), ("0.333", "0.333...", False), ("\\frac{1}{3}", "0.333...", False),
    ("\\frac{1}{3}", "0.333\\ldots", False), ("\\frac{1}{3}", "0.3\\dots", False), ("5", "5.\\overline{0}\\ldots", False),
    ("5", "5\\overline{0}", False), ("50", "5\\overline{0}", False), ("5", "\\overline{5}", False),
    ("5", "\\bar{5}", False), ("5", "\\dot{5}", False), ("5", "5.\\overline{ }", False), ("5", "5.\\overline{00}1", False),
    ("5", "5.\\overline{0}\\overline{0}", False), ("5", "5.\\widehat{0}", False), ("5", "5.\\tilde{0}", False),
    ("5", "\\overline{5.0}", False), ("\\frac{1}{7}", "0.\\dot{1}4", False), ("12", "1\\,2", False),
    ("12", "1\\ 2", False), ("15", "1~5", False), ("10", "1 0", False), ("100", "1 00", False),
    ("1000", "10 00", False), ("5", "0x5", False), ("5", "0b101", False), ("5", "101_2", False), ("5", "5_{10}", False),
    ("5", "V", False), ("5", "\\text{V}", False), ("5", "5.0.0", False), ("0.5", "0..5", False), ("5", "5,000", False),
    ("5", "101_2", False, TO_BASE10_Q), ("5", "5_{10}", False), ("2015", "2015_6", False),
    ("2015", "2015_7", False, BASE6_Q), ("2016", "2015_6", False, BASE6_Q), ("11", "1011_2", False, "Write 11 in binary."),
    ("\\{\\frac{1}{3}, 1\\}", "\\{0.\\overline{3}1, 1\\}", False), ("\\{5, 6\\}", "\\{5.\\overline{0}1, 6\\}", False),
    ("\\{\\frac{1}{3}, 1\\}", "\\{0.333..., 1\\}", False), ("2e", "2e1", False), ("2e+1", "2e1+1", False), ("21", "2e1+1", False), ("5e", "5e0", False), ("5", "5e", False),
    ("5", "\u2075", False), ("5", "5\\,000", False), ("5000", "50 00", False),
    # right: well-formed notations of the gold
    ("\\frac{1}{3}", "0.\\overline{3}", True), ("\\frac{1}{3}", "0.3\\overline{3}", True), ("\\frac{1}{3}", "0.\\bar{3}", True),
    ("\\frac{1}{3}", "0.\\dot{3}", True), ("\\frac{1}{7}", "0.\\dot{1}4285\\dot{7}", True), ("\\frac{1}{3}", "0.(3)", True),
    ("\\frac{1}{6}", "0.1\\overline{6}", True), ("5", "4.\\overline{9}", True), ("5", "4.(9)", True),
    ("5", "5.\\overline{0}", True), ("1000", "1{,}000", True), ("1000", "1\\,000", True), ("1000", "1\\ 000", True),
    ("1000000", "1\\,000\\,000", True), ("5", "+5", True), ("5", "5.", True), ("0.5", ".5", True), ("5", "05", True),
    ("5", "5\\times10^0", True), ("5", "5\\cdot 10^{0}", True), ("5", "\\frac{10}{2}", True), ("5", "\uff15", True),
    ("5", "\u0665", True), ("-5", "- 5", True), ("\\frac{40}{9}", "4 4/9", True), ("5", "5.0\\overline{0}", True),
    ("\\frac{1}{3}", ".\\overline{3}", True), ("\\frac{1}{3}", "0.\\overline3", True), ("\\frac{1}{3}", "0.\\dot 3", True),
    ("\\{\\frac{1}{3}, 1\\}", "\\{0.\\overline{3}, 1\\}", True), ("(\\frac{1}{3}, 1)", "(0.\\overline{3}, 1)", True),
    ("5000", "5 000", True), ("5", "5e0", True), ("5", "5E0", True), ("5000", "5e3", True), ("0.05", "5e-2", True),
    ("\\frac{1}{20}", "5E-2", True), ("2015", "2015_6", True, BASE6_Q), ("2015_6", "2015", True, BASE6_Q),
    ("5", "5_{10}", True, TO_BASE10_Q), ("204_5", "204_5", True), ("1011", "1011_2", True, "Write 11 in binary."),
]
MARKS = [
    ("0.05", "5\\%\\%", False), ("5", "5\\%\\%", False), ("5\\%", "5\\%\\%", False), ("5", "5%%", False),
    ("5", "5\\%%", False), ("5", "5\\%\\text{ percent}", False), ("5", "5\\text{ percent}\\%", False),
    ("5", "5 \\text{ percent percent}", False), ("5", "5\\%\\text{ \\%}", False), ("5", "5^\\circ\\%", False),
    ("5", "5^\\circ^\\circ", False), ("5", "5^{\\circ\\circ}", False), ("5", "5^{\\circ}{}^{\\circ}", False),
    ("5", "5^\\circ\\text{ degrees}", False), ("5\\text{ cm}", "5\\text{ cm}\\text{ cm}", False),
    ("5\\text{ cm}", "5\\text{ cm cm}", False), ("5", "\\$\\$5", False), ("5", "5\\text{ dollars}\\$", False),
    ("5", "\\%5", False), ("5", "5^{\\%}", False), ("5", "5‰", False), ("5", "5\\%\\permil", False),
    ("5", "500\\%", False), ("2", "200\\%", False), ("1", "100\\%", False), ("5\\%", "500\\%", False),
    ("500\\%", "5", False), ("\\frac{40}{9}", "4\\frac{4}{9}\\%", False), ("0.05", "5", False),
    ("5", "5\\%", False, COUNT_Q), ("0.05", "0.05\\%", False, PROB_Q), ("0.5", "\\frac{1}{2}\\%", False), ("0.25", "0.25\\%", False), ("0.25", "0.25\\%", False, PROB_Q),
    ("0.05", "5\\%", False, PERCENT_Q), ("95", "95\\%", False, "After a 5% discount, how many dollars does a $100 coat cost?"), ("5", "-5\\%", False), ("-5", "-500\\%", False), ("5", "5 \\cdot \\%", False),
    ("5", "5 \\times \\%", False), ("5", "5 + \\%", False), ("5", "\\%\\%5", False), ("5", "5\\%\\%\\%", False),
    ("5", "5\\%{}\\%", False), ("5", "5\\%^{\\%}", False), ("5\\%", "0.5", False), ("5", "5^{\\circ}{}^{\\prime}", False),
    ("5", "5'", False), ("5", "5\\text{ m}\\text{ m}", False), ("5\\text{ m}^2", "5\\text{ m m}", False),
    ("5\\text{ cm}", "5\\text{ mm}", False), ("5", "\\$\\,\\$5", False), ("5", "5\\text{ USD}\\text{ USD}", False),
    ("5\\%", "5^\\circ", False), ("5^\\circ", "5\\%", False), ("\\$5", "5\\%", False), ("5\\%", "\\$5", False),
    ("5", "5\\text{ percent of }5", False), ("5", "5\\text{ per cent}\\%", False), ("5", "5°°", False),
    ("5", "5 \\degree \\degree", False), ("5", "5\\%\\quad\\%", False), ("5", "5\\% \\\\ \\%", False),
    ("5", "(500\\%)", False), ("5", "{500\\%}", False), ("5", "\\left(500\\%\\right)", False), ("5", "+500\\%", False),
    ("5", "500\\% \\cdot 1", False), ("5", "\\frac{500\\%}{1}", False), ("5", "\\frac{1000}{2}\\%", False),
    ("5", "5\\mathrel{\\%}\\%", False), ("5", "\\text{5\\%\\%}", False), ("5", "5\\,\\text{\\%}\\text{\\%}", False),
    # right: one reading, chosen by the gold (and the instruction when there is one)
    ("5", "5\\%", True), ("5", "5\\text{ percent}", True), ("5", "5\\,\\%", True), ("5\\%", "5", True),
    ("5\\%", "0.05", True), ("0.05", "5\\%", True), ("\\frac{7}{25}", "28\\%", True), ("\\frac{1}{20}", "5\\%", True),
    ("12.5", "12.5\\%", True), ("0.125", "12.5\\%", True), ("5", "5\\%", True, PERCENT_Q),
    ("0.25", "25\\%", True, PROB_Q), ("12.5", "12.5\\%", True, "Find the percent increase."),
    ("0.125", "12.5\\%", True, "After a 5% discount, what fraction of the price is left?"), ("5", "5^{\\circ}", True), ("5^\\circ", "5", True),
    ("5\\text{ cm}", "5\\text{ cm}", True), ("5", "\\$5", True), ("10\\%", "10\\%", True), ("-5", "-5\\%", True),
    ("5.0", "5\\%", True), ("0.05", "5.0\\%", True), ("0.005", "\\frac{1}{2}\\%", True),
    ("50\\%", "0.5", True), ("5", "5\\text{ cm}", True), ("5", "\\$5.00", True), ("5", "5 \\text{%}", True),
    ("5", "\uff15\uff05", True), ("5", "5 \\text{\\%}", True), ("5", "5 \\mathrm{\\%}", True), ("5", "\\frac{5}{1}\\%", True), ("5^\\circ", "5°", True),
    ("\\$5", "5 \\text{ dollars}", True), ("5^\\circ", "5 \\text{ degrees}", True), ("5\\%", "5 \\text{ percent}", True),
    ("\\frac{1}{20}", "\\frac{10}{2}\\%", True), ("5", "5\ufe6a", True),
]
# a term below the numeric tolerance is another number (sympy proves the difference is not 0);
# closed forms that are the gold stay equal
TINY = [
    ("5050", "5050+10^{-100}", False), ("5050", "5050+10^{-400}", False), ("5050", "5050+2^{-2000}", False),
    ("5050", "5050-10^{-10^{6}}", False), ("5050", "5050+e^{-10^{6}}", False), ("5050", "5050+\\frac{1}{10^{400}}", False),
    ("5050", "5050(1+10^{-400})", False), ("0", "10^{-400}", False), ("\\frac{1}{3}", "\\frac{1}{3}+10^{-400}", False),
    ("\\sqrt{2}", "\\sqrt{2}+10^{-60}", False), ("\\pi", "\\pi-10^{-50}", False),
    ("5050", "5050 + 1.0\\cdot 10^{-60}", False), ("5050", "\\lfloor 5050.5 \\rfloor + 10^{-100}", False),
    ("\\sqrt{2}", "\\sqrt{2.0}+10^{-100}", False), ("0", "10^{-100}\\cdot 1.0", False),
    ("\\frac{1}{3}", "0.5 - \\frac{1}{6} + 10^{-100}", False), ("5050", "5050 + \\ln(1+10^{-60})", False),
    ("5050", "5050.0", True), ("\\frac{5\\sqrt{42}}{27}", "\\frac{10\\sqrt{10.5}}{27}", True),
    ("\\sqrt{6}", "\\sqrt{2}\\sqrt{3}", True), ("\\frac12", "\\frac{3}{6}", True), ("3", "\\frac{9}{3}", True),
    ("2", "\\sqrt[3]{8}", False), ("5050", "\\frac{100\\cdot 101}{2}", True), ("\\pi", "\\frac{4\\pi}{4}", True),
    ("\\sin 1", "\\sin(1)", True), ("\\sin^2 1", "1-\\cos^2(1)", True),
    # a function at a constant for a gold without one restates the problem (docs/verifier.md, "Restatements")
    ("\\frac12", "\\sin(\\pi/6)", False), ("3", "\\log_2 8", False), ("\\pi", "4\\arctan(1)", False),
    ("1", "\\sin^2(1)+\\cos^2(1)", False), ("3", "\\sqrt{9}", False), ("\\frac12", "\\frac{\\sqrt{3}}{2\\sqrt{3}}", False),
]
CASES = ([("tex", *c) for c in TEX] + [("digits", *c) for c in DIGITS] + [("marks", *c) for c in MARKS]
         + [("tiny", *c) for c in TINY])


def _judge(gold: str, pred: str, instruction: str | None) -> bool:
    text = pred[4:] if pred.startswith("RAW:") else f"The answer is $\\boxed{{{pred}}}$."
    return mathanswer.math_equal(gold, text, instruction)


@pytest.mark.parametrize("case", CASES, ids=[f"{c[0]}-{i}" for i, c in enumerate(CASES)])
def test_render_class_case(case):
    cls, gold, pred, expected, *rest = case
    instruction = rest[0] if rest else None
    assert _judge(gold, pred, instruction) is expected, f"{cls}: gold={gold!r} pred={pred!r} instruction={instruction!r}"


def test_the_render_classes_accept_no_wrong_answer_and_reject_no_right_one(capsys):
    wrong = [c for c in CASES if not c[3]]
    right = [c for c in CASES if c[3]]
    accepted = [c[:3] for c in wrong if _judge(c[1], c[2], c[4] if len(c) > 4 else None)]
    rejected = [c[:3] for c in right if not _judge(c[1], c[2], c[4] if len(c) > 4 else None)]
    with capsys.disabled():
        print(f"\nmath render classes: {len(wrong)} wrong answers, {len(accepted)} accepted {accepted}; "
              f"{len(right)} right answers, {len(rejected)} rejected {rejected}")
    assert len(wrong) >= 200 and not accepted and not rejected


def test_repeating_decimals_read_exactly_and_only_whole():
    from fractions import Fraction
    assert mathform.repeating("0.1\\overline{6}") == Fraction(1, 6)
    assert mathform.repeating("-0.\\dot{1}4285\\dot{7}") == Fraction(-1, 7)
    assert mathform.repeating("2.(142857)") == Fraction(15, 7)
    assert mathform.repeating("5.\\overline{0}1") is None
    assert mathform.repeating("0.\\dot{1}4") is None


def test_shown_drops_what_tex_never_draws_and_keeps_a_hidden_value_for_refusal():
    assert mathform.shown("\\phantom{-}5").strip() == "5"
    assert mathform.shown("\\smash[b]{6}5") == "65"
    assert "\\phantom{6}" in mathform.shown("\\phantom{6}5")
    assert mathform.ill_formed(mathform.shown("\\phantom{6}5")) is not None
    assert mathform.ill_formed("5") is None and mathform.ill_formed("1 000") is None


def test_tex_programming_anywhere_in_the_text_is_named_in_the_verdict():
    v = mathanswer.math_verdict("5", "\\def\\five{6} so $\\boxed{5}$")
    assert not v["ok"] and "\\def" in v["detail"]
    assert mathform.tex_program("x \\iff y, \\theta, \\left( \\right)") is None
