"""The band classes: the one definition of which tasks are in the learning band.

A task's estimate for a target policy version v pools every version u <= v, its pass and
fail counts weighted by `decay ** (v - u)`; the estimate is the mean of
Beta(prior_alpha + weighted passes, prior_beta + weighted fails) and its `evidence` is the
weighted count. The classes, checked in this order:

- `quarantined`: set aside (flaky, broken reference, too many infra failures);
- `explore`: little data: evidence < min_evidence, so no rate is claimed yet (the sampler
  spends its exploration share on these);
- `too_hard`: estimate below band_low;
- `too_easy`: estimate above band_high;
- `band`: band_low <= estimate <= band_high (the sampler serves these).

The curriculum (controller/taskbank/curriculum.py), the local run's console line, `paddock
tasks curriculum` and `paddock report` (text, JSON and HTML) all classify with this module, so
the same outcomes under the same `BandSpec` give the same numbers everywhere.

Pure: standard library only. Must not import: controller.taskbank.curriculum, duckdb, zmq.
"""
from __future__ import annotations

from dataclasses import dataclass, fields
from typing import Mapping

CLASSES = ("band", "explore", "too_easy", "too_hard", "quarantined")
# The order a report reads them in: below the band, in it, above it, then the unclassified.
READING_ORDER = ("too_hard", "band", "too_easy", "explore", "quarantined")


@dataclass(frozen=True)
class BandSpec:
    """The estimator and the band: everything that decides a task's class."""
    band_low: float = 0.2
    band_high: float = 0.8
    min_evidence: float = 3.0
    decay: float = 0.5
    prior_alpha: float = 1.0
    prior_beta: float = 1.0

    def __post_init__(self) -> None:
        if not 0.0 <= self.band_low < self.band_high <= 1.0:
            raise ValueError(f"curriculum: need 0 <= band_low < band_high <= 1, got "
                             f"{self.band_low!r}, {self.band_high!r}")
        if not 0.0 < self.decay <= 1.0:
            raise ValueError(f"curriculum: 'decay' must be in (0, 1], got {self.decay!r}")
        if self.prior_alpha <= 0 or self.prior_beta <= 0 or self.min_evidence < 0:
            raise ValueError("curriculum: priors must be > 0 and 'min_evidence' >= 0")

    @classmethod
    def from_mapping(cls, data: Mapping) -> "BandSpec":
        """The spec from a config mapping (e.g. a run's recorded curriculum config); keys
        that are not estimator fields (explore_share, ...) are ignored."""
        names = {f.name for f in fields(cls)}
        return cls(**{k: float(v) for k, v in data.items() if k in names})


def posterior_mean(weighted_pass: float, weighted_fail: float, spec: BandSpec) -> float:
    a, b = spec.prior_alpha + weighted_pass, spec.prior_beta + weighted_fail
    return a / (a + b)


def classify(mean: float, evidence: float, spec: BandSpec, quarantined: bool = False) -> str:
    """The class of one task's estimate (see the module docstring)."""
    if quarantined:
        return "quarantined"
    if evidence < spec.min_evidence:
        return "explore"
    if mean < spec.band_low:
        return "too_hard"
    if mean > spec.band_high:
        return "too_easy"
    return "band"


def explain(name: str, spec: BandSpec) -> str:
    """One sentence saying what a class means under `spec`."""
    lo, hi = f"{spec.band_low:g}", f"{spec.band_high:g}"
    return {
        "band": f"estimated pass rate within {lo}-{hi}: the sampler serves these",
        "too_hard": f"estimated pass rate below {lo}",
        "too_easy": f"estimated pass rate above {hi}",
        "explore": (f"little data: fewer than {spec.min_evidence:g} weighted rollouts (each "
                    f"earlier version counts {spec.decay:g}x the next), so no rate is claimed "
                    f"yet; the sampler explores these"),
        "quarantined": "set aside by the curriculum (flaky, broken, or dead-lettered)",
    }[name]


def format_counts(counts: Mapping[str, int], skip_zero: bool = True) -> str:
    """`band 41, explore 1, too_hard 5` in CLASSES order (the console's and the CLI's form)."""
    return ", ".join(f"{k} {counts.get(k, 0)}" for k in CLASSES
                     if counts.get(k, 0) or not skip_zero)


def evidence_sql(source: str = "rollouts") -> str:
    """DuckDB SQL giving (policy_version, task_id, weighted_passes, weighted_fails) for every
    version that has a scored rollout and every task seen at or before it; one parameter,
    `$decay`. `source` is a relation with task_id, policy_version and outcome (infra errors
    are masked, every other non-pass is a fail). Classify the rows with `posterior_mean` and
    `classify`: the classes are decided in one place, here in Python."""
    return (
        f"WITH per AS (SELECT task_id, policy_version AS u, "
        f"  count(*) FILTER (WHERE outcome = 'pass') AS p, "
        f"  count(*) FILTER (WHERE outcome <> 'pass') AS f "
        f"  FROM {source} WHERE outcome <> 'infra_error' GROUP BY ALL), "
        "vs AS (SELECT DISTINCT u AS v FROM per) "
        "SELECT v, task_id, sum(p * pow($decay, v - u)) AS wp, sum(f * pow($decay, v - u)) AS wf "
        "FROM vs JOIN per ON u <= v GROUP BY ALL ORDER BY v, task_id")
