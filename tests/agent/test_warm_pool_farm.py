"""Warm pools in the node agent's farm path, with real sandboxes: rollouts run by the agent's own
attempt path (`NodeAgent._run_attempt`, what its slot threads call) take their agent and grading
sandboxes from the autoscaled pools, each sandbox is used once, the results equal the unpooled
path's, and a pooled sandbox shows no trace of an earlier rollout."""
from __future__ import annotations

from pathlib import Path

import pytest

from controller.contracts.tasks import LeaseTask
from controller.taskbank.builtin import builtin_taskset
from nodeagent.agent.core import Attempt
from nodeagent.agent.daemon import NodeAgent
from nodeagent.agent.health import HealthSampler
from nodeagent.agent.warmpools import start_warm_pools
from nodeagent.sandbox.autoscale import ScaleConfig
from nodeagent.sandbox.runtime import SandboxRuntime, SandboxSpec, tar_to_changes
from nodeagent.sandbox.warmpool import pool_key
from tests.conftest import FakeClock, sandbox_prerequisites, wait_for

pytestmark = pytest.mark.sandbox
TASKSET = builtin_taskset()
NAMES = ["python/reverse_words", "python/fizzbuzz", "python/gcd", "python/is_prime", "math/lcm_12_18"]


@pytest.fixture(scope="module")
def policy(solving_policy):
    return solving_policy


@pytest.fixture(scope="module")
def node(python_image):
    """A node agent (never connected: its attempts are run by hand) over its own runtime."""
    reason = sandbox_prerequisites()
    if reason:
        pytest.fail(f"sandbox prerequisites missing: {reason}")
    rt = SandboxRuntime().start()
    agent = NodeAgent("pool-node", "tcp://127.0.0.1:9", "pool-test", slots=2,
                      image_store=str(Path(python_image).parent.parent), runtime=rt, insecure=True)
    handed: list[str] = []
    acquire = rt.acquire

    def recording_acquire(spec, *args, **kw):       # notes each handout's id, changes nothing
        sb = acquire(spec, *args, **kw)
        handed.append(sb.id)
        return sb
    rt.acquire = recording_acquire
    yield agent, rt, handed
    rt.close()


def attempt(run_dir: Path, rid: str, name: str, policy, python_image) -> Attempt:
    t = TASKSET.by_name()[name]
    task = LeaseTask.decode({**t.canonical(), "task_id": t.task_id,
                             "image_digest": "sha256:" + Path(python_image).stem})
    return Attempt("run", str(run_dir), rid, 1, 1, "b", 3, task, 7, policy.url, "scripted-v7")


def outcome_of(run_dir: Path, res) -> tuple:
    """The verdict and the agent's changes (path, kind, content) as stored; bytecode caches
    left out (a .pyc holds its source's mtime, which differs from run to run)."""
    changes = [c for p in sorted((run_dir / "changes").glob("*.tar")) for c in tar_to_changes(p.read_bytes())
               if "/__pycache__/" not in c.path]
    return res.outcome, res.reward, res.infra_reason, sorted((c.path, c.kind, c.data) for c in changes)


def test_rollouts_take_pooled_sandboxes_once_each_and_score_as_unpooled(node, policy, python_image, tmp_path):
    agent, rt, handed = node
    unpooled = {}
    for i, name in enumerate(NAMES):          # the pools are off: every sandbox is made for it
        d = tmp_path / f"off-{i}"
        unpooled[name] = outcome_of(d, agent._run_attempt(attempt(d, f"r{i}", name, policy, python_image)))
    assert rt.pool_hits == 0 and len(handed) == len(set(handed))
    assert "pass" in {o[0] for o in unpooled.values()} and not any(o[2] for o in unpooled.values())

    start_warm_pools(rt, agent, max_sandboxes=4)
    before, pooled = len(handed), {}
    for i, name in enumerate(NAMES):
        d = tmp_path / f"on-{i}"
        pooled[name] = outcome_of(d, agent._run_attempt(attempt(d, f"r{i}", name, policy, python_image)))
        # the agent's and the grading sandbox's pools are ready before the next lease comes
        wait_for(lambda: sum(rt.pool_stats()["pool_ready"].values()) >= 2, 60, "two warm pools ready")
    stats = rt.pool_stats()
    for name in NAMES:
        assert pooled[name] == unpooled[name], [(a, b) for a, b in zip(pooled[name][3], unpooled[name][3]) if a != b]
    acquires = len(handed) - before
    assert acquires == 2 * 4 + 1          # the agent's and the grader's; a math answer has no grader
    # only the first rollout's two sandboxes were made on the spot: every later one was waiting
    assert stats["pool_misses"] == 2 and stats["pool_hits"] == acquires - 2
    assert len(handed) == len(set(handed))                     # never a sandbox twice
    assert sorted(stats["pool_targets"].values()) == [1, 1]
    assert all(sb_id not in handed for p in rt._pools.values() for sb_id in (s.id for s in p._ready))
    health = HealthSampler(agent).sample()                     # what the heartbeat and `paddock health` carry
    assert health["pool_hits"] == stats["pool_hits"] and health["pool_misses"] == 2
    assert health["warm_pool"] >= 2 and sorted(health["pool_targets"].values()) == [1, 1]


