"""Rollout traces: the span tree's ids, W3C trace context, tail sampling at write time, old
shards without the tree's columns, and OTLP export to a receiver on 127.0.0.1.

The receiver is an OTLP/HTTP endpoint in the test (no collector binary is installable from
PyPI, Debian or npm here) that decodes each request with the official `opentelemetry-proto`
messages; the spans reach it through the OpenTelemetry SDK's exporter. Real Parquet + DuckDB.
"""
from __future__ import annotations

import gzip
import http.server
import math
import threading
import time
from datetime import datetime, timedelta, timezone

import pyarrow.parquet as pq
import pytest
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
    ExportTraceServiceRequest,
    ExportTraceServiceResponse,
)

from controller.analysis.query import connect
from controller.analysis.report import ReportConfig, hack_suspects
from controller.store.catalog import Catalog, compact
from nodeagent.store import tracing
from nodeagent.store.writer import SchemaError, write_attempt
from tests.conftest import FakeClock, wait_for

T0 = datetime(2025, 1, 2, 3, 4, 5, tzinfo=timezone.utc)
SPANS = [{"kind": "sandbox_start", "name": "native", "step": None, "start_s": 0.0, "duration_s": 0.2},
         {"kind": "model_call", "name": "m", "step": 0, "start_s": 0.2, "duration_s": 1.0},
         {"kind": "tool_call", "name": "shell", "step": 0, "start_s": 1.2, "duration_s": 0.3},
         {"kind": "model_call", "name": "m", "step": 1, "start_s": 1.5, "duration_s": 0.4},
         {"kind": "verification", "name": "pytest", "step": None, "start_s": 2.0, "duration_s": 0.5}]


def row(rid="r1", attempt=1, token=1, *, outcome="pass", reward=None, family="python", wall_s=10.0,
        steps=5, diff_bytes=500, tampered=False, **extra) -> dict:
    if reward is None and outcome not in ("infra_error", "judge_failed"):
        reward = 1.0 if outcome == "pass" else 0.0
    r = dict(run_id="run-a", rollout_id=rid, attempt=attempt, fencing_token=token, batch_id="b0",
             task_id=f"sha256:{rid}", task_name=f"task-{family}", task_family=family,
             taskset_hash="sha256:set", image_digest="sha256:img", verifier_version="v1",
             policy_version=0, seed=7, node="n1", outcome=outcome, reward=reward,
             reward_components={"tests": reward}, tampered=tampered,
             infra_reason="sandbox died" if outcome == "infra_error" else None, started_at=T0,
             finished_at=T0 + timedelta(seconds=wall_s), wall_s=wall_s, agent_s=wall_s * 0.8,
             verify_s=wall_s * 0.2, steps=steps, prompt_tokens=100, completion_tokens=20,
             limits={"memory_mb": 256}, answer="done", diff_bytes=diff_bytes)
    r.update(extra)
    return r


def q(run, sql):
    con = connect(run)
    try:
        return con.execute(sql).fetchall()
    finally:
        con.close()


# -- ids and W3C trace context ----------------------------------------------------------------

def test_ids_are_derived_from_the_rollout_and_read_by_the_official_w3c_propagator():
    from opentelemetry.trace import get_current_span
    from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator
    ctx = tracing.attempt_context("run-a", "r1", 2, 9)
    assert ctx == tracing.attempt_context("run-a", "r1", 2, 9)            # every node agrees
    assert ctx.trace_id == tracing.trace_id("run-a", "r1") == tracing.attempt_context("run-a", "r1", 3, 10).trace_id
    assert ctx.span_id != tracing.attempt_context("run-a", "r1", 3, 10).span_id   # a root per attempt
    assert tracing.trace_id("run-a", "r2") != ctx.trace_id and tracing.trace_id("run-b", "r1") != ctx.trace_id
    # OpenTelemetry's own W3C propagator reads the header we send, and we read what it writes.
    sc = get_current_span(TraceContextTextMapPropagator().extract({"traceparent": ctx.header()})).get_span_context()
    assert (f"{sc.trace_id:032x}", f"{sc.span_id:016x}", sc.trace_flags.sampled) == (ctx.trace_id, ctx.span_id, True)
    carrier: dict[str, str] = {}
    from opentelemetry.trace import NonRecordingSpan, SpanContext, TraceFlags, set_span_in_context
    theirs = SpanContext(0xABC, 0xDEF, is_remote=False, trace_flags=TraceFlags(0))
    TraceContextTextMapPropagator().inject(carrier, set_span_in_context(NonRecordingSpan(theirs)))
    assert tracing.parse_traceparent(carrier["traceparent"]) == tracing.TraceContext(
        f"{0xABC:032x}", f"{0xDEF:016x}", False)


