"""Fenced leases a node still runs: which rollouts a node lists as its own (a heartbeat's or a
registration's `held`) are no longer its own, and the `reject` that tells it so.

A lease stops being a node's when it expires (the node was silent), when the rollout is leased
again (a newer fencing token), or when its batch is cancelled and the `reject` was lost. The
node would learn it only when its result is rejected, after running the attempt to its end;
told at its next heartbeat instead, it stops the attempt now (nodeagent/agent/core.py stops an
attempt whose token is the reject's or older: docs/protocol.md "Cancellation"). Rollouts that
ended (committed, dead-lettered) are left to the result path: their results may be in flight.
Pure: the broker (core.py) passes its holder mirror and a row lookup.

Must not import: zmq, sqlite3, controller.store, controller.cli, nodeagent.
"""
from __future__ import annotations

from typing import Callable, Iterable, Mapping, Optional

from controller.contracts import protocol as P
from controller.contracts.states import CANCELLED, COMMITTED, DEAD_LETTER, HELD, REJECT_CANCELLED, STALE_TOKEN


def stale_leases(node: str, rollout_ids: Iterable[str], holder: Mapping[str, tuple[str, int]],
                 rollout: Callable[[str], Optional[Mapping]]) -> list[P.Reject]:
    """The rejects for the rollouts of `rollout_ids` that `node` runs but no longer holds:
    each with the rollout's current (attempt, token) and `cancelled` or `stale_token`.
    `holder`: rollout id -> (node, token) of the leases held (the broker's mirror, looked at
    first); `rollout(id)`: the queue's row of a rollout (read only where the mirror differs)."""
    out = []
    for rid in rollout_ids:
        held = holder.get(rid)
        if held is not None and held[0] == node:
            continue
        row = rollout(rid)
        if row is None or row["token"] is None or row["state"] in (COMMITTED, DEAD_LETTER):
            continue
        if row["state"] in HELD and row["node"] == node:
            continue                    # its own after all (the mirror catches up)
        out.append(P.Reject(rollout_id=rid, attempt=row["attempt"], token=row["token"],
                            reason=REJECT_CANCELLED if row["state"] == CANCELLED else STALE_TOKEN))
    return out
