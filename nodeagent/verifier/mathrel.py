"""Relations in a math answer: one spelling for each, and the ones a bare value must not carry.

A relation states every side (`mathanswer`): `x = 12/2 = 6` is 6, `6 = 5` is not 5. That holds
only if every way of writing a relation is read as one:
- `canonical(s)`: equality written otherwise becomes `=` (`==`, `=\\!=`, `:=`, `=:`, `\\coloneqq`,
  `\\colon=`, `\\equiv`, `\\cong`, `\\doteq`, `\\circeq`, `\\triangleq`, `\\bumpeq`, `\\stackrel{?}{=}`,
  `\\overset{def}{=}`, the words "equals", "is congruent to", and `≡ ≅ ≐ ≔ ≕ ≜ ≝ ≟ ⩵`); an
  approximation becomes `\\approx` (`\\approxeq`, `\\thickapprox`, `≈ ≊`); `≠ ≤ ≥ ≃ ∼ ∈ ∉ ⊂ ⊆`
  become their commands; `!=`, `<=`, `>=` become `\\ne`, `\\le`, `\\ge`; a biconditional
  (`\\iff`, `\\Leftrightarrow`, `⇔`) is `=`; any other character of the arrows and mathematical
  operators blocks is read by its Unicode name: an equality (`≗ ≙ ⩮`) is `=`, another relation
  (`⪯ ⊊ ∣`) a family of its own;
- `families(s)`: the other relations `s` holds, by family (`family(name)`: order, negation,
  inclusion, membership, precedence, divisibility, proportion, turnstiles, ...; a command is
  known by its name in the amssymb tables or by the shape of that name: `\\n...` of a relation
  is a negation, `...prec...`/`...succ...` precedence, `...subset...` inclusion): an answer
  holding a relation its gold does not (`6 \\propto 5`, `6 \\subset 5`, `6 \\in 5`, `6 \\perp 5`
  for gold 5) states something else than the gold's value; `stray(gold, pred)` says so. Order
  relations are allowed against a gold that is an interval or a set (`x \\in (0, 5)`), and `x
  \\in S` (a variable's membership) is read by `mathanswer`;
- what a relation states, for `mathanswer`: `stated_values(gold, pred)` (`x = 12/2 = 6` states 12/2
  and 6), `assigned_rhs(s)` (`a = 4, -8`), `assignment_tuples(shape)` (`p=5,q=2; p=7,q=2`),
  `is_lhs(s)` (a variable or tuple of variables on the left of `=`).

Pure string functions. Must not import: sympy, math_verify, zmq, controller.store,
controller.broker, nodeagent.verifier.mathanswer.
"""
from __future__ import annotations

import functools
import re
import unicodedata

from nodeagent.verifier import mathnorm as mn

_END = r"(?![A-Za-z])"
_EQ_CMDS = ("iff", "Leftrightarrow", "leftrightarrow", "Longleftrightarrow", "longleftrightarrow", "equiv", "cong",
            "doteq", "Doteq", "doteqdot", "circeq", "triangleq", "bumpeq", "Bumpeq",
            "coloneqq", "Coloneqq", "coloneq", "Coloneq", "eqqcolon", "Eqqcolon", "eqcolon", "Eqcolon",
            "risingdotseq", "fallingdotseq", "eqdef", "measeq", "questeq", "eqcirc", "Equiv")
_STACKED = re.compile(r"\\(?:stackrel|overset|underset)\s*\{(?:[^{}]|\{[^{}]*\}){0,40}\}\s*\{\s*(=|\\equiv|\\cong|\\sim|\\approx)\s*\}")
_EQUALITY = re.compile(r"\\(?:" + "|".join(_EQ_CMDS) + r")" + _END
                       + r"|=\s*\\!\s*=|\\colon\s*=|::=|:=|=:|(?<![<>!=])=(?:\s*=)+|[≡≅≐≔≕≜≝≟⩵⩶]"
                       + r"|\\(?:text|mbox|mathrm|textrm)\s*\{\s*(?:is\s+)?(?:equals?|equal\s+to|congruent\s+to|"
                       r"equivalent\s+to|identical\s+to|the\s+same\s+as)\s*\}")
