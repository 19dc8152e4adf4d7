"""What a math answer leaves over: the parts of a normalised answer the checker does not
understand. The checker reads an answer with Math-Verify, which silently drops what it cannot
parse (an unknown macro with its argument, an unknown symbol, a dangling operator) and compares
the rest. So an answer must be consumed entirely by what the checker knows:

- every command is on an allowlist (`KNOWN_COMMANDS`: numbers' and sets' notation, styling and
  spacing), is a relation `mathrel` reads (it judges those), or is written in the gold itself;
- every escaped symbol is spacing or a literal (`\\,` `\\%` `\\$` `\\{` ...);
- every character outside ASCII is a letter, a digit or a known sign (`KNOWN_CHARS`), or is in the gold;
- no binary operator dangles (`5-`, `5 \\times`, `5^`, `\\times 5`, `\\setminus 5`, `(5/, 6)`);
- no indeterminate form is written as a value (`0^0`, `\\frac{1}{\\infty}`, `\\infty^0`, `1^\\infty`).

`leftover(gold, pred)` names the first such part of `pred` (None when there is none); the
caller fails the answer (reward 0: an answer the checker cannot read whole is not shown equal).

Must not import: zmq, controller, nodeagent.verifier.checkers, nodeagent.verifier.grade,
nodeagent.verifier.mathanswer (which imports this one).
"""
from __future__ import annotations

import re
import unicodedata

from nodeagent.verifier import mathrel as mr

_GREEK = ("alpha beta gamma delta epsilon varepsilon zeta eta theta vartheta iota kappa lambda mu nu xi "
          "omicron pi varpi rho varrho sigma varsigma tau upsilon phi varphi chi psi omega Gamma Delta Theta "
          "Lambda Xi Pi Sigma Upsilon Phi Psi Omega")
KNOWN_COMMANDS = frozenset((
    _GREEK + " "
    # numbers, functions, structure
    "frac dfrac tfrac cfrac sqrt cdot times div pm mp infty binom dbinom tbinom choose "
    "sin cos tan cot sec csc arcsin arccos arctan arccot arcsec arccsc sinh cosh tanh coth log ln lg exp "
    "lim sum prod int min max gcd lcm det operatorname circ degree prime ast "
    "overline bar hat vec dot ddot tilde widehat widetilde underline overrightarrow "
    "ldots cdots dots vdots ddots dotsc dotsb begin end hline "
    # sets, intervals, logic the relation layer reads
    "in notin ni cup cap setminus emptyset varnothing subset subseteq supset supseteq subsetneq supsetneq "
    "mathbb mathcal mathfrak land lor wedge vee mid vert lvert rvert Vert lVert rVert langle rangle "
    "lfloor rfloor lceil rceil lbrace rbrace lbrack rbrack pmod bmod mod "
    # relations (mathrel decides what they state)
    "le leq ge geq lt gt leqslant geqslant ne neq not approx equiv cong sim simeq propto perp parallel "
    "ll gg "
    # text, styling, spacing, boxes
    "text textbf textit textrm textnormal texttt textsf mbox hbox mathrm mathbf mathit mathsf mathtt "
    "boldsymbol bm mathnormal emph displaystyle textstyle scriptstyle left right big Big bigg Bigg "
    "bigl bigr Bigl Bigr biggl biggr quad qquad enspace thinspace medspace thickspace boxed fbox "
    "relax nobreak allowbreak strut mathstrut nonumber notag limits nolimits"
).split())
KNOWN_ESCAPES = frozenset(",;:! %${}\\|_\t\n")
KNOWN_CHARS = frozenset("°π∞≤≥≠±×÷·∈∉∪∩∅√")
_OPS = r"times|cdot|div|setminus|cup|cap|land|lor|wedge|vee|bmod|mod|circ|ast|choose"
_ARG = r"(?:\{[^{}]*\}|\\[A-Za-z]+|[^\s{}\\])"
_MISSING_ARG = re.compile(r"\\(?:frac|binom)\s*(?:" + _ARG + r"\s*)?(?:$|[,;)\]}=])|\\sqrt\s*(?:$|[,;)\]}=])")
_BINARY = r"(?:[-+*/^_;:&]|\\\\|\\(?:pm|mp|" + _OPS + r")(?![A-Za-z]))"
_LEADING_ONLY_BINARY = r"(?:[*/^_;:&]|\\\\|\\(?:" + _OPS + r")(?![A-Za-z]))"
_STRAY_ASCII = re.compile(r"[`@#\"~]")
_DECORATION = re.compile(r"\^\s*(?:\{\s*(?:\\(?:circ|ast|prime)\s*|\*|')+\}|\\(?:circ|ast|prime)(?![A-Za-z])|\*)")
_PAIRS = ((r"[(\[]", r"[)\]]"), (r"\\\{", r"\\\}"), (r"(?<!\\)\{", r"(?<!\\)\}"), (r"\\langle", r"\\rangle"),
          (r"\\lfloor", r"\\rfloor"), (r"\\lceil", r"\\rceil"), (r"\\l[vV]ert", r"\\r[vV]ert"))
