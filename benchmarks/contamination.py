"""Contamination check: recall and false-positive rate per stage, calibration, and 10k x 10k time.

Quality, on the public labelled pairs (tests/data/contamination, README there): rephrased
GSM8K questions and rephrased HumanEval tasks (the goals), and translated pairs (HumanEval to
C and to JavaScript, MMLU sociology to Chinese) reported separately. Thresholds are calibrated
on the `calib` split (lowest threshold per stage with FPR <= --max-fpr on the pooled math and
code rows, rephrased and translated; code thresholds by ev.calibrate_all's joint rule) and every rate printed is on the `test` split, held out from that choice,
at the check's defaults (and at the freshly calibrated thresholds when they differ).

Rates are printed for both splits: `dev` (calib, where thresholds are chosen) and `held`
(test). Time: --timing-n training tasks against as many held-out tasks of synthetic text (words
drawn from the pairs' vocabulary, each as long as a GSM8K question drawn at random), an actual
run end to end through `check`, cold cache, with the time of each stage; then a new held-out set
against the cached training embeddings (the importer keeps them under <bank>/embeddings, so a
new held-out set only embeds itself).

The execution stage (held-out HumanEval tasks' own tests run in the farm's sandbox against their
nearest training neighbours' code) is scored too, unless --no-execution.

    .venv/bin/python benchmarks/contamination.py [--max-fpr 0.05] [--timing-n 10000] [--no-timing] [--no-quality] [--no-execution]
"""
from __future__ import annotations

import argparse
import os
import random
import tempfile
import time
from pathlib import Path

import numpy as np

from controller.cli.tasks import SandboxExecutor
from controller.taskbank import contamination_eval as ev
from controller.taskbank import semantic
from controller.taskbank.bank import make_set
from controller.taskbank.contamination import ContaminationConfig, check

GROUPS = (("math", "rephrase"), ("code", "rephrase"), ("code", "translate-c"),
          ("code", "translate-js"), ("mmlu", "translate-zh"))


def score_groups(rows: list[dict], cache: Path, executor=None) -> dict[tuple[str, str, str], list[ev.Scored]]:
    out = {}
    for domain, variant in GROUPS:
        for split in ("calib", "test"):
            group = [r for r in rows if (r["domain"], r["variant"], r["split"]) == (domain, variant, split)]
            t0 = time.monotonic()
            out[(domain, variant, split)] = ev.stage_scores(group, cache_dir=cache, executor=executor)
            print(f"  scored {domain}/{variant}/{split}: {len(group)} rows x 2 folds "
                  f"in {time.monotonic() - t0:.1f} s", flush=True)
    return out


def print_table(scored, thresholds: dict[str, float], title: str) -> None:
    """Recall and FPR per stage on the calib split (dev: thresholds chosen there) and on the
    test split (held out from every choice)."""
    print(f"\n{title}: thresholds " + ", ".join(f"{k} {v:.2f}" for k, v in thresholds.items()))
    head = "".join(f"{st:>17}" for st in (*ev.SCORED_STAGES, "all stages"))
    print(f"{'group':24}{'split':>6}{'pos/neg':>9}{head}")
    print(f"{'':39}" + "".join(f"{'recall  FPR':>17}" for _ in range(4)))
    for domain, variant in GROUPS:
        for split, label in (("calib", "dev"), ("test", "held")):
            s = scored[(domain, variant, split)]
            cells = []
            for st in ev.SCORED_STAGES:
                r, f, _, _ = ev.rates(s, ev.flag_stage(thresholds, st))
                cells.append(f"{r:8.3f} {f:5.3f}  ")
            r, f, npos, nneg = ev.rates(s, ev.flag_any(thresholds))
            cells.append(f"{r:8.3f} {f:5.3f}  ")
            print(f"{domain + '/' + variant:24}{label:>6}{f'{npos}/{nneg}':>9}"
                  + "".join(f"{c:>17}" for c in cells))


