"""Exports for trainers: the committed model calls of a run as token-level training samples.

A *sample* is one chain of calls in which each prompt extends the previous call's prompt and
completion (`model_calls.prompt_extends_previous`): a linear multi-turn rollout is one sample; a
harness that rewrites or branches its history makes one sample per chain. For each sample:
`prompt_ids` (the first call's prompt), `completion_ids` (everything after it: sampled tokens
and the environment's tokens between turns), `completion_mask` (1 = sampled by the policy, 0 =
tool output, chat template), `completion_logprobs` (the sampler's logprob at sampled
positions, 0.0 elsewhere), the rollout's `reward`, and `group_id` (rollouts of one task in one
batch: the group of group-relative methods such as GRPO). Calls the server answered without
ids or logprobs, and infra_error rollouts, are left out and counted (`ExportStats`).

Staleness (`max_staleness`, `current_version`): `per_rollout` drops a sample any of whose calls
was answered by a version older than `current_version - max_staleness`; `per_call` keeps it
and masks those calls' tokens.

Formats (`FORMATS`):
- `hf`: one Parquet file loadable with `datasets.load_dataset("parquet", data_files=...)`;
- `verifiers`: JSON Lines in the verifiers / prime-rl rollout schema (`prompt`, `completion` as
  chat messages, `answer`, `task`, `info`, `reward`, and the processed fields `prompt_ids`,
  `prompt_mask`, `completion_ids`, `completion_mask`, `completion_logprobs`).

Must not import: zmq, sqlite3, nodeagent.
"""
from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

from controller.analysis.query import connect, require_run
from controller.ondisk.fileio import atomic_write_with

FORMATS = ("hf", "verifiers")
STALENESS_RULES = ("per_rollout", "per_call")

SAMPLE_SCHEMA = pa.schema([
    ("rollout_id", pa.string()), ("sample_index", pa.int32()), ("group_id", pa.string()),
    ("task_id", pa.string()), ("task_name", pa.string()), ("batch_id", pa.string()),
    ("policy_version", pa.int32()), ("min_call_version", pa.int32()), ("reward", pa.float64()),
    ("outcome", pa.string()), ("calls", pa.int32()),
    ("prompt_ids", pa.list_(pa.int32())), ("prompt_mask", pa.list_(pa.int8())),
    ("completion_ids", pa.list_(pa.int32())), ("completion_mask", pa.list_(pa.int8())),
    ("completion_logprobs", pa.list_(pa.float32())),
    ("first_call", pa.int32()), ("last_call", pa.int32()),
])

_CALLS_SQL = """
SELECT m.rollout_id, m.call_index, m.prompt_extends_previous, m.call_policy_version,
       m.prompt_token_ids, m.completion_token_ids, m.completion_logprobs,
       r.task_id, r.task_name, r.batch_id, r.policy_version, r.reward, r.outcome
FROM model_calls m JOIN rollouts r USING (run_id, rollout_id, attempt, fencing_token)
WHERE m.status = 'ok' AND r.outcome NOT IN ('infra_error', 'judge_failed')
  AND coalesce(m.source, '') <> 'user_sim'   -- the user simulator's calls are never trained on
ORDER BY m.rollout_id, m.call_index
"""


class ExportError(ValueError):
    """An export cannot be made (bad format, bad staleness rule, no run); one-line message."""


@dataclass
class ExportStats:
    samples: int = 0
    rollouts: int = 0
    calls: int = 0
    calls_missing_tokens: int = 0
    dropped_stale: int = 0
    masked_stale_calls: int = 0


def group_id(task_id: str, batch_id: str | None) -> str:
    return hashlib.sha256(f"{batch_id or ''}\0{task_id}".encode()).hexdigest()[:16]


def _samples(calls: pa.Table, stats: ExportStats, min_version: int | None, rule: str) -> dict[str, list]:
    cols = {n: calls[n].to_pylist() for n in calls.column_names}
    out: dict[str, list] = {f.name: [] for f in SAMPLE_SCHEMA}
    cur: dict | None = None
    seen_rollouts: set[str] = set()

    def flush() -> None:
        nonlocal cur
        if cur is None:
            return
        stale = min_version is not None and cur["min_v"] is not None and cur["min_v"] < min_version
        if stale and rule == "per_rollout":
            stats.dropped_stale += 1
        else:
            for k in ("rollout_id", "group_id", "task_id", "task_name", "batch_id", "policy_version",
                      "reward", "outcome", "first_call", "last_call"):
                out[k].append(cur[k])
            out["sample_index"].append(cur["index"])
            out["min_call_version"].append(cur["min_v"])
            out["calls"].append(cur["calls"])
            out["prompt_ids"].append(cur["prompt"])
            out["prompt_mask"].append([1] * len(cur["prompt"]))
            out["completion_ids"].append(cur["ids"])
            out["completion_mask"].append(cur["mask"])
            out["completion_logprobs"].append(cur["lps"])
            stats.samples += 1
        cur = None

    n_in_rollout = 0
    for i in range(calls.num_rows):
        rid, prompt, comp, lps = (cols["rollout_id"][i], cols["prompt_token_ids"][i],
                                  cols["completion_token_ids"][i], cols["completion_logprobs"][i])
        stats.calls += 1
        if rid not in seen_rollouts:
            flush()
            seen_rollouts.add(rid)
            n_in_rollout = 0
        if prompt is None or comp is None or lps is None:
            stats.calls_missing_tokens += 1
            flush()
            continue
        version = cols["call_policy_version"][i]
        masked = rule == "per_call" and min_version is not None and version is not None and version < min_version
        stats.masked_stale_calls += masked
        if cur is not None and cols["prompt_extends_previous"][i] is True:
            base = len(cur["prompt"]) + len(cur["ids"])
            between = prompt[base:]
            cur["ids"].extend(between)
            cur["mask"].extend([0] * len(between))
            cur["lps"].extend([0.0] * len(between))
        else:
            flush()
            cur = {"rollout_id": rid, "index": n_in_rollout, "prompt": list(prompt), "ids": [], "mask": [],
                   "lps": [], "calls": 0, "min_v": None, "first_call": cols["call_index"][i],
                   "task_id": cols["task_id"][i], "task_name": cols["task_name"][i],
                   "batch_id": cols["batch_id"][i], "policy_version": cols["policy_version"][i],
                   "reward": cols["reward"][i], "outcome": cols["outcome"][i],
                   "group_id": group_id(cols["task_id"][i], cols["batch_id"][i])}
            n_in_rollout += 1
        cur["ids"].extend(comp)
        cur["mask"].extend([0 if masked else 1] * len(comp))
        cur["lps"].extend(0.0 if masked else lp for lp in lps)
        cur["calls"] += 1
        cur["last_call"] = cols["call_index"][i]
        if version is not None:
            cur["min_v"] = version if cur["min_v"] is None else min(cur["min_v"], version)
    flush()
    stats.rollouts = len(seen_rollouts)
    return out


