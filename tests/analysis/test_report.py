"""`paddock report`: canned sections over a real store, HDR percentiles merged across nodes."""
from __future__ import annotations

import argparse
import io
import json
import xml.etree.ElementTree as ET

import pytest

from controller.analysis.charts import bar_chart
from controller.analysis.report import build_report, render_html
from controller.cli.analysis import register
from controller.store.catalog import Catalog
from nodeagent.store.writer import write_attempt
from tests.store.test_store import T0, check_row, rollout_row, step_row


def _spans(kind_durations):
    return [{"kind": k, "name": k, "step": 0, "start_s": 0.0, "duration_s": d}
            for k, d in kind_durations]


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    run = tmp_path_factory.mktemp("run")
    cat = Catalog(run)
    n = 0

    def add(outcome, family="python", version=0, node="n1", task="t0", steps=3, diff=500,
            tampered=False, spans=(), checks=(), commit=True, **kw):
        nonlocal n
        n += 1
        rid = f"r{n:03d}"
        row = rollout_row(rid, outcome=outcome, family=family, policy_version=version, node=node,
                          task_id=f"sha256:{task}", steps=steps, diff_bytes=diff,
                          tampered=tampered, **kw)
        shards = write_attempt(run, node, row, [step_row(i) for i in range(min(steps, 2))],
                               list(checks) or [check_row()], spans=_spans(spans))
        if commit:
            cat.commit(rid, 1, 1, shards, committed_at=T0)
        return rid

    # version 0: python 1/4 pass (t0 pass, t1..t3 fail), math 2/2
    add("pass", task="t0", spans=[("model_call", 0.010)] * 50 + [("tool_call", 0.100)] * 10)
    for t in ("t1", "t2", "t3"):
        add("fail", task=t, node="n2", spans=[("model_call", 0.020)] * 50)
    add("pass", family="math", task="m0")
    add("pass", family="math", task="m0", node="n2", spans=[("model_call", 2.0)])
    # version 1: python t0 pass twice + fail once (rate 2/3: in band), t1 pass
    add("pass", version=1, task="t0")
    add("pass", version=1, task="t0")
    add("fail", version=1, task="t0")
    add("pass", version=1, task="t1")
    # hack suspects: one step and a tiny diff; a touched protected path
    lazy = add("pass", version=1, task="t2", steps=1, diff=0)
    sneaky = add("pass", version=1, task="t3",
                 checks=[check_row("protected:test_visible.py", "tampered")])
    add("pass", version=1, task="t3", checks=[check_row("protected:test_visible.py", "ok")])
    # infra: a committed infra_error on n2 and a retried (uncommitted) one on n1
    add("infra_error", version=1, task="t1", node="n2", infra_reason="sandbox_start: ENOSPC")
    add("infra_error", version=1, task="t1", node="n1", infra_reason="verifier: timeout",
        commit=False)
    cat.flush()
    return {"dir": run, "lazy": lazy, "sneaky": sneaky}


@pytest.fixture(scope="module")
def rep(run):
    return build_report(run["dir"])


def test_pass_rate_by_family_and_version_masks_infra_errors(rep):
    rates = {(r["task_family"], r["policy_version"]): (r["passed"], r["scored"])
             for r in rep["pass_rates"]}
    assert rates == {("python", 0): (1, 4), ("math", 0): (2, 2), ("python", 1): (6, 7)}


def test_band_occupancy_per_version(rep):
    occ = {r["policy_version"]: (r["too_hard"], r["band"], r["too_easy"], r["explore"])
           for r in rep["band_occupancy"]}
    # The curriculum's estimate (decay 0.5, Beta(1, 1), evidence >= 3). v0: every task has at
    # most 2 rollouts: little data. v1: t0 has 0.5 (v0 pass) + 3 (2 pass, 1 fail) = 3.5 weighted
    # rollouts, mean (1 + 2.5) / (2 + 3.5) = 0.64: in band; t1..t3 and m0 still little data.
    assert occ == {0: (0, 0, 0, 5), 1: (0, 1, 0, 4)}


