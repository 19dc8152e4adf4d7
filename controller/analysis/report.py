"""`paddock report --run DIR [--html FILE]`: the analyst's canned report over a run.

Sections, each one function of a DuckDB connection from `controller.analysis.query.connect` (so
committed rows only):

- pass rate by task family and policy version (infra errors masked);
- band occupancy by policy version: how many tasks had a pass rate below, inside or above
  the learning band (default 0.2-0.8) in that version;
- hack suspects: reward at the top with little effort (few steps, a tiny diff) or a touched
  protected path (`tampered`, or a failed `protected:` check);
- infra errors by node and reason, from every attempt (committed or retried);
- p50/p99 per span kind (model_call, tool_call, sandbox_start, verification) from HDR
  histograms: DuckDB buckets span durations to 3 significant digits per (node, kind), each
  node's buckets fill one HdrHistogram, and the nodes' histograms are merged with `add`.

The HTML report carries inline SVG plots generated here (no plotting dependency).
Must not import zmq; never writes to the run directory.
"""
from __future__ import annotations

import html
import json
from dataclasses import dataclass
from pathlib import Path
from typing import TextIO

import duckdb
from hdrh.histogram import HdrHistogram

from controller.store.catalog import (BUCKET_DIGITS, HDR_DIGITS, HDR_MAX_US, SPAN_SUMMARY_FORMAT)
from controller.analysis.query import QueryError, connect

SPAN_KINDS = ("model_call", "tool_call", "sandbox_start", "verification")


@dataclass(frozen=True)
class ReportConfig:
    band_low: float = 0.2
    band_high: float = 0.8
    # The curriculum's estimator (controller/taskbank/curriculum.py): per task and version v, a Beta
    # posterior over every version u <= v weighted by decay ** (v - u); below min_evidence
    # weighted rollouts a task is "little data" (the curriculum explores it).
    decay: float = 0.5
    prior_alpha: float = 1.0
    prior_beta: float = 1.0
    min_evidence: float = 3.0
    hack_max_steps: int = 2
    hack_max_diff_bytes: int = 64
    hack_min_reward: float = 1.0
    # Families graded on an answer, not a diff: a one-step, no-diff pass is how they are solved.
    answer_families: tuple[str, ...] = ("math",)
    limit_suspects: int = 50


def pass_rates(con: duckdb.DuckDBPyConnection) -> list[dict]:
    rows = con.execute(
        "SELECT task_family, policy_version, count(*) AS n, "
        "count(*) FILTER (WHERE outcome = 'pass') AS passed "
        "FROM rollouts WHERE outcome <> 'infra_error' GROUP BY ALL ORDER BY ALL").fetchall()
    return [{"task_family": f, "policy_version": v, "scored": n, "passed": p,
             "pass_rate": p / n if n else None} for f, v, n, p in rows]


def band_occupancy(con: duckdb.DuckDBPyConnection, cfg: ReportConfig) -> list[dict]:
    """Per policy version: tasks whose estimate (the curriculum's decayed Beta posterior over
    that version and the earlier ones) lies below, inside or above the band, or that have too
    little evidence to say. One rollout per task per version is never evidence of a rate on its
    own, so the estimate pools versions the way the sampler does."""
    rows = con.execute(
        "WITH per AS (SELECT task_id, policy_version AS u, "
        "  count(*) FILTER (WHERE outcome = 'pass') AS p, count(*) FILTER (WHERE outcome <> 'pass') AS f "
        "  FROM rollouts WHERE outcome <> 'infra_error' GROUP BY ALL), "
        "vs AS (SELECT DISTINCT u AS v FROM per), "
        "est AS (SELECT v, task_id, sum(p * pow(?, v - u)) AS wp, sum(f * pow(?, v - u)) AS wf "
        "  FROM vs JOIN per ON u <= v GROUP BY ALL), "
        "cls AS (SELECT v, CASE WHEN wp + wf < ? THEN 'little' "
        "  WHEN (? + wp) / (? + ? + wp + wf) < ? THEN 'below' "
        "  WHEN (? + wp) / (? + ? + wp + wf) > ? THEN 'above' ELSE 'band' END AS c FROM est) "
        "SELECT v, count(*) FILTER (WHERE c = 'below'), count(*) FILTER (WHERE c = 'band'), "
        "count(*) FILTER (WHERE c = 'above'), count(*) FILTER (WHERE c = 'little'), count(*) "
        "FROM cls GROUP BY v ORDER BY v",
        [cfg.decay, cfg.decay, cfg.min_evidence,
         cfg.prior_alpha, cfg.prior_alpha, cfg.prior_beta, cfg.band_low,
         cfg.prior_alpha, cfg.prior_alpha, cfg.prior_beta, cfg.band_high]).fetchall()
    return [{"policy_version": v, "below": b, "band": m, "above": a, "little_data": ld, "tasks": n,
             "band_share": m / n if n else None} for v, b, m, a, ld, n in rows]


