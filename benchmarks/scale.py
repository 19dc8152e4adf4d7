"""Scale: the controller's start with a training-sized task set, and the deterministic
simulation at training size, with the controller's CPU per event.

  load   writes a tasks file (`tasks.json`, as a run writes it: `taskblobs.write_tasks_file` of
         what `controller.taskbank.blobs.publish` returns: each task once, by id, one per line) of `--tasks` synthetic SWE-shaped references, then, in
         a fresh child process, does what `paddock controller` does at start: `load_tasks`, the
         `Controller` (opens the SQLite queue and the catalog, `BrokerCore` admits the tasks,
         binds the ROUTER socket) and, with `--curriculum`, the curriculum database over every
         task id. Prints the wall time of each step and the child's peak RSS (VmHWM).
         Synthetic: the references are generated (task ids, image digests, blob digests are
         hashes of the index, names are `swe/<owner>__<repo>-<n>`, limits are a SWE task's), so
         no blob exists; their size and shape are what `publish` writes for an imported SWE
         task (`controller.ondisk.taskblobs.reference`).
  sim    the simulation of tests/sim/sim.py at scale (`ScaleWorld`: real BrokerCore, real
         SQLite queue on tmpfs, real AgentCore agents; no faults): `--agents` x `--slots`,
         attempts lasting `--attempt-s` simulated seconds, the trainer keeping every slot
         busy. Prints the controller's CPU seconds per event (a frame in, or a tick) and per
         committed rollout, the events per simulated second, the frames' sizes and the SQLite
         commits. The collector's policy is the controller daemon's (`--gc controller`,
         controller/broker/gcpolicy.py) unless told; the simulated agents share the heap, so
         the collector's share is an upper bound of the real controller's.
         `--prefetch N`: each agent holds N leases ahead of its slots (`paddock agent
         --prefetch`, `AgentConfig.prefetch`; docs/protocol.md "Prefetch").
  table  `sim` at 100, 1,000 and 3,000 agents, each size and setting in a fresh process, with the
         daemon's collector policy, without prefetch and with `--prefetch N` (default 2): CPU per
         rollout, its ratio to the smallest farm, cores, frames per rollout, and prefetch's
         ratio to none; `--gc-reference` adds CPython's default collector (no prefetch);
         `--reference TREE` (another source tree, e.g. `git archive` of an older commit) runs
         each cell in that tree's controller too, at the same time as this tree's (one load),
         and prints both and their ratio. The trainer submits `--batch` rollouts at a time
         (default max(1,024, slots / 32), so that the queue stays ahead of the largest farm).
         Every cell runs `--repeats` times (default 3), round robin, and the table prints each
         cell's median with its spread, then the two goal lines: the largest farm's CPU per rollout
         over the smallest's, and the cores at 32,000 slots.

    .venv/bin/python benchmarks/scale.py load [--tasks 450000] [--curriculum] [--touched 2000]
    .venv/bin/python benchmarks/scale.py sim [--agents 1000] [--slots 32] [--sim-s 120] [--warmup-s 120] [--gc controller|default|off] [--prefetch 0]
    .venv/bin/python benchmarks/scale.py table [--agents 100 1000 3000] [--prefetch 2] [--repeats 3] [--gc-reference] [--reference TREE]
"""
from __future__ import annotations

import argparse
import gc
import hashlib
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

# The tree whose controller (and tests/sim world) runs: this one, or `table --reference`'s.
ROOT = Path(os.environ.get("PADDOCK_SCALE_TREE") or Path(__file__).resolve().parents[1])
sys.path.insert(0, str(ROOT))

from controller.broker import gcpolicy  # noqa: E402
from controller.ondisk.taskblobs import reference, write_tasks_file  # noqa: E402

SWE_LIMITS = {"memory_mb": 4096, "pids": 512, "disk_mb": 4096, "cpu": 2.0, "nofile": 1024}
REPOS = ["django__django", "sympy__sympy", "astropy__astropy", "scikit-learn__scikit-learn",
         "matplotlib__matplotlib", "sphinx-doc__sphinx", "pytest-dev__pytest", "psf__requests"]


