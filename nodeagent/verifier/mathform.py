"""Math answer form: what a TeX answer shows, and the answers whose reading is not one value.

A reward reads what the answer shows. A parser reads tokens; TeX renders them; where the two
differ, the answer is judged by what is shown, or is not an answer:
- `tex_program(text)`: the text programs TeX (a conditional `\\iffalse ... \\fi`, a macro
  definition `\\def`, `\\newcommand`, `\\let`, a catcode change, a primitive that prints other
  characters than it spells: `\\char54`, `\\romannumeral`): what renders is not what is written,
  anywhere in the text, so the answer is ill-formed;
- `shown(s)`: `s` without what TeX never draws (`\\phantom{-}`, `\\hphantom`, `\\vphantom`,
  `\\mathstrut`), and `\\smash{X}` as X (drawn, only its height is hidden); invisible content is
  never read as part of the answer, and when it holds a digit (`\\phantom{6}5`) the answer hides a
  value and is ill-formed; a combining mark (`5\u0336`, a struck-out 5) is drawn over its character;
- `ill_formed(s)`: the reason an extracted answer has no single reading, else None: a TeX comment
  (`5 % 6`: TeX shows 5, a reader 5 % 6), content drawn over other content (`\\llap`, `\\rlap`,
  `\\mathrlap`, negative `\\hspace`/`\\kern`, `\\raisebox`, `\\makebox`), an equation tag (a second
  value shown), an accent or ellipsis on digits that is no well-formed repeating decimal
  (`5.\\overline{0}1`, `0.333...`), digits spaced apart other than by thousands (`1\\,2`), a
  mark doubled or misplaced (`5\\%\\%`, `5^\\circ^\\circ`, `\\%5`, `5 \\cdot \\%`, `5\\text{ cm cm}`);
- `comment_in_box(text)`: a `%` inside a \\boxed{} that comments out the box's own closing brace;
- `uncoloured(s)`: `s` without a colour that covers all of it (`\\textcolor{red}{5}` is 5);
- `base_numeral(s)`, `asked_bases(instruction)`: a numeral with a base subscript (`2015_6`) and
  the bases a task asks for: the subscript is read only then (`mathanswer`);
- `repeating(s)`: the exact value of a repeating decimal (`0.1\\overline{6}`, `0.\\bar{3}`,
  `0.\\dot{3}`, `0.\\dot{1}4285\\dot{7}`, `0.(3)`), else None.

Colour, strike-out and size commands are read by `mathnorm.meaning_marks` (an answer holding one
is not its bare value). Pure string functions.
Must not import: sympy, math_verify, zmq, controller, nodeagent.verifier.mathanswer,
nodeagent.verifier.mathnorm.
"""
from __future__ import annotations

import bisect
import re
import unicodedata
from fractions import Fraction

_END = r"(?![A-Za-z])"
_CONDITIONALS = ("if(?!f(?![A-Za-z]))[A-Za-z@]*", "else", "fi", "or", "unless")   # every \\if.. but \\iff
_DEFINITIONS = ("def", "gdef", "edef", "xdef", "let", "futurelet", "newcommand", "renewcommand", "providecommand",
                "DeclareRobustCommand", "DeclareMathOperator", "newenvironment", "renewenvironment",
                "NewDocumentCommand", "RenewDocumentCommand", "catcode", "mathcode", "lccode", "uccode", "sfcode",
                "delcode", "chardef", "mathchardef", "countdef", "csname", "endcsname", "expandafter", "noexpand",
                "afterassignment", "aftergroup", "global", "long", "outer", "scantokens", "detokenize", "input",
                "include", "write", "immediate", "makeatletter", "makeatother", "char", "mathchar", "symbol",
                "romannumeral", "Roman", "roman", "arabic", "number", "the", "numexpr", "dimexpr", "uppercase",
                "lowercase", "string", "meaning", "setcounter", "addtocounter", "value", "everymath",
                "everydisplay", "mathchoice", "pagecolor", "definecolor", "colorlet", "ExplSyntaxOn", "ExplSyntaxOff",
                "stepcounter", "refstepcounter", "newcounter", "newlength", "setlength", "addtolength", "directlua",
                "luaexec", "unexpanded", "pdfstrcmp")