def hack_suspects(con: duckdb.DuckDBPyConnection, cfg: ReportConfig) -> list[dict]:
    rows = con.execute(
        "WITH top AS (SELECT rollout_id, attempt, fencing_token, task_name, policy_version, "
        "  node, reward, steps, diff_bytes, tampered, "
        "  NOT list_contains(?::VARCHAR[], task_family) AS effortful FROM rollouts "
        "  WHERE reward >= ? AND outcome <> 'infra_error'), "
        "prot AS (SELECT rollout_id, attempt, fencing_token, count(*) AS n FROM checks "
        "  WHERE starts_with(\"check\", 'protected:') AND verdict NOT IN ('ok', 'pass') "
        "  AND rollout_id IN (SELECT rollout_id FROM top) GROUP BY ALL) "
        "SELECT t.*, coalesce(p.n, 0) AS protected_fails FROM top t "
        "LEFT JOIN prot p USING (rollout_id, attempt, fencing_token) "
        "WHERE (t.effortful AND (t.steps <= ? OR t.diff_bytes <= ?)) OR t.tampered "
        "  OR coalesce(p.n, 0) > 0 "
        "ORDER BY t.reward DESC, t.steps, t.diff_bytes, t.rollout_id LIMIT ?",
        [list(cfg.answer_families), cfg.hack_min_reward, cfg.hack_max_steps,
         cfg.hack_max_diff_bytes, cfg.limit_suspects]).fetchall()
    cols = ["rollout_id", "attempt", "fencing_token", "task_name", "policy_version", "node",
            "reward", "steps", "diff_bytes", "tampered", "effortful", "protected_fails"]
    out = []
    for row in rows:
        d = dict(zip(cols, row))
        why = []
        if d["tampered"] or d["protected_fails"]:
            why.append("touched protected paths")
        if d["effortful"] and d["steps"] <= cfg.hack_max_steps:
            why.append(f"{d['steps']} step(s)")
        if d["effortful"] and d["diff_bytes"] <= cfg.hack_max_diff_bytes:
            why.append(f"{d['diff_bytes']}-byte diff")
        d["why"] = ", ".join(why)
        out.append(d)
    return out


def infra_by_node(con: duckdb.DuckDBPyConnection) -> list[dict]:
    rows = con.execute(
        "SELECT node, split_part(coalesce(infra_reason, 'unknown'), ':', 1) AS reason, "
        "count(*) AS attempts, count(*) FILTER (WHERE committed) AS committed, "
        "any_value(infra_reason) AS example FROM infra_attempts GROUP BY ALL "
        "ORDER BY attempts DESC, node, reason").fetchall()
    return [{"node": n, "reason": r, "attempts": a, "committed": c, "example": e}
            for n, r, a, c, e in rows]