def _hex(kind: str, i: int) -> str:
    return hashlib.sha256(f"{kind}{i}".encode()).hexdigest()


def synthetic_tasks(n: int, blob_root: str = "/shared/paddock/taskbank/blobs") -> dict[str, dict]:
    """`n` SWE-shaped task references keyed by task id and by name, as `publish` returns them."""
    taskset_hash = "sha256:" + _hex("set", n)
    out: dict[str, dict] = {}
    for i in range(n):
        name = f"swe/{REPOS[i % len(REPOS)]}-{10000 + i}"
        content = {"name": name, "family": "swe", "limits": SWE_LIMITS}
        ref = reference("sha256:" + _hex("task", i), content,
                        {"root": blob_root, "digest": "sha256:" + _hex("blob", i), "bytes": 6000 + i % 5000},
                        image_digest="sha256:" + _hex("image", i), taskset_hash=taskset_hash,
                        split="heldout" if i % 50 == 0 else "train")
        out[ref["task_id"]] = ref
        out[name] = ref
    return out


def _child_load(tasks_json: str, work: str, curriculum: bool, mode: str, touched: int = 2000) -> dict:
    """What the controller process does at start, timed; run in a fresh process. `mode`:
    dict (the whole file into a dict, the reference), first (the index is built), restart."""
    from controller.broker import daemon
    from controller.ondisk.taskblobs import load_tasks_file
    from controller.store.taskindex import TaskIndex, index_path
    from controller.taskbank.curriculum import Curriculum
    if mode == "first":
        index_path(tasks_json).unlink(missing_ok=True)
    c0, t0 = time.process_time(), time.perf_counter()
    tasks = load_tasks_file(tasks_json) if mode == "dict" else daemon.load_tasks(tasks_json)
    t1 = time.perf_counter()
    peak_load = _status_mb("VmHWM")
    ids = tasks.ids if isinstance(tasks, TaskIndex) else {d["task_id"] for d in tasks.values()}
    cur = Curriculum(os.path.join(work, f"curriculum-{mode}.sqlite"), ids) if curriculum else None
    t2 = time.perf_counter()
    run_dir = Path(work) / f"run-{mode}"
    run_dir.mkdir(exist_ok=True)
    ctl = daemon.Controller("tcp://127.0.0.1:0", "bench-scale", str(run_dir), "run", tasks,
                            str(run_dir / "controller.db"), curriculum=cur)
    t3 = time.perf_counter()
    out = {"cpu_s": time.process_time() - c0, "load_tasks_s": t1 - t0, "curriculum_s": t2 - t1, "controller_s": t3 - t2, "total_s": t3 - t0,
           "admitted": len(ctl.core.tasks), "refused": len(ctl.core.refused_tasks),
           "peak_rss_load_mb": peak_load, "peak_rss_mb": _status_mb("VmHWM")}
    if cur is not None:  # a sample's cost with `touched` tasks with outcomes, the rest unseen
        import random as _random
        n_ids = len(cur.task_ids)
        step = 7919   # spread over the set (prime: distinct positions)
        picked = [cur.task_ids[(i * step) % n_ids] for i in range(touched)]
        with cur._db:   # the outcomes of a long run, written at once (4 per task, 2 versions)
            cur._db.execute("BEGIN")
            cur._db.executemany("INSERT INTO outcomes VALUES (?, ?, ?, ?)",
                                [(t, v, (i + v) % 4, 4 - (i + v) % 4) for i, t in enumerate(picked)
                                 for v in (0, 1)])
        s0 = time.process_time()
        cur.sample(64, _random.Random(0), 1)    # the classes of (version, band): built once per version
        out["classes_build_s"] = time.process_time() - s0
        for size in (64, 1024):
            times = []
            for k in range(21):   # an outcome recorded between samples, as in a run
                cur.record(picked[(k * 31) % touched], 1, "pass" if k % 2 else "fail", rollout_id=f"s{size}-{k}")
                s0 = time.process_time()
                cur.sample(size, _random.Random(k), 1)
                times.append(time.process_time() - s0)
            out[f"sample{size}_ms_p50"] = 1e3 * sorted(times)[len(times) // 2]
            out[f"sample{size}_ms_max"] = 1e3 * max(times)
    del tasks
    import gc
    gc.collect()
    out["rss_after_mb"] = _status_mb("VmRSS")
    ctl.sock.close()
    return out


def _status_mb(field: str) -> float:
    """VmRSS or VmHWM (this process's peak: `ru_maxrss` would carry the parent's across exec)."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1]) / 1024
    return 0.0


def bench_load(args) -> dict:
    """Three starts of a fresh controller process on one tasks file: the reference (the whole
    file read into a dict, as before the index), the first start (the index is built beside the
    file) and a restart (the index is opened)."""
    with tempfile.TemporaryDirectory(prefix="paddock-scale-", dir=args.tmp) as d:
        path = Path(d) / "tasks.json"
        t0 = time.perf_counter()
        write_tasks_file(path, synthetic_tasks(args.tasks))
        size = path.stat().st_size
        print(f"tasks file: {args.tasks} synthetic SWE references, {size / 1e6:.1f} MB "
              f"({size / args.tasks:.0f} bytes per task), written in {time.perf_counter() - t0:.1f} s",
              flush=True)
        runs = {}
        for mode in ("dict", "first", "restart"):
            cmd = [sys.executable, __file__, "_child", str(path), d, "--mode", mode,
                   "--touched", str(args.touched)] + (["--curriculum"] if args.curriculum else [])
            res = subprocess.run(cmd, capture_output=True, text=True, env={**os.environ, "PYTHONPATH": str(ROOT)})
            if res.returncode != 0:
                raise SystemExit(f"child failed:\n{res.stderr[-4000:]}")
            runs[mode] = out = json.loads(res.stdout.strip().splitlines()[-1])
            print(f"{mode:>8}: load_tasks {out['load_tasks_s']:.2f} s, curriculum {out['curriculum_s']:.2f} s, "
                  f"Controller() {out['controller_s']:.2f} s, total {out['total_s']:.2f} s wall "
                  f"({out['cpu_s']:.2f} s CPU); admitted {out['admitted']} refs, refused {out['refused']}; "
                  f"peak RSS {out['peak_rss_mb']:.0f} MB, RSS after start {out['rss_after_mb']:.0f} MB"
                  + (f"; curriculum ({args.touched:,} tasks with outcomes, the rest unseen): classes of a "
                     f"policy version built in {out['classes_build_s']:.2f} s CPU; sample CPU: 64 tasks p50 "
                     f"{out['sample64_ms_p50']:.2f} ms (max {out['sample64_ms_max']:.2f}), 1,024 tasks p50 "
                     f"{out['sample1024_ms_p50']:.2f} ms (max {out['sample1024_ms_max']:.2f})"
                     if "sample64_ms_p50" in out else ""), flush=True)
    ref = runs["dict"]
    for mode in ("first", "restart"):
        print(f"{mode} start / whole-dict start: CPU {runs[mode]['cpu_s'] / ref['cpu_s']:.2f}x, "
              f"peak RSS {runs[mode]['peak_rss_mb'] / ref['peak_rss_mb']:.2f}x")
    return runs


def bench_sim(args) -> dict:
    from dataclasses import asdict, replace

    from tests.sim.sim import ScaleWorld
    base = "/dev/shm" if os.access("/dev/shm", os.W_OK) else None
    with tempfile.TemporaryDirectory(prefix="paddock-scale-", dir=base) as d:
        t0 = time.perf_counter()
        batch = args.batch or max(1024, args.agents * args.slots // 32)
        w = ScaleWorld(args.seed, Path(d), args.agents, args.slots, n_tasks=args.tasks,
                       attempt_s=args.attempt_s, hb_s=args.hb_s, prefetch=args.prefetch, batch=batch)
        if args.gc == "controller":
            gcpolicy.settle()  # what the controller daemon does once started (broker/gcpolicy.py)
        elif args.gc == "off":
            gc.disable()
        warm = w.run_for(args.warmup_s)
        warm = replace(warm)
        committed0, promoted0 = w.queue.counts()["committed"], w.promoted
        st = w.run_for(args.sim_s)
        w.check_agents()   # none runs more than its slots, none holds more than slots + prefetch
        promoted = w.promoted - promoted0
        wall = time.perf_counter() - t0
        counts = w.queue.counts()
        committed = counts["committed"] - committed0
        db = sum(p.stat().st_size for p in Path(d).glob("scale-*"))
    m = {k: getattr(st, k) - getattr(warm, k) for k in ("cpu_s", "frames_in", "frames_out", "bytes_in",
                                                        "bytes_out", "passes", "sim_s")}
    held = counts["leased"] + counts["running"]
    print(f"sim: {args.agents} agents x {args.slots} slots, prefetch {args.prefetch}, attempts {args.attempt_s:.0f} s +-50%, heartbeat "
          f"{args.hb_s:.0f} s, {args.tasks} task refs, submits of {batch}; measured {m['sim_s']:.0f} simulated s after "
          f"{args.warmup_s:.0f} s warm-up ({wall:.0f} s wall for the whole run)")
    print(f"  held leases at the end {held} of {args.agents * args.slots} slots (+{args.agents * args.prefetch} "
          f"prefetch); {promoted} attempts in the window started from a lease that waited; queue {counts}")
    print(f"  controller CPU {m['cpu_s']:.2f} s for {m['frames_in']} frames in, {m['frames_out']} out, "
          f"{m['passes']} passes (one SQLite commit each): {1e3 * m['cpu_s'] / m['frames_in']:.3f} ms per frame "
          f"in; {m['frames_in'] / m['sim_s']:.0f} frames in per simulated s -> "
          f"{m['cpu_s'] / m['sim_s']:.2f} controller cores")
    print(f"  frames: in {m['bytes_in'] / m['frames_in']:.0f} B mean, max {st.max_frame_in} B; out "
          f"{m['bytes_out'] / max(m['frames_out'], 1):.0f} B mean, max {st.max_frame_out} B; "
          f"{m['bytes_in'] / m['sim_s'] / 1e6:.2f} MB/s in, {m['bytes_out'] / m['sim_s'] / 1e6:.2f} MB/s out; "
          f"queue file {db / 1e6:.0f} MB; commits {m['passes'] / m['sim_s']:.1f}/s")
    print(f"  committed {committed} rollouts in the window: {1e6 * m['cpu_s'] / max(committed, 1):.0f} us of "
          f"controller CPU per rollout; frames per rollout: {m['frames_in'] / max(committed, 1):.2f} in, "
          f"{m['frames_out'] / max(committed, 1):.2f} out")
    out = {**asdict(st), "window": m, "counts": counts, "wall_s": wall, "committed": committed,
           "cpu_per_rollout_us": 1e6 * m["cpu_s"] / max(committed, 1), "cores": m["cpu_s"] / m["sim_s"],
           "held": held, "promoted": promoted, "frames_in_per_rollout": m["frames_in"] / max(committed, 1),
           "frames_out_per_rollout": m["frames_out"] / max(committed, 1)}
    return out


def bench_table(args) -> dict:
    """The controller's cost at several farm sizes in one run: CPU per committed rollout and
    cores, each size against the smallest (flat = the same cost per rollout at any size),
    without lease prefetch and with `--prefetch N`, and (`--gc-reference`) the same sizes under
    CPython's default collector policy as the reference. Each cell is a fresh process."""
    settings = list(dict.fromkeys([("controller", 0), ("controller", args.prefetch)]
                                  + ([("default", 0)] if args.gc_reference else [])))
    runs: dict = {}   # (tree, agents, gc, prefetch) -> one result per repeat
    for _ in range(args.repeats):   # round robin: every repeat of every cell spans the same stretch of load
        for agents in args.agents:
            for gc_mode, prefetch in settings:
                cmd = [sys.executable, __file__, "sim", "--agents", str(agents), "--slots", str(args.slots),
                       "--sim-s", str(args.sim_s), "--warmup-s", str(args.warmup_s), "--attempt-s",
                       str(args.attempt_s), "--gc", gc_mode, "--prefetch", str(prefetch), "--json"]
                # with --reference, the other tree's cell runs at the same time (the same load)
                trees = [""] + ([args.reference] if args.reference else [])
                procs = [(tree, subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                                 env={**os.environ, "PADDOCK_SCALE_TREE": tree,
                                                      "PYTHONPATH": tree or str(ROOT)}))
                         for tree in trees]
                for tree, proc in procs:
                    stdout, stderr = proc.communicate()
                    if proc.returncode != 0:
                        raise SystemExit(f"sim cell failed:\n{stderr[-4000:]}")
                    runs.setdefault((tree, agents, gc_mode, prefetch), []).append(
                        json.loads(stdout.strip().splitlines()[-1]))
    rows = {k[1:]: _median_cell(v) for k, v in runs.items() if k[0] == ""}
    refs = {k[1:]: _median_cell(v) for k, v in runs.items() if k[0] != ""}
    print(f"controller CPU at {args.slots} slots per agent, attempts {args.attempt_s:.0f} s, "
          f"{args.sim_s:.0f} simulated s measured after {args.warmup_s:.0f} s; medians of {args.repeats} "
          f"runs of each cell (min-max in brackets); load average {os.getloadavg()[0]:.1f} at the end")
    print(f"{'agents':>7} {'slots':>7} {'prefetch':>8} {'us/rollout':>11} {'vs ' + str(args.agents[0]):>8} "
          f"{'(min-max)':>11} {'cores':>6} {'frames in/out per rollout':>26} {'held/slots':>10} "
          f"{'vs no prefetch':>15}")
    for prefetch in dict.fromkeys((0, args.prefetch)):
        base = rows[(args.agents[0], "controller", prefetch)]["cpu_per_rollout_us"]
        for agents in args.agents:
            c, none = rows[(agents, "controller", prefetch)], rows[(agents, "controller", 0)]
            spread = f"({c['us_min']:.0f}-{c['us_max']:.0f})"
            print(f"{agents:>7} {agents * args.slots:>7} {prefetch:>8} {c['cpu_per_rollout_us']:>11.0f} "
                  f"{c['cpu_per_rollout_us'] / base:>8.2f} {spread:>11} {c['cores']:>6.3f} "
                  f"{c['frames_in_per_rollout']:>12.2f} / {c['frames_out_per_rollout']:<11.2f} "
                  f"{c['held'] / (agents * args.slots):>10.3f} "
                  f"{c['cpu_per_rollout_us'] / none['cpu_per_rollout_us']:>15.2f}")
    if args.reference:
        print(f"reference tree {args.reference}, each cell run at the same time as this tree's:")
        print(f"{'agents':>7} {'prefetch':>8} {'ref us/rollout':>15} {'ref cores':>9} {'us/rollout':>11} "
              f"{'cores':>6} {'this/ref':>9}")
        for agents in args.agents:
            for prefetch in dict.fromkeys((0, args.prefetch)):
                c, r = rows[(agents, "controller", prefetch)], refs[(agents, "controller", prefetch)]
                print(f"{agents:>7} {prefetch:>8} {r['cpu_per_rollout_us']:>15.0f} {r['cores']:>9.3f} "
                      f"{c['cpu_per_rollout_us']:>11.0f} {c['cores']:>6.3f} "
                      f"{c['cpu_per_rollout_us'] / r['cpu_per_rollout_us']:>9.2f}")
    if args.gc_reference:
        print(f"{'agents':>7} {'default gc us/rollout':>22} {'cores':>6} {'policy/default':>15}")
        for agents in args.agents:
            c, d = rows[(agents, "controller", 0)], rows[(agents, "default", 0)]
            print(f"{agents:>7} {d['cpu_per_rollout_us']:>22.0f} {d['cores']:>6.3f} "
                  f"{c['cpu_per_rollout_us'] / d['cpu_per_rollout_us']:>15.2f}")
    flat = max(rows[(a, "controller", 0)]["cpu_per_rollout_us"] for a in args.agents) / \
        rows[(args.agents[0], "controller", 0)]["cpu_per_rollout_us"]
    print(f"ratio CPU per rollout, largest of {args.agents} agents / {args.agents[0]} (no prefetch): "
          f"{flat:.2f}  (goal <= 1.20: flat within 20 %)")
    for agents in args.agents:
        if agents * args.slots == 32_000:
            print(f"controller cores at 32,000 slots (no prefetch): "
                  f"{rows[(agents, 'controller', 0)]['cores']:.3f}  (goal <= 0.100)")
    return {f"{a}:{g}:{p}": r for (a, g, p), r in rows.items()}


