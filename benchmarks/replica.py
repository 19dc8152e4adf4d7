"""The replica's cost on the commit path: rollouts committed per second by the rollout queue
with no replica, with a replica on another filesystem (/dev/shm) and with one on the same disk
as the queue, side by side in one process, alternating rounds; and the time to restore.

Each round submits N rollouts, leases them and commits them in passes of `--per-pass`
completions (the broker's group commit: one transaction per pass), each naming a 4 KiB
one-table shard written beforehand (as a node agent does; not timed). Prints per variant the median rate over
the rounds, its ratio to the no-replica rate, and `restore_ledger`'s time.

    PYTHONPATH=. .venv/bin/python benchmarks/replica.py --rollouts 2000 --per-pass 50 --rounds 3
"""
from __future__ import annotations

import argparse
import shutil
import statistics
import tempfile
import time
from pathlib import Path

from controller.store import replica as R
from controller.store.queue import QueueConfig, RolloutQueue


def one_round(base: Path, replica: Path | None, n: int, per_pass: int) -> float:
    run = Path(tempfile.mkdtemp(dir=base))
    (run / "rollouts").mkdir()
    q = RolloutQueue(run / "controller.db",
                     config=QueueConfig(replica_dir=str(replica) if replica else None))
    q.submit_batch("b", [("t", 1)], n)
    leases = q.lease_next("n1", n)
    rels = {}
    for lease in leases:  # the node agents' part, not timed
        rels[lease.rollout_id] = f"rollouts/n1-{lease.rollout_id}-a1-t{lease.token}.parquet"
        (run / rels[lease.rollout_id]).write_bytes(b"x" * 4096)
    t0 = time.perf_counter()
    for i in range(0, len(leases), per_pass):
        with q.batch():
            for lease in leases[i:i + per_pass]:
                q.complete(lease.rollout_id, lease.attempt, lease.token, "pass", 1.0,
                           {"rollouts": rels[lease.rollout_id]}, None, f"c{lease.rollout_id}")
    rate = len(leases) / (time.perf_counter() - t0)
    q.close()
    shutil.rmtree(run)
    return rate


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--rollouts", type=int, default=2000)
    ap.add_argument("--per-pass", type=int, default=50)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--dir", default="/var/tmp", help="where the queue lives (a disk)")
    args = ap.parse_args()
    base = Path(tempfile.mkdtemp(prefix="paddock-replica-bench-", dir=args.dir))
    shm = Path(tempfile.mkdtemp(prefix="paddock-replica-bench-", dir="/dev/shm"))
    rates: dict[str, list[float]] = {"none": [], "other fs (/dev/shm)": [], "same disk": []}
    try:
        for _ in range(args.rounds):
            for name in rates:
                rep = None
                if name != "none":
                    rep = Path(tempfile.mkdtemp(dir=shm if "shm" in name else base))
                rates[name].append(one_round(base, rep, args.rollouts, args.per_pass))
                if rep is not None:
                    t0 = time.perf_counter()
                    R.restore_ledger(rep, base / "restored.db")
                    restore_s = time.perf_counter() - t0
                    (base / "restored.db").unlink()
                    shutil.rmtree(rep)
                    print(f"  {name}: restore_ledger {restore_s * 1000:.0f} ms")
        ref = statistics.median(rates["none"])
        for name, r in rates.items():
            med = statistics.median(r)
            print(f"{name:22s} {med:8.0f} commits/s  ({med / ref:.2f} x no replica; rounds "
                  f"{', '.join(f'{x:.0f}' for x in r)})")
    finally:
        shutil.rmtree(base, ignore_errors=True)
        shutil.rmtree(shm, ignore_errors=True)


if __name__ == "__main__":
    main()
