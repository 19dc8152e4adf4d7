"""Math answer text around a \\boxed{}: when a box stands as the answer, and the answer lines
read with the boxes.

- `ill_formed(text)`: why a prediction cannot be read at all (TeX programming, a comment inside a
  box, a spray of boxes, a box that is not the answer), or None;
- `box_context(text)`: why a \\boxed{} / \\fbox{} is not the answer as written, or None. A box
  counts only when it stands as the answer: nothing in the same formula operates on it (no
  operator, relation other than "=", exponent, subscript, prime, factorial, percent, digit or
  letter glued to it, no command taking it as an argument: `10-\\boxed{5}`, `x \\ne \\boxed{5}`,
  `\\boxed{5}^2`, `\\frac{1}{\\boxed{5}}`, `\\boxed{5}\\%`, `\\boxed{5}0`), and the words right
  around it do not negate, bound, condition, hedge or scale it ("not \\boxed{5}", "at least
  \\boxed{5}", "\\boxed{5} if n is odd", "\\boxed{5} (or 6)", "\\boxed{5} thousand"). Prose around
  it is fine: "Therefore the answer is \\boxed{5}.", "$x = \\boxed{5}$ apples";
- `boxed_and_final_lines(text, boxed)`: the boxes' answers with the "final answer" lines, and
  an "answer is X" line after the last box (the model's last word: "Wait, the answer is 6");
- `line_answer(line)`: an "answer: X" line's answer when X is a bare answer or one math span.

Must not import: sympy, math_verify, zmq, controller other than controller.contracts,
nodeagent.verifier.mathanswer (which imports this one).
"""
from __future__ import annotations

import re

from nodeagent.verifier import mathform as mf
from nodeagent.verifier import mathnorm as mn

BOX_START = re.compile(r"\\(?:boxed|fbox)\s*\{")
_BIDI = re.compile("[\u202a-\u202e\u2066-\u2069][^\u202a-\u202e\u2066-\u2069]{2,}")   # "\u202e56" shows as 65

# -- the words around a box -------------------------------------------------------------------------
_NEG_WORDS = (r"not|isnt|arent|wasnt|werent|cant|couldnt|wont|wouldnt|shouldnt|dont|doesnt|didnt|aint|never|no|nor|neither|wrong|incorrect|false|maybe|perhaps|possibly|probably|least|most|"
              r"cannot|unless|except|besides|unlike|instead|rather|excluding|without")
_NEAR_WORDS = re.compile(r"(?<![A-Za-z])(?:" + _NEG_WORDS + r")(?![A-Za-z])", re.IGNORECASE)     # in the 3 words before
_LAST_WORD = re.compile(r"(?:^|\s)(?:minus|plus|times|over|than|negative|reciprocal|inverse|opposite|or|if|to|"
                        r"below|above|under|exceeds?|exceeding)$", re.IGNORECASE)
_AFTER_WORDS = re.compile(
    r"(?<![A-Za-z])(?:" + _NEG_WORDS + r"|or|if|when\w*|assum\w*|provided|given|for(?!\s+(?:part|question|problem|item|\())|with|where|at(?=\s+(?:least|most|best|worst|\$|[A-Za-z]\b))|only|max\w*|min\w*|"
    r"more|less|fewer|greater|smaller|larger|bigger|higher|lower|above|below|under|over|squared|cubed|percent\w*|"
    r"per|thousand\w*|million\w*|billion\w*|trillion\w*|hundred\w*|tens|tenths|dozens?|pairs?|kilo\w*|milli\w*|"
    r"ppm|rad|radians?|too|also|approx\w*|roughly|about|around|nearly|almost|off|but|else|otherwise|divided|"
    r"multiplied|factorial|power|plus|minus|times|negative|inverse|reciprocal|th|st|nd|rd)"
    r"(?![A-Za-z])", re.IGNORECASE)
_WORDS_READ = 2                        # words read after a box (3 before it)
_SPACE = re.compile(r"(?:\s|\\[,;:! ]|\\q?quad(?![A-Za-z])|~|\\displaystyle|\\textstyle|\\hfill|\*\*|"
                    r"\\(?:left|right|big|Big|bigg|Bigg)[lr]?(?=[()\[\]]))+")
