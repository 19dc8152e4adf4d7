"""A Paddock farm as a Slurm job, against the bare heterogeneous job it is built on.

On a fresh in-test cluster (3 nodes in their own network and UTS namespaces), in one run:
  reference  `sbatch` of a heterogeneous job (1 node + 2 nodes) whose steps run `true`
  Paddock    `sbatch` of the rendered het batch script: head (controller + policy + trainer)
             on one node, node agents on two, one policy version over --tasks built-in tasks
Per job: submit -> controller endpoint published (Paddock only), submit -> first rollout
committed (Paddock only), submit -> job COMPLETED (both, polled with scontrol every 50 ms).
Prints medians, p99 and the Paddock/reference ratio of the submit -> COMPLETED time.

    .venv/bin/python benchmarks/slurm_job.py [--runs 3] [--tasks 4]
"""
from __future__ import annotations

import argparse
import re
import sqlite3
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from slurm.sbatch import render  # noqa: E402
from slurm.testcluster import TestCluster  # noqa: E402

REFERENCE = """#!/bin/bash
#SBATCH --time=10
#SBATCH --nodes=1 --ntasks=1
#SBATCH hetjob
#SBATCH --nodes=2 --ntasks-per-node=1
srun --het-group=0 true &
srun --het-group=1 --ntasks-per-node=1 true &
wait
"""


def job_state(env: dict, job_id: str) -> str:
    out = subprocess.run(["scontrol", "show", "job", "-o", job_id], env=env, capture_output=True,
                         text=True).stdout
    states = re.findall(r"JobState=(\S+)", out)
    return states[0] if states and len(set(states)) == 1 else "MIXED"


def run_job(env: dict, script: Path, out: Path, run_dir: Path | None) -> dict:
    t0 = time.monotonic()
    job_id = subprocess.run(["sbatch", "--parsable", "-o", str(out), str(script)], env=env,
                            capture_output=True, text=True, check=True).stdout.strip().split(";")[0]
    marks: dict[str, float] = {}
    while True:
        now = time.monotonic() - t0
        if run_dir is not None:
            if "endpoint" not in marks and (run_dir / "controller.endpoint").exists():
                marks["endpoint"] = now
            if "first_commit" not in marks and (run_dir / "controller.db").exists():
                try:
                    con = sqlite3.connect(f"file:{run_dir / 'controller.db'}?mode=ro", uri=True)
                    if con.execute("SELECT count(*) FROM rollouts WHERE state='committed'").fetchone()[0]:
                        marks["first_commit"] = now
                    con.close()
                except sqlite3.Error:
                    pass
        state = job_state(env, job_id)
        if state in ("COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "NODE_FAIL"):
            if state != "COMPLETED":
                raise SystemExit(f"job {job_id} ended {state}; see {out}")
            marks["completed"] = now
            return marks
        if now > 300:
            raise SystemExit(f"job {job_id} not done after 300 s")
        time.sleep(0.05)


def pct(xs: list[float], q: float) -> float:
    xs = sorted(xs)
    return xs[min(int(round(q * (len(xs) - 1))), len(xs) - 1)]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--tasks", type=int, default=4)
    a = ap.parse_args()
    work = Path(tempfile.mkdtemp(prefix="paddock-bench-job-"))
    results: dict[str, list[dict]] = {"reference": [], "paddock": []}
    with TestCluster(work / "cluster", nodes=3, name_prefix="pdkb") as cluster:
        ref = work / "reference.sh"
        ref.write_text(REFERENCE)
        for i in range(a.runs):
            results["reference"].append(run_job(cluster.env, ref, work / f"ref-{i}.out", None))
            run_dir = work / f"run-{i}"
            script = work / f"paddock-{i}.sh"
            script.write_text(render(dict(run_dir=str(run_dir), env_nodes=2, time_limit="10", versions=1,
                                          tasks_limit=a.tasks, python=sys.executable, heartbeat_interval_s=0.5,
                                          controller_wait_s=120, agents_wait_s=120, signal_before_s=60)))
            results["paddock"].append(run_job(cluster.env, script, work / f"paddock-{i}.out", run_dir))
    print(f"{a.runs} runs each; Paddock: one policy version over {a.tasks} tasks on 2 agents (2 slots each)")
    print(f"{'job':10} {'mark':14} {'median s':>9} {'p99 s':>7}")
    for kind, rows in results.items():
        for mark in ("endpoint", "first_commit", "completed"):
            xs = [r[mark] for r in rows if mark in r]
            if xs:
                print(f"{kind:10} {mark:14} {statistics.median(xs):9.2f} {pct(xs, 0.99):7.2f}")
    ref_c = statistics.median(r["completed"] for r in results["reference"])
    pad_c = statistics.median(r["completed"] for r in results["paddock"])
    print(f"ratio paddock/reference (submit -> COMPLETED, medians): {pad_c / ref_c:.2f}x "
          f"(+{pad_c - ref_c:.2f} s for the farm's start, {a.tasks} rollouts and its clean stop)")
    print(f"work dir kept: {work}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
