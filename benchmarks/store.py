"""Trajectory store: ingest rate into Parquet and the canned report queries, Paddock vs raw.

One run, side by side:
- ingest (bulk): `trajwriter.write_batch` (column-wise schema checks, zstd, fsync, atomic
  rename) vs bare `pyarrow.parquet.write_table` of the same Arrow tables, for 1,000,000
  rollouts with 10,000,000 steps and 10,000,000 spans; steps/s of each and the ratio;
- ingest (per attempt): `trajwriter.write_attempt` (five shards per attempt, row checks,
  fsync) on a sample of attempts, steps/s (what one node agent sustains);
- compaction (`controller.store.catalog.compact`): the bulk shards, once every key in them is
  committed, are checked against the catalog and promoted to compacted files (hard link, no
  copy) with an HDR summary per spans file;
- the canned report queries of `controller.analysis.report` over `controller.analysis.query.connect` (committed
  rows only, bad-shard checks, HDR summaries) vs the same SQL on bare `read_parquet` with no
  commit filter and percentiles from every span row; median and p99 over --repeat runs, and
  the ratio of medians.

    .venv/bin/python benchmarks/store.py [--rollouts 1000000] [--steps-per 10] [--repeat 5]
"""
from __future__ import annotations

import argparse
import shutil
import statistics
import tempfile
import time
from datetime import datetime, timedelta, timezone
from pathlib import Path

import duckdb
import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from controller.analysis import report
from controller.analysis.query import connect
from controller.contracts.trajectory import SCHEMAS
from controller.store.catalog import CATALOG_SCHEMA, compact
from nodeagent.store.writer import write_attempt, write_batch

T0 = datetime(2026, 1, 1, tzinfo=timezone.utc)
FAMILIES = np.array(["python", "math", "swe"])
NODES = np.array([f"node-{i:02d}" for i in range(16)])
KINDS = np.array(["model_call", "tool_call", "sandbox_start", "verification"])


def pct(xs, q):
    xs = sorted(xs)
    return xs[min(int(q * len(xs)), len(xs) - 1)]


