"""Write `adversarial_classes.jsonl`: the math checker's red-team set for issue 24.

Wrong answers by class (multi-valued hedges, relations, symbol case, tolerance, list / set /
interval / tuple, option letters, units and percent, LaTeX tricks, Unicode look-alikes, huge
inputs) and a few controls that must still pass. `gold_from` names the public labelled case
whose gold a row reuses. Written by this project; run: python make_adversarial.py
"""
import json
from pathlib import Path

B = lambda s: f"so the answer is $\\boxed{{{s}}}$."
R = []
def add(cls, gold, pred, expected, why, gold_from=None, instruction=None):
    r = {"gold": gold, "pred": pred, "expected": expected, "class": cls, "why": why}
    if gold_from: r["gold_from"] = gold_from
    if instruction: r["instruction"] = instruction
    R.append(r)
MV = "huggingface/Math-Verify tests/test_all.py"
LIN = "paddock builtin math/linear_equation (gold 6)"
# multi-valued: a hedge offers several values
for p, why in [
    (B(r"6 \lor 7"), r"\lor between two values"), (B(r"7 \lor 6"), r"\lor, gold second"),
    (B(r"x = 6 \lor x = 7"), r"\lor between assignments"), (B(r"6 \vee 7"), r"\vee"),
    (B(r"x=6, x=7"), "two assignments of one variable"), (B(r"x = 7,\ x = 6"), "two assignments, spaced"),
    (B(r"\begin{cases} 6 \\ 7 \end{cases}"), "a cases block"), (B(r"\begin{cases} x = 7 & \text{if } a>0 \\ x = 6 & \text{otherwise} \end{cases}"), "a cases block with conditions"),
    (B("6 (or 7)"), "parenthetical alternative"), (B(r"6 \ (\text{or } 7)"), "parenthetical \\text alternative"),
    (B(r"6 \text{ or } 7"), "\\text{ or }"), (B(r"x = 6 \text{ or } x = 7"), "or between assignments"),
    (B(r"6 \\ 7"), "rows split by \\\\"), (B(r"6 \text{(or 7)}"), "alternative hidden in \\text"),
    ("answer: 6 \\lor 7", "hedge on an answer line"), ("answer: x=6, x=7", "two assignments on an answer line"),
    ("answer: 6 (or 7)", "parenthetical on an answer line"), ("The answer is $6 \\text{ or } 7$.", "hedge in an answer sentence"),
    (B(r"\{6, 7\}"), "a set of candidates for one value"), (B("6, 7"), "a bare list of candidates"),
    (B(r"x \in \{6, 7\}"), "membership in a set of candidates"), (B(r"6 \pm 1"), "\\pm around the gold"),
    (B(r"\boxed{6} 7"), "nested box with a second value"), (B(r"6 \text{ and } 7"), "and between values"),
]:
    add("multi-valued", "6", p, False, why, LIN)
# relation
for p, why in [
    (B("7 = 6"), "a false equation"), (B("6 = 7"), "a false equation, gold first"), (B("x = 7 = 6"), "a chain with a wrong link"),
    (B(r"6 \approx 7"), "approximation to a wrong value"), (B(r"x \approx 7"), "x approx a wrong value"),
    (B(r"6 \neq 7"), "an inequality"), (B(r"x \ge 6"), "a bound, not a value"), (B(r"6 < x < 7"), "a range"),
    (B(r"x \approx 6 \approx 7"), "chained approximations"), (B("3x + 7 = 25"), "restates the equation"),
]:
    add("relation", "6", p, False, why, LIN)
