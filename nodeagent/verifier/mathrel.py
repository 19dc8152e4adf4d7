"""Relations in a math answer: one spelling for each, and the ones a bare value must not carry.

A relation states every side (`mathanswer`): `x = 12/2 = 6` is 6, `6 = 5` is not 5. That holds
only if every way of writing a relation is read as one:
- `canonical(s)`: equality written otherwise becomes `=` (`==`, `=\\!=`, `:=`, `=:`, `\\coloneqq`,
  `\\colon=`, `\\equiv`, `\\cong`, `\\doteq`, `\\circeq`, `\\triangleq`, `\\bumpeq`, `\\stackrel{?}{=}`,
  `\\overset{def}{=}`, the words "equals", "is congruent to", and `≡ ≅ ≐ ≔ ≕ ≜ ≝ ≟ ⩵`); an
  approximation becomes `\\approx` (`\\approxeq`, `\\thickapprox`, `≈ ≊`); `≠ ≤ ≥ ≃ ∼ ∈ ∉ ⊂ ⊆`
  become their commands; `!=`, `<=`, `>=` become `\\ne`, `\\le`, `\\ge`;
- `families(s)`: the other relations `s` holds, by family (order, negation, inclusion,
  membership, proportion, the rest by name): an answer holding a relation its gold does not
  (`6 \\propto 5`, `6 \\subset 5`, `6 \\in 5`, `6 \\perp 5` for gold 5) states something else
  than the gold's value; `stray(gold, pred)` says so. Order relations are allowed against a gold
  that is an interval or a set (`0 < x < 5` for `(0, 5)`), and `x \\in S` (a variable's
  membership) is read by `mathanswer`.

Pure string functions. Must not import: sympy, math_verify, zmq, controller.store,
controller.broker, nodeagent.verifier.mathanswer.
"""
from __future__ import annotations

import re

_END = r"(?![A-Za-z])"
_EQ_CMDS = ("equiv", "cong", "doteq", "Doteq", "doteqdot", "circeq", "triangleq", "bumpeq", "Bumpeq",
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

_ORDER = ("lt", "gt", "le", "ge", "leq", "geq", "leqq", "geqq", "leqslant", "geqslant", "lesssim", "gtrsim",
          "lessapprox", "gtrapprox", "ll", "gg", "lll", "ggg", "lneq", "gneq", "lneqq", "gneqq", "lnsim",
          "gnsim", "lessgtr", "gtrless", "lesseqgtr", "gtreqless", "eqslantless", "eqslantgtr")
_NEGATED = ("ne", "neq", "not", "nless", "ngtr", "nleq", "ngeq", "nleqslant", "ngeqslant", "nleqq", "ngeqq",
            "ncong", "nsim", "nequiv", "nmid", "nparallel", "nprec", "nsucc", "npreceq", "nsucceq", "nsubseteq",
            "nsupseteq", "notin", "nvdash", "nvDash", "nVdash", "ntriangleleft", "ntriangleright")
_INCLUSION = ("subset", "subseteq", "subsetneq", "supset", "supseteq", "supsetneq", "sqsubset", "sqsubseteq",
              "sqsupset", "sqsupseteq", "Subset", "Supset", "subseteqq", "supseteqq")
_OTHER = ("propto", "varpropto", "perp", "parallel", "prec", "succ", "preceq", "succeq", "precsim", "succsim",
          "preccurlyeq", "succcurlyeq", "curlyeqprec", "curlyeqsucc", "asymp", "smile", "frown", "bowtie",
          "between", "pitchfork", "vdash", "dashv", "models", "vDash", "Vdash", "lhd", "rhd", "unlhd", "unrhd",
          "vartriangleleft", "vartriangleright", "trianglelefteq", "trianglerighteq", "ni", "owns", "divides")
_FAMILY = {**{c: "order" for c in _ORDER}, **{c: "negation" for c in _NEGATED},
           **{c: "inclusion" for c in _INCLUSION}, **{c: c for c in _OTHER}, "in": "membership"}
_COMMAND = re.compile(r"\\(" + "|".join(sorted(_FAMILY, key=len, reverse=True)) + r")" + _END)
_BARE_ORDER = re.compile(r"(?<![\\{])[<>]")
_VARIABLE_IN = re.compile(r"\s*(?:[A-Za-z](?:_\{?\w+\}?)?|\([A-Za-z](?:\s*,\s*[A-Za-z])*\))\s*\\in" + _END)


def canonical(s: str) -> str:
    """`s` with every equality spelled `=` and every approximation `\\approx` (see the module
    docstring); other relations spelled as commands."""
    if not re.search(r"[=:\\!<>\u2208-\u22ff\u2a75\u2a76]", s):
        return s
    s = _STACKED.sub(lambda m: m.group(1) if m.group(1) != "\\equiv" and m.group(1) != "\\cong" else "=", s)
    s = _EQUALITY.sub("=", s)
    s = _APPROX.sub(r"\\approx ", s)
    for pattern, spelled in _ASCII:
        s = pattern.sub(spelled, s)
    for a, b in _UNICODE.items():
        s = s.replace(a, b)
    return s


def families(s: str) -> set[str]:
    """The families of the relations other than `=`, `\\approx` and `\\sim` that `s` holds."""
    out = {_FAMILY[m.group(1)] for m in _COMMAND.finditer(s)}
    if _BARE_ORDER.search(s):
        out.add("order")
    if "membership" in out and _VARIABLE_IN.match(s) and s.count("\\in") == 1:
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


__all__ = ["canonical", "families", "stray"]
