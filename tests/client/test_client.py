"""Trainer client against a real controller and real agents over ZeroMQ: typed errors,
idempotent retries, results as they commit (sync and asyncio), cancel, staleness, and the
runnable example of docs/client.md."""
from __future__ import annotations

import asyncio
import json
import os
import re
import subprocess
import sys
import threading
import time

import pytest

from controller.client.api import (
    AsyncClient,
    BadRequest,
    Client,
    ControllerUnavailable,
    PolicyConflict,
    UnknownBatch,
    UnknownNode,
    UnknownPolicy,
    UnknownTask,
)
from controller.contracts import protocol as P
from controller.ondisk.keys import read_key_file
from controller.store.queue import QueueConfig
from nodeagent.agent.attempt import AttemptResult
from tests.broker.test_broker import DEP, ROOT, Farm, free_port, stuck_runner
from tests.conftest import wait_for

POLICY_URL = "http://127.0.0.1:9/v1"


@pytest.fixture
def farm(tmp_path):
    f = Farm(tmp_path)
    yield f
    f.stop()


def connect(farm, **kw) -> Client:
    kw.setdefault("timeout_s", 2.0)
    kw.setdefault("give_up_s", 20.0)
    kw.setdefault("watch_wait_s", 0.5)
    kw.setdefault("key_file", farm.key_file)
    return Client(farm.endpoint, DEP, **kw)


def test_refusals_are_typed(farm):
    with connect(farm) as c:
        with pytest.raises(UnknownPolicy, match="policy version 3"):
            c.submit(["t1"], 1, 3)
        c.publish_policy(3, POLICY_URL, "m")
        with pytest.raises(UnknownTask, match="nope"):
            c.submit(["t1", "nope"], 1, 3)
        with pytest.raises(BadRequest):
            c.submit([], 1, 3)
        with pytest.raises(PolicyConflict):
            c.publish_policy(3, POLICY_URL, "another-model")
        with pytest.raises(UnknownBatch):
            c.cancel("b424242")
        with pytest.raises(UnknownBatch):
            c.wait("b424242")
        with pytest.raises(UnknownNode):
            c.drain("ghost")
        assert c.status().counts["queued"] == 0, "no refusal changed anything"


def test_a_controller_that_never_answers_is_unavailable_after_give_up():
    with Client(f"tcp://127.0.0.1:{free_port()}", DEP, timeout_s=0.2, give_up_s=0.5,
                insecure=True) as c:
        t0 = time.monotonic()
        with pytest.raises(ControllerUnavailable, match="within 0.5s"):
            c.status()
        assert time.monotonic() - t0 < 3
        assert c.reconnects >= 1, "each silent try gets a fresh socket"


def test_a_retried_submit_is_not_submitted_twice(farm):
    with connect(farm) as c:
        c.publish_policy(1, POLICY_URL)
        msg = P.Submit(idem="same-key", tasks=["t1"], n_per_task=5, policy_version=1)
        first = c._request(msg, (P.Submitted,))
        c._new_socket(c.ctx)  # what a timeout does: fresh socket, same message
        again = c._request(msg, (P.Submitted,))
        assert (again.batch_id, again.rollouts) == (first.batch_id, first.rollouts)
        assert sum(c.status().counts.values()) == 5


def test_results_arrive_as_they_commit_and_wait_n_returns_early(farm):
    gate = threading.Event()

    def slow(rollout_id: str) -> bool:       # exactly half: the odd submission numbers
        return int(rollout_id.rsplit("-", 1)[1]) % 2 == 1

    def gated(a):
        if slow(a.rollout_id):
            gate.wait(30)
        return AttemptResult("pass", 1.0, {}, None)

    farm.agent("n1", 8, runner=gated)
    with connect(farm) as c:
        c.publish_policy(1, POLICY_URL)
        batch = c.submit(["t1"], 8, 1)
        got = c.wait(batch, n=4)
        assert len(got) == 4 and not any(slow(i["rollout_id"]) for i in got)
        gate.set()
        assert len(c.wait(batch)) == 8


