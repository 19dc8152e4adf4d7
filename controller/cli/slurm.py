"""Paddock on Slurm from the command line: `paddock sbatch render`, `paddock launch`, and the
job steps `paddock job head|agent` that the batch scripts run.

  paddock sbatch render KEY=VALUE ... [-o FILE]     the batch script (slurm/sbatch.py)
  paddock launch KEY=VALUE ... [--wait]             submit with submitit (slurm/launch.py)
  paddock job head --run-dir DIR ...                the head step (slurm/jobsteps.py)
  paddock job agent --run-dir DIR ...               one node agent's step
  paddock job server --component inference ...     one model server's step (slurm/servers.py)

Thin: parses arguments into `JobParams`, `HeadStep` and `AgentStep` (whose defaults are the
flags' defaults) and calls slurm/. Bad parameters exit 2 with the list of valid ones.

Must not import: zmq, sqlite3.
"""
from __future__ import annotations

import argparse
import logging
import socket
import sys
from dataclasses import MISSING, fields

from slurm.jobsteps import EXIT_BAD_INPUT, AgentStep, HeadStep, JobStepError, node_address, run_agent, run_head
from slurm.launch import launch
from slurm.sbatch import ParamError, coerce, load_job_file, parse_assignments, render, valid_parameters
from slurm.servers import ServerStep, run_server

HEAD_HELP = {
    "agents": "agents that must register first",
    "taskset": "the task set served (default: the built-in one)",
    "bank": "the task bank holding --taskset (shared storage)",
    "trainer": "your training command, run on this node once the agents registered "
               "(default: the built-in scripted trainer)",
    "policy_script": "the scripted policy's per-task scripts of swe tasks (docs/policy.md)",
    "bind_addr": "address the controller binds (default: this node's)",
    "metrics_port": "serve Prometheus metrics on this port",
    "validate": "quick, full or off: validate the task set first, as `paddock run` does",
    "servers": "the job's model servers to wait for, COMPONENT=COUNT,... (e.g. inference=2,judge=1)",
}
SERVER_HELP = {
    "component": "inference, judge or services",
    "command": "your server command (/bin/sh; $PADDOCK_SERVER_PORT, $PADDOCK_SERVER_HOST)",
    "health": "GET this path until 200 (/health, or /v1/models)",
    "reload": "the path POSTed on every replica at a weight update",
}
FLAG_TYPES = {"int": int, "float": float, "str": str, "str | None": str, "int | None": int}


def register(subparsers: argparse._SubParsersAction) -> None:
    """Add `paddock sbatch render`, `paddock launch` and `paddock job head|agent`."""
    p = subparsers.add_parser("sbatch", help="Slurm batch scripts for a training job and its farm")
    sub = p.add_subparsers(dest="sbatch_cmd", required=True)
    r = sub.add_parser("render", help="print the batch script for KEY=VALUE parameters",
                       description=f"Parameters: {valid_parameters()}. Example: paddock sbatch render "
                                   "run_dir=/scratch/runs/r1 env_nodes=4 time_limit=02:00:00 layout=het")
    r.add_argument("params", nargs="*", metavar="KEY=VALUE",
                   help="a job parameter, or a component's (inference.nodes=2, trainer.gpus_per_node=4)")
    r.add_argument("--job", metavar="FILE", help="a job description (YAML); KEY=VALUE words override it")
    r.add_argument("-o", "--output", help="write the script here instead of stdout")
    r.set_defaults(func=cmd_render)

    la = subparsers.add_parser("launch", help="submit the training job and its farm to Slurm (submitit)",
                               description="Same KEY=VALUE parameters as `paddock sbatch render` (single layout).")
    la.add_argument("params", nargs="*", metavar="KEY=VALUE")
    la.add_argument("--job", metavar="FILE", help="a job description (YAML); KEY=VALUE words override it")
    la.add_argument("--wait", action="store_true", help="wait for the job to end; exit 0 if COMPLETED")
    la.add_argument("--wait-timeout-s", type=float, default=7 * 86400)
    la.set_defaults(func=cmd_launch)

    job = subparsers.add_parser("job", help="job steps run by the Slurm batch scripts")
    steps = job.add_subparsers(dest="job_cmd", required=True)
    head = steps.add_parser("head", help="controller, policy server and trainer on the first node")
    _add_step_flags(head, HeadStep, HEAD_HELP)
    head.set_defaults(func=cmd_job, step=HeadStep, run=run_head)
    agent = steps.add_parser("agent", help="one node agent, once the head has published its endpoint")
    _add_step_flags(agent, AgentStep, {})
    agent.set_defaults(func=cmd_job, step=AgentStep, run=run_agent)
    server = steps.add_parser("server", help="one model server (inference, judge, services) on this node")
    _add_step_flags(server, ServerStep, SERVER_HELP)
    server.set_defaults(func=cmd_job, step=ServerStep, run=lambda step: run_server(step, node_address()))


def _add_step_flags(p: argparse.ArgumentParser, step: type, helps: dict[str, str]) -> None:
    """One flag per field of the step's dataclass: a field without a default is a required flag."""
    for f in fields(step):
        flag = "--" + f.name.replace("_", "-")
        kind = FLAG_TYPES[str(f.type)]
        if f.default is MISSING:
            p.add_argument(flag, type=kind, required=True, help=helps.get(f.name))
        else:
            p.add_argument(flag, type=kind, default=f.default, help=helps.get(f.name))


def cmd_job(args: argparse.Namespace) -> int:
    logging.basicConfig(level=logging.INFO, format=f"%(asctime)s {socket.gethostname()} %(name)s "
                                                   "%(levelname)s %(message)s")
    step = args.step(**{f.name: getattr(args, f.name) for f in fields(args.step)})
    try:
        return args.run(step)
    except JobStepError as exc:
        print(f"paddock job {args.job_cmd}: {exc}", file=sys.stderr)
        return EXIT_BAD_INPUT


def job_params(args: argparse.Namespace) -> dict:
    """The job description: the --job file's keys, overridden by the KEY=VALUE words."""
    params = load_job_file(args.job) if args.job else {}
    params.update(coerce(parse_assignments(args.params)))   # a component's `name.key` wins over its file value
    return params


def cmd_render(args: argparse.Namespace) -> int:
    try:
        params = job_params(args)
        params.setdefault("python", sys.executable)
        text = render(params)
    except ParamError as exc:
        print(f"paddock sbatch render: {exc}", file=sys.stderr)
        return 2
    if args.output:
        with open(args.output, "w") as f:
            f.write(text)
    else:
        sys.stdout.write(text)
    return 0


def cmd_launch(args: argparse.Namespace) -> int:
    try:
        handle = launch(job_params(args))
    except (ParamError, JobStepError) as exc:
        print(f"paddock launch: {exc}", file=sys.stderr)
        return EXIT_BAD_INPUT
    print(f"job {handle.job_id} submitted; run dir {handle.run_dir}", flush=True)
    if args.wait:
        state = handle.wait(args.wait_timeout_s)
        print(f"job {handle.job_id} {state}")
        return 0 if state == "COMPLETED" else 1
    return 0
