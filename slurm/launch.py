"""A Paddock job on Slurm: the two job steps, and `paddock launch` (submit from Python).

Job steps (what the batch scripts of slurm/sbatch.py run, one per layout component):
  `paddock job head`   controller + scripted policy server + trainer on one node. Publishes the
                       controller endpoint in the run directory (shared storage) with `job.json`
                       (deployment, agent version); trains once enough agents have registered;
                       then shuts the controller down, which stops the agents.
  `paddock job agent`  one per environment node: waits for the endpoint file (gives up with a
                       clear message after --controller-wait-s), checks deployment and version,
                       then runs the node agent.
SIGWINCH (forwarded by the batch shell before the time limit; sent by Slurm itself to a
`paddock launch` job, whose --signal names it) or SIGTERM: agents drain; the head
stops training, waits until every agent has drained and disconnected, then shuts the
controller down so the catalog is flushed. The controller ignores the signal itself (it must
outlive the drain).

`launch(params) -> JobHandle` submits the same layout with submitit (one task per node: task 0
runs the head, tasks 1.. run agents) and returns a handle whose state comes from Slurm
accounting (`sacct`), so a job that dies is seen as dead, not waited on forever.

Must not import: sqlite3 (the queue belongs to the controller process).
"""
from __future__ import annotations

import argparse
import contextlib
import json
import logging
import os
import signal
import socket
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

log = logging.getLogger("paddock.job")

ENDPOINT_FILE = "controller.endpoint"
JOB_FILE = "job.json"
LIVE_STATES = ("live", "ready")
EXIT_BAD_INPUT = 2
EXIT_GAVE_UP = 3


class JobStepError(RuntimeError):
    """A job step cannot go on; the message says what is wrong and where to look."""


class StopRequested(Exception):
    """The end-of-time signal arrived (the batch shell forwards --signal=B:...)."""


def check_run_dir(run_dir: Path) -> None:
    """The run directory exists (or can be created) and is writable, else JobStepError."""
    try:
        run_dir.mkdir(parents=True, exist_ok=True)
        probe = run_dir / f".writable-{socket.gethostname()}-{os.getpid()}"
        probe.write_text("ok")
        probe.unlink()
    except OSError as exc:
        raise JobStepError(f"run directory {run_dir} is not writable from {socket.gethostname()}: "
                           f"{exc.strerror or exc}") from None


def node_address() -> str:
    """The first non-loopback IPv4 address of this node (where agents on other nodes reach us)."""
    import psutil
    for name, addrs in sorted(psutil.net_if_addrs().items()):
        for a in addrs:
            if a.family == socket.AF_INET and not a.address.startswith("127."):
                return a.address
    return "127.0.0.1"


# ----------------------------------------------------------------------------- head step
def _wait_agents(client, want: int, timeout_s: float, clock=time.monotonic) -> int:
    deadline = clock() + timeout_s
    while True:
        live = sum(n.get("state") in LIVE_STATES for n in client.status().nodes)
        if live >= want:
            return live
        if clock() >= deadline:
            raise JobStepError(f"only {live} of {want} node agents registered within {timeout_s:.0f}s; "
                               "see logs/agents.log in the run directory")
        time.sleep(0.2)


def _wait_drained(client, timeout_s: float, clock=time.monotonic) -> None:
    deadline = clock() + timeout_s
    while clock() < deadline:
        try:
            nodes = client.status().nodes
        except Exception as exc:  # the controller is the one that must answer; log and stop waiting
            log.warning("status during drain failed: %s", exc)
            return
        if not any(n.get("state") in LIVE_STATES + ("draining",) for n in nodes):
            return
        time.sleep(0.2)
    log.warning("agents still connected after %.0fs of draining", timeout_s)


