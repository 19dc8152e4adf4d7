"""Per-rollout sandbox acquire latency with the autoscaled warm pool vs creating each sandbox, one run.

Each "rollout" acquires its sandbox the way the node agent's attempt path does
(`runtime.acquire(SandboxSpec(image, limits, files=task files, layers=...))`), runs `true` in it,
works for `--work-ms` (standing for the agent loop: the pool refills meanwhile) and destroys it.
- create: a runtime without pools (every acquire makes its sandbox: today's path with the pool off);
- pooled: a second runtime under `nodeagent.agent.warmpools.start_warm_pools` (the autoscaler
  sizes the pool from the arrivals; the first acquire of a spec is a miss, later ones take a
  ready sandbox and only write the task's files).
The two are interleaved rollout by rollout, per spec: a small task (busybox image, two small
files: a pooled handout writes them, one request to the node holder) and, unless
`--no-repo-layer` (and when the sympy sdist of benchmarks/swe_task.py is in the image store's
cache), a swe-shaped task whose ~32 MB repository is a read-only layer and that has no files.
Prints p50 / p99 of the acquire time of each, the ratio create/pooled, the pool's hits and
misses, and the memory an idle ready sandbox holds (the PSS of its processes: what
`nodeagent.agent.warmpools.IDLE_SANDBOX_MB` charges).

    PYTHONPATH=. .venv/bin/python benchmarks/warm_pool.py [--n 40] [--work-ms 150] [--no-repo-layer]
"""
from __future__ import annotations

import argparse
import statistics
import time

import psutil

from layers import treelayer
from layers.builtin import default_store_root, ensure_busybox_image
from layers.store import ImageStore
from nodeagent.agent.warmpools import start_warm_pools
from nodeagent.sandbox.runtime import SandboxRuntime, SandboxSpec
from nodeagent.sandbox.warmpool import pool_key

LIMITS = {"memory_mb": 256, "pids": 64, "cpu": 1.0, "disk_mb": 64, "nofile": 256}
FILES = {"solution.py": b"def f(x):\n    return x\n", "README.md": b"# task\n" * 40}


class _Agent:
    """What the pool's capacity reads of a node agent: slots, running attempts, draining."""
    slots, active, draining = 4, {}, False


def pct(xs, q):
    xs = sorted(xs)
    return xs[min(int(q * len(xs)), len(xs) - 1)]


def rollout(rt, spec, work_s: float) -> float:
    t = time.perf_counter()
    sb = rt.acquire(spec)
    took = time.perf_counter() - t
    assert sb.exec(["true"]).exit_code == 0
    time.sleep(work_s)          # stands for the agent loop's work; the pool refills meanwhile
    sb.destroy()
    return took


def idle_pss_mb(rt, spec) -> float | None:
    """Mean PSS of a ready sandbox's processes (its init), in MB."""
    pool = rt._pools.get(pool_key(spec))
    if pool is None or not len(pool):
        return None
    total = 0.0
    for sb in list(pool._ready):
        try:
            total += psutil.Process(sb.init_pid_host).memory_full_info().pss
        except (psutil.Error, AttributeError):
            return None
    return total / len(pool) / 2**20


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--n", type=int, default=40, help="rollouts per spec and way")
    ap.add_argument("--work-ms", type=float, default=150.0, help="each rollout's work between acquire and destroy")
    ap.add_argument("--no-repo-layer", action="store_true", help="only the empty task")
    args = ap.parse_args()
    store = ImageStore(default_store_root())
    _, image = ensure_busybox_image(store)
    specs = {"empty task": SandboxSpec(image=image, limits=LIMITS, files=FILES)}
    repo = store.root / "tmp" / "sdists" / "sympy-1.12"
    if not args.no_repo_layer and repo.is_dir():
        _, layer = treelayer.ensure_tree_layer(store, repo, "/work/repo")
        # a swe task's shape: the repository is a layer, no files written per sandbox
        specs["repo layer (sympy, 32 MB), no files"] = SandboxSpec(image=image, limits=LIMITS, layers=(layer,))
    plain = SandboxRuntime().start()
    pooled = SandboxRuntime().start()
    try:
        start_warm_pools(pooled, _Agent(), max_sandboxes=4)
        for name, spec in specs.items():
            rollout(plain, spec, 0)              # the image and layer mounted on both nodes
            created, handed = [], []
            hits0, misses0 = pooled.pool_hits, pooled.pool_misses
            for _ in range(args.n):
                created.append(rollout(plain, spec, args.work_ms / 1e3))
                handed.append(rollout(pooled, spec, args.work_ms / 1e3))
            c50, h50 = statistics.median(created), statistics.median(handed)
            print(f"{name}:")
            print(f"  create   p50 {c50 * 1e3:8.2f} ms   p99 {pct(created, .99) * 1e3:8.2f} ms")
            print(f"  pooled   p50 {h50 * 1e3:8.2f} ms   p99 {pct(handed, .99) * 1e3:8.2f} ms   "
                  f"hits {pooled.pool_hits - hits0}, misses {pooled.pool_misses - misses0}")
            print(f"  create/pooled p50 ratio {c50 / h50:6.1f}x")
            pss = idle_pss_mb(pooled, spec)
            print(f"  idle ready sandbox PSS: {'n/a' if pss is None else f'{pss:.1f} MB'}")
        print(f"pool stats: {pooled.pool_stats()}")
    finally:
        pooled.close()
        plain.close()
    print(f"load average: {' '.join(f'{x:.2f}' for x in psutil.getloadavg())}")


if __name__ == "__main__":
    main()