def chunk_tables(lo: int, hi: int, steps_per: int, rng: np.random.Generator) -> dict[str, pa.Table]:
    """Rollouts lo..hi-1 with their steps and spans (one span per step) as Arrow tables."""
    n = hi - lo
    idx = np.arange(lo, hi)
    rid = pa.array([f"r{i:08d}" for i in idx])
    version = (idx * 8 // max(hi, 1)).astype(np.int32) % 8
    task = rng.integers(0, 5000, n)
    p_pass = 0.2 + 0.08 * version
    outcome = np.where(rng.random(n) < p_pass, "pass", "fail").astype(object)
    outcome[rng.random(n) < 0.002] = "infra_error"
    reward = np.where(outcome == "pass", 1.0, 0.0)
    node = NODES[idx % len(NODES)]
    started = pa.array([T0] * n, pa.timestamp("us", tz="UTC"))
    rollouts = pa.table({
        "run_id": pa.array(["bench"] * n), "rollout_id": rid, "attempt": np.ones(n, np.int32),
        "fencing_token": np.ones(n, np.int64), "batch_id": pa.array(["b"] * n),
        "task_id": pa.array([f"sha256:{t:08x}" for t in task]),
        "task_name": pa.array([f"task/{t}" for t in task]),
        "task_family": FAMILIES[task % 3], "taskset_hash": pa.array(["sha256:set"] * n),
        "image_digest": pa.array(["sha256:img"] * n), "verifier_version": pa.array(["v1"] * n),
        "policy_version": version, "seed": idx.astype(np.int64), "node": node,
        "outcome": outcome,
        "reward": pa.array(np.where(outcome == "infra_error", np.nan, reward), from_pandas=True),
        "reward_components": pa.array(["{}"] * n), "tampered": rng.random(n) < 0.001,
        "infra_reason": pa.array(np.where(outcome == "infra_error", "sandbox_start: x", None)),
        "started_at": started, "finished_at": started, "wall_s": rng.gamma(2.0, 5.0, n),
        "agent_s": rng.gamma(2.0, 4.0, n), "verify_s": rng.gamma(2.0, 1.0, n),
        "steps": np.full(n, steps_per, np.int32), "prompt_tokens": np.full(n, 1000, np.int64),
        "completion_tokens": np.full(n, 200, np.int64),
        "limits": pa.array(['{"memory_mb":256}'] * n), "answer": pa.array(["done"] * n),
        "diff_bytes": rng.integers(0, 4000, n).astype(np.int64),
    })
    m = n * steps_per
    srid = pa.array(np.repeat(np.asarray(rid.to_pylist(), dtype=object), steps_per), pa.string())
    step = np.tile(np.arange(steps_per, dtype=np.int32), n)
    keys = {"run_id": pa.array(["bench"] * m), "rollout_id": srid,
            "attempt": np.ones(m, np.int32), "fencing_token": np.ones(m, np.int64)}
    sver = np.repeat(version, steps_per)
    steps = pa.table({**keys, "step": step, "role": pa.array(["assistant"] * m),
                      "content": pa.array(["run the tests"] * m),
                      "tool_name": pa.array(["shell"] * m),
                      "tool_args": pa.array(['{"cmd":"pytest -q"}'] * m),
                      "observation": pa.array(["1 passed"] * m), "exit_code": np.zeros(m, np.int32),
                      "started_at": pa.array([T0] * m, pa.timestamp("us", tz="UTC")),
                      "wall_s": rng.gamma(2.0, 0.5, m), "model_s": rng.gamma(2.0, 0.3, m),
                      "tool_s": rng.gamma(2.0, 0.2, m),
                      "prompt_tokens": np.full(m, 100, np.int64),
                      "completion_tokens": np.full(m, 20, np.int64), "policy_version": sver})
    spans = pa.table({**keys, "kind": KINDS[rng.integers(0, 4, m)], "step": step,
                      "start_s": np.zeros(m), "duration_s": rng.gamma(2.0, 0.2, m),
                      "node": np.repeat(node, steps_per), "policy_version": sver})
    catalog = pa.table({"rollout_id": rid, "attempt": np.ones(n, np.int32),
                        "fencing_token": np.ones(n, np.int64),
                        **{c: pa.nulls(n, pa.string()) for c in CATALOG_SCHEMA.names
                           if c.endswith("_shard")},
                        "committed_at": pa.array([T0] * n, pa.timestamp("us", tz="UTC"))})
    return {"rollouts": rollouts, "steps": steps, "spans": spans,
            "catalog": catalog.select(CATALOG_SCHEMA.names).cast(CATALOG_SCHEMA)}


def ingest(root: Path, rollouts: int, steps_per: int, chunk: int) -> tuple[float, float, int]:
    """Bulk-ingest into root/paddock (write_batch) and root/raw (pq.write_table).

    Returns (paddock seconds, raw seconds, steps)."""
    rng = np.random.default_rng(1)
    t_pad = t_raw = 0.0
    for d in ("paddock", "raw"):
        for t in ("rollouts", "steps", "spans", "catalog"):
            (root / d / t).mkdir(parents=True, exist_ok=True)
    for i, lo in enumerate(range(0, rollouts, chunk)):
        tables = chunk_tables(lo, min(lo + chunk, rollouts), steps_per, rng)
        name = f"bulk-{i:04d}.parquet"
        t = time.perf_counter()
        for table in ("rollouts", "steps", "spans"):
            write_batch(root / "paddock", table, tables[table], name)
        t_pad += time.perf_counter() - t
        t = time.perf_counter()
        for table in ("rollouts", "steps", "spans"):
            pq.write_table(tables[table], root / "raw" / table / name, compression="zstd")
        t_raw += time.perf_counter() - t
        pq.write_table(tables["catalog"], root / "paddock" / "catalog" / f"commit-{i:06d}.parquet")
    return t_pad, t_raw, rollouts * steps_per


def per_attempt_rate(root: Path, attempts: int, steps_per: int) -> float:
    run = root / "per-attempt"
    steps = [{"step": i, "role": "assistant", "content": "run the tests", "tool_name": "shell",
              "tool_args": {"cmd": "pytest -q"}, "observation": "1 passed", "exit_code": 0,
              "started_at": T0, "wall_s": 0.5, "model_s": 0.3, "tool_s": 0.2,
              "prompt_tokens": 100, "completion_tokens": 20, "logprobs": None}
             for i in range(steps_per)]
    t = time.perf_counter()
    for i in range(attempts):
        row = dict(run_id="bench", rollout_id=f"r{i}", attempt=1, fencing_token=1, batch_id="b",
                   task_id="sha256:t", task_name="t", task_family="python",
                   taskset_hash="sha256:set", image_digest="sha256:img", verifier_version="v1",
                   policy_version=0, seed=i, node="n1", outcome="pass", reward=1.0,
                   reward_components={}, tampered=False, infra_reason=None, started_at=T0,
                   finished_at=T0 + timedelta(seconds=1), wall_s=1.0, agent_s=0.8,
                   verify_s=0.2, steps=steps_per, prompt_tokens=1000, completion_tokens=200,
                   limits={"memory_mb": 256}, answer="done", diff_bytes=100)
        write_attempt(run, "n1", row, steps, [], spans=[], egress=[])
    return attempts * steps_per / (time.perf_counter() - t)


QUERIES = {
    "pass_rates": lambda con, cfg: report.pass_rates(con),
    "band_occupancy": report.band_occupancy,
    "hack_suspects": report.hack_suspects,
    "infra_by_node": lambda con, cfg: report.infra_by_node(con),
    "span_percentiles": lambda con, cfg: report.span_percentiles(con),
}


def raw_connection(raw: Path) -> duckdb.DuckDBPyConnection:
    """The reference: bare read_parquet views, no commit filter, no shard checks."""
    con = duckdb.connect(":memory:")
    for t in ("rollouts", "steps", "spans"):
        con.execute(f"CREATE VIEW {t} AS SELECT * FROM read_parquet('{raw}/{t}/*.parquet')")
    con.register("_empty_checks", SCHEMAS["checks"].empty_table())
    con.execute("CREATE VIEW checks AS SELECT * FROM _empty_checks")
    con.execute("CREATE VIEW infra_attempts AS SELECT node, infra_reason, TRUE AS committed "
                "FROM rollouts WHERE outcome = 'infra_error'")
    con.register("_span_summaries", pa.table({"path": pa.array([], pa.string())}))
    con.execute("CREATE VIEW _spans_rest AS SELECT * FROM spans")
    return con


def time_queries(make_con, repeat: int) -> dict[str, list[float]]:
    cfg = report.ReportConfig()
    out: dict[str, list[float]] = {q: [] for q in QUERIES}
    for _ in range(repeat):
        con = make_con()
        for name, fn in QUERIES.items():
            t = time.perf_counter()
            fn(con, cfg)
            out[name].append(time.perf_counter() - t)
        con.close()
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rollouts", type=int, default=1_000_000)
    ap.add_argument("--steps-per", type=int, default=10)
    ap.add_argument("--chunk", type=int, default=100_000, help="rollouts per shard")
    ap.add_argument("--repeat", type=int, default=5)
    ap.add_argument("--attempts", type=int, default=300, help="per-attempt writes to time")
    ap.add_argument("--dir", help="work directory (default: a temp dir, removed after)")
    args = ap.parse_args()
    root = Path(args.dir or tempfile.mkdtemp(prefix="paddock-store-bench-"))
    try:
        t_pad, t_raw, steps = ingest(root, args.rollouts, args.steps_per, args.chunk)
        print(f"ingest (bulk, {args.rollouts} rollouts, {steps} steps + {steps} spans):")
        print(f"  paddock write_batch : {steps / t_pad:12,.0f} steps/s ({t_pad:.1f} s)")
        print(f"  raw pq.write_table  : {steps / t_raw:12,.0f} steps/s ({t_raw:.1f} s)")
        print(f"  ratio paddock/raw   : {t_pad / t_raw:.2f}x time  (goal >= 100,000 steps/s)")
        rate = per_attempt_rate(root, args.attempts, args.steps_per)
        print(f"ingest (per attempt, write_attempt, 5 fsynced shards): {rate:,.0f} steps/s "
              f"over {args.attempts} attempts")
        t = time.perf_counter()
        result = compact(root / "paddock")
        t_compact = time.perf_counter() - t
        print(f"compaction: {result.sources} shards -> {result.targets} compacted files, "
              f"{result.rows:,} rows checked against the catalog in {t_compact:.1f} s")
        pad = time_queries(lambda: connect(root / "paddock"), args.repeat)
        raw = time_queries(lambda: raw_connection(root / "raw"), args.repeat)
        t = time.perf_counter()
        connect(root / "paddock").close()
        print(f"connect (list + check shards, catalog views): {time.perf_counter() - t:.3f} s")
        print(f"canned queries over {args.rollouts} rollouts / {steps} steps ({args.repeat} runs):")
        print(f"  {'query':18} {'paddock p50':>12} {'p99':>8} {'raw p50':>9} {'p99':>8} {'ratio':>6}")
        for name in QUERIES:
            p50, r50 = statistics.median(pad[name]), statistics.median(raw[name])
            print(f"  {name:18} {p50:11.3f}s {pct(pad[name], 0.99):7.3f}s {r50:8.3f}s "
                  f"{pct(raw[name], 0.99):7.3f}s {p50 / r50:5.2f}x")
        print("  goal: each canned query < 1 s")
    finally:
        if not args.dir:
            shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    main()