# The traceparent cases of the W3C Trace Context test suite (w3c/trace-context, test/test.py),
# as data: each value and whether a participant continues the trace it names.
W3C_TRACE = "12345678901234567890123456789012"
W3C_VALID = [f"00-{W3C_TRACE}-1234567890123456-01", f"cc-{W3C_TRACE}-1234567890123456-01",
             f"cc-{W3C_TRACE}-1234567890123456-01-what-the-future-will-be-like",
             f" 00-{W3C_TRACE}-1234567890123456-01", f"\t00-{W3C_TRACE}-1234567890123456-01",
             f"00-{W3C_TRACE}-1234567890123456-01 ", f"00-{W3C_TRACE}-1234567890123456-01\t",
             f"\t 00-{W3C_TRACE}-1234567890123456-01 \t", f"00-{W3C_TRACE}-1234567890123456-00"]
W3C_INVALID = [f"00-{W3C_TRACE}-1234567890123456-01.",
               f"00-{W3C_TRACE}-1234567890123456-01-what-the-future-will-be-like",
               f"cc-{W3C_TRACE}-1234567890123456-01.what-the-future-will-be-like",
               f"ff-{W3C_TRACE}-1234567890123456-01", f".0-{W3C_TRACE}-1234567890123456-01",
               f"0.-{W3C_TRACE}-1234567890123456-01", f"000-{W3C_TRACE}-1234567890123456-01",
               f"0000-{W3C_TRACE}-1234567890123456-01", f"0-{W3C_TRACE}-1234567890123456-01",
               "00-00000000000000000000000000000000-1234567890123456-01",
               "00-.2345678901234567890123456789012-1234567890123456-01",
               "00-1234567890123456789012345678901.-1234567890123456-01",
               "00-123456789012345678901234567890123-1234567890123456-01",
               "00-1234567890123456789012345678901-1234567890123456-01",
               f"00-{W3C_TRACE}-0000000000000000-01", f"00-{W3C_TRACE}-.234567890123456-01",
               f"00-{W3C_TRACE}-123456789012345.-01", f"00-{W3C_TRACE}-12345678901234567-01",
               f"00-{W3C_TRACE}-123456789012345-01", f"00-{W3C_TRACE}-1234567890123456-.0",
               f"00-{W3C_TRACE}-1234567890123456-0.", f"00-{W3C_TRACE}-1234567890123456-001",
               f"00-{W3C_TRACE}-1234567890123456-1"]


@pytest.mark.parametrize("value", W3C_VALID)
def test_the_w3c_suites_valid_traceparents_are_read(value):
    ctx = tracing.parse_traceparent(value)
    assert ctx is not None and (ctx.trace_id, ctx.span_id) == (W3C_TRACE, "1234567890123456")
    assert ctx.sampled == (value.strip(" \t").split("-")[3] == "01")


@pytest.mark.parametrize("value", W3C_INVALID + [
    None, "", "00-0AF7651916CD43DD8448EB211C80319C-b7ad6b7169203331-01",             # uppercase
    "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01\r\nx-evil: 1",         # injection
    "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01\r\n",                  # CRLF is not OWS
])
def test_an_invalid_traceparent_is_refused(value):
    assert tracing.parse_traceparent(value) is None


