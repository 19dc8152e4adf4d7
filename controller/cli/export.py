"""`paddock export --run DIR --format hf|verifiers [--out PATH]`: a run's committed model calls as
token-level training samples (controller/analysis/export.py; docs/trainers.md).

Thin: parses arguments and calls the export module. Must not import: zmq, nodeagent.
"""
from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

from controller.analysis.export import FORMATS, STALENESS_RULES, ExportError, write
from controller.analysis.query import QueryError, require_run

_SUFFIX = {"hf": ".parquet", "verifiers": ".jsonl"}


def cmd_export(args: argparse.Namespace) -> int:
    out = Path(args.out) if args.out else Path(args.run) / "export" / f"{args.format}{_SUFFIX[args.format]}"
    t0 = time.monotonic()
    try:
        require_run(args.run)
        if not args.out:
            out.parent.mkdir(exist_ok=True)       # the default: DIR/export/, inside the run
        stats = write(args.run, args.format, out, max_staleness=args.max_staleness,
                      current_version=args.current_version, staleness=args.staleness)
    except (ExportError, QueryError) as exc:
        print(f"paddock export: {exc}", file=sys.stderr)
        return 2
    print(json.dumps({"out": str(out), "seconds": round(time.monotonic() - t0, 3), **vars(stats)}))
    return 0


def register(sub: argparse._SubParsersAction) -> None:
    """Add `paddock export`."""
    p = sub.add_parser("export", help="write a run's model calls as training samples for a trainer")
    p.add_argument("--run", required=True, metavar="DIR", help="the run directory")
    p.add_argument("--format", required=True, choices=FORMATS,
                   help="hf: Parquet for Hugging Face datasets; verifiers: JSON Lines, verifiers/prime-rl schema")
    p.add_argument("--out", "-o", metavar="PATH", help="output file, in an existing directory "
                                                       "(default DIR/export/<format>.parquet|.jsonl)")
    p.add_argument("--max-staleness", type=int, metavar="N",
                   help="versions a call may lag behind --current-version (default: no limit)")
    p.add_argument("--current-version", type=int, metavar="V", help="default: the newest version in the run")
    p.add_argument("--staleness", choices=STALENESS_RULES, default="per_rollout",
                   help="drop stale samples (per_rollout) or mask stale calls' tokens (per_call)")
    p.set_defaults(func=cmd_export)
