"""Re-execution of a recorded rollout on this node: the attempt pipeline with the model's
answers taken from the record.

`ReplayModel` is a `nodeagent.harness.model.Model` that serves a recorded rollout's assistant
messages in order (and refuses past the last one: the harness asked for more than was
recorded, so the replay diverged). `reexecute(...)` runs `nodeagent.agent.attempt.run_attempt`
with it in a scratch run directory, so the tools really run again in a fresh sandbox and the
verifier grades again; it returns the new result and the new step rows. Reading the record
and comparing belong to the analyst's side (`controller.analysis.replay`), which hands the
record's plain fields here.

Must not import: zmq, controller.analysis, controller.store, controller.broker.
"""
from __future__ import annotations

import json
import shutil
import tempfile
from pathlib import Path
from typing import Any

import pyarrow.parquet as pq

from nodeagent.agent.attempt import Attempt, AttemptResult, run_attempt
from nodeagent.harness.model import ModelError
from nodeagent.sandbox.runtime import SandboxRuntime


def _calls(row: dict) -> list[dict]:
    """The tool calls of a recorded step, as OpenAI `tool_calls`."""
    raw = row.get("tool_args")
    if raw is None:
        return []
    args = json.loads(raw) if isinstance(raw, str) else raw
    if isinstance(args, list):     # the harness's record: [{"id", "name", "arguments"}]
        calls = args
    else:                          # one call recorded as its argument object
        calls = [{"id": "call_0", "name": row.get("tool_name"), "arguments": json.dumps(args)}]
    return [{"id": c.get("id") or f"call_{i}", "type": "function",
             "function": {"name": c.get("name"), "arguments": c.get("arguments")}} for i, c in enumerate(calls)]


class ReplayModel:
    """A `nodeagent.harness.model.Model` that answers with a recorded rollout's assistant messages
    (a conversation's `user` rows are the simulated user's: it says them again itself)."""

    def __init__(self, steps: list[dict]) -> None:
        self.steps = sorted((r for r in steps if r.get("role", "assistant") == "assistant"), key=lambda r: r["step"])
        self.served = 0

    def complete(self, payload: dict, timeout_s: float) -> dict:
        if self.served >= len(self.steps):
            raise ModelError(f"replay diverged: the harness asked for step {self.served} "
                             f"but only {len(self.steps)} were recorded")
        row = self.steps[self.served]
        self.served += 1
        message: dict[str, Any] = {"role": "assistant", "content": row.get("content")}
        calls = _calls(row)
        if calls:
            message["tool_calls"] = calls
        logprobs = json.loads(row["logprobs"]) if row.get("logprobs") else None
        return {"choices": [{"index": 0, "message": message, "logprobs": logprobs,
                             "finish_reason": "tool_calls" if calls else "stop"}],
                "usage": {"prompt_tokens": int(row.get("prompt_tokens") or 0),
                          "completion_tokens": int(row.get("completion_tokens") or 0)}}


def reexecute(task: dict, image: Path, *, rollout_id: str, attempt: int, seed: int, policy_version: int,
              steps: list[dict], runtime: SandboxRuntime | None = None) -> tuple[AttemptResult, list[dict]]:
    """Run the attempt again with the recorded model outputs; (its result, its new step rows)."""
    model = ReplayModel(steps)
    own_runtime = runtime is None
    runtime = runtime or SandboxRuntime().start()
    scratch = tempfile.mkdtemp(prefix="paddock-replay-")
    try:
        a = Attempt(run_id="replay", run_dir=scratch, rollout_id=rollout_id, attempt=attempt, token=0,
                    batch_id="replay", seed=seed, task=task, policy_version=policy_version,
                    endpoint=model, model=f"replay-of-{rollout_id}")   # type: ignore[arg-type]
        result = run_attempt(runtime, image, "replay", a)
        return result, _read_steps(Path(scratch), result.shards.get("steps"))
    finally:
        if own_runtime:
            runtime.close()
        shutil.rmtree(scratch, ignore_errors=True)


def _read_steps(scratch: Path, shard: str | None) -> list[dict]:
    if not shard:
        return []
    path = Path(shard) if Path(shard).is_absolute() else scratch / shard
    return sorted(pq.read_table(path).to_pylist(), key=lambda r: r["step"])