def test_band_occupancy_with_enough_evidence_sorts_tasks_below_in_and_above(tmp_path):
    import duckdb

    from controller.analysis.report import ReportConfig, band_occupancy
    con = duckdb.connect()
    con.execute("CREATE TABLE rollouts (task_id VARCHAR, policy_version INT, outcome VARCHAR)")
    rows = [("easy", 0, "pass")] * 8 + [("hard", 0, "fail")] * 8 + [("mid", 0, "pass"), ("mid", 0, "fail")] * 4
    con.executemany("INSERT INTO rollouts VALUES (?, ?, ?)", rows + [("hard", 0, "infra_error")] * 5)
    (occ,) = band_occupancy(con, ReportConfig())
    assert (occ["too_hard"], occ["band"], occ["too_easy"], occ["explore"]) == (1, 1, 1, 0)


def test_one_step_answer_tasks_are_not_suspects_for_their_lack_of_diff(tmp_path):
    import duckdb

    from controller.analysis.report import ReportConfig, hack_suspects
    con = duckdb.connect()
    con.execute("CREATE TABLE rollouts AS SELECT * FROM (VALUES "
                "('m1', 1, 1, 'math/x', 0, 'n1', 1.0, 1, 0, false, 'math', 'pass'), "
                "('p1', 1, 1, 'python/y', 0, 'n1', 1.0, 1, 0, false, 'python', 'pass')) "
                "t(rollout_id, attempt, fencing_token, task_name, policy_version, node, reward, "
                "steps, diff_bytes, tampered, task_family, outcome)")
    con.execute("CREATE TABLE checks (rollout_id VARCHAR, attempt INT, fencing_token INT, "
                "\"check\" VARCHAR, verdict VARCHAR)")
    assert [r["rollout_id"] for r in hack_suspects(con, ReportConfig())] == ["p1"]


def test_hack_suspects_are_the_lazy_and_the_sneaky_passes(rep, run):
    why = {r["rollout_id"]: r["why"] for r in rep["hack_suspects"]}
    assert set(why) == {run["lazy"], run["sneaky"]}
    assert why[run["lazy"]] == "1 step(s), 0-byte diff"
    assert why[run["sneaky"]] == "touched protected paths"


def test_infra_errors_by_node_include_retried_attempts(rep):
    got = {(r["node"], r["reason"]): (r["attempts"], r["committed"]) for r in rep["infra_by_node"]}
    assert got == {("n2", "sandbox_start"): (1, 1), ("n1", "verifier"): (1, 0)}


def test_span_percentiles_merge_the_nodes_histograms(rep):
    spans = {r["kind"]: r for r in rep["span_percentiles"]}
    model = spans["model_call"]
    # 50 x 10 ms on n1, 150 x 20 ms on n2, 1 x 2 s on n2: p50 is 20 ms, p99 is 20 ms.
    assert (model["count"], model["nodes"]) == (201, 2)
    assert model["p50_s"] == pytest.approx(0.020, rel=1e-2)
    assert model["p99_s"] == pytest.approx(0.020, rel=1e-2)
    assert spans["tool_call"]["p50_s"] == pytest.approx(0.100, rel=1e-2)
    assert list(spans) == ["model_call", "tool_call"]


def test_html_report_has_every_section_and_well_formed_svg_plots(rep):
    page = render_html(rep)
    for heading in ("Pass rate by task family", "Band occupancy", "Hack suspects",
                    "Infra errors by node", "Time per span kind"):
        assert heading in page
    svgs = [page[i:page.index("</svg>", i) + 6] for i in range(len(page))
            if page.startswith("<svg", i)]
    assert len(svgs) == 3
    for svg in svgs:
        ET.fromstring(svg)           # well-formed XML
    assert "<polyline" in svgs[0] and "<rect" in svgs[1]


def test_svg_escapes_labels():
    svg = bar_chart(["<v1>"], {"a&b": [1.0]}, "t<", x_label="x<", y_label="y&")
    ET.fromstring(svg)
    assert "&lt;v1&gt;" in svg


