"""Rollout traces: ids, the span tree, W3C trace context, tail sampling and OTLP export.

One trace per rollout, its id derived from (run_id, rollout_id): every attempt of a rollout,
on whichever node, and the node's model gateway agree on it without telling each other. Each
attempt is one root span (id from the attempt's key: run, rollout, attempt, fencing token);
its children are the attempt's spans rows (sandbox_start, each step's model_call and
tool_call, verification). A child's id is derived from the root, its kind and its ordinal
among the spans of that kind, so the gateway's n-th model call (`model_call_context`) and the
writer's n-th model_call span have the same id.

`TRACEPARENT` / the `traceparent` header are W3C Trace Context (version 00):
`00-<trace id, 32 hex>-<parent span id, 16 hex>-<flags>`; `parse_traceparent` checks one by the
spec's rules (lowercase hex, not all zeros, version ff invalid, a future version may carry more
fields).

Tail sampling (`TraceConfig.decide`) runs when the attempt is written, once its outcome is
known: failed (outcome not in `pass_outcomes`), slow (wall_s >= slow_s) and hack-suspect
attempts (the report's rule, `controller/analysis/report.py` `hack_suspects`, applied to the
one row and its checks) are always kept; the rest are kept with probability `keep_fraction`
(decided by the trace id, so all attempts of a rollout agree) and within `budget_per_min`
(a token bucket per node process). A dropped attempt's spans shard is written empty; its
rollouts row names the decision (`trace_sample`).

Export: when an OTLP/HTTP traces endpoint is configured (`PADDOCK_OTLP_ENDPOINT`, else
OpenTelemetry's `OTEL_EXPORTER_OTLP_TRACES_ENDPOINT` or `OTEL_EXPORTER_OTLP_ENDPOINT` +
`/v1/traces`), the kept attempts' trees go to it through the OpenTelemetry SDK
(opentelemetry-sdk's BatchSpanProcessor and the OTLP/HTTP protobuf exporter), off the
attempt's path (a background thread; `flush()` waits for it). Without an endpoint nothing is
imported from OpenTelemetry.

Must not import: zmq, duckdb, controller.store, controller.broker, controller.analysis,
nodeagent.agent, nodeagent.harness.
"""
from __future__ import annotations

import atexit
import hashlib
import logging
import math
import os
import re
import threading
import time
from dataclasses import dataclass, field
from datetime import datetime, timedelta, timezone
from typing import Any, Callable, Mapping, Sequence

from controller.contracts.trajectory import TRACE_SAMPLE_DECISIONS

log = logging.getLogger(__name__)

SAMPLE_DECISIONS = TRACE_SAMPLE_DECISIONS
_TP = re.compile(r"^([0-9a-f]{2})-([0-9a-f]{32})-([0-9a-f]{16})-([0-9a-f]{2})(-.*)?$")


# -- ids --------------------------------------------------------------------------------------

def _hex(nbytes: int, *parts: object) -> str:
    h = hashlib.sha256("\x00".join(str(p) for p in parts).encode()).digest()[:nbytes]
    if not any(h):                      # all-zero ids are invalid (W3C); astronomically rare
        h = b"\x00" * (nbytes - 1) + b"\x01"
    return h.hex()


def trace_id(run_id: str, rollout_id: str) -> str:
    """The rollout's trace id: 32 lowercase hex digits, the same on every node and attempt."""
    return _hex(16, "paddock-trace", run_id, rollout_id)


def root_span_id(run_id: str, rollout_id: str, attempt: int, fencing_token: int) -> str:
    """The attempt's root span id (16 hex digits)."""
    return _hex(8, "paddock-attempt", run_id, rollout_id, int(attempt), int(fencing_token))


def child_span_id(root: str, kind: str, ordinal: int) -> str:
    """The id of the `ordinal`-th (from 0) span of `kind` under the root span `root`."""
    return _hex(8, "paddock-span", root, kind, int(ordinal))


@dataclass(frozen=True)
class TraceContext:
    """A W3C trace context: trace id, parent span id, sampled flag."""
    trace_id: str
    span_id: str
    sampled: bool = True

    def header(self) -> str:
        """The `traceparent` value (version 00)."""
        return f"00-{self.trace_id}-{self.span_id}-{'01' if self.sampled else '00'}"