def test_a_future_version_traceparent_is_read_by_its_known_fields():
    tp = "cc-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01-what-the-future-adds"
    assert tracing.parse_traceparent(tp) == tracing.TraceContext(
        "0af7651916cd43dd8448eb211c80319c", "b7ad6b7169203331", True)


# -- tail sampling ------------------------------------------------------------------------------

def test_failed_slow_and_suspect_rollouts_are_always_kept_and_the_rest_sampled_to_the_fraction():
    cfg = tracing.TraceConfig(keep_fraction=0.1, slow_s=100.0)
    for outcome in ("fail", "timeout", "infra_error", "judge_failed"):
        assert {cfg.decide(row(f"x{i}", outcome=outcome)) for i in range(200)} == {"failed"}
    assert {cfg.decide(row(f"s{i}", wall_s=100.0)) for i in range(200)} == {"slow"}
    assert {cfg.decide(row(f"h{i}", tampered=True)) for i in range(50)} == {"suspect"}
    assert {cfg.decide(row(f"e{i}", steps=1)) for i in range(50)} == {"suspect"}     # no effort
    kept = [cfg.decide(row(f"p{i}")) for i in range(5000)]
    assert set(kept) == {"sampled", "dropped"}
    n = kept.count("sampled")
    assert abs(n - 500) < 5 * math.sqrt(5000 * 0.1 * 0.9), n                       # binomial, 5 sigma
    # The decision is the trace's: every attempt of a rollout, on any node, decides alike.
    other = tracing.TraceConfig(keep_fraction=0.1, slow_s=100.0)
    assert [other.decide(row(f"p{i}", attempt=2, token=5)) for i in range(5000)] == kept


def test_the_budget_caps_sampled_rollouts_per_minute_but_never_the_kept_ones():
    clock = FakeClock()
    cfg = tracing.TraceConfig(budget_per_min=6, clock=clock)
    assert [cfg.decide(row(f"p{i}")) for i in range(8)] == ["sampled"] * 6 + ["dropped"] * 2
    assert cfg.decide(row("f", outcome="fail")) == "failed"           # the budget is spent: still kept
    clock.advance(10.0)                                               # 6 a minute: one token back
    assert [cfg.decide(row(f"q{i}")) for i in range(2)] == ["sampled", "dropped"]
    clock.advance(3600.0)                                             # never more than a minute's worth
    assert [cfg.decide(row(f"z{i}")) for i in range(8)].count("sampled") == 6


def test_bad_sampling_settings_name_the_variable():
    with pytest.raises(ValueError, match="PADDOCK_TRACE_KEEP='lots'"):
        tracing.TraceConfig.from_env({"PADDOCK_TRACE_KEEP": "lots"})
    with pytest.raises(ValueError, match="keep_fraction"):
        tracing.TraceConfig.from_env({"PADDOCK_TRACE_KEEP": "1.5"})
    with pytest.raises(ValueError, match="PADDOCK_TRACE_SLOW_S='-1'"):
        tracing.TraceConfig.from_env({"PADDOCK_TRACE_SLOW_S": "-1"})
    cfg = tracing.TraceConfig.from_env({"OTEL_EXPORTER_OTLP_ENDPOINT": "http://127.0.0.1:4318/"})
    assert cfg.endpoint == "http://127.0.0.1:4318/v1/traces" and cfg.keep_fraction == 1.0


