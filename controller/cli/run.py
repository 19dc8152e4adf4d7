"""`paddock run` (the whole RL loop on this machine) and `paddock sandbox run` (one command in a
fresh sandbox).

  paddock run [--config FILE] [--versions N] [--agents N] ...
  paddock sandbox run [--image IMG] [--memory 256M] [--pids N] [--cpu C] [--degrade] [--show-caps] -- CMD
  paddock sandbox debug TASK [--run DIR] [--replay ROLLOUT] ...   (controller/cli/debug.py)

Thin: parses arguments and calls controller.demo.localrun (`RunConfig`, `run_local`) or the
sandbox runtime. A bad config exits 2; `sandbox run` exits with the command's status (125 if
the sandbox itself fails).

Must not import: zmq, controller.broker.
"""
from __future__ import annotations

import argparse
import math
import os
import re
import sys

from controller.cli import debug
from controller.contracts.tasks import LIMIT_RANGES, LimitError, checked_number
from controller.demo.localrun import ConfigError, RunConfig, node_capacity, run_local
from layers.builtin import default_store_root, ensure_builtin_image
from layers.store import ImageStore, ImageStoreError
from nodeagent.sandbox.runtime import SandboxError, SandboxRuntime, SandboxSpec
from nodeagent.verifier.validate import validate_for_run

EXIT_SANDBOX_FAILED = 125


def size_mb(text: str) -> int:
    """`256M`, `1G`, `512K`, `1048576` (bytes) -> whole MiB (at least 1)."""
    m = re.fullmatch(r"(\d+)([KMG]?)i?B?", text.strip(), re.IGNORECASE)
    if not m:
        raise argparse.ArgumentTypeError(f"invalid size {text!r} (examples: 256M, 1G)")
    n, unit = int(m.group(1)), m.group(2).upper()
    if n == 0:
        raise argparse.ArgumentTypeError(f"size {text!r} must be more than 0 (examples: 256M, 1G)")
    mb = {"": n / 2**20, "K": n / 1024, "M": n, "G": n * 1024}[unit] if unit else n
    return max(int(mb), 1)


def _number(kind: type, lo: float, hi: float):
    """An argparse type: a finite `kind` in [lo, hi] (0, negative, nan and inf are usage errors)."""
    def parse(text: str):
        try:
            value = kind(text) if kind is int else float(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r} is not {'an integer' if kind is int else 'a number'}") from None
        if not (math.isfinite(value) and lo <= value <= hi):
            bounds = (f"{int(lo)} to {int(hi)}" if kind is int else f"{lo:g} to {hi:g}")
            raise argparse.ArgumentTypeError(f"{text!r} must be from {bounds}")
        return value
    parse.__name__ = kind.__name__
    return parse


def positive_int(text: str) -> int:
    return _number(int, 1, 1 << 40)(text)


MAX_TIMEOUT_S = 7 * 86400.0


def check_sandbox_limits(limits: dict) -> None:
    """Each limit positive, finite and within this node's capacity; LimitError names the flag."""
    cap = node_capacity()
    flag = {"memory_mb": "--memory", "disk_mb": "--disk", "pids": "--pids", "cpu": "--cpu", "nofile": "nofile"}
    for key, value in limits.items():
        kind, lo, _hi = LIMIT_RANGES[key]
        unit = " MiB" if key.endswith("_mb") else ""
        try:
            checked_number(flag[key], value, kind, lo, cap[key], what="option")
        except LimitError:
            hi = str(int(cap[key])) if kind is int else f"{cap[key]:g}"
            raise LimitError(f"{flag[key]} {value!r}{unit} must be from {lo:g} to {hi}{unit} "
                             f"(this node's capacity)") from None


