"""The operator's commands for the trajectory store's second copy (controller/store/replica.py).

  paddock store restore --replica DIR --to NEW_RUN [--at TIME]   a run directory from its replica
  paddock store status --replica DIR [--max-lag-s S] [--json]    replica health: lag, failures
  paddock store check --replica DIR --run RUN                    is DIR usable as RUN's replica

The controller replicates when started with `$PADDOCK_REPLICA_DIR` (or the `replica_dir`
setting). TIME is epoch seconds or an ISO-8601 time (UTC unless it says otherwise).
Operating errors print one line to stderr and exit 2; `status` exits 1 when the replica is
behind by more than `--max-lag-s` (or, with `--max-age-s`, its status is older than that):
a health check.

Thin: parses arguments, calls controller.store.replica and controller.store.restore.
Must not import: zmq, controller.broker, nodeagent.
"""
from __future__ import annotations

import argparse
import json
import sys
import time
from datetime import datetime, timezone
from typing import Optional

from controller.store.catalog import CatalogError
from controller.store.replica import ReplicaError, check_replica_dir, generations, read_status
from controller.store.restore import restore_run


def register(subparsers: argparse._SubParsersAction) -> None:
    """Add `paddock store restore|status|check`."""
    p = subparsers.add_parser("store", help="the trajectory store's replica: restore, status",
                              description="Restore a run from its replica, or check the "
                              "replica's health (docs/operations.md, 'Restore from the "
                              "replica').")
    sub = p.add_subparsers(dest="store_command", required=True, metavar="COMMAND")
    r = sub.add_parser("restore", help="write a new run directory from a replica",
                       description="The ledger as of --at (default: the newest commit on the "
                       "replica), every committed shard it names, and its catalog.")
    r.add_argument("--replica", required=True, metavar="DIR", help="the replica directory")
    r.add_argument("--to", required=True, metavar="NEW_RUN",
                   help="the run directory to write (must not exist, or be empty)")
    r.add_argument("--at", metavar="TIME", type=parse_time,
                   help="point in time: epoch seconds or ISO-8601 (default: newest)")
    r.set_defaults(func=cmd_restore)
    s = sub.add_parser("status", help="replica lag and failures (exit 1 when behind)")
    s.add_argument("--replica", required=True, metavar="DIR", help="the replica directory")
    s.add_argument("--max-lag-s", type=float, default=60.0,
                   help="behind by more than this: exit 1 (default %(default)s)")
    s.add_argument("--max-age-s", type=float, default=None,
                   help="also exit 1 when the status was last written longer ago than this "
                   "(it is written at each commit, at most once a second: a farm that "
                   "commits steadily; default: not checked)")
    s.add_argument("--json", action="store_true", help="print the status as JSON")
    s.set_defaults(func=cmd_status)
    c = sub.add_parser("check", help="is a directory usable as a run's replica")
    c.add_argument("--replica", required=True, metavar="DIR", help="the replica directory")
    c.add_argument("--run", required=True, metavar="RUN", help="the run directory (primary)")
    c.set_defaults(func=cmd_check)


def parse_time(text: str) -> float:
    """Epoch seconds, or an ISO-8601 time (naive means UTC)."""
    try:
        return float(text)
    except ValueError:
        pass
    try:
        when = datetime.fromisoformat(text.replace("Z", "+00:00"))
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"{text!r} is not a time: give epoch seconds or ISO-8601 "
            f"(2026-12-04T15:30:00Z)") from None
    if when.tzinfo is None:
        when = when.replace(tzinfo=timezone.utc)
    return when.timestamp()


def _iso(at: Optional[float]) -> str:
    return "-" if at is None else datetime.fromtimestamp(at, timezone.utc).isoformat(
        timespec="milliseconds")


def _fail(msg: str) -> int:
    print(f"paddock store: {msg}", file=sys.stderr)
    return 2


def cmd_restore(args: argparse.Namespace) -> int:
    try:
        res = restore_run(args.replica, args.to, args.at)
    except (ReplicaError, CatalogError, OSError) as exc:
        return _fail(str(exc))
    print(f"restored {res.run_dir} from {args.replica}: ledger generation {res.generation}, "
          f"{res.records} log records, newest commit {_iso(res.until)}; {res.committed} "
          f"committed rollouts, {res.shards} shards copied")
    if res.missing:     # commits the primary made after its disk was lost: their record is gone
        print(f"{len(res.missing)} committed shards are not on the replica (first: {res.missing[0]}): "
              f"their {len(res.requeued)} rollouts are queued again ({', '.join(res.requeued[:5])}"
              f"{', ...' if len(res.requeued) > 5 else ''})", file=sys.stderr)
    return 0


def cmd_status(args: argparse.Namespace) -> int:
    try:
        status = read_status(args.replica)
    except (OSError, ValueError) as exc:
        return _fail(f"cannot read the status of {args.replica}: {exc}")
    if status is None:
        return _fail(f"{args.replica} has no status.json: not a replica, or never replicated to")
    age_s = time.time() - status["time"]
    gens = generations(args.replica)
    status = {**status, "status_age_s": round(age_s, 3), "generations": [g for g, _ in gens]}
    behind = status["lag_s"] > args.max_lag_s or (
        args.max_age_s is not None and abs(age_s) > args.max_age_s)
    if args.json:
        print(json.dumps(status, indent=2))
    else:
        print(f"replica {args.replica}: {'IN SYNC' if status['in_sync'] else 'BEHIND'} "
              f"(lag {status['lag_s']:.1f}s, status written {age_s:.1f}s ago); generation "
              f"{status['generation']} ({len(gens)} kept); {status['shipped_records']} log "
              f"records, {status['shards_copied']} shards copied, {status['pending_shards']} "
              f"pending, {status.get('uncopyable_shards', 0)} uncopyable; {status['failures']} failures"
              + (f", last: {status['last_error']}" if status["last_error"] else ""))
    return 1 if behind else 0


def cmd_check(args: argparse.Namespace) -> int:
    try:
        warnings = check_replica_dir(args.replica, args.run)
    except ReplicaError as exc:
        return _fail(str(exc))
    for w in warnings:
        print(f"warning: {w}", file=sys.stderr)
    print(f"{args.replica} can hold the replica of {args.run}")
    return 0