def attempt_context(run_id: str, rollout_id: str, attempt: int, fencing_token: int) -> TraceContext:
    """The context of an attempt's root span (what its gateway session and sandbox are given)."""
    return TraceContext(trace_id(run_id, rollout_id), root_span_id(run_id, rollout_id, attempt, fencing_token))


def model_call_context(root: TraceContext, call_index: int) -> TraceContext:
    """The context the gateway sends upstream with its `call_index`-th call of the attempt: the
    call's model_call span as the parent of the model server's spans."""
    return TraceContext(root.trace_id, child_span_id(root.span_id, "model_call", call_index), root.sampled)


def sandbox_env(ctx: TraceContext | None) -> dict[str, str]:
    """The environment that hands the trace context to a harness inside the sandbox
    (`TRACEPARENT`, the OpenTelemetry convention for environment carriers); {} without one."""
    return {"TRACEPARENT": ctx.header()} if ctx is not None else {}


def parse_traceparent(value: str | None) -> TraceContext | None:
    """A `traceparent` header or TRACEPARENT value, or None when it is absent or invalid."""
    if not value:
        return None
    m = _TP.match(value.strip(" \t"))         # OWS: spaces and tabs only
    if m is None:
        return None
    version, tid, sid, flags, rest = m.groups()
    if version == "ff" or (version == "00" and rest) or set(tid) == {"0"} or set(sid) == {"0"}:
        return None
    return TraceContext(tid, sid, bool(int(flags, 16) & 1))


# -- the tree ---------------------------------------------------------------------------------

def with_ids(spans: Sequence[Mapping[str, Any]], run_id: str, rollout_id: str, attempt: int,
             fencing_token: int) -> list[dict]:
    """The attempt's span rows with `trace_id`, `span_id` and `parent_span_id` (the root) set
    where not given. Ordinals count per kind in the rows' order (model_call spans in call order)."""
    tid = trace_id(run_id, rollout_id)
    root = root_span_id(run_id, rollout_id, attempt, fencing_token)
    seen: dict[str, int] = {}
    out = []
    for row in spans:
        kind = str(row.get("kind"))
        n = seen.get(kind, 0)
        seen[kind] = n + 1
        r = dict(row)
        r.setdefault("trace_id", tid)
        r.setdefault("span_id", child_span_id(root, kind, n))
        r.setdefault("parent_span_id", root)
        out.append(r)
    return out


# -- tail sampling ----------------------------------------------------------------------------

def _env_float(env: Mapping[str, str], name: str, default: float) -> float:
    raw = env.get(name)
    if raw is None or raw == "":
        return default
    try:
        value = float(raw)
    except ValueError:
        raise ValueError(f"{name}={raw!r} is not a number") from None
    if math.isnan(value) or value < 0:
        raise ValueError(f"{name}={raw!r} must be a number >= 0")
    return value