def run_head(args) -> int:
    from rich.console import Console
    from controller.client.api import Client, ClientError
    from controller.demo.policy_server import PolicyServer, default_params
    from controller.analysis.query import print_summary, summary
    from controller.demo.localrun import (LOCAL_FAMILIES, RunConfig, _train, _wait_file, lease_tasks, load_taskset,
                                task_images)
    from controller.contracts.tasks import TaskError
    from layers.builtin import ensure_builtin_image
    from layers.store import ImageStore
    from nodeagent.agent.version import AGENT_VERSION

    run_dir = Path(args.run_dir).resolve()
    check_run_dir(run_dir)
    (run_dir / "logs").mkdir(exist_ok=True)
    console = Console(file=sys.stdout, force_terminal=False, width=120)

    def on_signal(signum, _frame):
        raise StopRequested(signal.Signals(signum).name)
    for sig in (signal.SIGWINCH, signal.SIGTERM, signal.SIGUSR1, signal.SIGUSR2):   # USR2: submitit's
        signal.signal(sig, on_signal)

    trainer = getattr(args, "trainer", "")
    try:
        taskset = load_taskset(getattr(args, "taskset", "builtin"), getattr(args, "bank", ""))
        if not trainer and (others := sorted({t.family for t in taskset.tasks} - set(LOCAL_FAMILIES))):
            raise TaskError(f"the built-in scripted trainer plays {' and '.join(LOCAL_FAMILIES)} tasks; task set "
                            f"{taskset.name!r} also has {', '.join(others)} tasks: give your own trainer=")
        store = ImageStore(args.image_store)
        digest, _image = ensure_builtin_image(store)
        images = task_images(taskset, store)
    except TaskError as exc:
        raise JobStepError(str(exc)) from None
    names = [t.name for t in taskset.tasks][: args.tasks_limit or None]
    addr = args.bind_addr or node_address()
    cfg = RunConfig(versions=args.versions, rollouts_per_task=args.rollouts_per_task,
                    heartbeat_interval_s=args.heartbeat_interval_s, tasks_limit=args.tasks_limit,
                    image_store=args.image_store, runs_dir=str(run_dir.parent))
    (run_dir / "tasks.json").write_text(json.dumps(lease_tasks(taskset, images)))
    (run_dir / "run.json").write_text(json.dumps({
        "run_id": run_dir.name, "taskset": taskset.name, "taskset_hash": taskset.manifest_hash,
        "image": digest, "deployment": args.deployment, "slurm_job_id": os.environ.get("SLURM_JOB_ID"),
        "head_node": socket.gethostname()}, indent=2))
    job_tmp = run_dir / (JOB_FILE + ".tmp")
    job_tmp.write_text(json.dumps({"deployment": args.deployment, "agent_version": AGENT_VERSION,
                                   "head_node": socket.gethostname(), "head_addr": addr}))
    job_tmp.rename(run_dir / JOB_FILE)
    (run_dir / ENDPOINT_FILE).unlink(missing_ok=True)
    ctl = _spawn_controller(args, run_dir, addr)
    endpoint = None
    try:
        endpoint = _wait_file(run_dir / ENDPOINT_FILE, ctl, 60.0, "controller")
        print(f"paddock head: controller {endpoint}, waiting for {args.agents} agents", flush=True)
        rc = 0
        with contextlib.ExitStack() as stack:
            policy = None if trainer else stack.enter_context(PolicyServer(taskset, host=addr))
            client = stack.enter_context(Client(endpoint, args.deployment))
            trainer_proc = None
            try:
                n = _wait_agents(client, args.agents, args.agents_wait_s)
                print(f"paddock head: {n} agents registered; training", flush=True)
                if trainer:
                    trainer_proc = _start_trainer(trainer, run_dir, endpoint, args, taskset, addr)
                    rc = trainer_proc.wait()
                    print(f"paddock head: trainer exited with {rc}", flush=True)
                else:
                    _train(cfg, policy, endpoint, args.deployment, run_dir, taskset, names, default_params(), console)
            except StopRequested as stop:
                print(f"paddock head: {stop} before the time limit: waiting for agents to drain", flush=True)
                if trainer_proc is not None:
                    rc = _stop_trainer(trainer_proc, args.drain_timeout_s)
                _wait_drained(client, args.drain_timeout_s)
            finally:
                if trainer_proc is not None and trainer_proc.poll() is None:   # the head failed
                    _stop_trainer(trainer_proc, 10.0)
    except (RuntimeError, ClientError) as exc:   # JobStepError, or the controller did not start (RuntimeError)
        print(f"paddock head: {exc}; see {run_dir}/logs/controller.log", file=sys.stderr, flush=True)
        rc = EXIT_GAVE_UP
    finally:
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        _shutdown_controller(ctl, endpoint, args.deployment)
    if rc == 0:
        try:
            print_summary(summary(run_dir), run_dir, out=sys.stdout)
        except Exception as exc:  # an empty run has nothing to summarise
            print(f"paddock head: no summary: {exc}", flush=True)
    return rc


