"""Curriculum: per-task pass-rate estimates by policy version, and a sampler that keeps the
farm in the learning band.

Estimate. For a task and a target policy version v, each earlier-or-equal version u
contributes its pass and fail counts weighted by `decay ** (v - u)`; the estimate is the mean
of Beta(prior_alpha + weighted passes, prior_beta + weighted fails). Its `evidence` is the
weighted count. Recent versions dominate, so a task drifts out of the band as the policy
learns it (always solved) or as it turns out never solved.

Classes (per target version): `quarantined`; `explore` (evidence < min_evidence: little
data); `band` (band_low <= mean <= band_high); `too_easy`; `too_hard`. They are defined once,
in controller/taskbank/bands.py, which the report uses too.

Sampler. `sample(n, rng, version)` serves round(n * explore_share) rollouts from explore tasks
and the rest from band tasks, each pool visited in a seeded shuffled cycle so tasks are
spread evenly. An empty pool gives its share to the other; if both are empty the tasks
nearest to the band are served (the farm never stalls). Deterministic for a seeded `rng`.

Quarantine. A task is quarantined, with the reason, when the same solution (a hash of its
final diff/answer) got both a pass and a fail (flaky), when its reference solution fails
(broken), or when it dead-letters `max_infra_failures` times (broken). Quarantine persists
until `release`.

Persisted in SQLite (`curriculum.sqlite` in the task-bank dir); recording is idempotent per
rollout id. Must not import zmq.
"""
from __future__ import annotations

import dataclasses
import logging
import random
import sqlite3
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Iterable, Sequence

from controller.contracts.safeload import load_json
from controller.contracts.states import POLICY_OUTCOMES
from controller.taskbank.bands import CLASSES, BandSpec, classify

log = logging.getLogger(__name__)

SCORED = POLICY_OUTCOMES

_SCHEMA = """
CREATE TABLE IF NOT EXISTS outcomes (
    task_id TEXT NOT NULL, policy_version INTEGER NOT NULL,
    passes INTEGER NOT NULL DEFAULT 0, fails INTEGER NOT NULL DEFAULT 0,
    PRIMARY KEY (task_id, policy_version));
CREATE TABLE IF NOT EXISTS solutions (
    task_id TEXT NOT NULL, solution_hash TEXT NOT NULL,
    passes INTEGER NOT NULL DEFAULT 0, fails INTEGER NOT NULL DEFAULT 0,
    PRIMARY KEY (task_id, solution_hash));
CREATE TABLE IF NOT EXISTS infra (
    task_id TEXT PRIMARY KEY, failures INTEGER NOT NULL DEFAULT 0, last_reason TEXT);
CREATE TABLE IF NOT EXISTS quarantine (
    task_id TEXT PRIMARY KEY, reason TEXT NOT NULL, since REAL NOT NULL);
CREATE TABLE IF NOT EXISTS recorded (rollout_id TEXT PRIMARY KEY);
"""


class CurriculumError(RuntimeError):
    """The curriculum cannot serve: no task is left outside quarantine."""


@dataclass(frozen=True)
class CurriculumConfig:
    band_low: float = 0.2
    band_high: float = 0.8
    explore_share: float = 0.2
    min_evidence: float = 3.0
    decay: float = 0.5
    prior_alpha: float = 1.0
    prior_beta: float = 1.0
    max_infra_failures: int = 3

    def __post_init__(self) -> None:
        self.bands   # validates the band and the estimator's fields
        if not 0.0 <= self.explore_share <= 1.0:
            raise ValueError(f"curriculum: 'explore_share' must be in [0, 1], got {self.explore_share!r}")
        if self.max_infra_failures < 1:
            raise ValueError("curriculum: 'max_infra_failures' must be >= 1")

    @property
    def bands(self) -> BandSpec:
        """The fields that decide a task's class (controller/taskbank/bands.py)."""
        return BandSpec(self.band_low, self.band_high, self.min_evidence, self.decay,
                        self.prior_alpha, self.prior_beta)


@dataclass(frozen=True)
class Estimate:
    task_id: str
    mean: float
    alpha: float
    beta: float
    evidence: float


