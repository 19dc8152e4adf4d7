"""Math answer operations: answers that restate the computation instead of giving its value, and
the readings of a few spellings the parser does not share.

A reward is for the problem solved. An answer that writes the computation out unevaluated (a
sum, a binomial, a factorial, an integral, a limit, a function at a constant, or the problem's
own expression copied from the task's instruction) equals the value only because a computer
algebra system finishes the work; it is not accepted when the gold itself does not carry that
kind of operation (docs/verifier.md, "Restatements"):
- `restated(gold, pred, instruction, asked)`: the reason `pred` restates the problem, else None;
- `rounded_by_instruction(gold, pred, asked)`: False when the instruction names the places and
  the predicted decimal has more of them than asked (the rounding was not done), else None;
- `as_interval(pred)`: an inequality in one variable (`x < 3`, `1 \\le x < 2`, `\\mathbb{R}`)
  as the interval it describes, else None; `interval_gold(gold, instruction)`: the gold is an
  interval for sure (an end at infinity, a square bracket, or the instruction asks for one);
- `approximation_ok(value, literal, asked)`, `rounds_to(value, literal)`: whether a decimal
  stands for an exact value as the instruction asks, and whether it is that value rounded.

Pure string and Fraction functions.
Must not import: sympy, math_verify, zmq, controller, nodeagent.verifier.mathanswer,
nodeagent.verifier.mathnorm.
"""
from __future__ import annotations

import math
import re
from decimal import Decimal
from fractions import Fraction
from typing import Any

MIN_ROUNDED_SIG_DIGITS = 3       # a rounded decimal needs this many significant digits ...
MIN_ROUNDED_PLACES = 2           # ... or this many decimal places
MIN_APPROX_SIG_DIGITS = 4        # a predicted decimal for an exact non-decimal gold (1/7 ~ 0.1429)

_END = r"(?![A-Za-z])"
_OP_NAMES = r"(?:sum|prod|lcm|gcd|binom|binomial|comb|perm|choose|factorial|floor|ceil|mod|det|max|min|C|P|nCr|nPr)"
BIG_OPS = re.compile(
    r"\\(?:sum|prod|coprod|bigcup|bigcap|int|iint|iiint|oint|lim|limsup|liminf|varlimsup|varliminf|binom|dbinom|"
    r"tbinom|choose|gcd|lcm|max|min|det|lfloor|lceil|bmod|partial|nabla|Pr|argmax|argmin)" + _END
    + r"|\\Gamma\s*(?:\\left\s*)?\("                                       # the Gamma function, not the letter
    + r"|\\(?:operatorname|mathrm|text|textrm|mathit)\s*\{\s*" + _OP_NAMES + r"\s*\}\s*(?:\\left\s*)?\("
    + r"|(?<![\\A-Za-z])(?:sum|prod|lcm|gcd|binom|binomial|comb|perm|factorial|floor|ceil|mod|max|min)\s*\("
    + r"|\\begin\s*\{\s*[vV]matrix\s*\}"                                   # a determinant
    + r"|(?<!\\)!(?!=)"                                                    # a factorial (not \\! or !=)
    + r"|\\[dt]?frac\s*\{\s*(?:\\mathrm\s*\{\s*d\s*\}|d)\s*[A-Za-z]?\s*\}\s*\{\s*(?:\\mathrm\s*\{\s*d\s*\}|d)\s*[A-Za-z]"
    + r"|(?<![A-Za-z\\])[CP]\s*(?:\\left\s*)?\(\s*\d+\s*,\s*\d+\s*(?:\\right\s*)?\)"   # C(10,3)
    + r"|(?:\{\s*\}|^|\s)\s*_\s*\{?\s*\d+\s*\}?\s*[CP]\s*_"                 # {}_{10}C_3
    + r"|\^\s*\{?\s*\d+\s*\}?\s*[CP]\s*_|\d\s*[CP]\s*_?\s*\{?\s*\d"         # ^{10}C_3, 10C3
    + r"|[-+*]\s*\\(?:[lc]?dots[a-z]*|ldotp|cdotp)" + _END + r"\s*[-+*]"   # 1+2+\\cdots+100
)
_FUNCTION_NAMES = (r"(?:sin|cos|tan|sec|csc|cot|arcsin|arccos|arctan|arcsec|arccsc|arccot|sinh|cosh|tanh|coth|"
                   r"sech|csch|arsinh|arcosh|artanh|arc\w+|log\w*|ln|lg)")