add("relation", "x = 11", B("x = 7 = 11"), False, "a chain with a wrong link, gold an assignment", MV + "::test_relations_math[14]")
# case
for g, p, why in [("2a", B("a+A"), "a+A is not 2a"), ("a", B("A"), "symbol case"), ("A", B("a"), "point name case"),
                  ("x+y", B("X+y"), "variable case"), (r"\frac{\pi r}{h+r}", B(r"\frac{\pi R}{h+r}"), "radius r vs R"),
                  ("2 \\sin b \\cos a", B("2 \\sin B \\cos A"), "angles a vs A")]:
    add("case", g, p, False, why, {"\\frac{\\pi r}{h+r}": MV + "::test_latex_notation_math[24]", "2 \\sin b \\cos a": MV + "::test_latex_notation_math[23]"}.get(g))
# tolerance / rounding
for g, p, why, src in [
    (r"\frac{1}{7}", B("0.14"), "2 significant digits for an exact fraction", None),
    (r"\frac{2}{3}", B("0.67"), "2 significant digits for an exact fraction", None),
    (r"\frac{1}{3}", B("0.333"), "3 significant digits for an exact fraction", None),
    (r"\frac{1}{12}", B("0.083"), "rounded fraction", "qwen: tests/test_all.py::test_complex_math_expressions[0]"),
    (r"\sqrt{17}", B("4.12"), "3 significant digits for a surd", MV + "::test_float_precision[0]"),
    ("16386.20", B("16386.3"), "a different decimal", MV + "::test_math_extraction_edge_cases[5]"),
    ("7.78", B("7.8"), "fewer places than the gold asks", MV + "::test_math_extraction_additional_cases[14]"),
    ("16386.17", B("16386.16"), "last place off by one", MV + "::test_math_extraction_edge_cases[12]"),
    ("3628800", B("3628801"), "integer off by one", None),
    (r"\pi", B("3.14"), "pi to 3 digits", None),
    ("1000", B("999.99"), "an integer gold is not a rounding", MV + "::test_number_extraction[3]"),
    (r"\frac{1}{7}", B("0.142857"), "6 correct digits of an exact fraction, no decimal asked", None),
    (r"\sqrt{2}", B("1.414"), "a surd to 4 digits, no decimal asked", None),
    ("e", B("2.718"), "e to 4 digits, no decimal asked", None),
]:
    add("tolerance", g, p, False, why, src)
# an approximation asked by the instruction: only to the precision asked, every digit right
HUNDREDTH = "What is $\\sqrt{2}$? Express your answer as a decimal to the nearest hundredth."
for g, p, ok, why, ins in [
    (r"\sqrt{2}", B("1.41"), True, "the nearest hundredth, asked", HUNDREDTH),
    (r"\sqrt{2}", B("1.414"), True, "more places than asked, every digit right", HUNDREDTH),
    (r"\sqrt{2}", B("1.4"), False, "coarser than the hundredth asked", HUNDREDTH),
    (r"\sqrt{2}", B("1.42"), False, "wrongly rounded hundredth", HUNDREDTH),
    (r"\sqrt{2}", B("1.415"), False, "a wrong third digit beyond the precision asked", HUNDREDTH),
    (r"\frac{1}{7}", B("0.143"), True, "three decimal places, asked", "Round your answer to three decimal places."),
    (r"\frac{1}{7}", B("0.142"), False, "truncated, not rounded", "Round your answer to three decimal places."),
    (r"\pi", B("3"), True, "the nearest whole number, asked", "Round to the nearest whole number."),
    (r"\pi", B("4"), False, "the wrong whole number", "Round to the nearest whole number."),
    (r"\frac{1}{7}", B("0.1429"), True, "an approximate value asked, 4 digits", "Give the approximate value."),
    (r"\frac{1}{7}", B("0.14"), False, "an approximate value asked, 2 digits", "Give the approximate value."),
    (r"\frac{1}{7}", B("0.1429"), False, "a common fraction asked", "Express your answer as a common fraction, not a decimal."),
    (r"100\sqrt{2}", B("141.4"), True, "four significant figures, asked", "Give your answer to 4 significant figures."),
    (r"100\sqrt{2}", B("141"), False, "three significant figures when four are asked", "Give your answer to 4 significant figures."),
]:
    add("control" if ok else "tolerance", g, p, ok, why, None, ins)
