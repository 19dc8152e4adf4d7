"""Record and replay: re-execute a committed rollout from its recorded model outputs.

`paddock replay ROLLOUT_ID --run DIR` reads the rollout's committed attempt and its steps from
the run's trajectory store, and has the node side (`nodeagent.agent.replay.reexecute`, handed in
by the CLI) run the same attempt pipeline (fresh sandbox, harness, diff, verifier) with a
`ReplayModel` in place of the model server: the model's answers are the recorded assistant
messages, in order. The tools really run again in a
fresh sandbox; their new observations are compared with the recorded ones, and the new verdict
with the recorded one. A replay that reaches a different verdict is a non-determinism (or a
changed sandbox, verifier or image) worth reading.

Needs the run directory (trajectories, `tasks.json`, `run.json`) and the image store holding the
run's image. Must not import: zmq, nodeagent.
"""
from __future__ import annotations

import json
import logging
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

from controller.analysis.query import QueryError, connect
from controller.ondisk import taskblobs
from layers.builtin import default_store_root
from layers.store import ImageStore

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


def load(run_dir: str | Path, rollout_id: str) -> Recorded:
    try:
        con = connect(run_dir)
    except QueryError as exc:
        raise ReplayError(str(exc)) from None
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
    return taskblobs.inflate(tasks[task_id])


def _image(run_dir: Path, digest: str, image_store: str | None) -> Path:
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


def replay(run_dir: str | Path, rollout_id: str, reexecute: Callable[..., tuple[Any, list[dict]]],
           runtime=None, image_store: str | None = None) -> ReplayReport:
    """Re-run one committed rollout from its record; compare observations and verdict.

    `reexecute` is the node side (`nodeagent.agent.replay.reexecute`, passed in by the CLI):
    it takes the task, the image and the record's fields and returns (result, new step rows)."""
    run_dir = Path(run_dir)
    rec = load(run_dir, rollout_id)
    task = _task(run_dir, rec.task_id)
    image = _image(run_dir, rec.image_digest, image_store)
    result, replayed = reexecute(task, image, rollout_id=rec.rollout_id, attempt=rec.attempt, seed=rec.seed,
                                 policy_version=rec.policy_version, steps=rec.steps, runtime=runtime)
    recorded_obs = [r.get("observation") for r in rec.steps]
    new_obs = [r.get("observation") for r in replayed]
    diverged = [i for i, (a, b) in enumerate(zip(recorded_obs, new_obs)) if a != b]
    diverged += list(range(min(len(recorded_obs), len(new_obs)), max(len(recorded_obs), len(new_obs))))
    return ReplayReport(rec.rollout_id, rec.outcome, rec.reward, result.outcome, result.reward,
                        len(rec.steps), len(replayed), sum(a == b for a, b in zip(recorded_obs, new_obs)),
                        diverged, result.infra_reason)
