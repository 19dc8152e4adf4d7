"""Seeded tool faults for agents (a task's `tool_faults`): agents must cope with failing tools.

`ToolFaults.of(spec, seed)` reads `{"seed": int, "error": rate, "latency": rate, "latency_s":
seconds, "kill": rate}` (rates per tool call, 0..1; unknown keys raise FaultSpecError naming
the key). `draw(step, index)` is a pure function of (the spec's seed, the rollout's seed, the
step, the call's index): the same rollout replays the same faults. Kinds:
- `error`: the call is not run; the observation says the tool failed (exit code None);
- `kill`: the call is not run; the observation is that of a process killed by SIGKILL (137);
- `latency`: the call runs after `latency_s` seconds more (the wall budget still counts).
A fault is recorded in the step row (`steps.tool_faults`) and is never an infrastructure
failure, nor scored as one: the verifier grades the final state as for any rollout.

Must not import: zmq, nodeagent.agent, nodeagent.verifier.
"""
from __future__ import annotations

import hashlib
import random
from dataclasses import dataclass
from typing import Any, Mapping

from nodeagent.harness.tools import ToolResult

FAULT_KINDS = ("error", "kill", "latency")
_KEYS = ("seed", "latency_s") + FAULT_KINDS
DEFAULT_LATENCY_S = 1.0
ERROR_OBSERVATION = "error: the tool failed (transient error; injected fault)"
KILL_OBSERVATION = "Killed"


class FaultSpecError(ValueError):
    """A task's tool_faults are malformed; the message names the key."""


@dataclass(frozen=True)
class ToolFaults:
    seed: int
    rates: tuple[tuple[str, float], ...]
    latency_s: float

    @classmethod
    def of(cls, spec: Mapping[str, Any] | None, rollout_seed: int) -> "ToolFaults | None":
        if not spec:
            return None
        unknown = sorted(set(spec) - set(_KEYS))
        if unknown:
            raise FaultSpecError(f"tool_faults: unknown key {unknown[0]!r}; valid: {', '.join(_KEYS)}")
        rates = []
        for kind in FAULT_KINDS:
            r = spec.get(kind, 0.0)
            if isinstance(r, bool) or not isinstance(r, (int, float)) or not 0.0 <= r <= 1.0:
                raise FaultSpecError(f"tool_faults: {kind!r} must be a rate in [0, 1], got {r!r}")
            rates.append((kind, float(r)))
        if sum(r for _, r in rates) > 1.0:
            raise FaultSpecError("tool_faults: the rates add up to more than 1")
        lat = spec.get("latency_s", DEFAULT_LATENCY_S)
        if isinstance(lat, bool) or not isinstance(lat, (int, float)) or lat < 0:
            raise FaultSpecError(f"tool_faults: 'latency_s' must be >= 0 seconds, got {lat!r}")
        seed = spec.get("seed", 0)
        if isinstance(seed, bool) or not isinstance(seed, int):
            raise FaultSpecError(f"tool_faults: 'seed' must be an integer, got {seed!r}")
        mixed = int.from_bytes(hashlib.sha256(f"{seed}:{rollout_seed}".encode()).digest()[:8], "big")
        return cls(mixed, tuple(rates), float(lat))

    def draw(self, step: int, index: int) -> str | None:
        """The fault of tool call `index` of step `step`, or None."""
        u = random.Random(f"{self.seed}:{step}:{index}").random()
        acc = 0.0
        for kind, rate in self.rates:
            acc += rate
            if u < acc:
                return kind
        return None


def faulted_result(kind: str) -> ToolResult:
    """The observation of a call that an `error` or `kill` fault replaced."""
    if kind == "error":
        return ToolResult(ERROR_OBSERVATION, None, "injected_fault:error")
    return ToolResult(KILL_OBSERVATION, 137, "injected_fault:kill")


__all__ = ["FAULT_KINDS", "FaultSpecError", "ToolFaults", "faulted_result"]
