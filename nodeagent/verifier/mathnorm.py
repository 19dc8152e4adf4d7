"""Math answer text: finding the final answers in a model's text and reading their shape.

Pure string functions, no sympy and no Math-Verify (those live in `mathanswer`):
- `boxed_contents(text)`: every \\boxed{...} / \\fbox{...} body, nested braces kept;
- `answer_lines(text)`: every "answer: X" / "answer is X" line;
- `is_bare_answer(text)`: the text is itself an answer ("4, .1, 2", "\\frac{1}{2}"), not prose;
- `normalise(s)`: strip dollars, spacing commands, \\left/\\right, trailing dots, thin-space
  thousands separators (`14{,}916`, `11,\\! 111`);
- `split_top(s, sep)`: split at separators outside brackets and braces;
- `structure(s)`: the answer's shape: a bracketed group ("(", "]" ...), a braced set, a bare
  list, or a scalar; `text_answer(s)`: the content of a pure \\text{...} or option-letter answer;
- `number_literal(s)`: an integer / decimal / thousands-grouped / mixed-number ("4 4/9")
  literal, as (Fraction, places);
- `alternatives(s)`: the values of a hedged answer ("5 \\lor 6", "5 (or 6)", a `cases` block,
  rows split by \\\\), or [s];
- `hidden_text(s)`: True when a \\text{} (or \\mbox ...) inside a larger answer carries a digit,
  which a parser would drop as a unit word.
- `meaning_marks(s)`, `units(s)`: what makes an answer other than its bare value (a negation, a
  digit subscript, a scale word, a hiding command) and its unit words, spelled one way;
- `asked_precision(instruction)`: the decimal approximation a task's instruction asks for;
  `percent_asked(instruction)`: whether it asks for a percent;
- `space_scripts(text)`: CJK prose spaced where it meets ASCII, so numbers read as words.

Commas are thousands separators only when they group digits by three after a leading group of
1-3 digits that does not start with 0. A lone comma between digits ("-2,1") is a list in a gold
answer (two roots) and a decimal comma only in a prediction read against a decimal gold.
Must not import: sympy, math_verify, zmq, controller.store, controller.broker.
"""
from __future__ import annotations

import re
import unicodedata
from dataclasses import dataclass
from decimal import Decimal
from fractions import Fraction

from controller.contracts.answers import MAX_ANSWER_CHARS, MAX_BOXED, boxed_contents  # noqa: F401 (re-read here)
from nodeagent.verifier import mathform as mf

_ANSWER_LINE = re.compile(r"answer[ \t]*(?:is[ \t]*:?|:)[ \t]*([^\n]+)", re.IGNORECASE)
_PROSE_WORD = re.compile(r"(?<![\\A-Za-z])[A-Za-z]{4,}")
_TEXT_CMD = re.compile(r"\\(?:text|textbf|textit|textnormal|mathrm|mathbf|mbox|operatorname)\s*\{([^{}]*)\}")
_THOUSANDS = re.compile(r"[+-]?[1-9]\d{0,2}(?:,\d{3})+(?:\.\d+)?")
_MIXED = re.compile(r"([+-]?)(\d{1,3}(?: \d{3})+|\d+) (\d+)/(\d+)")
_SCIENTIFIC = re.compile(r"([+-]?(?:\d+(?:\.\d*)?|\.\d+))\s*(?:\\times|\\cdot|\*|×)\s*10\s*\^\s*(?:\{\s*([+-]?\d{1,4})\s*\}|(\d))")
_E_NOTATION = re.compile(r"[+-]?(?:\d+(?:\.\d*)?|\.\d+)[eE][+-]?\d{1,4}")
_TRAILING_ELLIPSIS = re.compile(r"\d\s*\.\s*\.\s*\.$")
_SPACE_GROUPED = re.compile(r"[+-]?\d{1,3}(?: \d{3})+(?:\.\d+)?")
_PERCENT_MARK = re.compile(r"\s*(?:\\%|%)\s*$")
_CJK_OR_OTHER_LETTER = re.compile(r"[^\x00-\x7f\u0370-\u03ff\u2100-\u214f]")
_DECIMAL_COMMA = re.compile(r"[+-]?\d+,\d+")
_DECIMAL_POINT_COMMA = re.compile(r"[+-]?0,\d{2,}")           # 0,111: a decimal, as Math-Verify reads it
_PLAIN_NUMBER = re.compile(r"[+-]?(?:\d+(?:\.\d*)?|\.\d+)")
_OPTION = re.compile(r"\(?([A-Ea-e])\)?")
_SPACING = re.compile(r"(?<!\\)\\(?:[!,;: ]|q?quad(?![A-Za-z]))|(?<!\\)~")   # not the \\ row break; ~ is a space
_SPACE_CMD = re.compile(r"\\(?:hspace\*?|hskip|vspace\*?)\s*\{\s*-?[\d.]+\s*(?:em|ex|pt|mu|cm|mm|in|bp|pc)\s*\}|"
                        r"\\m?kern\s*-?[\d.]+\s*(?:em|ex|pt|mu|cm|mm|in|bp|pc)|\\(?:enspace|thinspace|medspace|thickspace)(?![A-Za-z])")
