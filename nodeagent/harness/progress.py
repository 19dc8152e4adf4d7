"""The harness's no-progress detector: an episode that loops is ended as the policy's failure.

Two rules, fed one assistant turn at a time (`ProgressDetector.turn`):
- **repeat** (`no_progress_repeats`, default DEFAULT_REPEATS): the same tool call -- its name
  and its arguments, compared as parsed JSON -- answered by the same observation, the Nth time
  in the episode (not only in a row: a loop of two or three calls is caught too). Stop reason
  `no_progress`.
- **silence** (`no_output_turns`, default DEFAULT_NO_OUTPUT_TURNS): N turns in a row with no
  output at all: no text from the assistant and only empty observations (commands that print
  nothing, again and again). An observation seen before still counts as output: the same
  "replaced 1 occurrence(s) in f.py" after each of many edits is work, not silence (a cycle of
  the same calls and observations is the repeat rule's). Stop reason `no_output`.
A budget of 0 takes the default; the task's budgets set them (controller/contracts/tasks.py).
The detector sees only what the harness sees (calls and observations), never the sandbox.

Must not import: zmq, controller other than controller.contracts, nodeagent.agent,
nodeagent.sandbox.
"""
from __future__ import annotations

import hashlib
import json
from collections import Counter
from typing import Any, Iterable, Optional

from controller.contracts.tasks import Budgets

DEFAULT_REPEATS = 8
DEFAULT_NO_OUTPUT_TURNS = 16
NO_PROGRESS, NO_OUTPUT = "no_progress", "no_output"   # the loop's stop reasons


def _digest(*parts: Any) -> bytes:
    h = hashlib.blake2b(digest_size=16)
    for p in parts:
        b = p if isinstance(p, bytes) else str(p).encode("utf-8", "surrogatepass")
        h.update(len(b).to_bytes(8, "little"))
        h.update(b)
    return h.digest()


def _canonical_args(arguments: Any) -> str:
    """The call's arguments as canonical JSON (key order and spacing do not make a new call);
    text that is not JSON as it is."""
    if isinstance(arguments, str):
        try:
            arguments = json.loads(arguments)
        except (ValueError, RecursionError):   # nested past what the JSON reader goes
            return arguments
    try:
        return json.dumps(arguments, sort_keys=True, separators=(",", ":"))
    except (TypeError, ValueError, RecursionError):
        return repr(arguments)


class ProgressDetector:
    """Counts repeated (call, observation) pairs and turns without output; `turn()` says which
    rule fired (its stop reason) or None."""

    def __init__(self, repeats: int = DEFAULT_REPEATS, no_output_turns: int = DEFAULT_NO_OUTPUT_TURNS) -> None:
        if repeats < 1 or no_output_turns < 1:
            raise ValueError("the no-progress limits must be >= 1")
        self.repeats, self.no_output_turns = repeats, no_output_turns
        self._pairs: Counter = Counter()
        self.silent_turns = 0
        self.most_repeated = 0

    @classmethod
    def of(cls, b: Budgets) -> "ProgressDetector":
        return cls(b.no_progress_repeats or DEFAULT_REPEATS, b.no_output_turns or DEFAULT_NO_OUTPUT_TURNS)

    def turn(self, content: Optional[str], calls: Iterable[tuple[Any, Any, str]]) -> Optional[str]:
        """One assistant turn: its text and its tool calls as (name, arguments, observation).
        Returns NO_PROGRESS, NO_OUTPUT or None."""
        output = bool(content and content.strip())
        fired = None
        for name, arguments, observation in calls:
            key = _digest(name, _canonical_args(arguments), observation)
            self._pairs[key] += 1
            self.most_repeated = max(self.most_repeated, self._pairs[key])
            if self._pairs[key] >= self.repeats:
                fired = NO_PROGRESS
            output = output or bool(observation and str(observation).strip())
        self.silent_turns = 0 if output else self.silent_turns + 1
        if fired is None and self.silent_turns >= self.no_output_turns:
            fired = NO_OUTPUT
        return fired


__all__ = ["DEFAULT_NO_OUTPUT_TURNS", "DEFAULT_REPEATS", "NO_OUTPUT", "NO_PROGRESS", "ProgressDetector"]
