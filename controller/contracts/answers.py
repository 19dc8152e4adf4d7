"""What counts as a boxed final answer: the one reading of `\\boxed{...}` shared by the importer
(the MATH gold is the last boxed answer of the reference solution) and the math checker.

Pure string functions. Must not import: anything of Paddock.
"""
from __future__ import annotations

import re

MAX_ANSWER_CHARS = 2000          # a longer "answer" is not one; its checks fail fast
MAX_BOXED = 64                   # \\boxed{} bodies read from one text
_BOXED = re.compile(r"\\(?:boxed|fbox)\s*\{")


def boxed_contents(text: str, limit: int = MAX_BOXED) -> list[str]:
    """The bodies of the first `limit` \\boxed{...} in `text`, in order, nested braces kept; an
    unclosed one, or one longer than MAX_ANSWER_CHARS, is dropped (so the scan costs at most
    limit x that)."""
    out: list[str] = []
    for n, m in enumerate(_BOXED.finditer(text)):
        if n >= limit:
            break
        depth, i, end = 1, m.end(), min(len(text), m.end() + MAX_ANSWER_CHARS)
        while i < end and depth:
            depth += (text[i] == "{") - (text[i] == "}")
            i += 1
        if depth == 0:
            out.append(text[m.end():i - 1].strip())
    return out
