"""Judge stage of the contamination check: an LLM asked whether a held-out task is a copy.

Off by default. It goes through the verifier's OpenAI-compatible judge hook
(`nodeagent.verifier.checkers.judge_score`, handed in by the CLI as `JudgeConfig.score`: one
chat completion at temperature 0, a reply ending in `SCORE: x`), with a rubric that asks whether the two texts pose the same problem
(rephrased, translated, or renamed), as in the llm-decontaminator method. A score at or above
`JudgeConfig.min_score` is the verdict `contaminated`, below it `clean`; a judge that fails or
answers without a score gives the verdict `error` with the reason, never an exception.

Must not import: zmq, nodeagent.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Optional

# (judge spec, instruction, answer, diff) -> (score in [0, 1], the judge's text); raises on failure
JudgeClient = Callable[[dict, str, str, str], "tuple[float, str]"]

RUBRIC = (
    "Decide whether the agent's final answer below is a copy of the task: the same problem "
    "rephrased, translated into another natural or programming language, or with renamed "
    "variables, so that knowing one gives away the other. Problems that merely share a topic, "
    "a template or a technique but need a different answer are NOT copies. Score 1 for a copy, "
    "0 otherwise.")
VERDICTS = ("contaminated", "clean", "error")


@dataclass(frozen=True)
class JudgeConfig:
    endpoint: str                 # OpenAI-compatible base URL, e.g. http://127.0.0.1:8000/v1
    model: str
    top_k: int = 20               # at most this many candidate pairs go to the judge
    min_cosine: float = 0.5       # semantic near-misses at or above this are candidates too
    min_score: float = 0.5        # judge score at or above: contaminated
    timeout_s: float = 60.0
    max_chars: int = 4000         # of each text sent
    score: Optional[JudgeClient] = None   # the judge client (the CLI passes the verifier's)

    def __post_init__(self) -> None:
        if not self.endpoint.startswith(("http://", "https://")):
            raise ValueError(f"contamination: judge endpoint {self.endpoint!r} is not an http(s) URL")
        if not self.model:
            raise ValueError("contamination: judge 'model' must be set")
        if self.score is None:
            raise ValueError("contamination: the judge needs a client (`score`)")
        if self.top_k < 1 or self.timeout_s <= 0 or not 0.0 < self.min_score <= 1.0:
            raise ValueError("contamination: judge top_k >= 1, timeout_s > 0, min_score in (0, 1]")


def judge_pair(cfg: JudgeConfig, heldout_text: str, train_text: str) -> tuple[str, str]:
    """(verdict, reason) for one candidate pair."""
    spec = {"endpoint": cfg.endpoint, "model": cfg.model, "rubric": RUBRIC,
            "timeout_s": cfg.timeout_s}
    try:
        score, text = cfg.score(spec, heldout_text[:cfg.max_chars], train_text[:cfg.max_chars], "")
    except Exception as exc:  # noqa: BLE001 - any failure of the judge is the verdict "error", not a crash
        return "error", str(exc)[:500]
    verdict = "contaminated" if score >= cfg.min_score else "clean"
    return verdict, f"score {score:g}: {text.strip()[-400:]}"
