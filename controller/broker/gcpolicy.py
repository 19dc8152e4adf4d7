"""The controller process's garbage-collector policy.

CPython's cyclic collector walks every tracked object of a generation when it collects it;
the oldest generation holds what lives for the whole run (the task set's references, the
queue, the core's views), so its collections cost more the larger the farm and the task set,
paid by whichever frame happens to be in hand: the controller's CPU per frame grew with the
farm (0.069 ms at 100 agents, 0.108 ms at 1,000, in `benchmarks/scale.py sim`; 0.067 and
0.073 ms with the collector off). `settle()` is called once, by the daemon's entry point,
when the start-up state is built: that state is moved out of the collector's view
(`gc.freeze`: it is never collected, nor walked again), and the youngest generation is
collected every `GEN0_THRESHOLD` net allocations instead of 700, so the per-frame objects
(messages, replies, rows) mostly die before a collection sees them. Reference cycles made
later are still collected.

Must not import: controller.store, controller.contracts, nodeagent, zmq (it is called by
controller/broker/daemon.py and by benchmarks/scale.py, whose simulation shares the heap with
its simulated agents).
"""
from __future__ import annotations

import gc

GEN0_THRESHOLD = 10_000   # net container allocations between young collections (CPython: 700)
OLDER_THRESHOLDS = (20, 20)  # young collections per middle one, middle per oldest (CPython: 10, 10)


def settle() -> None:
    """Freeze what exists now (a full collection first, so no garbage is frozen) and set the
    thresholds. Idempotent; call it in the controller's own process only."""
    gc.collect()
    gc.freeze()
    gc.set_threshold(GEN0_THRESHOLD, *OLDER_THRESHOLDS)