_OVER = re.compile(r"\{\s*([^{}]+?)\s*\\over(?![A-Za-z])\s*([^{}]+?)\s*\}")
_PERCENT_WORD = re.compile(r"\s*(?:\\%|%|\\(?:text|textrm|mathrm|mbox)\s*\{\s*(?:\\?%|per\s*cent(?:age)?|pct)\s*\}|"
                           r"percentage|per\s*cent|pct)\s*$")
_LIST_WORD = re.compile(r"\s*\\text\{\s*(?:and|or)\s*\}\s*|\s+(?:and|or)\s+")
_MATRIX = re.compile(r"\(?\s*\\begin\{([pbB]?matrix)\}(.*?)\\end\{\1\}\s*\)?", re.DOTALL)
_ENV = re.compile(r"\\(?:begin|end)\{[a-z]+\*?\}")
_ESCAPED_CMD = re.compile(r"\\\\(?=(?:left|right|frac|dfrac|tfrac|sqrt|pi|boxed|text|cdot|times|infty)(?![A-Za-z]))")
_CONTRACTION = re.compile(r"[A-Za-z]'[a-z]")
_NESTED_BOX = re.compile(r"\\(?:boxed|fbox)(?![A-Za-z])\s*")
_OR_TEXT = re.compile(r"\\(?:text|textbf|textit|textnormal|mathrm|mbox)\s*\{\s*(or|and/or)\s*\}")
_DISJUNCTION = re.compile(r"\\lor(?![A-Za-z])|\\vee(?![A-Za-z])|\\text\{\s*or\s*\}|(?<![A-Za-z\\])or(?![A-Za-z])")
_PAREN_OR = re.compile(r"\(\s*(?:\\text\{\s*)?or\b")
_CASES = re.compile(r"\\begin\{(cases)\}(.*?)\\end\{cases\}", re.DOTALL)
_ROW_BREAK = re.compile(r"\\\\(?![A-Za-z])")
_PM = re.compile(r"\\(?:pm|mp)(?![A-Za-z])")
_TEXT_WITH_DIGIT = re.compile(r"\\(?:text|textbf|textit|textnormal|texttt|mbox|hbox|mathrm|operatorname)\s*"
                              r"\{(?:[^{}]*\d[^{}]*|[^{}]*(?<![A-Za-z])or(?![A-Za-z])[^{}]*)\}")
_TEXT_PUNCT = re.compile(r"\\(?:text|textbf|textit|textnormal|texttt|mbox|hbox|mathrm)\s*\{\s*([()\[\],;:/|])\s*\}")
_TEXT_QUANTITY = re.compile(r"^\\(?:text|textnormal|mbox|mathrm)\s*\{\s*([+-]?\d+(?:\.\d+)?)\s+([A-Za-z]+(?: [A-Za-z]+)?)\s*\}$")
_TEXT_ANY = re.compile(r"\\(?:text|textbf|textit|textnormal|texttt|mbox|hbox|mathrm)\s*\{([^{}]*)\}")
_EMPTY_SET = re.compile(r"\\varnothing(?![A-Za-z])|∅|^\s*\\\{\s*\\\}\s*$|\\emptyset(?![A-Za-z])\s*")
_UPRIGHT_CONSTANT = re.compile(r"\\(?:mathrm|mathit|operatorname)\s*\{\s*([ie])\s*\}")
_OPEN = {"(": ")", "[": "]", "{": "}"}
_CLOSE = {v: k for k, v in _OPEN.items()}


def answer_lines(text: str) -> list[str]:
    """The value of every "answer: X" / "the answer is X" line, trailing dot removed."""
    found = (f.strip().rstrip(".").strip() for f in _ANSWER_LINE.findall(text))
    return [f for f in found if f]


def is_bare_answer(text: str, limit: int | None = MAX_ANSWER_CHARS) -> bool:
    """True when `text` is an answer on its own (no delimiters, no prose words), at most `limit`
    characters once spacing commands are dropped ("5\\,\\,...^{2}" is short: read whole)."""
    s = _SPACING.sub(" ", text).strip()
    if not s or (limit is not None and len(s) > limit) or "\n" in s or "$" in s.replace("\\$", "") or "\\(" in s or "\\[" in s:
        return False
    if _CONTRACTION.search(s) or any(ch.isalpha() and unicodedata.category(ch) != "Lm"
                                     for ch in _CJK_OR_OTHER_LETTER.findall(s)):
        return False                             # "it's", or words in another script: prose (a prime "5\u02b9" is no word)
    s = _COLOUR_NAME.sub(r"\\color", s)        # "5\\color{white}{6}": a colour's name is no prose word
    return not _PROSE_WORD.search(_ENV.sub("", _TEXT_CMD.sub("", _PERCENT_WORD.sub("", s))))


_COLOUR_NAME = re.compile(r"\\(?:textcolor|color|colorbox)\s*(?:\[[a-zA-Z]*\]\s*)?\{[A-Za-z!0-9. ,]*\}")


_SUPERSCRIPTS = re.compile("[\u2070\u00b9\u00b2\u00b3\u2074-\u207b]+")
_SUBSCRIPTS = re.compile("[\u2080-\u208b]+")
_SCRIPT_DIGITS = str.maketrans("\u2070\u00b9\u00b2\u00b3\u2074\u2075\u2076\u2077\u2078\u2079\u207a\u207b"
                               "\u2080\u2081\u2082\u2083\u2084\u2085\u2086\u2087\u2088\u2089\u208a\u208b",
                               "0123456789+-0123456789+-")