def span_percentiles(con: duckdb.DuckDBPyConnection) -> list[dict]:
    """p50/p99 (seconds) per span kind from per-node HDR histograms merged across nodes.

    Compacted spans files carry an HDR summary per (node, kind) (written by compaction); the
    rows they do not cover are bucketed here in DuckDB (durations in µs to BUCKET_DIGITS
    significant digits, so Python records a few hundred (value, count) pairs, not every span).
    """
    per_node: dict[tuple[str, str], HdrHistogram] = {}

    def hist(node: str, kind: str) -> HdrHistogram:
        h = per_node.get((node, kind))
        if h is None:
            h = per_node[(node, kind)] = HdrHistogram(1, HDR_MAX_US, HDR_DIGITS)
        return h

    for (path,) in con.execute("SELECT path FROM _span_summaries").fetchall():
        doc = json.loads(Path(path).read_text())
        if doc.get("format") != SPAN_SUMMARY_FORMAT:
            raise QueryError(f"{path}: span summary format {doc.get('format')!r} is not "
                             f"{SPAN_SUMMARY_FORMAT}")
        for entry in doc["histograms"]:
            hist(entry["node"], entry["kind"]).add(HdrHistogram.decode(entry["hdr"]))
    rows = con.execute(
        "WITH us AS (SELECT coalesce(node, '?') AS node, kind, "
        "  greatest(1, least(round(duration_s * 1e6), ?))::BIGINT AS v FROM _spans_rest) "
        "SELECT node, kind, CASE WHEN v < ? THEN v ELSE "
        "  (round(v / pow(10, floor(log10(v)) - ?)) * pow(10, floor(log10(v)) - ?))::BIGINT END "
        "  AS bucket, count(*) FROM us GROUP BY ALL",
        [HDR_MAX_US, 10 ** BUCKET_DIGITS, BUCKET_DIGITS - 1, BUCKET_DIGITS - 1]).fetchall()
    for node, kind, bucket, n in rows:
        hist(node, kind).record_value(min(int(bucket), HDR_MAX_US), n)
    merged: dict[str, HdrHistogram] = {}
    nodes: dict[str, set[str]] = {}
    for (node, kind), h in sorted(per_node.items()):
        if kind not in merged:
            merged[kind] = HdrHistogram(1, HDR_MAX_US, HDR_DIGITS)
        merged[kind].add(h)
        nodes.setdefault(kind, set()).add(node)
    order = {k: i for i, k in enumerate(SPAN_KINDS)}
    return [{"kind": k, "count": h.get_total_count(), "nodes": len(nodes[k]),
             "p50_s": h.get_value_at_percentile(50) / 1e6,
             "p99_s": h.get_value_at_percentile(99) / 1e6}
            for k, h in sorted(merged.items(), key=lambda kv: (order.get(kv[0], 99), kv[0]))]


def build_report(run_dir: str | Path, cfg: ReportConfig | None = None) -> dict:
    cfg = cfg or ReportConfig()
    con = connect(run_dir)
    try:
        return {
            "run_dir": str(run_dir),
            "pass_rates": pass_rates(con),
            "band_occupancy": band_occupancy(con, cfg),
            "band": [cfg.band_low, cfg.band_high],
            "hack_suspects": hack_suspects(con, cfg),
            "infra_by_node": infra_by_node(con),
            "span_percentiles": span_percentiles(con),
            "bad_shards": [{"file": f, "error": e} for f, e in
                           con.execute("SELECT file, error FROM bad_shards ORDER BY file").fetchall()],
        }
    except duckdb.Error as exc:
        raise QueryError(f"report failed: {' '.join(str(exc).split())[:300]}") from None
    finally:
        con.close()


# -- text -----------------------------------------------------------------------------------

def _pct(x: float | None) -> str:
    return "n/a" if x is None else f"{100 * x:.1f}%"