def test_the_write_time_suspect_rule_is_the_reports(tmp_path):
    """Every variation of the report's hack-suspect rule (reward, family, steps, diff, tampering,
    a failed protected check, infra errors): the writer keeps exactly the report's suspects."""
    cat, cases = Catalog(tmp_path), []
    variants = [dict(outcome=o, reward=r, family=f, steps=s, diff_bytes=d, tampered=t)
                for o, r in (("pass", 1.0), ("pass", 0.5), ("infra_error", None))
                for f in ("python", "math") for s in (1, 2, 3) for d in (10, 64, 65) for t in (False, True)]
    cfg = tracing.TraceConfig(keep_fraction=0.0)
    for i, v in enumerate(variants):
        rid = f"r{i:03d}"
        checks = [{"check": "test_a", "verdict": "pass", "detail": None, "wall_s": 0.1}]
        if i % 7 == 0:
            checks.append({"check": "protected:tests/test_a.py", "verdict": "modified", "detail": None,
                           "wall_s": 0.0})
        shards = write_attempt(tmp_path, "n1", row(rid, **v), [], checks, spans=SPANS, trace=cfg)
        cat.commit(rid, 1, 1, shards, committed_at=T0)
        cases.append(rid)
    cat.flush()
    con = connect(tmp_path)
    try:
        report = {d["rollout_id"] for d in hack_suspects(con, ReportConfig(limit_suspects=10_000))}
        written = {r for (r,) in con.execute("SELECT rollout_id FROM rollouts WHERE trace_sample = 'suspect'").fetchall()}
        dropped = con.execute("SELECT count(*) FROM rollouts WHERE trace_sample = 'dropped'").fetchone()[0]
        spans_of_dropped = con.execute("SELECT count(*) FROM spans JOIN rollouts USING (rollout_id) "
                                       "WHERE trace_sample = 'dropped'").fetchone()[0]
    finally:
        con.close()
    assert report and written == report
    assert dropped > 0 and spans_of_dropped == 0          # keep_fraction 0: only the kept have spans


# -- the tree in the store ----------------------------------------------------------------------

def test_the_spans_view_holds_the_tree_and_a_dropped_attempt_keeps_its_row_but_no_spans(tmp_path):
    cat = Catalog(tmp_path)
    cfg = tracing.TraceConfig(keep_fraction=0.0)
    for rid, kw in (("kept", dict(outcome="fail")), ("gone", {})):
        cat.commit(rid, 1, 1, write_attempt(tmp_path, "n1", row(rid, **kw), [], [], spans=SPANS, trace=cfg),
                   committed_at=T0)
    cat.flush()
    root = tracing.root_span_id("run-a", "kept", 1, 1)
    got = q(tmp_path, "SELECT kind, step, duration_s, trace_id, span_id, parent_span_id FROM spans ORDER BY start_s")
    # the columns analysts read are as before; the tree's columns follow
    assert [g[:3] for g in got] == [(s["kind"], s["step"], s["duration_s"]) for s in SPANS]
    assert {(g[3], g[5]) for g in got} == {(tracing.trace_id("run-a", "kept"), root)}
    ids = [g[4] for g in got]
    assert len(set(ids)) == len(ids) and root not in ids
    assert ids[1] == tracing.model_call_context(tracing.attempt_context("run-a", "kept", 1, 1), 0).span_id
    assert ids[3] == tracing.model_call_context(tracing.attempt_context("run-a", "kept", 1, 1), 1).span_id
    assert q(tmp_path, "SELECT rollout_id, trace_id, trace_sample FROM rollouts ORDER BY rollout_id") == [
        ("gone", tracing.trace_id("run-a", "gone"), "dropped"), ("kept", tracing.trace_id("run-a", "kept"), "failed")]


def test_the_report_says_when_span_times_are_of_the_kept_attempts_only(tmp_path):
    import io

    from controller.analysis.report import build_report
    from controller.analysis.report_render import print_text
    cat = Catalog(tmp_path)
    for rid, kw in (("kept", dict(outcome="fail")), ("gone", {}), ("gone2", {})):
        shards = write_attempt(tmp_path, "n1", row(rid, **kw), [], [], spans=SPANS,
                               trace=tracing.TraceConfig(keep_fraction=0.0))
        cat.commit(rid, 1, 1, shards, committed_at=T0)
    cat.flush()
    rep = build_report(tmp_path)
    assert rep["span_sampling"] == {"dropped": 2, "failed": 1}
    assert {r["kind"]: r["count"] for r in rep["span_percentiles"]}["model_call"] == 2    # the kept one's
    out = io.StringIO()
    print_text(rep, out)
    assert "the spans of 2 of 3 committed attempts were dropped" in out.getvalue()