def register(subparsers: argparse._SubParsersAction) -> None:
    """Add `paddock run` and `paddock sandbox run`."""
    run = subparsers.add_parser("run", help="run the whole RL loop locally (controller, 2 node agents, trainer)")
    run.add_argument("--config", help="YAML file of run settings (see docs/operations.md)")
    run.add_argument("--versions", type=positive_int, help="policy versions to train (default 8)")
    run.add_argument("--agents", type=positive_int, help="node agents (default 2)")
    run.add_argument("--rollouts-per-task", type=positive_int, help="rollouts per task per version (default 1)")
    run.add_argument("--tasks-limit", type=_number(int, 0, 1 << 40), help="use only the first N tasks of the set")
    run.add_argument("--taskset", help="a task set in the bank (default: the built-in one)")
    run.add_argument("--bank", help="the task bank directory (default: $PADDOCK_TASKBANK, else ./taskbank)")
    run.add_argument("--runs-dir", help="where runs/<run-id>/ goes (default ./runs)")
    run.add_argument("--policy-script", metavar="FILE",
                     help="per-task scripts the scripted policy plays swe tasks with (JSON/YAML, docs/policy.md)")
    run.add_argument("--metrics-port", type=_number(int, 0, 65535), metavar="PORT",
                     help="serve the controller's Prometheus metrics on this port (0: any free port; "
                          "the URL is printed and written to RUN/controller.endpoint.metrics)")
    run.set_defaults(func=cmd_run)

    sbx = subparsers.add_parser("sandbox", help="sandbox tools")
    sub = sbx.add_subparsers(dest="sandbox_cmd", required=True)
    sr = sub.add_parser("run", help="run one command in a fresh sandbox")
    sr.add_argument("--image", help="image path or sha256:<digest> (default: the built-in python image)")
    sr.add_argument("--memory", type=size_mb, default=256, help="memory cap (default 256M)")
    sr.add_argument("--disk", type=size_mb, default=64, help="writable layer size (default 64M)")
    sr.add_argument("--pids", type=_number(int, 1, 4_194_304), default=64, help="process cap (default 64)")
    sr.add_argument("--cpu", type=_number(float, 0.01, 1024), default=1.0, help="CPU quota in cores (default 1.0)")
    sr.add_argument("--degrade", action="store_true",
                    help="run even if a cap can be held neither by a cgroup nor from user space (the memory "
                         "monitor, CPU slice + SCHED_BATCH, pids per id slice): it is then not enforced, and "
                         "says which (default: refuse)")
    sr.add_argument("--show-caps", action="store_true",
                    help="print how each cap is held (e.g. memory=monitor+rlimit cpu=cgroup-v2) on stderr")
    sr.add_argument("--timeout", type=_number(float, 0.001, MAX_TIMEOUT_S), default=10.0,
                    help="wall-clock limit in seconds (default 10)")
    sr.add_argument("--output-cap", type=_number(int, 1, 1 << 30), default=1 << 20, help="bytes of stdout/stderr kept")
    sr.add_argument("cmd", nargs=argparse.REMAINDER)
    sr.set_defaults(func=cmd_sandbox_run)
    debug.add_parser(sub)


def cmd_run(args: argparse.Namespace) -> int:
    try:
        cfg = RunConfig.load(args.config, {"versions": args.versions, "agents": args.agents,
                                           "rollouts_per_task": args.rollouts_per_task,
                                           "tasks_limit": args.tasks_limit, "runs_dir": args.runs_dir,
                                           "taskset": args.taskset, "bank": args.bank,
                                           "policy_script": args.policy_script,
                                           "metrics_port": args.metrics_port})
        run_local(cfg, validate_for_run)
    except (ConfigError, TypeError) as exc:
        print(f"paddock run: {exc}", file=sys.stderr)
        return 2
    return 0


def cmd_sandbox_run(args: argparse.Namespace) -> int:
    cmd = args.cmd[1:] if args.cmd[:1] == ["--"] else args.cmd
    if not cmd:
        print("paddock sandbox run: give a command after --", file=sys.stderr)
        return 2
    store = ImageStore(default_store_root())
    try:
        image = store.resolve(args.image) if args.image else ensure_builtin_image(store)[1]
    except (ImageStoreError, OSError) as exc:
        print(f"paddock sandbox run: {exc}", file=sys.stderr)
        return 2
    limits = {"memory_mb": args.memory, "disk_mb": args.disk, "pids": args.pids, "cpu": args.cpu,
              "nofile": 1024}
    try:
        check_sandbox_limits(limits)
    except LimitError as exc:
        print(f"paddock sandbox run: {exc}", file=sys.stderr)
        return 2
    try:
        with SandboxRuntime(degrade=args.degrade) as rt:
            report = rt.caps_report()
            if args.show_caps:
                print("paddock sandbox run: caps: " + " ".join(f"{cap}={how or 'NOT ENFORCED'}"
                                                           for cap, how in report["caps"].items()), file=sys.stderr)
            if report["degraded"]:
                print(f"paddock sandbox run: caps NOT enforced: {report['degraded']}", file=sys.stderr)
            sb = rt.create(SandboxSpec(image=image, limits=limits))
            try:
                r = sb.exec(cmd, stdin=b"" if sys.stdin.isatty() else sys.stdin.buffer.read(1 << 20),
                            timeout_s=args.timeout, output_cap=args.output_cap)
            finally:
                sb.destroy()
    except SandboxError as exc:
        print(f"paddock sandbox run: sandbox failed: {exc}", file=sys.stderr)
        return EXIT_SANDBOX_FAILED
    os.write(1, r.stdout)
    os.write(2, r.stderr)
    if r.truncated:
        print(f"\n[paddock: output truncated at {args.output_cap} bytes]", file=sys.stderr)
    if r.timed_out:
        print(f"[paddock: killed after {args.timeout}s]", file=sys.stderr)
    return r.exit_code
