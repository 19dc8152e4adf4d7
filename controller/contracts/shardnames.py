"""The trajectory store's names without its Arrow schemas: which tables the catalog names per
committed key (`SHARD_TABLES`) and how a per-attempt shard file is named (`shard_name`,
`shard_suffix`). Apart from controller/contracts/trajectory.py (which re-exports them) so
that the controller's hot path and start-up need no pyarrow.

Pure data and pure functions. Must not import: pyarrow, zmq, duckdb, sqlite3, nodeagent,
controller.store, controller.broker.
"""
from __future__ import annotations

import re

# Tables whose shards the catalog names per committed key (controller/store/catalog.py).
SHARD_TABLES: tuple[str, ...] = ("rollouts", "steps", "checks", "spans", "egress")

_SAFE_NAME = re.compile(r"[^A-Za-z0-9._-]")


def _safe(s: str) -> str:
    return _SAFE_NAME.sub(lambda m: "%{:02X}".format(ord(m.group())), s)


def shard_name(node: str, rollout_id: str, attempt: int, fencing_token: int) -> str:
    """`<node>-<rollout_id>-a<attempt>-t<token>.parquet`, unsafe characters %-escaped."""
    return f"{_safe(node)}-{shard_suffix(rollout_id, attempt, fencing_token)}"


def shard_suffix(rollout_id: str, attempt: int, fencing_token: int) -> str:
    """The end of every per-attempt shard name of this key: `<rollout_id>-a<n>-t<token>.parquet`."""
    return f"{_safe(rollout_id)}-a{int(attempt)}-t{int(fencing_token)}.parquet"