def test_an_unknown_sampling_decision_is_a_schema_error(tmp_path):
    with pytest.raises(SchemaError, match="rollouts.trace_sample: 'maybe'"):
        write_attempt(tmp_path, "n1", row(trace_sample="maybe"), [], [], spans=SPANS)


def test_a_bulk_rollouts_batch_with_an_unknown_sampling_decision_is_refused(tmp_path):
    import pyarrow as pa

    from nodeagent.store.writer import write_batch
    base = {k: [v] for k, v in row().items() if k not in ("reward_components", "limits", "started_at",
                                                          "finished_at")}
    base.update(reward_components=['{}'], limits=['{}'], started_at=[T0], finished_at=[T0])
    assert write_batch(tmp_path, "rollouts", pa.table({**base, "trace_sample": [None]}), "a.parquet")
    assert write_batch(tmp_path, "rollouts", pa.table({**base, "trace_sample": ["failed"]}), "b.parquet")
    with pytest.raises(SchemaError, match="rollouts.trace_sample: 1 value"):
        write_batch(tmp_path, "rollouts", pa.table({**base, "trace_sample": ["maybe"]}), "c.parquet")


def test_shards_written_before_the_tree_read_and_compact_with_null_ids(tmp_path):
    cat = Catalog(tmp_path)
    old = write_attempt(tmp_path, "n1", row("old", outcome="fail"), [], [], spans=SPANS)
    for table, cols in (("spans", ["trace_id", "span_id", "parent_span_id"]),
                        ("rollouts", ["trace_id", "trace_sample"])):
        path = tmp_path / old[table]
        pq.write_table(pq.read_table(path).drop_columns(cols), path)      # as the old writer wrote it
        assert not set(cols) & set(pq.read_schema(path).names)
    cat.commit("old", 1, 1, old, committed_at=T0)
    cat.commit("new", 1, 1, write_attempt(tmp_path, "n1", row("new", outcome="fail"), [], [], spans=SPANS),
               committed_at=T0)
    cat.flush()
    want = [("new", len(SPANS), len(SPANS)), ("old", len(SPANS), 0)]
    sql = "SELECT rollout_id, count(*), count(span_id) FROM spans GROUP BY 1 ORDER BY 1"
    assert q(tmp_path, sql) == want
    assert q(tmp_path, "SELECT rollout_id, trace_sample FROM rollouts ORDER BY 1") == [("new", "failed"), ("old", None)]
    assert compact(tmp_path).sources > 0
    assert q(tmp_path, sql) == want


# -- OTLP export --------------------------------------------------------------------------------

class OtlpReceiver:
    """An OTLP/HTTP traces endpoint on 127.0.0.1 that decodes each export with the official
    opentelemetry-proto messages and keeps the spans (with their resource's attributes)."""

    def __init__(self) -> None:
        self.spans: list = []
        self.requests = 0
        outer = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_POST(self):
                body = self.rfile.read(int(self.headers["Content-Length"]))
                if self.headers.get("Content-Encoding") == "gzip":
                    body = gzip.decompress(body)
                ok = self.path == "/v1/traces" and self.headers.get("Content-Type") == "application/x-protobuf"
                if ok:
                    req = ExportTraceServiceRequest.FromString(body)
                    for rs in req.resource_spans:
                        res = {a.key: a.value.string_value for a in rs.resource.attributes}
                        for ss in rs.scope_spans:
                            outer.spans.extend((res, s) for s in ss.spans)
                    outer.requests += 1
                reply = ExportTraceServiceResponse().SerializeToString()
                self.send_response(200 if ok else 400)
                self.send_header("Content-Type", "application/x-protobuf")
                self.send_header("Content-Length", str(len(reply)))
                self.end_headers()
                self.wfile.write(reply)

            def log_message(self, *a):
                pass

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/v1/traces"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    def __enter__(self) -> "OtlpReceiver":
        self.thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self.server.shutdown()
        self.server.server_close()