class Curriculum:
    """Pass-rate estimates and the band sampler over a fixed list of task ids."""

    def __init__(self, path: str | Path, task_ids: Iterable[str],
                 cfg: CurriculumConfig | None = None, clock=time.time):
        self.cfg = cfg or CurriculumConfig()
        self.task_ids = tuple(sorted(set(task_ids)))
        if not self.task_ids:
            raise ValueError("curriculum: no tasks")
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._clock = clock
        self._lock = threading.Lock()
        self._db = sqlite3.connect(self.path, isolation_level=None, check_same_thread=False)
        self._db.execute("PRAGMA journal_mode=WAL")
        # estimates, not a ledger: no fsync per recorded outcome (the controller records one
        # per commit); a crash loses at most the last few, which only weakens the evidence
        self._db.execute("PRAGMA synchronous=NORMAL")
        self._db.executescript(_SCHEMA)

    def close(self) -> None:
        self._db.close()

    def __enter__(self) -> "Curriculum":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    # -- recording --------------------------------------------------------------------------

    def record(self, task_id: str, policy_version: int, outcome: str,
               solution_hash: str | None = None, rollout_id: str | None = None) -> bool:
        """Count one committed outcome; False if `rollout_id` was already recorded.

        `infra_error` never counts as a verdict (it is masked, never scored).
        """
        if outcome == "infra_error":
            return False
        if outcome not in SCORED:
            raise ValueError(f"curriculum: outcome {outcome!r} is not one of {SCORED + ('infra_error',)}")
        passed = outcome == "pass"
        with self._lock, self._db:
            self._db.execute("BEGIN IMMEDIATE")
            if rollout_id is not None:
                cur = self._db.execute("INSERT OR IGNORE INTO recorded VALUES (?)", (rollout_id,))
                if cur.rowcount == 0:
                    return False
            self._db.execute(
                "INSERT INTO outcomes VALUES (?, ?, ?, ?) ON CONFLICT DO UPDATE SET "
                "passes = passes + excluded.passes, fails = fails + excluded.fails",
                (task_id, int(policy_version), int(passed), int(not passed)))
            if solution_hash and outcome in ("pass", "fail"):
                p, f = self._db.execute(
                    "INSERT INTO solutions VALUES (?, ?, ?, ?) ON CONFLICT DO UPDATE SET "
                    "passes = passes + excluded.passes, fails = fails + excluded.fails "
                    "RETURNING passes, fails",
                    (task_id, solution_hash, int(passed), int(not passed))).fetchone()
                if p and f:
                    self._quarantine(task_id, f"flaky: solution {solution_hash[:12]} got {p} "
                                              f"pass and {f} fail verdicts")
        return True

    def record_reference(self, task_id: str, passed: bool, detail: str = "") -> None:
        """Result of grading the task's reference solution; a failure quarantines the task."""
        if not passed:
            with self._lock, self._db:
                self._quarantine(task_id, "broken: reference solution fails"
                                 + (f": {detail}" if detail else ""))

    def record_infra_failure(self, task_id: str, reason: str) -> None:
        """A rollout of this task dead-lettered; too many make the task `broken`."""
        with self._lock, self._db:
            n = self._db.execute(
                "INSERT INTO infra VALUES (?, 1, ?) ON CONFLICT DO UPDATE SET "
                "failures = failures + 1, last_reason = excluded.last_reason RETURNING failures",
                (task_id, reason)).fetchone()[0]
            if n >= self.cfg.max_infra_failures:
                self._quarantine(task_id, f"broken: {n} rollouts dead-lettered; last: {reason}")

    def import_validation(self, path: str | Path) -> int:
        """Quarantine the tasks a `paddock tasks validate` file (`quarantine.json`, keyed by
        task id or by name with a `task_id`) lists as failing; return how many are ours."""
        try:
            data = load_json(path)
        except FileNotFoundError:
            return 0
        except (OSError, ValueError) as exc:
            raise CurriculumError(f"{path}: cannot read validation results: {exc}") from None
        ours = set(self.task_ids)
        n = 0
        for key, entry in sorted(data.items()):
            task_id = entry.get("task_id", key) if isinstance(entry, dict) else key
            if task_id in ours:
                reasons = entry.get("reasons", []) if isinstance(entry, dict) else []
                self.quarantine(task_id, "broken: validation: " + ("; ".join(map(str, reasons))
                                                                    or "failed"))
                n += 1
        return n

    def quarantine(self, task_id: str, reason: str) -> None:
        with self._lock, self._db:
            self._quarantine(task_id, reason)

    def release(self, task_id: str) -> None:
        with self._lock, self._db:
            self._db.execute("DELETE FROM quarantine WHERE task_id = ?", (task_id,))
            self._db.execute("DELETE FROM solutions WHERE task_id = ?", (task_id,))
            self._db.execute("DELETE FROM infra WHERE task_id = ?", (task_id,))

    def _quarantine(self, task_id: str, reason: str) -> None:
        cur = self._db.execute("INSERT OR IGNORE INTO quarantine VALUES (?, ?, ?)",
                               (task_id, reason, self._clock()))
        if cur.rowcount:
            log.warning("quarantined task_id=%s: %s", task_id, reason)

    # -- estimates --------------------------------------------------------------------------

    def quarantined(self) -> dict[str, str]:
        with self._lock:
            return dict(self._db.execute("SELECT task_id, reason FROM quarantine").fetchall())

    def estimates(self, version: int) -> dict[str, Estimate]:
        """Decayed Beta posterior per task for target policy `version`."""
        cfg = self.cfg
        with self._lock:
            rows = self._db.execute(
                "SELECT task_id, policy_version, passes, fails FROM outcomes "
                "WHERE policy_version <= ?", (int(version),)).fetchall()
        acc = {t: [0.0, 0.0] for t in self.task_ids}
        for task_id, v, p, f in rows:
            if task_id in acc:
                w = cfg.decay ** (version - v)
                acc[task_id][0] += w * p
                acc[task_id][1] += w * f
        out = {}
        for t, (p, f) in acc.items():
            a, b = cfg.prior_alpha + p, cfg.prior_beta + f
            out[t] = Estimate(t, a / (a + b), a, b, p + f)
        return out

    def _cfg_for(self, band: tuple[float, float] | None) -> CurriculumConfig:
        """The config, with the band of one request if given (validated like the config's)."""
        if band is None:
            return self.cfg
        return dataclasses.replace(self.cfg, band_low=float(band[0]), band_high=float(band[1]))

    def classify(self, version: int, band: tuple[float, float] | None = None) -> dict[str, str]:
        spec, q = self._cfg_for(band).bands, self.quarantined()
        return {t: classify(e.mean, e.evidence, spec, t in q)
                for t, e in self.estimates(version).items()}

    # -- sampling ---------------------------------------------------------------------------

    def sample(self, n: int, rng: random.Random, version: int,
               within: tuple[float, float] | None = None) -> list[str]:
        """`n` task ids for policy `version`: band tasks plus an exploration share (`within`:
        this request's band (low, high) instead of the config's)."""
        if n < 0:
            raise ValueError("curriculum: n must be >= 0")
        classes = self.classify(version, within)
        band = [t for t in self.task_ids if classes[t] == "band"]
        explore = [t for t in self.task_ids if classes[t] == "explore"]
        n_explore = round(n * self.cfg.explore_share) if explore else 0
        if not band:
            n_explore = n if explore else 0
        picks = _cycle(explore, n_explore, rng) + _cycle(band, n - n_explore, rng)
        if len(picks) < n:
            picks += _cycle(self._nearest_to_band(version, classes, within), n - len(picks), rng)
        rng.shuffle(picks)
        return picks

    def _nearest_to_band(self, version: int, classes: dict[str, str],
                         band: tuple[float, float] | None = None) -> list[str]:
        live = [t for t in self.task_ids if classes[t] != "quarantined"]
        if not live:
            raise CurriculumError(f"curriculum: all {len(self.task_ids)} tasks are quarantined; "
                                  f"see `quarantined()`")
        est = self.estimates(version)
        lo, hi = (self.cfg.band_low, self.cfg.band_high) if band is None else band
        dist = {t: max(lo - est[t].mean, est[t].mean - hi, 0.0) for t in live}
        best = min(dist.values())
        return [t for t in live if dist[t] - best < 0.05]

    def latest_version(self) -> int:
        """The newest policy version with a recorded outcome of one of our tasks (0 if none)."""
        ours = set(self.task_ids)
        with self._lock:
            rows = self._db.execute(
                "SELECT task_id, max(policy_version) FROM outcomes GROUP BY task_id").fetchall()
        return max((v for t, v in rows if t in ours), default=0)

    def occupancy(self, version: int) -> dict[str, int]:
        """How many tasks sit in each class for `version`."""
        counts = dict.fromkeys(CLASSES, 0)
        for c in self.classify(version).values():
            counts[c] += 1
        return counts


def _cycle(pool: Sequence[str], k: int, rng: random.Random) -> list[str]:
    """`k` items from `pool`: whole seeded shuffles of it, then part of one more."""
    if k <= 0 or not pool:
        return []
    out: list[str] = []
    while len(out) < k:
        order = list(pool)
        rng.shuffle(order)
        out.extend(order[:k - len(out)])
    return out
