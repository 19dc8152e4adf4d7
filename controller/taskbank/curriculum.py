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
(broken), or when it dead-letters `max_infra_failures` times for reasons of its own (broken:
`states.TASK_FAULT_CODES`, read from the reason's code; a dead letter of the rollout's own
making never counts). Quarantine persists until `release`.

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
from collections import OrderedDict
from dataclasses import dataclass
from pathlib import Path
from typing import Iterable, Sequence

from controller.contracts.safeload import load_json
from controller.contracts.states import POLICY_OUTCOMES, InfraReason, as_infra_reason
from controller.taskbank.bands import CLASSES, BandSpec, classify

log = logging.getLogger(__name__)

SCORED = POLICY_OUTCOMES
# (version, band) pairs whose classes stay cached: each holds every task with a record (~0.5 KB
# a task: 300 MB at 600,000), and a run asks for its latest version, and rarely a second band
CLASS_CACHE_ENTRIES = 3

_SCHEMA = """
CREATE TABLE IF NOT EXISTS outcomes (
    task_id TEXT NOT NULL, policy_version INTEGER NOT NULL,
    passes INTEGER NOT NULL DEFAULT 0, fails INTEGER NOT NULL DEFAULT 0,
    PRIMARY KEY (task_id, policy_version)) WITHOUT ROWID;
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


def task_fault(reason: InfraReason | str) -> bool:
    """Is a dead letter's reason the task's (its code in `states.TASK_FAULT_CODES`): its
    content or limits (`task`), its set-up (`setup`, or a set-up past its deadline,
    `deadline_setup`), its image or sandbox (`sandbox_start`), or grading that fails without
    the agent too (`verifier`: the verifier scores a failure that reproduces only with the
    agent's changes as `fail`, see docs/verifier.md; or grading past its deadline,
    `deadline_verify`)? Everything else — `model_server`, `store`, `agent_crash`,
    `lease_expired`, the node's phases past their deadlines, an `unknown` reason — is the
    rollout's. A reason given as text only (a `results` item of an older controller) is
    parsed (`states.InfraReason.parse`).

    Cancelled work never reaches the curriculum: a cancelled rollout is never committed nor
    dead-lettered (its late result is rejected), and `record` takes only committed outcomes."""
    typed = as_infra_reason(reason)
    return typed is not None and typed.task_fault


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
        if isinstance(task_ids, Sequence) and not isinstance(task_ids, (list, tuple, str)):
            self.task_ids = task_ids   # a lazy view (a task index's ids): never listed whole
            self._ours = task_ids.__contains__
        else:
            self.task_ids = tuple(sorted(set(task_ids)))
            self._ours = frozenset(self.task_ids).__contains__
        if not len(self.task_ids):
            raise ValueError("curriculum: no tasks")
        # (version, band) -> (weighted (passes, fails) and class of each task with a record):
        # kept up to date by record() and quarantine, so a sample reads no table
        self._classes: OrderedDict[tuple, _Classes] = OrderedDict()
        self._quarantine_cache: frozenset[str] | None = None
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._clock = clock
        self._lock = threading.RLock()  # re-entered: record() updates the caches, which may read the quarantine
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
        if outcome in ("infra_error", "judge_failed"):     # masked, never a verdict
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
            self._count_in_caches(task_id, int(policy_version), passed)
        return True

    def _count_in_caches(self, task_id: str, version: int, passed: bool) -> None:
        """One recorded outcome, added to every cached (version, band) it counts for."""
        if not self._ours(task_id):
            return
        q = task_id in self._quarantined_ids()
        for (target, band), entry in self._classes.items():
            if version > target:
                continue
            pf = entry.acc.setdefault(task_id, [0.0, 0.0])
            pf[0 if passed else 1] += self.cfg.decay ** (target - version)
            entry.set(task_id, self._class_of(pf, band, q))

    def record_reference(self, task_id: str, passed: bool, detail: str = "") -> None:
        """Result of grading the task's reference solution; a failure quarantines the task."""
        if not passed:
            with self._lock, self._db:
                self._quarantine(task_id, "broken: reference solution fails"
                                 + (f": {detail}" if detail else ""))

    def record_infra_failure(self, task_id: str, reason: InfraReason | str) -> None:
        """A rollout of this task dead-lettered; too many make the task `broken` — when the
        reason is the task's (`task_fault`, by its code). A dead letter of the rollout's own
        making (its model server, its artifacts, a node agent or lease lost under it) never
        counts against the task: a policy must not be able to quarantine a task."""
        why = reason if isinstance(reason, InfraReason) else InfraReason.parse(str(reason))
        if not why.task_fault:
            log.info("dead letter of task_id=%s not held against the task (%s): %s", task_id,
                     why.code, why.text[:200])
            return
        with self._lock, self._db:
            n = self._db.execute(
                "INSERT INTO infra VALUES (?, 1, ?) ON CONFLICT DO UPDATE SET "
                "failures = failures + 1, last_reason = excluded.last_reason RETURNING failures",
                (task_id, why.text)).fetchone()[0]
            if n >= self.cfg.max_infra_failures:
                self._quarantine(task_id, f"broken: {n} rollouts dead-lettered; last: {why.text}")

    def import_validation(self, path: str | Path) -> int:
        """Quarantine the tasks a `paddock tasks validate` file (`quarantine.json`, keyed by
        task id or by name with a `task_id`) lists as failing; return how many are ours."""
        try:
            data = load_json(path)
        except FileNotFoundError:
            return 0
        except (OSError, ValueError) as exc:
            raise CurriculumError(f"{path}: cannot read validation results: {exc}") from None
        n = 0
        for key, entry in sorted(data.items()):
            task_id = entry.get("task_id", key) if isinstance(entry, dict) else key
            if self._ours(task_id):
                reasons = entry.get("reasons", []) if isinstance(entry, dict) else []
                self.quarantine(task_id, "broken: validation: " + ("; ".join(map(str, reasons))
                                                                    or "failed"))
                n += 1
        return n

    def quarantine(self, task_id: str, reason: str) -> None:
        with self._lock, self._db:
            self._quarantine(task_id, reason)

    def release(self, task_id: str) -> None:
        self._classes.clear()
        self._quarantine_cache = None
        with self._lock, self._db:
            self._db.execute("DELETE FROM quarantine WHERE task_id = ?", (task_id,))
            self._db.execute("DELETE FROM solutions WHERE task_id = ?", (task_id,))
            self._db.execute("DELETE FROM infra WHERE task_id = ?", (task_id,))

    def _quarantine(self, task_id: str, reason: str) -> None:
        cur = self._db.execute("INSERT OR IGNORE INTO quarantine VALUES (?, ?, ?)",
                               (task_id, reason, self._clock()))
        if cur.rowcount:
            log.warning("quarantined task_id=%s: %s", task_id, reason)
            self._quarantine_cache = None
            if self._ours(task_id):
                for entry in self._classes.values():
                    entry.set(task_id, "quarantined")

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
        this request's band (low, high) instead of the config's). Reads only the tasks with a
        record (their classes are cached per version and band, and kept up to date as outcomes
        come in): a task never run is explored, found by its position among all the tasks."""
        if n < 0:
            raise ValueError("curriculum: n must be >= 0")
        entry = self._entry(version, within)
        band = entry.band.items
        explore = _ExplorePool(self.task_ids, entry)
        n_explore = round(n * self.cfg.explore_share) if len(explore) else 0
        if not band:
            n_explore = n if len(explore) else 0
        picks = _cycle(explore, n_explore, rng) + _cycle(band, n - n_explore, rng)
        if len(picks) < n:
            picks += _cycle(self._nearest_to_band(entry, within), n - len(picks), rng)
        rng.shuffle(picks)
        return picks

    def _class_of(self, pf: list[float], band: tuple[float, float] | None, quarantined: bool) -> str:
        cfg = self._cfg_for(band)
        a, b = cfg.prior_alpha + pf[0], cfg.prior_beta + pf[1]
        return classify(a / (a + b), pf[0] + pf[1], cfg.bands, quarantined)

    def _quarantined_ids(self) -> frozenset[str]:
        if self._quarantine_cache is None:
            self._quarantine_cache = frozenset(self.quarantined())
        return self._quarantine_cache

    def _touched_classes(self, version: int, band: tuple[float, float] | None) -> dict[str, str]:
        """The class of each of our tasks with a record (an outcome up to `version`, or a
        quarantine) for `version` and `band`; every other task is `explore` (no evidence)."""
        return self._entry(version, band).classes

    def _entry(self, version: int, band: tuple[float, float] | None) -> "_Classes":
        """The cached classes of (`version`, `band`), built from the outcomes table on a miss."""
        key = (int(version), None if band is None else (float(band[0]), float(band[1])))
        hit = self._classes.get(key)
        if hit is not None:
            self._classes.move_to_end(key)
            return hit
        cfg = self._cfg_for(band)  # validates the band
        with self._lock:
            # the decayed sums per task in SQLite (each version's weight from a temporary
            # table): one row per task, added in the primary key's order as before
            versions = [v for (v,) in self._db.execute(
                "SELECT DISTINCT policy_version FROM outcomes WHERE policy_version <= ?", (int(version),))]
            self._db.execute("CREATE TEMP TABLE IF NOT EXISTS decay_weight (v INTEGER PRIMARY KEY, w REAL)")
            self._db.execute("DELETE FROM decay_weight")
            self._db.executemany("INSERT INTO decay_weight VALUES (?, ?)",
                                 [(v, self.cfg.decay ** (version - v)) for v in versions])
            rows = self._db.execute(
                "SELECT o.task_id, sum(w.w * o.passes), sum(w.w * o.fails) FROM outcomes o "
                "CROSS JOIN decay_weight w ON w.v = o.policy_version GROUP BY o.task_id").fetchall()
        ours, spec, q = self._ours, cfg.bands, self._quarantined_ids()
        present = getattr(self.task_ids, "present", None)   # a task index: one query for all
        if present is not None:
            ours = present([r[0] for r in rows]).__contains__
        acc: dict[str, list[float]] = {}
        classes: dict[str, str] = {}
        for task_id, p, f in rows:
            if ours(task_id):
                acc[task_id] = [p, f]
                classes[task_id] = classify((cfg.prior_alpha + p) / (cfg.prior_alpha + cfg.prior_beta + p + f),
                                            p + f, spec, task_id in q)
        classes.update((t, "quarantined") for t in q if ours(t))
        entry = self._classes[key] = _Classes(acc, classes)
        while len(self._classes) > CLASS_CACHE_ENTRIES:
            self._classes.popitem(last=False)
        return entry

    def _nearest_to_band(self, entry: "_Classes", band: tuple[float, float] | None = None) -> list[str]:
        """With no task in the band or unexplored (every task has a record): the tasks whose
        estimate lies nearest to the band."""
        live = sorted(t for t, c in entry.classes.items() if c != "quarantined")
        if not live:
            raise CurriculumError(f"curriculum: all {len(self.task_ids)} tasks are quarantined; "
                                  f"see `quarantined()`")
        acc = entry.acc
        lo, hi = (self.cfg.band_low, self.cfg.band_high) if band is None else band
        cfg = self.cfg

        def mean(t: str) -> float:
            p, f = acc.get(t, (0.0, 0.0))
            return (cfg.prior_alpha + p) / (cfg.prior_alpha + cfg.prior_beta + p + f)
        dist = {t: max(lo - mean(t), mean(t) - hi, 0.0) for t in live}
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


class _Members:
    """A set of task ids that can be sampled by position: a list and each id's index in it.
    Adding appends, removing moves the last id into the hole: O(1) either way."""

    def __init__(self, items: Iterable[str]):
        self.items = list(items)
        self.pos = {t: i for i, t in enumerate(self.items)}

    def __len__(self) -> int:
        return len(self.items)

    def add(self, task_id: str) -> None:
        if task_id not in self.pos:
            self.pos[task_id] = len(self.items)
            self.items.append(task_id)

    def discard(self, task_id: str) -> None:
        i = self.pos.pop(task_id, None)
        if i is None:
            return
        last = self.items.pop()
        if i < len(self.items):
            self.items[i] = last
            self.pos[last] = i


class _Classes:
    """The curriculum's cache for one (version, band): each task with a record, its weighted
    (passes, fails) and its class, and what a sample reads kept up to date with every change
    (`set`): the band's members, how many tasks are out of the explore pool, and, once the
    explore pool had to be listed (it is a small share of the tasks), its members. A sample then
    costs the same however many tasks have a record; the band is listed in task id order when
    the cache is built and changes in place afterwards (a seeded sample is a function of the
    outcomes recorded, in their order)."""

    def __init__(self, acc: dict[str, list[float]], classes: dict[str, str]):
        self.acc, self.classes = acc, classes
        self.band = _Members(sorted(t for t, c in classes.items() if c == "band"))
        self.not_explore = sum(1 for c in classes.values() if c != "explore")
        self.explore: _Members | None = None

    def set(self, task_id: str, new: str) -> None:
        old = self.classes.get(task_id)     # None: no record yet (explored)
        self.classes[task_id] = new
        if old == new:
            return
        if old == "band":
            self.band.discard(task_id)
        elif new == "band":
            self.band.add(task_id)
        was, now = old in (None, "explore"), new == "explore"
        if was != now:
            self.not_explore += -1 if now else 1
            if self.explore is not None:
                (self.explore.add if now else self.explore.discard)(task_id)


class _ExplorePool:
    """The tasks to explore: every task of `universe` (a sequence) whose class in the cache
    entry is `explore`, or that has no record. Not listed while it is most of the tasks (drawn by
    position among them instead); listed once, then kept in the entry, when it is not."""

    def __init__(self, universe: Sequence[str], entry: _Classes):
        self.universe, self.entry = universe, entry
        self._n = len(universe) - entry.not_explore

    def __len__(self) -> int:
        return self._n

    def wanted(self, task_id: str) -> bool:
        return self.entry.classes.get(task_id, "explore") == "explore"

    def listed(self) -> list[str]:
        if self.entry.explore is None:
            self.entry.explore = _Members(t for t in self.universe if self.wanted(t))
        return self.entry.explore.items


def _cycle(pool, k: int, rng: random.Random) -> list[str]:
    """`k` items from `pool` (a list, or an `_ExplorePool`): whole seeded shuffles of it, then
    part of one more. A large explore pool is never listed: the last part is drawn by position
    among all the tasks (distinct, uniform, seeded), skipping the tasks that are not in it."""
    n = len(pool)
    if k <= 0 or not n:
        return []
    out: list[str] = []
    while k - len(out) >= n:
        order = list(pool if isinstance(pool, list) else pool.listed())
        rng.shuffle(order)
        out.extend(order)
    r = k - len(out)
    if not r:
        return out
    if isinstance(pool, list):
        return out + rng.sample(pool, r)
    if 4 * n < len(pool.universe):  # mostly excluded: list it (once: the entry keeps it)
        return out + rng.sample(pool.listed(), r)
    universe, seen = pool.universe, set()
    many = getattr(universe, "many", None) or (lambda positions: [universe[i] for i in positions])
    while len(seen) < r:
        for t in many(rng.sample(range(len(universe)), min(len(universe), 2 * (r - len(seen))))):
            if t not in seen and pool.wanted(t):
                seen.add(t)
                out.append(t)
                if len(seen) == r:
                    break
    return out
