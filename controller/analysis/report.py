"""`paddock report --run DIR [--html FILE]`: the analyst's canned report over a run.

Sections, each one function of a DuckDB connection from `controller.analysis.query.connect` (so
committed rows only):

- pass rate by task family and policy version (infra errors masked), and pass@k per family
  and version (the unbiased estimator over each task's n samples with c correct, averaged over
  the tasks with n >= k; also the DuckDB macro `pass_at_k(n, c, k)`, PASS_AT_K_MACRO);
- band occupancy by policy version, with the curriculum's classes (controller/taskbank/bands.py:
  too_hard / band / too_easy / explore = little data) under the run's recorded curriculum
  config (`run.json` key `curriculum`; defaults if none), and band movement: the tasks that
  entered or left the band at each version, and where they went;
- hack suspects: reward at the top with little effort (few steps, a tiny diff) or a touched
  protected path (`tampered`, or a failed `protected:` check);
- the top rollouts by reward per step (ties: fewer tokens, less wall time), each with the
  `paddock replay` and `paddock query` commands that open it;
- the slowest rollouts and where their wall time went (model calls, tool calls, sandbox
  start, verification, the rest);
- infra errors by node and reason, from every attempt (committed or retried);
- p50/p99 per span kind (model_call, tool_call, sandbox_start, verification) from HDR
  histograms: DuckDB buckets span durations to 3 significant digits per (node, kind), each
  node's buckets fill one HdrHistogram, and the nodes' histograms are merged with `add`.

The JSON form keeps full precision; text and HTML (controller/analysis/report_render.py)
round for reading. Must not import: zmq (it never writes to the run directory).
"""
from __future__ import annotations

import dataclasses
import json
import re
import shlex
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import TextIO

import duckdb
from hdrh.histogram import HdrHistogram

from controller.analysis.query import QueryError, RunNotFound, connect, newest_run
from controller.analysis.report_render import print_text, render_html
from controller.store.catalog import BUCKET_DIGITS, HDR_DIGITS, HDR_MAX_US, SPAN_SUMMARY_FORMAT
from controller.taskbank.bands import BandSpec, classify, evidence_sql, posterior_mean

SPAN_KINDS = ("model_call", "tool_call", "sandbox_start", "verification")
# The rollouts columns the sections read. build_report copies them out of the committed-only
# view once (a temp table that shadows the view): every section then scans memory instead of
# joining the shards with the catalog again.
REPORT_COLUMNS = ("run_id", "rollout_id", "attempt", "fencing_token", "task_id", "task_name",
                  "task_family", "policy_version", "node", "outcome", "reward", "tampered",
                  "wall_s", "steps", "prompt_tokens", "completion_tokens", "diff_bytes")
OCCUPANCY_CLASSES = ("too_hard", "band", "too_easy", "explore")

# pass@k (Chen et al. 2021, unbiased): 1 - C(n - c, k) / C(n, k), via log-gamma so that
# large n stays finite; NULL when a task has fewer than k samples.
PASS_AT_K_MACRO = (
    "CREATE OR REPLACE MACRO pass_at_k(n, c, k) AS CASE WHEN n < k THEN NULL "
    "WHEN n - c < k THEN 1.0 ELSE 1.0 - exp(lgamma(n - c + 1) + lgamma(n - k + 1) "
    "- lgamma(n - c - k + 1) - lgamma(n + 1)) END")


@dataclass(frozen=True)
class ReportConfig:
    # The band classes and their estimator (controller/taskbank/bands.py); None: the run's
    # recorded curriculum config (run.json), else BandSpec's defaults.
    bands: BandSpec | None = None
    hack_max_steps: int = 2
    hack_max_diff_bytes: int = 64
    hack_min_reward: float = 1.0
    # Families graded on an answer, not a diff: a one-step, no-diff pass is how they are solved.
    answer_families: tuple[str, ...] = ("math",)
    limit_suspects: int = 50
    ks: tuple[int, ...] = (1, 5, 10)
    top_n: int = 10
    movers_listed: int = 8


def run_band_spec(run_dir: str | Path) -> tuple[BandSpec, str]:
    """The run's curriculum config (its `run.json` key `curriculum`) and where it came from."""
    try:
        recorded = json.loads((Path(run_dir) / "run.json").read_text()).get("curriculum")
    except (OSError, ValueError, AttributeError):
        recorded = None
    if isinstance(recorded, dict):
        return BandSpec.from_mapping(recorded), "the run's curriculum config (run.json)"
    return BandSpec(), "the curriculum's defaults (the run recorded no curriculum config)"