def test_cli_report_text_json_and_html(run, tmp_path):
    ap = argparse.ArgumentParser()
    register(ap.add_subparsers())
    page = tmp_path / "r.html"
    args = ap.parse_args(["report", "--run", str(run["dir"]), "--html", str(page)])
    out = io.StringIO()
    assert args.func(args, out=out) == 0
    text = out.getvalue()
    assert "Hack suspects (high reward, little effort): 2" in text and page.read_text().startswith("<!doctype")
    args = ap.parse_args(["report", "--run", str(run["dir"]), "--json", "--band", "0.5", "0.9"])
    out = io.StringIO()
    assert args.func(args, out=out) == 0
    assert json.loads(out.getvalue())["band"] == [0.5, 0.9]
    args = ap.parse_args(["report", "--run", str(tmp_path / "missing")])
    assert args.func(args, out=io.StringIO()) == 2


def test_after_compaction_the_report_is_the_same_and_spans_come_from_hdr_summaries(run, rep, tmp_path):
    import shutil

    from controller.analysis.query import connect
    from controller.store.catalog import compact
    copy = tmp_path / "run"
    shutil.copytree(run["dir"], copy)
    result = compact(copy)
    assert result.targets == 5
    con = connect(copy)
    assert len(con.execute("SELECT path FROM _span_summaries").fetchall()) == 1
    assert con.execute("SELECT count(*) FROM _spans_rest").fetchone() == (0,)
    con.close()
    again = build_report(copy)
    for key in ("pass_rates", "band_occupancy", "hack_suspects", "infra_by_node",
                "span_percentiles"):
        assert again[key] == rep[key], key


# ------------------------------------------------------------------ what analysts ask next
def test_pass_at_k_is_the_unbiased_estimator_per_family_and_version():
    from math import comb

    import duckdb

    from controller.analysis.report import pass_at_k
    con = duckdb.connect()
    con.execute("CREATE TABLE rollouts (task_id VARCHAR, task_family VARCHAR, policy_version INT, "
                "outcome VARCHAR)")
    # task a: 10 samples, 3 correct; task b: 10 samples, 0 correct; task c: 4 samples (< k=5)
    rows = ([("a", "python", 0, "pass")] * 3 + [("a", "python", 0, "fail")] * 7
            + [("b", "python", 0, "fail")] * 10 + [("c", "python", 0, "pass")] * 4
            + [("a", "python", 0, "infra_error")] * 5)
    con.executemany("INSERT INTO rollouts VALUES (?, ?, ?, ?)", rows)
    got = {r["k"]: (r["tasks"], r["pass_at_k"]) for r in pass_at_k(con, (1, 5, 10, 20))}
    exact = lambda n, c, k: 1 - comb(n - c, k) / comb(n, k)   # noqa: E731
    assert got[1] == (3, pytest.approx((0.3 + 0.0 + 1.0) / 3))
    assert got[5] == (2, pytest.approx((exact(10, 3, 5) + 0.0) / 2))
    assert got[10] == (2, pytest.approx(0.5)) and 20 not in got
    assert con.execute("SELECT pass_at_k(10, 3, 5)").fetchone()[0] == pytest.approx(exact(10, 3, 5))


def test_band_movement_names_the_tasks_entering_and_leaving_the_band():
    from controller.analysis.report import band_movement
    classes = {0: {"a": "explore", "b": "band", "c": "band"},
               1: {"a": "band", "b": "band", "c": "too_easy", "d": "explore"}}
    (move,) = band_movement(classes, {"a": "task-a", "c": "task-c"})
    assert (move["policy_version"], move["entered"], move["left"]) == (1, 1, 1)
    assert move["entered_from"] == {"explore": 1} and move["left_to"] == {"too_easy": 1}
    assert move["entered_tasks"] == ["task-a"] and move["left_tasks"] == ["task-c"]