_SEPARATORS = str.maketrans({"\u2044": "/", "\u066b": ".", "\u066c": ","})   # fraction slash, Arabic separators


_MIXED_VULGAR = re.compile(r"(\d)(?=[\u00bc-\u00be\u2150-\u215e])")
_LEADING_DASH = re.compile(r"(?<![\w)\]}.])\u2013(?=\s*[\d.\\(])")
_ROOT_SIGN = re.compile(r"\u221a\s*(?:(\d+(?:\.\d+)?|[A-Za-z](?![A-Za-z]))|\{)")


def too_long_bare(text: str) -> bool:
    """True when `text` is a bare answer longer than MAX_ANSWER_CHARS: it cannot be read whole,
    and is never read as one of its numbers."""
    return len(text) > MAX_ANSWER_CHARS and is_bare_answer(text, limit=None)


def unescape_commands(text: str) -> str:
    """`\\\\left(`, `\\\\frac` (a backslash escaped once too often) read as `\\left(`, `\\frac`;
    superscript and subscript digits read as `^{..}` and `_{..}` (x\u00b2 is x^{2}, not x2), Unicode
    compatibility forms folded (NFKC: fullwidth digits, \u00bd is 1/2), the Arabic decimal separator
    read as ".", the minus sign read as "-", and
    invisible format characters (zero-width space, word joiner ...) removed, so "5\u200b6" is 56."""
    text = _SUPERSCRIPTS.sub(lambda m: "^{" + m.group(0).translate(_SCRIPT_DIGITS) + "}", text)
    text = _SUBSCRIPTS.sub(lambda m: "_{" + m.group(0).translate(_SCRIPT_DIGITS) + "}", text)
    text = _MIXED_VULGAR.sub(r"\1 ", text)                   # 1\u00bd is 1 1/2 (3/2), never 11/2
    text = _LEADING_DASH.sub("-", text)                      # \u20135: an en dash as a minus sign
    text = unicodedata.normalize("NFKC", text).replace("\u2212", "-").translate(_SEPARATORS)
    text = _ROOT_SIGN.sub(lambda m: "\\sqrt{" + (m.group(1) + "}" if m.group(1) else ""), text)   # \u221a3
    text = "".join(ch for ch in text if unicodedata.category(ch) != "Cf")
    return _ESCAPED_CMD.sub(r"\\", text)


def normalise(s: str) -> str:
    """A canonical spelling of one answer: no dollars, no spacing commands, no \\left/\\right."""
    s = re.sub(r"(?<!\\)%[ \t]*\n", " ", unescape_commands(s))   # a TeX comment of nothing: \\boxed{5050%⏎}
    s = mf.uncoloured(mf.shown(s)).strip()
    s = _EMPTY_SET.sub(r"\\emptyset ", s).strip()             # \\varnothing, \\{\\}, the empty-set sign
    s = _UPRIGHT_CONSTANT.sub(r"\1", s)                      # \\mathrm{i}, \\mathrm{e}: the constants i and e
    s = re.sub(r"∞\s*", r"\\infty ", s).strip()              # the sign is the command
    s = re.sub(r"^\*\*(.+)\*\*$", r"\1", s)                   # **5050**: Markdown bold
    if "," not in s:                                           # x=-2 \\text{ and } x=1 (not two solution tuples)
        s = re.sub(r"\s*(?:\\text\{\s*and\s*\}|\band\b)\s*(?=[A-Za-z](?:_\{?\w+\}?)?\s*=)", ", ", s)
    s = re.sub(r"(?<!\\)\$+", " ", s).strip()                # math delimiters, also mid-answer
    s = re.sub(r",\\!\s*(?=\d{3}(?!\d))", ",", s)          # 11,\! 111 -> 11,111
    s = re.sub(r"\s*\{\s*,\s*\}\s*", ",", s)                # 14{,}916 and 14 {, }916
    s = re.sub(r"(?<=[\d.])(?:\{\s*\})+", "", s)              # 5{}{}0 is 50: an empty group is nothing
    s = _TEXT_PUNCT.sub(r"\1", s)                             # \\text{(}7\\text{)} is (7)
    s = _NESTED_BOX.sub("", s)                               # \\boxed{\\boxed{5} 6} -> {5} 6
    s = re.sub(r"\\(?:left|right)(?![A-Za-z])|\\displaystyle", "", s)
    s = re.sub(r"\\[dtc]frac(?![A-Za-z])", r"\\frac", s)
    s = _SPACING.sub(" ", _SPACE_CMD.sub(" ", s))
    s = _OVER.sub(r"\\frac{\1}{\2}", s)                       # {1 \\over 2} is \\frac{1}{2}
    s = re.sub(r"(?<=\d) +(?=i(?![A-Za-z]))", "", s)       # 4\\,i is 4i
    s = _PERCENT_WORD.sub("\\%", s)
    s = _TEXT_QUANTITY.sub(r"\1 \\text{ \2}", s)             # \\text{3 cm} is 3 \\text{ cm}
    if "\\begin" not in s and re.search(r"\S[ \t]*\n\s*\S", s):
        s = re.sub(r"[ \t]*\n\s*", " \\\\\\\\ ", s)           # values on two lines are two rows
    s = re.sub(r"\s+", " ", s).strip()
    if _TRAILING_ELLIPSIS.search(s):
        return s                                 # "0.333...": an ellipsis, not a full stop
    return s.rstrip(".").strip()


