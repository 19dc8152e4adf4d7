"""Re-scoring a run from its stored changes and answers, on real sandboxes, read back by DuckDB."""
from __future__ import annotations

import json
from datetime import datetime, timezone

import duckdb
import pytest

from controller.analysis.rescore import RescoreError, rescore_run
from controller.farm.assemble import lease_tasks
from controller.store.catalog import Catalog
from controller.taskbank.builtin import builtin_taskset
from nodeagent.agent.attempt import Attempt, write_changes
from nodeagent.sandbox.runtime import Change
from nodeagent.store import writer as trajwriter
from nodeagent.verifier.grade import VERIFIER_VERSION
from nodeagent.verifier.rescore import regrade

T0 = datetime(2026, 1, 2, tzinfo=timezone.utc)


def store_rollout(run_dir, rid, task, outcome, reward, changes=(), answer=None, stop_reason="stop"):
    a = Attempt("run-r", str(run_dir), rid, 1, 1, "b0", 0, {}, 0, "", "")
    path = write_changes(str(run_dir), "n1", a, list(changes)) if outcome != "infra_error" else None
    row = dict(run_id="run-r", rollout_id=rid, attempt=1, fencing_token=1, batch_id="b0",
               task_id=task.task_id, task_name=task.name, task_family=task.family, taskset_hash="sha256:s",
               image_digest="sha256:img", verifier_version="v-old", policy_version=0, seed=0, node="n1",
               outcome=outcome, reward=reward, reward_components={}, tampered=False,
               infra_reason="sandbox died" if outcome == "infra_error" else None, started_at=T0, finished_at=T0,
               wall_s=1.0, agent_s=1.0, verify_s=0.0, steps=1, prompt_tokens=1, completion_tokens=1,
               limits={}, answer=answer, diff_bytes=0, stop_reason=stop_reason, changes_path=path)
    shards = trajwriter.write_attempt(run_dir, "n1", row, [], [])
    with Catalog(run_dir) as cat:
        cat.commit(rid, 1, 1, shards, T0)
        cat.flush()


def test_rescore_regrades_stored_changes_into_a_new_result_set(runtime, python_image, tmp_path):
    ts = builtin_taskset().by_name()
    gcd, frac = ts["python/gcd"], ts["math/fraction_sum"]
    (tmp_path / "tasks.json").write_text(json.dumps(lease_tasks(builtin_taskset(), "sha256:img")))
    ref = [Change("/work/solution.py", "modified", gcd.hidden["reference.py"].encode(), 0o644)]
    store_rollout(tmp_path, "r1", gcd, "pass", 1.0, ref)
    store_rollout(tmp_path, "r2", gcd, "pass", 1.0, [])                    # an old verifier's false positive
    store_rollout(tmp_path, "r3", frac, "fail", 0.0, answer="\\boxed{\\dfrac{3}{4}}")  # an old verifier's false negative
    store_rollout(tmp_path, "r4", gcd, "infra_error", None)
    path, rows = rescore_run(tmp_path, regrade, VERIFIER_VERSION, runtime, lambda digest: python_image, workers=2)
    assert path == tmp_path / "rescore" / VERIFIER_VERSION / "results.parquet"
    got = dict(duckdb.sql(f"SELECT rollout_id, outcome FROM '{path}' ORDER BY rollout_id").fetchall())
    assert got == {"r1": "pass", "r2": "fail", "r3": "pass", "r4": "infra_error"}
    [r4] = duckdb.sql(f"SELECT rescored, note FROM '{path}' WHERE rollout_id = 'r4'").fetchall()
    assert r4[0] is False and "never verified" in r4[1]
    [stored] = duckdb.sql(f"SELECT stored_outcome, stored_verifier_version, verifier_version FROM '{path}' "
                          "WHERE rollout_id = 'r2'").fetchall()
    assert stored == ("pass", "v-old", VERIFIER_VERSION)


def test_rescore_of_a_run_without_tasks_is_a_clear_error(runtime, python_image, tmp_path):
    with pytest.raises(RescoreError, match="tasks.json is missing"):
        rescore_run(tmp_path, regrade, VERIFIER_VERSION, runtime, lambda d: python_image)
