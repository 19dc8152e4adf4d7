"""The report's text and HTML forms, from the dict `controller.analysis.report.build_report`
returns: numbers rounded for reading (the JSON form keeps full precision), a sentence where a
table is empty, the band classes explained where they appear, charts from
controller/analysis/charts.py.

Must not import DuckDB or zmq, nor controller.analysis.report (that module imports this one).
"""
from __future__ import annotations

import base64
import html
from pathlib import Path
from typing import Callable, Sequence, TextIO

from controller.analysis.charts import bar_chart, line_chart, nice_ticks, time_scale
from controller.taskbank.bands import BandSpec, explain

OCC = ("too_hard", "band", "too_easy", "explore")
OCC_LABEL = {"too_hard": "too hard", "band": "in band", "too_easy": "too easy",
             "explore": "explore (little data)"}
SPAN_LABEL = {"model_call": "model", "tool_call": "tools", "sandbox_start": "sandbox start",
              "verification": "verification", "other": "other"}
# too hard, in band, too easy, little data: purple, green, blue, grey (grey: no verdict yet)
OCC_COLOURS = ("#9467bd", "#2ca02c", "#1f77b4", "#b0b0b0")
BREAKDOWN = ("model_call", "tool_call", "sandbox_start", "verification", "other")


# -- numbers for reading ---------------------------------------------------------------------

def pct(x: float | None) -> str:
    return "n/a" if x is None else f"{100 * x:.1f}%"


def secs(x: float | None) -> str:
    """A duration with three significant digits in a unit that suits it."""
    if x is None:
        return "n/a"
    if x == 0:
        return "0 s"
    factor, unit = time_scale(abs(float(f"{x:.3g}")))     # 0.99996 s reads "1 s", not "1e+03 ms"
    return f"{x * factor:.3g} {unit}"


def num(x) -> str:
    if x is None:
        return "-"
    if isinstance(x, bool) or not isinstance(x, (int, float)):
        return str(x)
    if isinstance(x, int):
        return f"{x:,}"
    return f"{x:.3g}"


def _classes_line(r: dict) -> str:
    return ", ".join(f"{r[c]} {OCC_LABEL[c]}" for c in OCC)


def glance(rep: dict) -> list[str]:
    """The four answers a reader wants first, one line each."""
    lines = []
    rates = rep["pass_rates"]
    if rates:
        newest = max(r["policy_version"] for r in rates)
        per = ", ".join(f"{r['task_family']} {pct(r['pass_rate'])} ({r['passed']}/{r['scored']})"
                        for r in rates if r["policy_version"] == newest)
        first = min(r["policy_version"] for r in rates)
        lines.append(f"pass rate at v{newest}: {per}" + (
            f"; at v{first}: " + ", ".join(f"{r['task_family']} {pct(r['pass_rate'])}" for r in rates
                                          if r["policy_version"] == first) if first != newest else ""))
    else:
        lines.append("no scored rollout is committed in this run yet")
    if rep["band_occupancy"]:
        o = rep["band_occupancy"][-1]
        lines.append(f"tasks at v{o['policy_version']}: {o['band']} of {o['tasks']} in band; "
                     f"the rest: {o['too_hard']} too hard, {o['too_easy']} too easy, "
                     f"{o['explore']} with too little data to say")
    n = len(rep["hack_suspects"])
    lines.append(f"hack suspects: {n} (listed below)" if n else
                 "hack suspects: none (" + hack_rule_sentence(rep.get("hack_rule", {})) + ")")
    spans = rep["span_percentiles"]
    if spans:
        s = max(spans, key=lambda r: r["p99_s"])
        lines.append(f"slowest step kind: {SPAN_LABEL.get(s['kind'], s['kind'])} "
                     f"(p99 {secs(s['p99_s'])}, p50 {secs(s['p50_s'])})")
    else:
        lines.append("no timed spans recorded")
    return lines


