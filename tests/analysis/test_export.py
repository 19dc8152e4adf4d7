"""`paddock export`: committed model calls become token-level samples that trainers read as they
are (Hugging Face datasets Parquet; verifiers/prime-rl JSON Lines), with masks, rewards and group
ids; stale calls are dropped or masked by rule; a 10,000-rollout run exports in under 10 s."""
from __future__ import annotations

import json
import time
from datetime import datetime, timezone

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from controller.analysis.export import ExportError, group_id, samples, write
from controller.cli.export import register
from controller.demo.policy_server import PolicyServer
from controller.store.catalog import Catalog
from controller.taskbank.builtin import builtin_taskset
from nodeagent.gateway.session import GatewayBudgets, Session, Upstream
from nodeagent.store.writer import write_attempt, write_batch
from tests.gateway.test_gateway import drive
from tests.store.test_store import rollout_row

T0 = datetime(2024, 1, 1, tzinfo=timezone.utc)


@pytest.fixture(scope="module")
def policy():
    with PolicyServer(builtin_taskset()) as srv:
        yield srv


def real_run(tmp_path, policy, n=2, turns=3, reward=1.0):
    """n committed rollouts whose model calls went through a gateway session to the policy."""
    sessions = []
    with Catalog(tmp_path) as cat:
        for i in range(n):
            s = Session(Upstream(0, policy.url, "scripted-v0"), GatewayBudgets(10, 100_000, 30.0))
            drive(s, turns, seed=i)
            row = rollout_row(f"r{i}", reward=reward, task_id="sha256:t", batch_id="b0")
            shards = write_attempt(tmp_path, "n1", row, [], [], model_calls=s.rows)
            cat.commit(f"r{i}", 1, 1, shards, 0.0)
            sessions.append(s)
    return sessions


def test_a_linear_rollout_is_one_sample_whose_mask_marks_the_sampled_tokens(tmp_path, policy):
    (s,) = real_run(tmp_path, policy, n=1)
    table, stats = samples(tmp_path)
    assert stats.samples == 1 and stats.calls == 3 and stats.calls_missing_tokens == 0
    row = table.to_pylist()[0]
    first, last = s.rows[0], s.rows[-1]
    assert row["prompt_ids"] == first["prompt_token_ids"]
    assert row["prompt_ids"] + row["completion_ids"] == last["prompt_token_ids"] + last["completion_token_ids"]
    sampled = [t for t, m in zip(row["completion_ids"], row["completion_mask"]) if m]
    assert sampled == sum((r["completion_token_ids"] for r in s.rows), [])
    lps = [lp for lp, m in zip(row["completion_logprobs"], row["completion_mask"]) if m]
    assert lps == pytest.approx(sum((r["completion_logprobs"] for r in s.rows), []))
    assert row["reward"] == 1.0 and row["group_id"] == group_id("sha256:t", "b0")


def test_hf_parquet_and_verifiers_jsonl_are_written(tmp_path, policy):
    real_run(tmp_path, policy, n=2)
    write(tmp_path, "hf", tmp_path / "out.parquet")
    hf = pq.read_table(tmp_path / "out.parquet")
    assert hf.num_rows == 2 and {"prompt_ids", "completion_ids", "completion_mask", "reward",
                                 "group_id"} <= set(hf.column_names)
    write(tmp_path, "verifiers", tmp_path / "out.jsonl")
    lines = [json.loads(l) for l in (tmp_path / "out.jsonl").read_text().splitlines()]
    assert len(lines) == 2
    v = lines[0]
    assert v["prompt"][0]["role"] == "system" and v["completion"][-1]["role"] == "assistant"
    assert len(v["completion_ids"]) == len(v["completion_mask"]) == len(v["completion_logprobs"])
    assert set(v["prompt_mask"]) == {1} and v["info"]["group_id"]
    with pytest.raises(ExportError, match="valid: hf, verifiers"):
        write(tmp_path, "csv", tmp_path / "x")


def test_calls_without_token_ids_are_left_out_and_counted(tmp_path, policy):
    (s,) = real_run(tmp_path / "a", policy, n=1)
    rows = [dict(r) for r in s.rows]
    rows[1]["completion_logprobs"] = None
    tmp = tmp_path / "b"
    with Catalog(tmp) as cat:
        cat.commit("r0", 1, 1, write_attempt(tmp, "n1", rollout_row("r0"), [], [], model_calls=rows), 0.0)
    table, stats = samples(tmp)
    assert stats.calls_missing_tokens == 1 and stats.samples == 2   # the chain breaks at the hole


def test_staleness_per_rollout_drops_and_per_call_masks(tmp_path, policy):
    (s,) = real_run(tmp_path / "a", policy, n=1)
    rows = [dict(r, call_policy_version=v) for r, v in zip(s.rows, (1, 2, 2))]
    tmp = tmp_path / "b"
    with Catalog(tmp) as cat:
        cat.commit("r0", 1, 1, write_attempt(tmp, "n1", rollout_row("r0"), [], [], model_calls=rows), 0.0)
    assert samples(tmp, max_staleness=0, current_version=2)[1].dropped_stale == 1
    table, stats = samples(tmp, max_staleness=0, current_version=2, staleness="per_call")
    assert stats.masked_stale_calls == 1
    row = table.to_pylist()[0]
    n_first = len(rows[0]["completion_token_ids"])
    assert row["completion_mask"][:n_first] == [0] * n_first