@dataclass
class TraceConfig:
    """Tail sampling and export settings of one node process (`from_env`)."""
    endpoint: str | None = None          # OTLP/HTTP traces URL; None: no export
    keep_fraction: float = 1.0           # of the attempts not kept for a reason
    budget_per_min: float = math.inf     # at most this many such attempts a minute
    slow_s: float = 600.0                # an attempt this long or longer is always kept
    pass_outcomes: tuple[str, ...] = ("pass",)   # any other outcome is a failure: kept
    hack_min_reward: float = 1.0         # the report's hack-suspect rule (ReportConfig's defaults)
    hack_max_steps: int = 2
    hack_max_diff_bytes: int = 64
    answer_families: tuple[str, ...] = ("math",)
    export_timeout_s: float = 10.0       # one export's bound, retries included
    clock: Callable[[], float] = time.monotonic
    _tokens: float = field(default=math.nan, repr=False)
    _last: float = field(default=math.nan, repr=False)
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    def __post_init__(self) -> None:
        if not 0.0 <= self.keep_fraction <= 1.0:
            raise ValueError(f"trace keep_fraction {self.keep_fraction!r} must lie in [0, 1]")
        if not self.budget_per_min >= 0:
            raise ValueError(f"trace budget_per_min {self.budget_per_min!r} must be >= 0")

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None, **kw: Any) -> "TraceConfig":
        """PADDOCK_OTLP_ENDPOINT (else OTEL_EXPORTER_OTLP_TRACES_ENDPOINT, else
        OTEL_EXPORTER_OTLP_ENDPOINT + /v1/traces), PADDOCK_TRACE_KEEP (fraction, default 1),
        PADDOCK_TRACE_BUDGET_PER_MIN (default unlimited), PADDOCK_TRACE_SLOW_S (default 600).
        A malformed value raises ValueError naming the variable."""
        env = os.environ if env is None else env
        endpoint = env.get("PADDOCK_OTLP_ENDPOINT") or env.get("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT") or None
        if endpoint is None and env.get("OTEL_EXPORTER_OTLP_ENDPOINT"):
            endpoint = env["OTEL_EXPORTER_OTLP_ENDPOINT"].rstrip("/") + "/v1/traces"
        return cls(endpoint=endpoint, keep_fraction=_env_float(env, "PADDOCK_TRACE_KEEP", 1.0),
                   budget_per_min=_env_float(env, "PADDOCK_TRACE_BUDGET_PER_MIN", math.inf),
                   slow_s=_env_float(env, "PADDOCK_TRACE_SLOW_S", 600.0), **kw)

    def is_suspect(self, row: Mapping[str, Any], checks: Sequence[Mapping[str, Any]] = ()) -> bool:
        """The report's hack-suspect rule on one rollouts row and its checks rows."""
        reward = row.get("reward")
        if reward is None or reward < self.hack_min_reward or row.get("outcome") == "infra_error":
            return False
        if row.get("tampered"):
            return True
        if any(str(c.get("check", "")).startswith("protected:") and c.get("verdict") not in ("ok", "pass")
               for c in checks):
            return True
        effortful = row.get("task_family") not in self.answer_families
        return effortful and ((row.get("steps") or 0) <= self.hack_max_steps
                              or (row.get("diff_bytes") or 0) <= self.hack_max_diff_bytes)

    def decide(self, row: Mapping[str, Any], checks: Sequence[Mapping[str, Any]] = ()) -> str:
        """One of SAMPLE_DECISIONS for a finished attempt's rollouts row (and its checks)."""
        if self.is_suspect(row, checks):
            return "suspect"
        if row.get("outcome") not in self.pass_outcomes:
            return "failed"
        wall = row.get("wall_s")
        if isinstance(wall, (int, float)) and wall >= self.slow_s:
            return "slow"
        if self.keep_fraction < 1.0:
            tid = trace_id(str(row.get("run_id")), str(row.get("rollout_id")))
            if int(tid[:16], 16) / 2.0 ** 64 >= self.keep_fraction:
                return "dropped"
        return "sampled" if self._take() else "dropped"

    def _take(self) -> bool:
        """One token of the per-minute budget (a bucket of `budget_per_min` tokens refilled
        continuously), or False when it is empty."""
        if self.budget_per_min == math.inf:
            return True
        with self._lock:
            now = self.clock()
            if math.isnan(self._tokens):
                self._tokens, self._last = self.budget_per_min, now
            self._tokens = min(self.budget_per_min,
                               self._tokens + (now - self._last) * self.budget_per_min / 60.0)
            self._last = now
            if self._tokens >= 1.0:
                self._tokens -= 1.0
                return True
            return False


_CONFIG: TraceConfig | None = None
_CONFIG_ENV: tuple | None = None
_CONFIG_LOCK = threading.Lock()
_ENV_NAMES = ("PADDOCK_OTLP_ENDPOINT", "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", "OTEL_EXPORTER_OTLP_ENDPOINT",
              "PADDOCK_TRACE_KEEP", "PADDOCK_TRACE_BUDGET_PER_MIN", "PADDOCK_TRACE_SLOW_S")


def node_config() -> TraceConfig:
    """The node process's config, from its environment (re-read when those variables change;
    the budget's bucket is kept while they do not)."""
    global _CONFIG, _CONFIG_ENV
    key = tuple(os.environ.get(n) for n in _ENV_NAMES)
    with _CONFIG_LOCK:
        if _CONFIG is None or key != _CONFIG_ENV:
            _CONFIG, _CONFIG_ENV = TraceConfig.from_env(), key
        return _CONFIG


# -- OTLP export ------------------------------------------------------------------------------

def _ns(t: datetime) -> int:
    if t.tzinfo is None:
        t = t.replace(tzinfo=timezone.utc)
    return int(round(t.timestamp() * 1e6)) * 1000