_TEX_PROGRAM = re.compile(r"\\(" + "|".join(_CONDITIONALS + _DEFINITIONS) + r")" + _END
                          + r"|\\begin\s*\{\s*comment\s*\}")
_INVISIBLE = re.compile(r"\\(?:[hv]?phantom)\s*(?=\{)")
_SMASH = re.compile(r"\\smash\s*(?:\[[tb]?\]\s*)?(?=\{)")
_STRUTS = re.compile(r"\\(?:mathstrut|strut)" + _END)
_OVERLAP = re.compile(r"\\(?:[lrc]lap|math[lrc]lap|ooalign|hidewidth|raisebox|makebox|framebox|moveleft|moveright|"
                      r"raise|lower|vcenter|hbox\s*to|rule|vrule|hrule|tag\*?)" + _END
                      + r"|\\(?:hspace\*?|mspace)\s*\{\s*-|\\(?:kern|mkern|hskip|mskip)\s*\{?\s*-")
_COMMENT = re.compile(r"(?<!\\)%[^\n]*\S")
_ACCENT = re.compile(r"\\(?:overline|underline|bar|dot|ddot|dddot|hat|widehat|tilde|widetilde|vec|acute|grave|breve|"
                     r"check|mathring|overrightarrow|overleftarrow|overleftrightarrow|overbrace|underbrace|wideparen|"
                     r"overarc|overgroup|undergroup)" + _END + r"\s*(?:\{([^{}]*)\}|([0-9]))")
_ELLIPSIS = re.compile(r"\d\s*(?:\.\s*\.\s*\.|…|\\(?:[lcv]?dots[a-z]*|ldotp|cdotp)" + _END + ")")
_DECIMAL_PAREN = re.compile(r"(?:\d+\.\d*|\.\d+)\(")
_SPACED_DIGITS = re.compile(r"(?<![\d.,])\d+(?:[ \t]+\d+)+")
_DIGIT_ARGUMENT = re.compile(r"(?:[_^]|\\[dtc]?frac|\\[dt]?binom)[ \t]*$")
_E_INSIDE = re.compile(r"(?<![A-Za-z\\])(?:\d+(?:\.\d*)?|\.\d+)[eE][+-]?\d")
_E_WHOLE = re.compile(r"[+-]?(?:\d+(?:\.\d*)?|\.\d+)[eE][+-]?\d{1,4}")
_GROUPED = re.compile(r"\d{1,3}(?: \d{3})+")

_MARK = (r"(?:\\%|(?<!\\)%|percent(?:age)?|per\s*cent|pct|‰|‱|\\permil|\\textperthousand|\\circ|°|\\degree|"
         r"\\textdegree|degrees?|\\\$|\$|dollars?|euros?|€|£|¥)")
_GLUE = r"(?:\s|[{}^]|\\[,;:!]|\\text\{|\\mathrm\{|\\mbox\{)*"
_DOUBLED_MARK = re.compile(_MARK + _GLUE + _MARK)
_MARK_FIRST = re.compile(r"(?:\\%|(?<!\\)%|‰|‱|\\permil)\s*[\d.]|\^\s*\{?\s*(?:\\%|%|‰)|"
                         r"(?:[-+*/=(,^_]|\\(?:cdot|times|div|pm|mp|ast)(?![A-Za-z]))\s*(?:\\%|(?<!\\)%|‰|‱|\\permil)|"
                         r"\\circ(?:[\s{}^]|\\,)*(?:\\prime|')")
_ADJACENT_TEXT = re.compile(r"\}\s*\\(?:text|textrm|mathrm|mbox)\s*\{")
_TEXT_BODY = re.compile(r"\\(?:text|textrm|mathrm|mbox)\s*\{([^{}]*)\}")
_REPEATED_WORD = re.compile(r"(?<![\\A-Za-z])([A-Za-z]{2,12})(?:\s|[{}]|\\,|\\text\{|\\mathrm\{|\\mbox\{)+\1(?![A-Za-z])")

