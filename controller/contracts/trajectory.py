"""The trajectory store's schema, shared by its writers (node agents) and readers (catalog,
DuckDB views, reports): the shard tables and their Arrow schemas, key and provenance columns,
which columns are optional or JSON, and how a shard is named.

Pure data and pure functions (pyarrow types only; nothing is read or written here). The
writer is `nodeagent.store.writer`; the columns are documented in docs/trajectories.md.

Must not import: zmq, duckdb, sqlite3, nodeagent, controller.store, controller.broker.
"""
from __future__ import annotations

import pyarrow as pa

# SHARD_TABLES: the tables whose shards the catalog names per committed key; the names live
# in controller/contracts/shardnames.py (no pyarrow: the controller's start-up needs them).
from controller.contracts.shardnames import SHARD_TABLES, shard_name, shard_suffix  # noqa: F401 - re-exported

TABLES = SHARD_TABLES
# Every table a node writes per attempt: the shard tables and `model_calls`, whose shard has
# the same name as the attempt's other shards and whose rows the views show through the
# catalog's committed keys (it is not one of the catalog's shard columns).
ATTEMPT_TABLES: tuple[str, ...] = SHARD_TABLES + ("model_calls",)
CALL_STATUSES = ("ok", "error", "budget")
CALL_SOURCES = ("builtin", "harness", "user_sim")   # user_sim: a simulated user's calls, never trained on
SPAN_KINDS = ("model_call", "tool_call", "sandbox_start", "verification")
# rollouts.trace_sample: why the attempt's spans were kept (suspect, failed, slow, sampled) or not.
TRACE_SAMPLE_DECISIONS = ("suspect", "failed", "slow", "sampled", "dropped")
# What produced a row: copied from the rollout row into every child row by the writer.
PROVENANCE_COLUMNS = ("taskset_hash", "task_id", "image_digest", "verifier_version",
                      "policy_version", "limits")
KEY_COLUMNS = ("run_id", "rollout_id", "attempt", "fencing_token")

_TS = pa.timestamp("us", tz="UTC")


def _f(name: str, type_: pa.DataType, nullable: bool = False) -> pa.Field:
    return pa.field(name, type_, nullable=nullable)


_KEY_FIELDS = [
    _f("run_id", pa.string()),
    _f("rollout_id", pa.string()),
    _f("attempt", pa.int32()),
    _f("fencing_token", pa.int64()),
]

ROLLOUTS_SCHEMA = pa.schema(_KEY_FIELDS + [
    _f("batch_id", pa.string(), True),
    _f("task_id", pa.string()),
    _f("task_name", pa.string()),
    _f("task_family", pa.string()),
    _f("taskset_hash", pa.string()),
    _f("image_digest", pa.string()),
    _f("verifier_version", pa.string()),
    _f("policy_version", pa.int32()),
    _f("seed", pa.int64()),
    _f("node", pa.string()),
    _f("outcome", pa.string()),
    _f("reward", pa.float64(), True),
    _f("reward_components", pa.string()),
    _f("tampered", pa.bool_()),
    _f("infra_reason", pa.string(), True),
    _f("started_at", _TS),
    _f("finished_at", _TS),
    _f("wall_s", pa.float64()),
    _f("agent_s", pa.float64()),
    _f("verify_s", pa.float64()),
    _f("steps", pa.int32()),
    _f("prompt_tokens", pa.int64()),
    _f("completion_tokens", pa.int64()),
    _f("limits", pa.string()),
    _f("answer", pa.string(), True),
    _f("diff_bytes", pa.int64()),
    # Analyst extras: optional keys (NULL when omitted), see OPTIONAL_COLUMNS.
    _f("split", pa.string(), True),
    _f("stop_reason", pa.string(), True),
    _f("diff_files", pa.int32(), True),
    _f("cpu_s", pa.float64(), True),
    _f("peak_memory_bytes", pa.int64(), True),
    _f("changes_path", pa.string(), True),   # the verifier's changes artifact (rescore)
    _f("trace_id", pa.string(), True),       # the rollout's trace (32 hex; nodeagent/store/tracing.py)
    _f("trace_sample", pa.string(), True),   # the tail-sampling decision: TRACE_SAMPLE_DECISIONS
    _f("infra_code", pa.string(), True),     # the code of infra_reason: states.INFRA_CODES
])

STEPS_SCHEMA = pa.schema(_KEY_FIELDS + [
    _f("step", pa.int32()),
    _f("role", pa.string()),
    _f("content", pa.string(), True),
    _f("tool_name", pa.string(), True),
    _f("tool_args", pa.string(), True),
    _f("observation", pa.string(), True),
    _f("exit_code", pa.int32(), True),
    _f("started_at", _TS),
    _f("wall_s", pa.float64()),
    _f("model_s", pa.float64(), True),
    _f("tool_s", pa.float64(), True),
    _f("prompt_tokens", pa.int64(), True),
    _f("completion_tokens", pa.int64(), True),
    _f("logprobs", pa.string(), True),
    # Analyst extras: optional keys (NULL when omitted).
    _f("observation_truncated", pa.bool_(), True),
    _f("tool_faults", pa.string(), True),   # JSON list of the faults injected in this step's tool calls
])

CHECKS_SCHEMA = pa.schema(_KEY_FIELDS + [
    _f("check", pa.string()),
    _f("verdict", pa.string()),
    _f("detail", pa.string(), True),
    _f("wall_s", pa.float64()),
])