def test_a_pooled_sandbox_shows_no_trace_of_an_earlier_rollout(node, python_image):
    agent, rt, handed = node
    if rt._scaler is None:
        start_warm_pools(rt, agent, max_sandboxes=4)
    spec_a = SandboxSpec(image=Path(python_image), files={"a.txt": b"task a"})
    first = rt.acquire(spec_a)
    r = first.exec(["sh", "-c", "echo secret > /tmp/trace; echo x > /work/trace; "
                                "setsid sleep 600 </dev/null >/dev/null 2>&1 & echo started"])
    assert r.stdout == b"started\n", r.stderr
    wait_for(lambda: len(rt._pools.get(pool_key(spec_a), ())) >= 1, 60, "a ready sandbox of the spec")
    hits = rt.pool_hits
    second = rt.acquire(SandboxSpec(image=Path(python_image), files={"b.txt": b"task b"}))
    try:
        assert rt.pool_hits == hits + 1 and second.id != first.id
        probe = ("import os\n"
                 "print(sorted(os.listdir('/tmp')), sorted(os.listdir('/work')))\n"
                 "cmds = []\n"
                 "for p in os.listdir('/proc'):\n"
                 "    if p.isdigit():\n"
                 "        try: cmds.append(open(f'/proc/{p}/cmdline','rb').read().split(b'\\0')[0].decode())\n"
                 "        except OSError: pass\n"
                 "print(any('sleep' in c for c in cmds))\n")
        out = second.exec(["python3", "-c", probe]).stdout.decode().splitlines()
        assert out[0] == "[] ['b.txt']", out                   # not a.txt, not /work/trace or /tmp/trace
        assert out[1] == "False"                               # the earlier sleep is not here
        assert first.exec(["sh", "-c", "cat /tmp/trace"]).stdout == b"secret\n"   # it was real
    finally:
        first.destroy()
        second.destroy()
    assert handed.count(second.id) == 1


def test_a_draining_agent_holds_no_warm_sandbox(node):
    agent, rt, _ = node
    if rt._scaler is None:
        pytest.skip("needs the pools started by the tests above")
    agent.core.drain(deadline_s=0.0)
    rt.plan_pools()
    wait_for(lambda: rt.pool_stats()["warm_pool"] == 0, 60, "the pools emptied")
    assert set(rt.pool_stats()["pool_targets"].values()) == {0}


def test_a_spec_not_leased_for_a_while_loses_its_pool(busybox_image):
    clock = FakeClock()
    rt = SandboxRuntime().start()
    try:
        agent = NodeAgent("idle-node", "tcp://127.0.0.1:9", "pool-test", slots=2,
                          image_store=str(Path(busybox_image).parent.parent), runtime=rt, insecure=True)
        start_warm_pools(rt, agent, max_sandboxes=2, config=ScaleConfig(idle_after_s=120), clock=clock)
        spec = SandboxSpec(image=Path(busybox_image))
        rt.acquire(spec).destroy()
        rt.plan_pools()
        wait_for(lambda: rt.pool_stats()["warm_pool"] == 1, 60, "a ready sandbox")
        clock.advance(119)
        assert rt.plan_pools() == {pool_key(spec): 1}
        clock.advance(2)
        assert rt.plan_pools() == {pool_key(spec): 0}
        assert rt._pools == {} and rt.pool_stats()["pool_targets"] == {}
        wait_for(lambda: rt.active_sandboxes() == 0, 30, "the waiting sandbox destroyed")
    finally:
        rt.close()