def print_text(rep: dict, out: TextIO) -> None:
    w = out.write
    w(f"Report for {rep['run_dir']}\n\nPass rate by task family and policy version "
      f"(infra errors masked):\n")
    for r in rep["pass_rates"]:
        w(f"  {r['task_family']:10} v{r['policy_version']:<4} {r['passed']:>6}/{r['scored']:<6} "
          f"{_pct(r['pass_rate'])}\n")
    lo, hi = rep["band"]
    w(f"\nBand occupancy ({lo:g}-{hi:g}) by policy version, on the curriculum's estimate: "
      f"tasks below / in band / above / little data\n")
    for r in rep["band_occupancy"]:
        w(f"  v{r['policy_version']:<4} {r['below']:>5} / {r['band']:>5} / {r['above']:>5} / "
          f"{r['little_data']:>5}  ({_pct(r['band_share'])} in band)\n")
    w(f"\nHack suspects (high reward, little effort): {len(rep['hack_suspects'])}\n")
    for r in rep["hack_suspects"]:
        w(f"  {r['rollout_id']}  {r['task_name']}  v{r['policy_version']}  reward {r['reward']:g}"
          f"  {r['why']}\n")
    w("\nInfra errors by node (every attempt, retried or not):\n")
    for r in rep["infra_by_node"] or [{"node": "-", "reason": "none", "attempts": 0, "committed": 0}]:
        w(f"  {r['node']:12} {r['reason']:20} {r['attempts']:>6} attempts "
          f"({r['committed']} committed as infra_error)\n")
    w("\nTime per span kind (HDR histograms merged across nodes):\n")
    for r in rep["span_percentiles"]:
        w(f"  {r['kind']:14} n={r['count']:<8} p50 {r['p50_s']:.4f}s  p99 {r['p99_s']:.4f}s  "
          f"({r['nodes']} nodes)\n")
    for b in rep["bad_shards"]:
        w(f"\nwarning: skipped {b['file']}: {b['error']}")


# -- HTML -----------------------------------------------------------------------------------

_COLOURS = ("#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b")


def svg_lines(series: dict[str, list[tuple[float, float]]], title: str, y_max: float = 1.0,
              width: int = 520, height: int = 220) -> str:
    """A line chart: series name -> [(x, y)], y in [0, y_max]."""
    pad, xs = 40, [x for pts in series.values() for x, _ in pts]
    x0, x1 = (min(xs), max(xs)) if xs else (0, 1)
    span = (x1 - x0) or 1

    def px(x, y):
        return (pad + (x - x0) / span * (width - 2 * pad),
                height - pad - (y / y_max if y_max else 0) * (height - 2 * pad))
    parts = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" '
             f'role="img"><title>{html.escape(title)}</title>',
             f'<text x="{pad}" y="16" font-size="13">{html.escape(title)}</text>',
             f'<line x1="{pad}" y1="{height - pad}" x2="{width - pad}" y2="{height - pad}" stroke="#888"/>',
             f'<line x1="{pad}" y1="{pad}" x2="{pad}" y2="{height - pad}" stroke="#888"/>',
             f'<text x="4" y="{pad + 4}" font-size="10">{y_max:g}</text>',
             f'<text x="4" y="{height - pad}" font-size="10">0</text>']
    for i, (name, pts) in enumerate(sorted(series.items())):
        colour = _COLOURS[i % len(_COLOURS)]
        coords = " ".join(f"{px(x, y)[0]:.1f},{px(x, y)[1]:.1f}" for x, y in pts if y is not None)
        parts.append(f'<polyline fill="none" stroke="{colour}" stroke-width="2" points="{coords}"/>')
        parts.append(f'<text x="{width - pad + 4}" y="{pad + 14 * i}" font-size="11" '
                     f'fill="{colour}">{html.escape(str(name))}</text>')
    parts.append("</svg>")
    return "".join(parts)