def test_async_client_submits_and_iterates_results(farm):
    farm.agent("n1", 4)

    async def main():
        async with AsyncClient(farm.endpoint, DEP, timeout_s=2, watch_wait_s=0.5,
                               key_file=farm.key_file) as c:
            await c.publish_policy(1, POLICY_URL)
            batch = await c.submit(["t1", "t2"], 5, 1)
            seen = [item["rollout_id"] async for item in c.aresults(batch)]
            status = await c.status()
            with pytest.raises(UnknownTask):
                await c.submit(["zzz"], 1, 1)
            return seen, status

    seen, status = asyncio.run(main())
    assert len(seen) == len(set(seen)) == 10
    assert status.counts["committed"] == 10


def test_cancel_ends_the_batch_and_a_late_result_is_rejected(farm):
    stuck, started, gate = stuck_runner()
    agent = farm.agent("n1", 1, runner=stuck)
    with connect(farm) as c:
        c.publish_policy(1, POLICY_URL)
        batch = c.submit(["t1"], 4, 1)
        assert started.wait(10)
        assert c.cancel(batch) == 4
        assert c.wait(batch) == [], "cancelled rollouts are not results"
        gate.set()
        assert c.status().counts["cancelled"] == 4
    assert agent.active == {}, "the agent dropped the cancelled attempt"


def test_staleness_bound_reruns_old_rollouts_with_the_new_policy(tmp_path):
    f = Farm(tmp_path, queue=QueueConfig(max_staleness=1, stale_policy="rerun"))
    try:
        with connect(f) as c:
            c.publish_policy(1, POLICY_URL)
            batch = c.submit(["t1"], 3, 1)
            c.publish_policy(2, POLICY_URL)
            c.publish_policy(3, POLICY_URL)  # version 1 is now 2 behind: over the bound
            f.agent("n1", 2)
            items = c.wait(batch)
        assert [i["policy_version"] for i in items] == [3, 3, 3]
    finally:
        f.stop()


def test_staleness_bound_can_drop_instead(tmp_path):
    f = Farm(tmp_path, queue=QueueConfig(max_staleness=0, stale_policy="drop"))
    try:
        with connect(f) as c:
            c.publish_policy(1, POLICY_URL)
            batch = c.submit(["t1"], 2, 1)
            c.publish_policy(2, POLICY_URL)
            items = c.wait(batch)
        assert [(i["state"], i["infra_reason"]) for i in items] == [("cancelled",
                                                                      "stale_policy")] * 2
    finally:
        f.stop()


def test_the_documented_example_runs(tmp_path):
    doc = (ROOT / "docs" / "client.md").read_text()
    (code,) = re.findall(r"```python\n(.*?)```", doc, re.S)
    (tmp_path / "example.py").write_text(code)
    tasks = {name: {"task_id": name, "image_digest": "sha256:aa"}
             for name in ("python/fizzbuzz", "python/gcd")}
    from controller.broker.daemon import Controller
    ctl = Controller("tcp://127.0.0.1:0", DEP, str(tmp_path / "run"), "run", tasks,
                     str(tmp_path / "q.db"), heartbeat_interval_s=0.1)
    threads = [threading.Thread(target=ctl.serve, daemon=True)]
    from nodeagent.agent.daemon import NodeAgent, noop_runner
    agent = NodeAgent("n1", ctl.endpoint, DEP, 4, runner=noop_runner(), heartbeat_interval_s=0.1,
                      keys=read_key_file(ctl.key_file))
    threads.append(threading.Thread(target=agent.run, daemon=True))
    for t in threads:
        t.start()
    try:
        # the example checks that a model server answers first: the scripted policy server is one
        from controller.contracts.tasks import TaskSet
        from controller.demo.policy_server import PolicyServer
        srv = PolicyServer(TaskSet("none", ())).__enter__()
        env = {**os.environ, "PADDOCK_ENDPOINT": ctl.endpoint, "PADDOCK_DEPLOYMENT": DEP,
               "PADDOCK_KEY_FILE": ctl.key_file, "PYTHONPATH": str(ROOT), "PADDOCK_POLICY_URL": srv.url}
        r = subprocess.run([sys.executable, str(tmp_path / "example.py")], env=env, cwd=ROOT,
                           capture_output=True, text=True, timeout=60)
        assert r.returncode == 0, r.stderr
        assert "8 scored rollouts, mean reward 1.00" in r.stdout
        assert "refused: unknown tasks: ['no/such-task']" in r.stdout
        srv.__exit__(None, None, None)
    finally:
        agent.stopped = True
        ctl.core.stopped = True
        for t in threads:
            t.join(10)


