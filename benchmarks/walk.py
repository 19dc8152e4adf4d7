"""The walk of one lease: from the broker to the committed row, room by room.

One process, real parts, no sockets (the sans-I/O cores take the frames a socket would carry): the
broker core over a real queue file and catalog, leasing one rollout of a built-in task by
reference (the run's tasks file and its blobs); the node agent's core decoding the lease; one real
attempt (`run_attempt`: task blob, sandbox, the built-in harness against the scripted policy
server, the verifier, the shard writer); the result frame back into the broker core, which commits
the row. A profile hook on this thread records the room of every Python function called on the
way (a room: `controller/<package>`, `nodeagent/<package>`, `layers`, `slurm`; the standard
library and other packages are transparent). Consecutive calls in one room are one stay; a return
is a stay in a room the walk had already left.

    PYTHONPATH=. .venv/bin/python benchmarks/walk.py [--task NAME] [--show]

Threads other than the walk's own (the gateway's HTTP server, the scripted model server) are not
traced: they serve the walk, the lease does not pass through them.
"""
from __future__ import annotations

import argparse
import json
import shutil
import sys
import tempfile
import time
from pathlib import Path

if "controller" not in sys.modules and not any(Path(p, "controller").is_dir() for p in sys.path if p):
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))   # no PYTHONPATH: this checkout

import controller  # noqa: E402
from controller.broker.core import BrokerCore  # noqa: E402
from controller.contracts import protocol as P  # noqa: E402
from controller.demo.policy_server import STRATEGIES, PolicyServer, default_params  # noqa: E402
from controller.ondisk.taskblobs import write_tasks_file  # noqa: E402
from controller.store.catalog import Catalog  # noqa: E402
from controller.store.queue import QueueConfig, RolloutQueue  # noqa: E402
from controller.store.taskindex import open_index  # noqa: E402
from controller.taskbank.blobs import blob_root, publish  # noqa: E402
from controller.taskbank.builtin import builtin_taskset  # noqa: E402
from layers.builtin import default_store_root, ensure_builtin_image  # noqa: E402
from layers.store import ImageStore  # noqa: E402
from nodeagent.agent.attempt import run_attempt  # noqa: E402
from nodeagent.agent.core import AgentCore  # noqa: E402
from nodeagent.sandbox.runtime import SandboxRuntime  # noqa: E402

ROOT = Path(controller.__file__).resolve().parents[1]   # the tree under test (PYTHONPATH first)
DEP = "walk"
PACKAGES = ("controller", "nodeagent")


def room_of(filename: str) -> str | None:
    try:
        rel = Path(filename).resolve().relative_to(ROOT)
    except ValueError:
        return None
    parts = rel.parts
    if parts[0] in PACKAGES and len(parts) > 2:
        return f"{parts[0]}.{parts[1]}"
    if parts[0] in ("layers", "slurm"):
        return parts[0]
    return None


class Trace:
    """The rooms of the Python calls made on this thread while on."""

    def __init__(self) -> None:
        self.rooms: list[str] = []
        self._cache: dict[str, str | None] = {}

    def _hook(self, frame, event, _arg):
        if event != "call":
            return
        name = frame.f_code.co_filename
        room = self._cache.get(name, "?")
        if room == "?":
            room = self._cache[name] = room_of(name)
        if room is not None and (not self.rooms or self.rooms[-1] != room):
            self.rooms.append(room)

    def __enter__(self):
        sys.setprofile(self._hook)
        return self

    def __exit__(self, *exc):
        sys.setprofile(None)


