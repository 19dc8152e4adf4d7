"""`paddock sandbox debug TASK`: a shell in the sandbox a rollout of TASK gets.

  paddock sandbox debug TASK [--bank DIR] [--set NAME] [--image-store DIR]
  paddock sandbox debug TASK --run RUN_DIR [--replay ROLLOUT_ID]
  paddock sandbox debug --run RUN_DIR --replay ROLLOUT_ID

TASK is a task id (or a 4+ hex-digit prefix) or name: of the run's tasks file (`--run`, what
its node agents leased), else of the task bank (`--bank`/`$PADDOCK_TASKBANK`, `--set`), else
of the built-in set; or a task package directory. The sandbox is made by the node agent's own
steps (`nodeagent.agent.debugbox`): image, layers, set-up layer, files, limits and network
policy of a rollout. `--replay ROLLOUT_ID` first runs that rollout's recorded tool calls (the
run's committed `steps` rows) in it, printing each observation. Then a shell: interactive on a
terminal, else the commands are read from stdin. The sandbox's facts go to stderr first (`--facts`:
as one JSON line). On exit nothing of it is left (link, sandbox, egress registration, runtime).

Exits with 0, 2 for a bad task or run (the message names it), 125 when the sandbox fails, 130
on Ctrl-C (which ends the session where the shell has no pseudo-terminal), 128+N on SIGTERM or
SIGHUP (a closed terminal), each after the clean-up.
Must not import: zmq, controller.broker.
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import sys
from pathlib import Path
from types import SimpleNamespace

from controller.analysis.replay import ReplayError, load
from controller.contracts.network import PolicyError
from controller.contracts.tasks import TaskError
from controller.contracts.tools import ToolSetError
from controller.demo.localrun import task_images
from controller.taskbank.bank import TaskBank, find_task, load_package
from controller.taskbank.builtin import builtin_taskset
from layers.builtin import default_store_root
from layers.store import ImageStore, ImageStoreError
from nodeagent.agent.debugbox import debug_sandbox, replay_calls, shell
from nodeagent.harness.sandboxlink import LinkError
from nodeagent.sandbox.runtime import SandboxError, SandboxRuntime
from nodeagent.sandbox.spec import SetupError

EXIT_SANDBOX_FAILED = 125


class DebugError(Exception):
    """The task, run or rollout named cannot be debugged; the message says which and why."""


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("debug", help="a shell in the exact sandbox a rollout of a task gets")
    p.add_argument("task", nargs="?", help="task id, id prefix or name (or a task package directory)")
    p.add_argument("--run", metavar="DIR", help="a run directory: its tasks (what its rollouts got), its trajectories")
    p.add_argument("--replay", metavar="ROLLOUT_ID", help="first run this rollout's recorded tool calls (needs --run)")
    p.add_argument("--bank", metavar="DIR", help="task bank (default $PADDOCK_TASKBANK or ./taskbank)")
    p.add_argument("--set", dest="set_name", help="look the task up in this set of the bank")
    p.add_argument("--image-store", metavar="DIR", help="image store (default: the run's, else the default one)")
    p.add_argument("--facts", action="store_true", help="print the sandbox's facts as one JSON line on stderr")
    p.set_defaults(func=cmd_debug)


def _store(args: argparse.Namespace) -> ImageStore:
    root = args.image_store
    if root is None and args.run:
        try:
            root = json.loads((Path(args.run) / "run.json").read_text()).get("config", {}).get("image_store")
        except (OSError, ValueError):
            root = None
    return ImageStore(root or default_store_root())


def _from_run(run_dir: Path, ref: str, store: ImageStore) -> tuple[dict, Path]:
    """The run's lease entry for `ref` (by id, prefix or name), as its node agents got it."""
    try:
        tasks = json.loads((run_dir / "tasks.json").read_text())
    except (OSError, ValueError) as exc:
        raise DebugError(f"cannot read the run's tasks ({run_dir / 'tasks.json'}): {exc}") from None
    entry = tasks.get(ref)
    if entry is None:
        hits = {e["task_id"]: e for k, e in tasks.items() if len(ref) >= 4 and isinstance(e, dict)
                and str(e.get("task_id", "")).removeprefix("sha256:").startswith(ref.removeprefix("sha256:"))}
        if len(hits) > 1:
            raise DebugError(f"task id prefix {ref!r} is ambiguous in {run_dir / 'tasks.json'}: {len(hits)} tasks")
        entry = next(iter(hits.values()), None)
    if entry is None:
        raise DebugError(f"no task {ref!r} in {run_dir / 'tasks.json'}")
    digest = entry.get("image_digest") or ""
    if not store.has(digest):
        raise DebugError(f"task {ref!r}: image {digest or '(none)'} is not in the image store {store.root}")
    return entry, store.path_of(digest)