def sampling_sentence(rep: dict) -> str:
    """A line under the span times when tail sampling dropped the spans of some attempts."""
    samp = rep.get("span_sampling") or {}
    dropped, total = samp.get("dropped", 0), sum(samp.values())
    if not dropped:
        return ""
    return (f"  (tail sampling: the spans of {dropped} of {total} committed attempts were dropped; "
            f"the times above are of the kept: failed, slow, hack-suspect and sampled)\n")


def hack_rule_sentence(rule: dict) -> str:
    """What "no hack suspect" means, saying which families the effort rule exempts (answer
    tasks are solved in one step with no diff: the top-by-effort table shows them)."""
    exempt = rule.get("answer_families") or []
    return (f"no rollout with reward >= {rule.get('min_reward', 1):g} took <= {rule.get('max_steps', 2)} "
            f"steps or a diff of <= {rule.get('max_diff_bytes', 64)} bytes"
            + (f" (the {', '.join(exempt)} {'family is' if len(exempt) == 1 else 'families are'} exempt "
               f"from this effort rule: answer tasks are solved in one step with no diff)" if exempt else "")
            + ", and none touched a protected path")


def empty_sentence(section: str, rep: dict) -> str:
    rule = rep.get("hack_rule", {})
    return {
        "pass_rates": "No scored rollout is committed yet.",
        "pass_at_k": "No task has enough samples in one version for pass@k.",
        "band_occupancy": "No scored rollout is committed yet, so no task has an estimate.",
        "band_movement": "Only one policy version so far: nothing could move.",
        "hack_suspects": f"No hack suspects: {hack_rule_sentence(rule)}.",
        "top_by_effort": "No rollout was rewarded.",
        "slowest_rollouts": "No rollout is committed yet.",
        "infra_by_node": "No infra errors: every attempt reached a verdict.",
        "span_percentiles": "No timed spans were recorded.",
    }[section]


# -- text ------------------------------------------------------------------------------------

def print_text(rep: dict, out: TextIO) -> None:
    w = out.write
    spec = BandSpec(**rep["band_spec"]) if "band_spec" in rep else BandSpec()
    w(f"Report for {rep['run_dir']}\n\nAt a glance:\n")
    for line in glance(rep):
        w(f"  {line}\n")
    w("\nPass rate by task family and policy version (infra errors masked):\n")
    for r in rep["pass_rates"] or [None]:
        w(f"  {empty_sentence('pass_rates', rep)}\n" if r is None else
          f"  {r['task_family']:10} v{r['policy_version']:<4} {r['passed']:>6}/{r['scored']:<6} "
          f"{pct(r['pass_rate'])}\n")
    w("\npass@k by task family and policy version (unbiased, mean over tasks with >= k samples):\n")
    for r in rep.get("pass_at_k", []) or [None]:
        w(f"  {empty_sentence('pass_at_k', rep)}\n" if r is None else
          f"  {r['task_family']:10} v{r['policy_version']:<4} pass@{r['k']:<3} "
          f"{pct(r['pass_at_k'])}  over {r['tasks']} tasks\n")
    lo, hi = rep["band"]
    w(f"\nBand occupancy ({lo:g}-{hi:g}) by policy version, on the curriculum's estimate; "
      f"estimator from {rep.get('band_spec_source', 'defaults')}:\n")
    for r in rep["band_occupancy"] or [None]:
        w(f"  {empty_sentence('band_occupancy', rep)}\n" if r is None else
          f"  v{r['policy_version']:<4} {_classes_line(r)}  ({pct(r['band_share'])} of "
          f"{r['tasks']} in band)\n")
    for c in OCC:
        w(f"    {c}: {explain(c, spec)}\n")
    _text_movement(rep, w)
    _text_rollouts(rep, w)
    w("\nInfra errors by node and reason (every attempt, retried or not):\n")
    for r in rep["infra_by_node"] or [None]:
        w(f"  {empty_sentence('infra_by_node', rep)}\n" if r is None else
          f"  {r['node']:12} {r['reason']:20} {r['attempts']:>6} attempts "
          f"({r['committed']} committed as infra_error)\n")
    w("\nTime per span kind (HDR histograms merged across nodes):\n")
    for r in rep["span_percentiles"] or [None]:
        w(f"  {empty_sentence('span_percentiles', rep)}\n" if r is None else
          f"  {r['kind']:14} n={r['count']:<8} p50 {secs(r['p50_s']):>9}  p99 {secs(r['p99_s']):>9}"
          f"  ({r['nodes']} nodes)\n")
    w(sampling_sentence(rep))
    web = rep.get("web") or {}
    if web.get("tasks"):
        w("\nWeb rollouts: what the browser showed (accessibility trees are the steps' observations,"
          " screenshots files under the run directory):\n")
        for t in web["tasks"]:
            w(f"  {t['task_name']:36} {t['rollouts']:>4} rollouts {t['observations']:>6} trees "
              f"{t['screenshots']:>4} screenshots\n")
        for t in web["thumbnails"]:
            w(f"  latest screenshot of {t['task_name']}: {t['path']}\n")
    for b in rep["bad_shards"]:
        w(f"\nwarning: skipped {b['file']}: {b['error']}")