_APPROX = re.compile(r"\\(?:approxeq|thickapprox)" + _END + r"|[≈≊]")
_ASCII = ((re.compile(r"(?<!\\)!="), "\\\\ne "), (re.compile(r"<="), "\\\\le "), (re.compile(r">="), "\\\\ge "))
_UNICODE = {"≠": "\\ne ", "≤": "\\le ", "≥": "\\ge ", "≃": "\\simeq ", "∼": "\\sim ", "∈": "\\in ", "∉": "\\notin ",
            "⊂": "\\subset ", "⊆": "\\subseteq ", "⊃": "\\supset ", "⊇": "\\supseteq ", "∝": "\\propto ",
            "⊥": "\\perp ", "∥": "\\parallel ", "≪": "\\ll ", "≫": "\\gg ", "≺": "\\prec ", "≻": "\\succ "}

_ORDER = ("lt", "gt", "le", "ge", "leq", "geq", "leqq", "geqq", "leqslant", "geqslant", "ll", "gg", "lll", "ggg",
          "llless", "gggtr", "eqslantless", "eqslantgtr")
_NAMED = {"ne": "negation", "neq": "negation", "not": "negation", "notin": "negation", "neqq": "negation",
          "in": "membership", "ni": "membership", "owns": "membership", "propto": "proportion",
          "varpropto": "proportion", "perp": "perp", "asymp": "asymp", "bowtie": "bowtie", "between": "between",
          "pitchfork": "pitchfork", "divides": "mid", "therefore": "logic", "because": "logic",
          "dashv": "turnstile", "models": "turnstile", "lhd": "triangle", "rhd": "triangle",
          "unlhd": "triangle", "unrhd": "triangle", **{c: "order" for c in _ORDER}}
# Relation commands by the shape of their names (the amssymb tables): every negated, order,
# precedence, inclusion, divisibility, turnstile, triangle and similarity relation.
_SHAPES = (
    (re.compile(r"(?:less|gtr|eqslant)[a-z]*|[lg]n(?:eqq?|sim|approx)|[lg]vertneqq|[lg](?:e|eq|eqq|eqslant)?dot|"
                r"[lg]tr?dot|lessdot|gtrdot"), "order"),
    (re.compile(r"[a-z]*(?:prec|succ)[a-z]*"), "precedence"),
    (re.compile(r"(?:var|n)?(?:sq)?(?:sub|sup)set[a-z]*|Subset|Supset"), "inclusion"),
    (re.compile(r"(?:short|n|nshort)?(?:mid|parallel)"), "mid"),
    (re.compile(r"(?:small)?(?:smile|frown)"), "smile"),
    (re.compile(r"n?(?:v|V|Vv)(?:dash|Dash|DASH)|nVDash|vdash"), "turnstile"),
    (re.compile(r"(?:var|n|black)?triangle(?:left|right)(?:eq(?:slant)?)?"), "triangle"),
    (re.compile(r"(?:back|thick|eq|n)?sim(?:eq)?|backsimeq|[a-z]+approx|approxident"), "similar"),
)
_NOT_RELATIONS = {"sim", "simeq", "approx", "thicksim", "eqsim", "backsim"}   # `\\approx` is read by mathanswer, `\\sim`
#                                                                            is a meaning mark (mathnorm)
_COMMAND = re.compile(r"\\([A-Za-z]+)(?:\{([A-Z]+)\})?")
_BARE_ORDER = re.compile(r"(?<![\\{])[<>]")
_VARIABLE_IN = re.compile(r"\s*(?:[A-Za-z](?:_\{?\w+\}?)?|\([A-Za-z](?:\s*,\s*[A-Za-z])*\))\s*\\in" + _END)


@functools.lru_cache(maxsize=1024)
def family(name: str) -> str | None:
    """The family of the relation command `\\<name>`, or None when it is no relation (or one
    read elsewhere: `\\approx`, `\\sim`)."""
    if name in _NOT_RELATIONS:
        return None
    if name in _NAMED:
        return _NAMED[name]
    if len(name) > 2 and name[0] == "n" and family(name[1:]) is not None:
        return "negation"                   # \\nleq, \\nsubseteqq, \\nVDash, \\ncong
    if name in _EQ_CMDS:
        return "equality"
    for shape, fam in _SHAPES:
        if shape.fullmatch(name):
            return fam
    return None