def _from_bank(args: argparse.Namespace, store: ImageStore) -> tuple[dict, Path]:
    ref = args.task
    if Path(ref).is_dir():
        task = load_package(ref)
    else:
        bank = TaskBank(args.bank)
        if args.bank and not bank.root.is_dir():
            raise DebugError(f"task bank {bank.root} does not exist")
        try:
            task = find_task(bank, ref, args.set_name)
        except (TaskError, OSError) as exc:
            builtin = [t for t in builtin_taskset().tasks if ref in (t.name, t.task_id)
                       or (len(ref) >= 4 and t.task_id.removeprefix("sha256:").startswith(ref.removeprefix("sha256:")))]
            if args.set_name or len(builtin) != 1:
                raise DebugError(f"{exc} (nor in the built-in set)") from None
            task = builtin[0]
    digest, image = task_images(SimpleNamespace(tasks=[task]), store)[task.task_id]
    return dict(task.canonical(), task_id=task.task_id, image_digest=digest), image


def resolve(args: argparse.Namespace) -> tuple[dict, Path, list[dict]]:
    """(the lease task, its image, the rollout's recorded steps to replay). Raises DebugError."""
    store = _store(args)
    steps: list[dict] = []
    ref = args.task
    if args.replay:
        if not args.run:
            raise DebugError("--replay needs --run DIR (the run whose trajectories hold the rollout)")
        try:
            rec = load(args.run, args.replay)
        except ReplayError as exc:
            raise DebugError(str(exc)) from None
        if ref and ref not in (rec.task_id, rec.task_id.removeprefix("sha256:")) and not \
                rec.task_id.removeprefix("sha256:").startswith(ref.removeprefix("sha256:")):
            entry, _ = _from_run(Path(args.run), ref, store)
            if entry.get("task_id") != rec.task_id:
                raise DebugError(f"rollout {args.replay} is of task {rec.task_id}, not {ref!r}")
        ref, steps = rec.task_id, rec.steps
    if not ref:
        raise DebugError("name a TASK (or --run DIR --replay ROLLOUT_ID)")
    try:
        if args.run:
            task, image = _from_run(Path(args.run), ref, store)
        else:
            task, image = _from_bank(args, store)
    except (TaskError, ImageStoreError) as exc:
        raise DebugError(str(exc)) from None
    return task, image, steps


def cmd_debug(args: argparse.Namespace) -> int:
    try:
        task, image, steps = resolve(args)
    except DebugError as exc:
        print(f"paddock sandbox debug: {exc}", file=sys.stderr)
        return 2
    interactive = os.isatty(0)
    for sig in (signal.SIGTERM, signal.SIGHUP):   # a closed terminal or a kill: clean up, then go
        signal.signal(sig, _end_session)
    try:
        with SandboxRuntime() as rt, debug_sandbox(rt, image, task) as box:
            facts = box.facts()
            if args.facts:
                print(json.dumps(facts, sort_keys=True), file=sys.stderr)
            print(f"paddock sandbox debug: task {facts['task']} ({facts['task_id'][:19]}), image "
                  f"{facts['image_digest'][:19]}, {len(facts['layers'])} layer(s), limits {facts['limits']}, "
                  f"network {facts['network']}", file=sys.stderr)
            for step, call, out in replay_calls(box, steps):
                print(f"[replay step {step}] {call.get('name')} {call.get('arguments')}\n{out.observation}",
                      flush=True)
            sys.stdout.flush()
            cols, rows = shutil.get_terminal_size((80, 24))
            mode = shell(box, 0, 1, interactive, rows=rows, cols=cols)
            if interactive:
                print(f"paddock sandbox debug: shell ended ({mode}); destroying the sandbox", file=sys.stderr)
    except (TaskError, PolicyError, ToolSetError) as exc:
        print(f"paddock sandbox debug: task: {exc}", file=sys.stderr)
        return 2
    except (SandboxError, SetupError, LinkError, OSError) as exc:
        print(f"paddock sandbox debug: sandbox failed: {exc}", file=sys.stderr)
        return EXIT_SANDBOX_FAILED
    except KeyboardInterrupt:        # Ctrl-C on a terminal without a pty in the sandbox: the
        print("paddock sandbox debug: interrupted; the sandbox is destroyed", file=sys.stderr)
        return 130                   # session ends, the context managers above cleaned up
    except _Ended as exc:
        print(f"paddock sandbox debug: {exc}; the sandbox is destroyed", file=sys.stderr)
        return 128 + exc.signum
    return 0


class _Ended(Exception):
    def __init__(self, signum: int) -> None:
        super().__init__(f"ended by {signal.Signals(signum).name}")
        self.signum = signum


def _end_session(signum: int, _frame) -> None:
    signal.signal(signum, signal.SIG_IGN)        # once: the clean-up must not be cut short
    raise _Ended(signum)


__all__ = ["DebugError", "add_parser", "cmd_debug", "resolve"]
