"""Trajectory shard writer: one Parquet file per table per rollout attempt, written atomically.

A node agent calls `write_attempt` once an attempt has finished (verified or failed). The rows
are checked against the schemas of `controller.contracts.trajectory` (one per table); every child row (steps, checks, spans, egress) gets the rollout
row's keys and provenance columns (PROVENANCE_COLUMNS) copied in; a missing
or unknown key, a NULL in a non-nullable column or a value of the wrong type raises
`SchemaError` naming the table and the column. The rollout row's reason may be typed
(`states.InfraReason`: its text goes to `infra_reason`, its code to `infra_code`) or text only
(its code is read from the text, `InfraReason.parse`). Each shard is written to a `.tmp` name (`controller.ondisk.fileio`) in its
table directory, fsynced and `os.rename`d into place, so a reader never sees half a file and
the `*.parquet` glob never matches a file being written.

Writing a shard does not make its rows visible: the controller's catalog decides which
(rollout_id, attempt, fencing_token) keys are committed (see controller/store/catalog.py and
docs/trajectories.md).

Must not import: zmq, duckdb, controller.store, controller.broker, controller.analysis (node agents run
without them; the schema comes from controller.contracts).
"""
from __future__ import annotations

import json
import logging
import math
import os
import re
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Mapping, Sequence

import pyarrow as pa
import pyarrow.parquet as pq

from controller.contracts.states import INFRA_CODES, OUTCOMES, InfraReason
from controller.contracts.trajectory import (
    JSON_COLUMNS,
    KEY_COLUMNS,
    OPTIONAL_COLUMNS,
    PROVENANCE_COLUMNS,
    SCHEMAS,
    SHARD_TABLES,
    SPAN_KINDS,
    TRACE_SAMPLE_DECISIONS,
    shard_name,
)
from controller.ondisk.fileio import atomic_write_with
from nodeagent.store import tracing

log = logging.getLogger(__name__)

class SchemaError(ValueError):
    """A trajectory row does not match its table's schema; the message names table and column."""


def write_attempt(run_dir: str | os.PathLike, node: str, rollout_row: Mapping[str, Any],
                  steps: Sequence[Mapping[str, Any]],
                  checks: Sequence[Mapping[str, Any]],
                  spans: Sequence[Mapping[str, Any]] = (),
                  egress: Sequence[Mapping[str, Any]] = (),
                  model_calls: Sequence[Mapping[str, Any]] | None = None,
                  trace: tracing.TraceConfig | None = None) -> dict[str, str]:
    """Validate and write the five shards of one attempt; return {table: path relative to run_dir}.

    `model_calls` (the gateway's rows), when given, is written as a sixth shard of the same
    name under `model_calls/`; it is not in the returned dict (the catalog names the five
    shard tables; the model_calls view reads the committed keys).

    Child rows (`steps`, `checks`, `spans`, `egress`) may omit the key columns (run_id,
    rollout_id, attempt, fencing_token) and the provenance columns: they are copied from
    `rollout_row`; if given they must match it. All rows are validated before any file is
    written. Every table gets a shard, empty when it has no rows.

    The spans become a tree (`nodeagent.store.tracing`: trace, span and parent ids) and are
    tail-sampled: `trace` (default: the node's config, `tracing.node_config()`) decides from
    the finished attempt whether its spans are kept; the rollouts row records the trace id and
    the decision (`trace_id`, `trace_sample`); a dropped attempt's spans shard is empty. A kept
    attempt's tree is queued for OTLP export when an endpoint is configured.
    """
    run_dir = Path(run_dir)
    cfg = tracing.node_config() if trace is None else trace
    rollout = _complete_rollout(rollout_row, node)
    _to_table("rollouts", [rollout])                # validated before the sampler reads it
    keys = {k: rollout[k] for k in KEY_COLUMNS}
    keys.update({k: rollout.get(k) for k in PROVENANCE_COLUMNS})
    node_spans = _spans(spans, node)                # their kinds checked before the sampler takes a token
    decision = rollout.get("trace_sample") or cfg.decide(rollout, checks)
    rollout.setdefault("trace_id", tracing.trace_id(rollout["run_id"], rollout["rollout_id"]))
    span_rows = tracing.with_ids(node_spans, keys["run_id"], keys["rollout_id"], keys["attempt"],
                                 keys["fencing_token"])
    rollout["trace_sample"] = decision
    rollouts_table = _to_table("rollouts", [rollout])
    children = {"steps": steps, "checks": checks, "spans": span_rows, "egress": _egress(egress)}
    if model_calls is not None:
        children["model_calls"] = model_calls
    tables = {"rollouts": rollouts_table}
    for table, rows in children.items():
        tables[table] = _to_table(table, [_with_keys(table, i, r, keys)
                                          for i, r in enumerate(rows)])
    if decision == "dropped":                       # validated above, not kept
        tables["spans"] = tables["spans"].slice(0, 0)
    name = shard_name(node, keys["rollout_id"], keys["attempt"], keys["fencing_token"])
    written: dict[str, str] = {}
    for table, data in tables.items():
        directory = run_dir / table
        directory.mkdir(parents=True, exist_ok=True)
        _write_atomic(data, directory / name)
        if table in SHARD_TABLES:
            written[table] = f"{table}/{name}"
    log.info("wrote shards rollout_id=%s attempt=%s token=%s node=%s steps=%d checks=%d trace=%s",
             keys["rollout_id"], keys["attempt"], keys["fencing_token"], node,
             len(steps), len(checks), decision)
    if decision != "dropped" and cfg.endpoint:
        tracing.export_attempt(cfg, rollout, span_rows, decision, model_calls or ())
    return written