# list / set / interval / tuple
for g, p, why, src in [
    ("-2,1", B("-2.1"), "two roots read as a decimal", MV + "::test_latex_notation_math[13]"),
    ("-2,1", "-2.1", "two roots read as a decimal, bare", MV + "::test_latex_notation_math[13]"),
    ("(6,31,-1)", B(r"\{6, 31, -1\}"), "an ordered triple given as a set", MV + "::test_latex_notation_math[18]"),
    ("(6,31,-1)", B("(31, 6, -1)"), "triple out of order", MV + "::test_latex_notation_math[18]"),
    ("(7,6)", B(r"\{7,6\}"), "a pair given as a set", MV + "::test_math_extraction_edge_cases[2]"),
    (r"\{1,2\}", B("(1,2)"), "an interval (or pair) for a set", None),
    (r"\{1,2\}", B("[1,2]"), "a closed interval for a set", None),
    ("[0,1)", B(r"\{0,1\}"), "a set for an interval", MV + "::test_sets_handling[0]"),
    ("[-4,0]", B("-4, 0"), "the end points for an interval", MV + "::test_math_extraction_additional_cases[18]"),
    ("[-4,0]", B("(-4,0)"), "open for closed", MV + "::test_math_extraction_additional_cases[18]"),
    (r"\{1\pm\sqrt{5},-2\}", B(r"1+\sqrt{5}, -2"), "one root missing", MV + "::test_latex_notation_math[21]"),
    ("1 \\pm \\sqrt{19}", B("1 + \\sqrt{19}"), "half of a \\pm", MV + "::test_latex_notation_math[19]"),
]:
    add("list-set-interval", g, p, False, why, src)
# option letters
for g, p, why, src in [
    ("a", B("(A)"), "a variable gold is not option A", None), ("e", B(r"\text{(E)}"), "Euler's e is not option E", None),
    (r"\text{C}", B(r"\text{(C) or (D)}"), "two options", MV + "::test_math_extraction_additional_cases[21]"),
    (r"\text{C}", B("C, D"), "two options as a list", MV + "::test_math_extraction_additional_cases[21]"),
    (r"\text{C}", B(r"\text{(C)} \lor \text{(D)}"), "two options with \\lor", MV + "::test_math_extraction_additional_cases[21]"),
    (r"\text{E}", B("e"), "option E is not e", MV + "::test_math_extraction_additional_cases[26]"),
]:
    add("option-letters", g, p, False, why, src)
# units / percent
for g, p, why, src in [
    (r"15\mbox{ cm}^2", B(r"15 \text{ cm}^2 = 150 \text{ mm}^2"), "a wrong conversion stated", MV + "::test_latex_notation_math[12]"),
    (r"15\mbox{ cm}^2", B(r"1\text{5 cm}^2"), "digit hidden in a unit", MV + "::test_latex_notation_math[12]"),
    ("125", B(r"125 \text{ or 126 miles}"), "hedge hidden in the unit text", MV + "::test_latex_notation_math[25]"),
    (r"20\%", B(r"0.2\% "), "percent of the fraction", MV + "::test_math_extraction_additional_cases[13]"),
    (r"28\%", B(r"28\% \text{ or } 29\%"), "percent hedge", MV + "::test_percent_notation[0]"),
]:
    add("units-percent", g, p, False, why, src)