def pass_rates(con: duckdb.DuckDBPyConnection) -> list[dict]:
    rows = con.execute(
        "SELECT task_family, policy_version, count(*) AS n, "
        "count(*) FILTER (WHERE outcome = 'pass') AS passed "
        "FROM rollouts WHERE outcome <> 'infra_error' GROUP BY ALL ORDER BY ALL").fetchall()
    return [{"task_family": f, "policy_version": v, "scored": n, "passed": p,
             "pass_rate": p / n if n else None} for f, v, n, p in rows]


def pass_at_k(con: duckdb.DuckDBPyConnection, ks: tuple[int, ...] = (1, 5, 10)) -> list[dict]:
    """pass@k per task family and version: the mean over tasks with n >= k samples of the
    unbiased estimator; a k no task reaches is left out."""
    con.execute(PASS_AT_K_MACRO)
    rows = con.execute(
        "WITH t AS (SELECT task_family, policy_version, task_id, count(*) AS n, "
        "  count(*) FILTER (WHERE outcome = 'pass') AS c FROM rollouts "
        "  WHERE outcome <> 'infra_error' GROUP BY ALL), "
        "ks AS (SELECT unnest(?::INT[]) AS k) "
        "SELECT task_family, policy_version, k, count(*) AS tasks, avg(pass_at_k(n, c, k)) "
        "FROM t JOIN ks ON n >= k GROUP BY ALL ORDER BY ALL", [list(ks)]).fetchall()
    return [{"task_family": f, "policy_version": v, "k": k, "tasks": n, "pass_at_k": p}
            for f, v, k, n, p in rows]


def task_classes(con: duckdb.DuckDBPyConnection, spec: BandSpec) -> dict[int, dict[str, str]]:
    """version -> task id -> class, for every task with a scored rollout at or before it."""
    out: dict[int, dict[str, str]] = {}
    for v, task_id, wp, wf in con.execute(evidence_sql(), {"decay": spec.decay}).fetchall():
        out.setdefault(v, {})[task_id] = classify(posterior_mean(wp, wf, spec), wp + wf, spec)
    return out


def band_occupancy(con: duckdb.DuckDBPyConnection, cfg: ReportConfig,
                   classes: dict[int, dict[str, str]] | None = None) -> list[dict]:
    """Per policy version: how many tasks sit in each class (the curriculum's estimate over
    that version and the earlier ones). One rollout per task per version is never evidence
    of a rate on its own, so the estimate pools versions the way the sampler does."""
    classes = task_classes(con, cfg.bands or BandSpec()) if classes is None else classes
    out = []
    for v, per_task in sorted(classes.items()):
        row = {"policy_version": v, **{c: 0 for c in OCCUPANCY_CLASSES}}
        for c in per_task.values():
            row[c] += 1
        row["tasks"] = len(per_task)
        row["band_share"] = row["band"] / len(per_task) if per_task else None
        out.append(row)
    return out


def band_movement(classes: dict[int, dict[str, str]], names: dict[str, str],
                  listed: int = 8) -> list[dict]:
    """Per version after the first: tasks that entered the band (and from which class) and
    tasks that left it (and to which class), with up to `listed` task names of each."""
    out, versions = [], sorted(classes)
    for prev, v in zip(versions, versions[1:]):
        before, now = classes[prev], classes[v]
        entered = sorted((t for t, c in now.items() if c == "band" and before.get(t) != "band"),
                         key=lambda t: names.get(t, t))
        left = sorted((t for t, c in before.items() if c == "band" and now.get(t) != "band"),
                      key=lambda t: names.get(t, t))
        out.append({"policy_version": v, "entered": len(entered), "left": len(left),
                    "entered_from": _tally(before.get(t, "unseen") for t in entered),
                    "left_to": _tally(now.get(t, "unseen") for t in left),
                    "entered_tasks": [names.get(t, t) for t in entered[:listed]],
                    "left_tasks": [names.get(t, t) for t in left[:listed]],
                    # how many names the lists leave out (said as "… and N more")
                    "entered_unlisted": max(len(entered) - listed, 0),
                    "left_unlisted": max(len(left) - listed, 0)})
    return out


def _tally(items) -> dict[str, int]:
    out: dict[str, int] = {}
    for x in items:
        out[x] = out.get(x, 0) + 1
    return dict(sorted(out.items()))


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


