"""The two job steps of a Paddock job on Slurm (what the batch scripts of slurm/sbatch.py and the
tasks of a `paddock launch` job run, one per layout component):

  `paddock job head`   controller + trainer (yours, or the built-in scripted one with its policy
                       server) on one node (`run_head`). Validates the task set as `paddock run`
                       does (quarantined tasks are not served; `quarantine.json`). Publishes the
                       controller endpoint in the run directory (shared storage) with `job.json`
                       (deployment, agent version); waits for the job's model servers
                       (slurm/servers.py) and enough agents; trains; then shuts the controller
                       down, which stops the agents, and tells the model servers to stop.
  `paddock job agent`  one per environment node (`run_agent`): waits for the endpoint file (gives
                       up with a clear message after `controller_wait_s`), checks deployment and
                       version, then runs `paddock agent` as a child process, restarted with
                       backoff when it exits unexpectedly (slurm/supervise.py).
  `paddock job server` one per node of a server component: slurm/servers.py.

Requeue and resume: a requeued job (`--requeue`, slurm/sbatch.py's `requeue=1`) runs again
under the same job id with SLURM_RESTART_COUNT set; a new job may be given the same run
directory. Either way the head finds the run's queue (`controller.db`) there and the controller
reopens it: committed rollouts stay committed, those leased by the lost run are leased anew
(released when this run's agents register from their nodes, or when the leases expire), and
the keyed submits of a restarted trainer get their batches back. The head removes the previous
run's endpoint before it writes `job.json` (deployment + incarnation), and an agent waits for
the `job.json` of its own run, so nobody dials a dead controller.

SIGWINCH (forwarded by the batch shell before the time limit; sent by Slurm itself to a
`paddock launch` job, whose --signal names it) or SIGTERM: agents drain; the head stops
training, waits until every agent has drained and disconnected (your trainer, whose model
server the running rollouts call, is stopped after that), then shuts the controller down so the
catalog is flushed. The controller ignores the signal itself (it must outlive the drain).

The steps take their settings as `HeadStep` / `AgentStep` (plain dataclasses; the command line
is controller/cli/slurm.py). The run is assembled as the local run assembles its own
(controller/farm/assemble.py): the same run directory, task index and controller and agent command
lines; the controller and the node agents run as `paddock controller` and `paddock agent`
processes. The trainer is a command: yours, or the built-in scripted one
(`python -m controller.demo.builtin_trainer`, the local run's trainer as a process).

Must not import: sqlite3 (the queue belongs to the controller process), submitit, controller.demo,
controller.cli.
"""
from __future__ import annotations

import contextlib
import dataclasses
import json
import logging
import os
import shlex
import signal
import socket
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import psutil
from rich.console import Console

from controller.analysis.query import print_summary, summary
from controller.broker.daemon import STOPPED_SUFFIX
from controller.client.api import Client, ClientError
from controller.contracts.liveness import HEARTBEAT_INTERVAL_S
from controller.contracts.tasks import TaskError
from controller.farm.assemble import (
    ENDPOINT_FILE,
    HEALTH_DIR_ENV,
    agent_argv,
    controller_argv,
    load_taskset,
    open_run_dir,
    spawn,
    stop_farm,
    task_images,
    validation_cache_dir,
    wait_file,
    write_run_files,
)
from controller.ondisk.fileio import atomic_write
from controller.ondisk.keys import KeyFileError, key_file_of, private_dir
from layers.builtin import ensure_builtin_image
from layers.store import ImageStore
from nodeagent.agent.version import AGENT_VERSION
from nodeagent.verifier.validate import validate_for_run
from slurm.lifeline import die_with_parent
from slurm.servers import (
    SERVERS_FILE,
    ServerError,
    endpoints_env,
    parse_servers,
    stop_servers,
    wait_servers,
)
from slurm.supervise import Policy, Supervisor

log = logging.getLogger("paddock.job")

JOB_FILE = "job.json"
QUEUE_FILE = "controller.db"           # the controller's default queue in the run directory
LIVE_STATES = ("live", "ready")
EXIT_BAD_INPUT = 2
EXIT_GAVE_UP = 3
BUILTIN_TRAINER = (sys.executable, "-m", "controller.demo.builtin_trainer")   # the job names no trainer
SERVED_FILE = "served.json"            # the names of the tasks the head serves (the built-in trainer's)
END_OF_TIME = (signal.SIGWINCH, signal.SIGTERM, signal.SIGUSR1, signal.SIGUSR2)   # USR2: submitit's