def canonical(s: str) -> str:
    """`s` with every equality spelled `=` and every approximation `\\approx` (see the module
    docstring); other relations spelled as commands."""
    if not re.search(r"[=:\\!<>\u2190-\u21ff\u2200-\u22ff\u27f0-\u27ff\u2a00-\u2aff]", s):
        return s
    s = _STACKED.sub(lambda m: m.group(1) if m.group(1) != "\\equiv" and m.group(1) != "\\cong" else "=", s)
    s = _EQUALITY.sub("=", s)
    s = _APPROX.sub(r"\\approx ", s)
    for pattern, spelled in _ASCII:
        s = pattern.sub(spelled, s)
    for a, b in _UNICODE.items():
        s = s.replace(a, b)
    return _UNICODE_RELATION.sub(_unicode_relation, s)


_UNICODE_RELATION = re.compile(r"[\u2190-\u21ff\u2200-\u22ff\u27f0-\u27ff\u2a00-\u2aff]")
_EQUAL_WORDS = ("EQUAL", "IDENTICAL", "CORRESPONDS", "ESTIMATES", "MEASURED BY", "EQUIVALENT")
_RELATION_WORDS = ("LESS", "GREATER", "PRECEDES", "SUCCEEDS", "SUBSET", "SUPERSET", "ELEMENT", "CONTAINS",
                   "DIVIDES", "PARALLEL", "PERPENDICULAR", "TACK", "FORCES", "PROPORTIONAL", "TILDE", "BETWEEN",
                   "NORMAL SUBGROUP", "MODELS", "TRUE", "NOT ", "DOES NOT", "ASYMPTOTIC", "SQUARE IMAGE",
                   "SQUARE ORIGINAL", "RELATION", "EQUIVALENT", "EQUAL")


def _unicode_relation(m: re.Match) -> str:
    """A relation character of the arrows and mathematical operators blocks: an equality
    (its name says EQUAL, IDENTICAL, ESTIMATES, ...) becomes `=`, a biconditional arrow `=`,
    another relation `\\urel{<name>}` (a family of its own); other symbols are kept."""
    ch = m.group(0)
    name = unicodedata.name(ch, "")
    if "LEFT RIGHT" in name and "ARROW" in name:
        return "="                          # ⇔ ↔: each side the same
    if "ARROW" in name:
        return ch
    negated = any(w in name for w in ("NOT ", "NEITHER", "DOES NOT"))
    ordered = any(w in name for w in _RELATION_WORDS[:12] + ("TILDE",))
    if not negated and not ordered and any(w in name for w in _EQUAL_WORDS):
        return "="
    if negated or ordered or any(w in name for w in _RELATION_WORDS):
        return " \\urel{" + "".join(w[0] for w in name.split()) + "} "
    return ch


def families(s: str) -> set[str]:
    """The families of the relations other than `=`, `\\approx` and `\\sim` that `s` holds."""
    out = {f for m in _COMMAND.finditer(s) if (f := family(m.group(1))) is not None}
    out.update("unicode:" + m.group(2) for m in _COMMAND.finditer(s) if m.group(1) == "urel" and m.group(2))
    if _BARE_ORDER.search(s):
        out.add("order")
    if "membership" in out and _VARIABLE_IN.match(s) and s.count("\\in") == 1 and len(mn.split_top(s)) == 1:
        out.discard("membership")          # "x \\in [0, 1)": a variable's values, read by mathanswer
    return out


def stray(gold: str, pred: str, gold_is_scalar: bool) -> bool:
    """`pred` holds a relation the gold does not (`6 \\propto 5` for 5): it states something else
    than the gold's value. Order relations are not stray against a gold that is not a scalar
    (an interval, a set: `0 < x < 5` for `(0, 5)`)."""
    extra = families(pred) - families(gold)
    if not gold_is_scalar:
        extra.discard("order")
    return bool(extra)


# -- what a relation states (read by mathanswer) -----------------------------------------------

