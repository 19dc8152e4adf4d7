"""Math answer checkers side by side on public labelled cases: agreement, false positives, time.

Three checkers on every case of `tests/data/math_cases/*.jsonl` (see the README there for the
sources: Math-Verify's test suite and mixed-number tests, Hendrycks MATH `is_equiv` tests,
Qwen2.5-Math grader cases, lighteval's extractive-match tests, NeMo-Skills' `math_equal` pairs,
and the project's own adversarial sets):
  (a) today   `nodeagent.verifier.checkers.math_equal` (the checker before `mathanswer`);
  (b) mv      Math-Verify alone, default settings: `verify(parse(gold), parse(pred))`;
  (c) ours    `nodeagent.verifier.mathanswer.math_equal`.
Agreement = verdicts equal to the label / cases; FP = accepted must-reject cases (label false);
times are per check, in-process. Each check runs under a CPU-time guard (--guard-s, SIGPROF, so
it does not clash with Math-Verify's own SIGALRM timer); a check that hits it counts as a reject
and is reported.

    PYTHONPATH=. .venv/bin/python benchmarks/math_checker.py [--show ours] [--guard-s 20]
"""
from __future__ import annotations

import argparse
import json
import signal
import statistics
import time
from pathlib import Path

from nodeagent.verifier import checkers, mathanswer

CASES_DIR = Path(__file__).resolve().parent.parent / "tests" / "data" / "math_cases"
PUBLIC_SETS = ("math_verify", "hendrycks", "qwen", "lighteval", "nemo_skills", "mv_mixed")
ALL_SETS = (*PUBLIC_SETS, "adversarial", "adversarial_classes")


class _Guard(Exception):
    pass


def _on_guard(signum, frame):
    raise _Guard()


def load_cases(name: str) -> list[dict]:
    """The cases of one set, without those marked "excluded" (the README says why)."""
    with open(CASES_DIR / f"{name}.jsonl", encoding="utf-8") as fh:
        cases = [json.loads(line) for line in fh if line.strip()]
    skipped = [c for c in cases if c.get("excluded")]
    if skipped:
        print(f"{name}: {len(skipped)} case(s) excluded: " + "; ".join(c["origin"] for c in skipped))
    return [c for c in cases if not c.get("excluded")]


def mv_default(gold: str, pred: str) -> bool:
    from math_verify import parse, verify
    return bool(verify(parse(gold), parse(pred)))


CHECKERS = {"today": checkers.math_equal, "mv": mv_default, "ours": mathanswer.math_equal}


def run_one(fn, gold: str, pred: str, guard_s: float, instruction: str | None = None) -> tuple[bool, float, str]:
    """(verdict, seconds, note) for one check under the CPU-time guard; the case's instruction
    (the task's prompt, when the case carries one) goes to the checker that reads it ("ours")."""
    signal.setitimer(signal.ITIMER_PROF, guard_s)
    t0 = time.perf_counter()
    try:
        ok, note = bool(fn(gold, pred, instruction) if instruction and fn is mathanswer.math_equal else fn(gold, pred)), ""
    except _Guard:
        ok, note = False, "guard"
    except Exception as exc:  # noqa: BLE001 - a checker that raises is a reject, reported
        ok, note = False, f"raised {type(exc).__name__}"
    finally:
        signal.setitimer(signal.ITIMER_PROF, 0)
    return ok, time.perf_counter() - t0, note


def evaluate(sets: dict[str, list[dict]], guard_s: float) -> dict:
    """{checker: {set: [(case, verdict, seconds, note)]}}."""
    out: dict = {}
    for cname, fn in CHECKERS.items():
        out[cname] = {}
        for sname, cases in sets.items():
            out[cname][sname] = [(c, *run_one(fn, c["gold"], c["pred"], guard_s, c.get("instruction")))
                                 for c in cases]
    return out


def _stats(rows: list) -> dict:
    n = len(rows)
    agree = sum(v == c["expected"] for c, v, _, _ in rows)
    rejects = [r for r in rows if not r[0]["expected"]]
    fp = sum(v for _, v, _, _ in rejects)
    times = sorted(t for _, _, t, _ in rows)
    p99 = times[min(len(times) - 1, int(0.99 * len(times)))] if times else 0.0
    return {"n": n, "agree": agree, "rate": agree / n if n else 0.0, "rejects": len(rejects), "fp": fp,
            "p50_ms": 1000 * (statistics.median(times) if times else 0.0), "p99_ms": 1000 * p99,
            "notes": sum(bool(r[3]) for r in rows)}


def report(results: dict) -> None:
    groups = {s: [s] for s in ALL_SETS if s in next(iter(results.values()))}
    groups["public (all sets)"] = [s for s in PUBLIC_SETS if s in groups]
    groups["all incl. adversarial"] = [s for s in ALL_SETS if s in groups]
    print(f"{'set':<24}{'checker':<8}{'n':>5}{'agree':>8}{'rate':>8}{'FP':>9}{'p50 ms':>9}{'p99 ms':>9}{'guard':>7}")
    for gname, members in groups.items():
        for cname, per_set in results.items():
            s = _stats([r for m in members for r in per_set[m]])
            print(f"{gname:<24}{cname:<8}{s['n']:>5}{s['agree']:>8}{s['rate']:>8.3f}"
                  f"{s['fp']:>4}/{s['rejects']:<4}{s['p50_ms']:>9.1f}{s['p99_ms']:>9.1f}{s['notes']:>7}")
        print()


def show_disagreements(results: dict, cname: str) -> None:
    for sname, rows in results[cname].items():
        for c, v, t, note in rows:
            if v != c["expected"]:
                print(f"[{sname}] {c.get('origin', '')} expected={c['expected']} got={v} {note} "
                      f"{t * 1000:.0f}ms\n   gold={c['gold'][-150:]!r}\n   pred={c['pred'][-150:]!r}")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--sets", default=",".join(ALL_SETS))
    ap.add_argument("--guard-s", type=float, default=20.0)
    ap.add_argument("--show", choices=tuple(CHECKERS), help="list the cases this checker gets wrong")
    args = ap.parse_args(argv)
    signal.signal(signal.SIGPROF, _on_guard)
    sets = {s: load_cases(s) for s in args.sets.split(",") if s}
    mathanswer.math_equal("1", "1")            # warm imports (sympy, the LaTeX parser)
    mv_default("1", "1")
    results = evaluate(sets, args.guard_s)
    report(results)
    if args.show:
        show_disagreements(results, args.show)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