FUNCTIONS = re.compile(r"\\" + _FUNCTION_NAMES + _END
                       + r"|\\(?:operatorname|mathrm|text|textrm|mathit)\s*\{\s*" + _FUNCTION_NAMES + r"\s*\}"
                       + r"|(?<![\\A-Za-z])" + _FUNCTION_NAMES + r"\s*\(")
_RADICAL = re.compile(r"\\sqrt" + _END + r"|√|\^\s*\{?\s*(?:\d+\s*/\s*\d+|\\frac\s*\{?\s*\d+\s*\}?\s*\{?\s*\d+|0?\.\d+)")
_CONSTANTS = re.compile(r"\\pi" + _END + r"|π|(?<![A-Za-z\\\d.])e(?![A-Za-z\d])|\\exp" + _END + r"|(?<![A-Za-z\\])i\s*\^")
_BARS = re.compile(r"\||\\[lr]?[vV]ert" + _END + r"|\\[lr]?\|")
_EXACT_RATIONAL = re.compile(r"[+-]?(?:\d+|\\frac\s*(?:\{\s*\d+\s*\}|\d)\s*(?:\{\s*\d+\s*\}|\d)|\d+\s*/\s*\d+)")
_COMMANDS = re.compile(r"\\[A-Za-z]+|\\text\s*\{[^{}]*\}")
_CONSTANT_LETTERS = re.compile(r"[A-DF-HJ-Za-df-hj-z]")       # any letter but e and i


def _variables(s: str) -> bool:
    """True when `s` names a variable (a letter outside commands, other than e and i)."""
    return _CONSTANT_LETTERS.search(_COMMANDS.sub(" ", s)) is not None


_LETTER = re.compile(r"(?<![A-Za-z\\])([A-DF-HJ-Za-df-hj-z])(?![A-Za-z])")


def _cancelling(pred: str) -> bool:
    """True when `pred` names a variable twice (`\\frac{x}{x}`, `x - x + 3`) or applies a function
    to one (`\\cos^2 x + \\sin^2 x`): against a gold without variables, they can only cancel."""
    if re.search(r"[<>:≤≥]|\\(?:[lg]eq?|[lg]t|mid|in|forall)" + _END, pred):
        return False                          # a set or a condition names its variable twice: \\{x \\mid x < 3\\}
    letters = _LETTER.findall(_COMMANDS.sub(" ", pred))
    return len(letters) != len(set(letters)) or (bool(letters) and FUNCTIONS.search(pred) is not None)


_OPTIONS = re.compile(r"\(\s*[A-E]\s*\)\s*\S")                # "(A) 5 (B) 6": the instruction lists choices
_FRACTION_ASKED = re.compile(r"common\s+fraction|as\s+a\s+(?:reduced\s+|simplified\s+|proper\s+|improper\s+)?fraction|"
                             r"fraction\s+in\s+(?:lowest|simplest)\s+terms|as\s+a\s+ratio\s+of\s+integers", re.IGNORECASE)
_DECIMAL_ASKED = re.compile(r"as\s+a\s+decimal|in\s+decimal\s+(?:form|notation)|decimal\s+(?:number|answer|form)", re.IGNORECASE)
_DECIMAL_GOLD = re.compile(r"[+-]?\d*\.\d+")
_NOT_A_FRACTION = re.compile(r"[+-]?(?:\d*\.\d*(?:\\(?:overline|bar)\{?\d+\}?|\(\d+\))?|\d+(?:\.\d+)?(?:\\%|%))"
                             r"|[+-]?\d+(?:\.\d+)?(?:[eE][+-]?\d+|(?:\\times|\\cdot)10\^\{?[+-]?\d+\}?)")
_SIMPLE_NUMBER = re.compile(r"[+-]?(?:\d+(?:\.\d+)?|\.\d+|\\frac\s*(?:\{\s*\d+\s*\}|\d)\s*(?:\{\s*\d+\s*\}|\d)|\d+\s*/\s*\d+)")
_OPERATOR = re.compile(r"[-+*/^!=]|\\(?:times|cdot|div|frac|sqrt|binom|dbinom|tbinom|choose)" + _END
                       + "|" + FUNCTIONS.pattern + "|" + BIG_OPS.pattern)
