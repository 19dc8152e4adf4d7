"""Math answer checking: Math-Verify's LaTeX and expression parsing at the core, with a layer
for what a reward must not get wrong.

Entry points, with the contract of `nodeagent.verifier.checkers` (the isolated check runner
calls them; JSON in, JSON out):
- `math_verdict(gold, pred_text) -> {"ok": bool, "detail": str}`: what `answer_verdict("math",
  ...)` returns;
- `math_equal(gold, pred_text) -> bool`.

How a prediction is judged:
1. Its final answers: every \\boxed{} body; else, when the text is itself a bare answer, the
   text; else every "answer: X" line when there are several; else what Math-Verify extracts.
   Several *different* final answers pass only if every one equals the gold (a spray of
   candidates fails whichever comes last), unless the gold itself is a set of several values.
2. Each answer is compared with the gold by shape (`mathnorm.structure`): a bracketed group
   compares item by item in order with the same brackets (intervals keep open/closed ends,
   tuples keep their order); a braced set compares as a set; a bare list of numbers keeps its
   order; a list of tuples compares as a set.
3. Scalars: plain number literals compare exactly as rationals (3628803 is not 10!); a decimal
   may stand for a value rounded to its places (0.33 for 1/3, gold 33.3 for 100/3), only with
   at least 3 significant digits or 2 places. Pure text answers (\\text{(E)}, (C)) compare by
   their folded text. Everything else goes to Math-Verify's `verify` (sets, intervals,
   relations, matrices, symbolic equality), with the exact rule for numeric expressions.

Time: one check starts no new parse or comparison after CHECK_BUDGET_S (the rest counts as
"not shown equal"); each parse and comparison runs under Math-Verify's own timeouts on the
main thread (they use SIGALRM, which works only there); on another thread those are off and
the caller's deadline (the check runner kills the process) bounds the check. Inputs are capped (`mathnorm.MAX_ANSWER_CHARS`,
`MAX_TEXT_CHARS`, `MAX_CANDIDATES`, `mathnorm.MAX_BOXED`). No exception escapes `math_verdict`.

Must not import: zmq, controller other than controller.contracts, nodeagent.verifier.checkers
(which imports this one), nodeagent.verifier.grade.
"""
from __future__ import annotations

import logging
import re
import threading
import time
from fractions import Fraction

from nodeagent.verifier import mathnorm as mn

log = logging.getLogger(__name__)

PARSE_TIMEOUT_S = 3
VERIFY_TIMEOUT_S = 3
CHECK_BUDGET_S = 8.0             # past this, no new parse/verify starts: what is left is "not equal"
MAX_CANDIDATES = 8
MAX_TEXT_CHARS = 200_000
MAX_SET_ITEMS = 32
MIN_ROUNDED_SIG_DIGITS = 3       # a rounded decimal needs this many significant digits ...
MIN_ROUNDED_PLACES = 2           # ... or this many decimal places
EXACT_TOL_DIGITS = 40            # numeric expressions are equal when they agree to this many digits
UNPARSEABLE = "unparseable answer: no \\boxed{}, 'answer:' or number found"

_RELATION = re.compile(r"<|>|\\le|\\ge|\\ne|\\lt|\\gt|\\neq|\\approx|\\in\b|=")
_ASSIGN_LHS = re.compile(r"[A-Za-z](?:_\{?\w+\}?)?|\([A-Za-z](?:\s*,\s*[A-Za-z])*\)|[A-Za-z]\([A-Za-z0-9]\)")
_AND_ITEM = re.compile(r"^(?:\\text\{\s*and\s*\}|and)\s*")


def _math_verify():
    """Math-Verify, imported on first use: it pulls in sympy and the ANTLR LaTeX parser (about a
    second), which `paddock check` and the check server's preload should pay only when needed."""
    import math_verify
    return math_verify


def _timeouts() -> tuple[int | None, int | None]:
    """(parse, verify) timeouts for Math-Verify: its SIGALRM timer works only on the main thread."""
    if threading.current_thread() is threading.main_thread():
        return PARSE_TIMEOUT_S, VERIFY_TIMEOUT_S
    return None, None


class _Budget(threading.local):
    deadline: float | None = None


_budget = _Budget()


def _out_of_time() -> bool:
    return _budget.deadline is not None and time.monotonic() > _budget.deadline


def mv_parse(text: str) -> list:
    """Math-Verify's parse with its LaTeX and expression extraction; [] on any failure or when
    the check's CHECK_BUDGET_S is spent."""
    if _out_of_time():
        return []
    mv = _math_verify()
    try:
        return mv.parse(text, extraction_config=[mv.LatexExtractionConfig(), mv.ExprExtractionConfig()],
                        parsing_timeout=_timeouts()[0], raise_on_error=False)
    except Exception:  # noqa: BLE001 - a parser failure means "no answer found"
        return []


