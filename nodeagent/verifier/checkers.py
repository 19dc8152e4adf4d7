"""Checkers: answer checks (math equivalence, exact, regex) and the LLM judge.

The checker spec itself (schema, `validate_spec`, `SpecError`) is a contract:
`controller.contracts.checkerspec`. `answer_verdict(kind, gold, text)` is the answer check the
verifier runs. `math_equal(gold, pred)`: extract the final answer (\\boxed{...}, "answer:",
last number), normalise LaTeX, compare exactly, then as numbers with a tolerance, then
symbolically with sympy — only on expressions made of allowlisted tokens (sympify evaluates its
input). These functions can be slow or hang on pathological input: the verifier calls them only
through the isolated check runner (`nodeagent.verifier.checks`, `answer_verdict`), which kills
them at a deadline. `judge_score` asks an OpenAI-compatible endpoint to grade against a rubric
(off by default), through the harness's model client (`nodeagent.harness.model`).
Must not import zmq, controller.* outside contracts, nodeagent.agent, nodeagent.harness.loop.
"""
from __future__ import annotations

import re
from fractions import Fraction

from controller.contracts.checkerspec import SpecError
from nodeagent.harness.model import HTTPModel, ModelError, check_reply

SYMPY_TIMEOUT_S = 5.0
REL_TOL = 1e-6

_BOXED = re.compile(r"\\boxed\s*\{")
_NUMBER = re.compile(r"-?\d+(?:\.\d+)?(?:/\d+)?")


def _boxed_contents(text: str) -> list[str]:
    out: list[str] = []
    for m in _BOXED.finditer(text):
        i, depth, buf = m.end(), 1, []
        while i < len(text):
            ch = text[i]
            depth += (ch == "{") - (ch == "}")
            if depth == 0:
                out.append("".join(buf).strip())
                break
            buf.append(ch)
            i += 1
    return out


def boxed_answers(text: str) -> list[str]:
    """The contents of every \\boxed{...} in `text`, in order (nested braces kept)."""
    return _boxed_contents(text)


def final_answers(text: str | None) -> list[str]:
    """Every final-answer candidate of the strongest kind present: all \\boxed{} contents, else
    every 'answer:' line, else the last number."""
    if not text:
        return []
    boxed = _boxed_contents(text)
    if boxed:
        return boxed
    found = [f.strip().rstrip(".").strip()
             for f in re.findall(r"answer\s*(?:is\s*:?|:)\s*([^\n]+)", text, re.IGNORECASE)]
    found = [f for f in found if f]
    if found:
        return found
    nums = _NUMBER.findall(text)
    return nums[-1:]


MAX_CANDIDATES = 8


def candidates(text: str | None) -> list[str]:
    """The distinct final answers (by normalised form), in order of appearance."""
    seen: dict[str, str] = {}
    for a in final_answers(text):
        seen.setdefault(normalise(a), a)
    return list(seen.values())


def hedged(text: str | None) -> bool:
    """Several different final answers given (a spray of boxed values)."""
    return len(candidates(text)) > 1


def extract_answer(text: str | None) -> str | None:
    """The final answer in a model's text: last \\boxed{}, else after 'answer:', else last number."""
    answers = final_answers(text)
    return answers[-1] if answers else None


def normalise(ans: str) -> str:
    s = ans.strip().strip("$").strip()
    for old, new in (("\\left", ""), ("\\right", ""), ("\\dfrac", "\\frac"), ("\\tfrac", "\\frac"),
                     ("\\!", ""), ("\\,", ""), ("\\ ", ""), ("^\\circ", ""), ("\\%", ""),
                     ("\\cdot", "*"), ("\\times", "*"), ("{,}", "")):
        s = s.replace(old, new)
    s = re.sub(r"\\text\{[^}]*\}", "", s)
    s = re.sub(r"\s+", "", s)
    s = re.sub(r"^[a-zA-Z]=", "", s)
    return s.rstrip(".")


def _latex_to_sympy(s: str) -> str:
    s = re.sub(r"\\frac\{([^{}]*)\}\{([^{}]*)\}", r"((\1)/(\2))", s)
    s = re.sub(r"\\sqrt\{([^{}]*)\}", r"sqrt(\1)", s)
    s = re.sub(r"\\sqrt(\d+)", r"sqrt(\1)", s)
    s = s.replace("\\pi", "pi").replace("^", "**").replace("{", "(").replace("}", ")")
    s = re.sub(r"(\d)([a-zA-Z(])", r"\1*\2", s)
    return s


def _as_number(s: str) -> Fraction | float | None:
    s = s.replace(",", "")
    try:
        return Fraction(s)
    except (ValueError, ZeroDivisionError):
        pass
    m = re.fullmatch(r"\\frac\{(-?\d+)\}\{(\d+)\}", s) or re.fullmatch(r"-?\\frac\{(\d+)\}\{(\d+)\}", s)
    if m and int(m.group(2)):
        sign = -1 if s.startswith("-") and not m.group(1).startswith("-") else 1
        return sign * Fraction(int(m.group(1)), int(m.group(2)))
    return None