_NUMBER = re.compile(r"\d+(?:\.\d+)?")
_NUMERAL = re.compile(r"[+-]?\d+(?:\.\d+)?(?:(?:\\times|\\cdot|\*)10\^\{?[+-]?\d+\}?|[eE][+-]?\d+)?"   # 1.5\\times10^{3}
                      r"|[+-]?\d+\\frac\{\d+\}\{\d+\}|[+-]?\d+(?:\\%|%|\^\{?\\circ\}?)")      # 2\\frac{1}{2}, 15\\%
_SQUASH = re.compile(r"\s+|\\(?:left|right|displaystyle|textstyle|[,;:!])|(?<!\\)\$|\\[()\[\]]")


def _evaluated(p: str) -> bool:
    """True when the squashed answer `p` is a number in its final form: an integer, a decimal, or a
    fraction in lowest terms (`\\frac{12}{3}` and `\\frac{4}{8}` are a division still to do)."""
    if not _SIMPLE_NUMBER.fullmatch(p):
        return False
    m = re.fullmatch(r"[+-]?(?:\\frac(?:\{(\d+)\}|(\d))(?:\{(\d+)\}|(\d))|(\d+)/(\d+))", p)
    if m is None:
        return True
    a, b = (int(x) for x in (m.group(1) or m.group(2) or m.group(5), m.group(3) or m.group(4) or m.group(6)))
    return b > 1 and math.gcd(a, b) == 1


def _fillers(instruction: str) -> set[str]:
    """Numbers an expression of the instruction's numbers may add: 0 and 1, and 100 when it
    speaks of percent."""
    return {"0", "1", "100"} if re.search(r"%|percent", instruction, re.IGNORECASE) else {"0", "1"}


def _given_numbers(instruction: str) -> set[str]:
    """The numbers an instruction gives, each also as its percent (15 -> 0.15)."""
    given = set(_NUMBER.findall(_squash(instruction[-8000:])))
    return given | {format((Decimal(n) / 100).normalize(), "f") for n in given if len(n) < 30}


def _squash(s: str) -> str:
    s = re.sub(r"\\[dt]frac" + _END, r"\\frac", s)
    s = re.sub(r"\\frac\s*(\d)\s*(\d)", r"\\frac{\1}{\2}", s)          # \\frac42 is \\frac{4}{2}
    return _SQUASH.sub("", s)


def restated(gold: str, pred: str, instruction: str | None, asked: Any) -> str | None:
    """Why `pred` restates the problem instead of answering it, else None (see the module docstring):
    a big operator (sum, product, integral, limit, binomial, factorial, gcd, floor, determinant,
    derivative) when the gold has none; an elementary function of a constant (`\\sin 30^\\circ`,
    `\\log_2 8`) when the gold has no function; the instruction's own expression (`17 \\times 23`)
    when it is not the gold's spelling; a decimal where the instruction asks for a fraction."""
    if BIG_OPS.search(pred) and not BIG_OPS.search(gold):
        return "an unevaluated operation (sum, binomial, factorial, integral ...) the gold does not carry"
    if FUNCTIONS.search(pred) and not FUNCTIONS.search(gold) and not BIG_OPS.search(gold) and not _variables(pred):
        return "a function at a constant the gold does not carry"
    if not _variables(gold) and _cancelling(pred):
        return "variables that cancel, for a gold without one: an identity, not a value"
    if _BARS.search(pred) and not _BARS.search(gold) and not _variables(pred):
        return "an absolute value of a constant the gold does not carry"
    if _EXACT_RATIONAL.fullmatch(_squash(gold)) and (_RADICAL.search(pred) or _CONSTANTS.search(pred)):
        return "a radical or a constant (pi, e) for a rational gold: the work not done"
    if not instruction:
        return None
    p = _squash(pred)
    if _FRACTION_ASKED.search(instruction) and _NOT_A_FRACTION.fullmatch(p) and not _NOT_A_FRACTION.fullmatch(_squash(gold)):
        return "a decimal or a percent where the instruction asks for a fraction"
    if _DECIMAL_ASKED.search(instruction) and _DECIMAL_GOLD.fullmatch(_squash(gold)) and re.search(r"\\frac|/", p):
        return "a fraction where the instruction asks for a decimal"
    if (len(p) >= 3 and p != _squash(gold) and not _evaluated(p) and _OPERATOR.search(p)
            and not _OPTIONS.search(instruction) and p in _squash(instruction[-8000:])):
        return "the instruction's own expression"
    numbers = _NUMBER.findall(p)
    if (numbers and _SIMPLE_NUMBER.fullmatch(_squash(gold)) and not _variables(pred) and not _evaluated(p)
            and not _NUMERAL.fullmatch(p) and _OPERATOR.search(p)
            and set(numbers) - _fillers(instruction) <= _given_numbers(instruction)):
        return "an expression of the instruction's own numbers, not evaluated"
    return None