def synthetic_tasks(rows: list[dict], n: int, tag: str, rng: random.Random) -> list:
    """n math tasks of random words from the pairs' vocabulary, each as long (in words) as a
    held-out GSM8K question drawn at random: the data's own length distribution."""
    math = [r["heldout"].split() for r in rows if r["domain"] == "math"]
    vocab = [w for words in math for w in words]
    lengths = [len(words) for words in math]
    return [ev.math_task(f"{tag}-{i}", " ".join(rng.choices(vocab, k=rng.choice(lengths))))
            for i in range(n)]


def timing(rows: list[dict], n: int) -> None:
    """Wall and CPU seconds of `check` on n x n synthetic tasks, per stage: all stages with a
    cold cache, then a new held-out set against the cached training embeddings; then the
    neighbour search alone."""
    rng = random.Random(7)
    train = make_set("train", synthetic_tasks(rows, n, "t", rng))
    with tempfile.TemporaryDirectory() as cache:
        semantic.load_embedder()            # derives the int8 model once, outside the timing
        for label in ("cold cache", "training embeddings cached"):
            held = make_set(label[:4], synthetic_tasks(rows, n, label[:4], rng), "heldout")
            load0 = os.getloadavg()[0]
            t0, c0 = time.monotonic(), time.process_time()
            report = check(train, held, ContaminationConfig(), cache_dir=cache)
            wall, cpu = time.monotonic() - t0, time.process_time() - c0
            stages = ", ".join(f"{k} {v:.1f} s" for k, v in report.seconds.items())
            emb = report.embedded
            print(f"{n} x {n} ({label}): {wall:.1f} s wall, {cpu:.1f} s CPU ({stages}); "
                  f"{emb.get('embedded', 0)} texts embedded, {emb.get('cached', 0)} cached; "
                  f"{len(report.suspects)} suspects; load average {load0:.1f} at the start, "
                  f"{os.getloadavg()[0]:.1f} at the end", flush=True)
    vecs = semantic.normalise(np.random.default_rng(1).normal(size=(2 * n, semantic.DIMENSION))
                              .astype(np.float32))
    t0 = time.monotonic()
    semantic.nearest(vecs[:n], vecs[n:], k=1)
    print(f"{n} x {n} neighbour search alone: {time.monotonic() - t0:.2f} s", flush=True)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--pairs", default=str(ev.PAIRS_FILE))
    ap.add_argument("--max-fpr", type=float, default=0.05, help="calibration target")
    ap.add_argument("--timing-n", type=int, default=10_000)
    ap.add_argument("--no-timing", action="store_true")
    ap.add_argument("--no-quality", action="store_true", help="only the timing")
    ap.add_argument("--cache", help="embedding cache directory (default: a temporary one)")
    ap.add_argument("--no-execution", action="store_true",
                    help="without the execution stage (no sandbox): semantic and lexical stages only")
    args = ap.parse_args()
    rows = ev.load_pairs(args.pairs)
    if not args.no_quality:
        quality(rows, args)
    if not args.no_timing:
        print()
        timing(rows, args.timing_n)
    return 0


def quality(rows: list[dict], args) -> None:
    with tempfile.TemporaryDirectory() as tmp, SandboxExecutor() as executor:
        scored = score_groups(rows, Path(args.cache or tmp), None if args.no_execution else executor)
    calib = [s for (d, v, sp), ss in scored.items() if d in ("math", "code") and sp == "calib" for s in ss]
    fitted = ev.calibrate_all(calib, args.max_fpr)
    print(f"\ncalibrated on the calib split (math and code rows, rephrased and translated, FPR <= {args.max_fpr}): "
          + ", ".join(f"{k} {v:.2f}" for k, v in fitted.items()))
    print_table(scored, ev.defaults(), "at the defaults")
    if fitted != ev.defaults():
        print_table(scored, fitted, "at the thresholds calibrated now")


if __name__ == "__main__":
    raise SystemExit(main())