def write_batch(run_dir: str | os.PathLike, table: str, data: pa.Table, name: str) -> str:
    """Write a columnar batch of many attempts' rows of one table as one shard (bulk ingest:
    re-scoring, imports, benchmarks); return its path relative to run_dir.

    Checked column-wise, not row by row: the columns must be the table's (nullable ones may
    be missing and become NULL), castable to its types, with no NULL in a
    non-nullable column and only known `outcome`, `trace_sample` / span `kind` values. JSON text columns are
    not parsed here (the per-attempt writer does that). The rows become visible only once
    their keys are committed in the catalog, like any shard.
    """
    import pyarrow.compute as pc
    if table not in SCHEMAS:
        raise SchemaError(f"unknown table {table!r}; valid: {', '.join(SCHEMAS)}")
    if not name.endswith(".parquet") or "/" in name or name.startswith("."):
        raise SchemaError(f"{table}: shard name {name!r} must be a plain '<name>.parquet'")
    schema = SCHEMAS[table]
    unknown = sorted(set(data.column_names) - set(schema.names))
    if unknown:
        raise SchemaError(f"{table}: unknown column(s) {', '.join(unknown)}")
    arrays = []
    for field in schema:
        if field.name not in data.column_names:
            if not field.nullable and field.name not in OPTIONAL_COLUMNS[table]:
                raise SchemaError(f"{table}.{field.name}: missing")
            arrays.append(pa.nulls(data.num_rows, field.type))
            continue
        col = data[field.name]
        try:
            col = col.cast(field.type)
        except (pa.ArrowInvalid, pa.ArrowNotImplementedError) as exc:
            raise SchemaError(f"{table}.{field.name}: cannot store as {field.type}: {exc}") from None
        if not field.nullable and col.null_count:
            raise SchemaError(f"{table}.{field.name}: {col.null_count} NULL(s) but the column is "
                              f"not nullable")
        arrays.append(col)
    out = pa.Table.from_arrays(arrays, schema=schema)
    enums = {"rollouts": [("outcome", OUTCOMES), ("trace_sample", TRACE_SAMPLE_DECISIONS)],
             "spans": [("kind", SPAN_KINDS)]}
    for col, valid in enums.get(table, []):
        known = pc.or_kleene(pc.is_in(out[col], pa.array(valid)), pc.is_null(out[col]))
        bad = pc.sum(pc.invert(known)).as_py()
        if bad:
            raise SchemaError(f"{table}.{col}: {bad} value(s) not in {', '.join(valid)}")
    directory = Path(run_dir) / table
    directory.mkdir(parents=True, exist_ok=True)
    _write_atomic(out, directory / name)
    return f"{table}/{name}"


