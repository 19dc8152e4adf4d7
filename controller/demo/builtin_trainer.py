"""The built-in scripted trainer as a trainer command: what the Slurm head step runs when the job
names no trainer of its own, started and stopped as yours is (slurm/jobsteps.py):

    python -m controller.demo.builtin_trainer --served FILE [--versions N] [--rollouts-per-task K]
                                              [--runs-dir DIR] [--policy-script FILE]
    python -m controller.demo.builtin_trainer --check [--policy-script FILE]

It reads the farm from the trainer environment (PADDOCK_ENDPOINT, PADDOCK_DEPLOYMENT,
PADDOCK_RUN_DIR, PADDOCK_KEY_FILE, PADDOCK_TASKSET, PADDOCK_TASKBANK, PADDOCK_HEAD_ADDR,
PADDOCK_SERVERS_FILE), serves the scripted policy (its own policy server on the head's address, or
the job's `inference` replicas, whose weights it updates over HTTP), and runs the local run's
`train` over the tasks the head serves (`--served`: a JSON list of task names, what validation
kept). `--check` only says whether the scripted policy can play the task set (exit 2 and the
reason on stderr if not), so the head refuses a job it cannot train before the farm starts.

End of time: the job's signals (SIGTERM, SIGWINCH, SIGUSR1, SIGUSR2) are ignored, so the policy
server keeps answering the running rollouts while the head waits for the drain; the head then
stops this process with SIGINT (exit 0).

Must not import: slurm, controller.cli, nodeagent.
"""
from __future__ import annotations

import argparse
import contextlib
import json
import os
import signal
import sys
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

from rich.console import Console

from controller.contracts.tasks import TaskError
from controller.demo.localrun import RunConfig, scripted_players, train
from controller.demo.policy_server import PolicyServer, default_params
from controller.farm.assemble import load_taskset

EXIT_CANNOT_PLAY = 2
END_OF_TIME = (signal.SIGTERM, signal.SIGWINCH, signal.SIGUSR1, signal.SIGUSR2)
RELOAD_TIMEOUT_S = 600.0


class ReplicaPolicy:
    """The scripted policy served by the job's `inference` replicas (servers.json records, each
    with its `base` and `reload` path): `set_policy` POSTs the weights to every replica, `url`
    is their URLs (the gateway spreads rollouts over them)."""

    def __init__(self, records: list[dict]) -> None:
        self.records = records
        self.url = " ".join(r["url"] for r in records)

    def set_policy(self, version: int, params: Any) -> bool:
        body = json.dumps({"version": version, "params": params}).encode()
        bad = []
        for r in self.records:
            req = urllib.request.Request(r["base"] + (r.get("reload") or "/admin/policies"), data=body,
                                         headers={"Content-Type": "application/json"}, method="POST")
            try:
                with urllib.request.urlopen(req, timeout=RELOAD_TIMEOUT_S) as resp:
                    status: int | str = resp.status
            except urllib.error.HTTPError as exc:
                status = exc.code
            except OSError as exc:
                status = str(exc)
            if not (isinstance(status, int) and 200 <= status < 300):
                bad.append(f"{r.get('node')} ({r['base']}): {status}")
        if bad or not self.records:
            raise RuntimeError("weight update did not reach every replica: " + ("; ".join(bad) or "no replicas"))
        return True


def _inference_records(env) -> list[dict]:
    path = env.get("PADDOCK_SERVERS_FILE")
    if not path or not Path(path).exists():
        return []
    return json.loads(Path(path).read_text()).get("inference") or []


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m controller.demo.builtin_trainer")
    ap.add_argument("--check", action="store_true", help="only check that the scripted policy can play the set")
    ap.add_argument("--served", default="", help="a JSON file: the names of the tasks the head serves")
    ap.add_argument("--versions", type=int, default=2)
    ap.add_argument("--rollouts-per-task", type=int, default=1)
    ap.add_argument("--runs-dir", default="")
    ap.add_argument("--policy-script", default="")
    args = ap.parse_args(argv)
    env = os.environ
    taskset = load_taskset(env.get("PADDOCK_TASKSET", "builtin"), env.get("PADDOCK_TASKBANK", ""))
    try:
        players = scripted_players(taskset, args.policy_script)
    except TaskError as exc:
        print(str(exc), file=sys.stderr, flush=True)
        return EXIT_CANNOT_PLAY
    if args.check:
        return 0
    for sig in END_OF_TIME:
        signal.signal(sig, signal.SIG_IGN)
    run_dir = Path(env["PADDOCK_RUN_DIR"])
    names = json.loads(Path(args.served).read_text())
    cfg = RunConfig(versions=args.versions, rollouts_per_task=args.rollouts_per_task,
                    runs_dir=args.runs_dir or str(run_dir.parent), policy_script=args.policy_script)
    console = Console(file=sys.stdout, force_terminal=False, width=120)
    try:
        with contextlib.ExitStack() as stack:
            records = _inference_records(env)
            policy = ReplicaPolicy(records) if records else stack.enter_context(
                PolicyServer(taskset, host=env.get("PADDOCK_HEAD_ADDR", "127.0.0.1"), players=players))
            train(cfg, policy, env["PADDOCK_ENDPOINT"], env["PADDOCK_DEPLOYMENT"], run_dir, taskset, names,
                  default_params(), console)
    except KeyboardInterrupt:      # the head's stop after the drain
        print("built-in trainer: stopped", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