_OPENERS = re.compile(r"(?:</?[A-Za-z]+>|\$\$?|\\\[|\\\(|\\begin\{[a-z*]+\}(?:\{[^{}]*\})?|&|\\\\)$")
_CLOSERS = re.compile(r"^(?:</?[A-Za-z]+>|\$\$?|\\\]|\\\)|\\end\{[a-z*]+\}|&|\\\\)")
_FINE_BEFORE_CMD = re.compile(r"\\(?:Rightarrow|Longrightarrow|implies|therefore|iff|Leftrightarrow|to|rightarrow|"
                              r"approx|equiv|cong|in|colon|qquad|quad|hfill|textbf|mathbf|boldsymbol|bm|bf|large|Large|LARGE|huge|"
                              r"Huge|displaystyle)$")
_TEXT_GROUP = re.compile(r"^\\(?:text|textrm|textbf|textit|textnormal|mbox|mathrm)\s*\{")
_TEXT_ARG = re.compile(r"\\(?:text\w*|mbox|mathrm)\s*\{([^{}]*)\}")


# between two boxes, only a list's glue: "\\boxed{2} or \\boxed{3}", "$\\boxed{2}$, $x = \\boxed{3}$"
_BOX_GLUE = re.compile(r"[\s$,;]*(?:\\text\s*\{\s*)?(?:or|and)?(?:\s*\})?[\s$,;]*(?:[A-Za-z](?:_\{?\w+\}?)?\s*=)?[\s$]*")


def _box_spans(text: str) -> list[tuple[int, int]]:
    """(start, end) of every outermost box (end after its closing brace); an unclosed box ends the text."""
    spans: list[tuple[int, int]] = []
    pos = 0
    while len(spans) <= mn.MAX_BOXED:
        m = BOX_START.search(text, pos)
        if m is None:
            break
        depth, i = 1, m.end()
        while i < len(text) and depth:
            depth += (text[i] == "{") - (text[i] == "}")
            i += 1
        spans.append((m.start(), i))
        pos = i
    return spans


def _words(s: str) -> list[str]:
    s = re.sub(r"\\[A-Za-z]+", " ", _TEXT_ARG.sub(r" \1 ", s))
    return re.sub(r"[^A-Za-z']+", " ", s).replace("'", "").split()


def _sentence_before(text: str, start: int, floor: int) -> str:
    lo = max(floor, text.rfind("\n", 0, start) + 1)
    s = text[lo:start]
    cut = max((m.end() for m in re.finditer(r"[.!?:;](?:\s|$)|\\\\", s)), default=0)
    return s[cut:]


def _before_fault(text: str, start: int, floor: int) -> str | None:
    words = " ".join(_words(_sentence_before(text, start, floor))[-3:])
    if _NEAR_WORDS.search(words) or _LAST_WORD.search(words):
        return f"the words {words!r} right before it"
    s = _SPACE.sub(" ", text[max(floor, text.rfind("\n", 0, start) + 1):start]).rstrip()
    while (s.endswith("(") or s.endswith("[") or s.endswith("{")) and not s.endswith("\\" + s[-1]):
        if s.endswith("{") and re.search(r"(?:[}^_]|\\(?!(?:textbf|mathbf|boldsymbol|bm|bf)\s*\{$)[A-Za-z]+)\s*\{$", s):
            return "a command taking it as an argument"
        s = _SPACE.sub(" ", re.sub(r"\\[A-Za-z]+\s*\{$", "", s[:-1]) if s.endswith("{") else s[:-1]).rstrip()
    if not s or _OPENERS.search(s) or s.endswith(":") or s.endswith(","):
        return None
    if s.endswith("}") and (g := _group_start(s)) is not None and _TEXT_GROUP.match(s[g:]):
        return None                                  # \text{Answer: }\boxed{5}: its words were read above
    if s[-1] == "=" and not re.search(r"(?:\\not|!|:|\\ne|<|>)\s*=$", s):
        return None
    cmd = re.search(r"\\[A-Za-z]+$", s)
    if cmd:
        return None if _FINE_BEFORE_CMD.search(s) else f"{cmd.group(0)!r} right before it"
    if s[-1].isalpha() and (re.search(r"[A-Za-z]{2,}$", s) or text[start - 1].isspace()):
        return None                                  # a prose word ("is \\boxed{5}")
    return f"{s[-12:]!r} right before it"


