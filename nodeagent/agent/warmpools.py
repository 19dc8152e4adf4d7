"""The node agent's warm pools: the sandbox autoscaler (nodeagent.sandbox.autoscale) switched on
over the agent's runtime, with the node's capacity as its bound.

`start_warm_pools(runtime, agent, max_sandboxes)` makes every attempt's sandbox acquire (the
agent's and the verifier's grading sandbox: `runtime.acquire`) an arrival of its spec, so the
specs this node is leased most keep ready sandboxes (already at the task's image and layers).
A handout is never reused: the attempt destroys it, as it destroys one it made.

The pool never takes what the slots need (`capacity_of`): it holds at most `max_sandboxes`
(default `default_pool_size`: two per slot, an agent and a grading sandbox each, so a batch of
leases that fills every slot at once finds all its sandboxes ready), at most the runtime's id
slices beyond two per slot (a slot's
agent and grading sandbox, and one being torn down), and, in memory, at most
`max_mem_mb` and what the node has available beyond a full sandbox memory cap for every slot
and `MEM_HEADROOM_MB`; on disk, what the state directory's filesystem has beyond
`DISK_HEADROOM_MB`. A draining agent holds none. Each ready sandbox is charged
`IDLE_SANDBOX_MB` (its init and overlay mount; files are written at the handout) and
`IDLE_SANDBOX_DISK_MB`.

Must not import: zmq, controller, nodeagent.agent.daemon.
"""
from __future__ import annotations

import logging
import time

import psutil

from nodeagent.sandbox.autoscale import Autoscaler, Capacity, Cost, ScaleConfig
from nodeagent.sandbox.spec import DEFAULT_LIMITS

log = logging.getLogger(__name__)

IDLE_SANDBOX_MB = 8          # a waiting sandbox's init and mounts (benchmarks/warm_pool.py measures it)
IDLE_SANDBOX_DISK_MB = 1
MEM_HEADROOM_MB = 512        # left to the agent, the gateway and the verifier's checks
DISK_HEADROOM_MB = 1024
DEFAULT_MAX_MEM_MB = 512     # the pool's own memory cap


def default_pool_size(slots: int) -> int:
    """Two ready sandboxes per slot: its agent's and its grading sandbox."""
    return 2 * max(int(slots), 0)


def capacity_of(agent, runtime, max_sandboxes: int, max_mem_mb: float = DEFAULT_MAX_MEM_MB) -> Capacity:
    """What the pool may hold now, never what the slots need (see the module docstring)."""
    if agent.draining or max_sandboxes <= 0:
        return Capacity(sandboxes=0)
    slots = int(agent.slots)
    sandboxes = min(max_sandboxes, int(getattr(runtime, "slots", max_sandboxes)) - 2 * slots)
    slot_mem = int(DEFAULT_LIMITS["memory_mb"])
    for a in list(agent.active.values()):
        try:
            slot_mem = max(slot_mem, int(dict(a.task.limits).get("memory_mb") or 0))
        except (AttributeError, TypeError, ValueError):
            continue
    mem_free = psutil.virtual_memory().available / 2**20
    mem = min(max_mem_mb, mem_free - slots * slot_mem - MEM_HEADROOM_MB)
    state = getattr(runtime, "state_dir", None)
    disk = psutil.disk_usage(state).free / 2**20 - DISK_HEADROOM_MB if state else float("inf")
    return Capacity(sandboxes=max(sandboxes, 0), mem_mb=max(mem, 0.0), disk_mb=max(disk, 0.0))


def start_warm_pools(runtime, agent, max_sandboxes: int, config: ScaleConfig | None = None,
                     clock=time.monotonic) -> Autoscaler:
    """Put `runtime`'s pools under an autoscaler bounded by `agent`'s capacity; the scaler."""
    slots = max(int(agent.slots), 1)
    config = config or ScaleConfig(max_per_spec=min(ScaleConfig.max_per_spec, max(max_sandboxes, 1), slots))
    scaler = Autoscaler(config, clock)
    runtime.autoscale(scaler, lambda: capacity_of(agent, runtime, max_sandboxes),
                      lambda spec: Cost(mem_mb=IDLE_SANDBOX_MB, disk_mb=IDLE_SANDBOX_DISK_MB))
    log.info("warm pools on: at most %d ready sandboxes, %d per spec", max_sandboxes, config.max_per_spec)
    return scaler