def _attrs(span) -> dict:
    out = {}
    for a in span.attributes:
        v = a.value
        out[a.key] = getattr(v, v.WhichOneof("value"))
    return out


def test_a_collector_receives_the_attempts_span_tree_and_nothing_of_a_dropped_one(tmp_path):
    with OtlpReceiver() as rx:
        cfg = tracing.TraceConfig(endpoint=rx.url, keep_fraction=0.0)
        write_attempt(tmp_path, "n1", row("r1", outcome="fail"), [], [], spans=SPANS, trace=cfg)
        write_attempt(tmp_path, "n1", row("r2"), [], [], spans=SPANS, trace=cfg)     # dropped
        assert tracing.flush(10.0)
        wait_for(lambda: len(rx.spans) >= 1 + len(SPANS), 10.0, "the exported spans")
    spans = [s for _, s in rx.spans]
    assert len(spans) == 1 + len(SPANS)
    tid = bytes.fromhex(tracing.trace_id("run-a", "r1"))
    root = bytes.fromhex(tracing.root_span_id("run-a", "r1", 1, 1))
    assert {s.trace_id for s in spans} == {tid}
    (r,) = [s for s in spans if not s.parent_span_id]
    assert r.span_id == root and _attrs(r)["paddock.outcome"] == "fail" and _attrs(r)["paddock.trace_sample"] == "failed"
    assert r.start_time_unix_nano == int(T0.timestamp()) * 10**9
    assert r.end_time_unix_nano - r.start_time_unix_nano == 10 * 10**9
    children = sorted((s for s in spans if s.parent_span_id), key=lambda s: s.start_time_unix_nano)
    assert {s.parent_span_id for s in children} == {root}
    assert [_attrs(s)["paddock.span.kind"] for s in children] == [s["kind"] for s in SPANS]
    assert [round((s.end_time_unix_nano - s.start_time_unix_nano) / 1e9, 6) for s in children] == \
        [s["duration_s"] for s in SPANS]
    assert {res["host.name"] for res, _ in rx.spans} == {"n1"}


def call_row(i, **kw) -> dict:
    r = dict(call_index=i, source="harness", step=None, model="scripted-v7", request_model="whatever",
             request_messages=[{"role": "user", "content": "hi"}], request_params={}, status="ok", retries=0,
             started_at=T0 + timedelta(seconds=1 + i), upstream_s=0.25, gateway_s=0.01, prompt_tokens=11,
             completion_tokens=3 + i)
    r.update(kw)
    return r


def test_a_harness_in_the_sandbox_has_its_gateway_calls_exported_with_the_ids_sent_upstream(tmp_path):
    harness_spans = [SPANS[0], {"kind": "tool_call", "name": "harness", "step": 0, "start_s": 0.2, "duration_s": 5.0},
                     SPANS[-1]]
    with OtlpReceiver() as rx:
        cfg = tracing.TraceConfig(endpoint=rx.url)
        shards = write_attempt(tmp_path, "n1", row("r1", outcome="fail"), [], [], spans=harness_spans,
                               model_calls=[call_row(0), call_row(1), call_row(2, source="user_sim")], trace=cfg)
        assert tracing.flush(10.0)
        wait_for(lambda: len(rx.spans) >= 1 + len(harness_spans) + 2, 10.0, "the exported spans")
    stored = pq.read_table(tmp_path / shards["spans"]).to_pylist()
    assert [s["kind"] for s in stored] == [s["kind"] for s in harness_spans]      # the store: as written
    spans = [s for _, s in rx.spans]
    assert len(spans) == 1 + len(harness_spans) + 2                               # no user_sim call
    (harness_id,) = [s["span_id"] for s in stored if s["name"] == "harness"]
    calls = sorted((s for s in spans if _attrs(s).get("paddock.span.kind") == "model_call"),
                   key=lambda s: s.start_time_unix_nano)
    root = tracing.attempt_context("run-a", "r1", 1, 1)
    assert [s.span_id.hex() for s in calls] == [tracing.model_call_context(root, i).span_id for i in (0, 1)]
    assert {s.parent_span_id.hex() for s in calls} == {harness_id}
    assert [_attrs(s)["gen_ai.usage.output_tokens"] for s in calls] == [3, 4]
    assert [(s.end_time_unix_nano - s.start_time_unix_nano) for s in calls] == [260_000_000] * 2


