"""Isolated check runner: per-check overhead, and throughput when checks hang — one run, side by side.

1. Overhead: a trivial check (`exact_match("a", "a")`) called in-process vs through Paddock's
   isolated runner (`nodeagent.verifier.checks`: pre-forked child with its own session, rlimits, output
   cap, deadline that kills the group), sequentially. Overhead = isolated p50 - in-process p50.
2. Throughput over 1,000 checks with 0% and with 1% hanging forever (`time.sleep(3600)`), for
   Paddock (deadline kills the hang; the others never wait for it) and for the common baseline:
   `concurrent.futures.ProcessPoolExecutor` + `future.result(timeout=...)`, which gives up on
   the result but leaves the stuck worker stuck. "good/s" counts the non-hanging checks over the
   time until the last of them finished; "all resolved" is when every check had a result or a
   timeout. The baseline is cut off after --cutoff seconds (its stuck workers are then killed).

3. `--humaneval-rounds R`: whole `verify` calls on real HumanEval tasks (tests/data), call
   isolation side by side with the in-process reference mode.

    .venv/bin/python benchmarks/verifier.py [--n 1000] [--timeout 0.5] [--workers 4] [--repeats 5]
                                            [--humaneval-rounds 5]
"""
from __future__ import annotations

import argparse
import concurrent.futures as cf
import os
import signal
import statistics
import time

from nodeagent.verifier import checkers
from nodeagent.verifier.checks import CheckRunner

TRIVIAL = ("nodeagent.verifier.checkers:exact_match", ["a", "a"])
HANG = ("time:sleep", [3600])


def pct(xs, q):
    xs = sorted(xs)
    return xs[min(int(q * len(xs)), len(xs) - 1)]


def overhead(runner: CheckRunner, n: int) -> None:
    inproc, isolated = [], []
    for _ in range(n):
        t = time.perf_counter()
        checkers.exact_match("a", "a")
        inproc.append(time.perf_counter() - t)
    for _ in range(n):
        t = time.perf_counter()
        r = runner.run(*TRIVIAL, timeout_s=5)
        isolated.append(time.perf_counter() - t)
        assert r.outcome == "ok" and r.value is True
    p_in, p_iso = statistics.median(inproc), statistics.median(isolated)
    print(f"{'in-process trivial check':<34} p50 {p_in * 1e3:8.4f} ms   p99 {pct(inproc, .99) * 1e3:8.4f} ms")
    print(f"{'paddock isolated trivial check':<34} p50 {p_iso * 1e3:8.4f} ms   p99 {pct(isolated, .99) * 1e3:8.4f} ms")
    print(f"{'overhead per check (p50)':<34} {(p_iso - p_in) * 1e3:8.3f} ms   (goal <= 2 ms)")