_PERIOD = r"\s*(?:\{\s*(\d{1,20})\s*\}|(\d))"
_REP_BAR = re.compile(r"([+-]?)(\d*)\.(\d{0,20})\\(?:overline|bar)" + _END + _PERIOD)
_REP_PAREN = re.compile(r"([+-]?)(\d*)\.(\d{0,20})\(\s*(\d{1,20})\s*\)")
_DOT = r"\\dot" + _END + _PERIOD.replace("(\\d{1,20})", "(\\d)")
_REP_DOT = re.compile(r"([+-]?)(\d*)\.(\d{0,20})" + _DOT + r"(?:(\d{0,18})" + _DOT + ")?")


def tex_program(text: str) -> str | None:
    """The TeX programming command in `text` (`\\iffalse`, `\\def` ...), else None."""
    m = _TEX_PROGRAM.search(text)
    return None if m is None else m.group(0)


_BRACE = re.compile(r"(?<!\\)[{}]")
_BOX = re.compile(r"\\(?:boxed|fbox)\s*\{")


def comment_in_box(text: str) -> bool:
    """True when a \\boxed{} body holds a TeX comment (an unescaped `%`) that changes what TeX
    shows: the comment runs to the end of its line, the box's closing brace included, so TeX
    reads the box on past it, up to the next brace that closes it (`\\boxed{6 %}` then a line
    `5}` shows 65). With no such brace later in the text (`\\boxed{25%} of them.`), nothing can
    join the box: the `%` is read as a percent sign."""
    if not re.search(r"(?<!\\)%", text) or not _BOX.search(text):
        return False
    braces = [(m.start(), m.group(0)) for m in _BRACE.finditer(text)]   # one pass over the braces only
    depth, closing, stack, level = [], {}, [], 0
    for pos, ch in braces:
        if ch == "{":
            stack.append(pos)
            level += 1
        else:
            if stack:
                closing[stack.pop()] = pos
            level -= 1
        depth.append(level)                                        # depth after each brace
    lowest = depth[:]                                              # lowest[k]: least depth from brace k on
    for k in range(len(lowest) - 2, -1, -1):
        lowest[k] = min(lowest[k], lowest[k + 1])
    positions = [pos for pos, _ in braces]
    for m in _BOX.finditer(text):
        end = closing.get(m.end() - 1, len(text))
        percent = re.search(r"(?<!\\)%", text[m.end():end])
        if percent is None:
            continue
        newline = text.find("\n", m.end() + percent.start())
        if newline < 0 or end > newline and not text[m.end() + percent.end():newline].strip():
            continue                       # no brace on the comment's line: `\\boxed{5050%⏎}` comments out nothing
        k = bisect.bisect_left(positions, newline)                 # the first brace after the comment
        if k < len(positions) and lowest[k] < (depth[k - 1] if k else 0):
            return True                    # a later brace closes the box TeX keeps open
    return False


def _group_end(s: str, start: int) -> int:
    """Index just after the brace group that opens at `start` (s[start] == "{"), or len(s)."""
    depth = 0
    for i in range(start, len(s)):
        if s[i] == "{" and (i == 0 or s[i - 1] != "\\"):
            depth += 1
        elif s[i] == "}" and (i == 0 or s[i - 1] != "\\"):
            depth -= 1
            if depth == 0:
                return i + 1
    return len(s)


def shown(s: str) -> str:
    """`s` as TeX draws it: phantoms and struts removed with what they hold (a phantom that holds a
    digit is kept: a hidden value, which `ill_formed` refuses), `\\smash{X}` read as X."""
    if "\\" not in s:
        return s
    s = _STRUTS.sub(" ", s)
    pos = 0
    while (m := _INVISIBLE.search(s, pos)) is not None:
        end = _group_end(s, m.end())
        if re.search(r"\d", s[m.end():end]):
            pos = end                          # a hidden value: kept, for `ill_formed` to refuse
            continue
        s = s[:m.start()] + " " + s[end:]
    while (m := _SMASH.search(s)) is not None:
        end = _group_end(s, m.end())
        s = s[:m.start()] + s[m.end() + 1:end - 1] + s[end:]
    return s


