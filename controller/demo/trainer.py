"""A small REINFORCE trainer for the scripted policy's logits.

The policy is a softmax over strategies per task family, `params = {family: {strategy: logit}}`
(the format `controller.demo.policy_server` serves). One update takes scored samples
`(family, strategy, reward)` and moves each family's logits along the policy gradient with a
per-family mean-reward baseline:

    logit[f][k] += lr * mean over samples i of family f of (r_i - mean_r[f]) * (1[a_i = k] - p[f][k])

Pure arithmetic on dicts; `softmax` is the one the policy server samples with. Must not import:
zmq, sqlite3, nodeagent, http.server (controller.demo.policy_server imports this).
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Iterable, Mapping

from controller.analysis.defences import PLAN_LINE

Params = dict[str, dict[str, float]]


class TrainerError(ValueError):
    """A sample does not fit the params (unknown family or strategy, non-finite reward)."""


@dataclass(frozen=True)
class Sample:
    family: str
    strategy: str
    reward: float


def softmax(logits: Mapping[str, float]) -> dict[str, float]:
    top = max(logits.values())
    exps = {k: math.exp(v - top) for k, v in logits.items()}
    total = sum(exps.values())
    return {k: e / total for k, e in exps.items()}


def probabilities(params: Mapping[str, Mapping[str, float]]) -> dict[str, dict[str, float]]:
    """The policy's strategy probabilities per family."""
    return {family: softmax(logits) for family, logits in params.items()}


def strategy_from_plan(content: str | None) -> str:
    """The strategy named on the first line `plan: <strategy>` of a first assistant message.
    Raises TrainerError when the message carries no plan line."""
    match = PLAN_LINE.match(content or "")
    if match is None:
        raise TrainerError(f"no 'plan: <strategy>' line in {(content or '')[:80]!r}")
    return match.group(1)


class ScriptedPolicyTrainer:
    """Holds the current params; `update` applies one REINFORCE step and returns the new params."""

    def __init__(self, params: Mapping[str, Mapping[str, float]], lr: float = 0.5) -> None:
        if not (lr > 0 and math.isfinite(lr)):
            raise TrainerError(f"lr must be a positive finite number, got {lr!r}")
        self.lr = lr
        self.params: Params = {f: {s: float(v) for s, v in logits.items()} for f, logits in params.items()}
        self.version = 0

    def _check(self, samples: Iterable[Sample]) -> dict[str, list[Sample]]:
        by_family: dict[str, list[Sample]] = {}
        for s in samples:
            if s.family not in self.params:
                raise TrainerError(f"sample family {s.family!r} is not in params {sorted(self.params)}")
            if s.strategy not in self.params[s.family]:
                raise TrainerError(f"sample strategy {s.strategy!r} is not a {s.family} strategy "
                                   f"{sorted(self.params[s.family])}")
            if isinstance(s.reward, bool) or not math.isfinite(s.reward):
                raise TrainerError(f"sample reward must be a finite number, got {s.reward!r}")
            by_family.setdefault(s.family, []).append(s)
        return by_family

    def update(self, samples: list[Sample]) -> Params:
        """One policy-gradient step. Families without samples keep their logits. Returns a copy
        of the new params; `self.version` counts the updates applied."""
        by_family = self._check(samples)
        new: Params = {f: dict(logits) for f, logits in self.params.items()}
        for family, group in by_family.items():
            probs = softmax(self.params[family])
            baseline = sum(s.reward for s in group) / len(group)
            grad = {k: 0.0 for k in probs}
            for s in group:
                advantage = s.reward - baseline
                for k, p in probs.items():
                    grad[k] += advantage * ((1.0 if k == s.strategy else 0.0) - p)
            for k in grad:
                new[family][k] += self.lr * grad[k] / len(group)
        self.params = new
        self.version += 1
        return {f: dict(logits) for f, logits in new.items()}