def _median_cell(results: list[dict]) -> dict:
    """One cell's repeats: the median of each figure, and the spread of the CPU per rollout."""
    import statistics
    out = {k: statistics.median(r[k] for r in results) for k in results[0] if isinstance(results[0][k], (int, float))}
    us = [r["cpu_per_rollout_us"] for r in results]
    return {**out, "us_min": min(us), "us_max": max(us)}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    lo = sub.add_parser("load")
    lo.add_argument("--tasks", type=int, default=450_000)
    lo.add_argument("--curriculum", action="store_true")
    lo.add_argument("--tmp", default=None)
    lo.add_argument("--touched", type=int, default=2000,
                    help="tasks with outcomes when the curriculum samples (late in a long run: most of them)")
    ch = sub.add_parser("_child")
    ch.add_argument("tasks_json")
    ch.add_argument("work")
    ch.add_argument("--curriculum", action="store_true")
    ch.add_argument("--mode", choices=("dict", "first", "restart"), default="restart")
    ch.add_argument("--touched", type=int, default=2000)
    si = sub.add_parser("sim")
    si.add_argument("--agents", type=int, default=1000)
    si.add_argument("--slots", type=int, default=32)
    si.add_argument("--sim-s", type=float, default=120.0, help="simulated seconds measured")
    si.add_argument("--warmup-s", type=float, default=120.0, help="simulated seconds before")
    si.add_argument("--hb-s", type=float, default=5.0)
    si.add_argument("--attempt-s", type=float, default=60.0)
    si.add_argument("--tasks", type=int, default=10_000)
    si.add_argument("--seed", type=int, default=1)
    si.add_argument("--gc", choices=("controller", "default", "off"), default="controller",
                    help="the collector's policy: the controller daemon's (broker/gcpolicy.py), "
                         "CPython's defaults, or off (the bound: the simulated agents share this heap)")
    si.add_argument("--prefetch", type=int, default=0, help="leases each agent holds ahead of its slots")
    si.add_argument("--batch", type=int, default=0,
                    help="rollouts per trainer submit (default max(1024, slots / 32): the trainer, one "
                         "submit in flight, must keep the queue ahead of the farm; at 1,024 a farm of "
                         "3,000 x 32 ran the queue dry and a quarter of its slots idle)")
    si.add_argument("--json", action="store_true", help="also print the figures as one JSON line")
    ta = sub.add_parser("table")
    ta.add_argument("--agents", type=int, nargs="+", default=[100, 1000, 3000])
    ta.add_argument("--slots", type=int, default=32)
    ta.add_argument("--sim-s", type=float, default=60.0)
    ta.add_argument("--warmup-s", type=float, default=90.0)
    ta.add_argument("--attempt-s", type=float, default=60.0)
    ta.add_argument("--prefetch", type=int, default=2, help="the setting compared with none")
    ta.add_argument("--gc-reference", action="store_true", help="also run CPython's default collector")
    ta.add_argument("--repeats", type=int, default=3,
                    help="runs of every cell, round robin; the table prints each cell's median")
    ta.add_argument("--reference", default="", help="another source tree (e.g. `git archive` of the "
                    "commit before a change): each cell also runs there, at the same time")
    args = ap.parse_args(argv)
    if args.cmd == "table":
        bench_table(args)
    elif args.cmd == "sim" and args.json:
        out = bench_sim(args)
        print(json.dumps({k: out[k] for k in ("cpu_per_rollout_us", "cores", "committed", "wall_s", "held", "promoted",
                                              "frames_in_per_rollout", "frames_out_per_rollout")}))
    elif args.cmd == "_child":
        print(json.dumps(_child_load(args.tasks_json, args.work, args.curriculum, args.mode, args.touched)))
    elif args.cmd == "load":
        bench_load(args)
    else:
        bench_sim(args)
    return 0


if __name__ == "__main__":
    sys.exit(main())
