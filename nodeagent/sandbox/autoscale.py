"""The warm-pool autoscaler, sans-I/O: per sandbox spec key, how many ready sandboxes to keep.

`Autoscaler(config, clock)` is told of lease arrivals (`arrival(key, cost)`) and of measured
create latencies (`created(key, seconds)`); `plan(capacity)` returns the target of every key it
knows. It starts no thread and touches no sandbox: `nodeagent.sandbox.warmpool` applies the plan.

Per key:
- Forecast: an exponentially decayed event rate over the arrivals, `rate` (per second; half-life
  `half_life_s`), and a decayed peak of the arrivals that came within one refill window of each
  other (`burst_floor_s`, or one create if longer), `burst` (leases come in batches: a batch of 4 in the same millisecond needs 4 ready
  sandboxes, whatever the mean rate).
- Raw target: enough for the arrivals expected while one sandbox is made, Poisson-style:
  `ceil(rate * L + safety * sqrt(rate * L))` with `L` the key's measured create latency (an EWMA,
  `default_create_s` until measured), and at least `ceil(burst - 0.5)`; capped at `max_per_spec`.
- Scale up at once. Scale down only to the highest raw target of the last `downscale_window_s`
  (the Kubernetes HPA's downscale stabilisation), and only once that lies a full `dead_band`
  below the current target (hysteresis: a forecast wavering around a boundary does not flap).
- A key not leased for `idle_after_s` drops to 0 and is forgotten (its pool is stopped).

`plan(capacity)` then bounds the stabilised targets by the node's `Capacity`: at most
`sandboxes` pooled sandboxes in all, and the pool's memory and disk (each key's per-sandbox
`Cost`) within its budgets; the busiest keys (by rate) are served first. The bound is applied
after the stabilisation, so a budget that shrinks takes effect at once.

Imports only the standard library. Must not import: nodeagent.sandbox.runtime, threading, os.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Callable, Hashable


@dataclass(frozen=True)
class ScaleConfig:
    half_life_s: float = 30.0          # of the arrival-rate forecast
    safety: float = 1.0                # standard deviations of Poisson demand kept ready
    default_create_s: float = 0.05     # create latency assumed until one is measured
    burst_floor_s: float = 0.05        # arrivals within this (or one create) of each other: a burst
    downscale_window_s: float = 60.0   # stabilisation: scale down to the window's highest need
    dead_band: float = 1.0             # scale down only when the need is this far below target
    idle_after_s: float = 300.0        # not leased this long: target 0, the key forgotten
    max_per_spec: int = 4

    def __post_init__(self):
        for name in ("half_life_s", "burst_floor_s", "default_create_s"):
            if getattr(self, name) <= 0:
                raise ValueError(f"ScaleConfig.{name} must be > 0, not {getattr(self, name)}")
        for name in ("safety", "downscale_window_s", "dead_band", "idle_after_s", "max_per_spec"):
            if getattr(self, name) < 0:
                raise ValueError(f"ScaleConfig.{name} must be >= 0, not {getattr(self, name)}")


@dataclass(frozen=True)
class Cost:
    """What one ready sandbox of a key holds while it waits."""
    mem_mb: float = 0.0
    disk_mb: float = 0.0


@dataclass(frozen=True)
class Capacity:
    """What the pool may hold now (the node agent computes it from its free slots and memory)."""
    sandboxes: int
    mem_mb: float = math.inf
    disk_mb: float = math.inf


@dataclass
class _Key:
    cost: Cost
    last_t: float                   # of the last arrival
    rate: float = 0.0               # decayed rate at last_t
    burst: float = 0.0              # decayed peak burst at last_t
    recent: list = field(default_factory=list)    # arrival times within the burst window
    create_s: float | None = None   # EWMA of measured create latency
    target: int = 0                 # stabilised (before the capacity bound)
    history: list = field(default_factory=list)   # (t, raw) within the downscale window
    changes: int = 0                # how often `target` changed


class Autoscaler:
    def __init__(self, config: ScaleConfig = ScaleConfig(), clock: Callable[[], float] | None = None):
        if clock is None:
            raise ValueError("Autoscaler needs a clock (monotonic seconds)")
        self.config, self.clock = config, clock
        self._keys: dict[Hashable, _Key] = {}
        self._tau = config.half_life_s / math.log(2)

    # -- inputs -----------------------------------------------------------------------------
    def arrival(self, key: Hashable, cost: Cost = Cost()) -> None:
        """A lease needing a sandbox of `key` arrived now."""
        now, k = self.clock(), self._keys.get(key)
        if k is None:
            k = self._keys[key] = _Key(cost, now)
        decay = math.exp(-(now - k.last_t) / self._tau)
        window = self._burst_window(k)
        k.recent = [t for t in k.recent if now - t <= window] + [now]
        k.rate = k.rate * decay + 1.0 / self._tau
        k.burst = max(k.burst * decay, float(len(k.recent)))
        k.last_t, k.cost = now, cost

    def created(self, key: Hashable, seconds: float) -> None:
        """A sandbox of `key` took `seconds` to create (an EWMA of the last few)."""
        k = self._keys.get(key)
        if k is not None:
            k.create_s = seconds if k.create_s is None else 0.7 * k.create_s + 0.3 * seconds

    # -- outputs ----------------------------------------------------------------------------
    def knows(self, key: Hashable) -> bool:
        """Whether `key` has been leased within `idle_after_s` (as of the last plan)."""
        return key in self._keys

    def forecast(self, key: Hashable) -> tuple[float, float]:
        """(rate per second, burst) of `key` now; (0, 0) for a key it does not know."""
        k = self._keys.get(key)
        if k is None:
            return 0.0, 0.0
        decay = math.exp(-(self.clock() - k.last_t) / self._tau)
        return k.rate * decay, k.burst * decay

    def raw_target(self, key: Hashable) -> float:
        """The unstabilised need of `key` now (before the ceiling)."""
        k = self._keys[key]
        rate, burst = self.forecast(key)
        lam = rate * (k.create_s if k.create_s is not None else self.config.default_create_s)
        return min(max(lam + self.config.safety * math.sqrt(lam), burst - 0.5), self.config.max_per_spec)

    def plan(self, capacity: Capacity) -> dict[Hashable, int]:
        """Every known key's target now (0 for a key that went idle: the last time it is named)."""
        now, cfg = self.clock(), self.config
        out: dict[Hashable, int] = {}
        for key, k in list(self._keys.items()):
            if now - k.last_t >= cfg.idle_after_s:
                del self._keys[key]
                out[key] = 0
                continue
            self._stabilise(k, math.ceil(self.raw_target(key)), now)
        ranked = sorted(self._keys.items(), key=lambda kv: -self.forecast(kv[0])[0])
        left_n, left_mem, left_disk = capacity.sandboxes, capacity.mem_mb, capacity.disk_mb
        for key, k in ranked:
            n = min(k.target, max(left_n, 0))
            if k.cost.mem_mb > 0 and left_mem < math.inf:
                n = min(n, int(max(left_mem, 0) // k.cost.mem_mb))
            if k.cost.disk_mb > 0 and left_disk < math.inf:
                n = min(n, int(max(left_disk, 0) // k.cost.disk_mb))
            n = max(n, 0)
            out[key] = n
            left_n -= n
            left_mem -= n * k.cost.mem_mb
            left_disk -= n * k.cost.disk_mb
        return out

    def _stabilise(self, k: _Key, raw: int, now: float) -> None:
        window = self.config.downscale_window_s
        k.history = [(t, r) for t, r in k.history if now - t < window] + [(now, raw)]
        if raw > k.target:                        # up: at once
            k.target, k.changes = raw, k.changes + 1
            return
        need = max(r for _t, r in k.history)      # down: to the window's highest need
        if need <= k.target - self.config.dead_band:
            k.target, k.changes = need, k.changes + 1

    def _burst_window(self, k: _Key) -> float:
        return max(self.config.burst_floor_s, k.create_s or 0.0)

    def stats(self) -> dict:
        """Per key: rate, burst, stabilised target, changes (for health and tests)."""
        out = {}
        for key, k in self._keys.items():
            rate, burst = self.forecast(key)
            out[key] = {"rate_per_s": round(rate, 4), "burst": round(burst, 2), "target": k.target,
                        "changes": k.changes, "create_ms": None if k.create_s is None else round(k.create_s * 1e3, 2)}
        return out
