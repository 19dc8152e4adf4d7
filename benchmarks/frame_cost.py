"""Frame cost: where the controller's CPU per rollout goes at 64 agents x 1 slot against 8 x 8,
measured in one process with a thread-time clock (so the load of a shared machine moves the
figures little, unlike `benchmarks/dispatch.py`'s).

  core   the broker core alone (`BrokerCore` on a real SQLite queue file: decoded messages
         in, `tick`, `take_outbox`; no codec, no sockets): every pass takes the results of
         `--per-pass` rollouts, at 8 x 8 six to a frame (two agents), at 64 x 1 one to a
         frame (twelve agents), and places as many leases. CPU per rollout of each shape.
  codec  the frames of one rollout in each shape: decode an agent's `result_batch` of 6 (8 x 8)
         or 1 (64 x 1) results, encode its `leases` frame of as many leases and acks. CPU
         per rollout (per frame / its rollouts).
What is not here is the sockets: pyzmq's receive and sends per frame, ZeroMQ's I/O thread
(CURVE, syscalls, the wake-ups between it and the loop), which `dispatch.py` prints as the
controller's other threads. With PYTHONPATH set, the controller code under it is measured
(another tree, e.g. a checkout of main: `PYTHONPATH=../main python benchmarks/frame_cost.py`).

    .venv/bin/python benchmarks/frame_cost.py [--passes 400] [--per-pass 12] [--repeats 3]
"""
from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if not os.environ.get("PYTHONPATH"):  # else the tree it names is measured (a baseline)
    sys.path.insert(0, str(ROOT))

from controller.broker.core import BrokerCore  # noqa: E402
from controller.contracts import protocol as P  # noqa: E402
from controller.store.queue import QueueConfig, RolloutQueue  # noqa: E402

DEP = "bench-frames"
TASK = {"task_id": "noop", "image_digest": "sha256:00"}


def result_of(lease: P.Lease) -> P.Result:
    return P.Result(rollout_id=lease.rollout_id, attempt=lease.attempt, token=lease.token,
                    outcome="pass", reward=1.0, shards={}, infra_reason=None,
                    idem=f"{lease.rollout_id}:{lease.token}")


def core_us(agents: int, slots: int, passes: int, per_pass: int) -> float:
    """The core's CPU per rollout (thread time), `passes` passes of `per_pass` results."""
    d = Path(tempfile.mkdtemp(prefix="paddock-frame-cost-"))
    queue = RolloutQueue(d / "q.db", config=QueueConfig(lease_ttl_s=60))
    core = BrokerCore(queue, {"noop": TASK}, DEP, "run", str(d))
    held: dict[bytes, list[P.Lease]] = {}

    def one_pass(msgs: list) -> None:
        with queue.batch():
            for identity, msg in msgs:
                core.handle(identity, msg)
            core.tick()
        for identity, msg in core.take_outbox():
            held.setdefault(identity, []).extend(
                m for m in P.unbatched(msg) if isinstance(m, P.Lease))

    for i in range(agents):
        name = f"a{i:02d}"
        one_pass([(name.encode(), P.Register(node=name, slots=slots, images=[], mem_free_mb=1,
                                             agent_version="0.4.0")),
                  (name.encode(), P.Ready(node=name, credit=slots))])
    one_pass([(b"c", P.PublishPolicy(idem="p", version=1, endpoint="http://x/v1", model="m"))])
    one_pass([(b"c", P.Submit(idem="s", tasks=["noop"], n_per_task=passes * per_pass + 2 * agents * slots,
                              policy_version=1))])
    per_frame = min(6, slots)
    done, spent = 0, 0.0
    for p in range(passes):
        msgs, k = [], 0
        order = list(held)
        for identity in order[p % len(order):] + order[:p % len(order)]:
            take = min(len(held[identity]), per_pass - k, per_frame)
            if take <= 0:
                continue
            items, held[identity] = held[identity][:take], held[identity][take:]
            msgs.append((identity, P.ResultBatch(items=[result_of(x) for x in items])))
            k += take
            if k >= per_pass:
                break
        t0 = time.thread_time()  # the messages above are the agents' work, not the core's
        one_pass(msgs)
        spent += time.thread_time() - t0
        done += k
    queue.close()
    return spent / done * 1e6


def codec_us(n: int, rounds: int = 5000) -> float:
    """Decode a `result_batch` of n results and encode a `leases` frame of n leases and n
    acks: CPU per rollout."""
    leases = [P.Lease(rollout_id=f"b000001-{i:05d}", attempt=1, token=100 + i, lease_ttl_s=60.0,
                      task=dict(TASK), policy=P.PolicyRef(1, "http://127.0.0.1:9/v1", "noop"),
                      seed=i, run_id="run", run_dir="/tmp/run", batch_id="b000001")
              for i in range(n)]
    frame = P.encode(P.ResultBatch(items=[result_of(x) for x in leases]), DEP)
    acks = [f"{i:032x}" for i in range(n)]
    t0 = time.thread_time()
    for _ in range(rounds):
        P.decode(frame, DEP)
        P.encode_frames(P.LeaseBatch(items=leases, acks=acks), DEP)
    return (time.thread_time() - t0) / rounds / n * 1e6


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--passes", type=int, default=400)
    ap.add_argument("--per-pass", type=int, default=12, help="rollouts ending per pass")
    ap.add_argument("--repeats", type=int, default=3)
    args = ap.parse_args(argv)
    import controller
    print(f"controller code from {Path(controller.__file__).parents[1]}")
    core: dict[tuple[int, int], list[float]] = {(8, 8): [], (64, 1): []}
    codec: dict[tuple[int, int], list[float]] = {(8, 8): [], (64, 1): []}
    for _ in range(args.repeats):  # the shapes alternate: the same background for both
        for shape in core:
            core[shape].append(core_us(*shape, args.passes, args.per_pass))
            codec[shape].append(codec_us(min(6, shape[1])))
    for shape in core:
        print(f"{shape[0]:2d} x {shape[1]}: core {statistics.median(core[shape]):6.1f} us per "
              f"rollout (runs {', '.join(f'{x:.1f}' for x in core[shape])}), codec "
              f"{statistics.median(codec[shape]):5.1f} us per rollout")
    big, small = (8, 8), (64, 1)
    c, k = (statistics.median(core[small]) / statistics.median(core[big]),
            statistics.median(codec[small]) - statistics.median(codec[big]))
    print(f"64 x 1 / 8 x 8: core {c:.2f}x; the codec adds {k:.1f} us per rollout")
    return 0


if __name__ == "__main__":
    sys.exit(main())