def _text_movement(rep: dict, w) -> None:
    w("\nBand movement (tasks entering and leaving the band):\n")
    for r in rep.get("band_movement", []) or [None]:
        if r is None:
            w(f"  {empty_sentence('band_movement', rep)}\n")
            continue
        src = ", ".join(f"{n} from {k}" for k, n in r["entered_from"].items())
        dst = ", ".join(f"{n} to {k}" for k, n in r["left_to"].items())
        w(f"  v{r['policy_version']:<4} +{r['entered']} entered" + (f" ({src})" if src else "")
          + f", -{r['left']} left" + (f" ({dst})" if dst else "") + "\n")
        if r["entered_tasks"]:
            w(f"        in:  {listed_names(r['entered_tasks'], r['entered'])}\n")
        if r["left_tasks"]:
            w(f"        out: {listed_names(r['left_tasks'], r['left'])}\n")


def listed_names(names: Sequence[str], total: int) -> str:
    """`names`, and "… and N more" when the list is cut short of `total`."""
    more = total - len(names)
    return ", ".join(names) + (f", … and {more} more" if more > 0 else "") if names else "-"


def _text_rollouts(rep: dict, w) -> None:
    w(f"\nHack suspects (high reward, little effort): {len(rep['hack_suspects'])}\n")
    if not rep["hack_suspects"]:
        w(f"  {empty_sentence('hack_suspects', rep)}\n")
    for r in rep["hack_suspects"]:
        w(f"  {r['rollout_id']}  {r['task_name']}  v{r['policy_version']}  reward {r['reward']:g}"
          f"  {r['why']}\n")
    w("\nTop rollouts by reward per step (open one with the commands shown):\n")
    for r in rep.get("top_by_effort", []) or [None]:
        if r is None:
            w(f"  {empty_sentence('top_by_effort', rep)}\n")
            continue
        w(f"  {r['rollout_id']}  {r['task_name']}  v{r['policy_version']}  reward {num(r['reward'])}"
          f" in {r['steps']} steps, {num(r['tokens'])} tokens, {secs(r['wall_s'])}\n"
          f"      {r['replay']}\n      {r['query']}\n")
    w("\nSlowest rollouts and where their time went:\n")
    for r in rep.get("slowest_rollouts", []) or [None]:
        if r is None:
            w(f"  {empty_sentence('slowest_rollouts', rep)}\n")
            continue
        parts = ", ".join(f"{SPAN_LABEL[k]} {secs(r[f'{k}_s'])}" for k in BREAKDOWN)
        w(f"  {r['rollout_id']}  {r['task_name']}  {r['outcome']}  {secs(r['wall_s'])}: {parts}\n")


# -- HTML ------------------------------------------------------------------------------------

Col = tuple[str, str, Callable]


def _cell(v, fmt: Callable) -> str:
    text = fmt(v)
    return f"<code>{html.escape(text)}</code>" if fmt is _code else html.escape(text)


def _code(v) -> str:
    return str(v)