def split_top(s: str, sep: str = ",") -> list[str]:
    """`s` split at `sep` where no bracket or brace is open (\\{ and \\} count as braces)."""
    parts: list[str] = []
    buf: list[str] = []
    depth, i = 0, 0
    while i < len(s):
        ch = s[i]
        if ch in _OPEN:
            depth += 1
        elif ch in _CLOSE:
            depth = max(0, depth - 1)
        if depth == 0 and s.startswith(sep, i):
            parts.append("".join(buf).strip())
            buf, i = [], i + len(sep)
            continue
        buf.append(ch)
        i += 1
    parts.append("".join(buf).strip())
    return parts


def _matching_close(s: str, start: int) -> int:
    """Index of the bracket closing the one opened at `start` (any bracket kind), or -1."""
    depth = 0
    for i in range(start, len(s)):
        if s[i] in _OPEN:
            depth += 1
        elif s[i] in _CLOSE:
            depth -= 1
            if depth == 0:
                return i
    return -1


@dataclass(frozen=True)
class Shape:
    kind: str                      # scalar | group | set | list
    items: tuple[str, ...]
    left: str = ""                 # group only: "(" or "["
    right: str = ""                # group only: ")" or "]"


def structure(s: str) -> Shape:
    """The shape of a normalised answer. "(1,2]" is a group (interval or tuple), "\\{1,2\\}" a
    set, "1, 2" a bare list, anything else (thousands-grouped numbers included) a scalar."""
    t = s.strip()
    matrix = _MATRIX.fullmatch(t)
    if matrix and "\\begin" not in matrix.group(2):
        rows = [split_top(r, "&") for r in re.split(r"\\\\", matrix.group(2)) if r.strip()]
        if rows and all(len(r) == len(rows[0]) for r in rows):
            return Shape("group", tuple(i for r in rows for i in r), "matrix", f"{len(rows)}x{len(rows[0])}")
    if t.startswith("\\{") and t.endswith("\\}") and _matching_close(t, 1) == len(t) - 1:
        return Shape("set", tuple(i for i in split_top(t[2:-2]) if i))
    if t.startswith("{") and t.endswith("}") and _matching_close(t, 0) == len(t) - 1:
        items = split_top(t[1:-1])       # TeX grouping braces: {1,3} is printed 1,3 (a list)
        if len(items) >= 2:
            return Shape("list", tuple(i for i in items if i))
    if t[:1] in "([" and t[-1:] in ")]" and _matching_close(t, 0) == len(t) - 1:
        items = split_top(t[1:-1])
        if len(items) < 2 and ";" in t:
            items = split_top(t[1:-1], ";")
        if len(items) >= 2:
            return Shape("group", tuple(items), t[0], t[-1])
    grouped = _THOUSANDS.match(t)
    if grouped and "," not in t[grouped.end():] and not t[grouped.end():grouped.end() + 1].isdigit():
        return Shape("scalar", (t,))       # 7,425,000 and 1,000.99m^2 are one number
    if _DECIMAL_POINT_COMMA.fullmatch(t):
        return Shape("scalar", (t,))
    by_semicolon = split_top(t, ";")
    if len(by_semicolon) >= 2 and all(by_semicolon):
        return Shape("list", tuple(by_semicolon))    # -12;-11;-10 and p=5,q=2;p=7,q=2
    groups = _split_regex_top(t, _LIST_WORD)
    if len(groups) >= 2 and all(len(split_top(g)) >= 2 and all("=" in i for i in split_top(g)) for g in groups):
        return Shape("list", tuple(groups))          # p = 5, q = 2 \text{and} p = 7, q = 2: two solutions
    items = split_top(_LIST_WORD.sub(", ", t))
    if len(items) >= 2 and all(items):
        return Shape("list", tuple(items))
    pm = plus_minus(t)
    if pm is not None:
        return Shape("set", pm)
    return Shape("scalar", (t,))


def plus_minus(s: str) -> tuple[str, str] | None:
    """"\\pm 2021" -> ("2021", "-(2021)"); "1 \\pm \\sqrt{2}" -> ("1 + (\\sqrt{2})", "1 - (\\sqrt{2})"):
    one top-level \\pm, read as the two values it stands for; else None."""
    found = [m for m in _PM.finditer(s) if depth_at(s, m.start()) == 0]
    if len(found) != 1:
        return None
    head, tail = s[:found[0].start()].strip(), s[found[0].end():].strip()
    if not tail:
        return None
    if not head:
        return tail, f"-({tail})"
    return f"{head} + ({tail})", f"{head} - ({tail})"


def pm_variants(s: str, limit: int = 3) -> list[str] | None:
    """Every value an answer with a \\pm or \\mp *inside* an expression stands for (`(\\pm 2)^2` ->
    `(+ 2)^2`, `(- 2)^2`), at most `limit` signs (2^limit values); None when it has none, or only
    the one top-level sign `plus_minus` reads, or more than `limit`."""
    found = [m for m in _PM.finditer(s)]
    if not found or len(found) > limit or plus_minus(s) is not None:
        return None
    out = [s]
    for _ in found:
        nxt = []
        for v in out:
            m = _PM.search(v)
            if m is None:
                continue
            nxt += [v[:m.start()] + " + " + v[m.end():], v[:m.start()] + " - " + v[m.end():]]
        out = nxt or out
    return [re.sub(r"([(\[{,]|^)\s*\+\s*", r"\1", v) for v in out]


