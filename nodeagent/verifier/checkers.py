"""Checkers: answer checks (math equivalence, exact, regex) and the LLM judge.

The checker spec itself (schema, `validate_spec`, `SpecError`) is a contract:
`controller.contracts.checkerspec`. `answer_verdict(kind, gold, text)` is the answer check the
verifier runs; math answers are judged by `nodeagent.verifier.mathanswer` (Math-Verify's parser
and verifier, with exact rational comparison, ordered tuples, sets and intervals, and a spray
of different final answers failing: see docs/verifier.md). These functions can be slow or hang
on pathological input: the verifier calls them only
through the isolated check runner (`nodeagent.verifier.checks`, `answer_verdict`), which kills
them at a deadline. `judge_score` asks an OpenAI-compatible endpoint to grade against a rubric
(off by default), through the harness's model client (`nodeagent.harness.model`).
Must not import: zmq, controller.store, controller.broker, controller.cli, nodeagent.agent,
nodeagent.harness.loop.
"""
from __future__ import annotations

import re

from controller.contracts.checkerspec import SpecError
from nodeagent.harness.model import HTTPModel, ModelError, check_reply
from nodeagent.verifier import mathanswer


def extract_answer(text: str | None) -> str | None:
    """The final answer in a model's text: the last of `mathanswer.final_answers` (the boxed
    answers, else the 'answer:' lines, else the last number), or None."""
    answers = mathanswer.final_answers(text or "")
    return answers[-1] if answers else None


math_equal = mathanswer.math_equal


def answer_verdict(kind: str, gold: str, pred_text: str | None, instruction: str | None = None) -> dict:
    """{"ok": bool, "detail": str} for an answer check; run in the isolated check runner.
    `instruction` (the task's prompt, the author's text) tells a math check whether a decimal
    approximation of an exact gold was asked (`mathanswer.math_verdict`)."""
    if pred_text is None or not str(pred_text).strip():
        return {"ok": False, "detail": "no answer given"}
    if kind == "math":
        return mathanswer.math_verdict(gold, pred_text, instruction)
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