def _spans(rows: Sequence[Mapping[str, Any]], node: str) -> list[dict]:
    out = []
    for i, row in enumerate(rows):
        if row.get("kind") not in SPAN_KINDS:
            raise SchemaError(f"spans.kind (row {i}): {row.get('kind')!r} is not one of "
                              f"{', '.join(SPAN_KINDS)}")
        out.append({"node": node, **row})
    return out


def _egress(rows: Sequence[Mapping[str, Any]]) -> list[dict]:
    out = []
    for row in rows:
        row = dict(row)
        if row.get("port") is not None and not isinstance(row["port"], bool):
            try:
                row["port"] = int(row["port"])
            except (TypeError, ValueError):
                pass        # left as is: the schema check names it
        out.append(row)
    return out


def _complete_rollout(row: Mapping[str, Any], node: str) -> dict[str, Any]:
    row = dict(row)
    row.setdefault("node", node)
    if row["node"] != node:
        raise SchemaError(f"rollouts.node: row says {row['node']!r} but the writer is {node!r}")
    if row.get("trace_sample") is not None and row["trace_sample"] not in TRACE_SAMPLE_DECISIONS:
        raise SchemaError(f"rollouts.trace_sample: {row['trace_sample']!r} is not one of "
                          f"{', '.join(TRACE_SAMPLE_DECISIONS)}")
    _typed_reason(row)
    outcome = row.get("outcome")
    if outcome is not None and outcome not in OUTCOMES:
        raise SchemaError(f"rollouts.outcome: {outcome!r} is not one of {', '.join(OUTCOMES)}")
    if "reward" in row and outcome is not None:
        if outcome in ("infra_error", "judge_failed") and row["reward"] is not None:
            raise SchemaError(f"rollouts.reward: must be None for outcome {outcome} "
                              "(an infrastructure or judge failure is masked, never scored)")
        if outcome not in ("infra_error", "judge_failed") and row["reward"] is None:
            raise SchemaError(f"rollouts.reward: must not be None for outcome {outcome!r}")
    return row


def _typed_reason(row: dict[str, Any]) -> None:
    """The row's reason as its text (`infra_reason`) and its code (`infra_code`): a typed
    reason (`states.InfraReason`) gives both; a reason given as text only gets its code from
    the text (`InfraReason.parse`); a code outside `states.INFRA_CODES` is a SchemaError."""
    reason = row.get("infra_reason")
    if isinstance(reason, InfraReason):
        row["infra_reason"], code = reason.text, reason.code
        if row.get("infra_code") not in (None, code):
            raise SchemaError(f"rollouts.infra_code: {row['infra_code']!r} is not the reason's "
                              f"code {code!r}")
        row["infra_code"] = code
    elif row.get("infra_code") is None and isinstance(reason, str):
        row["infra_code"] = InfraReason.parse(reason).code
    code = row.get("infra_code")
    if code is not None and code not in INFRA_CODES:
        raise SchemaError(f"rollouts.infra_code: {code!r} is not one of {', '.join(INFRA_CODES)}")


def _with_keys(table: str, index: int, row: Mapping[str, Any],
               keys: Mapping[str, Any]) -> dict[str, Any]:
    out = dict(row)
    for k, v in keys.items():
        if k in out and out[k] != v:
            raise SchemaError(f"{table}.{k} (row {index}): {out[k]!r} does not match the "
                              f"rollout row's {v!r}")
        out[k] = v
    return out