def mv_verify(gold: list, pred: list) -> bool:
    """Math-Verify's verify (float rounding 6, strict); False on any failure or timeout."""
    if _out_of_time():
        return False
    try:
        return bool(_math_verify().verify(gold, pred, timeout_seconds=_timeouts()[1], raise_on_error=False))
    except Exception:  # noqa: BLE001 - undecidable means "not shown equal"
        return False


def _parse_answer(s: str) -> list:
    """An answer string (already the answer, no prose) parsed as LaTeX math."""
    return mv_parse(f"${s}$") or mv_parse(s)


# -- finding the final answers ----------------------------------------------------------------

def _dedupe(answers: list[str]) -> list[str]:
    seen: dict[str, None] = {}
    for a in answers:
        if a:
            seen.setdefault(a, None)
    return list(seen)


def final_answers(text: str) -> list[str]:
    """The distinct final answers in `text`, normalised (see the module docstring, step 1)."""
    text = text[-MAX_TEXT_CHARS:]
    boxed = mn.boxed_contents(text)
    if boxed:
        return _dedupe([mn.normalise(b) for b in boxed])
    if mn.is_bare_answer(text):
        return _dedupe([mn.normalise(text)])
    lines = _dedupe([mn.normalise(a) for a in mn.answer_lines(text)])
    if len(lines) > 1:
        return lines
    parsed = mv_parse(text)
    if parsed:
        return _dedupe([mn.normalise(str(parsed[-1]))])
    return lines


_BETWEEN_BOXES = re.compile(r"\\boxed\s*\{[^{}]*\}|[\s,;$.]|\\[()\[\]]|\\quad|\\text\{\s*(?:and|or)\s*\}|\b(?:and|or)\b")


def gold_answer(gold: str) -> str | None:
    """The gold's answer string. Several boxed values written side by side (only commas, "and"
    between them) become one set; boxed values scattered through a solution: the last one."""
    answers = final_answers(gold)
    if not answers:
        return None
    if len(answers) == 1:
        return answers[0]
    first, last = gold.find("\\boxed"), gold.rfind("\\boxed")
    if _BETWEEN_BOXES.sub("", gold[first:last]).strip():
        return answers[-1]
    return "\\{" + ", ".join(answers) + "\\}"


# -- comparing ----------------------------------------------------------------------------------

def _strip_assignment(gold: str, pred: str) -> str:
    """'x = 5' -> '5' and 'x \\in [0, 1)' -> '[0, 1)' when the gold states no relation itself."""
    if _RELATION.search(gold):
        return pred
    for sep in ("=", "\\in "):
        parts = mn.split_top(pred, sep)
        if len(parts) > 1 and re.search(r"<|>|\\le|\\ge|\\ne", pred) is None:
            lhs, pred = parts[0], parts[-1]
            if sep == "\\in " and not _ASSIGN_LHS.fullmatch(lhs):
                return parts[0] + sep + parts[-1]
    if "\\approx" in pred:
        left, _, right = pred.partition("\\approx")
        pred = right.strip() if _ASSIGN_LHS.fullmatch(left.strip()) else left.strip()
    return pred


def answers_equal(gold: str, pred: str) -> bool:
    """True when the normalised answer `pred` states the normalised gold answer."""
    if len(gold) > mn.MAX_ANSWER_CHARS or len(pred) > mn.MAX_ANSWER_CHARS:
        return False
    if gold == pred:
        return True
    pred = _strip_assignment(gold, pred)
    if gold == pred:
        return True
    solutions = _assigned_rhs(gold)
    if solutions is not None and _assigned_rhs(pred) is None and mn.structure(solutions).kind == "list":
        return _as_sets(mn.structure(solutions).items, mn.structure(pred).items)   # a = 4, -8, -10
    tg, tp = mn.text_answer(gold), mn.text_answer(pred)
    if tg is not None and tp is not None:
        return tg == tp
    sg, sp = mn.structure(gold), mn.structure(pred)
    if sg.kind == "scalar" and sp.kind == "scalar":
        return scalars_equal(gold, pred)
    if sg.kind == sp.kind == "group":
        return (sg.left, sg.right) == (sp.left, sp.right) and _in_order(sg.items, sp.items)
    if sg.kind in ("set", "list") and sp.kind in ("set", "list"):
        if sg.kind == sp.kind == "list" and _ordered_list(sg.items):
            return _in_order(sg.items, sp.items)
        return _as_sets(sg.items, sp.items)
    return mv_verify(_parse_answer(gold), _parse_answer(pred))


