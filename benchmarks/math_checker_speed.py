"""Time per math check, this tree against another checkout (before/after), side by side in one run.

Two worker processes, one per source tree (each imports `nodeagent.verifier.mathanswer` from its
own tree, so Math-Verify's settings of one cannot leak into the other); the parent sends every
labelled case of `tests/data/math_cases/` (public sets, then adversarial) to both, alternating
which goes first, and each worker times `math_equal` in-process. Reported: median and p99 per
check for each tree and their ratio (this tree / the other).

    PYTHONPATH=. .venv/bin/python benchmarks/math_checker_speed.py --base /tmp/base-checkout
"""
from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import statistics
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent.parent
CASES_DIR = HERE / "tests" / "data" / "math_cases"


def _worker(root: str, conn) -> None:
    sys.path.insert(0, root)
    from nodeagent.verifier import mathanswer  # noqa: PLC0415 - imported from `root`, in this process
    mathanswer.math_equal("1", "1")               # warm imports
    while True:
        case = conn.recv()
        if case is None:
            return
        t0 = time.perf_counter()
        ok = mathanswer.math_equal(case["gold"], case["pred"])
        conn.send((bool(ok), time.perf_counter() - t0))


def _cases(names: list[str]) -> list[dict]:
    out = []
    for name in names:
        for line in (CASES_DIR / f"{name}.jsonl").read_text(encoding="utf-8").splitlines():
            if line.strip() and not json.loads(line).get("excluded"):
                out.append(json.loads(line))
    return out


def _p99(xs: list[float]) -> float:
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(0.99 * len(xs)))]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--base", required=True, help="the other checkout's root (e.g. a worktree of main)")
    ap.add_argument("--sets", default="math_verify,hendrycks,qwen,lighteval,nemo_skills,mv_mixed")
    args = ap.parse_args(argv)
    ctx = mp.get_context("spawn")
    trees = {"base": str(Path(args.base).resolve()), "this": str(HERE)}
    conns, procs = {}, []
    for name, root in trees.items():
        parent, child = ctx.Pipe()
        p = ctx.Process(target=_worker, args=(root, child), daemon=True)
        p.start()
        conns[name], procs = parent, procs + [p]
    times: dict[str, list[float]] = {n: [] for n in trees}
    cases = _cases([s for s in args.sets.split(",") if s])
    for i, case in enumerate(cases):
        order = list(trees) if i % 2 == 0 else list(reversed(trees))
        for name in order:
            conns[name].send(case)
            times[name].append(conns[name].recv()[1])
    for c in conns.values():
        c.send(None)
    for p in procs:
        p.join(10)
    med = {n: statistics.median(t) * 1000 for n, t in times.items()}
    p99 = {n: _p99(t) * 1000 for n, t in times.items()}
    print(f"{len(cases)} checks per tree ({args.sets})")
    for n in trees:
        print(f"{n:<5} median {med[n]:7.2f} ms   p99 {p99[n]:8.1f} ms   total {sum(times[n]):6.1f} s")
    print(f"ratio this/base: median {med['this'] / med['base']:.2f}   p99 {p99['this'] / p99['base']:.2f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