_NAMED_TUPLE = re.compile(r"\(\s*([A-Za-z](?:_\{?\w+\}?)?(?:\s*,\s*[A-Za-z](?:_\{?\w+\}?)?)+)\s*\)\s*=\s*(\(.*\))")


def named_tuple(s: str) -> str:
    """`(x,y)=(2,1)` read as `x=2, y=1` (each name with its value); else `s`."""
    m = _NAMED_TUPLE.fullmatch(s.strip())
    if m is None or _matching_close(m.group(2), 0) != len(m.group(2)) - 1:
        return s
    names, values = split_top(m.group(1)), split_top(m.group(2)[1:-1])
    if len(names) != len(values):
        return s
    return ", ".join(f"{n.strip()}={v.strip()}" for n, v in zip(names, values))


def text_answer(s: str) -> str | None:
    """The content of a pure text answer (\\text{(E)}, \\textbf{Evelyn}, (C)), else None: words
    case-folded, a single letter (an option, a point, a variable) as written."""
    t = s.strip()
    m = _TEXT_CMD.fullmatch(t)
    if m:
        t = m.group(1)
    elif not _OPTION.fullmatch(t):
        return None
    t = re.sub(r"[\s()]", "", t).rstrip(".")               # \\text{B.} is the option B
    return (t if len(t) == 1 else t.lower()) or None     # a letter keeps its case: "a" is not (A)


def number_literal(s: str) -> tuple[Fraction, int | None] | None:
    """(value, decimal places) of a plain number literal: "7", "-0.25", ".1", "7,425,000",
    "1000,99" (decimal comma), "0.1\\overline{6}" (a repeating decimal: exact), "5e3" (e-notation:
    5000, never 5*e*3); places is None for an integer, an exact repeating decimal or e-notation. Percent and degree marks and a
    leading currency sign are dropped. None for anything else."""
    if re.search(r",\s", s):
        return None                              # "-2, 1" is a list, never a decimal comma
    e_notation = _E_NOTATION.fullmatch(s.strip())
    if e_notation:                               # 5e3, 2.5E-2: a calculator's numeral, exactly
        value = Fraction(Decimal(e_notation.group(0)))
        return value, None
    scientific = _SCIENTIFIC.fullmatch(s.strip())
    if scientific:                               # 6.02 \\times 10^{23}: exactly 602 * 10^21
        return Fraction(Decimal(scientific.group(1))) * Fraction(10) ** int(scientific.group(2) or scientific.group(3)), None
    repeating = mf.repeating(s)
    if repeating is not None:                    # 0.1\\overline{6} is 1/6, exactly
        return repeating, None
    mixed = _MIXED.fullmatch(_PERCENT_MARK.sub("", s).strip())
    if mixed:                                    # 4 4/9 is 40/9; 4 4/0 and 11 7/6 are no number
        sign, whole, num, den = mixed.groups()
        if int(den) == 0 or int(num) >= int(den):
            return None
        value = int(whole.replace(" ", "")) + Fraction(int(num), int(den))
        return (-value if sign == "-" else value), None
    t = s.replace("\\%", "").replace("%", "").replace("^\\circ", "").replace("^{\\circ}", "")
    t = re.sub(r"^([+-])\s+", r"\1", re.sub(r"\s+", " ", t.replace("\\$", "")).strip())
    if " " in t and not _SPACE_GROUPED.fullmatch(t):
        return None                              # "1 2" is two numbers; "1 000" is one
    t = t.replace(" ", "")
    if _THOUSANDS.fullmatch(t):
        t = t.replace(",", "")
    elif _DECIMAL_COMMA.fullmatch(t):
        t = t.replace(",", ".")
    if not _PLAIN_NUMBER.fullmatch(t) or len(t) > 400:
        return None
    places = len(t.split(".", 1)[1]) if "." in t else None
    return Fraction(t if not t.endswith(".") else t[:-1]), places or None


def significant_digits(value: Fraction, places: int) -> int:
    """How many significant digits a decimal with `places` places of `value` carries."""
    digits = str(abs(round(value * 10 ** places))).lstrip("0")
    return len(digits)


def alternatives(s: str) -> list[str]:
    """The values a hedged answer offers: "5 \\lor 6", "5 \\text{ or } 6", "5 (or 6)", the rows of a
    `cases` (or `array`, `aligned` ...) block, rows split by \\\\ outside a matrix; else [s].
    A row's condition after `&` is dropped. Only the top level is split."""
    t = s.strip()
    m = _CASES.fullmatch(t)
    if m:
        rows = [r.split("&", 1)[0].strip() for r in _ROW_BREAK.split(m.group(2))]
        rows = [r.rstrip(",;.").strip() for r in rows if r.strip()]
        return rows or [t]
    if "\\begin" not in t and _ROW_BREAK.search(t):
        rows = [r.strip() for r in _ROW_BREAK.split(t) if r.strip()]
        if len(rows) > 1:
            return rows
    t = _OR_TEXT.sub(" or ", t)
    unwrapped = _TEXT_ANY.sub(lambda m: f" {m.group(1)} ", t)
    if _PAREN_OR.search(unwrapped):
        t = unwrapped                          # 6 \\text{ (or seven)}
    paren = _PAREN_OR.search(t)
    if paren and depth_at(t, paren.start()) == 0:
        close = _matching_close(t, paren.start())
        inner = t[paren.end():close if close > 0 else len(t)].strip()
        rest = (t[:paren.start()] + (t[close + 1:] if close > 0 else "")).strip()
        return [rest, inner] if rest and inner else [t]
    parts = [p for p in _split_regex_top(t, _DISJUNCTION) if p]
    return parts if len(parts) > 1 else [s]