TRAINER_ENV = ("PADDOCK_ENDPOINT", "PADDOCK_DEPLOYMENT", "PADDOCK_RUN_DIR", "PADDOCK_TASKSET",
               "PADDOCK_TASKSET_HASH", "PADDOCK_TASKBANK", "PADDOCK_HEAD_ADDR")


def _start_trainer(command: str, run_dir: Path, endpoint: str, args, taskset, addr: str) -> subprocess.Popen:
    """The user's training command, by /bin/sh in its own process group on the head node, with
    what it needs to reach the farm in its environment (TRAINER_ENV); output to logs/trainer.log.
    It starts with the end-of-time signals at their defaults: the head tells it (SIGTERM)."""
    env = dict(os.environ, PADDOCK_ENDPOINT=endpoint, PADDOCK_DEPLOYMENT=args.deployment,
               PADDOCK_RUN_DIR=str(run_dir), PADDOCK_TASKSET=taskset.name,
               PADDOCK_TASKSET_HASH=taskset.manifest_hash, PADDOCK_HEAD_ADDR=addr)
    if getattr(args, "bank", ""):
        env["PADDOCK_TASKBANK"] = args.bank
    log_f = open(run_dir / "logs" / "trainer.log", "ab")
    print(f"paddock head: starting trainer: {command}", flush=True)
    return subprocess.Popen(["/bin/sh", "-c", command], env=env, stdout=log_f, stderr=subprocess.STDOUT,
                            stdin=subprocess.DEVNULL, start_new_session=True)


