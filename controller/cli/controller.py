"""`paddock controller`: run the controller daemon (also `python -m controller.broker`).

Parses the command line, builds the one `BrokerConfig` from it (an invalid value is a usage
error naming the setting) and calls `controller.broker.daemon.run` with plain arguments.
`register(subparsers)` adds the subcommand to the `paddock` CLI; `main(argv)` is the
standalone entry point. The defaults shown in `--help` are BrokerConfig's.

Must not import: nodeagent, sqlite3, zmq.
"""
from __future__ import annotations

import argparse
import logging
import sys
from pathlib import Path
from typing import Optional, Sequence

from controller.broker import daemon
from controller.broker.config import BrokerConfig, load
from controller.ondisk.keys import KEY_FILE, KeyFileError
from controller.store.replica import ReplicaError

_DEFAULTS = BrokerConfig()
# argparse dest -> BrokerConfig (or QueueConfig) key: the knobs this command sets.
_KNOBS = ("heartbeat_interval_s", "liveness", "lease_ttl_s", "max_staleness", "stale_policy",
          "metrics_port", "metrics_addr", "compact_every", "max_attempts", "max_node_losses",
          "lease_silence_intervals", "replica_dir")


def add_arguments(ap: argparse.ArgumentParser) -> None:
    """The controller's options (run, then knobs)."""
    ap.add_argument("--bind", default="tcp://127.0.0.1:0", help="ZeroMQ endpoint to bind "
                    "(default %(default)s: any free port on localhost)")
    ap.add_argument("--deployment", required=True, help="deployment id: frames of any other "
                    "deployment are dropped")
    ap.add_argument("--run-dir", required=True, help="the run directory (shards, catalog, logs)")
    ap.add_argument("--tasks-json", required=True,
                    help="file mapping task refs to lease task dicts")
    ap.add_argument("--endpoint-file", required=True, help="where to publish the bound endpoint")
    ap.add_argument("--db", help="queue database (default RUN_DIR/controller.db)")
    ap.add_argument("--key-file", help=f"the run's CURVE keys (default RUN_DIR/{KEY_FILE}, made "
                    "0600 at the first start); only peers holding this file get an answer")
    ap.add_argument("--insecure", action="store_true",
                    help="no CURVE: plain-text, unauthenticated control plane (benchmarks' "
                    "side-by-side only; anyone who reaches the port can drive the farm)")
    ap.add_argument("--curriculum-db", help="the curriculum (pass-rate estimates) a submit's "
                    "sampler request is resolved against (default: none, such requests are "
                    "refused)")
    ap.add_argument("--log-level", default="INFO")
    ap.add_argument("--heartbeat-interval-s", type=float, default=_DEFAULTS.heartbeat_interval_s,
                    help="heartbeat interval, both directions (default %(default)s)")
    ap.add_argument("--liveness", type=int, default=_DEFAULTS.liveness,
                    help="silent intervals before a node is lost (default %(default)s)")
    ap.add_argument("--lease-ttl-s", type=float, default=_DEFAULTS.queue.lease_ttl_s,
                    help="a lease not renewed for this long goes back to the queue "
                    "(default %(default)s)")
    ap.add_argument("--max-attempts", type=int, default=_DEFAULTS.queue.max_attempts,
                    help="a rollout's infrastructure failures charged to its task (task, "
                    "setup, verifier) before it is dead-lettered (default %(default)s)")
    ap.add_argument("--max-node-losses", type=int, default=_DEFAULTS.queue.max_node_losses,
                    help="attempts of a rollout lost with their node (vanished, restarted) "
                    "or to the infrastructure (model server unreachable, sandbox start) "
                    "before it is dead-lettered; counted apart from failures "
                    "(default %(default)s)")
    ap.add_argument("--lease-silence-intervals", type=float,
                    default=_DEFAULTS.lease_silence_intervals,
                    help="a node silent this many heartbeat intervals gets no new lease "
                    "(default %(default)s)")
    ap.add_argument("--max-staleness", type=int, default=_DEFAULTS.queue.max_staleness,
                    help="policy versions a queued rollout may lag (default: unbounded)")
    ap.add_argument("--stale-policy", choices=("rerun", "drop"),
                    default=_DEFAULTS.queue.stale_policy,
                    help="what happens to a rollout over the staleness bound "
                    "(default %(default)s)")
    ap.add_argument("--metrics-port", type=int, default=_DEFAULTS.metrics_port,
                    help="serve Prometheus metrics on this port (0: any free port; see "
                    "controller/broker/metrics.py)")
    ap.add_argument("--metrics-addr", default=_DEFAULTS.metrics_addr,
                    help="address the metrics server binds (default %(default)s)")
    ap.add_argument("--replica-dir", default=None,
                    help="a second copy of the ledger and the committed shards, on another filesystem "
                         "(default $PADDOCK_REPLICA_DIR; see `paddock store`)")
    ap.add_argument("--compact-every", type=int, default=_DEFAULTS.compact_every, metavar="N",
                    help="merge the run's small shards after every N commits (0: never)")


def run_args(args: argparse.Namespace, ap: argparse.ArgumentParser) -> int:
    """Run the daemon from parsed arguments; an invalid setting is `ap.error`."""
    try:
        config = load({k: getattr(args, k) for k in _KNOBS})
    except ValueError as exc:
        ap.error(str(exc))
    logging.basicConfig(level=args.log_level.upper(),
                        format="%(asctime)s controller %(levelname)s %(message)s")
    try:
        return daemon.run(config, bind=args.bind, deployment=args.deployment,
                          run_dir=Path(args.run_dir), tasks=daemon.load_tasks(args.tasks_json),
                          endpoint_file=args.endpoint_file, db_path=args.db,
                          curriculum_db=args.curriculum_db, key_file=args.key_file,
                          insecure=args.insecure)
    except (KeyFileError, ReplicaError) as exc:
        print(f"paddock controller: {exc}", file=sys.stderr)
        return 2


def register(subparsers: argparse._SubParsersAction) -> None:
    """Add `paddock controller`."""
    ap = subparsers.add_parser("controller", help="run the controller daemon",
                               description="Run the controller: the broker over the durable "
                               "rollout queue, on a ZeroMQ ROUTER socket.")
    add_arguments(ap)
    ap.set_defaults(func=lambda args: run_args(args, ap))


def main(argv: Optional[Sequence[str]] = None) -> int:
    ap = argparse.ArgumentParser(prog="paddock controller",
                                 description="Run the controller daemon.")
    add_arguments(ap)
    return run_args(ap.parse_args(argv), ap)