@dataclass(frozen=True)
class HeadStep:
    """Settings of `paddock job head` (the command line's flags, one field each)."""
    run_dir: str
    deployment: str
    image_store: str
    agents: int                          # agents that must register before training
    heartbeat_interval_s: float = HEARTBEAT_INTERVAL_S
    agents_wait_s: float = 300.0
    drain_timeout_s: float = 60.0
    versions: int = 2
    rollouts_per_task: int = 1
    tasks_limit: int = 0
    taskset: str = "builtin"             # the task set served
    bank: str = ""                       # the task bank holding `taskset` (shared storage)
    trainer: str = ""                    # your training command ("": the built-in scripted trainer)
    policy_script: str = ""              # the scripted policy's swe scripts (controller/demo/swe_policy.py)
    bind_addr: str | None = None         # address the controller binds (None: this node's)
    metrics_port: int | None = None      # serve Prometheus metrics on this port
    validate: str = "quick"              # quick | full | off: validate the task set first, as `paddock run`
    servers: str = ""                    # the job's model servers to wait for: "inference=2,judge=1"
    servers_wait_s: float = 600.0        # ... this long


@dataclass(frozen=True)
class AgentStep:
    """Settings of `paddock job agent`."""
    run_dir: str
    deployment: str
    image_store: str
    heartbeat_interval_s: float = HEARTBEAT_INTERVAL_S
    slots: int = 2
    controller_wait_s: float = 300.0
    sandbox: str = "native"              # native | apptainer: the sandbox backend
    restart_max_failures: int = 3        # agent failures within restart_window_s that give the node up
    restart_window_s: float = 300.0
    restart_backoff_s: float = 1.0       # the first restart's delay (doubling, at most 30 s)


class JobStepError(RuntimeError):
    """A job step cannot go on; the message says what is wrong and where to look."""


class StopRequested(Exception):
    """The end-of-time signal arrived (the batch shell forwards --signal=B:...)."""


def check_run_dir(run_dir: Path) -> None:
    """The run directory exists (or can be created, 0700) and is writable, else JobStepError."""
    try:
        private_dir(run_dir)
        probe = run_dir / f".writable-{socket.gethostname()}-{os.getpid()}"
        probe.write_text("ok")
        probe.unlink()
    except OSError as exc:
        raise JobStepError(f"run directory {run_dir} is not writable from {socket.gethostname()}: "
                           f"{exc.strerror or exc}") from None
    except KeyFileError as exc:
        raise JobStepError(str(exc)) from None


def node_address() -> str:
    """The first non-loopback IPv4 address of this node (where agents on other nodes reach us)."""
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


def run_head(args: HeadStep) -> int:
    """The head step; returns its exit status (EXIT_GAVE_UP when the farm never came up)."""
    run_dir = Path(args.run_dir).resolve()
    check_run_dir(run_dir)

    def on_signal(signum, _frame):
        raise StopRequested(signal.Signals(signum).name)
    for sig in END_OF_TIME:
        signal.signal(sig, on_signal)
    resumed = resuming(run_dir)
    try:
        key_file = open_run_dir(run_dir)  # logs/ and the keys, before the endpoint: agents load them then
    except KeyFileError as exc:
        print(f"paddock head: {exc}", file=sys.stderr, flush=True)
        return EXIT_BAD_INPUT
    try:
        taskset, names = _prepare_run(args, run_dir)
    except StopRequested as stop:   # the job ends (or is requeued) before its farm came up
        print(f"paddock head: {stop} while preparing the run: exiting", flush=True)
        if args.servers:
            stop_servers(run_dir, args.deployment)
        return 0
    addr = args.bind_addr or node_address()
    _remove_previous_endpoint(run_dir)
    gate_agents = resumed and bool(args.trainer)    # let in once the trainer is back (_serve)
    if not gate_agents:
        _publish_job(run_dir, args.deployment, addr)
    if resumed:
        print(f"paddock head: resuming the run in {run_dir} (incarnation {incarnation()}): its queue "
              f"{QUEUE_FILE} is kept; committed rollouts are not run again, leased ones are leased anew",
              flush=True)
    ctl = _spawn_controller(args, run_dir, addr)
    endpoint = None
    try:
        endpoint = wait_file(run_dir / ENDPOINT_FILE, ctl, 60.0, "controller")
        print(f"paddock head: controller {endpoint}, waiting for {args.agents} agents", flush=True)
        rc = _serve(args, run_dir, taskset, endpoint, addr, gate_agents)
    except (RuntimeError, ClientError) as exc:   # JobStepError, or the controller did not start (RuntimeError)
        print(f"paddock head: {exc}; see {run_dir}/logs/controller.log", file=sys.stderr, flush=True)
        rc = EXIT_GAVE_UP
    finally:
        for sig in END_OF_TIME:   # a later signal must not cut the shutdown short (store flush, summary)
            signal.signal(sig, signal.SIG_IGN)
        stop_farm([ctl], endpoint, args.deployment, key_file, "job finished")
        if args.servers:
            stop_servers(run_dir, args.deployment)     # the model servers' steps end
    if rc == 0:
        try:
            print_summary(summary(run_dir), run_dir, out=sys.stdout)
        except Exception as exc:  # an empty run has nothing to summarise
            print(f"paddock head: no summary: {exc}", flush=True)
    return rc