def table(rows: Sequence[dict], cols: Sequence[Col], empty: str) -> str:
    """A table of `rows`, or the sentence `empty` when there are none."""
    if not rows:
        return f'<p class="empty">{html.escape(empty)}</p>'
    head = "".join(f"<th>{html.escape(h)}</th>" for _, h, _ in cols)
    body = "".join("<tr>" + "".join(f"<td>{_cell(r.get(k), f)}</td>" for k, _, f in cols)
                   + "</tr>" for r in rows)
    return f"<table><tr>{head}</tr>{body}</table>"


def _charts(rep: dict) -> tuple[str, str, str]:
    by_family: dict[str, list[tuple[float, float]]] = {}
    for r in rep["pass_rates"]:
        by_family.setdefault(r["task_family"], []).append((r["policy_version"], r["pass_rate"]))
    rates = line_chart(by_family, "Pass rate by policy version", x_label="policy version",
                       y_label="pass rate", y_unit="%", y_max=1.0, x_format=lambda x: f"v{x:g}")
    occ = rep["band_occupancy"]
    bands = bar_chart([f"v{r['policy_version']}" for r in occ],
                      {OCC_LABEL[c]: [r[c] for r in occ] for c in OCC},
                      "Tasks per band class", x_label="policy version", y_label="tasks",
                      y_unit="count", stacked=True, colours=OCC_COLOURS)
    spans = rep["span_percentiles"]
    # the unit of the top tick, not of the largest bar: a 0.95 s p99 draws ticks up to 1 s
    factor, unit = time_scale(nice_ticks(max((r["p99_s"] for r in spans), default=0.0))[-1])
    times = bar_chart([SPAN_LABEL.get(r["kind"], r["kind"]) for r in spans],
                      {"p50": [r["p50_s"] * factor for r in spans],
                       "p99": [r["p99_s"] * factor for r in spans]},
                      "Time per span kind", x_label="span kind", y_label="duration", y_unit=unit)
    return rates, bands, times