def test_n_rollouts_from_the_band_go_to_the_band_tasks(farm, tmp_path):
    # t2 is never solved, t1 half the time: only t1 is in the 0.2-0.8 band, so with no
    # exploration share every sampled rollout is of t1.
    import random

    from controller.taskbank.curriculum import Curriculum, CurriculumConfig
    farm.agent("n1", 4, runner=lambda a: AttemptResult("pass", 1.0, {}, None))
    with Curriculum(tmp_path / "cur.db", ["t1", "t2"], CurriculumConfig(explore_share=0.0)) as cur:
        for i in range(12):
            cur.record("t2", 1, "fail", rollout_id=f"b{i}")
            cur.record("t1", 1, "pass" if i % 2 else "fail", rollout_id=f"c{i}")
        with connect(farm) as c:
            c.publish_policy(1, POLICY_URL)
            batch = c.submit_from_band(cur, 6, 1, random.Random(7))
            got = c.wait(batch)
    assert len(got) == 6 and {r["task_ref"] for r in got} == {"t1"}


def test_a_sampler_request_is_resolved_by_the_controllers_curriculum(tmp_path):
    # The same band as above, but the CONTROLLER's curriculum picks: the trainer sends only
    # BandRequest(n_tasks, band, seed). A band holding no task of its own still serves the
    # nearest ones; a controller without a curriculum refuses such a submit.
    from controller.client.api import BandRequest
    from controller.taskbank.curriculum import Curriculum, CurriculumConfig
    cur = Curriculum(tmp_path / "cur.db", ["t1", "t2"], CurriculumConfig(explore_share=0.0))
    for i in range(12):
        cur.record("t2", 1, "fail", rollout_id=f"b{i}")
        cur.record("t1", 1, "pass" if i % 2 else "fail", rollout_id=f"c{i}")
    (tmp_path / "with").mkdir()
    (tmp_path / "bare").mkdir()
    farm = Farm(tmp_path / "with", curriculum=cur)
    bare = Farm(tmp_path / "bare")
    try:
        farm.agent("n1", 4, runner=lambda a: AttemptResult("pass", 1.0, {}, None))
        with connect(farm) as c:
            c.publish_policy(1, POLICY_URL)
            batch = c.submit(sampler=BandRequest(n_tasks=3, band=[0.2, 0.8], seed=7),
                             n_per_task=2, policy=1)
            got = c.wait(batch)
            assert len(got) == 6 and {r["task_ref"] for r in got} == {"t1"}
            hard = c.wait(c.submit(sampler=BandRequest(2, [0.0, 0.1], 1), policy=1))
            assert {r["task_ref"] for r in hard} == {"t2"}, "never solved: in the 0-0.1 band"
            with pytest.raises(P.ProtocolError, match="sampler.band"):  # refused before sending
                c.submit(sampler=BandRequest(2, [0.9, 0.1], 1), policy=1)
        with connect(bare) as c:
            c.publish_policy(1, POLICY_URL)
            with pytest.raises(BadRequest, match="no curriculum"):
                c.submit(sampler=BandRequest(2, [0.2, 0.8], 1), policy=1)
    finally:
        farm.stop()
        bare.stop()
        cur.close()