SPANS_SCHEMA = pa.schema(_KEY_FIELDS + [
    _f("kind", pa.string()),
    _f("name", pa.string(), True),
    _f("step", pa.int32(), True),
    _f("start_s", pa.float64()),
    _f("duration_s", pa.float64()),
    _f("node", pa.string(), True),      # the node the span ran on (the writer fills it)
])

EGRESS_SCHEMA = pa.schema(_KEY_FIELDS + [
    _f("sandbox", pa.string(), True),
    _f("host", pa.string(), True),
    _f("port", pa.int32(), True),
    _f("address", pa.string(), True),
    _f("verdict", pa.string()),
    _f("reason", pa.string(), True),
    _f("ts", _TS),
])

# One row per model call through the node's gateway (nodeagent/gateway/session.py).
MODEL_CALLS_SCHEMA = pa.schema(_KEY_FIELDS + [
    _f("call_index", pa.int32()),
    _f("parent_call", pa.int32(), True),              # branches: the call this prompt continues
    _f("prompt_extends_previous", pa.bool_(), True),  # prompt ids = previous prompt + completion + ...
    _f("source", pa.string()),                        # builtin | harness | user_sim
    _f("step", pa.int32(), True),
    _f("call_policy_version", pa.int32(), True),      # the version that answered this call
    _f("model", pa.string(), True),
    _f("request_model", pa.string(), True),
    _f("request_messages", pa.string()),
    _f("request_tools", pa.string(), True),
    _f("request_params", pa.string()),
    _f("response", pa.string(), True),
    _f("finish_reason", pa.string(), True),
    _f("prompt_token_ids", pa.list_(pa.int32()), True),
    _f("completion_token_ids", pa.list_(pa.int32()), True),
    _f("completion_logprobs", pa.list_(pa.float64()), True),
    _f("prompt_tokens", pa.int64(), True),
    _f("completion_tokens", pa.int64(), True),
    _f("status", pa.string()),                        # ok | error | budget
    _f("error", pa.string(), True),
    _f("retries", pa.int32()),                        # refused while a new version loaded
    _f("started_at", _TS),
    _f("upstream_s", pa.float64()),
    _f("gateway_s", pa.float64()),
])

# Provenance fields appended to every child table (nullable: shards written before these
# columns existed read as NULL).
_PROVENANCE_FIELDS = [
    _f("taskset_hash", pa.string(), True),
    _f("task_id", pa.string(), True),
    _f("image_digest", pa.string(), True),
    _f("verifier_version", pa.string(), True),
    _f("policy_version", pa.int32(), True),
    _f("limits", pa.string(), True),
]
STEPS_SCHEMA = pa.schema(list(STEPS_SCHEMA) + _PROVENANCE_FIELDS)
CHECKS_SCHEMA = pa.schema(list(CHECKS_SCHEMA) + _PROVENANCE_FIELDS)
# The span tree (nullable: shards written before these columns existed read as NULL).
_TRACE_FIELDS = [
    _f("trace_id", pa.string(), True),        # 32 hex: the rollout's trace
    _f("span_id", pa.string(), True),         # 16 hex
    _f("parent_span_id", pa.string(), True),  # 16 hex: the attempt's root span
]
SPANS_SCHEMA = pa.schema(list(SPANS_SCHEMA) + _PROVENANCE_FIELDS + _TRACE_FIELDS)
EGRESS_SCHEMA = pa.schema(list(EGRESS_SCHEMA) + _PROVENANCE_FIELDS)
MODEL_CALLS_SCHEMA = pa.schema(list(MODEL_CALLS_SCHEMA) + _PROVENANCE_FIELDS)

SCHEMAS: dict[str, pa.Schema] = {
    "rollouts": ROLLOUTS_SCHEMA, "steps": STEPS_SCHEMA, "checks": CHECKS_SCHEMA,
    "spans": SPANS_SCHEMA, "egress": EGRESS_SCHEMA, "model_calls": MODEL_CALLS_SCHEMA,
}

# Columns a caller may leave out (they become NULL). Every other column is a required key,
# even when nullable: a required nullable column must be passed explicitly as None.
OPTIONAL_COLUMNS: dict[str, frozenset[str]] = {
    "rollouts": frozenset({"split", "stop_reason", "diff_files", "cpu_s", "peak_memory_bytes", "changes_path",
                           "trace_id", "trace_sample", "infra_code"}),
    "steps": frozenset({"observation_truncated", "tool_faults"}) | frozenset(PROVENANCE_COLUMNS),
    "checks": frozenset(PROVENANCE_COLUMNS),
    "spans": frozenset({"name", "step", "node", "trace_id", "span_id", "parent_span_id"})
    | frozenset(PROVENANCE_COLUMNS),
    "egress": frozenset({"sandbox", "host", "port", "address", "reason"})
    | frozenset(PROVENANCE_COLUMNS),
    "model_calls": frozenset({"parent_call", "prompt_extends_previous", "step", "call_policy_version", "model",
                              "request_model", "request_tools", "response", "finish_reason", "prompt_token_ids",
                              "completion_token_ids", "completion_logprobs", "prompt_tokens",
                              "completion_tokens", "error"}) | frozenset(PROVENANCE_COLUMNS),
}

# Columns holding JSON text: callers may pass a str (must parse) or any JSON-able object.
JSON_COLUMNS: dict[str, frozenset[str]] = {
    "rollouts": frozenset({"reward_components", "limits"}),
    "steps": frozenset({"tool_args", "logprobs", "limits", "tool_faults"}),
    "checks": frozenset({"limits"}),
    "spans": frozenset({"limits"}),
    "egress": frozenset({"limits"}),
    "model_calls": frozenset({"request_messages", "request_tools", "request_params", "response", "limits"}),
}