def _group_start(s: str) -> int | None:
    """Where the command owning the brace group that ends `s` starts, or None."""
    depth, i = 0, len(s) - 1
    while i >= 0:
        depth += (s[i] == "}") - (s[i] == "{")
        if depth == 0:
            break
        i -= 1
    if i < 0:
        return None
    m = re.search(r"\\[A-Za-z]+\s*$", s[:i])
    return m.start() if m else None


def _after_fault(text: str, end: int, ceiling: int) -> str | None:
    hi = text.find("\n", end)
    s = text[end:min(ceiling, hi if hi >= 0 else len(text))]
    s = _SPACE.sub(" ", s).lstrip()
    while s[:1] in (")", "]", "}"):
        s = _SPACE.sub(" ", s[1:]).lstrip()
    if ceiling < len(text) and re.fullmatch(r"=\s*", s) and hi != ceiling:
        return None                                  # \boxed{8/2} = \boxed{4}: both are read
    s = re.sub(r"^\\(?:pmod\s*\{[^{}]*\}|[bp]?mod\s*\d+)", "", s).lstrip()    # \equiv \boxed{9} \pmod{11}
    closed = _CLOSERS.match(s)
    if closed:
        s = s[closed.end():]
    elif s and not s[0].isalpha():
        t = _TEXT_GROUP.match(s)
        if t is None and not re.match(r"[.,;:?](?!\d)", s) :
            return f"{s[:12]!r} right after it"
    t = _TEXT_ARG.match(s)
    if t and re.match(r"\s*[\^_'!]", s[t.end():]):
        return f"{s[:t.end() + 6]!r} right after it"      # \boxed{5}\text{ cm}^{-1}: a unit raised
    s = _TEXT_ARG.sub(r" \1 ", s)
    sentence = re.split(r"[.!?;](?:\s|$)|\\\\", s, maxsplit=1)[0]
    words = sentence.split()
    head = " ".join(words[:_WORDS_READ])
    hit = _AFTER_WORDS.search(" ".join(words[:_WORDS_READ + 1]))
    if (hit and hit.start() < len(head)) or re.search(r"\d", head.split(" ")[0]):
        return f"the words {head!r} right after it"
    return None


def box_context(text: str) -> str | None:
    """Why a box in `text` does not stand as the answer (see the module docstring), or None."""
    spans = _box_spans(text)
    for n, (start, end) in enumerate(spans):
        floor = spans[n - 1][1] if n else 0
        ceiling = spans[n + 1][0] if n + 1 < len(spans) else len(text)
        lone_before = n > 0 and _BOX_GLUE.fullmatch(text[floor:start]) is not None
        lone_after = ceiling < len(text) and _BOX_GLUE.fullmatch(text[end:ceiling]) is not None
        why = (None if lone_before else _before_fault(text, start, floor)) or \
            (None if lone_after else _after_fault(text, end, ceiling))
        if why:
            return why
    return None


def ill_formed(text: str) -> str | None:
    """Why the prediction `text` cannot be read as written, or None."""
    program = mf.tex_program(text)
    if program is not None:
        return f"ill-formed answer: TeX programming {program!r} (what renders is not what is written)"
    if mf.comment_in_box(text):
        return "ill-formed answer: a TeX comment ('%') inside a \\boxed{} hides its closing brace"
    if _BIDI.search(text):
        return "ill-formed answer: a bidirectional control character (what shows is not the order written)"
    boxes = len(BOX_START.findall(text))
    if boxes > mn.MAX_BOXED:
        return f"{boxes} \\boxed answers given (at most {mn.MAX_BOXED} are read)"
    why = box_context(mn.unescape_commands(text)) if boxes else None
    if why:
        return f"the boxed answer is not the answer as written: {why}"
    return None


# -- answer lines read with the boxes ---------------------------------------------------------------
FINAL_LINE = re.compile(r"final\s+answer[*:\s]*(?:is\b[*:\s]*)?([^\n]*)", re.IGNORECASE)
LATER_LINE = re.compile(r"(?:(?:^|\n)[ \t*#]*(?:final\s+)?answer[ \t*]*:|\b(?:the|my|correct|real|right|true)\s+answer[ \t]*"
                        r"(?:is|should\s+be|must\s+be|would\s+be|will\s+be))[ \t*:]*(?:actually[ \t]*)?([^\n]*)",
                        re.IGNORECASE)