def incarnation() -> str:
    """Which run of this Slurm job this is: its restart count ("0" first; a requeued job runs
    again under the same job id with SLURM_RESTART_COUNT=1, 2, ...). Every step of one run sees
    the same value, so an agent can tell this run's `job.json` from a previous run's."""
    return os.environ.get("SLURM_RESTART_COUNT", "0")


def resuming(run_dir: Path) -> bool:
    """The run directory already holds a queue: a requeued job, or a new job on the same run
    directory. The controller reopens it (the queue on shared storage is the run's truth: its
    start reconciles the catalog with it, and leases of the previous run expire and are retried)."""
    return (run_dir / QUEUE_FILE).exists()


def _remove_previous_endpoint(run_dir: Path) -> None:
    """A previous run's endpoint (a requeued job, or an earlier job on this run directory) goes
    before this run's `job.json` is written: an agent that reads this run's `job.json` finds
    either no endpoint yet or the one the new controller writes."""
    for stale in (ENDPOINT_FILE, ENDPOINT_FILE + STOPPED_SUFFIX):
        (run_dir / stale).unlink(missing_ok=True)


def _publish_job(run_dir: Path, deployment: str, addr: str) -> None:
    """Write `job.json` for this run of the job: the agents of this run wait for it."""
    atomic_write(run_dir / JOB_FILE, json.dumps({
        "deployment": deployment, "incarnation": incarnation(), "agent_version": AGENT_VERSION,
        "head_node": socket.gethostname(), "head_addr": addr}))


def _check_same_taskset(run_dir: Path, taskset) -> None:
    """A resumed run serves the task set it was started with (its queue names those tasks)."""
    try:
        before = json.loads((run_dir / "run.json").read_text())
    except (OSError, ValueError):
        return
    if before.get("taskset_hash") not in (None, taskset.manifest_hash):
        raise JobStepError(f"run directory {run_dir} holds a run of task set {before.get('taskset')!r} "
                           f"({before.get('taskset_hash')}); this job serves {taskset.name!r} "
                           f"({taskset.manifest_hash}): resume it with the same task set, or give a new run_dir")


def _prepare_run(args: HeadStep, run_dir: Path) -> tuple:
    """Load the task set, make sure its images are in the store and the trainer can train it,
    validate it, write the run's files (controller/farm/assemble.py: `tasks.json`, its index,
    `run.json`) and the names of the served tasks; return (task set, served task names).
    JobStepError names what is missing."""
    try:
        taskset = load_taskset(args.taskset, args.bank)
        store = ImageStore(args.image_store)
        digest, _image = ensure_builtin_image(store)
        images = task_images(taskset, store)
    except TaskError as exc:
        raise JobStepError(str(exc)) from None
    if not args.trainer:
        _check_builtin_trainer(args, taskset)
    if resuming(run_dir):
        _check_same_taskset(run_dir, taskset)
    names = [t.name for t in taskset.tasks][: args.tasks_limit or None]
    try:      # the same start-up check as `paddock run`: quarantined tasks are not served
        names = validate_for_run(taskset, names, {t.name: images[t.task_id][1] for t in taskset.tasks},
                                 validation_cache_dir(Path(store.root)), run_dir, args.validate,
                                 console=Console(file=sys.stdout, force_terminal=False, width=120))
    except ValueError as exc:
        raise JobStepError(f"--validate: {exc}") from None
    if not names:
        raise JobStepError(f"every task of {taskset.name!r} failed validation: see {run_dir}/quarantine.json")
    write_run_files(run_dir, taskset, images, args.bank, {
        "run_id": run_dir.name, "taskset": taskset.name, "taskset_hash": taskset.manifest_hash,
        "image": digest, "deployment": args.deployment, "slurm_job_id": os.environ.get("SLURM_JOB_ID"),
        "head_node": socket.gethostname(), "incarnation": incarnation(), "validate": args.validate,
        "served_tasks": len(names)})
    atomic_write(run_dir / SERVED_FILE, json.dumps(names))
    return taskset, names