def _assigned_rhs(s: str) -> str | None:
    """'a = 4, -8' -> '4, -8' (one variable given its values), else None."""
    parts = s.split("=")
    if len(parts) == 2 and _ASSIGN_LHS.fullmatch(parts[0].strip()) and not _RELATION.search(parts[1]):
        return parts[1].strip()
    return None


def _ordered_list(items: tuple[str, ...]) -> bool:
    """A bare list of values keeps its order ("10, 4, -2" is not "4, 10, -2"); a list of
    tuples or of equations ("a_3 = 2, a_{37} = 19") is a set of solutions."""
    return all(mn.structure(i).kind == "scalar" and not _RELATION.search(i) for i in items)


def _clean_item(item: str) -> str:
    return _AND_ITEM.sub("", item).strip()


def _in_order(gold: tuple[str, ...], pred: tuple[str, ...]) -> bool:
    return len(gold) == len(pred) and all(
        answers_equal(_clean_item(g), _clean_item(p)) for g, p in zip(gold, pred))


def _as_sets(gold: tuple[str, ...], pred: tuple[str, ...]) -> bool:
    """Equal as sets: every gold item is among the predicted ones and every predicted item is
    among the gold ones (a repeated item is one item)."""
    g, p = _dedupe([_clean_item(i) for i in gold]), _dedupe([_clean_item(i) for i in pred])
    if not g or not p or len(g) > MAX_SET_ITEMS or len(p) > MAX_SET_ITEMS:
        return False
    matched_pred: set[int] = set()
    for item in g:
        hits = [j for j, c in enumerate(p) if answers_equal(item, c)]
        if not hits:
            return False
        matched_pred.update(hits)
    return len(matched_pred) == len(p)


def scalars_equal(gold: str, pred: str) -> bool:
    """One value against one value: exact for integers and fractions, rounded decimals by
    their places, numeric expressions exactly, everything else by Math-Verify."""
    lg, lp = mn.number_literal(gold), mn.number_literal(pred)
    if lg is not None and lp is not None:
        return literals_equal(lg, lp)
    g, p = _parse_answer(gold), _parse_answer(pred)
    if not g or not p:
        return False
    ge, pe = _numeric(g[0]), _numeric(p[0])
    if ge is not None and pe is not None:
        if lg is not None or lp is not None:
            literal, expr = (lg, pe) if lg is not None else (lp, ge)
            return _literal_matches_expr(literal, expr)
        return _exact_equal(ge, pe)
    if (ge is None) != (pe is None) and _only_numbers(g[0]) and _only_numbers(p[0]):
        return False
    return mv_verify(g, p)


def literals_equal(a: tuple[Fraction, int | None], b: tuple[Fraction, int | None]) -> bool:
    """Two number literals: equal as rationals, or the coarser decimal is the finer one rounded."""
    (va, pa), (vb, pb) = a, b
    if va == vb:
        return True
    if pa is None and pb is None:
        return False
    coarse, fine = (a, b) if (pa or 0) <= (pb or 0) else (b, a)
    if coarse[1] is None:
        return False                      # an integer stands for itself, not a rounding
    return _rounds_to(fine[0], coarse)


def _rounds_to(value, literal: tuple[Fraction, int | None]) -> bool:
    """True when the decimal `literal` is `value` (exact) rounded to its places, and it carries
    enough digits to mean something (MIN_ROUNDED_SIG_DIGITS or MIN_ROUNDED_PLACES)."""
    lit, places = literal
    if places is None:
        return False
    if places < MIN_ROUNDED_PLACES and mn.significant_digits(lit, places) < MIN_ROUNDED_SIG_DIGITS:
        return False
    return abs(value - lit) <= Fraction(1, 2 * 10 ** places)


def _numeric(expr):
    """`expr` when it is a single real number-valued sympy expression, else None."""
    import sympy  # noqa: PLC0415 - loaded with math_verify (see _math_verify)
    if not isinstance(expr, sympy.Expr) or isinstance(expr, (sympy.Tuple,)) or expr.free_symbols:
        return None
    try:
        return expr if expr.is_number and expr.is_real is not False else None
    except Exception:  # noqa: BLE001
        return None


def _only_numbers(expr) -> bool:
    import sympy  # noqa: PLC0415 - loaded with math_verify (see _math_verify)
    return isinstance(expr, sympy.Expr) and not expr.free_symbols