_DANGLING_END = re.compile(_BINARY + r"\s*(?:$|[,;)\]=]|\\[)\]}]|\\right(?![A-Za-z]))")
_DANGLING_START = re.compile(r"(?:^|[,;(\[=]|\\[(\[{])\s*" + _LEADING_ONLY_BINARY)
_COMMAND = re.compile(r"\\([A-Za-z]+|[^A-Za-z])")
_INF = r"[+-]?\s*\\infty"
_INDETERMINATE = re.compile(
    r"(?<![\d.])0\s*\^\s*\{?\s*0(?![\d.])|"                          # 0^0
    r"\\frac\s*\{[^{}]*\}\s*\{\s*" + _INF + r"\s*\}|"                # \frac{1}{\infty}
    r"\\frac\s*\{\s*" + _INF + r"\s*\}|"                             # \frac{\infty}{..}
    r"\\infty\s*\^|(?<![\d.])1\s*\^\s*\{?\s*\\infty|"                # \infty^0, \infty^{-1}, 1^\infty
    r"(?<![\d.])0\s*(?:\\cdot|\\times|\*)\s*\\infty|\\infty\s*(?:\\cdot|\\times|\*)\s*0(?![\d.])|"
    r"\^\s*\{?\s*[+-]\s*\}?\s*\}")                                  # \frac{1}{0^+}


def _commands(s: str) -> set[str]:
    return {m.group(1) for m in _COMMAND.finditer(s)}


def _unknown(s: str, gold: str) -> str | None:
    allowed = _commands(gold)
    for m in _COMMAND.finditer(s):
        name = m.group(1)
        if name in allowed:
            continue
        if name[0].isalpha() and name not in KNOWN_COMMANDS and name != "urel" and mr.family(name) is None:
            return f"unknown command \\{name}"
        if not name[0].isalpha() and name not in KNOWN_ESCAPES:
            return f"unknown symbol \\{name}"
    gold_chars = set(gold)
    for ch in s:
        if ord(ch) < 128 or ch in KNOWN_CHARS or ch in gold_chars:
            continue
        cat = unicodedata.category(ch)
        if cat in ("Lu", "Ll", "Lo", "Nd") and not 0xD800 <= ord(ch) <= 0xDFFF:
            continue
        return f"unknown character U+{ord(ch):04X} {unicodedata.name(ch, '')}".rstrip()
    return None


def _structural(s: str, whole: bool = True) -> str | None:
    body = re.sub(r"\\(?:text|textrm|mbox|mathrm)\s*\{[^{}]*\}", " ", s)   # words are the units' business
    body = re.sub(r"^\s*\*\*(?!\*)|(?<![*^/+-])\*\*\s*$", "", body)        # Markdown bold: **92**
    body = _DECORATION.sub(" ", body.replace("\\lbrace", "\\{").replace("\\rbrace", "\\}"))   # 5^\\circ: a mark
    body = re.sub(r"\\(?:lbrack|rbrack)(?![A-Za-z])", lambda m: "[" if "l" == m.group(0)[1] else "]", body)
    for opening, closing in _PAIRS if whole else ():
        if len(re.findall(opening, body)) > len(re.findall(closing, body)):
            return "an unclosed bracket"        # "\\langle 5", "\\lbrace 5" ("5)" closes a label: "1) 5)")
    if "&" in body and "\\begin" not in body:
        return "an '&' outside an array"
    m = _STRAY_ASCII.search(body)
    if m:
        return f"stray symbol {m.group(0).strip()!r}"
    m = (_DANGLING_END.search(body) or _DANGLING_START.search(body) or _MISSING_ARG.search(body)
         or re.match(r"\s*\\[lcv]?dots", body))
    if m:
        return f"dangling operator {m.group(0).strip()!r}"
    m = re.search(r"\\emptyset\s*[\w\\(]", body)
    if m:
        return "a value written after the empty set"
    m = _INDETERMINATE.search(body)
    if m:
        return f"indeterminate form or arithmetic with infinity {m.group(0).strip()!r}"
    return None


def leftover(gold: str, pred: str, whole: bool = False) -> str | None:
    """What of `pred` the checker would not account for and the gold does not write itself, or None.
    Relations are first spelled as `mathrel.canonical` spells them (`\\equiv`, `≡` are `=`); a
    relation command `mathrel.family` knows is accounted for (`mathrel.stray` judges it). `whole`:
    `pred` is a whole final answer, not an item of one (only then is an unclosed bracket left over:
    "\\langle 1" is an item of "\\langle 1,2,3\\rangle")."""
    gold, pred = mr.canonical(gold), mr.canonical(pred)
    reason = _unknown(pred, gold)
    if reason is not None:
        return reason
    if _structural(gold, whole) is None:
        return _structural(pred, whole)
    return None
