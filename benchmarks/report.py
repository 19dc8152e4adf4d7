"""`paddock report` at scale: build a store of N rollouts with benchmarks/store.py's generator
(10 steps and 10 spans each, committed, then compacted as a run with the default
--compact-every is), and time `build_report` plus the text and HTML rendering.

    .venv/bin/python benchmarks/report.py [--rollouts 1000000] [--repeat 3] [--dir DIR]

Goal: <= 5 s for 1,000,000 rollouts. Must not import zmq.
"""
from __future__ import annotations

import argparse
import io
import shutil
import statistics
import tempfile
import time
from pathlib import Path

import numpy as np
import pyarrow.parquet as pq

from benchmarks.store import chunk_tables
from controller.analysis.report import build_report
from controller.analysis.report_render import print_text, render_html
from controller.store.catalog import compact
from nodeagent.store.writer import write_batch


def build_store(root: Path, rollouts: int, steps_per: int = 10, chunk: int = 100_000) -> None:
    rng = np.random.default_rng(1)
    for table in ("rollouts", "steps", "spans", "catalog"):
        (root / table).mkdir(parents=True, exist_ok=True)
    for i, lo in enumerate(range(0, rollouts, chunk)):
        tables = chunk_tables(lo, min(lo + chunk, rollouts), steps_per, rng)
        for table in ("rollouts", "steps", "spans"):
            write_batch(root, table, tables[table], f"bulk-{i:04d}.parquet")
        pq.write_table(tables["catalog"], root / "catalog" / f"commit-{i:06d}.parquet")
    compact(root)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rollouts", type=int, default=1_000_000)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--dir", help="store directory (kept; reused if it holds a store)")
    args = ap.parse_args()
    root = Path(args.dir or tempfile.mkdtemp(prefix="paddock-report-bench-"))
    try:
        if not (root / "rollouts").is_dir():
            t = time.perf_counter()
            build_store(root, args.rollouts)
            print(f"store: {args.rollouts:,} rollouts built and compacted in "
                  f"{time.perf_counter() - t:.1f} s")
        times = []
        for _ in range(args.repeat):
            t = time.perf_counter()
            rep = build_report(root)
            render_html(rep)
            print_text(rep, io.StringIO())
            times.append(time.perf_counter() - t)
        print(f"report (build + text + HTML) over {args.rollouts:,} rollouts: median "
              f"{statistics.median(times):.2f} s, max {max(times):.2f} s over {args.repeat} runs "
              f"(goal <= 5 s)")
    finally:
        if not args.dir:
            shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    main()
