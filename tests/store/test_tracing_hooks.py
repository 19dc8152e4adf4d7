"""The trace context reaches a harness inside the sandbox (TRACEPARENT) and the gateway session
of a real attempt (needs the hooks in nodeagent/agent/attempt.py and nodeagent/harness/external.py)."""
from __future__ import annotations

import pytest

from controller.analysis.query import connect
from controller.contracts.tasks import Task
from controller.store.catalog import Catalog
from controller.taskbank.builtin import builtin_taskset
from nodeagent.agent.attempt import Attempt, run_attempt
from nodeagent.store import tracing

pytestmark = pytest.mark.sandbox
PY_TASK = builtin_taskset().by_name()["python/reverse_words"]


def test_a_harness_in_the_sandbox_is_given_its_attempts_traceparent(runtime, python_image, solving_policy,
                                                                     tmp_path):
    fields = {f: getattr(PY_TASK, f) for f in PY_TASK.__dataclass_fields__}
    fields["harness"] = ("sh", "-c", "echo TP=$TRACEPARENT")
    task = Task(**fields)
    a = Attempt("run", str(tmp_path), "r1", 2, 5, "b", 1, {**task.canonical(), "task_id": task.task_id}, 7,
                solving_policy.url, "scripted-v7")
    res = run_attempt(runtime, python_image, "n1", a)
    with Catalog(tmp_path) as cat:
        cat.commit("r1", 2, 5, res.shards, 0.0)
    obs = " ".join(o or "" for (o,) in connect(tmp_path).execute("SELECT observation FROM steps").fetchall())
    assert f"TP={tracing.attempt_context('run', 'r1', 2, 5).header()}" in obs, obs