def plan(n: int, hang_pct: float) -> list[bool]:
    every = int(round(100 / hang_pct)) if hang_pct else 0
    return [bool(every) and i % every == every // 2 for i in range(n)]


def paddock_throughput(runner: CheckRunner, hangs: list[bool], timeout_s: float) -> dict:
    t0 = time.perf_counter()
    futs = [(h, runner.submit(*(HANG if h else TRIVIAL), timeout_s=timeout_s)) for h in hangs]
    last_good = 0.0
    outcomes: dict[str, int] = {}
    for h, f in futs:
        if not h:
            r = f.result()
            last_good = max(last_good, time.perf_counter() - t0)
            outcomes[r.outcome] = outcomes.get(r.outcome, 0) + 1
    for h, f in futs:
        if h:
            r = f.result()
            outcomes[r.outcome] = outcomes.get(r.outcome, 0) + 1
    return {"good": sum(not h for h in hangs), "last_good_s": last_good, "all_s": time.perf_counter() - t0,
            "outcomes": outcomes}


def _trivial() -> bool:
    return checkers.exact_match("a", "a")


def _hang() -> None:
    time.sleep(3600)


def baseline_throughput(hangs: list[bool], timeout_s: float, workers: int, cutoff_s: float) -> dict:
    pool = cf.ProcessPoolExecutor(max_workers=workers)
    pool.submit(_trivial).result()                   # workers up before the clock starts
    t0 = time.perf_counter()
    futs = [(h, pool.submit(_hang if h else _trivial)) for h in hangs]
    done_good, last_good, timeouts = 0, 0.0, 0
    for h, f in futs:
        if time.perf_counter() - t0 > cutoff_s:
            break
        try:
            f.result(timeout=timeout_s)
            done_good += 1
            last_good = time.perf_counter() - t0
        except cf.TimeoutError:
            timeouts += 1
    wall = time.perf_counter() - t0
    procs = list(getattr(pool, "_processes", {}).values())
    pool.shutdown(wait=False, cancel_futures=True)
    for p in procs:                                  # the workers this benchmark started, by PID
        try:
            os.kill(p.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    return {"good": done_good, "last_good_s": last_good or wall, "all_s": wall, "timeouts": timeouts,
            "cut_off": wall > cutoff_s}


def rate_of(r: dict) -> float:
    return r["good"] / r["last_good_s"] if r["last_good_s"] else 0.0


def show(name: str, r: dict, ref: float | None) -> float:
    rate = rate_of(r)
    extra = f"   {rate / ref * 100:6.1f}% of hang-free" if ref else ""
    cut = "   CUT OFF (stuck workers)" if r.get("cut_off") else ""
    print(f"{name:<34} good/s {rate:9.1f}   good done {r['good']:5d}   all resolved {r['all_s']:7.2f} s{extra}{cut}")
    return rate


def humaneval_grading(rounds: int) -> None:
    """A real HumanEval task (tests/data) graded with its reference, call isolation vs the
    in-process reference mode (`isolation: process`), alternating; p50 of whole `verify` calls."""
    import json
    from pathlib import Path

    from controller.taskbank.importers import humaneval_task
    from layers.builtin import default_store_root, ensure_builtin_image
    from layers.store import ImageStore
    from nodeagent.sandbox.runtime import Change, SandboxRuntime
    from nodeagent.verifier.grade import graded_task, verify
    data = Path(__file__).resolve().parent.parent / "tests" / "data" / "humaneval_sample.jsonl"
    image = ensure_builtin_image(ImageStore(default_store_root()))[1]
    times: dict[str, list[float]] = {"call": [], "process": []}
    with SandboxRuntime() as rt:
        for _ in range(rounds):
            for line in data.read_text().splitlines():
                t = humaneval_task(json.loads(line), Path("x"), 1)
                for mode in times:
                    task = {**t.canonical(), "task_id": t.task_id, "checker": {**t.checker, "isolation": mode}}
                    change = [Change("/work/solution.py", "modified", task["hidden"]["reference.py"].encode(), 0o644)]
                    t0 = time.perf_counter()
                    v = verify(rt, image, graded_task(task), change, None)
                    times[mode].append(time.perf_counter() - t0)
                    assert v.outcome == "pass", v.checks
    p50 = {m: statistics.median(ts) for m, ts in times.items()}
    for m, ts in times.items():
        print(f"  humaneval reference, isolation={m:<8} p50 {p50[m] * 1e3:7.1f} ms   p99 {pct(ts, .99) * 1e3:7.1f} ms")
    print(f"  call / in-process p50: {p50['call'] / p50['process']:.2f}x   (goal <= 1.3x)")


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--humaneval-rounds", type=int, default=0,
                    help="also grade the tests/data HumanEval sample this many rounds, call vs in-process")
    ap.add_argument("--n", type=int, default=1000)
    ap.add_argument("--overhead-n", type=int, default=500)
    ap.add_argument("--timeout", type=float, default=0.5, help="per-check deadline (s)")
    ap.add_argument("--workers", type=int, default=4, help="baseline pool size")
    ap.add_argument("--cutoff", type=float, default=30.0, help="give up on the baseline after (s)")
    ap.add_argument("--repeats", type=int, default=5, help="paddock throughput runs per condition")
    args = ap.parse_args()
    if args.humaneval_rounds:
        print(f"== HumanEval grading ({args.humaneval_rounds} rounds of tests/data/humaneval_sample.jsonl)")
        humaneval_grading(args.humaneval_rounds)
    with CheckRunner(preload=("nodeagent.verifier.checkers",)) as runner:
        runner.run(*TRIVIAL)
        print(f"== per-check overhead ({args.overhead_n} sequential checks)")
        overhead(runner, args.overhead_n)
        print(f"\n== throughput, {args.n} checks, deadline {args.timeout}s "
              f"(paddock: median of {args.repeats} alternating runs)")
        runs: dict[int, list[dict]] = {0: [], 1: []}
        for _ in range(args.repeats):
            for pct_ in (0, 1):
                runs[pct_].append(paddock_throughput(runner, plan(args.n, pct_), args.timeout))
        med = {p: sorted(rs, key=rate_of)[len(rs) // 2] for p, rs in runs.items()}
        for p, rs in runs.items():
            print(f"  paddock {p}% hanging, good/s per run: " + ", ".join(f"{rate_of(r):.0f}" for r in rs))
        free = show("paddock, 0% hanging", med[0], None)
        show("paddock, 1% hanging forever", med[1], free)
    bfree = show(f"baseline pool({args.workers}), 0% hanging",
                 baseline_throughput(plan(args.n, 0), args.timeout, args.workers, args.cutoff), None)
    show(f"baseline pool({args.workers}), 1% hanging",
         baseline_throughput(plan(args.n, 1), args.timeout, args.workers, args.cutoff), bfree)


if __name__ == "__main__":
    main()
