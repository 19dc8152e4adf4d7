"""Cancellation on a real farm: a real controller and a real node agent over ZeroMQ (CURVE),
rollouts in real sandboxes, a tool-calling model server (outside Paddock) whose policy runs
`sleep 30` in the sandbox. Cancelling the batch stops both rollouts: their sandboxes are gone
and their slots take the next batch within a second; the cancel's typed reason is recorded by
the controller (`cancelled`, its counters) and by the node (`AgentCore.cancelled`); nothing of
the cancelled work is committed."""
from __future__ import annotations

import threading
import time
import uuid
from pathlib import Path

import pytest

from controller.broker.daemon import Controller
from controller.client.api import Client
from controller.contracts import protocol as P
from controller.contracts.errors import LocalProtocolError
from controller.ondisk.keys import read_key_file
from controller.store.queue import RolloutQueue
from controller.taskbank.builtin import builtin_taskset
from nodeagent.agent.daemon import NodeAgent
from nodeagent.agent.health import HealthSampler
from tests.agent.toolpolicy import ToolPolicy
from tests.conftest import wait_for

pytestmark = pytest.mark.sandbox
DEP = "dep-cancel-test"


@pytest.fixture
def farm(tmp_path, runtime, python_image):
    t = next(t for t in builtin_taskset().tasks if t.family == "python")
    entry = {**t.canonical(), "task_id": t.task_id, "name": "t", "image_digest": "sha256:" + Path(python_image).stem}
    ctl = Controller("tcp://127.0.0.1:0", DEP, str(tmp_path / "run"), "run", {t.task_id: entry}, str(tmp_path / "q.db"),
                     heartbeat_interval_s=0.1, liveness=5)
    threads = [threading.Thread(target=ctl.serve, daemon=True)]
    agent = NodeAgent("n1", ctl.endpoint, DEP, 2, image_store=str(Path(python_image).parent.parent), runtime=runtime,
                      heartbeat_interval_s=0.1, keys=read_key_file(ctl.key_file))
    threads.append(threading.Thread(target=agent.run, daemon=True))
    for th in threads:
        th.start()
    policy = ToolPolicy("sleep 30")
    client = Client(ctl.endpoint, DEP, key_file=ctl.key_file, timeout_s=5.0, give_up_s=20.0, watch_wait_s=0.5)
    yield ctl, agent, policy, client
    client.close()
    agent.stopped = True
    ctl.core.stopped = True
    for th in threads:
        th.join(10)
    policy.close()
    wait_for(lambda: runtime.active_sandboxes() == 0, 30, "the farm's sandboxes gone")


def running(runtime, agent, n: int) -> bool:
    return runtime.active_sandboxes() == n and len(agent.active) == n


def test_a_cancelled_batch_frees_its_slots_within_a_second(farm, runtime, tmp_path):
    ctl, agent, policy, c = farm
    c.publish_policy(1, policy.url)
    first = c.submit(["t"], 2, 1)
    wait_for(lambda: running(runtime, agent, 2) and policy.requests >= 2, 60, "both rollouts in their tool call")
    t0 = time.monotonic()
    assert c.cancel(first) == 2
    wait_for(lambda: runtime.active_sandboxes() == 0, 5, "the cancelled rollouts' sandboxes gone", interval_s=0.005)
    gone_s = time.monotonic() - t0
    # the slots are free: the next batch's two rollouts both run at once (each in a new sandbox)
    second = c.submit(["t"], 2, 1)
    t1 = time.monotonic()
    wait_for(lambda: running(runtime, agent, 2), 5, "the next batch running on both slots", interval_s=0.005)
    taken_s = time.monotonic() - t1
    print(f"\ncancel -> sandboxes destroyed: {gone_s:.3f}s; cancel -> next batch running: {time.monotonic() - t0:.3f}s "
          f"(submit -> running {taken_s:.3f}s)")
    assert gone_s < 1.0, f"the cancelled sandboxes lived {gone_s:.2f}s past the cancel"
    assert time.monotonic() - t0 < 1.0 + taken_s
    assert dict(agent.core.cancelled) == {"cancelled_by_trainer": 2}

    wait_for(lambda: policy.requests == 4, 10, "the second batch's rollouts in their tool call")
    # a cancel with another reason: echoed, counted by it; the node stops that batch too
    reply = c._request(P.Cancel(idem=uuid.uuid4().hex, batch_id=second, reason="deadline"), (P.Cancelled,))
    assert (reply.rollouts, reply.reason) == (2, "deadline")
    with pytest.raises(LocalProtocolError, match="field 'reason' must be"):
        c.cancel(second, reason="because")                              # the trainer's codes only
    wait_for(lambda: runtime.active_sandboxes() == 0, 5, "the second batch's sandboxes gone")
    counters = c.status().counters
    assert (counters["revoked_cancelled_by_trainer"], counters["revoked_deadline"]) == (2, 2)
    assert dict(agent.core.cancelled) == {"cancelled_by_trainer": 4}, "the node knows only that its batch was cancelled"
    assert HealthSampler(agent).sample()["cancelled"] == {"cancelled_by_trainer": 4}   # `paddock health`
    assert c.wait(first) == [] and c.wait(second) == []                # nothing of it committed

    q = RolloutQueue(tmp_path / "q.db")
    rows = q.rollouts()
    assert [r["state"] for r in rows] == ["cancelled"] * 4
    assert all(a["outcome"] == "cancelled" for r in rows for a in q.attempts(r["rollout_id"]))
    # the typed reason on the record: the rollouts' infra_reason and their attempts' reason
    assert sorted(r["infra_reason"] for r in rows) == ["cancelled_by_trainer"] * 2 + ["deadline"] * 2
    assert sorted(a["reason"] for r in rows for a in q.attempts(r["rollout_id"])) == \
        ["cancelled_by_trainer"] * 2 + ["deadline"] * 2
    assert policy.requests == 4, "no model call after the cancels"
