"""The trajectory store's vocabulary shared by its writers (node agents) and readers
(catalog, DuckDB views): the names of the shard tables, one directory each under a run.

Must not import: anything of Paddock, or anything that does I/O.
"""
from __future__ import annotations

SHARD_TABLES: tuple[str, ...] = ("rollouts", "steps", "checks", "spans", "egress")