def test_the_controllers_curriculum_learns_from_every_commit(tmp_path):
    # With a curriculum, the controller counts each committed verdict (once per rollout) for
    # its task and policy version: a trainer that only sends sampler requests still moves the
    # estimates, and tasks leave "explore".
    from controller.taskbank.curriculum import Curriculum
    cur = Curriculum(tmp_path / "cur.db", ["t1", "t2"])
    (tmp_path / "farm").mkdir()
    farm = Farm(tmp_path / "farm", curriculum=cur)
    try:
        farm.agent("n1", 4, runner=lambda a: AttemptResult("pass", 1.0, {}, None))
        with connect(farm) as c:
            c.publish_policy(1, POLICY_URL)
            assert len(c.wait(c.submit(["t1"], n_per_task=4, policy=1))) == 4
        est = cur.estimates(1)
        assert est["t1"].evidence == 4 and est["t2"].evidence == 0
        assert cur.classify(1) == {"t1": "too_easy", "t2": "explore"}
    finally:
        farm.stop()
        cur.close()


def test_a_resent_sampler_submit_is_answered_without_sampling_again(tmp_path):
    from controller.taskbank.curriculum import Curriculum
    from tests.broker.test_broker import Harness
    with Curriculum(tmp_path / "cur.db", ["t1", "t2"]) as cur:
        h = Harness(tmp_path, curriculum=cur)
        h.send(b"c", P.PublishPolicy(idem="p", version=1, endpoint=POLICY_URL, model="m"))
        sub = P.Submit(idem="once", tasks=[], n_per_task=1, policy_version=1,
                       sampler=P.BandRequest(n_tasks=4, band=[0.2, 0.8], seed=3))
        first, again = (next(m for _, m in h.send(b"c", sub) if isinstance(m, P.Submitted))
                        for _ in range(2))
        assert (first.batch_id, first.rollouts) == (again.batch_id, again.rollouts) == \
            (first.batch_id, 4)
        assert h.queue.counts()["queued"] == 4


# ---- trainer restarts: keyed submits, resumable results, the endpoint file -------------------

def test_a_submit_with_a_key_gets_the_same_batch_every_time(farm):
    with connect(farm) as c:
        c.publish_policy(1, POLICY_URL)
        first = c.submit(["t1"], 3, 1, key="run-7/step-0")
        with connect(farm) as restarted:  # another process, the same training step
            assert restarted.submit(["t1"], 3, 1, key="run-7/step-0") == first
        assert c.submit(["t1"], 3, 1, key="run-7/step-1") != first
        assert sum(c.status().counts.values()) == 6, "no orphan batch"
        with pytest.raises(TypeError, match="key"):
            c.submit(["t1"], 1, 1, key="")


def test_every_result_has_a_cursor_and_results_after_it_resume_exactly(farm):
    farm.agent("n1", 4)
    with connect(farm) as c:
        c.publish_policy(1, POLICY_URL)
        batch = c.submit(["t1"], 6, 1)
        everything = c.wait(batch)
        cursors = [i["cursor"] for i in everything]
        assert cursors == sorted(cursors) and len(set(cursors)) == 6
        rest = list(c.results(batch, after=everything[2]["cursor"]))
        assert [i["rollout_id"] for i in rest] == [i["rollout_id"] for i in everything[3:]]
        assert list(c.results(batch, after=cursors[-1])) == []