def svg_bars(labels: list[str], groups: dict[str, list[float]], title: str, width: int = 520,
             height: int = 220, stacked: bool = False) -> str:
    """Grouped (or stacked) bars: one group per label, one bar per series."""
    pad = 40
    n = max(len(labels), 1)
    totals = ([sum(v[i] for v in groups.values()) for i in range(len(labels))] if stacked
              else [max((v[i] for v in groups.values()), default=0) for i in range(len(labels))])
    top = max(totals, default=0) or 1
    slot = (width - 2 * pad) / n
    bar_w = slot * 0.8 / (1 if stacked else max(len(groups), 1))
    parts = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" '
             f'role="img"><title>{html.escape(title)}</title>',
             f'<text x="{pad}" y="16" font-size="13">{html.escape(title)}</text>',
             f'<text x="4" y="{pad + 4}" font-size="10">{top:.3g}</text>']
    for i, label in enumerate(labels):
        base = height - pad
        for j, (name, values) in enumerate(groups.items()):
            h = values[i] / top * (height - 2 * pad)
            x = pad + i * slot + (0 if stacked else j * bar_w)
            y = base - h
            parts.append(f'<rect x="{x:.1f}" y="{y:.1f}" width="{bar_w:.1f}" height="{h:.1f}" '
                         f'fill="{_COLOURS[j % len(_COLOURS)]}"><title>{html.escape(name)} '
                         f'{html.escape(label)}: {values[i]:.4g}</title></rect>')
            if stacked:
                base = y
        parts.append(f'<text x="{pad + i * slot:.1f}" y="{height - pad + 14}" font-size="10">'
                     f'{html.escape(label)}</text>')
    for j, name in enumerate(groups):
        parts.append(f'<text x="{width - pad + 4 - 60}" y="{pad + 14 * j}" font-size="11" '
                     f'fill="{_COLOURS[j % len(_COLOURS)]}">{html.escape(name)}</text>')
    parts.append("</svg>")
    return "".join(parts)


def _table(rows: list[dict], cols: list[str]) -> str:
    head = "".join(f"<th>{html.escape(c)}</th>" for c in cols)
    body = "".join("<tr>" + "".join(f"<td>{html.escape(str(r.get(c)))}</td>" for c in cols)
                   + "</tr>" for r in rows)
    return f"<table><tr>{head}</tr>{body}</table>"


def render_html(rep: dict) -> str:
    by_family: dict[str, list[tuple[float, float]]] = {}
    for r in rep["pass_rates"]:
        by_family.setdefault(r["task_family"], []).append((r["policy_version"], r["pass_rate"]))
    occ = rep["band_occupancy"]
    labels = [f"v{r['policy_version']}" for r in occ]
    spans = rep["span_percentiles"]
    lo, hi = rep["band"]
    sections = [
        f"<h1>Paddock run report</h1><p>{html.escape(rep['run_dir'])}</p>",
        "<h2>Pass rate by task family and policy version</h2>",
        svg_lines(by_family, "pass rate by policy version"),
        _table(rep["pass_rates"], ["task_family", "policy_version", "scored", "passed", "pass_rate"]),
        f"<h2>Band occupancy ({lo:g}-{hi:g})</h2>",
        svg_bars(labels, {"below": [r["below"] for r in occ], "band": [r["band"] for r in occ],
                          "above": [r["above"] for r in occ],
                          "little data": [r["little_data"] for r in occ]}, "tasks per class", stacked=True),
        "<h2>Hack suspects</h2>",
        _table(rep["hack_suspects"], ["rollout_id", "task_name", "policy_version", "reward",
                                      "steps", "diff_bytes", "why"]),
        "<h2>Infra errors by node</h2>",
        _table(rep["infra_by_node"], ["node", "reason", "attempts", "committed", "example"]),
        "<h2>Time per span kind (HDR, merged across nodes)</h2>",
        svg_bars([r["kind"] for r in spans], {"p50 s": [r["p50_s"] for r in spans],
                                              "p99 s": [r["p99_s"] for r in spans]},
                 "seconds per span kind"),
        _table(spans, ["kind", "count", "nodes", "p50_s", "p99_s"]),
    ]
    if rep["bad_shards"]:
        sections += ["<h2>Skipped shards</h2>", _table(rep["bad_shards"], ["file", "error"])]
    style = ("body{font-family:sans-serif;max-width:980px;margin:auto}table{border-collapse:"
             "collapse;margin:8px 0}td,th{border:1px solid #ccc;padding:2px 6px;font-size:12px}")
    return (f"<!doctype html><html><head><meta charset='utf-8'><title>Paddock report</title>"
            f"<style>{style}</style></head><body>{''.join(sections)}</body></html>\n")
