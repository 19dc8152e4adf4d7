"""The wall-clock time written into records (trajectory rows, model calls, egress decisions):
`utc_now()`, timezone-aware UTC. Never for durations: those use a monotonic clock.

Must not import: anything of Paddock.
"""
from __future__ import annotations

from datetime import datetime, timezone


def utc_now() -> datetime:
    """Wall-clock time for records (never for durations: use a monotonic clock)."""
    return datetime.now(timezone.utc)
