"""A local farm (controller and two node agents as processes, real sandboxes) with an OTLP
endpoint set: the collector receives, from the node agents' own processes, one trace per kept
rollout with the same tree the trajectory store holds, and nothing of a dropped one (a passing
rollout that is no hack suspect, with PADDOCK_TRACE_KEEP=0)."""
from __future__ import annotations

import pytest

from controller.analysis.query import connect
from controller.demo.localrun import RunConfig, run_local
from nodeagent.store import tracing
from nodeagent.verifier.validate import validate_for_run
from tests.store.test_tracing import OtlpReceiver, _attrs

pytestmark = [pytest.mark.slow, pytest.mark.sandbox]


def test_a_farms_node_agents_send_each_kept_rollouts_tree_to_the_collector(tmp_path, python_image, monkeypatch):
    with OtlpReceiver() as rx:
        monkeypatch.setenv("PADDOCK_OTLP_ENDPOINT", rx.url)      # the agents inherit the environment
        monkeypatch.setenv("PADDOCK_TRACE_KEEP", "0")       # a pass is kept only as a suspect
        run_dir = run_local(validate=validate_for_run,
                            cfg=RunConfig(versions=4, rollouts_per_task=2, tasks_limit=8, learning_rate=8.0,
                                          runs_dir=str(tmp_path), heartbeat_interval_s=0.5))
    con = connect(run_dir)
    rollouts = con.execute("SELECT run_id, rollout_id, attempt, fencing_token, node, trace_id, trace_sample "
                           "FROM rollouts").fetchall()
    stored = con.execute("SELECT trace_id, span_id, parent_span_id FROM spans").fetchall()
    con.close()
    assert len(rollouts) == 64   # enough that some pass (P(no pass) < 1 %: p(solve) starts at 0.08)
    kept = [r for r in rollouts if r[6] != "dropped"]
    assert kept and {r[6] for r in rollouts} <= set(tracing.SAMPLE_DECISIONS)
    got = [s for _, s in rx.spans]
    roots = {(s.trace_id.hex(), s.span_id.hex()) for s in got if not s.parent_span_id}
    # every kept committed attempt's root arrived (an uncommitted retry may add more, never fewer)
    want_roots = {(r[5], tracing.root_span_id(r[0], r[1], r[2], r[3])) for r in kept}
    assert want_roots <= roots
    assert all(r[5] == tracing.trace_id(r[0], r[1]) for r in rollouts)
    # every stored span (only kept attempts have any) arrived with its parent
    assert stored and {(t, s, p) for t, s, p in stored} <= {
        (s.trace_id.hex(), s.span_id.hex(), s.parent_span_id.hex()) for s in got if s.parent_span_id}
    # nothing of a dropped attempt
    dropped = {r[5] for r in rollouts if r[6] == "dropped"}
    assert dropped and not dropped & {s.trace_id.hex() for s in got}     # the seeded run passes some
    # sent by the node agents: each root names the node that ran it
    nodes = {res["host.name"] for res, s in rx.spans if not s.parent_span_id}
    assert nodes <= {"local-1", "local-2"} and {_attrs(s)["paddock.trace_sample"] for s in got
                                                 if not s.parent_span_id} <= set(tracing.SAMPLE_DECISIONS)
