"""Math answer checking: Math-Verify's LaTeX and expression parsing at the core, with a layer
for what a reward must not get wrong.

Entry points, with the contract of `nodeagent.verifier.checkers` (the isolated check runner
calls them; JSON in, JSON out):
- `math_verdict(gold, pred_text, instruction=None) -> {"ok": bool, "detail": str}`: what
  `answer_verdict("math", ...)` returns; `instruction` is the task's prompt when the caller has it;
- `math_equal(gold, pred_text, instruction=None) -> bool`.

How a prediction is judged (docs/verifier.md, "Math equivalence", has the table of rules):
1. Its final answers: every \\boxed{} body, when each box stands as the answer (`mathbox`: no
   operator, relation, exponent, glued digit or negating/bounding word around it; a "final
   answer" or "the answer is" line after the last box wins); else the text itself when it is a
   bare answer (read whole up to `mathnorm.MAX_ANSWER_CHARS`, spacing not counted; a longer
   one, gold or prediction, is unreadable, never one of its numbers); else the "answer: X"
   lines (a hedge on the line is all its values; a bound or condition next to a number,
   "at least 5", "5 when x = 2", reads no value); else what Math-Verify extracts. Several *different* final answers
   pass only if every one equals the gold, unless the gold itself is a set of several values.
2. A hedge (`mathnorm.alternatives`: \\lor, "or", "(or 6)", a `cases` block, rows) offers every
   value it names: each must be the gold (or, for a multi-valued gold, the set must match). A
   relation states every side: 'x = 12/2 = 6' is fine, '6 = 5' and '5 \\approx 7' are not; every
   spelling of equality is '=' ('==', '\\equiv', '\\cong', ':=', `mathrel.canonical`), and a
   relation the gold does not hold ('6 \\propto 5', '6 \\subset 5') is never the gold's value.
   An answer that restates the computation (a sum, binomial, factorial, a function at a constant,
   the instruction's own expression: `mathops.restated`) is not the value; an inequality in one
   variable is the interval it describes (`mathops.as_interval`).
3. Each answer is compared with the gold by shape (`mathnorm.structure`): a bracketed group
   compares item by item in order with the same brackets; a braced set compares as a set; a
   bare list of numbers keeps its order unless the gold lists them ascending (solutions: a set);
   a list of tuples compares as a set; a set is never an interval or a tuple and one value is
   never several. A lone comma in a gold ("-2,1") is a list.
4. Scalars: number literals (mixed numbers included) compare exactly as rationals; a gold decimal
   may be the rounding of the prediction (gold 33.3, 100/3): the gold's places say what was asked. A predicted decimal that only approximates an exact gold (sqrt(2), pi, 1/7) passes
   only when the task's instruction asks for an approximation (`mathnorm.asked_precision`), at
   the precision asked (`mathops.MIN_APPROX_SIG_DIGITS` when none is named) and right in every digit shown;
   without an instruction, the gold's exact form is what was asked. Single letters keep their
   case (text answers of words fold it), and so do symbol names Math-Verify would fold
   (`_case_clash`); everything else goes to Math-Verify's `verify`, with its LaTeX conversion
   made case-sensitive (`_case_sensitive_latex`) and the exact rule for numeric expressions.
5. Never dropped (`mathnorm.meaning_marks`, `mathnorm.units`): a negation (`\\not=`), a digit
   subscript (`5_{6}`), a scale word (`5 \\text{ thousand}`), a command that hides, colours or
   strikes out (`\\hphantom`, `\\color`, `\\cancel`), a unit other than the gold's (`5 m` for
   `5 cm`). More than `mathnorm.MAX_BOXED` boxes is a spray and fails.

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

from nodeagent.verifier import mathbox as mb
from nodeagent.verifier import mathform as mf
from nodeagent.verifier import mathleft as ml
from nodeagent.verifier import mathnorm as mn
from nodeagent.verifier import mathops as mo
from nodeagent.verifier import mathrel as mr

log = logging.getLogger(__name__)

PARSE_TIMEOUT_S = 3
VERIFY_TIMEOUT_S = 3
CHECK_BUDGET_S = 8.0             # past this, no new parse/verify starts: what is left is "not equal"
MAX_CANDIDATES = 8
MAX_TEXT_CHARS = 200_000
MAX_SET_ITEMS = 32
MAX_GOLD_GLUE_CHARS = 30         # words between a gold's boxes that still make them one set
EXACT_TOL_DIGITS = 40            # numeric expressions are equal when they agree to this many digits
DIFF_MAXN_BITS = 2000            # ... and their difference shows no digit up to this working precision
UNPARSEABLE = "unparseable answer: no \\boxed{}, 'answer:' or number found"

_AND_ITEM = re.compile(r"^(?:\\text\{\s*and\s*\}|and)\s*")


def _math_verify():
    """Math-Verify, imported on first use: it pulls in sympy and the ANTLR LaTeX parser (about a
    second), which `paddock check` and the check server's preload should pay only when needed.
    Its LaTeX conversion is set to keep the case of symbols (latex2sympy's default folds it, so
    `a+A` would read as `2a`); see `_case_sensitive_latex`."""
    import math_verify
    _case_sensitive_latex(math_verify)
    return math_verify


def _case_sensitive_latex(mv) -> None:
    """Make Math-Verify's LaTeX parse call latex2sympy with `lowercase_symbols=False` (once per
    process; its parse cache is cleared so no folded result survives)."""
    parser = mv.parser
    if getattr(parser.latex2sympy, "_paddock_case_sensitive", False):
        return
    from latex2sympy2_extended.latex2sympy2 import ConversionConfig  # noqa: PLC0415 - Math-Verify's dependency
    original, config = parser.latex2sympy, ConversionConfig(lowercase_symbols=False)

    def latex2sympy(*args, **kwargs):
        kwargs.setdefault("conversion_config", config)
        return original(*args, **kwargs)

    latex2sympy._paddock_case_sensitive = True  # type: ignore[attr-defined]  # a marker on the function object
    parser.latex2sympy = latex2sympy
    parser.parse_latex_cached.cache_clear()


def _timeouts() -> tuple[int | None, int | None]:
    """(parse, verify) timeouts for Math-Verify: its SIGALRM timer works only on the main thread."""
    if threading.current_thread() is threading.main_thread():
        return PARSE_TIMEOUT_S, VERIFY_TIMEOUT_S
    return None, None


class _Budget(threading.local):
    deadline: float | None = None
    asked: mn.Precision | None = None    # the approximation the task's instruction asks for, if any
    percent_asked: bool | None = None    # the instruction asks for a percent (None: no instruction)
    bases: frozenset[int] = frozenset()  # the number bases the instruction names
    instruction: str | None = None       # the task's prompt, when the caller passes it


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
    """An answer string (already the answer, no prose) parsed as LaTeX math (degrees inside a
    trigonometric function as radians: the parser drops the mark, `\\sin 30^\\circ` is not sin 30)."""
    s = mo.degrees_in_functions(s)
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
    text = mb.answer_marks(mn.unescape_commands(text[-MAX_TEXT_CHARS:]))
    boxed = mn.boxed_contents(text)
    if boxed:
        return mb.boxed_and_final_lines(text, boxed)
    if mn.is_bare_answer(text):
        return _dedupe([mn.normalise(text)])
    raw = mn.answer_lines(text)
    if not raw and mn.too_long_bare(text):
        return []                               # too long to read whole: never one of its numbers
    lines = _dedupe([mn.normalise(a) for a in raw])
    if len(lines) > 1:
        return lines
    if lines:                                   # the answer line is the region to read, whole
        line = mb.line_answer(raw[-1])
        if line is not None:
            return [line]
    if raw:
        hedge = _dedupe([mn.normalise(a) for a in mn.alternatives(mn.normalise(mb.ANSWER_PREFIX.sub("", raw[-1])))])
        if len(hedge) > 1:
            return hedge                        # "answer: 7 \\text{ or } 8": every value is an answer
    if raw and mb.conditioned(raw[-1]):
        return []                               # "answer: at least 5", "5 when x = 2": no value read whole
    parsed = mv_parse(mn.space_scripts(raw[-1] if raw else text))
    if parsed:
        return _dedupe([mn.normalise(str(parsed[-1]))])
    return lines


_BETWEEN_BOXES = re.compile(r"\\boxed\s*\{[^{}]*\}|[\s,;$.]|\\[()\[\]]|\\quad|\\text\{\s*(?:and|or)\s*\}|\b(?:and|or)\b")


def gold_answer(gold: str) -> str | None:
    """The gold's answer string. Several boxed values written side by side (between them only
    commas, "and", or a few words joined by "and": "\\boxed{1} papers and \\boxed{2} bins") become
    one set; boxed values scattered through a solution: the last one."""
    gold = mn.unescape_commands(gold)
    answers = final_answers(gold)
    if not answers:
        return None
    if len(answers) == 1:
        return answers[0]
    starts = [m.start() for m in re.finditer(r"\\(?:boxed|fbox)\s*\{", gold)]
    if len(starts) != len(answers):
        return answers[-1]
    group = [answers[-1]]                       # the last run of boxes joined only by glue
    for i in range(len(starts) - 2, -1, -1):
        if not _joined(gold[starts[i]:starts[i + 1]]):
            break
        group.insert(0, answers[i])
    group = _dedupe(group)
    return group[0] if len(group) == 1 else "\\{" + ", ".join(group) + "\\}"


def _joined(between: str) -> bool:
    """Two boxes are one answer when what lies between them is commas, "and", spacing, or at
    most one word without digits ("\\boxed{1} papers and \\boxed{2} bins")."""
    rest = _BETWEEN_BOXES.sub(" ", between).strip()
    return len(rest) <= MAX_GOLD_GLUE_CHARS and not re.search(r"[\d=]", rest) and len(rest.split()) <= 1


# -- comparing ----------------------------------------------------------------------------------

APPROX_REL_TOL = Fraction(1, 100)   # the approximate side of "exact \\approx decimal": within 1%


def answers_equal(gold: str, pred: str) -> bool:
    """True when the normalised answer `pred` states the normalised gold answer, and only it."""
    if len(gold) > mn.MAX_ANSWER_CHARS or len(pred) > mn.MAX_ANSWER_CHARS:
        return False
    if gold == pred:
        return True
    if ml.leftover(gold, pred) is not None:
        return False                        # "5\\textsuperscript{2}", "\\neg 5", "5-", "5′", "0^0": not read whole
    if mf.ill_formed(pred) is not None and mf.ill_formed(gold) is None:
        return False                        # "5.\\overline{0}1", "5 % 6", "5\\%\\%", "\\llap{6}5": no one value
    gold, pred = mr.canonical(gold), mr.canonical(pred)   # "6 == 5", "6 \\equiv 5": "6 = 5"
    sides = [side for side in mn.split_top(pred, "=") if side and not mr.is_lhs(side)] or [pred]
    if all(mo.restated(gold, side, _budget.instruction, _budget.asked) is not None for side in sides):
        return False                        # "\\sum_{k=1}^{100} k", "\\binom{10}{3}", "\\log_2 8": the work left undone
    sg = mn.structure(gold)
    interval = mo.as_interval(pred) if sg.kind == "group" and len(sg.items) == 2 else None
    if interval is not None and mo.interval_gold(gold, sg.left, sg.right, _budget.instruction):
        return answers_equal(gold, interval)   # "x < 3" for (-\\infty, 3)
    if sg.kind == "scalar" and mo.infinity_arithmetic(gold, pred):
        return False                        # "\\infty - 1": no number to compute with
    if mr.stray(gold, pred, mn.structure(gold).kind == "scalar"):
        return False                        # "6 \\propto 5", "6 \\subset 5": not the gold's value
    signs = None if mn.pm_variants(gold) or mn.plus_minus(gold) else mn.pm_variants(pred)
    if signs:
        return all(answers_equal(gold, v) for v in signs)   # "(\\pm 2)^2": each sign's value must be the gold
    if "=" in gold and (named := mn.named_tuple(pred)) != pred:
        return answers_equal(gold, named)   # "(x,y)=(2,1)" is "x=2, y=1"
    alts = _dedupe(mn.alternatives(pred))
    if len(alts) > 1:                       # a hedge: every value it offers must be right
        if _multi_valued(gold):
            return _as_sets(mn.structure(gold).items, tuple(alts))
        return all(answers_equal(gold, a) for a in alts)
    if alts and alts[0] != pred:
        return answers_equal(gold, alts[0])  # "6 \\text{ or } 6", a one-row cases block
    chain = _assignment_chain(gold, pred)
    if chain is not None:
        return chain
    if mn.hidden_text(pred) and not mn.hidden_text(gold):
        return False                        # "5 \\text{(or 6)}": the parser would drop the 6
    based = mf.base_equal(gold, pred, _budget.bases)
    based = mf.base_values_equal(gold, pred) if based is None else based
    if based is not None:
        return based
    if mn.primes(gold) != mn.primes(pred):
        return False                        # "f'(x)" for f(x): a derivative, which the parser drops
    if mn.meaning_marks(pred) - mn.meaning_marks(gold):
        return False                        # "x \\not= 5", "5_{6}", "5 \\text{ thousand}": not the bare value
    gm, pm = mf.marks(gold), mf.marks(pred)
    if gm and pm and gm != pm:
        return False                        # "5^\\circ" for "5\\%", "\\$5" for "5\\%": another quantity
    gu, pu = mn.units(gold), mn.units(pred)
    if gu and pu and gu != pu:
        return False                        # "5 \\text{ m}" for "5 \\text{ cm}": two different quantities
    if (gm and not pm and pu and not gu) or (pm and any(u.startswith("^") for u in pu)) or ("cents" in gu and pm):
        return False                        # "30 \\text{ rad}" for 30°, "12 \\text{ cents}" for \\$12 and back, "12°F^2"
    stated = mr.stated_values(gold, pred)
    if stated is not None:
        values, approx = stated
        if approx == "\\approx" or (not values and approx is None):
            return False
        if approx is not None and not values:
            return _one_equal(gold, approx)
        return all(_one_equal(gold, v) for v in values) and (approx is None or _close(gold, approx))
    return _one_equal(gold, pred)


def _assignment_chain(gold: str, pred: str) -> bool | None:
    """Gold 'x = 11', prediction a chain 'x = 5+6 = 7 = 11': every link must be the gold's value
    (Math-Verify reads only the last; a chain that passes through a wrong value is a hedge).
    None when the gold is no single assignment or the prediction no chain of three or more."""
    gparts = mn.split_top(gold, "=")
    pparts = mn.split_top(pred, "=")
    if len(gparts) != 2 or len(pparts) < 3 or not mr.is_lhs(gparts[0]) or mr.RELATION.search(gparts[1]):
        return None
    if any(mr.RELATION.search(p) for p in pparts) or len(mn.split_top(pred)) > 1:
        return None
    values = pparts[1:] if mr.is_lhs(pparts[0]) else pparts
    return all(_one_equal(gparts[1].strip(), v) for v in values)


def _one_equal(gold: str, pred: str) -> bool:
    """One stated value against the gold, by shape (see the module docstring, step 2)."""
    if gold == pred:
        return True
    named = mr.named_values(gold)
    if named is not None and "=" not in pred and mn.structure(pred).kind in ("group", "list", "set"):
        return _in_order(named, mn.structure(pred).items)   # "(2,1)" for "x=1, y=2": in the gold's order
    lg = None if mn.lone_comma_list(gold) else mn.number_literal(gold)
    lp = mn.number_literal(pred)
    if lg is not None and lp is not None:
        if _percent_only(gold, pred):
            return _percent_equal(gold, pred, lg, lp)
        if _percent_only(pred, gold) and literals_equal(lg, lp) is False and lp[0].denominator != 1:
            return lg[0] / 100 == lp[0]     # 0.05 for a gold 5\\%: the percent's value (never 5 for 500\\%)
        return literals_equal(lg, lp)
    solutions = mr.assigned_rhs(gold)
    if solutions is not None and mr.assigned_rhs(pred) is None and mn.structure(solutions).kind == "list":
        return _as_sets(mn.structure(solutions).items, mn.structure(pred).items)   # a = 4, -8, -10
    tg, tp = mn.text_answer(gold), mn.text_answer(pred)
    if tg is not None and tp is not None:
        return tg == tp
    sg, sp = mn.structure(gold), mn.structure(pred)
    if sg.kind == "scalar" and sp.kind == "scalar":
        if _percent_only(gold, pred):
            return _percent_equal(gold, pred, lg, lp)
        return scalars_equal(gold, pred)
    if sg.kind == sp.kind == "group":
        return (sg.left, sg.right) == (sp.left, sp.right) and _in_order(sg.items, sp.items)
    tuples = mr.assignment_tuples(sg)
    if tuples is not None and sp.kind in ("list", "group"):
        pred_items = sp.items if sp.kind == "list" else (pred,)
        return _as_sets(tuples, pred_items)          # p=5,q=2;p=7,q=2 is (5,2),(7,2)
    if sg.kind == "group" and sp.kind == "list" and sg.left == "(" and sg.right == ")":
        return _in_order(sg.items, sp.items)          # (1, 2) written 1, 2: still in order
    if sg.kind in ("set", "list") and sp.kind in ("set", "list"):
        if sg.kind == sp.kind == "list" and mr.ordered_list(sg.items) and not _ascending(sg.items):
            return _in_order(sg.items, sp.items)
        return _as_sets(sg.items, sp.items)
    if "matrix" not in (sg.left, sp.left) and not mr.RELATION.search(gold) and not mr.RELATION.search(pred):
        return False        # a set is not an interval or a tuple, one value is not several
    g, p = _parse_answer(gold), _parse_answer(pred)
    return not _case_clash(g, p) and mv_verify(g, p)


def _close(gold: str, approx: str) -> bool:
    """The approximate side of 'exact \\approx d': a number within APPROX_REL_TOL of the gold."""
    lit = mn.number_literal(approx)
    g = _parse_answer(gold)
    value = _numeric(g[0]) if g else None
    if lit is None or value is None:
        return False
    try:
        exact = Fraction(str(value.evalf(30)))
    except Exception:  # noqa: BLE001 - not a plain number: not shown close
        return False
    return abs(exact - lit[0]) <= APPROX_REL_TOL * abs(exact)


def _ascending(items: tuple[str, ...]) -> bool:
    """True when a gold list of numbers is in strictly ascending order ("-3, 3", "-2,1"): the way
    solutions are listed, read as a set. A list in any other order ("10, 4, -2") states that order."""
    values = []
    for item in items:
        lit = mn.number_literal(item.strip())
        if lit is not None:
            values.append(lit[0])
            continue
        parsed = _parse_answer(item)
        value = _numeric(parsed[0]) if parsed else None
        if value is None:
            return False
        try:
            values.append(Fraction(str(value.evalf(30))))
        except Exception:  # noqa: BLE001 - not a plain number: no order to read
            return False
    return len(values) >= 2 and all(a < b for a, b in zip(values, values[1:]))


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
    lg = None if mn.lone_comma_list(gold) else mn.number_literal(gold)
    lp = mn.number_literal(pred)
    if lg is not None and lp is not None:
        return literals_equal(lg, lp)
    g = _parse_answer(gold)
    if lp is not None and g and _numeric(g[0]) is not None:    # 4 4/9%, 28%: the literal, not the parse
        ge = _numeric(g[0])
        return _literal_matches_expr(lp, ge, literal_is_gold=False) or (
            _percent_only(gold, pred) and _literal_matches_expr((lp[0] / 100, None), ge, literal_is_gold=False))
    p = _parse_answer(pred)
    if not g or not p:
        return False
    ge, pe = _numeric(g[0]), _numeric(p[0])
    if ge is not None and pe is not None:
        if lg is not None or lp is not None:
            literal, expr = (lg, pe) if lg is not None else (lp, ge)
            assert literal is not None  # lg, else lp: one of them is set here
            if _literal_matches_expr(literal, expr, literal_is_gold=lg is not None):
                return True
            return lp is not None and _percent_only(gold, pred) and _literal_matches_expr(
                (lp[0] / 100, None), expr, literal_is_gold=False)      # 28% for a gold 7/25
        return _exact_equal(ge, pe)
    if (ge is None) != (pe is None) and _only_numbers(g[0]) and _only_numbers(p[0]):
        return False
    return not _case_clash(g, p) and mv_verify(g, p)


def _case_clash(gold: list, pred: list) -> bool:
    """True when the two parses name symbols that differ only in case (\\theta and \\Theta, a and
    A): Math-Verify's comparison folds the case of multi-letter symbol names, a reward may not."""
    if not gold or not pred:
        return False
    try:
        gs = {str(s) for s in getattr(gold[0], "free_symbols", set())}
        ps = {str(s) for s in getattr(pred[0], "free_symbols", set())}
    except Exception:  # noqa: BLE001 - no symbols to read: no clash
        return False
    return gs != ps and {n.lower() for n in gs} == {n.lower() for n in ps}


