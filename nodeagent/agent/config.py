"""The node agent's one configuration object: every knob of the agent (its protocol core, its
daemon and what it runs attempts with), with units in the names and the defaults in one place.

`AgentConfig` is frozen and validated when made: an invalid value raises `ValueError` naming
its key (`agent.liveness must be an integer >= 1, got 0`); a bad run budget default raises the
contracts' `BudgetError` naming the budget key. `paddock agent` (controller/cli/agent.py) builds
one from its flags; `AgentCore`, `NodeAgent` and `serve` take it, and tests and the simulation
replace single knobs with `with_knobs()` (an unknown key is a `ValueError` listing the valid
ones). The sandbox runtime's own knobs are a `RuntimeConfig` (nodeagent/sandbox/config.py).

Must not import: zmq, psutil, threading, os, nodeagent.sandbox, nodeagent.harness,
nodeagent.verifier, controller other than controller.contracts.
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any, Mapping, Optional

from controller.contracts.liveness import HEARTBEAT_INTERVAL_S, LIVENESS
from controller.contracts.tasks import Budgets

SANDBOX_BACKENDS = ("native", "apptainer")
_POSITIVE_S = ("heartbeat_interval_s", "backoff_max_s")
_AT_LEAST_0_S = ("drain_deadline_s",)
_OPTIONAL_POSITIVE_S = ("give_up_s",)
_OPTIONAL_AT_LEAST_0_S = ("noop_s",)
_AT_LEAST_1 = ("slots", "liveness")


@dataclass(frozen=True)
class AgentConfig:
    slots: int = 2  # rollouts run at once (the credit of a fresh agent)
    prefetch: int = 0  # leases held beyond the slots, waiting for one (docs/protocol.md "Prefetch")
    heartbeat_interval_s: float = HEARTBEAT_INTERVAL_S  # the agent's heartbeats, and its liveness unit
    liveness: int = LIVENESS  # silent intervals (plus the backoff) before the agent reconnects
    drain_deadline_s: float = 60.0  # on a drain: how long running attempts may take to finish
    backoff_max_s: float = 2.0  # the reconnect backoff doubles from an interval up to this
    give_up_s: Optional[float] = None  # never welcomed this long after the start: stop (None: never)
    image_store: str = ""  # the image store directory (required to run sandboxes)
    noop_s: Optional[float] = None  # no sandboxes: every attempt passes after this long (benchmarks)
    sandbox: str = "native"  # the sandbox backend: one of SANDBOX_BACKENDS
    warm_pool: Optional[int] = None  # ready sandboxes at most (None: warmpools.default_pool_size; 0: off)
    # the run's defaults for the deadline and no-progress budget keys a task leaves at 0
    run_budgets: Mapping[str, float] = field(default_factory=dict, hash=False)

    def __post_init__(self) -> None:
        for key in _POSITIVE_S:
            _check_number(key, getattr(self, key), low=0.0, strict=True)
        for key in _AT_LEAST_0_S:
            _check_number(key, getattr(self, key), low=0.0, strict=False)
        for key, strict in [(k, True) for k in _OPTIONAL_POSITIVE_S] + [(k, False) for k in _OPTIONAL_AT_LEAST_0_S]:
            if getattr(self, key) is not None:
                _check_number(key, getattr(self, key), low=0.0, strict=strict, optional=True)
        for key in _AT_LEAST_1:
            _check_int(key, getattr(self, key), low=1)
        _check_int("prefetch", self.prefetch, low=0)
        if self.warm_pool is not None:
            _check_int("warm_pool", self.warm_pool, low=0, optional=True)
        if self.sandbox not in SANDBOX_BACKENDS:
            raise ValueError(f"agent.sandbox must be one of {list(SANDBOX_BACKENDS)}, got {self.sandbox!r}")
        if not isinstance(self.image_store, str):
            raise ValueError(f"agent.image_store must be a path (a string), got {self.image_store!r}")
        if not isinstance(self.run_budgets, Mapping):
            raise ValueError(f"agent.run_budgets must be a mapping of budget key -> number, "
                             f"got {self.run_budgets!r}")
        Budgets().with_run_defaults(self.run_budgets)  # BudgetError naming the key
        object.__setattr__(self, "run_budgets", dict(self.run_budgets))  # a copy: the caller's may change


AGENT_KEYS = frozenset(f.name for f in dataclasses.fields(AgentConfig))


def with_knobs(config: AgentConfig, knobs: Mapping[str, Any]) -> AgentConfig:
    """`config` with some knobs replaced (validated again); an unknown key is a ValueError
    naming it and the valid ones."""
    if not knobs:
        return config
    unknown = sorted(set(knobs) - AGENT_KEYS)
    if unknown:
        raise ValueError(f"unknown agent setting(s) {unknown}; valid: {sorted(AGENT_KEYS)}")
    return dataclasses.replace(config, **knobs)


def _check_number(key: str, value: Any, *, low: float, strict: bool, optional: bool = False) -> None:
    ok = not isinstance(value, bool) and isinstance(value, (int, float)) and (
        value > low if strict else value >= low)
    if not ok:
        bound = f"> {low:g}" if strict else f">= {low:g}"
        raise ValueError(f"agent.{key} must be a number {bound}{' or None' if optional else ''}, got {value!r}")


def _check_int(key: str, value: Any, *, low: int, optional: bool = False) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < low:
        raise ValueError(f"agent.{key} must be an integer >= {low}{' or None' if optional else ''}, "
                         f"got {value!r}")