def depth_at(s: str, pos: int) -> int:
    """How many brackets and braces are open at `pos`."""
    depth = 0
    for ch in s[:pos]:
        if ch in _OPEN:
            depth += 1
        elif ch in _CLOSE:
            depth = max(0, depth - 1)
    return depth


def _split_regex_top(s: str, pattern: re.Pattern) -> list[str]:
    parts, last = [], 0
    for m in pattern.finditer(s):
        if depth_at(s, m.start()) == 0:
            parts.append(s[last:m.start()].strip())
            last = m.end()
    parts.append(s[last:].strip())
    return parts


def hidden_text(s: str) -> bool:
    """True when a text command inside a larger answer carries a digit or the word "or"
    ("5 \\text{(or 6)}", "6^{\\text{or }7}"): a LaTeX parser drops text as a unit word, so what it
    says would vanish from the comparison."""
    m = _TEXT_WITH_DIGIT.search(s)
    return m is not None and m.group(0) != s.strip()


def lone_comma_list(s: str) -> bool:
    """"-2,1": digits with one comma and no thousands grouping (a list of two numbers in a gold)."""
    t = s.strip()
    return (_DECIMAL_COMMA.fullmatch(t) is not None and _THOUSANDS.fullmatch(t) is None
            and _DECIMAL_POINT_COMMA.fullmatch(t) is None)


_SCRIPT_BOUNDARY = re.compile(r"(?<=[\u3000-\u9fff\uac00-\ud7af\uff01-\uff60])(?=[\x21-\x7e])|"
                              r"(?<=[\x21-\x7e])(?=[\u3000-\u9fff\uac00-\ud7af\uff01-\uff60])")


def space_scripts(text: str) -> str:
    """A space where a CJK character (written without spaces between words) meets an ASCII one,
    so that a number in Chinese prose ("比例为13/28") reads as a word of its own."""
    return _SCRIPT_BOUNDARY.sub(" ", text)


def strip_percent(s: str) -> str:
    """`s` without its closing percent mark ("28\\%" -> "28")."""
    return _PERCENT_MARK.sub("", s).strip()


def is_percent(s: str) -> bool:
    """True when the answer ends in a percent mark ("28%", "10\\%", normalised "28 percent")."""
    return _PERCENT_MARK.search(s) is not None


# -- what the task's instruction asks of a number ----------------------------------------------

@dataclass(frozen=True)
class Precision:
    """What an instruction asks of a decimal: `places` (0 for a whole number, -2 for "the
    nearest hundred") and/or `sig` (significant figures); both None: "a decimal" or
    "approximately", with no precision named."""
    places: int | None = None
    sig: int | None = None


MAX_COUNT = 1_000_000            # a precision count read from an instruction is at most this
_NUMBER_WORDS = {"one": 1, "two": 2, "three": 3, "four": 4, "five": 5, "six": 6, "seven": 7, "eight": 8,
                 "nine": 9, "ten": 10}
_PLACE_WORDS = {"whole number": 0, "integer": 0, "unit": 0, "one": 0, "tenth": 1, "hundredth": 2,
                "thousandth": 3, "ten-thousandth": 4, "ten thousandth": 4, "hundred-thousandth": 5,
                "hundred thousandth": 5, "millionth": 6, "cent": 2, "ten": -1, "hundred": -2, "thousand": -3}
_COUNT = r"(?<![\d.,])(\d+|(?<![A-Za-z])(?:one|two|three|four|five|six|seven|eight|nine|ten))"   # "100 places": 100
_NEAREST = re.compile(r"nearest\s+(ten[- ]thousandth|hundred[- ]thousandth|millionth|thousandth|hundredth|tenth|"
                      r"whole\s+number|integer|unit|one|cent|thousand|hundred|ten)(?![A-Za-z-])", re.IGNORECASE)
_NEAREST_DECIMAL = re.compile(r"nearest\s+(0?\.(?:0*)1)(?!\d)", re.IGNORECASE)
_PLACES = re.compile(_COUNT + r"[\s-]+(?:decimal\s+(?:places?|digits?)|digits?\s+after\s+the\s+decimal(?:\s+point)?|d\.\s?p\.)",
                     re.IGNORECASE)
_SIG = re.compile(_COUNT + r"[\s-]+(?:significant\s+(?:figures?|digits?)|sig(?:\.|nificant)?\s*figs?\.?|s\.\s?f\.)",
                  re.IGNORECASE)
_APPROX_WORDS = re.compile(r"\b(?:decimal|approximat\w*|estimate|round(?:ed|ing)?|numerical(?:ly)?)\b", re.IGNORECASE)
_EXACT_WORDS = re.compile(r"\bexact(?:ly)?\s+(?:value|answer|form|fraction|expression)|\bin\s+exact\b|\bexact\s*[.,;)]|"
                          r"simplest\s+(?:radical\s+)?form|common\s+fraction|in\s+terms\s+of\s+\\?pi|"
                          r"not\s+(?:as\s+)?a\s+decimal|(?:do\s+not|don't|without|no)\s+round", re.IGNORECASE)