def _percent_equal(gold: str, pred: str, lg: tuple[Fraction, int | None] | None,
                   lp: tuple[Fraction, int | None] | None) -> bool:
    """A `pred` with a percent mark for a gold without one: "N%" is N when the gold is a plain
    number literal ("what percent" golds: 10, 12.5) and the instruction, if any, asks for a
    percent; it is N/100 when the gold is not whole (0.05, 7/25) and the instruction, if any, does
    not. 500% is not 5; 4 4/9% is not 40/9 (docs/verifier.md, "Percent")."""
    bare = mn.strip_percent(pred) if mn.is_percent(pred) else None     # None: a mark inside, "(500\\%)"
    plain = bare is not None and not _PERCENT_SIGN.search(bare)
    asked = _budget.percent_asked
    count = asked is True or (lg is not None and abs(lg[0]) >= 1)   # 0.25\\% is 0.0025, never 0.25 unasked
    if asked is not False and lg is not None and plain and count and _one_equal(gold, bare):   # type: ignore[arg-type]
        return True
    if asked is True or _whole(gold, lg):
        return False
    if lp is not None and mn.is_percent(pred):
        value = lp[0] / 100
        return lg[0] == value if lg is not None else scalars_equal(
            gold, f"\\frac{{{value.numerator}}}{{{value.denominator}}}")
    if plain:
        return scalars_equal(gold, f"\\frac{{{bare}}}{{100}}")
    return scalars_equal(gold, pred)         # Math-Verify reads every \\% as /100