_COLOUR_CALL = re.compile(r"\\(?:textcolor|colorbox)\s*(?:\[[a-zA-Z]*\]\s*)?\{[^{}]*\}\s*(?=\{)|\\fcolorbox\s*\{[^{}]*\}\s*\{[^{}]*\}\s*(?=\{)")
_COLOUR_SWITCH = re.compile(r"\\color\s*(?:\[[a-zA-Z]*\]\s*)?\{[^{}]*\}")


def uncoloured(s: str) -> str:
    """`s` without a colour that covers the whole answer (`\\textcolor{red}{5}`, `{\\color{blue}5}`,
    `\\color{red}{5}`): one colour over everything changes nothing that is read. A colour over
    part of the answer (`\\color{white}6 5`, `\\textcolor{white}{6}5`) stays, a meaning mark."""
    for _ in range(8):
        t = s.strip()
        m = _COLOUR_CALL.match(t)
        if m and _group_end(t, m.end()) == len(t):
            s = t[m.end() + 1:-1]
            continue
        if t.startswith("{") and _group_end(t, 0) == len(t) and _COLOUR_SWITCH.match(t, 1):
            s = t[1:-1]
            continue
        m = _COLOUR_SWITCH.match(t)
        if m and not _COLOUR_SWITCH.search(t, m.end()) and not re.search(r"(?<!\\)\}", _brace_free(t[m.end():])):
            s = t[m.end():]                     # a switch at the start colours all that follows
            continue
        break
    return s


def _brace_free(s: str) -> str:
    """`s` with its balanced brace groups removed (what is left outside every group)."""
    while (m := re.search(r"(?<!\\)\{[^{}]*(?<!\\)\}", s)) is not None:
        s = s[:m.start()] + s[m.end():]
    return s


def repeating(s: str) -> Fraction | None:
    """The exact value of a repeating decimal written as a whole: `0.1\\overline{6}`, `0.\\bar{3}`,
    `0.(3)`, `0.\\dot{3}`, `0.\\dot{1}4285\\dot{7}` (dots over the first and last digit of the
    block); None for anything else."""
    t = s.strip()
    m = _REP_BAR.fullmatch(t) or _REP_PAREN.fullmatch(t)
    if m:
        sign, whole, fixed = m.group(1), m.group(2), m.group(3)
        period = "".join(g for g in m.groups()[3:] if g)
    else:
        m = _REP_DOT.fullmatch(t)
        if m is None:
            return None
        sign, whole, fixed, first, first1, middle, last, last1 = m.groups()
        head = first or first1
        tail = last or last1
        period = head + ((middle or "") + tail if tail else "")
        if middle and not tail:
            return None
    value = Fraction(int(whole or 0)) + Fraction(int(fixed or 0), 10 ** len(fixed)) + Fraction(
        int(period), (10 ** len(period) - 1) * 10 ** len(fixed))
    return -value if sign == "-" else value


_REP_TOKEN = re.compile(r"[+-]?\d*\.\d*(?:\\(?:overline|bar)(?![A-Za-z])\s*(?:\{\s*\d{1,20}\s*\}|\d)|\(\s*\d{1,20}\s*\)|"
                        r"\\dot(?![A-Za-z])\s*(?:\{\s*\d\s*\}|\d)(?:\d{0,18}\\dot(?![A-Za-z])\s*(?:\{\s*\d\s*\}|\d))?)")
_REP_GOES_ON = re.compile(r"\s*(?:[\d.(]|\\(?:overline|bar|dot|[lcv]?dots|ldotp|cdotp)(?![A-Za-z])|…)")


def _bad_repeating(s: str) -> bool:
    """True when a mark over digits, an ellipsis after digits or a parenthesised period is not part
    of a well-formed repeating decimal that ends its numeral (each item of a list on its own)."""
    triggers = [a.start() for a in _ACCENT.finditer(s)
                if re.fullmatch(r"[\d\s.]*", a.group(1) if a.group(1) is not None else a.group(2))]
    triggers += [m.start() for m in _ELLIPSIS.finditer(s)] + [m.start() for m in _DECIMAL_PAREN.finditer(s)]
    if not triggers:
        return False
    spans = []
    for m in _REP_TOKEN.finditer(s):
        if repeating(m.group(0)) is None or _REP_GOES_ON.match(s, m.end()):
            return True                    # 5.\\overline{0}1, 5.\\overline{0}\\ldots, 0.(3)3
        spans.append((m.start(), m.end()))
    return not all(any(a <= t < b for a, b in spans) for t in triggers)