def _attr(d: dict, key: str, value: Any) -> None:
    if value is not None and not (isinstance(value, float) and not math.isfinite(value)):
        d[key] = value


def otel_spans(rollout: Mapping[str, Any], spans: Sequence[Mapping[str, Any]], decision: str,
               model_calls: Sequence[Mapping[str, Any]] = ()) -> list:
    """The attempt's tree as OpenTelemetry SDK `ReadableSpan`s: the root (the attempt) first,
    then one per spans row (ids as `with_ids` gave them). Times: `started_at` plus the rows'
    `start_s`. Model calls of the built-in harness carry their gateway row's model and tokens;
    a harness in the sandbox's calls (gateway rows beyond the model_call spans) become spans
    of their own under the harness's span."""
    from opentelemetry.sdk.resources import Resource
    from opentelemetry.sdk.trace import ReadableSpan
    from opentelemetry.sdk.util.instrumentation import InstrumentationScope
    from opentelemetry.trace import SpanContext, SpanKind, Status, StatusCode, TraceFlags

    run_id, rollout_id = str(rollout["run_id"]), str(rollout["rollout_id"])
    tid = int(trace_id(run_id, rollout_id), 16)
    root_hex = root_span_id(run_id, rollout_id, rollout["attempt"], rollout["fencing_token"])
    flags = TraceFlags(TraceFlags.SAMPLED)
    root_ctx = SpanContext(tid, int(root_hex, 16), is_remote=False, trace_flags=flags)
    resource = Resource.create({"service.name": "paddock-node", "host.name": str(rollout.get("node") or ""),
                                "paddock.run_id": run_id})
    scope = InstrumentationScope("paddock.nodeagent")
    started = rollout["started_at"]
    if not isinstance(started, datetime):
        started = datetime.fromtimestamp(float(started), tz=timezone.utc)
    attrs: dict[str, Any] = {}
    for key in ("rollout_id", "attempt", "fencing_token", "batch_id", "task_id", "task_name", "task_family",
                "policy_version", "outcome", "reward", "steps", "infra_reason", "stop_reason", "tampered"):
        _attr(attrs, f"paddock.{key}", rollout.get(key))
    attrs["paddock.trace_sample"] = decision
    outcome = rollout.get("outcome")
    status = Status(StatusCode.ERROR, f"{outcome}: {rollout.get('infra_reason') or ''}"[:200]) \
        if outcome in ("infra_error", "judge_failed") else Status(StatusCode.UNSET)
    wall = float(rollout.get("wall_s") or 0.0)
    out = [ReadableSpan(f"rollout {rollout.get('task_name') or ''}".strip(), context=root_ctx, parent=None,
                        resource=resource, attributes=attrs, kind=SpanKind.INTERNAL, status=status,
                        start_time=_ns(started), end_time=_ns(started + timedelta(seconds=wall)),
                        instrumentation_scope=scope)]
    calls = {int(c["call_index"]): c for c in model_calls
             if c.get("source") != "user_sim" and c.get("call_index") is not None}
    n_model = 0
    for row in spans:
        kind = str(row["kind"])
        a: dict[str, Any] = {"paddock.span.kind": kind}
        _attr(a, "paddock.step", row.get("step"))
        span_kind = SpanKind.INTERNAL
        if kind == "model_call":
            span_kind = SpanKind.CLIENT
            call = calls.get(n_model)
            n_model += 1
            _attr(a, "gen_ai.request.model", row.get("name"))
            if call is not None:
                _attr(a, "gen_ai.response.model", call.get("model"))
                _attr(a, "gen_ai.usage.input_tokens", call.get("prompt_tokens"))
                _attr(a, "gen_ai.usage.output_tokens", call.get("completion_tokens"))
                _attr(a, "paddock.call.status", call.get("status"))
        start = started + timedelta(seconds=float(row["start_s"]))
        ctx = SpanContext(tid, int(row["span_id"], 16), is_remote=False, trace_flags=flags)
        parent = SpanContext(tid, int(row["parent_span_id"], 16), is_remote=False, trace_flags=flags)
        name = f"{kind} {row['name']}" if row.get("name") else kind
        out.append(ReadableSpan(name, context=ctx, parent=parent, resource=resource, attributes=a,
                                kind=span_kind, start_time=_ns(start),
                                end_time=_ns(start + timedelta(seconds=float(row["duration_s"]))),
                                instrumentation_scope=scope))
    # A harness inside the sandbox: its model calls are the gateway's rows, not spans rows. They
    # are exported as the gateway's spans, with the ids the gateway sent upstream, under the
    # harness's span.
    harness = [r["span_id"] for r in spans if r.get("kind") == "tool_call" and r.get("name") == "harness"]
    under = SpanContext(tid, int(harness[0] if harness else root_hex, 16), is_remote=False, trace_flags=flags)
    for i in sorted(calls):
        call, at = calls[i], calls[i].get("started_at")
        if isinstance(at, (int, float)) and not isinstance(at, bool):
            at = datetime.fromtimestamp(at, tz=timezone.utc)
        if i < n_model or not isinstance(at, datetime):
            continue
        start = at
        a = {"paddock.span.kind": "model_call", "paddock.call.index": i}
        for key, col in (("gen_ai.request.model", "request_model"), ("gen_ai.response.model", "model"),
                         ("gen_ai.usage.input_tokens", "prompt_tokens"),
                         ("gen_ai.usage.output_tokens", "completion_tokens"), ("paddock.call.status", "status"),
                         ("paddock.step", "step")):
            _attr(a, key, call.get(col))
        sid = child_span_id(root_hex, "model_call", i)
        dur = float(call.get("upstream_s") or 0.0) + float(call.get("gateway_s") or 0.0)
        out.append(ReadableSpan(f"model_call {call.get('model') or ''}".strip(),
                                context=SpanContext(tid, int(sid, 16), is_remote=False, trace_flags=flags),
                                parent=under, resource=resource, attributes=a, kind=SpanKind.CLIENT,
                                start_time=_ns(start), end_time=_ns(start + timedelta(seconds=dur)),
                                instrumentation_scope=scope))
    return out