def test_the_report_and_the_curriculum_classify_the_same_outcomes_alike(tmp_path):
    import random

    import duckdb

    from controller.analysis.report import ReportConfig, band_occupancy
    from controller.taskbank.bands import BandSpec
    from controller.taskbank.curriculum import Curriculum, CurriculumConfig
    rng = random.Random(7)
    tasks = [f"t{i}" for i in range(30)]
    cfg = CurriculumConfig(decay=0.9)
    rows = [(t, v, "pass" if rng.random() < (i % 10) / 10 + v * 0.03 else "fail")
            for v in range(6) for i, t in enumerate(tasks) for _ in range(rng.randint(0, 2))]
    con = duckdb.connect()
    con.execute("CREATE TABLE rollouts (task_id VARCHAR, policy_version INT, outcome VARCHAR)")
    con.executemany("INSERT INTO rollouts VALUES (?, ?, ?)", rows)
    seen = {t for t, _, _ in rows}
    with Curriculum(tmp_path / "c.sqlite", seen, cfg) as cur:
        for n, (t, v, outcome) in enumerate(rows):
            cur.record(t, v, outcome, rollout_id=f"r{n}")
        report = {r["policy_version"]: r for r in band_occupancy(con, ReportConfig(bands=cfg.bands))}
        for v in range(6):
            seen_by_v = {t for t, u, _ in rows if u <= v}
            classes = {t: c for t, c in cur.classify(v).items() if t in seen_by_v}
            counts = {c: sum(x == c for x in classes.values()) for c in ("too_hard", "band", "too_easy", "explore")}
            assert counts == {c: report[v][c] for c in counts}, v
    assert BandSpec.from_mapping({**cfg.__dict__}) == cfg.bands


def test_a_run_that_recorded_its_curriculum_config_is_classified_with_it(run, tmp_path):
    import shutil
    copy = tmp_path / "run"
    shutil.copytree(run["dir"], copy)
    (copy / "run.json").write_text(json.dumps({"run_id": "x", "curriculum": {
        "decay": 1.0, "min_evidence": 2.0, "explore_share": 0.2}}))
    rep = build_report(copy)
    assert rep["band_spec"]["decay"] == 1.0 and "run.json" in rep["band_spec_source"]
    v1 = rep["band_occupancy"][-1]
    assert v1["explore"] < 4      # pooled over both versions with no decay: more tasks classified


def test_top_rollouts_by_reward_per_step_come_with_the_commands_that_open_them(rep, run):
    top = rep["top_by_effort"]
    assert top[0]["rollout_id"] == run["lazy"] and top[0]["reward_per_step"] == 1.0
    assert top[0]["replay"] == f"paddock replay {run['lazy']} --run {run['dir']}"
    assert top[0]["query"].startswith(f"paddock query --run {run['dir']} \"SELECT step")
    assert f"rollout_id = '{run['lazy']}'" in top[0]["query"]


def test_slowest_rollouts_split_their_wall_time_by_span_kind(rep):
    slow = {r["rollout_id"]: r for r in rep["slowest_rollouts"]}
    first = slow["r001"]            # 50 x 10 ms model calls, 10 x 100 ms tool calls, 10 s wall
    assert first["model_call_s"] == pytest.approx(0.5) and first["tool_call_s"] == pytest.approx(1.0)
    assert first["other_s"] == pytest.approx(first["wall_s"] - 1.5)


def test_text_rounds_for_reading_and_json_keeps_full_precision(run):
    ap = argparse.ArgumentParser()
    register(ap.add_subparsers())
    out = io.StringIO()
    args = ap.parse_args(["report", "--run", str(run["dir"])])
    assert args.func(args, out=out) == 0
    text = out.getvalue()
    assert "85.7%" in text and "0.857142" not in text and "At a glance" in text
    assert "explore: little data: fewer than 3 weighted rollouts" in text
    out = io.StringIO()
    args = ap.parse_args(["report", "--run", str(run["dir"]), "--json"])
    assert args.func(args, out=out) == 0
    rates = {(r["task_family"], r["policy_version"]): r["pass_rate"]
             for r in json.loads(out.getvalue())["pass_rates"]}
    assert rates[("python", 1)] == 6 / 7