def _whole(gold: str, lg: tuple[Fraction, int | None] | None) -> bool:
    """True when the gold is a whole number (5, 5.0, \\frac{10}{2})."""
    if lg is not None:
        return lg[0].denominator == 1
    parsed = _parse_answer(gold)
    value = _numeric(parsed[0]) if parsed else None
    return value is not None and value.is_integer is True


_PERCENT_SIGN = re.compile(r"\\%|(?<!\\)%")


def _percent_only(gold: str, pred: str) -> bool:
    """The prediction holds a percent mark and the gold does not: '28%' may state 0.28 (`_percent_equal`)."""
    return _PERCENT_SIGN.search(pred) is not None and _PERCENT_SIGN.search(gold) is None


def literals_equal(gold: tuple[Fraction, int | None], pred: tuple[Fraction, int | None]) -> bool:
    """Two number literals: equal as rationals, or the gold is a decimal and the prediction,
    given to at least as many places, rounds to it. A prediction coarser than the gold fails
    (gold 0.3333, 0.33 is less than was asked); an integer gold stands for itself."""
    (vg, pg), (vp, pp) = gold, pred
    if vg == vp:
        return True
    if mo.rounded_by_instruction(gold, pred, _budget.asked) is False:
        return False                        # 3.14159 for "to the nearest hundredth": not rounded
    if pg is None or (pp or 0) < pg:
        return False
    return mo.rounds_to(vp, gold, mn.significant_digits)


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