def _check_builtin_trainer(args: HeadStep, taskset) -> None:
    """The built-in trainer's scripted policy can play the task set (and its policy script is
    good), asked of the trainer command itself; JobStepError with its reason if not."""
    env = dict(os.environ, PADDOCK_TASKSET=args.taskset, PADDOCK_TASKBANK=args.bank)
    r = subprocess.run([*BUILTIN_TRAINER, "--check", "--policy-script", args.policy_script], env=env,
                       capture_output=True, text=True, stdin=subprocess.DEVNULL)
    if r.returncode != 0:
        raise JobStepError(r.stderr.strip().splitlines()[-1] if r.stderr.strip() else
                           f"the built-in trainer cannot train task set {taskset.name!r} (exit {r.returncode})")


def builtin_trainer_argv(args: HeadStep, run_dir: Path) -> list[str]:
    """The built-in scripted trainer as a trainer command (controller/demo/builtin_trainer.py)."""
    return [*BUILTIN_TRAINER, "--served", str(run_dir / SERVED_FILE), "--versions", str(args.versions),
            "--rollouts-per-task", str(args.rollouts_per_task), "--runs-dir", str(run_dir.parent),
            "--policy-script", args.policy_script]


def _serve(args: HeadStep, run_dir: Path, taskset, endpoint: str, addr: str, gate_agents: bool = False) -> int:
    """Once enough agents registered: the trainer command (yours, or the built-in scripted one,
    whose output joins the head's log); on the end-of-time signal, wait for the drain, then stop
    the trainer. `gate_agents` (a resumed run with your trainer): the trainer starts first and
    the agents are let in (`job.json`) once it is back, so the queued rollouts of its policy are
    not leased while its inference server is still down (each would burn a retry)."""
    rc = 0
    servers = {}
    if args.servers:
        print(f"paddock head: waiting for the model servers ({args.servers})", flush=True)
        try:
            servers = wait_servers(run_dir, parse_servers(args.servers), args.deployment, args.servers_wait_s)
        except ServerError as exc:
            raise JobStepError(str(exc)) from None
        print("paddock head: model servers up: " + "; ".join(
            f"{c}: {' '.join(r['url'] for r in recs)}" for c, recs in servers.items()), flush=True)
    builtin = not args.trainer
    # the built-in trainer (no shell between) keeps its policy server up through the job's
    # signals, ignored from its start: SIGINT stops it
    stop_signal = signal.SIGINT if builtin else signal.SIGTERM

    def start() -> subprocess.Popen:
        if builtin:
            return _start_trainer(builtin_trainer_argv(args, run_dir), run_dir, endpoint, args, taskset, addr,
                                  servers, out=sys.stdout, ignore=END_OF_TIME)
        return _start_trainer(args.trainer, run_dir, endpoint, args, taskset, addr, servers)
    with Client(endpoint, args.deployment, key_file=key_file_of(run_dir)) as client:
        trainer_proc = None
        try:
            if gate_agents:
                trainer_proc = start()
                _wait_trainer_back(client, trainer_proc, args.agents_wait_s)
                _publish_job(run_dir, args.deployment, addr)
            n = _wait_agents(client, args.agents, args.agents_wait_s)
            print(f"paddock head: {n} agents registered; training", flush=True)
            trainer_proc = trainer_proc or start()
            rc = trainer_proc.wait()
            print(f"paddock head: trainer exited with {rc}", flush=True)
        except StopRequested as stop:
            print(f"paddock head: {stop} before the time limit: waiting for agents to drain", flush=True)
            # the trainer (and the model server it runs) stays up until the running rollouts are
            # done: stopped first, it would fail them all as infrastructure errors (each a retry)
            _wait_drained(client, args.drain_timeout_s)
            if trainer_proc is not None:
                rc = _stop_trainer(trainer_proc, args.drain_timeout_s, stop_signal)
        finally:
            if trainer_proc is not None and trainer_proc.poll() is None:   # the head failed
                _stop_trainer(trainer_proc, 10.0, stop_signal)
    return rc