def _literal_matches_expr(literal: tuple[Fraction, int | None], expr) -> bool:
    """A number literal against a closed-form number: exact for integers, rounding for decimals."""
    import sympy  # noqa: PLC0415 - loaded with math_verify (see _math_verify)
    value, places = literal
    rational = sympy.Rational(value.numerator, value.denominator)
    if expr.is_Rational:
        exact = Fraction(int(expr.p), int(expr.q))
        return exact == value or (places is not None and _rounds_to(exact, literal))
    if places is None:
        return _exact_equal(rational, expr)
    try:
        diff = sympy.Abs(expr - rational).evalf(EXACT_TOL_DIGITS)
        if not diff.is_number or diff.is_real is False:
            return False
        approx = Fraction(str(sympy.Float(expr.evalf(EXACT_TOL_DIGITS), EXACT_TOL_DIGITS)))
    except Exception:  # noqa: BLE001 - cannot evaluate: not shown equal
        return False
    return _rounds_to(approx, literal)


def _exact_equal(a, b) -> bool:
    """Two closed-form numbers: rationals exactly; others when they agree to EXACT_TOL_DIGITS
    significant digits (evaluated with margin), else when their difference simplifies to 0.
    The sympy work runs under Math-Verify's timer on the main thread (see `_bounded`)."""
    if a.is_Rational and b.is_Rational:
        return a == b
    return _bounded(_closed_forms_equal, a, b)


def _closed_forms_equal(a, b) -> bool:
    import sympy  # noqa: PLC0415 - loaded with math_verify (see _math_verify)
    try:
        va, vb = a.evalf(EXACT_TOL_DIGITS + 20), b.evalf(EXACT_TOL_DIGITS + 20)
        if va.is_Number and vb.is_Number:
            scale = max(sympy.Integer(1), abs(va))
            return bool(abs(va - vb) < scale * sympy.Rational(1, 10 ** EXACT_TOL_DIGITS))
        return bool(sympy.simplify(a - b) == 0)
    except Exception:  # noqa: BLE001 - cannot decide: not shown equal
        return False


def _bounded(fn, *args) -> bool:
    """`fn(*args)` under Math-Verify's SIGALRM timeout (VERIFY_TIMEOUT_S) when on the main
    thread; elsewhere unbounded here and bounded by the caller's deadline. A timeout is False."""
    seconds = _timeouts()[1]
    if _out_of_time():
        return False
    if seconds is None:
        return fn(*args)
    mv = _math_verify()
    try:
        return mv.utils.timeout(seconds)(fn)(*args)
    except mv.errors.TimeoutException:
        return False


# -- verdicts -----------------------------------------------------------------------------------

def _multi_valued(gold: str) -> bool:
    return mn.structure(gold).kind in ("set", "list")


def math_verdict(gold: str, pred_text: str | None) -> dict:
    """{"ok": bool, "detail": str} for a math answer check (the `checkers.answer_verdict`
    contract for kind "math"). Never raises."""
    _budget.deadline = time.monotonic() + CHECK_BUDGET_S
    try:
        return _verdict(str(gold), pred_text)
    except Exception as exc:  # noqa: BLE001 - a checker bug must not crash the check process
        log.warning("math check failed: %s: %s", type(exc).__name__, exc)
        return {"ok": False, "detail": f"math check error: {type(exc).__name__}"}
    finally:
        _budget.deadline = None


def _verdict(gold: str, pred_text: str | None) -> dict:
    if pred_text is None or not str(pred_text).strip():
        return {"ok": False, "detail": "no answer given"}
    answers = final_answers(str(pred_text))
    if not answers:
        return {"ok": False, "detail": UNPARSEABLE}
    g = gold_answer(gold)
    if g is None:
        return {"ok": False, "detail": f"unparseable gold answer {gold[:200]!r}"}
    if len(answers) > MAX_CANDIDATES:
        return {"ok": False, "detail": f"{len(answers)} different final answers given (at most {MAX_CANDIDATES})"}
    if len(answers) == 1:
        ok = answers_equal(g, answers[0])
        return {"ok": ok, "detail": f"extracted={answers[0][:200]!r} gold={g[:200]!r}"}
    ok = all(answers_equal(g, a) for a in answers)
    if not ok and _multi_valued(g):
        ok = answers_equal(g, "\\{" + ", ".join(answers) + "\\}")
    return {"ok": ok, "detail": f"{len(answers)} different final answers given, "
            f"{'all equal to' if ok else 'not all equal to'} gold={g[:200]!r}"}


def math_equal(gold: str, pred_text: str | None) -> bool:
    """True when the final answer in `pred_text` equals `gold` (see `math_verdict`)."""
    return bool(math_verdict(gold, pred_text)["ok"])
