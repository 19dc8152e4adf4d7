"""`paddock agent`: run a node agent (one per compute node; `paddock run` and the Slurm job
steps start it). Parses the arguments into the agent's `AgentConfig` and the sandbox
runtime's `RuntimeConfig` (their defaults are the flags' defaults; an invalid value exits 2
naming the key), configures logging and calls `nodeagent.agent.daemon.serve`.

  paddock agent (--run-dir RUN | --endpoint-file F [--controller tcp://HOST:PORT] [--key-file K])
                --deployment ID [--node N] [--slots N] [--prefetch N]
                (--image-store DIR | --noop-s S) [--subid-base B --subid-count C | --subid-share K/N]
                [--heartbeat-interval-s S] [--drain-deadline-s S] [--give-up-s S] [--degrade]
                [--warm-pool N] [--sandbox native|apptainer] [--insecure] [--log-level L]

The run's CURVE keys come from `--key-file` (default: `controller.key` next to the endpoint
file); a missing key file, or one of another user or readable by others, is an error naming the
path and the fix, before anything starts. `--insecure` (a `--insecure` controller) goes without.

`register(subparsers)` adds the subcommand to `paddock`; `main(argv)` runs it alone
(`python -m controller.cli agent ...` goes through `paddock`).

Must not import: controller.broker, controller.store (an agent holds no controller state).
"""
from __future__ import annotations

import argparse
import logging
import os
import sys
from pathlib import Path

from controller.contracts.tasks import BudgetError, Budgets
from controller.ondisk.keys import KEY_FILE, KeyFileError, RunKeys, read_key_file
from nodeagent.agent.config import SANDBOX_BACKENDS, AgentConfig
from nodeagent.agent.daemon import EndpointFile, serve
from nodeagent.sandbox.config import RuntimeConfig
from nodeagent.sandbox.runtime import SandboxError, subid_range

_DEFAULTS = AgentConfig()


def add_arguments(ap: argparse.ArgumentParser) -> None:
    ap.add_argument("--node", default=os.uname().nodename, help="this node's name (default: the host name)")
    ap.add_argument("--controller", help="ZeroMQ endpoint, e.g. tcp://10.0.0.1:5555 (default: "
                    "what the endpoint file names)")
    ap.add_argument("--run-dir", help="the run directory: its controller.endpoint and "
                    f"{KEY_FILE} are the defaults of --endpoint-file and --key-file")
    ap.add_argument("--endpoint-file", help="the controller's endpoint file, looked at again "
                    "while the controller is silent (a restart on another port is followed)")
    ap.add_argument("--key-file", help=f"the run's CURVE keys (default: {KEY_FILE} next to the "
                    "endpoint file); mode 0600, yours")
    ap.add_argument("--insecure", action="store_true",
                    help="no CURVE (only against a `paddock controller --insecure`)")
    ap.add_argument("--give-up-s", type=float, default=_DEFAULTS.give_up_s,
                    help="exit (status 4) if no controller has welcomed this agent this long "
                         "after its start (default: keep trying)")
    ap.add_argument("--deployment", required=True, help="the deployment id every frame carries")
    ap.add_argument("--slots", type=int, default=_DEFAULTS.slots,
                    help=f"rollouts run at once (default {_DEFAULTS.slots})")
    ap.add_argument("--prefetch", type=int, default=_DEFAULTS.prefetch,
                    help="leases held beyond the slots, waiting for one: fewer frames per "
                         "rollout for an agent of few slots (docs/protocol.md \"Prefetch\"; "
                         f"default {_DEFAULTS.prefetch})")
    ap.add_argument("--image-store", default=_DEFAULTS.image_store, help="the image store directory (required unless --noop-s)")
    ap.add_argument("--subid-base", type=int, help="first subordinate id of the sandboxes' user range")
    ap.add_argument("--subid-count", type=int, help="how many subordinate ids from --subid-base")
    ap.add_argument("--subid-share", type=_share, metavar="K/N",
                    help="use the K-th of N equal shares of this user's subordinate id range "
                         "(several agents of one user on one host: K = 0..N-1)")
    ap.add_argument("--heartbeat-interval-s", type=float, default=_DEFAULTS.heartbeat_interval_s,
                    help=f"seconds between heartbeats (default {_DEFAULTS.heartbeat_interval_s:g})")
    ap.add_argument("--drain-deadline-s", type=float, default=_DEFAULTS.drain_deadline_s,
                    help="on SIGTERM or drain: how long running attempts may take to finish "
                         f"(default {_DEFAULTS.drain_deadline_s:g})")
    ap.add_argument("--noop-s", type=float, default=_DEFAULTS.noop_s,
                    help="no sandbox: every rollout passes after this many seconds (benchmarks)")
    ap.add_argument("--degrade", action="store_true",
                    help="start even where a sandbox cap (memory, pids, cpu) can be held neither by a "
                         "cgroup nor from user space (memory monitor, CPU slice + SCHED_BATCH, pids per id "
                         "slice): it is then not enforced, and the log says which (default: refuse)")
    ap.add_argument("--warm-pool", type=int, default=_warm_pool_default(), metavar="N",
                    help="keep at most N ready sandboxes for the specs this node is leased most, sized "
                         "by an arrival-rate autoscaler (0: off; default: two per slot, or "
                         f"${WARM_POOL_ENV})")
    ap.add_argument("--sandbox", choices=SANDBOX_BACKENDS, default=_DEFAULTS.sandbox,
                    help="the sandbox backend: native (user namespaces, this host's cgroups) or apptainer "
                         "(for sites whose policy requires it; `apptainer` must be on PATH) (default native)")
    ap.add_argument("--budget-default", action="append", default=[], metavar="KEY=VALUE",
                    help="the run's default for a deadline or no-progress budget a task leaves at 0 "
                         "(create_s, setup_s, verify_s, teardown_s, total_s, no_progress_repeats, "
                         "no_output_turns); repeatable")
    ap.add_argument("--log-level", default="INFO", help="DEBUG, INFO, WARNING or ERROR (default INFO)")