def _wait_trainer_back(client, proc: subprocess.Popen, timeout_s: float, clock=time.monotonic) -> None:
    """A resumed run's trainer is back once it watches its results (a trainer serves its policy
    before it reads what the policy produced); after `timeout_s`, or if it exited, go on anyway."""
    deadline = clock() + timeout_s
    while clock() < deadline and proc.poll() is None:
        if client.status().counters.get("watchers", 0) > 0:
            print("paddock head: the trainer is back (it watches its results): letting the agents in", flush=True)
            return
        time.sleep(0.2)
    print(f"paddock head: the trainer is not watching results after {timeout_s:.0f}s "
          f"(exit status {proc.poll()}): letting the agents in anyway", flush=True)


TRAINER_ENV = ("PADDOCK_ENDPOINT", "PADDOCK_DEPLOYMENT", "PADDOCK_RUN_DIR", "PADDOCK_KEY_FILE",
               "PADDOCK_TASKSET", "PADDOCK_TASKSET_HASH", "PADDOCK_TASKBANK", "PADDOCK_HEAD_ADDR",
               "PADDOCK_INCARNATION", "PADDOCK_QUARANTINE_FILE", "PADDOCK_SERVERS_FILE",
               "PADDOCK_INFERENCE_ENDPOINTS", "PADDOCK_JUDGE_ENDPOINTS", "PADDOCK_SERVICES_ENDPOINTS")


def _start_trainer(command: str | list[str], run_dir: Path, endpoint: str, args: HeadStep, taskset, addr: str,
                   servers: dict | None = None, out=None, ignore: tuple[signal.Signals, ...] = ()) -> subprocess.Popen:
    """The training command (a shell line, run by /bin/sh; or an argv) in its own process group on
    the head node, with what it needs to reach the farm in its environment (TRAINER_ENV); output
    to logs/trainer.log (or `out`). It starts with the end-of-time signals at their defaults (the
    head tells it), or with those of `ignore` ignored."""
    env = dict(os.environ, PADDOCK_ENDPOINT=endpoint, PADDOCK_DEPLOYMENT=args.deployment,
               PADDOCK_RUN_DIR=str(run_dir), PADDOCK_KEY_FILE=str(key_file_of(run_dir)),
               PADDOCK_TASKSET=taskset.name,
               PADDOCK_TASKSET_HASH=taskset.manifest_hash, PADDOCK_HEAD_ADDR=addr,
               PADDOCK_INCARNATION=incarnation())
    if args.bank:
        env["PADDOCK_TASKBANK"] = args.bank
    if servers:      # the job's model servers: $PADDOCK_INFERENCE_ENDPOINTS ... and servers.json
        env.update(endpoints_env(servers), PADDOCK_SERVERS_FILE=str(run_dir / SERVERS_FILE))
    env["PADDOCK_QUARANTINE_FILE"] = str(run_dir / "quarantine.json")
    log_f = out if out is not None else open(run_dir / "logs" / "trainer.log", "ab")
    argv = ["/bin/sh", "-c", command] if isinstance(command, str) else command
    print(f"paddock head: starting trainer: {command if isinstance(command, str) else shlex.join(command)}",
          flush=True)
    return subprocess.Popen(argv, env=env, stdout=log_f, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                            start_new_session=True, preexec_fn=lambda: _trainer_signals(ignore))


def _trainer_signals(ignore: tuple[signal.Signals, ...]) -> None:
    """In the trainer's child before exec: no signal blocked, the stop signals at their defaults
    (whatever the head inherited), then `ignore` ignored."""
    signal.pthread_sigmask(signal.SIG_SETMASK, [])
    for s in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP, signal.SIGQUIT, *END_OF_TIME):
        signal.signal(s, signal.SIG_DFL)
    for s in ignore:
        signal.signal(s, signal.SIG_IGN)