# LaTeX tricks
for g, p, why in [
    ("5", B(r"5\phantom{6}"), "\\phantom hides a digit"), ("6", B(r"\phantom{6}7"), "\\phantom shows the gold invisibly"),
    ("5", B(r"\boxed{5} 6"), "\\boxed nesting with a second value"), ("5", B(r"\text{5 or 6}"), "hedge inside \\text"),
    ("5", B(r"\color{white}{6}5"), "a hidden coloured digit"), ("5", B(r"\hphantom{6}5 \lor 6"), "phantom and a hedge"),
    ("5", r"\boxed{5}" + " " + r"\boxed{6}", "two boxes"), ("5", B(r"\fbox{5} \fbox{6}"), "\\fbox nesting"),
    ("5", B(r"\not= 5"), "negated relation"), ("5", B(r"5^{\text{or } 6}"), "hedge in an exponent text"),
    ("6", B(r"6^{\text{or }7}"), "hedge in an exponent text, digit outside"), ("6", B(r"6 \text{ (or seven)}"), "hedge in words"),
    ("6", B(r"6 \,\,\text{(}7\text{)}"), "a second value in text parentheses"), ("6", B(r"6 \texttt{ or } 7"), "\\texttt or"),
    ("6", B(r"6 \hbox{ or } 7"), "\\hbox or"),
]:
    add("latex-tricks", g, p, False, why)
# unicode look-alikes
for g, p, why in [
    ("5", B("\u22125"), "unicode minus"), ("-5", B("5"), "sign dropped"), ("5", B("5\u200b6"), "zero-width space between digits"),
    ("5", B("\uff15\uff16"), "fullwidth 56"), ("6", B("\u0431"), "cyrillic letter for 6"), ("5", B("5\u20606"), "word joiner between digits"),
]:
    add("unicode", g, p, False, why)
# huge / timeouts
for g, p, why in [
    ("5", B("10^{10^{10^{10}}}"), "power tower"), ("5", B("(" * 200 + "5" + ")" * 200 + "+1"), "deep nesting"),
    ("5", B("+".join(["x"] * 2000) + "-2000x+5"), "a long expression equal to 5, 2000 terms"),
    ("5", B(r"5 \lor " * 30 + "6"), "a long hedge"), ("5", "\\boxed{5}" * 40 + "\\boxed{6}", "many boxes"),
]:
    add("huge", g, p, False, why)
# must accept (controls: the rules do not reject honest answers)
for g, p, why, src in [
    ("6", B("x = 6"), "assignment", LIN), ("6", B(r"x = \frac{18}{3} = 6"), "a chain whose links are all the gold", LIN),
    ("6", B(r"6 \text{ or } 6"), "a hedge between equal values", LIN), ("-2,1", B("-2, 1"), "the roots, spaced", MV + "::test_latex_notation_math[13]"), ("16386.20", B("16386.2"), "a trailing zero dropped: same value", MV + "::test_math_extraction_edge_cases[5]"),
    ("-2,1", B(r"\{-2, 1\}"), "roots as a set", MV + "::test_latex_notation_math[13]"),
    (r"\frac{1}{3}", B(r"\frac{1}{3} \approx 0.333"), "exact then approximate", None),
    ("1 \\pm \\sqrt{19}", B(r"1 + \sqrt{19}, 1 - \sqrt{19}"), "both values of \\pm", MV + "::test_latex_notation_math[19]"),
    (r"\text{C}", B(r"\text{(C)}"), "option in parentheses", MV + "::test_math_extraction_additional_cases[21]"),
    ("2a", B("a+a"), "same symbol twice", None), ("(6,31,-1)", B(r"\left(6, 31, -1\right)"), "\\left/\\right", MV + "::test_latex_notation_math[18]"),
    ("5", B("\uff15"), "fullwidth digit 5", None), ("6", B(r"\frac{12}{2}"), "an expression whose value is the gold", LIN), ("-5", B("\u22125"), "unicode minus", None),
    ("6", r"\begin{cases} x = 6 \end{cases}" and B(r"\begin{cases} 6 \end{cases}"), "one-row cases", LIN),
]:
    add("control", g, p, True, why, src)
with open(Path(__file__).resolve().parent / "adversarial_classes.jsonl", "w", encoding="utf-8") as fh:
    fh.writelines(json.dumps(r, ensure_ascii=False) + "\n" for r in R)
print(len(R), "must-reject", sum(not r["expected"] for r in R))
