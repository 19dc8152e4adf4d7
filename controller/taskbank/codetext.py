"""The natural-language view of a code task, for the semantic stage of the contamination check.

A rephrased copy of a code benchmark item (llm-decontaminator's rephrased HumanEval) keeps what
the task asks and changes everything else: identifiers renamed, `for` loops turned into `while`
loops, dead statements and a different library inserted, doctest values changed. Structural
fingerprints of the code (AST shingles, winnowing) find almost none of these copies, and an
embedding of the whole code is dominated by its syntax, which every Python function shares. What
survives the rewrite is the description: the docstring's prose and the comments, and the words of
the function's name. `code_view` extracts that text (doctest examples kept: on the calibration
split, leaving them out loses more copies than it clears negatives), which the semantic stage
embeds beside the task's whole text (controller/taskbank/semantic.py).

Code in which Python's tokenizer finds no prose (C, JavaScript, a syntax error) gets the same view from
regular expressions over its comments and docstrings.

The second signal is the code's shape with its names taken out (`structure_grams`): its tokens
with every identifier that is not a keyword or builtin as `ID`, every number as `0`, every
string as `S`, docstrings, comments and `pass` dropped, as a set of 4-grams. A rephrased copy
renames and pads; the body it keeps (`while b: a, b = b, a % b`) reads the same. `containment`
is the share of the held-out task's grams found in the training task's, so a copy padded with
extra functions and examples still contains the original. On its own the signal is weak
(generic shapes recur); the semantic stage adds it to the prose cosine of a code task's nearest
training neighbour when both codes parse as Python (`is_python`; controller/taskbank/
contamination.py, `code_structure_weight`).

Pure standard library. Must not import: zmq, onnxruntime, tokenizers, numpy (the semantic extra).
"""
from __future__ import annotations

import ast
import builtins
import io
import keyword
import re
import tokenize
import warnings

from controller.contracts.tasks import Task

_DEF_NAME = re.compile(r"^\s*(?:async\s+)?(?:def|class)\s+([A-Za-z_]\w*)"      # Python
                       r"|\bfunction\s+([A-Za-z_]\w*)\s*\("                      # JavaScript
                       r"|^[A-Za-z_][\w \t*]*?\b([A-Za-z_]\w*)\s*\([^)]*\)\s*\{",  # C
                       re.M)
_C_COMMENT = re.compile(r"/\*(.*?)\*/|//([^\n]*)|#([^\n]*)", re.S)
_PY_STRING = re.compile(r'"""(.*?)"""|\'\'\'(.*?)\'\'\'', re.S)
_CAMEL = re.compile(r"(?<=[a-z0-9])(?=[A-Z])")
MIN_DOC_CHARS = 20      # a string literal shorter than this is data, not a description
STRUCTURE_GRAM = 4      # tokens per structural gram (chosen on the calibration split)
_KEEP_NAMES = frozenset(keyword.kwlist) | frozenset(dir(builtins))
_ANY_TOKEN = re.compile(r"[A-Za-z_]\w*|\d[\w.]*|\"(?:\\.|[^\"\\])*\"|'(?:\\.|[^'\\])*'|\S")
_AFTER_STATEMENT = (tokenize.NEWLINE, tokenize.INDENT, tokenize.DEDENT, tokenize.NL)
CODE_SUFFIXES = (".py", ".c", ".cc", ".cpp", ".h", ".js", ".ts", ".java", ".go", ".rs")


def name_words(name: str) -> str:
    """`below_zero` -> "below zero", `sortArray` -> "sort array"."""
    return " ".join(w.lower() for w in _CAMEL.sub("_", name).split("_") if w)


def _python_prose(code: str) -> list[str] | None:
    """Comments and docstring-sized strings, or None when the tokenizer cannot read `code`."""
    prose = []
    try:
        for tok in tokenize.generate_tokens(io.StringIO(code).readline):
            if tok.type == tokenize.COMMENT:
                prose.append(tok.string.lstrip("#").strip())
            elif tok.type == tokenize.STRING and len(tok.string) >= MIN_DOC_CHARS:
                prose.append(tok.string.strip("rRbBuUfF").strip("\"'").strip())
    except (tokenize.TokenError, IndentationError, SyntaxError):
        return None
    return prose