def _stop_trainer(proc: subprocess.Popen, timeout_s: float, how: signal.Signals = signal.SIGTERM,
                  clock=time.monotonic) -> int:
    """End of time: SIGTERM (`how`) to the trainer's process group (it may checkpoint), SIGKILL
    after `timeout_s`. A shell line's /bin/sh may die of the signal at once while the trainer it
    started is still writing its checkpoint: the stop waits for the whole process group, not only
    for its first process. Returns the exit code (0 if it exited cleanly on the signal)."""
    deadline = clock() + timeout_s
    try:
        os.killpg(proc.pid, how)
    except ProcessLookupError:
        pass
    try:
        rc = proc.wait(timeout=timeout_s)
        if not _group_gone(proc.pid, deadline, clock):
            raise subprocess.TimeoutExpired(proc.args, timeout_s)
    except subprocess.TimeoutExpired:
        log.warning("trainer did not exit %.0fs after %s: killing it", timeout_s, how.name)
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        rc = proc.wait()
        _group_gone(proc.pid, clock() + 10.0, clock)
    # /bin/sh itself may die of the SIGTERM while the trainer exits cleanly: both mean "stopped"
    print(f"paddock head: trainer stopped after the end-of-time signal (exit status {rc})", flush=True)
    return 0 if rc in (0, -how) else rc


def _group_gone(pgid: int, deadline: float, clock=time.monotonic, poll_s: float = 0.05) -> bool:
    """Wait until no process of the group `pgid` runs, or `deadline`; True if none runs."""
    while _group_alive(pgid):
        if clock() >= deadline:
            return False
        time.sleep(poll_s)
    return True


def _group_alive(pgid: int) -> bool:
    """Whether any process of the process group `pgid` still runs (zombies not counted)."""
    for pid in psutil.pids():
        with contextlib.suppress(OSError, psutil.Error):
            if os.getpgid(pid) == pgid and psutil.Process(pid).status() != psutil.STATUS_ZOMBIE:
                return True
    return False


def curriculum_path(run_dir: Path, bank: str) -> Path:
    return Path(bank) / "curriculum.sqlite" if bank else run_dir / "curriculum.sqlite"


def _spawn_controller(args: HeadStep, run_dir: Path, addr: str) -> subprocess.Popen:
    """`paddock controller` on this node's address. Slurm signals every process of the step; the
    controller must outlive the drain, so it starts with the end-of-time signals ignored. Your
    trainer may submit sampler requests: the controller samples from, and learns into, the
    curriculum kept with the bank (or with this run)."""
    argv = controller_argv(run_dir, args.deployment, args.heartbeat_interval_s, bind=f"tcp://{addr}:0",
                           metrics_port=args.metrics_port, metrics_addr=addr,   # the node's, not 0.0.0.0
                           curriculum_db=curriculum_path(run_dir, args.bank) if args.trainer else None)
    return spawn(argv, run_dir / "logs" / "controller.log",
                 ignore=(signal.SIGTERM, signal.SIGUSR1, signal.SIGUSR2))


# ----------------------------------------------------------------------------- agent step
def wait_endpoint(run_dir: Path, timeout_s: float, deployment: str | None = None,
                  clock=time.monotonic, poll_s: float = 0.2) -> tuple[str, dict]:
    """(endpoint, job.json) once the head of this run of the job (`deployment`, `incarnation()`)
    has published both, else JobStepError after timeout_s. A `job.json` of another deployment
    or of a previous run (a requeued job, an earlier job on this run directory) is waited past:
    its endpoint is stale; at the deadline it is named (check_job's message)."""
    deadline = clock() + timeout_s
    ep, job_file = run_dir / ENDPOINT_FILE, run_dir / JOB_FILE
    job = None
    while True:
        job = _read_job(job_file)
        if job is not None and (deployment is None or _this_run(job, deployment)) and ep.exists():
            return ep.read_text().strip(), job        # the head removed the stale one before job.json
        if clock() >= deadline:
            break
        time.sleep(poll_s)
    if job is not None and deployment is not None:
        check_job(job, deployment, job.get("agent_version"))
    raise JobStepError(
        f"no controller endpoint at {ep} after {timeout_s:.0f}s: the head step did not start "
        f"(see {run_dir}/logs/head.log), or {run_dir} is not on storage shared with "
        f"{socket.gethostname()}")


def _read_job(path: Path) -> dict | None:
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):   # not written yet (it is written atomically)
        return None


def _this_run(job: dict, deployment: str) -> bool:
    return job.get("deployment") == deployment and str(job.get("incarnation", "0")) == incarnation()


