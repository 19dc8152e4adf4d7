"""The analyst's commands: `paddock query`, `compact`, `report`, `replay`, `rescore`.

  paddock query [--run DIR] [--format table|csv|json] SQL    DuckDB over committed rows (read-only)
  paddock query [--run DIR] --allow-write "COPY (...) TO 'x.csv'"  a COPY into the current directory
  paddock query [--run DIR] --export FILE.duckdb             a snapshot, for your own DuckDB
  paddock compact --run DIR                                  merge a run's small shards
  paddock report [--run DIR] [--html FILE] [--json]          the canned report
  paddock replay ROLLOUT_ID --run DIR                        re-execute one rollout from its record
  paddock rescore --run DIR                                  re-grade stored changes and answers

Thin: parses arguments, calls controller.analysis and controller.store.catalog with plain
arguments. Operating errors print one line to stderr and exit 2.

Must not import: zmq, controller.broker.
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import TextIO

from controller.analysis.query import (
    FORMATS,
    QueryError,
    bad_shards,
    connect,
    export,
    newest_run,
    query_command,
    run_query,
)
from controller.analysis.replay import ReplayError, replay
from controller.analysis.report import write_report
from controller.analysis.rescore import RescoreError, rescore_run
from controller.store.catalog import CatalogError, compact
from layers.builtin import default_store_root, ensure_builtin_image
from layers.store import ImageStore, ImageStoreError
from nodeagent.agent.replay import reexecute
from nodeagent.sandbox.runtime import SandboxError, SandboxRuntime
from nodeagent.verifier.grade import VERIFIER_VERSION
from nodeagent.verifier.rescore import regrade

RUN_HELP = "run directory (or a directory of runs); default: newest under ./runs"


def register(subparsers: argparse._SubParsersAction) -> None:
    """Add `paddock query`, `compact`, `report`, `replay` and `rescore`."""
    add_query_commands(subparsers)
    add_report_command(subparsers)
    add_replay_command(subparsers)
    add_rescore_command(subparsers)


def add_query_commands(subparsers: argparse._SubParsersAction) -> None:
    """`paddock query [--run DIR] [--format table|csv|json] SQL` and `paddock compact`."""
    p = subparsers.add_parser(
        "query", help="run SQL over a run's committed trajectories (DuckDB)",
        description="Views: rollouts, steps, checks, spans, egress, catalog (committed rows "
                    "only), infra_attempts (every infra_error attempt), bad_shards. "
                    f"Example: {query_command('runs/<run_id>')}")
    p.add_argument("--run", metavar="DIR", default=None, help=RUN_HELP)
    p.add_argument("--format", choices=FORMATS, default="table", help="output format")
    p.add_argument("--export", metavar="FILE.duckdb",
                   help="instead of a query: write a DuckDB database holding a copy of every view's "
                        "rows (open it with your own DuckDB: `duckdb FILE`); it does not depend on "
                        "the run directory afterwards")
    p.add_argument("--allow-write", action="store_true",
                   help="let COPY ... TO and EXPORT DATABASE write files into the current directory "
                        "(otherwise only SELECT and EXPLAIN run; nothing is ever written elsewhere)")
    p.add_argument("sql", nargs="?", help="the SQL query")
    p.set_defaults(func=cmd_query)
    c = subparsers.add_parser(
        "compact", help="merge a run's small committed shards (no row lost or duplicated)")
    c.add_argument("--run", metavar="DIR", required=True, help="run directory")
    c.add_argument("--max-shard-bytes", type=int, default=1 << 20,
                   help="only shards up to this size are merged (default 1 MiB)")
    c.set_defaults(func=cmd_compact)


def add_report_command(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser("report", help="canned analyst report over a run (text, JSON, HTML)")
    p.add_argument("--run", metavar="DIR", default=None, help=RUN_HELP)
    p.add_argument("--html", metavar="FILE", help="also write an HTML report with plots")
    p.add_argument("--json", action="store_true", help="print the report as JSON")
    p.add_argument("--band", nargs=2, type=float, metavar=("LOW", "HIGH"), default=None,
                   help="learning band (default: the run's curriculum band)")
    p.add_argument("--k", type=_ks, metavar="K[,K...]", default=None,
                   help="the k of pass@k, any positive integers (default 1,5,10)")
    p.set_defaults(func=cmd_report)


def _ks(text: str) -> tuple[int, ...]:
    """`1,2,20` -> (1, 2, 20): positive integers, each at most 1,000,000."""
    try:
        ks = tuple(sorted({int(x) for x in text.split(",") if x.strip()}))
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r}: give positive integers, e.g. 1,2,20") from None
    if not ks or not all(1 <= k <= 1_000_000 for k in ks):
        raise argparse.ArgumentTypeError(f"{text!r}: each k must be from 1 to 1000000")
    return ks


def add_replay_command(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser("replay", help="re-execute a rollout from its record and check the verdict",
                              description="Feeds the recorded model outputs to the harness, re-runs the tools "
                                          "in a fresh sandbox and the verifier, and compares verdicts.")
    p.add_argument("rollout_id")
    p.add_argument("--run", required=True, metavar="DIR", help="the run directory")
    p.add_argument("--image-store", default=None, help="image store (default: the run's, else the default)")
    p.set_defaults(func=cmd_replay)


def add_rescore_command(subparsers: argparse._SubParsersAction) -> None:
    rs = subparsers.add_parser("rescore", help="re-grade a run's stored trajectories with this verifier")
    rs.add_argument("--run", required=True, metavar="DIR", help="the run directory")
    rs.add_argument("--image-store", help="image store root (default: the built-in store)")
    rs.add_argument("--workers", type=int, default=2, help="parallel verifications (default 2)")
    rs.set_defaults(func=cmd_rescore)


# -- query, compact -------------------------------------------------------------------------

def cmd_query(args: argparse.Namespace, out: TextIO | None = None,
              err: TextIO | None = None) -> int:
    """Entry point of `paddock query`: 0 on success, 2 on bad SQL or a missing run."""
    err = sys.stderr if err is None else err
    try:
        run_dir = Path(args.run) if args.run else newest_run()
        if getattr(args, "export", None):
            if args.sql:
                raise QueryError("give either SQL or --export FILE, not both")
            print(f"wrote {export(run_dir, args.export)} (views of {run_dir}); open it with DuckDB, "
                  f"e.g. duckdb.connect({str(args.export)!r}, read_only=True)", file=out or sys.stdout)
            return 0
        if not args.sql:
            raise QueryError("give the SQL query (or --export FILE)")
        con = connect(run_dir)
        for file, error in bad_shards(con):
            print(f"paddock query: warning: skipped {file}: {error}", file=err)
        con.close()
        run_query(run_dir, args.sql, fmt=args.format, out=out, allow_write=getattr(args, "allow_write", False))
    except QueryError as exc:
        print(f"paddock query: error: {exc}", file=err)
        return 2
    return 0


def cmd_compact(args: argparse.Namespace, out: TextIO | None = None) -> int:
    try:
        r = compact(args.run, max_shard_bytes=args.max_shard_bytes)
    except (CatalogError, OSError) as exc:
        print(f"paddock compact: error: {exc}", file=sys.stderr)
        return 2
    print(f"compacted {r.sources} shards into {r.targets} files ({r.rows} rows); "
          f"finished {r.recovered} interrupted compactions"
          + (f"; left {r.deferred} compactions' sources for open readers (the next compact removes them)"
             if r.deferred else ""), file=out or sys.stdout)
    return 0


# -- report, replay, rescore ----------------------------------------------------------------

def cmd_report(args: argparse.Namespace, out: TextIO | None = None) -> int:
    band = tuple(args.band) if args.band is not None else None
    return write_report(args.run, out or sys.stdout, html_path=args.html, as_json=args.json, band=band,
                        ks=getattr(args, "k", None))


def cmd_replay(args: argparse.Namespace, out: TextIO | None = None) -> int:
    """0: same verdict; 1: a different verdict; 2: the rollout cannot be replayed."""
    out = out or sys.stdout
    try:
        report = replay(args.run, args.rollout_id, reexecute, image_store=args.image_store)
    except ReplayError as exc:
        print(f"paddock replay: error: {exc}", file=sys.stderr)
        return 2
    print(report.line(), file=out)
    return 0 if report.same_verdict else 1


def cmd_rescore(args: argparse.Namespace, out: TextIO | None = None) -> int:
    out = out or sys.stdout
    store = ImageStore(args.image_store or default_store_root())

    def image_for(digest: str) -> Path:
        try:
            return Path(store.resolve(digest))
        except (ImageStoreError, OSError, ValueError):
            return Path(ensure_builtin_image(store)[1])
    try:
        with SandboxRuntime() as rt:
            path, rows = rescore_run(args.run, regrade, VERIFIER_VERSION, rt, image_for, args.workers)
    except (RescoreError, SandboxError) as exc:
        print(f"paddock rescore: {exc}", file=sys.stderr)
        return 2
    changed = [r for r in rows if r["rescored"] and r["outcome"] != r["stored_outcome"]]
    print(f"re-scored {sum(r['rescored'] for r in rows)}/{len(rows)} rollouts into {path}", file=out)
    print(f"outcome changed for {len(changed)}" + "".join(
        f"\n  {r['rollout_id']} {r['task_name']}: {r['stored_outcome']} -> {r['outcome']}"
        + (f" ({r['infra_reason']})" if r["infra_reason"] else "") for r in changed[:20]), file=out)
    return 0