def span_sampling(con: duckdb.DuckDBPyConnection) -> dict[str, int]:
    """Committed attempts per tail-sampling decision (rollouts.trace_sample; NULL, written
    before traces, counts as `all`): with `dropped` attempts the span times describe the kept."""
    cols = {r[0] for r in con.execute("DESCRIBE main.rollouts").fetchall()}
    if "trace_sample" not in cols:          # a store whose views predate traces
        return {}
    rows = con.execute("SELECT coalesce(trace_sample, 'all'), count(*) FROM main.rollouts "
                       "GROUP BY 1 ORDER BY 1").fetchall()
    return {k: int(n) for k, n in rows}


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


def _open_commands(run_dir: Path, run_id: str, rollout_id: str) -> dict[str, str]:
    """The shell commands that open one rollout: its replay and its steps."""
    run = run_dir if (run_dir / "run.json").exists() or not (run_dir / run_id).is_dir() \
        else run_dir / run_id
    sql = ("SELECT step, role, tool_name, tool_args, observation FROM steps "
           f"WHERE rollout_id = '{rollout_id.replace(chr(39), chr(39) * 2)}' ORDER BY step")
    return {"replay": f"paddock replay {shlex.quote(rollout_id)} --run {shlex.quote(str(run))}",
            "query": f"paddock query --run {shlex.quote(str(run))} {_shell_sql(sql)}"}


def _shell_sql(sql: str) -> str:
    """SQL as one shell word: in double quotes when nothing in it is special there (the
    SQL's own single quotes stay readable), else shlex-quoted."""
    return f'"{sql}"' if not set(sql) & set('"$`\\!') else shlex.quote(sql)


def top_by_effort(con: duckdb.DuckDBPyConnection, run_dir: Path, n: int = 10) -> list[dict]:
    """The rewarded rollouts with the most reward per step (ties: fewer tokens, less wall
    time), each with the commands that open it."""
    rows = con.execute(
        "SELECT run_id, rollout_id, task_name, task_family, policy_version, node, reward, steps, "
        "prompt_tokens + completion_tokens AS tokens, wall_s, "
        "reward / greatest(steps, 1) AS reward_per_step FROM rollouts "
        "WHERE reward > 0 AND outcome <> 'infra_error' "
        "ORDER BY reward_per_step DESC, tokens, wall_s, rollout_id LIMIT ?", [n]).fetchall()
    cols = ["run_id", "rollout_id", "task_name", "task_family", "policy_version", "node",
            "reward", "steps", "tokens", "wall_s", "reward_per_step"]
    return [{**d, **_open_commands(run_dir, d["run_id"], d["rollout_id"])}
            for d in (dict(zip(cols, r)) for r in rows)]


def slowest_rollouts(con: duckdb.DuckDBPyConnection, run_dir: Path, n: int = 10) -> list[dict]:
    """The `n` rollouts with the longest wall time and the seconds their spans of each kind
    took (`other_s`: wall time no span covers: harness, queueing inside the node, I/O)."""
    top = con.execute(
        "SELECT run_id, rollout_id, task_name, policy_version, node, outcome, wall_s "
        "FROM rollouts ORDER BY wall_s DESC, rollout_id LIMIT ?", [n]).fetchall()
    if not top:
        return []
    # The spans view holds committed attempts only, and a rollout has one committed attempt:
    # its id is the key. A list parameter lets DuckDB skip the row groups that cannot match.
    spent = con.execute("SELECT rollout_id, kind, sum(duration_s) FROM spans "
                        "WHERE rollout_id = ANY(?) GROUP BY ALL", [[r[1] for r in top]]).fetchall()
    by_rollout: dict[str, dict[str, float]] = {}
    for rid, kind, secs in spent:
        by_rollout.setdefault(rid, {})[kind] = secs
    out = []
    for run_id, rid, task, version, node, outcome, wall in top:
        kinds = by_rollout.get(rid, {})
        row = {"rollout_id": rid, "task_name": task, "policy_version": version, "node": node,
               "outcome": outcome, "wall_s": wall,
               **{f"{k}_s": kinds.get(k, 0.0) for k in SPAN_KINDS}}
        row["other_s"] = max(wall - sum(kinds.get(k, 0.0) for k in SPAN_KINDS), 0.0)
        row.update(_open_commands(run_dir, run_id, rid))
        out.append(row)
    return out


SCREENSHOT_REF = re.compile(r"screenshot stored as (artifacts/[^\s()]+\.png)")
MAX_THUMBNAILS = 6                # the HTML page embeds at most this many screenshots (newest first)