WARM_POOL_ENV = "PADDOCK_WARM_POOL"


def _warm_pool_default() -> int | None:
    """$PADDOCK_WARM_POOL (how `paddock run` and job steps pass it to their agents), else None."""
    text = os.environ.get(WARM_POOL_ENV, "").strip()
    if not text:
        return None
    try:
        n = int(text)
    except ValueError:
        raise SystemExit(f"paddock agent: ${WARM_POOL_ENV}={text!r} is not a whole number") from None
    if n < 0:
        raise SystemExit(f"paddock agent: ${WARM_POOL_ENV}={text!r} must be >= 0")
    return n


def _share(text: str) -> tuple[int, int]:
    try:
        k, n = (int(x) for x in text.split("/"))
    except ValueError:
        raise argparse.ArgumentTypeError(f"--subid-share: {text!r} is not K/N (e.g. 0/2)") from None
    if not (n >= 1 and 0 <= k < n):
        raise argparse.ArgumentTypeError(f"--subid-share: {text!r} needs 0 <= K < N")
    return k, n


def share_of_subids(k: int, n: int) -> tuple[int, int]:
    """(base, count) of the K-th of N equal shares of this user's subordinate id range."""
    base, count = subid_range()
    share = count // n
    return base + k * share, share


def _usage(ap: argparse.ArgumentParser | None, msg: str) -> int:
    if ap is not None:
        ap.error(msg)  # exits 2 with the usage
    print(f"paddock agent: {msg}", file=sys.stderr)
    return 2


def connection(args: argparse.Namespace) -> tuple[str, str | None, RunKeys | None]:
    """(endpoint, endpoint file, keys) from the arguments; ValueError or KeyFileError (the
    message names the path and the fix) when they do not add up."""
    endpoint_file = args.endpoint_file or (str(Path(args.run_dir) / "controller.endpoint")
                                           if args.run_dir else None)
    endpoint = args.controller
    if endpoint is None:
        if endpoint_file is None:
            raise ValueError("give --run-dir, --endpoint-file or --controller")
        endpoint = EndpointFile(endpoint_file).read()
        if endpoint is None:
            raise ValueError(f"no controller endpoint in {endpoint_file}: start the controller "
                             "first (or give --controller)")
    if args.insecure:
        return endpoint, endpoint_file, None
    key_file = args.key_file or (str(Path(endpoint_file).with_name(KEY_FILE))
                                 if endpoint_file else None)
    if key_file is None:
        raise KeyFileError("no key file: give --key-file RUN_DIR/controller.key (or --run-dir "
                           "RUN_DIR); only `--insecure` goes without, against an insecure "
                           "controller")
    return endpoint, endpoint_file, read_key_file(key_file)