def synthetic_run(run_dir, n_rollouts: int, calls_per: int = 3, outcomes=None, sources=None):
    """A bulk run: n rollouts of `calls_per` linear calls each, 64-token prompts, 32-token turns
    (`outcomes`: per rollout, default pass; `sources`: per call index, default builtin)."""
    rids = [f"r{i:06d}" for i in range(n_rollouts)]
    rollouts = pa.table({
        "run_id": ["run"] * n_rollouts, "rollout_id": rids, "attempt": [1] * n_rollouts,
        "fencing_token": [1] * n_rollouts, "batch_id": [f"b{i // 64}" for i in range(n_rollouts)],
        "task_id": [f"sha256:t{i % 50}" for i in range(n_rollouts)], "task_name": ["t"] * n_rollouts,
        "task_family": ["python"] * n_rollouts, "taskset_hash": ["h"] * n_rollouts,
        "image_digest": ["d"] * n_rollouts, "verifier_version": ["v"] * n_rollouts,
        "policy_version": [0] * n_rollouts, "seed": list(range(n_rollouts)), "node": ["n"] * n_rollouts,
        "outcome": outcomes or ["pass"] * n_rollouts,
        "reward": [None if o in ("infra_error", "judge_failed") else 1.0 for o in (outcomes or ["pass"] * n_rollouts)], "reward_components": ["{}"] * n_rollouts,
        "tampered": [False] * n_rollouts, "started_at": [T0] * n_rollouts, "finished_at": [T0] * n_rollouts,
        "wall_s": [1.0] * n_rollouts, "agent_s": [1.0] * n_rollouts, "verify_s": [0.1] * n_rollouts,
        "steps": [calls_per] * n_rollouts, "prompt_tokens": [0] * n_rollouts,
        "completion_tokens": [0] * n_rollouts, "limits": ["{}"] * n_rollouts, "diff_bytes": [0] * n_rollouts})
    write_batch(run_dir, "rollouts", rollouts, "bulk.parquet")
    n = n_rollouts * calls_per
    prompt, turn = list(range(64)), list(range(1000, 1032))
    prompts, comps = [], []
    for _ in range(n_rollouts):
        p = prompt
        for c in range(calls_per):
            prompts.append(p)
            comps.append(turn)
            p = p + turn + [7, 8, 9]
    calls = pa.table({
        "run_id": ["run"] * n, "rollout_id": [r for r in rids for _ in range(calls_per)],
        "attempt": [1] * n, "fencing_token": [1] * n, "call_index": [c for _ in rids for c in range(calls_per)],
        "prompt_extends_previous": [c > 0 for _ in rids for c in range(calls_per)],
        "source": [(sources or ["builtin"] * calls_per)[c] for _ in rids for c in range(calls_per)],
        "call_policy_version": [0] * n, "request_messages": ["[]"] * n,
        "request_params": ["{}"] * n, "prompt_token_ids": prompts, "completion_token_ids": comps,
        "completion_logprobs": [[-0.5] * 32] * n, "status": ["ok"] * n, "retries": [0] * n,
        "started_at": [T0] * n, "upstream_s": [0.01] * n, "gateway_s": [0.0001] * n})
    write_batch(run_dir, "model_calls", calls, "bulk.parquet")
    with Catalog(run_dir) as cat:
        for r in rids:
            cat.commit(r, 1, 1, {}, 0.0)


def test_a_10000_rollout_run_exports_in_under_10_seconds(tmp_path):
    synthetic_run(tmp_path, 10_000)
    for fmt in ("hf", "verifiers"):
        t0 = time.monotonic()
        stats = write(tmp_path, fmt, tmp_path / f"out.{fmt}")
        took = time.monotonic() - t0
        assert stats.samples == 10_000 and stats.rollouts == 10_000
        assert took <= 10.0, f"{fmt} export took {took:.1f}s"


def test_the_cli_registers_paddock_export():
    import argparse
    ap = argparse.ArgumentParser()
    register(ap.add_subparsers())
    args = ap.parse_args(["export", "--run", "x", "--format", "hf"])
    assert args.format == "hf" and args.staleness == "per_rollout"


def test_the_user_simulator_and_judge_failed_rollouts_are_never_training_data(tmp_path):
    """A conversational run: the user simulator's calls (source user_sim) and the rollouts whose
    judge failed (reward NULL, like infra_error) are left out of the export."""
    synthetic_run(tmp_path, 3, calls_per=2, outcomes=["pass", "judge_failed", "infra_error"],
                  sources=["builtin", "user_sim"])
    out = tmp_path / "out.parquet"
    stats = write(tmp_path, "hf", out)
    rows = pq.read_table(out).to_pylist()
    assert stats.rollouts == 1 and [r["rollout_id"] for r in rows] == ["r000000"]
    assert len(rows[0]["completion_ids"]) == 32, "only the policy's own call of that rollout"