def _to_table(table: str, rows: list[dict[str, Any]]) -> pa.Table:
    schema = SCHEMAS[table]
    names = set(schema.names)
    optional = OPTIONAL_COLUMNS[table]
    for i, row in enumerate(rows):
        unknown = sorted(set(row) - names)
        if unknown:
            raise SchemaError(f"{table}: unknown column(s) {', '.join(unknown)} (row {i}); "
                              f"valid columns: {', '.join(schema.names)}")
        missing = [n for n in schema.names if n not in row and n not in optional]
        if missing:
            also = f"; also missing: {', '.join(missing[1:])}" if missing[1:] else ""
            raise SchemaError(f"{table}.{missing[0]}: missing (row {i}){also}")
    arrays = []
    for field in schema:
        values = [_convert(table, field, i, row.get(field.name)) for i, row in enumerate(rows)]
        try:
            arrays.append(pa.array(values, type=field.type))
        except (pa.ArrowInvalid, pa.ArrowTypeError, OverflowError, TypeError) as exc:
            raise SchemaError(
                f"{table}.{field.name}: cannot store as {field.type}: {exc}") from None
    return pa.Table.from_arrays(arrays, schema=schema)


_SURROGATE = re.compile("[\ud800-\udfff]")


def _text(value: Any) -> Any:
    """Text as Parquet can hold it: a lone surrogate (JSON's "\\ud800" in a tool call's
    arguments, which the policy writes) becomes U+FFFD instead of failing the whole attempt's
    write, which would turn the policy's own output into an infrastructure error."""
    if isinstance(value, str) and _SURROGATE.search(value):
        return _SURROGATE.sub("\ufffd", value)
    if isinstance(value, (list, tuple)):
        return [_text(v) for v in value]
    return value


def _convert(table: str, field: pa.Field, index: int, value: Any) -> Any:
    return _text(_checked(table, field, index, value))


def _checked(table: str, field: pa.Field, index: int, value: Any) -> Any:
    where = f"{table}.{field.name} (row {index})"
    if value is None:
        if not field.nullable:
            raise SchemaError(f"{where}: is NULL but the column is not nullable")
        return None
    if field.name in JSON_COLUMNS[table]:
        if isinstance(value, str):
            try:
                json.loads(value)
            except ValueError as exc:
                raise SchemaError(f"{where}: not valid JSON text: {exc}") from None
            return value
        try:
            return json.dumps(value, sort_keys=True, separators=(",", ":"), allow_nan=False)
        except (TypeError, ValueError) as exc:
            raise SchemaError(f"{where}: not JSON-serialisable: {exc}") from None
    if pa.types.is_timestamp(field.type):
        return _timestamp(where, value)
    if pa.types.is_integer(field.type) and (isinstance(value, bool) or not isinstance(value, int)):
        raise SchemaError(f"{where}: expected an integer, got {type(value).__name__} {value!r}")
    if pa.types.is_floating(field.type):
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise SchemaError(f"{where}: expected a number, got {type(value).__name__} {value!r}")
        if field.name.endswith("_s") and not (math.isfinite(value) and value >= 0):
            raise SchemaError(f"{where}: a duration must be finite and >= 0, got {value!r}")
    if pa.types.is_boolean(field.type) and not isinstance(value, bool):
        raise SchemaError(f"{where}: expected a bool, got {type(value).__name__} {value!r}")
    if pa.types.is_list(field.type):
        if not isinstance(value, (list, tuple)):
            raise SchemaError(f"{where}: expected a list, got {type(value).__name__}")
        return list(value)
    if pa.types.is_string(field.type) and not isinstance(value, str):
        raise SchemaError(f"{where}: expected a string, got {type(value).__name__} {value!r}")
    return value


def _timestamp(where: str, value: Any) -> datetime:
    """Accept an aware datetime or wall-clock epoch seconds; naive datetimes are ambiguous."""
    if isinstance(value, datetime):
        if value.tzinfo is None:
            raise SchemaError(f"{where}: naive datetime; pass a timezone-aware one (UTC)")
        return value.astimezone(timezone.utc)
    if isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value):
        return datetime.fromtimestamp(value, tz=timezone.utc)
    raise SchemaError(f"{where}: expected an aware datetime or epoch seconds, got {value!r}")


def _write_atomic(table: pa.Table, path: Path) -> None:
    atomic_write_with(path, lambda tmp: pq.write_table(table, str(tmp), compression="zstd"))
