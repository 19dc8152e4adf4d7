"""Fixtures of the conversational family: the built-in conversational task set, a scripted
policy server over it (which also serves the node's judge, `node:judge`), and
`rollout(task, strategy)`, one real attempt (sandbox, harness,
services, user simulator, verifier) whose rows are committed and readable with DuckDB."""
from __future__ import annotations

import itertools

import pytest

from controller.analysis.query import connect
from controller.demo.policy_server import STRATEGIES, PolicyServer, default_params
from controller.store.catalog import Catalog
from controller.taskbank.conversational import conversational_taskset
from nodeagent.agent.attempt import Attempt, run_attempt

TASKSET = conversational_taskset()
_versions = itertools.count(100)


@pytest.fixture(scope="module")
def conv_policy():
    with PolicyServer(TASKSET) as srv:
        yield srv


def version_playing(server, family: str, strategy: str) -> int:
    """A fresh policy version that always plays `strategy` for `family`."""
    params = default_params()
    params[family] = {s: (60.0 if s == strategy else 0.0) for s in STRATEGIES[family]}
    v = next(_versions)
    server.set_policy(v, params)
    return v


@pytest.fixture
def rollout(runtime, python_image, conv_policy, tmp_path, monkeypatch):
    counter = itertools.count(1)
    monkeypatch.setenv("PADDOCK_JUDGE_ENDPOINT", conv_policy.url)     # the node's judge: the scripted one
    monkeypatch.setenv("PADDOCK_USER_SIM_ENDPOINT", conv_policy.url)  # and its user_sim

    def run(task, strategy: str, seed: int = 7):
        v = version_playing(conv_policy, "conversational", strategy)
        rid = f"r{next(counter)}"
        lease = {**task.canonical(), "task_id": task.task_id}
        res = run_attempt(runtime, python_image, "n1", Attempt("run", str(tmp_path), rid, 1, 1, "b", v, lease, seed,
                                                               conv_policy.url, f"scripted-v{v}"))
        if res.shards:
            with Catalog(tmp_path) as cat:
                cat.commit(rid, 1, 1, res.shards, 0.0)
        return res, rid, connect(tmp_path)
    return run