MAX_POWERS = 2           # a power tower can take sympy hours: refused before it starts
_ALLOWED_NAMES = {"sqrt", "pi", "E", "I", "oo", "sin", "cos", "tan", "log", "exp", "Rational"}
_TOKEN = re.compile(r"\s*(?:(\d+(?:\.\d+)?)|([A-Za-z]+)|(\*\*|[-+*/(),]))")


def safe_expression(s: str) -> bool:
    """True when `s` is only numbers, single-letter symbols, allowlisted names and arithmetic."""
    pos = 0
    while pos < len(s):
        m = _TOKEN.match(s, pos)
        if not m or m.end() == pos:
            return False
        name = m.group(2)
        if name and len(name) > 1 and name not in _ALLOWED_NAMES:
            return False
        pos = m.end()
    return bool(s.strip()) and s.count("**") + s.count("^") <= MAX_POWERS


def sympy_equal(a: str, b: str) -> bool | None:
    """Symbolic equality of two allowlisted expressions; None when unsafe or undecidable.
    Can take unbounded time: call it only inside the isolated check runner."""
    if not (safe_expression(a) and safe_expression(b)):
        return None
    from sympy import simplify, sympify
    try:
        return bool(simplify(sympify(a) - sympify(b)) == 0)
    except Exception:  # noqa: BLE001 - any sympy failure means "cannot decide"
        return None


def math_equal(gold: str, pred_text: str | None) -> bool:
    """True when the final answer equals `gold`. With several different final answers, every
    one must equal `gold` (two forms of the same value pass; a spray of candidates fails,
    whichever comes last), so listing candidates never earns reward."""
    cands = candidates(pred_text)
    if not cands or len(cands) > MAX_CANDIDATES:
        return False
    return all(_equal(gold, c) for c in cands)


def _equal(gold: str, pred: str) -> bool:
    g, p = normalise(gold), normalise(pred)
    if g == p:
        return True
    gn, pn = _as_number(g), _as_number(p)
    if gn is not None and pn is not None:
        return abs(float(gn) - float(pn)) <= REL_TOL * max(1.0, abs(float(gn)))
    if not p or len(p) > 200:
        return False
    return bool(sympy_equal(_latex_to_sympy(g), _latex_to_sympy(p)))


def answer_verdict(kind: str, gold: str, pred_text: str | None) -> dict:
    """{"ok": bool, "detail": str} for an answer check; run in the isolated check runner."""
    if pred_text is None or not str(pred_text).strip():
        return {"ok": False, "detail": "no answer given"}
    if kind == "math":
        pred = extract_answer(pred_text)
        if pred is None:
            return {"ok": False, "detail": "unparseable answer: no \\boxed{}, 'answer:' or number found"}
        if hedged(pred_text):
            ok = math_equal(gold, pred_text)
            n = len(candidates(pred_text))
            return {"ok": ok, "detail": f"{n} different final answers given, "
                    f"{'all equal to' if ok else 'not all equal to'} gold={gold[:200]!r}"}
        return {"ok": math_equal(gold, pred_text), "detail": f"extracted={pred[:200]!r} gold={gold[:200]!r}"}
    if kind == "exact":
        return {"ok": exact_match(gold, pred_text), "detail": f"answer={str(pred_text)[:200]!r}"}
    if kind == "regex":
        return {"ok": regex_match(gold, pred_text), "detail": f"answer={str(pred_text)[:200]!r}"}
    raise SpecError(f"checker kind {kind!r} is not an answer check")


def exact_match(gold: str, pred_text: str | None) -> bool:
    return (pred_text or "").strip() == gold.strip()


def regex_match(pattern: str, pred_text: str | None) -> bool:
    return re.fullmatch(pattern, (pred_text or "").strip()) is not None


# ---------------------------------------------------------------------------------------------
# The judge hook

class JudgeError(Exception):
    """The judge endpoint failed or answered without a score: infrastructure, not a verdict."""


JUDGE_PROMPT = ("You grade an AI agent's work against a rubric. Reply with a short justification and "
                "then a last line `SCORE: <number between 0 and 1>`.\n\nRubric:\n{rubric}\n\n"
                "Task:\n{instruction}\n\nAgent's final answer:\n{answer}\n\nAgent's file changes:\n{diff}")
_SCORE = re.compile(r"SCORE:\s*([01](?:\.\d+)?)\s*$", re.MULTILINE)


def judge_score(judge: dict, instruction: str, answer: str, diff: str) -> tuple[float, str]:
    """(score in [0, 1], the judge's text) from an OpenAI-compatible chat endpoint."""
    payload = {"model": judge["model"], "temperature": 0, "messages": [
        {"role": "user", "content": JUDGE_PROMPT.format(rubric=judge["rubric"], instruction=instruction[:4000],
                                                        answer=answer[:4000], diff=diff[:16000])}]}
    try:
        body = HTTPModel(judge["endpoint"]).complete(payload, float(judge.get("timeout_s", 60.0)))
        text = check_reply(body, judge["endpoint"])["message"].get("content") or ""
    except ModelError as exc:
        raise JudgeError(str(exc)) from None
    m = _SCORE.findall(text)
    if not m:
        raise JudgeError(f"judge reply has no 'SCORE: x' line: {text[-200:]!r}")
    score = float(m[-1])
    if not 0.0 <= score <= 1.0:
        raise JudgeError(f"judge score {score} is outside [0, 1]")
    return score, text[-1000:]