class Exporter:
    """An OTLP/HTTP exporter behind the SDK's BatchSpanProcessor (a background thread)."""

    def __init__(self, endpoint: str, timeout_s: float = 10.0) -> None:
        from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
        from opentelemetry.sdk.trace.export import BatchSpanProcessor
        self.endpoint = endpoint
        self._processor = BatchSpanProcessor(OTLPSpanExporter(endpoint=endpoint, timeout=timeout_s))

    def export(self, spans: Sequence) -> None:
        for s in spans:
            self._processor.on_end(s)

    def flush(self, timeout_s: float = 30.0) -> bool:
        return bool(self._processor.force_flush(int(timeout_s * 1000)))

    def shutdown(self) -> None:
        self._processor.shutdown()


_EXPORTERS: dict[tuple[str, float], Exporter] = {}


def exporter_for(endpoint: str, timeout_s: float = 10.0) -> Exporter:
    """The process's exporter to `endpoint` (made once; shut down, flushing, at exit: a
    collector that is down holds the exit for at most `timeout_s`)."""
    with _CONFIG_LOCK:
        ex = _EXPORTERS.get((endpoint, timeout_s))
        if ex is None:
            ex = _EXPORTERS[(endpoint, timeout_s)] = Exporter(endpoint, timeout_s)
            atexit.register(ex.shutdown)
        return ex


def export_attempt(cfg: TraceConfig, rollout: Mapping[str, Any], spans: Sequence[Mapping[str, Any]],
                   decision: str, model_calls: Sequence[Mapping[str, Any]] = ()) -> bool:
    """Queue a kept attempt's tree for export when `cfg` has an endpoint; never raises (a
    collector that is down costs the trace, not the attempt). True when queued."""
    if not cfg.endpoint or decision == "dropped":
        return False
    try:
        exporter_for(cfg.endpoint, cfg.export_timeout_s).export(otel_spans(rollout, spans, decision, model_calls))
        return True
    except Exception as exc:    # noqa: BLE001 - tracing must never fail an attempt
        log.warning("trace export of rollout %s attempt %s failed: %r", rollout.get("rollout_id"),
                    rollout.get("attempt"), exc)
        return False


def flush(timeout_s: float = 30.0) -> bool:
    """Wait until every queued span went out (or `timeout_s`); True when all did."""
    return all(ex.flush(timeout_s) for ex in list(_EXPORTERS.values()))
