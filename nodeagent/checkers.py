"""Answer checkers that run outside any sandbox: math answer equivalence, exact and regex match.

`math_equal(gold, pred)`: extract the final answer (\\boxed{...}, "answer:", last number),
normalise LaTeX, compare exactly, then as numbers with a tolerance, then symbolically with
sympy in a separate process under a hard timeout (a pathological expression costs only its own
check). Pure functions apart from that one subprocess. Must not import zmq or the controller.
"""
from __future__ import annotations

import re
import subprocess
import sys
from fractions import Fraction

SYMPY_TIMEOUT_S = 5.0
REL_TOL = 1e-6

_BOXED = re.compile(r"\\boxed\s*\{")
_NUMBER = re.compile(r"-?\d+(?:\.\d+)?(?:/\d+)?")


def extract_answer(text: str | None) -> str | None:
    """The final answer in a model's text: last \\boxed{}, else after 'answer:', else last number."""
    if not text:
        return None
    starts = [m.end() for m in _BOXED.finditer(text)]
    if starts:
        i, depth, out = starts[-1], 1, []
        while i < len(text):
            ch = text[i]
            depth += (ch == "{") - (ch == "}")
            if depth == 0:
                return "".join(out).strip()
            out.append(ch)
            i += 1
        return None
    m = re.search(r"answer\s*(?:is|:)\s*(.+)", text, re.IGNORECASE)
    if m:
        return m.group(1).strip().rstrip(".")
    nums = _NUMBER.findall(text)
    return nums[-1] if nums else None


def normalise(ans: str) -> str:
    s = ans.strip().strip("$").strip()
    for old, new in (("\\left", ""), ("\\right", ""), ("\\dfrac", "\\frac"), ("\\tfrac", "\\frac"),
                     ("\\!", ""), ("\\,", ""), ("\\ ", ""), ("^\\circ", ""), ("\\%", ""),
                     ("\\cdot", "*"), ("\\times", "*"), ("{,}", "")):
        s = s.replace(old, new)
    s = re.sub(r"\\text\{[^}]*\}", "", s)
    s = re.sub(r"\s+", "", s)
    s = re.sub(r"^[a-zA-Z]=", "", s)
    return s.rstrip(".")


def _latex_to_sympy(s: str) -> str:
    s = re.sub(r"\\frac\{([^{}]*)\}\{([^{}]*)\}", r"((\1)/(\2))", s)
    s = re.sub(r"\\sqrt\{([^{}]*)\}", r"sqrt(\1)", s)
    s = re.sub(r"\\sqrt(\d+)", r"sqrt(\1)", s)
    s = s.replace("\\pi", "pi").replace("^", "**").replace("{", "(").replace("}", ")")
    s = re.sub(r"(\d)([a-zA-Z(])", r"\1*\2", s)
    return s


def _as_number(s: str) -> Fraction | float | None:
    s = s.replace(",", "")
    try:
        return Fraction(s)
    except (ValueError, ZeroDivisionError):
        pass
    m = re.fullmatch(r"\\frac\{(-?\d+)\}\{(\d+)\}", s) or re.fullmatch(r"-?\\frac\{(\d+)\}\{(\d+)\}", s)
    if m and int(m.group(2)):
        sign = -1 if s.startswith("-") and not m.group(1).startswith("-") else 1
        return sign * Fraction(int(m.group(1)), int(m.group(2)))
    return None


_SYMPY_PROG = """
import sys
from sympy import simplify, sympify
a, b = sys.argv[1], sys.argv[2]
try:
    print("true" if simplify(sympify(a) - sympify(b)) == 0 else "false")
except Exception:
    print("error")
"""


def sympy_equal(a: str, b: str, timeout_s: float = SYMPY_TIMEOUT_S) -> bool | None:
    """Symbolic equality in its own process; None when undecidable or over the time limit."""
    try:
        r = subprocess.run([sys.executable, "-c", _SYMPY_PROG, a, b], capture_output=True,
                           text=True, timeout=timeout_s)
    except subprocess.TimeoutExpired:
        return None
    out = r.stdout.strip()
    return {"true": True, "false": False}.get(out)


def math_equal(gold: str, pred_text: str | None) -> bool:
    pred = extract_answer(pred_text)
    if pred is None:
        return False
    g, p = normalise(gold), normalise(pred)
    if g == p:
        return True
    gn, pn = _as_number(g), _as_number(p)
    if gn is not None and pn is not None:
        return abs(float(gn) - float(pn)) <= REL_TOL * max(1.0, abs(float(gn)))
    if not p or len(p) > 200:
        return False
    return bool(sympy_equal(_latex_to_sympy(g), _latex_to_sympy(p)))


def exact_match(gold: str, pred_text: str | None) -> bool:
    return (pred_text or "").strip() == gold.strip()


def regex_match(pattern: str, pred_text: str | None) -> bool:
    return re.fullmatch(pattern, (pred_text or "").strip()) is not None