def _literal_matches_expr(literal: tuple[Fraction, int | None], expr, literal_is_gold: bool) -> bool:
    """A number literal against a closed-form number: exact for integers and for decimals that
    are the value. A gold decimal may be the rounding of the exact prediction (gold 33.3, 100/3):
    the gold's places say what was asked. A predicted decimal (or, for "the nearest whole number",
    integer) that only approximates an exact gold passes only when the task's instruction asks for
    an approximation (`mathops.approximation_ok`): 1.414 is not sqrt(2), 0.1429 is not 1/7."""
    import sympy  # noqa: PLC0415 - loaded with math_verify (see _math_verify)
    value, places = literal
    rational = sympy.Rational(value.numerator, value.denominator)
    if expr.is_Rational:
        exact = Fraction(int(expr.p), int(expr.q))
        if exact == value:
            return True
        if literal_is_gold:       # an exact prediction when the instruction asks to round: not rounded
            return places is not None and _budget.asked is None and mo.rounds_to(exact, literal, mn.significant_digits)
        return mo.approximation_ok(exact, literal, _budget.asked, mn.significant_digits)
    if places is None and (literal_is_gold or _budget.asked is None):
        return _exact_equal(rational, expr)
    try:
        diff = sympy.Abs(expr - rational).evalf(EXACT_TOL_DIGITS)
        if not diff.is_number or diff.is_real is False:
            return False
        approx = Fraction(str(sympy.Float(expr.evalf(EXACT_TOL_DIGITS), EXACT_TOL_DIGITS)))
    except Exception:  # noqa: BLE001 - cannot evaluate: not shown equal
        return False
    if literal_is_gold:
        return _budget.asked is None and mo.rounds_to(approx, literal, mn.significant_digits)
    return mo.approximation_ok(approx, literal, _budget.asked, mn.significant_digits)


