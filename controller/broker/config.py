"""The controller's one configuration object: every knob of the broker, its daemon loop and
the durable queue, with units in the names and the defaults in one place.

`BrokerConfig` is frozen and validated when made: an invalid value raises `ValueError`
naming its key (`broker.liveness must be an integer >= 1, got 0`). The queue's own knobs are
`BrokerConfig.queue` (a `QueueConfig`, whose defaults -- the lease TTL among them -- are the
ones the broker uses). The CLI (controller/cli/controller.py) builds one with `load()` from
its parsed arguments; tests and the simulation override single knobs with `with_knobs()`.

Must not import: zmq, sqlite3, controller.cli, nodeagent.
"""
from __future__ import annotations

import dataclasses
import os
from dataclasses import dataclass, field
from typing import Any, Mapping, Optional

from controller.contracts.liveness import HEARTBEAT_INTERVAL_S, LIVENESS
from controller.store.records import QueueConfig

_POSITIVE_S = ("heartbeat_interval_s", "sweep_interval_s", "lost_keep_s", "max_watch_wait_s",
               "compact_wait_s", "lease_silence_intervals")
_AT_LEAST_1 = ("liveness", "max_dispatch", "max_watchers", "max_frames_per_pass")
_AT_LEAST_0 = ("poll_timeout_ms", "compact_every")


@dataclass(frozen=True)
class BrokerConfig:
    heartbeat_interval_s: float = HEARTBEAT_INTERVAL_S  # both directions; told to agents in `welcome`
    liveness: int = LIVENESS  # silent intervals before a peer is declared lost
    lease_silence_intervals: float = 2.0  # silent this many intervals: no new leases
    sweep_interval_s: float = 0.5  # purge lost nodes, expire leases, flush the catalog
    lost_keep_s: float = 3600.0  # a lost node stays in `status` this long
    max_dispatch: int = 4096  # leases placed per pass
    max_watchers: int = 1024  # long polls waiting at once (more are answered at once)
    max_watch_wait_s: float = 60.0  # a long poll is answered after at most this long
    max_frames_per_pass: int = 1024  # frames read per pass (one group commit)
    poll_timeout_ms: int = 20  # the loop's socket poll
    compact_every: int = 0  # merge the run's small shards after every N commits (0: never)
    compact_wait_s: float = 120.0  # at shutdown, how long a running compaction may finish (then stopped)
    metrics_port: Optional[int] = None  # Prometheus metrics on this port (0: any; None: off)
    metrics_addr: str = "127.0.0.1"  # the node's address, never 0.0.0.0 (slurm/jobsteps.py passes it)
    queue: QueueConfig = field(default_factory=QueueConfig)

    def __post_init__(self) -> None:
        for key in _POSITIVE_S:
            value = getattr(self, key)
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not value > 0:
                raise ValueError(f"broker.{key} must be a number > 0, got {value!r}")
        for key, low in [(k, 1) for k in _AT_LEAST_1] + [(k, 0) for k in _AT_LEAST_0]:
            value = getattr(self, key)
            if isinstance(value, bool) or not isinstance(value, int) or value < low:
                raise ValueError(f"broker.{key} must be an integer >= {low}, got {value!r}")
        port = self.metrics_port
        if port is not None and (isinstance(port, bool) or not isinstance(port, int)
                                 or not 0 <= port <= 65535):
            raise ValueError(f"broker.metrics_port must be a port number (0-65535) or null, "
                             f"got {port!r}")
        if not isinstance(self.queue, QueueConfig):
            raise ValueError(f"broker.queue must be a QueueConfig, got {self.queue!r}")


BROKER_KEYS = frozenset(f.name for f in dataclasses.fields(BrokerConfig)) - {"queue"}
QUEUE_KEYS = frozenset(f.name for f in dataclasses.fields(QueueConfig))


REPLICA_ENV = "PADDOCK_REPLICA_DIR"  # the replica directory, when no `replica_dir` is given


def load(values: Mapping[str, Any], environ: Mapping[str, str] = os.environ) -> BrokerConfig:
    """A BrokerConfig from flat key -> value pairs (the CLI's parsed arguments): the queue's
    keys go to `queue`, the others to the broker; an unknown key is a ValueError naming it.
    `replica_dir`, when not given (or None), is `$PADDOCK_REPLICA_DIR` if set (read here, at
    the entry point: the Slurm job and `paddock run` pass it down to the controller)."""
    if values.get("replica_dir") is None and environ.get(REPLICA_ENV):
        values = {**values, "replica_dir": environ[REPLICA_ENV]}
    unknown = sorted(set(values) - BROKER_KEYS - QUEUE_KEYS)
    if unknown:
        raise ValueError(f"unknown controller setting(s) {unknown}; valid: "
                         f"{sorted(BROKER_KEYS | QUEUE_KEYS)}")
    queue = QueueConfig(**{k: v for k, v in values.items() if k in QUEUE_KEYS})
    return BrokerConfig(queue=queue, **{k: v for k, v in values.items() if k in BROKER_KEYS})


def with_knobs(config: BrokerConfig, knobs: Mapping[str, Any]) -> BrokerConfig:
    """`config` with some broker knobs replaced (validated again); an unknown key is a
    ValueError naming it."""
    if not knobs:
        return config
    unknown = sorted(set(knobs) - BROKER_KEYS - {"queue"})
    if unknown:
        raise ValueError(f"unknown broker setting(s) {unknown}; valid: "
                         f"{sorted(BROKER_KEYS | {'queue'})}")
    return dataclasses.replace(config, **knobs)