def web_observations(con: duckdb.DuckDBPyConnection, run_dir: Path) -> dict:
    """What the browser showed web rollouts: per web task, its rollouts, accessibility-tree
    observations (`browser_observe`) and screenshots (their artifact files under the run
    directory, named by the step's observation); the newest screenshots for the HTML page."""
    rows = con.execute(
        "SELECT r.task_name, count(DISTINCT r.rollout_id), "
        "count(*) FILTER (WHERE s.tool_name = 'browser_observe'), "
        "list(s.observation ORDER BY s.rollout_id DESC, s.step DESC) FILTER (WHERE s.tool_name = 'browser_screenshot') "
        "FROM rollouts r JOIN steps s USING (rollout_id, attempt, fencing_token) "
        "WHERE r.task_family = 'web' GROUP BY r.task_name ORDER BY r.task_name").fetchall()
    tasks, shots = [], []
    for name, rollouts, observed, outs in rows:
        refs = [m.group(1) for o in (outs or []) for m in [SCREENSHOT_REF.search(o or "")] if m]
        tasks.append({"task_name": name, "rollouts": rollouts, "observations": observed, "screenshots": len(refs)})
        shots += [{"task_name": name, "path": ref} for ref in refs[:1] if (run_dir / ref).is_file()]
    return {"tasks": tasks, "thumbnails": shots[:MAX_THUMBNAILS]}


def build_report(run_dir: str | Path, cfg: ReportConfig | None = None) -> dict:
    cfg = cfg or ReportConfig()
    run_dir = Path(run_dir)
    if cfg.bands is None:
        spec, spec_source = run_band_spec(run_dir)
    else:
        spec, spec_source = cfg.bands, "given to the report"
    con = connect(run_dir)
    try:
        sampling = span_sampling(con)           # before the temp table below shadows the view
        con.execute(f"CREATE TEMP TABLE rollouts AS SELECT {', '.join(REPORT_COLUMNS)} "
                    "FROM main.rollouts")
        classes = task_classes(con, spec)
        names = dict(con.execute("SELECT task_id, any_value(task_name) FROM rollouts "
                                 "GROUP BY task_id").fetchall())
        return {
            "run_dir": str(run_dir),
            "pass_rates": pass_rates(con),
            "pass_at_k": pass_at_k(con, cfg.ks),
            "band": [spec.band_low, spec.band_high],
            "band_spec": dataclasses.asdict(spec),
            "band_spec_source": spec_source,
            "band_occupancy": band_occupancy(con, cfg, classes),
            "band_movement": band_movement(classes, names, cfg.movers_listed),
            "hack_suspects": hack_suspects(con, cfg),
            "hack_rule": {"min_reward": cfg.hack_min_reward, "max_steps": cfg.hack_max_steps,
                          "max_diff_bytes": cfg.hack_max_diff_bytes,
                          "answer_families": list(cfg.answer_families)},
            "top_by_effort": top_by_effort(con, run_dir, cfg.top_n),
            "slowest_rollouts": slowest_rollouts(con, run_dir, cfg.top_n),
            "infra_by_node": infra_by_node(con),
            "span_percentiles": span_percentiles(con),
            "span_sampling": sampling,
            "web": web_observations(con, run_dir),
            "bad_shards": [{"file": f, "error": e} for f, e in
                           con.execute("SELECT file, error FROM bad_shards ORDER BY file").fetchall()],
        }
    except duckdb.Error as exc:
        raise QueryError(f"report failed: {' '.join(str(exc).split())[:300]}") from None
    finally:
        con.close()


def write_report(run: str | None, out: TextIO, *, html_path: str | None = None,
                 as_json: bool = False, band: tuple[float, float] | None = None,
                 ks: tuple[int, ...] | None = None) -> int:
    """The library side of `paddock report`: build, then print text or JSON, and write the
    HTML page if asked. `band`: (low, high) instead of the run's curriculum band; `ks`: the
    k of pass@k (default 1, 5, 10)."""
    try:
        run_dir = Path(run) if run else newest_run()
        if html_path and not Path(html_path).parent.is_dir():
            raise QueryError(f"cannot write {html_path}: directory {Path(html_path).parent} does not exist")
        cfg = ReportConfig(ks=tuple(ks)) if ks else ReportConfig()
        if band is not None:
            spec, _ = run_band_spec(run_dir)
            cfg = dataclasses.replace(cfg, bands=dataclasses.replace(spec, band_low=float(band[0]),
                                                                     band_high=float(band[1])))
        rep = build_report(run_dir, cfg)
    except (QueryError, RunNotFound, ValueError) as exc:
        print(f"paddock report: error: {exc}", file=sys.stderr)
        return 2
    if as_json:
        out.write(json.dumps(rep, indent=1, default=str) + "\n")
    else:
        print_text(rep, out)
    if html_path:
        Path(html_path).write_text(render_html(rep))
        print(f"HTML report: {html_path}", file=out)
    return 0