def samples(run_dir: str | Path, max_staleness: int | None = None, current_version: int | None = None,
            staleness: str = "per_rollout") -> tuple[pa.Table, ExportStats]:
    """The run's training samples as an Arrow table (SAMPLE_SCHEMA) and what was left out."""
    if staleness not in STALENESS_RULES:
        raise ExportError(f"staleness rule {staleness!r}; valid: {', '.join(STALENESS_RULES)}")
    con = connect(run_dir)
    try:
        calls = con.sql(_CALLS_SQL).to_arrow_table()
        if max_staleness is not None and current_version is None:
            current_version = con.execute("SELECT max(call_policy_version) FROM model_calls").fetchone()[0]
    finally:
        con.close()
    min_version = None if max_staleness is None or current_version is None else current_version - max_staleness
    stats = ExportStats()
    table = pa.table(_samples(calls, stats, min_version, staleness), schema=SAMPLE_SCHEMA)
    return table, stats


def _messages(run_dir: str | Path, table: pa.Table) -> dict[tuple[str, int], tuple[list, list]]:
    """(prompt messages, completion messages) of each sample, from its first and last call."""
    con = connect(run_dir)
    try:
        rows = con.execute("SELECT rollout_id, call_index, request_messages, response FROM model_calls "
                           "WHERE status = 'ok'").fetchall()
    finally:
        con.close()
    by_key = {(r[0], r[1]): (r[2], r[3]) for r in rows}
    out = {}
    for rid, first, last in zip(table["rollout_id"].to_pylist(), table["first_call"].to_pylist(),
                                table["last_call"].to_pylist()):
        prompt = json.loads(by_key[(rid, first)][0])
        final_req, final_resp = by_key[(rid, last)]
        tail = json.loads(final_req)[len(prompt):]
        final = []
        if final_resp is not None:
            msg = json.loads(final_resp)["choices"][0]["message"]
            final = [{k: v for k, v in msg.items() if k in ("role", "content", "tool_calls")}]
        out[(rid, first)] = (prompt, tail + final)
    return out


def write(run_dir: str | Path, fmt: str, out: str | Path, **kw) -> ExportStats:
    """Write the run's samples in `fmt` to `out` (atomically); return the stats."""
    if fmt not in FORMATS:
        raise ExportError(f"export format {fmt!r}; valid: {', '.join(FORMATS)}")
    require_run(run_dir)
    out = Path(out)
    if not out.parent.is_dir():
        raise ExportError(f"cannot write {out}: directory {out.parent} does not exist")
    table, stats = samples(run_dir, **kw)
    if fmt == "hf":
        atomic_write_with(out, lambda tmp: pq.write_table(table, str(tmp), compression="zstd"))
        return stats
    messages = _messages(run_dir, table)

    def write_jsonl(tmp: Path) -> None:
        with open(tmp, "w") as fh:
            for row in table.to_pylist():
                prompt, completion = messages[(row["rollout_id"], row["first_call"])]
                fh.write(json.dumps({
                    "prompt": prompt, "completion": completion, "answer": "", "task": row["task_name"],
                    "info": {k: row[k] for k in ("rollout_id", "sample_index", "group_id", "task_id", "batch_id",
                                                 "policy_version", "min_call_version", "outcome")},
                    "reward": row["reward"], "prompt_ids": row["prompt_ids"], "prompt_mask": row["prompt_mask"],
                    "completion_ids": row["completion_ids"], "completion_mask": row["completion_mask"],
                    "completion_logprobs": row["completion_logprobs"]}) + "\n")
    atomic_write_with(out, write_jsonl)
    return stats


__all__ = ["ExportError", "ExportStats", "FORMATS", "SAMPLE_SCHEMA", "STALENESS_RULES", "group_id", "samples",
           "write"]