def rounded_by_instruction(gold_literal: tuple[Fraction, int | None], pred_literal: tuple[Fraction, int | None],
                           asked: Any) -> bool | None:
    """False when the instruction names the decimal places (`asked.places` >= 0), the two
    literals differ and the prediction shows more places than asked: `3.14159` for "round to the
    nearest hundredth" (gold 3.14) did not round. None otherwise (the usual comparison decides)."""
    if asked is None or asked.places is None or asked.places < 0:
        return None
    if gold_literal[0] != pred_literal[0] and (pred_literal[1] or 0) > asked.places:
        return False
    return None


def rounds_to(value: Fraction, literal: tuple[Fraction, int | None], significant) -> bool:
    """True when the decimal `literal` is `value` (exact) rounded to its places, and it carries
    enough digits to mean something (MIN_ROUNDED_SIG_DIGITS or MIN_ROUNDED_PLACES).
    `significant(value, places)` counts significant digits (`mathnorm.significant_digits`)."""
    lit, places = literal
    if places is None:
        return False
    if places < MIN_ROUNDED_PLACES and significant(lit, places) < MIN_ROUNDED_SIG_DIGITS:
        return False
    return abs(value - lit) <= Fraction(1, 2 * 10 ** places)


def approximation_ok(value: Fraction, literal: tuple[Fraction, int | None], asked: Any, significant) -> bool:
    """A predicted literal standing for the exact `value`: only when the instruction asks for an
    approximation (`asked`, a `mathnorm.Precision`), given to at least the precision it names
    (MIN_APPROX_SIG_DIGITS significant digits when it names none), and correct to every digit it
    shows (the value rounded to the literal's own places)."""
    lit, places = literal
    if asked is None:
        return False
    shown = places or 0
    if asked.places is not None and asked.places < 0:          # "the nearest hundred": 1400 for 1414.2
        step = Fraction(10) ** -asked.places
        return places is None and lit % step == 0 and abs(value - lit) <= step / 2
    if asked.places is not None and shown < asked.places:
        return False
    digits = significant(lit, shown)
    if asked.sig is not None and digits < asked.sig:
        return False
    if asked.places is None and asked.sig is None and digits < MIN_APPROX_SIG_DIGITS:
        return False
    return abs(value - lit) <= Fraction(1, 2 * 10 ** shown)


_TRIG = re.compile(r"\\(?:sin|cos|tan|sec|csc|cot)" + _END)
_DEGREES = re.compile(r"(\d+(?:\.\d+)?)\s*\^\s*(?:\{\s*\\circ\s*\}|\\circ" + _END + r")|(\d+(?:\.\d+)?)\s*°")


def degrees_in_functions(s: str) -> str:
    """`s` with each angle in degrees written as radians when `s` holds a trigonometric function
    (`\\sin 10^\\circ` -> `\\sin (10\\pi/180)`); else `s` unchanged."""
    if not _TRIG.search(s):
        return s
    return _DEGREES.sub(lambda m: f"({m.group(1) or m.group(2)}\\pi/180)", s)


# -- inequalities as intervals ------------------------------------------------------------------