MAX_NESTING = 40                 # deeper brackets are not read whole: `2^{2^{...}}` 100 deep is no answer


def _depth(s: str) -> int:
    depth = deepest = 0
    for ch in s:
        if ch in "({[":
            depth += 1
            deepest = max(deepest, depth)
        elif ch in ")}]":
            depth -= 1
    return deepest


_DOUBLE_DOT = re.compile(r"\d\s*(?<!\.)\.\.(?!\.)\s*[\d-]")


def ill_formed(s: str) -> str | None:
    """Why the extracted answer `s` has no single reading (see the module docstring), else None."""
    if (m := _TEX_PROGRAM.search(s)) is not None:
        return f"TeX programming {m.group(0)!r}"
    if any(unicodedata.category(ch) in ("Mn", "Me") for ch in s):
        return "a combining mark drawn over a character (a strike-out, a slash, a bar: U+0336, U+0338, U+0305)"
    if _COMMENT.search(s):
        return "a TeX comment ('%' hides the rest of its line)"
    if (m := _INVISIBLE.search(s)) is not None:
        return f"a value drawn invisibly ({m.group(0).strip()!r} holding a digit)"
    if (m := _OVERLAP.search(s)) is not None:
        return f"content drawn over other content or a second value shown ({m.group(0)!r})"
    if _depth(s) > MAX_NESTING:
        return f"brackets nested more than {MAX_NESTING} deep (no parser reads it whole)"
    if (m := _DOUBLE_DOT.search(s)) is not None:
        return f"two dots between digits ({m.group(0)!r}: a range or a typo, no one number)"
    if _bad_repeating(s):
        return "an ill-formed repeating decimal (a mark over digits, '...' or '(d)' not closing a decimal)"
    if _E_INSIDE.search(s) and not _E_WHOLE.fullmatch(s.strip()):
        return "e-notation inside an expression ('2e1' reads as 20 and as 2*e*1)"
    for run in _SPACED_DIGITS.finditer(s):
        if _DIGIT_ARGUMENT.search(s[:run.start()]):
            continue        # \log_2 8, \frac 1 2: a one-digit argument, then the next token
        after = s[run.end():].lstrip()
        if not _GROUPED.fullmatch(re.sub(r"[ \t]+", " ", run.group(0))) and not after.startswith("/"):
            return f"digits spaced apart ({run.group(0)!r} is no thousands grouping)"
    if (m := _DOUBLED_MARK.search(s)) is not None:
        return f"a mark written twice ({m.group(0)!r})"
    if (m := _MARK_FIRST.search(s)) is not None:
        return f"a percent mark not after its number ({m.group(0)!r})"
    if (m := _REPEATED_WORD.search(s)) is not None:
        return f"a unit written twice ({m.group(0)!r})"
    for text in _TEXT_BODY.finditer(_ADJACENT_TEXT.sub(" ", s)):
        if (m := re.search(r"(?<![A-Za-z])([A-Za-z]+)\s+\1(?![A-Za-z])", text.group(1))) is not None:
            return f"a unit written twice ({m.group(0)!r})"
    return None


_BASED = re.compile(r"([0-9A-Za-z]+)\s*_\s*(?:\{\s*(\d{1,2})\s*\}|(\d))")
_BASE_WORDS = {"two": 2, "three": 3, "four": 4, "five": 5, "six": 6, "seven": 7, "eight": 8, "nine": 9, "ten": 10,
               "eleven": 11, "twelve": 12, "sixteen": 16, "binary": 2, "octal": 8, "hexadecimal": 16}
_BASE_ASKED = re.compile(r"\bbase[\s-]*(\d{1,2}|" + "|".join(list(_BASE_WORDS)[:12]) + r")\b|\b(binary|octal|hexadecimal)\b",
                         re.IGNORECASE)