def _stop_trainer(proc: subprocess.Popen, timeout_s: float) -> int:
    """End of time: SIGTERM to the trainer's process group (it may checkpoint), SIGKILL after
    `timeout_s`. Returns its exit code (0 if it exited cleanly on the signal)."""
    try:
        os.killpg(proc.pid, signal.SIGTERM)
    except ProcessLookupError:
        pass
    try:
        rc = proc.wait(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        log.warning("trainer did not exit %.0fs after SIGTERM: killing it", timeout_s)
        os.killpg(proc.pid, signal.SIGKILL)
        rc = proc.wait()
    # /bin/sh itself may die of the SIGTERM while the trainer exits cleanly: both mean "stopped"
    print(f"paddock head: trainer stopped after the end-of-time signal (exit status {rc})", flush=True)
    return 0 if rc in (0, -signal.SIGTERM) else rc


def curriculum_path(run_dir: Path, bank: str) -> Path:
    return Path(bank) / "curriculum.sqlite" if bank else run_dir / "curriculum.sqlite"


def _spawn_controller(args, run_dir: Path, addr: str) -> subprocess.Popen:
    from controller.demo.localrun import COMPACT_EVERY
    argv = [sys.executable, "-m", "controller.broker", "--bind", f"tcp://{addr}:0",
            "--deployment", args.deployment, "--run-dir", str(run_dir),
            "--tasks-json", str(run_dir / "tasks.json"), "--endpoint-file", str(run_dir / ENDPOINT_FILE),
            "--heartbeat-interval-s", str(args.heartbeat_interval_s),
            "--compact-every", str(COMPACT_EVERY)]
    if args.metrics_port is not None:
        argv += ["--metrics-port", str(args.metrics_port)]
    if getattr(args, "trainer", ""):
        # your trainer may submit sampler requests: the controller samples from, and learns
        # into, the curriculum kept with the bank (or with this run)
        argv += ["--curriculum-db", str(curriculum_path(run_dir, getattr(args, "bank", "")))]
    log_f = open(run_dir / "logs" / "controller.log", "ab")
    # Slurm signals every process of the step; the controller must outlive the drain, so it
    # starts with the end-of-time signals ignored (the disposition survives exec).
    return subprocess.Popen(argv, stdout=log_f, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                            preexec_fn=lambda: [signal.signal(s, signal.SIG_IGN)
                                                for s in (signal.SIGTERM, signal.SIGUSR1, signal.SIGUSR2)])


def _shutdown_controller(ctl: subprocess.Popen, endpoint: str | None, deployment: str) -> None:
    from controller.client.api import Client
    if endpoint and ctl.poll() is None:
        try:
            with Client(endpoint, deployment, timeout_s=5, retries=2) as c:
                c.shutdown("job finished")
        except Exception as exc:
            log.warning("controller shutdown request failed: %s", exc)
    try:
        ctl.wait(timeout=30)
    except subprocess.TimeoutExpired:
        ctl.kill()
        ctl.wait()


# ----------------------------------------------------------------------------- agent step
def wait_endpoint(run_dir: Path, timeout_s: float, clock=time.monotonic,
                  poll_s: float = 0.2) -> tuple[str, dict]:
    """(endpoint, job.json) once the head has published both, else JobStepError after timeout_s."""
    deadline = clock() + timeout_s
    ep, job = run_dir / ENDPOINT_FILE, run_dir / JOB_FILE
    while not (ep.exists() and job.exists()):
        if clock() >= deadline:
            raise JobStepError(
                f"no controller endpoint at {ep} after {timeout_s:.0f}s: the head step did not start "
                f"(see {run_dir}/logs/head.log), or {run_dir} is not on storage shared with "
                f"{socket.gethostname()}")
        time.sleep(poll_s)
    return ep.read_text().strip(), json.loads(job.read_text())


def check_job(job: dict, deployment: str, agent_version: str) -> None:
    if job.get("deployment") != deployment:
        raise JobStepError(f"the run directory belongs to deployment {job.get('deployment')!r}, "
                           f"this agent to {deployment!r}: two jobs share one run directory")
    if job.get("agent_version") != agent_version:
        raise JobStepError(f"agent version {agent_version} cannot join a controller of version "
                           f"{job.get('agent_version')}: install the same Paddock on every node")


def agent_subids(procid: int, ntasks: int) -> tuple[int, int]:
    """This task's share of the sandbox user's subordinate ids (tasks may share one host)."""
    from nodeagent.sandbox.runtime import subid_range
    base, count = subid_range()
    share = count // max(ntasks, 1)
    return base + procid * share, share


def run_agent(args) -> int:
    from controller.cli import agent as agent_cli
    from nodeagent.agent.version import AGENT_VERSION
    run_dir = Path(args.run_dir).resolve()

    def on_signal(signum, _frame):
        raise StopRequested(signal.Signals(signum).name)
    for sig in (signal.SIGWINCH, signal.SIGTERM, signal.SIGUSR2):
        signal.signal(sig, on_signal)
    node = socket.gethostname()
    try:
        endpoint, job = wait_endpoint(run_dir, args.controller_wait_s)
        check_job(job, args.deployment, AGENT_VERSION)
    except JobStepError as exc:
        print(f"paddock agent on {node}: {exc}", file=sys.stderr, flush=True)
        return EXIT_GAVE_UP
    except StopRequested as s:
        print(f"paddock agent on {node}: {s} while waiting for the controller: exiting", flush=True)
        return 0
    # the node agent's main() installs its SIGTERM drain handler; the job's drain signal
    # (SIGWINCH, see slurm/sbatch.py) is turned into that SIGTERM, for this process only
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    for sig in (signal.SIGWINCH, signal.SIGUSR2):   # USR2: submitit's signal before the time limit
        signal.signal(sig, lambda *_: signal.raise_signal(signal.SIGTERM))
    base, count = agent_subids(int(os.environ.get("SLURM_PROCID", "0")), int(os.environ.get("SLURM_NTASKS", "1")))
    os.environ["PADDOCK_HEALTH_DIR"] = str(run_dir / "health")
    print(f"paddock agent on {node}: joining {endpoint}", flush=True)
    return agent_cli.main(["--node", node, "--controller", endpoint, "--deployment", args.deployment,
                           "--slots", str(args.slots), "--image-store", args.image_store,
                           "--subid-base", str(base), "--subid-count", str(count),
                           "--heartbeat-interval-s", str(args.heartbeat_interval_s)])


# ----------------------------------------------------------------------------- CLI
def cmd_job(args) -> int:
    logging.basicConfig(level=logging.INFO, format=f"%(asctime)s {socket.gethostname()} %(name)s "
                                                   "%(levelname)s %(message)s")
    try:
        return run_head(args) if args.job_cmd == "head" else run_agent(args)
    except JobStepError as exc:
        print(f"paddock job {args.job_cmd}: {exc}", file=sys.stderr)
        return EXIT_BAD_INPUT


def register(subparsers: argparse._SubParsersAction) -> None:
    """Add `paddock job head|agent` (job steps) and `paddock launch` (submit with submitit)."""
    job = subparsers.add_parser("job", help="job steps run by the Slurm batch scripts")
    sub = job.add_subparsers(dest="job_cmd", required=True)
    for name in ("head", "agent"):
        p = sub.add_parser(name)
        p.add_argument("--run-dir", required=True)
        p.add_argument("--deployment", required=True)
        p.add_argument("--image-store", required=True)
        p.add_argument("--heartbeat-interval-s", type=float, default=1.0)
        p.set_defaults(func=cmd_job)
    head = sub.choices["head"]
    head.add_argument("--agents", type=int, required=True, help="agents that must register first")
    head.add_argument("--agents-wait-s", type=float, default=300.0)
    head.add_argument("--drain-timeout-s", type=float, default=60.0)
    head.add_argument("--versions", type=int, default=2)
    head.add_argument("--rollouts-per-task", type=int, default=1)
    head.add_argument("--tasks-limit", type=int, default=0)
    head.add_argument("--taskset", default="builtin", help="the task set served (default: the built-in one)")
    head.add_argument("--bank", default="", help="the task bank holding --taskset (shared storage)")
    head.add_argument("--trainer", default="", help="your training command, run on this node once the agents "
                                                    "registered (default: the built-in scripted trainer)")
    head.add_argument("--bind-addr", help="address the controller binds (default: this node's)")
    head.add_argument("--metrics-port", type=int, help="serve Prometheus metrics on this port")
    agent = sub.choices["agent"]
    agent.add_argument("--slots", type=int, default=2)
    agent.add_argument("--controller-wait-s", type=float, default=300.0)
    register_launch(subparsers)


# ----------------------------------------------------------------------------- paddock launch
TERMINAL_STATES = ("COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "NODE_FAIL", "OUT_OF_MEMORY",
                   "BOOT_FAIL", "DEADLINE", "PREEMPTED", "REVOKED")


def _job_args(p, **extra) -> argparse.Namespace:
    deployment = f"slurm-{os.environ.get('SLURM_JOB_ID', 'local')}"
    return argparse.Namespace(run_dir=p.run_dir, deployment=deployment, image_store=p.image_store,
                              heartbeat_interval_s=p.heartbeat_interval_s, **extra)


def job_task(p) -> int:
    """What every task of a launched job runs: task 0 the head, the others one node agent each."""
    import submitit
    rank = submitit.JobEnvironment().global_rank
    logging.basicConfig(level=logging.INFO, format=f"%(asctime)s {socket.gethostname()} %(name)s "
                                                   "%(levelname)s %(message)s", force=True)
    if rank == 0:
        rc = run_head(_job_args(p, agents=p.agents_needed, agents_wait_s=p.agents_wait_s, drain_timeout_s=60.0,
                                versions=p.versions, rollouts_per_task=p.rollouts_per_task,
                                tasks_limit=p.tasks_limit, taskset=p.taskset, bank=p.bank, trainer=p.trainer,
                                bind_addr=None, metrics_port=None))
    else:
        rc = run_agent(_job_args(p, slots=p.slots_per_node, controller_wait_s=p.controller_wait_s))
    if rc != 0:
        raise RuntimeError(f"job step on {socket.gethostname()} (task {rank}) exited with {rc}; "
                           f"see {p.run_dir}/logs")
    return rc


@dataclass
class JobHandle:
    """A launched job: its id, its run directory, and its state from Slurm accounting."""
    job: object
    run_dir: Path

    @property
    def job_id(self) -> str:
        return str(self.job.job_id)

    def state(self) -> str:
        """The job's state from sacct (PENDING, RUNNING, COMPLETED, FAILED, CANCELLED, ...).
        A failed sacct call is logged by submitit and gives UNKNOWN, never an exception."""
        return self.job.watcher.get_state(self.job_id, mode="force").split()[0]

    def wait(self, timeout_s: float, poll_s: float = 1.0, clock=time.monotonic) -> str:
        """Poll accounting until the job reaches a terminal state (returned), or TimeoutError."""
        deadline = clock() + timeout_s
        while (state := self.state()) not in TERMINAL_STATES:
            if clock() >= deadline:
                raise TimeoutError(f"job {self.job_id} still {state} after {timeout_s:.0f}s")
            time.sleep(poll_s)
        return state

    def __str__(self) -> str:
        return f"job {self.job_id} {self.state()} run_dir {self.run_dir}"


def launch(params) -> JobHandle:
    """Submit the farm with submitit: one component of env_nodes + 1 nodes, one task per node
    (task 0: head, tasks 1..: agents). `params` are the batch parameters of slurm/sbatch.py."""
    import submitit
    from slurm.sbatch import DRAIN_SIGNAL_NUMBER, JobParams, ParamError, time_limit_s
    p = params if isinstance(params, JobParams) else JobParams.from_mapping(
        dict({"layout": "single", "python": sys.executable}, **params))
    if p.layout != "single":
        raise ParamError("paddock launch submits the single-component layout (submitit cannot submit "
                         "heterogeneous jobs): pass layout=single, or use `paddock sbatch render layout=het`")
    check_run_dir(Path(p.run_dir))
    ex = submitit.SlurmExecutor(folder=Path(p.run_dir) / "submitit", python=p.python)
    ex.update_parameters(job_name=p.job_name, time=max(time_limit_s(p.time_limit) // 60, 1),
                         nodes=p.env_nodes + 1, ntasks_per_node=1,
                         cpus_per_task=max(p.head_cpus, p.agent_cpus),
                         partition=p.partition or None, account=p.account or None,
                         # submitit would ask for USR2, which Slurm sends to every process of the
                         # step, sandboxes included (default action: die). The drain signal is
                         # ignored by default, so only the job steps, which handle it, react.
                         additional_parameters={"signal": f"{DRAIN_SIGNAL_NUMBER}@{p.signal_before_s}"})
    job = ex.submit(job_task, p)
    log.info("submitted job %s (run dir %s)", job.job_id, p.run_dir)
    return JobHandle(job, Path(p.run_dir))


def cmd_launch(args) -> int:
    from slurm.sbatch import ParamError, coerce, parse_assignments
    try:
        handle = launch(coerce(parse_assignments(args.params)))
    except (ParamError, JobStepError) as exc:
        print(f"paddock launch: {exc}", file=sys.stderr)
        return EXIT_BAD_INPUT
    print(f"job {handle.job_id} submitted; run dir {handle.run_dir}", flush=True)
    if args.wait:
        state = handle.wait(args.wait_timeout_s)
        print(f"job {handle.job_id} {state}")
        return 0 if state == "COMPLETED" else 1
    return 0


def register_launch(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser("launch", help="submit the training job and its farm to Slurm (submitit)",
                              description="Same KEY=VALUE parameters as `paddock sbatch render` (single layout).")
    p.add_argument("params", nargs="*", metavar="KEY=VALUE")
    p.add_argument("--wait", action="store_true", help="wait for the job to end; exit 0 if COMPLETED")
    p.add_argument("--wait-timeout-s", type=float, default=7 * 86400)
    p.set_defaults(func=cmd_launch)