def render_html(rep: dict) -> str:
    spec = BandSpec(**rep["band_spec"]) if "band_spec" in rep else BandSpec()
    rates, bands, times = _charts(rep)
    lo, hi = rep["band"]
    E = lambda key: empty_sentence(key, rep)   # noqa: E731
    fam = ("task_family", "family", str)
    ver = ("policy_version", "version", lambda v: f"v{v}")
    rid = ("rollout_id", "rollout", _code)
    sections = [
        f"<h1>Paddock run report</h1><p><code>{html.escape(rep['run_dir'])}</code></p>",
        "<h2>At a glance</h2><ul>" + "".join(f"<li>{html.escape(x)}</li>" for x in glance(rep)) + "</ul>",
        "<h2>Pass rate by task family and policy version</h2>", rates,
        table(rep["pass_rates"], [fam, ver, ("scored", "scored", num), ("passed", "passed", num),
                                  ("pass_rate", "pass rate", pct)], E("pass_rates")),
        "<h3>pass@k (unbiased estimator, mean over tasks with at least k samples)</h3>",
        table(rep.get("pass_at_k", []), [fam, ver, ("k", "k", num), ("tasks", "tasks", num),
                                         ("pass_at_k", "pass@k", pct)], E("pass_at_k")),
        f"<h2>Band occupancy ({lo:g}-{hi:g})</h2>",
        f"<p>Classes of the curriculum's estimate; estimator from {html.escape(rep.get('band_spec_source', ''))}:</p><ul>"
        + "".join(f"<li><b>{OCC_LABEL[c]}</b>: {html.escape(explain(c, spec))}</li>" for c in OCC)
        + "</ul>", bands,
        table(rep["band_occupancy"], [ver] + [(c, OCC_LABEL[c], num) for c in OCC]
              + [("tasks", "tasks", num), ("band_share", "in band", pct)], E("band_occupancy")),
        "<h3>Band movement</h3>",
        table([dict(r, entered_list=listed_names(r["entered_tasks"], r["entered"]),
                    left_list=listed_names(r["left_tasks"], r["left"]))
               for r in rep.get("band_movement", [])], [
            ver, ("entered", "entered", num), ("entered_from", "from", _moves),
            ("entered_list", "tasks entering", str), ("left", "left", num),
            ("left_to", "to", _moves), ("left_list", "tasks leaving", str)], E("band_movement")),
        "<h2>Hack suspects</h2>",
        table(rep["hack_suspects"], [rid, ("task_name", "task", str), ver, ("reward", "reward", num),
                                     ("steps", "steps", num), ("diff_bytes", "diff bytes", num),
                                     ("why", "why", str)], E("hack_suspects")),
        "<h2>Top rollouts by reward per step</h2>",
        table(rep.get("top_by_effort", []), [
            rid, ("task_name", "task", str), ver, ("reward", "reward", num), ("steps", "steps", num),
            ("tokens", "tokens", num), ("wall_s", "wall", secs), ("replay", "replay", _code),
            ("query", "steps of it", _code)], E("top_by_effort")),
        "<h2>Slowest rollouts: where the time went</h2>",
        table(rep.get("slowest_rollouts", []), [rid, ("task_name", "task", str),
                                                ("outcome", "outcome", str), ("wall_s", "wall", secs)]
              + [(f"{k}_s", SPAN_LABEL[k], secs) for k in BREAKDOWN]
              + [("replay", "replay", _code)], E("slowest_rollouts")),
        "<h2>Infra errors by node and reason</h2>",
        table(rep["infra_by_node"], [("node", "node", str), ("reason", "reason", str),
                                     ("attempts", "attempts", num), ("committed", "committed", num),
                                     ("example", "example", str)], E("infra_by_node")),
        "<h2>Time per span kind (HDR, merged across nodes)</h2>", times,
        f"<p>{html.escape(sampling_sentence(rep).strip())}</p>" if sampling_sentence(rep) else "",
        table(rep["span_percentiles"], [("kind", "kind", str), ("count", "spans", num),
                                        ("nodes", "nodes", num), ("p50_s", "p50", secs),
                                        ("p99_s", "p99", secs)], E("span_percentiles")),
    ]
    web = rep.get("web") or {}
    if web.get("tasks"):
        sections += ["<h2>Web rollouts: what the browser showed</h2>",
                     table(web["tasks"], [("task_name", "task", str), ("rollouts", "rollouts", num),
                                          ("observations", "accessibility trees", num),
                                          ("screenshots", "screenshots", num)], ""),
                     "".join(_thumbnail(rep["run_dir"], t) for t in web["thumbnails"])]
    if rep["bad_shards"]:
        sections += ["<h2>Skipped shards</h2>",
                     table(rep["bad_shards"], [("file", "file", str), ("error", "error", str)], "")]
    style = ("body{font-family:sans-serif;max-width:1000px;margin:auto;padding:0 12px}"
             "table{border-collapse:collapse;margin:8px 0}td,th{border:1px solid #ccc;"
             "padding:2px 6px;font-size:12px;text-align:left}p.empty{color:#555;font-style:italic}"
             "svg.chart{display:block;margin:8px 0}code{font-size:11px}")
    return (f"<!doctype html><html><head><meta charset='utf-8'><title>Paddock report</title>"
            f"<style>{style}</style></head><body>{''.join(sections)}</body></html>\n")


def _thumbnail(run_dir: str, shot: dict) -> str:
    """A stored screenshot embedded in the page (a data: URI: the page stands alone)."""
    try:
        data = (Path(run_dir) / shot["path"]).read_bytes()
    except OSError:
        return ""
    return (f"<figure style='display:inline-block;margin:4px'><img width='240' alt='{html.escape(shot['path'])}' "
            f"src='data:image/png;base64,{base64.b64encode(data).decode()}'>"
            f"<figcaption><code>{html.escape(shot['task_name'])}</code></figcaption></figure>")


def _moves(d) -> str:
    return ", ".join(f"{n} {k}" for k, n in (d or {}).items()) or "-"