ANSWER_PREFIX = re.compile(r"^(?:\s*(?:the\s+)?(?:final\s+)?answer\s*(?:is\s*:?|:)\s*)+", re.IGNORECASE)
_FINAL_IS = re.compile(r"^(?:the\s+)?(?:final\s+)?answer\s+is\s*:?\s*", re.IGNORECASE)
_HOPE = re.compile(r"[\s.]*I hope it is correct.*$", re.IGNORECASE)
_MATH_SPAN = re.compile(r"^\$+([^$]+)\$+\s*[.,;]?$")
# an "answer is ..." line after the last box that holds a number but cannot be read:
LATER_UNREAD = "\\text{(an answer line after the box that cannot be read)}"


_GSM_LINE = re.compile(r"(?m)^([ \t]*)####[ \t]*(?=\S)")


def answer_marks(text: str) -> str:
    """`text` with a GSM8K answer line ("#### 5") read as an "Answer: 5" line."""
    return _GSM_LINE.sub(r"\1Answer: ", text) if "####" in text else text


def conditioned(line: str) -> bool:
    """True when an "answer: X" line that is no bare answer bounds, conditions, hedges or negates
    its value ("at least 5", "5 (maximum)", "5 if n is odd", "5 when x = 2", "5 assuming a = 2"):
    no number in it is the answer, whole."""
    body = _TEXT_ARG.sub(r" \1 ", ANSWER_PREFIX.sub("", line))
    body = re.sub(r"\\[A-Za-z]+|[$()\[\],;:]", " ", body)
    if re.search(r"\d[^=]*?(?<![<>!\\])\b[A-Za-z](?:_\{?\w+\}?)?\s*=", body):
        return True                                  # "5 when x = 2", "5 assuming a=2"
    tokens = body.split()
    for i, tok in enumerate(tokens):
        if not re.search(r"\d", tok):
            continue
        before, after = " ".join(tokens[max(0, i - 2):i]), " ".join(tokens[i + 1:i + 3])
        if _NEAR_WORDS.search(before) or _LAST_WORD.search(before) or _AFTER_WORDS.search(after):
            return True                              # words next to a number: "at least 5", "5 (maximum)"
    return False


def line_answer(line: str) -> str | None:
    """An "answer: X" line's answer when X is a bare answer or one math span, else None."""
    line = _HOPE.sub("", _FINAL_IS.sub("", ANSWER_PREFIX.sub("", line))).strip()
    m = _MATH_SPAN.fullmatch(line)
    if m:
        return mn.normalise(m.group(1))
    return mn.normalise(line) if mn.is_bare_answer(line) else None


def _dedupe(answers: list[str]) -> list[str]:
    return list(dict.fromkeys(a for a in answers if a))


def boxed_and_final_lines(text: str, boxed: list[str]) -> list[str]:
    """The boxes' answers and every "final answer" line's (one without a box of its own): a
    single such line after the last box wins (the model's last word); lines before it are more
    final answers, which must agree with the boxes ("**Final Answer** 7" then \\boxed{6} is two).
    An "answer is X" line after the last box is such a line too ("Wait, the answer is 6"); one
    holding a number that cannot be read is an answer that cannot be read (`LATER_UNREAD`)."""
    spans = _box_spans(text)
    last = text.rfind("\\boxed")
    last_end = spans[-1][1] if spans else len(text)
    before: list[str] = []
    after: list[str] = []
    for m in FINAL_LINE.finditer(text):
        body = m.group(1).strip().strip("*").strip()
        if not body or "\\boxed" in body or "\\fbox" in body:
            continue
        line = line_answer(body)
        if line is None:
            continue
        commented = re.match(r"\s*%", text[text.rfind("\n", 0, m.start()) + 1:m.start()])   # a TeX comment line
        (after if m.start() > last and not commented else before).append(line)   # a line TeX hides must agree
    if not after:
        for m in LATER_LINE.finditer(text, last_end):
            body = re.split(r"\.(?:\s|$)", m.group(1))[0].strip().strip("*").strip()
            if not body or "\\boxed" in body or "\\fbox" in body or re.match(r"\s*%", text[text.rfind("\n", 0, m.start()) + 1:]):
                continue
            line = line_answer(body)
            if line is not None:
                after.append(line)
            elif re.search(r"\d", body):
                after.append(LATER_UNREAD)
    if len(after) == 1:
        return after
    return _dedupe([mn.normalise(b) for b in boxed] + before + after)