_LT = r"(?:<|\\lt" + _END + r")"
_GT = r"(?:>|\\gt" + _END + r")"
_LE = r"(?:\\leq?(?:slant)?" + _END + r"|≤|<=)"
_GE = r"(?:\\geq?(?:slant)?" + _END + r"|≥|>=)"
_REL = "(" + "|".join((_LE, _GE, _LT, _GT)) + ")"
_VAR = r"[A-Za-z]"
_BOUND = r"((?:[^<>=≤≥\\]|\\(?!le|ge|lt|gt)[A-Za-z]+(?![A-Za-z])|\\[^A-Za-z])*?)"   # one reading of each character
_ONE_SIDED = re.compile(r"\s*" + _VAR + r"\s*" + _REL + r"\s*" + _BOUND + r"\s*")
_ONE_SIDED_REV = re.compile(r"\s*" + _BOUND + r"\s*" + _REL + r"\s*" + _VAR + r"\s*")
_TWO_SIDED = re.compile(r"\s*" + _BOUND + r"\s*" + _REL + r"\s*" + _VAR + r"\s*" + _REL + r"\s*" + _BOUND + r"\s*")
_SET_BUILDER = re.compile(r"\\\{\s*" + _VAR + r"\s*(?::|\\mid|\||\\vert)\s*(.*)\\\}")
_REALS = re.compile(r"\\mathbb\s*\{\s*R\s*\}|\\R" + _END + r"|ℝ|\\text\s*\{\s*all\s+real\s+numbers\s*\}")


def _kind(rel: str) -> tuple[str, bool]:
    """("<" or ">", strict) for a relation token."""
    less = re.fullmatch(_LT + "|" + _LE, rel) is not None
    strict = re.fullmatch(_LT + "|" + _GT, rel) is not None
    return ("<" if less else ">"), strict


def as_interval(pred: str) -> str | None:
    """The interval an inequality in one variable describes (`x < 3` -> `(-\\infty, 3)`,
    `1 \\le x < 2` -> `[1, 2)`, `3 > x`, `\\{x : x > 0\\}`, `\\mathbb{R}`), else None."""
    s = pred.strip()
    builder = _SET_BUILDER.fullmatch(s)
    if builder:
        s = builder.group(1).strip()
    if _REALS.fullmatch(s):
        return "(-\\infty, \\infty)"
    m = _TWO_SIDED.fullmatch(s)
    if m and m.group(1).strip() and m.group(4).strip():
        (k1, s1), (k2, s2) = _kind(m.group(2)), _kind(m.group(3))
        if k1 != k2:
            return None
        lo, hi, slo, shi = (m.group(1), m.group(4), s1, s2) if k1 == "<" else (m.group(4), m.group(1), s2, s1)
        return f"{'(' if slo else '['}{lo.strip()}, {hi.strip()}{')' if shi else ']'}"
    for pattern, var_first in ((_ONE_SIDED, True), (_ONE_SIDED_REV, False)):
        m = pattern.fullmatch(s)
        if not m:
            continue
        bound = (m.group(2) if var_first else m.group(1)).strip()
        kind, strict = _kind(m.group(1) if var_first else m.group(2))
        if not bound or re.search(r"[<>=≤≥]|\\[lg]e", bound):
            return None
        upper = (kind == "<") == var_first             # x < 3 and 3 > x: 3 is the upper end
        if upper:
            return f"(-\\infty, {bound}{')' if strict else ']'}"
        return f"{'(' if strict else '['}{bound}, \\infty)"
    return None


_INTERVAL_ASKED = re.compile(r"\binterval\b|\binequalit", re.IGNORECASE)


def interval_gold(gold: str, left: str, right: str, instruction: str | None) -> bool:
    """True when a two-item bracketed gold is an interval for sure: an end at infinity, a square
    bracket, or an instruction that asks for an interval (`(3, 4)` alone may be a point)."""
    if "\\infty" in gold or "[" in (left + right) or "]" in (left + right):
        return True
    return instruction is not None and _INTERVAL_ASKED.search(instruction[-4000:]) is not None


_INFINITY_ARITHMETIC = re.compile(r"\\infty\s*(?:[-+*/^]|\\(?:cdot|times|div)" + _END + r")|"
                                  r"(?:[-+*/^]|\\(?:cdot|times|div)" + _END + r")\s*\\infty")


def infinity_arithmetic(gold: str, pred: str) -> bool:
    """True when a scalar prediction does arithmetic with infinity (`\\infty - 1`, `2\\infty`)
    and the gold does not: infinity is no number to compute with (a leading sign is allowed)."""
    def computes(s: str) -> bool:
        s = re.sub(r"^\s*[+-]\s*(?=\\infty)", "", s.strip())
        return "\\infty" in s and (_INFINITY_ARITHMETIC.search(s) is not None or re.search(r"\d\s*\\infty", s) is not None)
    return computes(pred) and not computes(gold)