def _exact_equal(a, b) -> bool:
    """Two closed-form numbers: rationals exactly; others when they agree to EXACT_TOL_DIGITS
    significant digits (evaluated with margin) and sympy cannot prove them different, else when
    their difference simplifies to 0. Under Math-Verify's timer on the main thread (`_bounded`)."""
    if a.is_Rational and b.is_Rational:
        return a == b
    return _bounded(_closed_forms_equal, a, b)


def _closed_forms_equal(a, b) -> bool:
    import sympy  # noqa: PLC0415 - loaded with math_verify (see _math_verify)
    try:
        va, vb = a.evalf(EXACT_TOL_DIGITS + 20), b.evalf(EXACT_TOL_DIGITS + 20)
        if va.is_Number and vb.is_Number:
            scale = max(sympy.Integer(1), abs(va))
            if not abs(va - vb) < scale * sympy.Rational(1, 10 ** EXACT_TOL_DIGITS):
                return False
            d = sympy.nsimplify(a - b, rational=True) if (a - b).has(sympy.Float) else a - b   # decimals as written
            for form in (d, d.expand()):
                try:
                    if form.evalf(EXACT_TOL_DIGITS, strict=True, maxn=DIFF_MAXN_BITS) != 0 or form.is_zero is False:
                        return False
                except ArithmeticError:   # PrecisionExhausted: no digit of it is known, 0 as far as evalf goes
                    continue     # (a term below the tolerance, 5050 + 10^{-100}, is another number)
            return True
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