def run_budgets(pairs: list[str]) -> dict[str, float]:
    """--budget-default KEY=VALUE pairs, checked (`Budgets.with_run_defaults`): ValueError naming
    the bad pair, key or value."""
    out: dict[str, float] = {}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not sep:
            raise ValueError(f"--budget-default {pair!r} is not KEY=VALUE")
        try:
            out[key.strip()] = int(value) if value.strip().lstrip("-").isdigit() else float(value)
        except ValueError:
            raise ValueError(f"--budget-default {pair!r}: {value!r} is not a number") from None
    try:
        Budgets().with_run_defaults(out)
    except BudgetError as exc:
        raise ValueError(f"--budget-default: {exc}") from None
    return out


def configs(args: argparse.Namespace, budgets: dict[str, float],
            subids: tuple[int, int] | None) -> tuple[AgentConfig, RuntimeConfig]:
    """The agent's and the sandbox runtime's configuration from the parsed flags; ValueError
    naming the key when a value is invalid."""
    agent = AgentConfig(slots=args.slots, prefetch=args.prefetch,
                        heartbeat_interval_s=args.heartbeat_interval_s,
                        drain_deadline_s=args.drain_deadline_s, give_up_s=args.give_up_s,
                        image_store=args.image_store, noop_s=args.noop_s, sandbox=args.sandbox,
                        warm_pool=args.warm_pool, run_budgets=budgets)
    return agent, RuntimeConfig(subids=subids, degrade=args.degrade)


def run(args: argparse.Namespace, ap: argparse.ArgumentParser | None = None) -> int:
    if args.noop_s is None and not args.image_store:
        return _usage(ap, "--image-store is required (unless --noop-s)")
    try:
        budgets = run_budgets(args.budget_default)
    except ValueError as exc:
        return _usage(ap, str(exc))
    subids = (args.subid_base, args.subid_count) if args.subid_base is not None else None
    try:
        config, runtime_config = configs(args, budgets, subids)
    except ValueError as exc:
        return _usage(ap, str(exc))
    try:
        endpoint, endpoint_file, keys = connection(args)
    except ValueError as exc:
        return _usage(ap, str(exc))
    except KeyFileError as exc:
        print(f"paddock agent: {exc}", file=sys.stderr)
        return 2
    logging.basicConfig(level=args.log_level.upper(),
                        format=f"%(asctime)s {args.node} %(name)s %(levelname)s %(message)s")
    if args.subid_share is not None:
        try:
            runtime_config = RuntimeConfig(subids=share_of_subids(*args.subid_share), degrade=args.degrade)
        except SandboxError as exc:
            print(f"paddock agent: {exc}", file=sys.stderr)
            return 2
    return serve(args.node, endpoint, args.deployment, config, runtime_config=runtime_config,
                 keys=keys, insecure=args.insecure, endpoint_file=endpoint_file)


def register(subparsers) -> None:
    """Add `paddock agent` to the `paddock` command's subparsers."""
    ap = subparsers.add_parser("agent", help="run a node agent", description="Run a node agent.")
    add_arguments(ap)
    ap.set_defaults(func=lambda args: run(args, ap))


def main(argv: list[str] | None = None) -> int:
    """`paddock agent` on its own (the Slurm job step calls this with its arguments)."""
    ap = argparse.ArgumentParser(prog="paddock agent", description="Run a node agent.")
    add_arguments(ap)
    args = ap.parse_args(argv)
    return run(args, ap)


if __name__ == "__main__":
    sys.exit(main())