def _count(word: str) -> int:
    """The whole count ("100" is 100, never its last digits); past MAX_COUNT digits, MAX_COUNT."""
    if word.isdigit():
        return min(int(word[:7]), MAX_COUNT) if len(word) <= 7 else MAX_COUNT
    return _NUMBER_WORDS[word.lower()]


_PERCENT_ASKED = re.compile(      # the question asks for a percent ("a 5% discount" alone does not)
    r"\b(?:what|which)\s+(?:is\s+the\s+)?(?:per\s*cent|percent(?:age)?)\b|\b(?:as|in|into|to)\s+(?:a\s+)?(?:per\s*cent|"
    r"percent(?:age)?)\b|\bin\s*\\?%|\bpercent(?:age)?\s+(?:change|increase|decrease|loss|gain|error|of)\b|"
    r"\bhow\s+many\s+percent|\bpercentage\b|\bnearest\s+(?:tenth\s+of\s+a\s+|hundredth\s+of\s+a\s+)?percent\b",
    re.IGNORECASE)


def percent_asked(instruction: str) -> bool:
    """True when a task's instruction asks for a percent ("what percent", "as a percent", "in %",
    "percent increase", "percentage"); a percent in its data ("a 5% discount") is not asking."""
    return _PERCENT_ASKED.search(instruction[-4000:]) is not None


def asked_precision(instruction: str | None) -> Precision | None:
    """The decimal approximation a task's instruction asks for ("to the nearest hundredth",
    "3 decimal places", "2 significant figures", "as a decimal", "approximately", "round"), or
    None when it asks for none, or asks for an exact form ("common fraction", "simplest radical
    form", "exact value", "in terms of pi", "do not round"), or there is no instruction."""
    if not instruction:
        return None
    text = instruction[-4000:]
    if _EXACT_WORDS.search(text):
        return None
    m = _NEAREST.search(text)
    if m:
        return Precision(places=_PLACE_WORDS[re.sub(r"\s+", " ", m.group(1).lower())])
    m = _NEAREST_DECIMAL.search(text)
    if m:
        return Precision(places=len(m.group(1).split(".", 1)[1]))
    m = _PLACES.search(text)
    if m:
        return Precision(places=_count(m.group(1)))
    m = _SIG.search(text)
    if m:
        return Precision(sig=_count(m.group(1)))
    if _APPROX_WORDS.search(text):
        return Precision()
    return None


# -- marks that change what a value means -------------------------------------------------------

_NEGATION = re.compile(r"\\not(?![A-Za-z])|\\n(?:less|gtr|leq|geq)(?![A-Za-z])")
_HIDING = re.compile(r"\\(?:[hv]?phantom|smash|color|textcolor|colorbox|fcolorbox|[bx]?cancel|sout|strikeout|"
                     r"tiny|scriptsize|footnotesize|small|normalsize|large|Large|LARGE|huge|Huge)(?![A-Za-z])")
_PER_MILLE = re.compile(r"‰|‱|\\(?:permil|textperthousand|textpertenthousand)(?![A-Za-z])|per\s*mill?e|"
                        r"(?<![A-Za-z])(?:bps|basis\s+points?)(?![A-Za-z])", re.IGNORECASE)
_VALUE_WORDS = re.compile(
    r"(?<![\\A-Za-z])(not|no|none|never|nope|wrong|incorrect|false|either|neither|nor|"
    r"except|nearly|almost|least|most|more|less|fewer|than|between|ish|approx\w*|roughly|circa|"
    r"maybe|perhaps|probably|possibly|guess|if|when|whenever|unless|assuming|provided|only|maximum|minimum|"
    r"negative|inverse|reciprocal|opposite|minus|hundredths?|thousandths?|tens|kilo|ppm|rad|radians?|"
    r"squared|cubed|half|halves|thirds?|quarters?|fifths?|tenths?|twice|double|triple|root|"
    r"zero|one|two|three|four|five|six|seven|eight|nine|ten|eleven|twelve|twenty|thirty|forty|fifty|"
    r"(?:times|plus|minus|over|divided\s+by)(?=\s*[\w(]))(?![A-Za-z])", re.IGNORECASE)
_DECORATED = re.compile(r"\d\s*(?:\^\s*\{?\s*(?:\*|\\ast|\\star|\\prime|\\dagger|')\s*\}?|')")
_SIMILAR = re.compile(r"\\(?:sim|simeq|thicksim|eqsim|backsim)(?![A-Za-z])")
_ONE_SIDED = re.compile(r"\^\s*(?:\{\s*[+-]\s*\}|[+-](?![\w{\\]))")
_SCALE_ABBR = re.compile(r"(?<=[\d\s])\\(?:text|textrm|mbox|mathrm)\s*\{\s*(k|K|M|B|bn|mn|mil|thou)\s*\}")
_DIGIT_SUBSCRIPT = re.compile(r"\d\s*_\s*\{?\s*\d")
_SCALE = re.compile(r"(?<![A-Za-z])(thousand|million|billion|trillion|dozen|hundred|lakh|crore|score|gross|grand|"
                    r"myriad)s?(?![A-Za-z])",
                    re.IGNORECASE)