def _regex_prose(code: str) -> list[str]:
    prose = [next(g for g in m.groups() if g is not None).strip(" *\n")
             for m in _C_COMMENT.finditer(code)]
    prose += [next(g for g in m.groups() if g is not None).strip()
              for m in _PY_STRING.finditer(code)]
    return prose


def code_view(code: str) -> str:
    """The words of the defined names, then the prose of the comments and docstrings; the code
    itself when it has no prose at all."""
    prose = _python_prose(code)
    if not prose:               # not Python (or no Python comment): C, JavaScript, ...
        prose = _regex_prose(code)
    prose = [p for p in prose if p]
    if not prose:
        return code
    names = [name_words(next(g for g in m if g)) for m in _DEF_NAME.findall(code)]
    return "\n".join([" ".join(dict.fromkeys(n for n in names if n)), *prose])


def _shape(tok: str) -> str:
    if tok[0].isalpha() or tok[0] == "_":
        return tok if tok in _KEEP_NAMES else "ID"
    if tok[0].isdigit():
        return "0"
    return "S" if tok[0] in "\"'" else tok


def structure_tokens(code: str) -> list[str]:
    """`code`'s tokens with names, numbers and strings abstracted (module docstring); Python's
    tokenizer where it reads the code, a regular expression otherwise (C, JavaScript)."""
    out: list[str] = []
    prev = tokenize.NEWLINE
    try:
        for tok in tokenize.generate_tokens(io.StringIO(code).readline):
            if tok.type == tokenize.ERRORTOKEN and not tok.string.isspace():
                raise SyntaxError(tok.string)      # not Python (a backtick, a `$`): fallback
            if tok.type in (tokenize.NAME, tokenize.NUMBER, tokenize.OP):
                out.append(_shape(tok.string))
            elif tok.type == tokenize.STRING and prev not in _AFTER_STATEMENT:
                out.append("S")                     # a docstring (a string statement) is dropped
            if tok.type not in (tokenize.COMMENT, tokenize.NL):
                prev = tok.type
    except (tokenize.TokenError, IndentationError, SyntaxError):
        body = re.sub(r"/\*.*?\*/|//[^\n]*|#[^\n]*", " ", code, flags=re.S)
        out = [_shape(t) for t in _ANY_TOKEN.findall(body)]
    return [t for t in out if t != "pass"]


def structure_grams(code: str, n: int = STRUCTURE_GRAM) -> frozenset[str]:
    toks = structure_tokens(code)
    return frozenset(" ".join(toks[i:i + n]) for i in range(max(len(toks) - n + 1, 1))) \
        if toks else frozenset()


def is_python(code: str) -> bool:
    """Whether `code` parses as Python: shapes are compared only between two such codes (a
    translation to C or JavaScript has another shape by nature)."""
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", SyntaxWarning)
            ast.parse(code)
    except (SyntaxError, ValueError, RecursionError, MemoryError):
        return False
    return True


def containment(held: frozenset[str], train: frozenset[str]) -> float:
    """The share of `held`'s grams that `train` holds (0 when `held` is empty)."""
    return len(held & train) / len(held) if held else 0.0


def task_code(task: Task) -> str | None:
    """A task's code: its reference solution (hidden files named reference*), else its visible
    code files; None when it has none (a math or prose task)."""
    trees = ([{r: c for r, c in task.hidden.items() if r.rsplit("/", 1)[-1].startswith("reference")}],
             [task.files])
    for (tree,) in trees:
        code = [tree[rel] for rel in sorted(tree)
                if isinstance(tree[rel], str) and rel.endswith(CODE_SUFFIXES)]
        if code:
            return "\n".join(code)
    return None


def task_code_view(task: Task) -> str | None:
    """`code_view` of the task's code, or None when it has no code."""
    code = task_code(task)
    return code_view(code) if code is not None else None
