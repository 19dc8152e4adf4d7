"""Named fault points on the controller's commit path, and the hook type that fires them.

A `FaultHook` is a callable taking a point's name; the queue, the catalog and the daemon loop
call it at each step where a crash would leave a distinct state on disk. In production it is
`no_fault` (does nothing). tests/broker/test_crash.py installs a hook that kills the process
(`os._exit`) at one chosen point, restarts the controller on the same files and checks that
the catalog shows exactly what the queue committed.

The commit path of one pass of the controller loop, in order:

1. `QUEUE_BEFORE_COMMIT`  every decision of the pass is made, the SQLite COMMIT is not done
2. `QUEUE_AFTER_COMMIT`   the COMMIT is durable, the catalog has not heard of it
3. `CATALOG_BEFORE_LINK`  a catalog file is written and fsynced under its `.tmp` name
4. `CATALOG_AFTER_LINK`   the catalog file is in place, its directory not yet fsynced
5. `BEFORE_REPLY`         queue and catalog are durable, no reply of the pass has left
6. `AFTER_REPLY`          the replies of the pass are sent

Must not import anything of the project (a leaf: the store and the broker both use it).
"""
from __future__ import annotations

from typing import Callable

FaultHook = Callable[[str], None]

QUEUE_BEFORE_COMMIT = "queue.before_commit"
QUEUE_AFTER_COMMIT = "queue.after_commit"
CATALOG_BEFORE_LINK = "catalog.before_link"
CATALOG_AFTER_LINK = "catalog.after_link"
BEFORE_REPLY = "daemon.before_reply"
AFTER_REPLY = "daemon.after_reply"

COMMIT_PATH = (QUEUE_BEFORE_COMMIT, QUEUE_AFTER_COMMIT, CATALOG_BEFORE_LINK, CATALOG_AFTER_LINK,
               BEFORE_REPLY, AFTER_REPLY)


def no_fault(point: str) -> None:
    """The production hook: no fault anywhere."""