def test_a_client_follows_the_endpoint_file_to_a_controller_on_another_port(tmp_path):
    first = Farm(tmp_path)
    ep_file = tmp_path / "run" / "controller.endpoint"
    ep_file.write_text(first.endpoint)
    with Client.for_run(tmp_path / "run", DEP, timeout_s=5.0, give_up_s=30.0,
                        watch_wait_s=0.2, reread_s=0.2) as c:
        c.publish_policy(1, POLICY_URL)
        first.stop()  # (its serve closed the socket and the queue)
        second = Farm(tmp_path)  # the same queue, another port
        try:
            assert second.endpoint != first.endpoint
            ep_file.write_text(second.endpoint)
            t0 = time.monotonic()
            batch = c.submit(["t1"], 2, 1)
            assert time.monotonic() - t0 < 3.0, "found well within the request timeout"
            assert c.endpoint == second.endpoint
            second.agent("n1", 2)
            assert len(c.wait(batch)) == 2
        finally:
            second.stop()


def test_docs_client_md_shows_the_loop_of_the_resumable_trainer_example():
    example = (ROOT / "docs" / "examples" / "resumable_trainer.py").read_text()
    loop = re.search(r"# --8<-- \[start:loop\]\n(.*?)# --8<-- \[end:loop\]", example, re.S)
    (shown,) = re.findall(r"```py\n(.*?)```", (ROOT / "docs" / "client.md").read_text(), re.S)
    assert shown.strip() == loop.group(1).strip(), "docs/client.md shows the tested example"


def test_the_resumable_trainer_example_survives_kill_9_and_resumes(tmp_path):
    import signal
    tasks = {name: {"task_id": name, "image_digest": "sha256:aa"}
             for name in ("python/fizzbuzz", "python/gcd")}
    from controller.broker.daemon import Controller
    from nodeagent.agent.daemon import NodeAgent, noop_runner
    ctl = Controller("tcp://127.0.0.1:0", DEP, str(tmp_path / "run"), "run", tasks,
                     str(tmp_path / "q.db"), heartbeat_interval_s=0.1)
    (tmp_path / "run" / "controller.endpoint").write_text(ctl.endpoint)
    agent = NodeAgent("n1", ctl.endpoint, DEP, 2, runner=noop_runner(0.05),
                      heartbeat_interval_s=0.1, keys=read_key_file(ctl.key_file))
    threads = [threading.Thread(target=t, daemon=True) for t in (ctl.serve, agent.run)]
    for t in threads:
        t.start()
    ckpt = tmp_path / "trainer.json"
    env = {**os.environ, "PADDOCK_RUN_DIR": str(tmp_path / "run"), "PADDOCK_DEPLOYMENT": DEP,
           "TRAINER_CHECKPOINT": str(ckpt), "TRAINER_STEPS": "3", "PYTHONPATH": str(ROOT)}
    script = [sys.executable, str(ROOT / "docs" / "examples" / "resumable_trainer.py")]
    def folded() -> int:
        try:
            return len(json.loads(ckpt.read_text())["seen"])
        except (OSError, ValueError):
            return 0
    kills = 0
    try:
        for kill_at in (2, 7, 8, 13, 21):  # inside a batch, at a step's end, in the last one
            proc = subprocess.Popen(script, env=env, cwd=tmp_path, stdout=subprocess.DEVNULL,
                                    stderr=subprocess.PIPE)
            wait_for(lambda: folded() >= kill_at or proc.poll() is not None, 60,
                     f"{kill_at} results folded in")
            if proc.poll() is None:
                proc.send_signal(signal.SIGKILL)
                kills += 1
            proc.communicate()
        r = subprocess.run(script, env=env, cwd=tmp_path, capture_output=True, text=True,
                           timeout=60)
        assert r.returncode == 0, r.stderr
        out = r.stdout
        state = json.loads(ckpt.read_text())
        assert len(state["seen"]) == 3 * 8 and len(set(state["seen"])) == 24, "none twice"
        assert "done: 3 steps, 24 results" in out
        assert kills >= 3, "killed mid-run"
        from controller.store.queue import RolloutQueue
        assert sum(RolloutQueue(tmp_path / "q.db").counts().values()) == 24, "no orphan batch"
    finally:
        agent.stopped = True
        ctl.core.stopped = True
        for t in threads:
            t.join(10)