_UNIT_SYNONYMS = {
    "centimeter": "cm", "centimetre": "cm", "meter": "m", "metre": "m", "kilometer": "km", "kilometre": "km",
    "millimeter": "mm", "millimetre": "mm", "inch": "in", "inches": "in", "foot": "ft", "feet": "ft",
    "yard": "yd", "mile": "mi", "second": "s", "sec": "s", "minute": "min", "hour": "h", "hr": "h",
    "gram": "g", "kilogram": "kg", "liter": "l", "litre": "l", "milliliter": "ml", "millilitre": "ml",
    "degree": "deg", "dollar": "usd", "cent": "cents", "mph": "mi/h", "pound": "lb", "ounce": "oz",
}
_KNOWN_UNITS = set(_UNIT_SYNONYMS) | set(_UNIT_SYNONYMS.values()) | {"cm", "m", "km", "mm", "in", "ft", "yd", "mi", "s",
                                                                 "min", "h", "g", "kg", "l", "ml", "lb", "oz"}
_BARE_UNIT = re.compile(r"[+-]?\d[\d.,]*\s*([A-Za-z]{1,10})\s*(?:\^\s*\{?\d\}?)?")
_UNIT_POWER = re.compile(r"\s*\^\s*\{?\s*(-?\s*\d)")     # "^2" an area, "^{-1}" a rate: never the unit itself
_PER = re.compile(r"/|(?<![A-Za-z])per(?![A-Za-z])", re.IGNORECASE)
_NOT_UNITS = {"and", "or", "unit", "units", "square", "sq", "cubic", "cu", "per", "of", "the", "a", "an", "each"}


def meaning_marks(s: str) -> set[str]:
    """Marks that make an answer mean something else than its bare value: a negated relation
    (`x \\not= 5`), a digit subscript (`5_{6}`, a base or an index), a scale word (`5 thousand`),
    a command that hides, colours or strikes out what it holds (`7\\hphantom{8}`, `\\cancel{7}8`), a
    word that changes or hedges the value (`3 \\text{ squared}`, `\\text{3 halves}`, `3 \\text{ times
    two}`, `\\text{not 3}`, `\\text{about 3}`: unit words such as `3 \\text{ times}` stay)."""
    marks = {"negation"} if _NEGATION.search(s) else set()
    marks.update("hidden:" + m.group(0) for m in _HIDING.finditer(s))
    if _DIGIT_SUBSCRIPT.search(s):
        marks.add("subscript")
    marks.update("scale:" + m.group(1).lower() for m in _SCALE.finditer(s))
    marks.update("scale:" + m.group(1) for m in _SCALE_ABBR.finditer(s))
    marks.update("word:" + re.sub(r"\s+", " ", m.group(1).lower()) for m in _VALUE_WORDS.finditer(s))
    if _DECORATED.search(s):
        marks.add("decorated")               # "6^{*}", "6'": a footnote, a prime, feet or minutes
    if _SIMILAR.search(s):
        marks.add("similar")                 # "\\sim 5": about 5
    if _ONE_SIDED.search(s):
        marks.add("one-sided")               # "5^{+}": a one-sided limit, not 5
    if _PER_MILLE.search(s):
        marks.add("per-mille")               # "5 \\permil", "5 \\text{ bps}": not 5
    return marks


_PRIME = re.compile(r"(?:[A-Za-z)\]}]|\\right\s*[)\]])\s*(?:'|\^\s*\{?\s*\\prime(?![A-Za-z]))")


def primes(s: str) -> int:
    """How many primes stand on a letter or a bracket (`f'(x)`, `x''`, `(2x)'`, `y^\\prime`): a
    derivative, never the bare letter (`mathanswer` compares the counts both ways)."""
    return len(_PRIME.findall(_TEXT_ANY.sub(" ", s)))


def units(s: str) -> frozenset[str]:
    """The unit words written in text commands next to a number ("5 \\text{ cm}" -> {"cm"},
    "3 \\mbox{ inches}" -> {"in"}), spelled one way; empty when the answer has no number outside
    its text commands (an option letter, a word answer)."""
    if not re.search(r"\d", _TEXT_ANY.sub(" ", s)):
        return frozenset()
    bare = _BARE_UNIT.fullmatch(s.strip())
    if bare and bare.group(1).lower() in _KNOWN_UNITS:       # "5 m", "12 cm^2": written without \\text
        w = bare.group(1).lower()
        return frozenset({_UNIT_SYNONYMS.get(w, w)})
    words: set[str] = set()
    for m in _TEXT_ANY.finditer(s):
        for k, part in enumerate(_PER.split(m.group(1), maxsplit=1)):   # "5 \\text{ per hour}": a rate, not hours
            for w in re.findall(r"[A-Za-z]+", part):
                w = w.lower()
                if w in _NOT_UNITS or _SCALE.fullmatch(w):
                    continue
                w = _UNIT_SYNONYMS.get(w, _UNIT_SYNONYMS.get(w[:-1], w[:-1]) if len(w) > 2 and w.endswith("s") else w)
                words.add("/" * k + w)
        power = _UNIT_POWER.match(s, m.end())
        if power:
            words.add("^" + re.sub(r"\s", "", power.group(1)))   # "5 \\text{ cm}^2" is an area, not a length
    return frozenset(words)