def math_verdict(gold: str, pred_text: str | None, instruction: str | None = None) -> dict:
    """{"ok": bool, "detail": str} for a math answer check (the `checkers.answer_verdict`
    contract for kind "math"). `instruction`, the task's prompt when the caller has it, says
    whether a decimal approximation of an exact gold is asked (`mathnorm.asked_precision`);
    without it the gold's own form is the instruction. Never raises."""
    _budget.deadline = time.monotonic() + CHECK_BUDGET_S
    try:
        _budget.asked = mn.asked_precision(str(instruction)) if instruction else None
        _budget.percent_asked = mn.percent_asked(str(instruction)) if instruction else None
        _budget.bases = mf.asked_bases(str(instruction)) if instruction else frozenset()
        _budget.instruction = str(instruction) if instruction else None
        return _verdict(str(gold), pred_text)
    except Exception as exc:  # noqa: BLE001 - a checker bug must not crash the check process
        log.warning("math check failed: %s: %s", type(exc).__name__, exc)
        return {"ok": False, "detail": f"math check error: {type(exc).__name__}"}
    finally:
        _budget.deadline = None
        _budget.asked = None
        _budget.percent_asked = None
        _budget.bases = frozenset()
        _budget.instruction = None


def _verdict(gold: str, pred_text: str | None) -> dict:
    if pred_text is None or not str(pred_text).strip():
        return {"ok": False, "detail": "no answer given"}
    why = mb.ill_formed(str(pred_text)[-MAX_TEXT_CHARS:])
    if why:
        return {"ok": False, "detail": why}
    answers = final_answers(str(pred_text))
    if not answers:
        return {"ok": False, "detail": UNPARSEABLE}
    g = gold_answer(gold)
    if g is None:
        return {"ok": False, "detail": f"unparseable gold answer {gold[:200]!r}"}
    if len(answers) > MAX_CANDIDATES:
        return {"ok": False, "detail": f"{len(answers)} different final answers given (at most {MAX_CANDIDATES})"}
    left = next((x for a in answers if len(a) <= mn.MAX_ANSWER_CHARS and (x := ml.leftover(g, a, whole=True))), None)
    if len(answers) == 1:
        ok = left is None and answers_equal(g, answers[0])
        return {"ok": ok, "detail": f"extracted={answers[0][:200]!r} gold={g[:200]!r}" + (f" ({left})" if left else "")}
    if left is not None:
        return {"ok": False, "detail": f"{len(answers)} different final answers given, one not read whole ({left})"}
    ok = all(answers_equal(g, a) for a in answers)
    if not ok and _multi_valued(g):
        ok = answers_equal(g, "\\{" + ", ".join(answers) + "\\}")
    return {"ok": ok, "detail": f"{len(answers)} different final answers given, "
            f"{'all equal to' if ok else 'not all equal to'} gold={g[:200]!r}"}


def math_equal(gold: str, pred_text: str | None, instruction: str | None = None) -> bool:
    """True when the final answer in `pred_text` equals `gold` (see `math_verdict`)."""
    return bool(math_verdict(gold, pred_text, instruction)["ok"])