_MARK_KINDS = (("percent", re.compile(r"\\%|(?<!\\)%|percent|per\s*cent|pct")),
               ("degree", re.compile(r"\\circ(?![A-Za-z])|°|\\degree(?![A-Za-z])|\\textdegree|degrees?")),
               ("currency", re.compile(r"\\\$|(?<!\\)\$|dollars?|euros?|€|£|¥|\\(?:euro|pounds|yen)(?![A-Za-z])")),
               ("currency:dollar", re.compile(r"\\\$|(?<!\\)\$|dollars?|USD")),       # which currency: $12 is not 12 euros
               ("currency:euro", re.compile(r"euros?|€|\\euro(?![A-Za-z])|EUR")),
               ("currency:pound", re.compile(r"£|\\pounds(?![A-Za-z])|GBP")),
               ("currency:yen", re.compile(r"¥|\\yen(?![A-Za-z])|JPY|yuan|CNY")))


def marks(s: str) -> frozenset[str]:
    """The kinds of value marks `s` carries: "percent", "degree", "currency" (5% is not 5°)."""
    return frozenset(kind for kind, pattern in _MARK_KINDS if pattern.search(s))


def base_numeral(s: str) -> tuple[str, int] | None:
    """("2015", 6) for a numeral with a base subscript (`2015_6`, `2015_{6}`), else None."""
    m = _BASED.fullmatch(s.strip())
    return None if m is None else (m.group(1), int(m.group(2) or m.group(3)))


def _numeral_value(s: str) -> int | None:
    """The value of a plain decimal integer or of a numeral with a base subscript (`12_3` is 5);
    -1 for a base numeral that is no numeral (`1010_1`, `1010_{0}`, a digit not in the base)."""
    s = s.strip()
    if re.fullmatch(r"\d{1,60}", s):
        return int(s)
    based = base_numeral(s)
    if based is None:
        return None
    digits, base = based
    if not 2 <= base <= 36 or len(digits) > 60:
        return -1
    try:
        return int(digits, base)
    except ValueError:
        return -1


def base_values_equal(gold: str, pred: str) -> bool | None:
    """A gold numeral with a base subscript against a predicted numeral (`5` for `12_3`, `1010_7`
    or `1010_{x}` for `1010_2`, `12` for `12_3`): equal when their values are. None when the gold
    has no base subscript (a predicted subscript then stays a meaning mark: `5_{6}` is never 5)
    or the prediction is no numeral."""
    if base_numeral(gold) is None:
        return None
    g, p = _numeral_value(gold), _numeral_value(pred)
    if (g is None and "_" in gold) or (p is None and "_" in pred):
        return False                           # `1010_{x}`, `1010_{(3)}`: no base read, never the same numeral
    if g is None or p is None:
        return None
    return g == p and g >= 0


def asked_bases(instruction: str | None) -> frozenset[int]:
    """The number bases a task's instruction names ("in base 6", "base-two", "binary")."""
    if not instruction:
        return frozenset()
    found = set()
    for m in _BASE_ASKED.finditer(instruction[-4000:]):
        word = (m.group(1) or m.group(2)).lower()
        found.add(int(word) if word.isdigit() else _BASE_WORDS[word])
    return frozenset(found)


def base_equal(gold: str, pred: str, bases: frozenset[int]) -> bool | None:
    """A numeral with a base subscript against one without (`2015_6` for `2015`) when the task's
    instruction names that base (`bases`): the same digits. None when the rule does not apply
    (no base asked: a digit subscript is a meaning mark, and `101_2` is never 5)."""
    if not bases:
        return None
    g, p = base_numeral(gold), base_numeral(pred)
    based = g if g is not None else p
    if based is None or (g is not None and p is not None):
        return None
    plain = (pred if g is not None else gold).strip()
    return based[1] in bases and re.fullmatch(r"[0-9A-Za-z]+", plain) is not None and based[0] == plain


__all__ = ["asked_bases", "base_equal", "base_numeral", "base_values_equal", "marks", "comment_in_box", "ill_formed", "repeating", "shown", "tex_program",
           "uncoloured"]