def walk(task_name: str) -> tuple[list[str], dict]:
    store = ImageStore(default_store_root())
    digest, image = ensure_builtin_image(store)
    taskset = builtin_taskset()
    task = next(t for t in taskset.tasks if t.name == task_name)
    run_dir = Path(tempfile.mkdtemp(prefix="paddock-walk-"))
    tasks_json = run_dir / "tasks.json"
    write_tasks_file(tasks_json, publish(taskset, {t.task_id: (digest, image) for t in taskset.tasks},
                                         blob_root("", taskset, run_dir)))
    queue = RolloutQueue(run_dir / "controller.db", config=QueueConfig(lease_ttl_s=600))
    catalog = Catalog(run_dir)
    broker = BrokerCore(queue, open_index(tasks_json), DEP, run_dir.name, str(run_dir), catalog=catalog,
                        heartbeat_interval_s=60.0)
    agent = AgentCore("n1", 1, DEP, heartbeat_interval_s=60.0, liveness=5)
    runtime = SandboxRuntime().start()

    def to_broker(peer: bytes, msgs, tick: bool = True) -> list:
        with queue.batch():
            for m in msgs:
                broker.receive(peer, P.encode(m, DEP))
            if tick:
                broker.tick()
        return broker.take_outbox()

    def to_agent(out) -> None:
        for peer, m in out:
            if peer == b"n1":
                agent.receive_data(P.encode(m, DEP))

    def agent_frames() -> list:
        return [m for m in agent.take_outbox() if isinstance(m, P.Message)]

    try:
        with PolicyServer(taskset) as policy:
            params = default_params()
            params[task.family] = {s: (60.0 if s == "solve" else 0.0) for s in STRATEGIES[task.family]}
            policy.set_policy(1, params)
            agent.start()
            to_agent(to_broker(b"n1", agent_frames()))          # register -> welcome
            to_broker(b"n1", agent_frames())
            to_broker(b"client", [P.PublishPolicy(idem="p1", version=1, endpoint=policy.url, model="scripted-v1")])
            to_broker(b"client", [P.Submit(idem="s1", tasks=[task.task_id], n_per_task=1, policy_version=1)],
                      tick=False)
            t0 = time.monotonic()
            with Trace() as trace:
                to_agent(to_broker(b"n1", []))                    # the broker's pass: the lease

                attempts = agent.take_attempts()
                assert len(attempts) == 1, attempts
                a = attempts[0]
                res = run_attempt(runtime, image, "n1", a)
                agent.attempts_done([(a, res)])
                to_broker(b"n1", agent_frames())                  # the result -> commit
            wall_s = time.monotonic() - t0
        committed = catalog.is_committed(a.rollout_id, a.attempt, a.token)
    finally:
        runtime.close()
        shutil.rmtree(run_dir, ignore_errors=True)
    row = {"task": task.name, "outcome": res.outcome, "reward": res.reward, "wall_s": round(wall_s, 2),
           "committed": committed}
    return trace.rooms, row


VOCABULARY = ("controller.contracts", "controller.ondisk")   # leaves every room uses, like the stdlib


def summarise(calls: list[str], transparent: tuple[str, ...] = ()) -> dict:
    """Rooms, stays and returns of a walk; rooms in `transparent` count as no room."""
    stays: list[str] = []
    for r in calls:
        if r not in transparent and (not stays or stays[-1] != r):
            stays.append(r)
    seen: set[str] = set()
    returns: list[str] = []
    for r in stays:
        if r in seen:
            returns.append(r)
        seen.add(r)
    per_room = {r: returns.count(r) for r in sorted(set(returns))}
    return {"rooms": len(seen), "stays": len(stays), "returns": len(returns),
            "most_returns_to_one_room": max(per_room.values(), default=0), "returned_to": per_room,
            "path": stays}


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--task", default="python/fizzbuzz")
    ap.add_argument("--show", action="store_true", help="print the stays in order")
    args = ap.parse_args()
    calls, row = walk(args.task)
    out = {"every_room": summarise(calls), "vocabulary_transparent": summarise(calls, VOCABULARY), **row}
    if not args.show:
        for k in ("every_room", "vocabulary_transparent"):
            out[k].pop("path")
    print(json.dumps(out, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