def test_a_collector_that_is_down_costs_the_trace_not_the_attempt(tmp_path):
    with OtlpReceiver() as rx:
        url = rx.url                          # a port that was just closed: nothing listens
    cfg = tracing.TraceConfig(endpoint=url, export_timeout_s=1.0)
    t = time.monotonic()
    shards = write_attempt(tmp_path, "n1", row("r1", outcome="fail"), [], [], spans=SPANS, trace=cfg)
    assert time.monotonic() - t < 1.0          # the export is off the attempt's path
    assert pq.read_table(tmp_path / shards["spans"]).num_rows == len(SPANS)


@pytest.mark.sandbox
def test_a_real_rollout_reaches_the_collector_as_a_tree(runtime, python_image, solving_policy, tmp_path,
                                                       monkeypatch):
    """A rollout of a built-in task through the scripted policy, in a real sandbox, with the
    node's OTLP endpoint set: the collector gets the attempt's root and every span the store
    holds, with the same ids, all children of the root."""
    from controller.taskbank.builtin import builtin_taskset
    from nodeagent.agent.attempt import Attempt, run_attempt
    task = builtin_taskset().by_name()["python/reverse_words"]
    with OtlpReceiver() as rx:
        monkeypatch.setenv("PADDOCK_OTLP_ENDPOINT", rx.url)
        monkeypatch.setenv("PADDOCK_TRACE_KEEP", "0")          # a pass: kept only as a suspect or slow
        monkeypatch.setenv("PADDOCK_TRACE_SLOW_S", "0")        # ...and every rollout is slow here
        a = Attempt("run", str(tmp_path), "r1", 1, 3, "b", 1, {**task.canonical(), "task_id": task.task_id}, 7,
                    solving_policy.url, "scripted-v7")
        res = run_attempt(runtime, python_image, "n1", a)
        assert res.outcome == "pass", res.infra_reason
        assert tracing.flush(10.0)
        stored = pq.read_table(tmp_path / res.shards["spans"]).to_pylist()
        wait_for(lambda: len(rx.spans) >= 1 + len(stored), 10.0, "the rollout's spans at the collector")
    spans = [s for _, s in rx.spans]
    root = tracing.root_span_id("run", "r1", 1, 3)
    (r,) = [s for s in spans if not s.parent_span_id]
    assert r.span_id.hex() == root and _attrs(r)["paddock.trace_sample"] == "slow"
    assert {s.trace_id.hex() for s in spans} == {tracing.trace_id("run", "r1")}
    kinds = [s["kind"] for s in stored]
    assert kinds[0] == "sandbox_start" and kinds[-1] == "verification" and kinds.count("model_call") == 3
    assert sorted((s.span_id.hex(), s.parent_span_id.hex()) for s in spans if s.parent_span_id) == \
        sorted((s["span_id"], s["parent_span_id"]) for s in stored)
    assert {s["parent_span_id"] for s in stored} == {root}
    calls = [s for s in spans if _attrs(s).get("paddock.span.kind") == "model_call"]
    assert all(_attrs(s)["gen_ai.usage.output_tokens"] > 0 for s in calls)     # the gateway's rows