RELATION = re.compile(r"<|>|\\le|\\ge|\\ne|\\lt|\\gt|\\neq|\\approx|\\in\b|=")
ASSIGN_LHS = re.compile(r"[A-Za-z](?:_\{?\w+\}?)?|\([A-Za-z](?:\s*,\s*[A-Za-z])*\)|[A-Za-z]\([A-Za-z0-9]\)")


def is_lhs(s: str) -> bool:
    return ASSIGN_LHS.fullmatch(s.strip()) is not None


def stated_values(gold: str, pred: str) -> tuple[list[str], str | None] | None:
    """The values a relation in `pred` states when the gold states none: 'x = 12/2 = 6' ->
    (['12/2', '6'], None); 'x \\in [0, 1)' -> (['[0, 1)'], None); '\\frac{1}{3} \\approx 0.333' ->
    (['\\frac{1}{3}'], '0.333') (exact values, then the approximate one). Every exact value must be
    the gold: '6 = 5' states 5 and 6. None when `pred` is no such relation."""
    if RELATION.search(gold) or len(mn.split_top(pred)) > 1:
        return None
    if re.search(r"<|>|\\le|\\ge|\\ne|\\lt|\\gt|\\sim|\\equiv", pred):
        return None
    approx = None
    if "\\approx" in pred:
        exact_part, _, approx = pred.partition("\\approx")
        approx = approx.strip()
        if "\\approx" in approx or "=" in approx:
            return [approx], "\\approx"          # a chain of approximations: never equal
    else:
        exact_part = pred
    for sep in ("=", "\\in "):
        parts = [p for p in mn.split_top(exact_part, sep)]
        if len(parts) > 1 and all(parts):
            if sep == "\\in " and (len(parts) != 2 or not is_lhs(parts[0])):
                return None
            values = parts[1:] if is_lhs(parts[0]) else parts
            return values, approx
        if len(parts) > 1:
            return None
    if approx is None:
        return None
    exact_part = exact_part.strip()
    return ([] if is_lhs(exact_part) else [exact_part]), approx


def assignment_tuples(shape: mn.Shape) -> tuple[str, ...] | None:
    """A list of assignment groups ("p=5,q=2" ; "p=7,q=2") as tuples ("(5, 2)", "(7, 2)"), else None."""
    if shape.kind != "list" or not all(";" not in i and "=" in i for i in shape.items):
        return None
    out = []
    for item in shape.items:
        parts = [mn.split_top(a, "=") for a in mn.split_top(item)]
        if len(parts) < 2 or not all(len(p) == 2 and is_lhs(p[0]) for p in parts):
            return None
        out.append("(" + ", ".join(p[1].strip() for p in parts) + ")")
    return tuple(out)


def named_values(s: str) -> tuple[str, ...] | None:
    """'x=1, y=2' -> ('1', '2'): values bound to two or more distinct names, in the gold's order; else None."""
    parts = [mn.split_top(a, "=") for a in mn.split_top(s)]
    if len(parts) < 2 or not all(len(p) == 2 and is_lhs(p[0]) and not RELATION.search(p[1]) for p in parts):
        return None
    names = [p[0].strip() for p in parts]
    return tuple(p[1].strip() for p in parts) if len(set(names)) == len(names) else None


def assigned_rhs(s: str) -> str | None:
    """'a = 4, -8' -> '4, -8' (one variable given its values), else None."""
    parts = s.split("=")
    if len(parts) == 2 and ASSIGN_LHS.fullmatch(parts[0].strip()) and not RELATION.search(parts[1]):
        return parts[1].strip()
    return None


def ordered_list(items: tuple[str, ...]) -> bool:
    """A bare list of values keeps its order ("10, 4, -2" is not "4, 10, -2"); a list of
    tuples or of equations ("a_3 = 2, a_{37} = 19") is a set of solutions."""
    return all(mn.structure(i).kind == "scalar" and not RELATION.search(i) for i in items)


__all__ = ["ASSIGN_LHS", "RELATION", "assigned_rhs", "assignment_tuples", "canonical", "families", "family", "is_lhs", "named_values",
           "ordered_list", "stated_values", "stray"]
