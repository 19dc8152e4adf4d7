"""Record and replay: re-execute a committed rollout from its recorded model outputs.

`paddock replay ROLLOUT_ID --run DIR` reads the rollout's committed attempt and its steps from
the run's trajectory store, and runs the same attempt pipeline (`nodeagent.agent.attempt.run_attempt`:
fresh sandbox, harness, diff, verifier) with a `ReplayModel` in place of the model server: the
model's answers are the recorded assistant messages, in order. The tools really run again in a
fresh sandbox; their new observations are compared with the recorded ones, and the new verdict
with the recorded one. A replay that reaches a different verdict is a non-determinism (or a
changed sandbox, verifier or image) worth reading.

Needs the run directory (trajectories, `tasks.json`, `run.json`) and the image store holding the
run's image. Must not import zmq.
"""
from __future__ import annotations

import json
import logging
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

log = logging.getLogger(__name__)


class ReplayError(Exception):
    """The rollout cannot be replayed (not found, not committed, image missing)."""


@dataclass(frozen=True)
class Recorded:
    rollout_id: str
    attempt: int
    seed: int
    policy_version: int
    outcome: str
    reward: float | None
    task_id: str
    image_digest: str
    steps: list[dict]


@dataclass
class ReplayReport:
    rollout_id: str
    recorded_outcome: str
    recorded_reward: float | None
    replayed_outcome: str
    replayed_reward: float | None
    steps_recorded: int
    steps_replayed: int
    observations_same: int
    diverged_steps: list[int] = field(default_factory=list)
    infra_reason: str | None = None

    @property
    def same_verdict(self) -> bool:
        return (self.recorded_outcome, self.recorded_reward) == (self.replayed_outcome, self.replayed_reward)

    def line(self) -> str:
        verdict = "same verdict" if self.same_verdict else "DIFFERENT verdict"
        extra = f"; diverged at steps {self.diverged_steps}" if self.diverged_steps else ""
        infra = f"; infra: {self.infra_reason}" if self.infra_reason else ""
        return (f"replay {self.rollout_id}: recorded {self.recorded_outcome} reward {self.recorded_reward} -> "
                f"replayed {self.replayed_outcome} reward {self.replayed_reward}: {verdict}; observations "
                f"{self.observations_same}/{self.steps_recorded} identical{extra}{infra}")


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
    """A `nodeagent.harness.model.Model` that answers with a recorded rollout's assistant messages."""

    def __init__(self, steps: list[dict]) -> None:
        self.steps = sorted(steps, key=lambda r: r["step"])
        self.served = 0

    def complete(self, payload: dict, timeout_s: float) -> dict:
        from nodeagent.harness.model import ModelError
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


def load(run_dir: str | Path, rollout_id: str) -> Recorded:
    from controller.analysis.query import connect
    con = connect(run_dir)
    try:
        cur = con.execute("SELECT rollout_id, attempt, fencing_token, seed, policy_version, outcome, reward, "
                          "task_id, image_digest FROM rollouts WHERE rollout_id = ? "
                          "ORDER BY attempt DESC LIMIT 1", [rollout_id])
        row = cur.fetchone()
        if row is None:
            raise ReplayError(f"rollout {rollout_id!r} has no committed attempt in {run_dir}")
        rid, attempt, token, seed, version, outcome, reward, task_id, image = row
        cur = con.execute("SELECT * FROM steps WHERE rollout_id = ? AND attempt = ? AND fencing_token = ? "
                          "ORDER BY step", [rid, attempt, token])
        names = [d[0] for d in cur.description]
        steps = [dict(zip(names, r)) for r in cur.fetchall()]
    finally:
        con.close()
    return Recorded(rid, attempt, seed, version, outcome, reward, task_id, image, steps)


def _task(run_dir: Path, task_id: str) -> dict:
    try:
        tasks = json.loads((run_dir / "tasks.json").read_text())
    except (OSError, ValueError) as exc:
        raise ReplayError(f"cannot read the run's tasks ({run_dir / 'tasks.json'}): {exc}") from None
    if task_id not in tasks:
        raise ReplayError(f"task {task_id} is not in {run_dir / 'tasks.json'}")
    return tasks[task_id]


def _image(run_dir: Path, digest: str, image_store: str | None) -> Path:
    from layers.builtin import default_store_root
    from layers.store import ImageStore
    root = image_store
    if root is None:
        try:
            root = json.loads((run_dir / "run.json").read_text()).get("config", {}).get("image_store") or None
        except (OSError, ValueError):
            root = None
    store = ImageStore(root or default_store_root())
    if not store.has(digest):
        raise ReplayError(f"image {digest} is not in the image store {store.root}")
    return store.path_of(digest)


def replay(run_dir: str | Path, rollout_id: str, runtime=None, image_store: str | None = None) -> ReplayReport:
    """Re-run one committed rollout from its record; compare observations and verdict."""
    from nodeagent.agent.attempt import Attempt, run_attempt
    from nodeagent.sandbox.runtime import SandboxRuntime
    run_dir = Path(run_dir)
    rec = load(run_dir, rollout_id)
    task = _task(run_dir, rec.task_id)
    image = _image(run_dir, rec.image_digest, image_store)
    model = ReplayModel(rec.steps)
    own_runtime = runtime is None
    runtime = runtime or SandboxRuntime().start()
    scratch = tempfile.mkdtemp(prefix="paddock-replay-")
    try:
        attempt = Attempt(run_id="replay", run_dir=scratch, rollout_id=rec.rollout_id, attempt=rec.attempt,
                          token=0, batch_id="replay", seed=rec.seed, task=task, policy_version=rec.policy_version,
                          endpoint=model, model=f"replay-of-{rec.rollout_id}")   # type: ignore[arg-type]
        result = run_attempt(runtime, image, "replay", attempt)
        replayed = _read_steps(Path(scratch), result.shards.get("steps"))
    finally:
        if own_runtime:
            runtime.close()
        import shutil
        shutil.rmtree(scratch, ignore_errors=True)
    recorded_obs = [r.get("observation") for r in rec.steps]
    new_obs = [r.get("observation") for r in replayed]
    diverged = [i for i, (a, b) in enumerate(zip(recorded_obs, new_obs)) if a != b]
    diverged += list(range(min(len(recorded_obs), len(new_obs)), max(len(recorded_obs), len(new_obs))))
    return ReplayReport(rec.rollout_id, rec.outcome, rec.reward, result.outcome, result.reward,
                        len(rec.steps), len(replayed), sum(a == b for a, b in zip(recorded_obs, new_obs)),
                        diverged, result.infra_reason)


def _read_steps(scratch: Path, shard: str | None) -> list[dict]:
    if not shard:
        return []
    import pyarrow.parquet as pq
    path = Path(shard) if Path(shard).is_absolute() else scratch / shard
    return sorted(pq.read_table(path).to_pylist(), key=lambda r: r["step"])