def check_job(job: dict, deployment: str, agent_version: str) -> None:
    if job.get("deployment") != deployment:
        raise JobStepError(f"the run directory belongs to deployment {job.get('deployment')!r}, "
                           f"this agent to {deployment!r}: two jobs share one run directory")
    if str(job.get("incarnation", "0")) != incarnation():
        raise JobStepError(f"the run directory holds run {job.get('incarnation', '0')} of this job, this agent "
                           f"belongs to run {incarnation()}: the head of this run did not start")
    if job.get("agent_version") != agent_version:
        raise JobStepError(f"agent version {agent_version} cannot join a controller of version "
                           f"{job.get('agent_version')}: install the same Paddock on every node")


def run_agent(args: AgentStep) -> int:
    """The agent step; returns the node agent's exit status (EXIT_GAVE_UP without a controller)."""
    run_dir = Path(args.run_dir).resolve()

    def on_signal(signum, _frame):
        raise StopRequested(signal.Signals(signum).name)
    for sig in (signal.SIGWINCH, signal.SIGTERM, signal.SIGUSR2):
        signal.signal(sig, on_signal)
    node = socket.gethostname()
    try:
        endpoint, job = wait_endpoint(run_dir, args.controller_wait_s, args.deployment)
        check_job(job, args.deployment, AGENT_VERSION)
    except JobStepError as exc:
        print(f"paddock agent on {node}: {exc}", file=sys.stderr, flush=True)
        return EXIT_GAVE_UP
    except StopRequested as s:
        print(f"paddock agent on {node}: {s} while waiting for the controller: exiting", flush=True)
        return 0
    share = f'{os.environ.get("SLURM_PROCID", "0")}/{os.environ.get("SLURM_NTASKS", "1")}'
    os.environ[HEALTH_DIR_ENV] = str(run_dir / "health")
    argv = agent_argv(run_dir, node, endpoint, args.deployment, slots=args.slots, image_store=args.image_store,
                      subid_share=share, heartbeat_interval_s=args.heartbeat_interval_s, sandbox=args.sandbox)
    print(f"paddock agent on {node}: joining {endpoint}", flush=True)
    return supervise_agent(argv, node, run_dir, endpoint, args)


def supervise_agent(argv: list[str], node: str, run_dir: Path, endpoint: str, args: AgentStep) -> int:
    """`paddock agent ARGV` as a child process, restarted with backoff when it exits unexpectedly
    (slurm/supervise.py); given up after too many failures: the node is drained at the controller
    and reported in `<run_dir>/health/<node>.supervisor.json`. The job's drain signal (SIGWINCH;
    submitit's SIGUSR2) and SIGTERM become one SIGTERM to the agent, which drains."""
    report_path = run_dir / "health" / f"{node}.supervisor.json"
    report_path.parent.mkdir(parents=True, exist_ok=True)

    def spawn() -> subprocess.Popen:
        # the agent dies with this step, as it did when it ran in the step's process: a step
        # that is killed loses its node's running rollouts, which the controller leases anew
        return subprocess.Popen(argv, stdin=subprocess.DEVNULL, preexec_fn=die_with_parent(signal.SIGKILL))

    def write(report) -> None:
        atomic_write(report_path, json.dumps(dataclasses.asdict(report), indent=1))

    def on_restart(report) -> None:
        print(f"paddock agent on {node}: restarting the agent (restart {report.restarts}; "
              f"last exit {report.failures[-1]['exit']})", flush=True)
        write(report)

    def on_fatal(report) -> None:
        print(f"paddock agent on {node}: {report.reason}; draining the node and reporting it in "
              f"{report_path}", file=sys.stderr, flush=True)
        write(report)
        try:
            with Client(endpoint, args.deployment, timeout_s=5, retries=2, key_file=key_file_of(run_dir)) as c:
                c.drain(node)
        except Exception as exc:  # the report is written; the controller may be gone
            log.warning("drain of %s at the controller failed: %s", node, exc)

    sup = Supervisor(node, spawn, Policy(max_failures=args.restart_max_failures, window_s=args.restart_window_s,
                                         backoff_base_s=args.restart_backoff_s),
                     on_fatal=on_fatal, on_restart=on_restart)
    for sig in (signal.SIGWINCH, signal.SIGTERM, signal.SIGUSR2):   # USR2: submitit's signal before the time limit
        signal.signal(sig, lambda signum, _f: sup.request_stop(signal.Signals(signum).name))
    return sup.run()


