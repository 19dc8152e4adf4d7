"""Slurm batch scripts for a Paddock job: one pure function renders them from validated parameters.

`render(params) -> str` is the whole contract. `JobParams` lists every valid parameter (its
fields); an unknown or invalid one raises `ParamError` naming it and listing the valid ones.
Every value that reaches the shell body is shell-quoted (`shlex.quote`); values that reach
`#SBATCH` lines (which sbatch parses itself, without a shell) are restricted to plain tokens.

Two layouts, the same job steps (`paddock job head` / `paddock job agent`, slurm/jobsteps.py):
  het     heterogeneous job: component 0 runs the head (controller + trainer) on one node,
          component 1 runs one node agent per environment node (srun --het-group=1).
  single  one component of env_nodes + 1 nodes: the head step on the first node, the agent
          step (one task per node) on the others.
The head publishes the controller's endpoint in the run directory (shared storage); agents
wait for it there and give up before the job's time runs out. `--signal=B:<SIG>@<secs>` reaches
the batch shell, which forwards SIGWINCH to both steps (Slurm signals every process of a step;
WINCH is ignored by default, so sandboxes are untouched): agents drain, the head stops the
training loop, waits for the drain and shuts the controller down (the store is flushed).
With `requeue=1` a preempted (or `scontrol requeue`d) job runs again under the same job id, on
the same run directory: the head resumes the run from its queue (slurm/jobsteps.py). The time
limit's warning is then USR1 (TERM is refused: scancel sends it too): the shell drains the farm
and requeues its own job (`scontrol requeue`), at most `max_requeues` times (SLURM_RESTART_COUNT);
a TERM drains and ends the job.

Must not import: zmq, sqlite3 (pure; used by `paddock sbatch render` and the launcher).
"""
from __future__ import annotations

import re
import shlex
from dataclasses import MISSING, asdict, dataclass, fields
from typing import Any, Mapping

from controller.contracts.liveness import HEARTBEAT_INTERVAL_S
from slurm.components import (
    COMPONENTS,
    SERVER_COMPONENTS,
    Component,
    ParamError,
    check_components,
    coerce_component_value,
    component_keys,
    sbatch_options,
    step_options,
    valid_component_keys,
    with_defaults,
)

LAYOUTS = ("het", "single")
VALIDATE_MODES = ("quick", "full", "off")
SANDBOXES = ("native", "apptainer")
SIGNALS = ("TERM", "USR1")   # the end-of-time warning; "" (the default): TERM, or USR1 with requeue=1
REQUEUE_SIGNAL = "USR1"      # requeue=1: the warning must not be TERM, which scancel sends too (and
                             # not USR2, submitit's)
REQUEUE_MARGIN_S = 10        # requeue=1: requeue anyway this long before the limit if the drain is not over
DRAIN_SIGNAL = "WINCH"    # forwarded to the job steps: ignored by default, handled by the steps
DRAIN_SIGNAL_NUMBER = 28  # SIGWINCH on Linux; scancel takes WINCH only by number
_TOKEN = re.compile(r"[A-Za-z0-9_.-]{1,64}")
_TIME = re.compile(r"(?:(\d+)-)?(\d{1,2}):(\d{2}):(\d{2})|(\d+)")


@dataclass(frozen=True)
class JobParams:
    run_dir: str                       # absolute path on storage shared by every node
    env_nodes: int                     # nodes that run one node agent each
    time_limit: str = "01:00:00"       # minutes, or [D-]HH:MM:SS
    layout: str = "het"                # het | single
    job_name: str = "paddock"
    partition: str = ""                # empty: the cluster's default partition
    account: str = ""
    slots_per_node: int = 2            # concurrent sandboxes per node agent
    head_cpus: int = 1                 # CPUs of the head (controller + trainer) task
    agent_cpus: int = 1                # CPUs of each node agent task
    signal: str = ""                   # sent to the batch shell before the time limit: TERM | USR1
                                       # ("": TERM, or USR1 with requeue=1)
    signal_before_s: int = 120         # ... this many seconds before it
    controller_wait_s: int = 300       # agents give up if the endpoint has not appeared by then
    agents_wait_s: int = 300           # the head gives up if too few agents registered by then
    min_agents: int = 0                # agents that must register before training (0: env_nodes)
    versions: int = 2                  # policy versions the trainer runs
    rollouts_per_task: int = 1
    tasks_limit: int = 0               # 0: every task of the set
    taskset: str = "builtin"           # the task set served: "builtin", or one stored in `bank`
    bank: str = ""                     # the task bank directory (shared storage), for a stored task set
    trainer: str = ""                  # your training command (run by /bin/sh on the head node once the
                                       # agents registered; env PADDOCK_ENDPOINT, ...); "": the built-in one
    policy_script: str = ""            # the built-in trainer's swe scripts (controller/demo/swe_policy.py)
    heartbeat_interval_s: float = HEARTBEAT_INTERVAL_S
    image_store: str = "/var/tmp/paddock/images"
    python: str = "python3"            # interpreter with Paddock installed (the venv's)
    requeue: int = 0                   # 1: --requeue (preempted or failed: back to the queue; the next
                                       # run resumes from the run directory's queue), and at the time
                                       # limit's warning the job drains and requeues itself; 0: Slurm's default
    max_requeues: int = 10             # requeue=1: the job requeues itself while SLURM_RESTART_COUNT is below this
    validate: str = "quick"            # quick | full | off: the head validates the task set first, as
                                       # `paddock run` does (quarantined tasks are not served)
    sandbox: str = "native"            # native | apptainer: the node agents' sandbox backend

    def __post_init__(self) -> None:
        def bad(name: str, why: str) -> ParamError:
            return ParamError(f"batch parameter {name!r} {why}; valid parameters: {valid_parameters()}")
        for f in fields(self):
            v = getattr(self, f.name)
            want = {"int": int, "float": (int, float), "str": str}[f.type]
            if isinstance(v, bool) or not isinstance(v, want):
                raise bad(f.name, f"must be {f.type}, got {v!r}")
        if self.layout not in LAYOUTS:
            raise bad("layout", f"must be one of {', '.join(LAYOUTS)}, got {self.layout!r}")
        if self.validate not in VALIDATE_MODES:
            raise bad("validate", f"must be one of {', '.join(VALIDATE_MODES)}, got {self.validate!r}")
        if self.sandbox not in SANDBOXES:
            raise bad("sandbox", f"must be one of {', '.join(SANDBOXES)}, got {self.sandbox!r}")
        if self.signal not in ("",) + SIGNALS:
            raise bad("signal", f"must be one of {', '.join(SIGNALS)}, got {self.signal!r}")
        for name in ("run_dir", "image_store", "python"):
            v = getattr(self, name)
            if not v or "\0" in v or "\n" in v:
                raise bad(name, "must be a non-empty path without NUL or newline")
        for name in ("run_dir", "image_store"):
            if not getattr(self, name).startswith("/"):
                raise bad(name, f"must be an absolute path (every node resolves it), got {getattr(self, name)!r}")
        if self.taskset != "builtin" and not _TOKEN.fullmatch(self.taskset):
            raise bad("taskset", f"must be 'builtin' or a task set name of [A-Za-z0-9_.-], got {self.taskset!r}")
        for name in ("bank", "policy_script"):
            v = getattr(self, name)
            if v and (not v.startswith("/") or "\0" in v or "\n" in v):
                raise bad(name, f"must be an absolute path (every node resolves it), got {v!r}")
        if self.taskset != "builtin" and not self.bank:
            raise bad("bank", f"must name the task bank that holds taskset={self.taskset!r}")
        if "\0" in self.trainer or "\n" in self.trainer:
            raise bad("trainer", "must be one command line (no NUL or newline)")
        for name in ("job_name", "partition", "account"):
            v = getattr(self, name)
            if v and not _TOKEN.fullmatch(v):
                raise bad(name, f"must be 1-64 characters of [A-Za-z0-9_.-], got {v!r}")
        if not self.job_name:
            raise bad("job_name", "must not be empty")
        for name in ("env_nodes", "slots_per_node", "head_cpus", "agent_cpus", "versions",
                     "rollouts_per_task", "controller_wait_s", "agents_wait_s"):
            if getattr(self, name) < 1:
                raise bad(name, f"must be >= 1, got {getattr(self, name)!r}")
        for name in ("min_agents", "tasks_limit", "signal_before_s"):
            if getattr(self, name) < 0:
                raise bad(name, f"must be >= 0, got {getattr(self, name)!r}")
        if self.requeue not in (0, 1):
            raise bad("requeue", f"must be 0 or 1, got {self.requeue!r}")
        if self.requeue and self.signal == "TERM":
            raise bad("signal", f"must not be TERM with requeue=1: scancel sends TERM too, and the job "
                                f"must tell the time limit's warning (drain, then requeue) from a cancel "
                                f"(drain and end); leave it unset or give {REQUEUE_SIGNAL}")
        if self.max_requeues < 0:
            raise bad("max_requeues", f"must be >= 0, got {self.max_requeues!r}")
        if self.min_agents > self.env_nodes:
            raise bad("min_agents", f"must not exceed env_nodes={self.env_nodes}")
        if self.heartbeat_interval_s <= 0:
            raise bad("heartbeat_interval_s", "must be > 0")
        limit_s = time_limit_s(self.time_limit)
        if limit_s is None:
            raise bad("time_limit", f"must be minutes or [D-]HH:MM:SS, got {self.time_limit!r}")
        if self.signal_before_s >= limit_s:
            raise bad("signal_before_s", f"must be below the time limit ({limit_s}s)")
        for name in ("controller_wait_s", "agents_wait_s"):
            if getattr(self, name) >= limit_s - self.signal_before_s:
                raise bad(name, f"must be below time_limit - signal_before_s "
                                f"({limit_s - self.signal_before_s}s), so the job gives up before its time runs out")

    @classmethod
    def from_mapping(cls, params: Mapping[str, Any]) -> "JobParams":
        known = {f.name for f in fields(cls)}
        unknown = sorted(set(params) - known)
        if unknown:
            raise ParamError(f"unknown batch parameter {unknown[0]!r}; valid parameters: {valid_parameters()}")
        missing = [f.name for f in fields(cls) if f.default is MISSING and f.name not in params]
        if missing:
            raise ParamError(f"missing batch parameter {missing[0]!r}; valid parameters: {valid_parameters()}")
        return cls(**params)

    @property
    def agents_needed(self) -> int:
        return self.min_agents or self.env_nodes

    @property
    def warning_signal(self) -> str:
        """The signal of `--signal=B:<SIG>@<secs>`: the one given, else USR1 with requeue=1, else TERM."""
        return self.signal or (REQUEUE_SIGNAL if self.requeue else "TERM")


def valid_parameters() -> str:
    return ", ".join(f.name for f in fields(JobParams)) + "; " + valid_component_keys()


def job_of(params: Mapping[str, Any]) -> tuple[JobParams, dict[str, Component]]:
    """(JobParams, {component: Component}) of a job description: JobParams' keys, plus
    `components: {name: {key: value}}` (YAML) and `name.key` (command line) for the components.
    The job's own keys are the components' defaults: env_nodes -> farm.nodes, head_cpus ->
    trainer.cpus_per_task, agent_cpus -> farm.cpus_per_task, partition and account -> each's."""
    m = dict(params)
    nested = m.pop("components", None)
    dotted = {k: m.pop(k) for k in list(m) if "." in k}
    farm_nodes = dotted.get("farm.nodes", ((nested or {}).get("farm") or {}).get("nodes")
                            if isinstance(nested, Mapping) else None)
    if "env_nodes" not in m and farm_nodes is not None:
        m["env_nodes"] = farm_nodes
    elif "env_nodes" in m and farm_nodes is not None and farm_nodes != m["env_nodes"]:
        raise ParamError(f"batch parameter 'farm.nodes' ({farm_nodes!r}) differs from env_nodes "
                         f"({m['env_nodes']!r}): give one of them; valid parameters: {valid_parameters()}")
    p = JobParams.from_mapping(m)
    comps = component_keys(nested, dotted, {
        "trainer": {"nodes": 1, "cpus_per_task": p.head_cpus},
        "farm": {"nodes": p.env_nodes, "cpus_per_task": p.agent_cpus}})
    comps = {n: with_defaults(c, partition=p.partition, account=p.account) for n, c in comps.items()}
    check_components(comps, time_limit_s(p.time_limit), time_limit_s, p.layout)
    budget = time_limit_s(p.time_limit) - p.signal_before_s
    for name in SERVER_COMPONENTS:
        if comps[name].nodes and comps[name].ready_wait_s >= budget:
            raise ParamError(f"batch parameter '{name}.ready_wait_s' ({comps[name].ready_wait_s}) must be below "
                             f"time_limit - signal_before_s ({budget}s), so the job gives up before its time runs out; "
                             f"valid: {valid_component_keys()}")
    return p, comps


def time_limit_s(text: str) -> int | None:
    """Seconds of a Slurm time limit given as minutes or [D-]HH:MM:SS; None if malformed."""
    m = _TIME.fullmatch(text.strip()) if isinstance(text, str) else None
    if not m:
        return None
    if m.group(5) is not None:
        return int(m.group(5)) * 60 or None
    d, h, mi, s = (int(g or 0) for g in m.group(1, 2, 3, 4))
    if mi >= 60 or s >= 60:
        return None
    return (d * 86400 + h * 3600 + mi * 60 + s) or None


def coerce(params: Mapping[str, str]) -> dict[str, Any]:
    """KEY=VALUE strings (from a command line) -> typed values per JobParams field types."""
    types = {f.name: f.type for f in fields(JobParams)}
    out: dict[str, Any] = {}
    for k, v in params.items():
        if "." in k:
            out[k] = coerce_component_value(k, v)
            continue
        if k not in types:
            raise ParamError(f"unknown batch parameter {k!r}; valid parameters: {valid_parameters()}")
        try:
            out[k] = {"int": int, "float": float, "str": str}[types[k]](v)
        except ValueError:
            raise ParamError(f"batch parameter {k!r} must be {types[k]}, got {v!r}; "
                             f"valid parameters: {valid_parameters()}") from None
    return out


# ----------------------------------------------------------------------------- rendering
def render(params: Mapping[str, Any] | JobParams) -> str:
    """The batch script text for `params` (a job description: JobParams fields and components,
    see `job_of`; or a JobParams)."""
    p, comps = job_of(asdict(params) if isinstance(params, JobParams) else params)
    q = shlex.quote
    present = [n for n in COMPONENTS if comps[n].nodes]
    servers = [n for n in SERVER_COMPONENTS if comps[n].nodes]
    header = ["#!/bin/bash", f"# Paddock job ({p.layout} layout), rendered by slurm/sbatch.py: do not edit.",
              "# components: " + ", ".join(f"{n} ({comps[n].nodes} node{'s' * (comps[n].nodes > 1)})" for n in present)]
    common = [f"#SBATCH --job-name={p.job_name}", f"#SBATCH --time={p.time_limit}",
              f"#SBATCH --signal=B:{p.warning_signal}@{p.signal_before_s}"]
    # a requeued job runs the script again: its output is appended to, not truncated
    common += ["#SBATCH --requeue", "#SBATCH --open-mode=append"] if p.requeue else []
    srun: dict[str, str] = {}
    if p.layout == "het":
        # one component per kind of node: each gets its own nodes, CPUs, GPUs, memory, partition...
        sbatch = list(common)
        for k, name in enumerate(present):
            c = comps[name]
            tasks = ["--ntasks=1"] if name == "trainer" else ["--ntasks-per-node=1"]
            sbatch += (["#SBATCH hetjob"] if k else []) + [f"#SBATCH --nodes={c.nodes}"] + [
                f"#SBATCH {o}" for o in tasks + sbatch_options(c)]
            srun[name] = " ".join(["srun", f"--het-group={k}", f"--nodes={c.nodes}", *tasks, *step_options(c)])
        place = []
    else:
        # one kind of node (check_components): the steps share the job's nodes, in component order
        first = comps[present[0]]
        widest = max(comps[n].cpus_per_task for n in present)
        total = sum(comps[n].nodes for n in present)
        sbatch = common + [f"#SBATCH --nodes={total}", "#SBATCH --ntasks-per-node=1"] + [
            f"#SBATCH {o}" for o in sbatch_options(Component(
                nodes=total, cpus_per_task=widest, **{k: getattr(first, k) for k in (
                    "gpus_per_node", "gres", "mem", "partition", "qos", "constraint", "account", "time")}))
            if not o.startswith("--time=")]
        place = ['NODES=($(scontrol show hostnames "$SLURM_JOB_NODELIST"))',
                 'HEAD_NODE=${NODES[0]}',
                 '# the nodes of a component: nodes_of FIRST COUNT (comma-separated)',
                 'nodes_of() { local IFS=,; echo "${NODES[*]:$1:$2}"; }']
        offset = 0
        for name in present:
            c = comps[name]
            if name == "trainer":
                where = ['--ntasks=1', '--nodelist="$HEAD_NODE"']
            else:
                where = [f"--ntasks={c.nodes}", "--ntasks-per-node=1", f'--nodelist="$(nodes_of {offset} {c.nodes})"']
            srun[name] = " ".join(["srun", f"--nodes={c.nodes}", *where, *step_options(c)])
            offset += c.nodes
    settings = [
        f"RUN_DIR={q(p.run_dir)}", f"PY={q(p.python)}", f"IMAGE_STORE={q(p.image_store)}",
        'DEPLOYMENT="slurm-${SLURM_JOB_ID}"',
    ]
    settings += ["START_S=$(date +%s)"] if p.requeue else []
    head_args = [
        "--run-dir", '"$RUN_DIR"', "--deployment", '"$DEPLOYMENT"', "--image-store", '"$IMAGE_STORE"',
        "--agents", q(str(p.agents_needed)), "--agents-wait-s", q(str(p.agents_wait_s)),
        "--versions", q(str(p.versions)), "--rollouts-per-task", q(str(p.rollouts_per_task)),
        "--tasks-limit", q(str(p.tasks_limit)), "--heartbeat-interval-s", q(str(p.heartbeat_interval_s)),
    ]
    head_args += ["--taskset", q(p.taskset)] if p.taskset != "builtin" else []
    head_args += ["--bank", q(p.bank)] if p.bank else []
    head_args += ["--trainer", q(p.trainer)] if p.trainer else []
    head_args += ["--policy-script", q(p.policy_script)] if p.policy_script else []
    head_args += ["--validate", q(p.validate)] if p.validate != "quick" else []
    if servers:
        head_args += ["--servers", q(",".join(f"{n}={comps[n].nodes}" for n in servers)),
                      "--servers-wait-s", q(str(max(comps[n].ready_wait_s for n in servers)))]
    agent_args = [
        "--run-dir", '"$RUN_DIR"', "--deployment", '"$DEPLOYMENT"', "--image-store", '"$IMAGE_STORE"',
        "--slots", q(str(p.slots_per_node)), "--controller-wait-s", q(str(p.controller_wait_s)),
        "--heartbeat-interval-s", q(str(p.heartbeat_interval_s)),
    ]
    agent_args += ["--sandbox", q(p.sandbox)] if p.sandbox != "native" else []
    server_steps = []
    for name in servers:
        c = comps[name]
        args = ["--component", name, "--run-dir", '"$RUN_DIR"', "--deployment", '"$DEPLOYMENT"',
                "--port", q(str(c.port)), "--health", q(c.health), "--ready-wait-s", q(str(c.ready_wait_s))]
        args += ["--reload", q(c.reload)] if c.reload else []
        args += ["--command", q(c.command)]
        server_steps += [
            f'{srun[name]} "$PY" -m controller.cli job server {" ".join(args)} \\',
            f'  >>"$RUN_DIR/logs/{name}.log" 2>&1 &',
            'SERVER_PIDS="$SERVER_PIDS $!"']
    if server_steps:
        server_steps = ["# model servers (and judges, services) on their own nodes: each publishes its endpoint",
                        "# in $RUN_DIR/servers/ once healthy; the head waits for them, and stops them at the end",
                        "SERVER_PIDS=", *server_steps]
    head_srun, agent_srun = srun["trainer"], srun["farm"]
    body = [
        "",
        *settings,
        "",
        "# The run directory must be writable here; every node must see it (shared storage).",
        'if ! mkdir -p "$RUN_DIR/logs" || ! touch "$RUN_DIR/logs/.writable"; then',
        '  echo "paddock: run directory $RUN_DIR is not writable from $(hostname)" >&2',
        "  exit 2",
        "fi",
        *place,
        "",
        *server_steps,
        f'{head_srun} "$PY" -m controller.cli job head {" ".join(head_args)} \\',
        '  >>"$RUN_DIR/logs/head.log" 2>&1 &',
        "HEAD_PID=$!",
        f'{agent_srun} "$PY" -m controller.cli job agent {" ".join(agent_args)} \\',
        '  >>"$RUN_DIR/logs/agents.log" 2>&1 &',
        "AGENTS_PID=$!",
        "",
        *(_requeue_ending(p) if p.requeue else _plain_ending(p)),
    ]
    return "\n".join(header + sbatch + body) + "\n"


_FORWARD_COMMENT = [
    "# The end-of-time signal reaches this shell (--signal=B:...). Slurm delivers a step signal to",
    f"# every process of the step (sandboxes too), so it goes on as SIG{DRAIN_SIGNAL}, which processes",
    "# ignore by default and the job steps handle: agents drain, the head stops training, waits",
    "# for the drain and flushes the store. (A signal to srun itself would abort its step.)",
]
_WAIT_HEAD = [
    "# wait returns early (>128) when the trap runs: wait again until the step has exited",
    'while :; do wait "$HEAD_PID"; HEAD_RC=$?; kill -0 "$HEAD_PID" 2>/dev/null || break; done',
    "# the head has stopped the controller: agents still waiting for one are told to give up",
]
_WAIT_AGENTS = ['while :; do wait "$AGENTS_PID"; kill -0 "$AGENTS_PID" 2>/dev/null || break; done',
                '# server steps (if any) stop once the head has written servers/stop (or on scancel)',
                'for pid in ${SERVER_PIDS:-}; do while :; do wait "$pid"; kill -0 "$pid" 2>/dev/null || break; done; done',
                'echo "paddock: head exited with $HEAD_RC"']


def _plain_ending(p: JobParams) -> list[str]:
    """requeue=0: the warning drains the farm and the job ends."""
    return [
        *_FORWARD_COMMENT,
        f'forward() {{ echo "paddock: SIG{p.warning_signal} before the time limit: draining"; '
        f'scancel --signal={DRAIN_SIGNAL_NUMBER} "$SLURM_JOB_ID"; }}',
        f"trap forward {p.warning_signal}",
        *_WAIT_HEAD,
        '[ "$HEAD_RC" -eq 0 ] || scancel --signal=TERM "$SLURM_JOB_ID"',
        *_WAIT_AGENTS,
        'exit "$HEAD_RC"',
    ]


def _requeue_ending(p: JobParams) -> list[str]:
    """requeue=1: the warning (its own signal, USR1) drains the farm, then the job requeues
    itself (at most max_requeues restarts); TERM (scancel, or Slurm requeueing or preempting the
    job) drains and ends. A watchdog requeues anyway REQUEUE_MARGIN_S before the time limit if
    the drain is not over by then (the queue keeps what was committed)."""
    sig, cap, margin = p.warning_signal, p.max_requeues, REQUEUE_MARGIN_S
    return [
        *_FORWARD_COMMENT,
        f"# SIG{sig} (the warning) drains, then requeues this job: the run resumes from its queue in the",
        f"# next allocation (at most {cap} restarts: SLURM_RESTART_COUNT counts every requeue). SIGTERM",
        "# (scancel; Slurm requeueing or preempting the job itself) drains and ends: no requeue from here.",
        "requeue_job() {",
        "  REQUEUED=1",
        f'  echo "paddock: requeueing job $SLURM_JOB_ID (restart $((${{SLURM_RESTART_COUNT:-0}} + 1)) of at most {cap}): '
        'the next run resumes the run in $RUN_DIR"',
        '  scontrol requeue "$SLURM_JOB_ID"',
        "}",
        f"# when the drain is not over {margin}s before the time limit, requeue anyway (leased rollouts",
        "# are leased anew by the next run); the end time is Slurm's, else the rendered limit's",
        "watchdog() {",
        '  trap \'kill "$SLEEP_PID" 2>/dev/null; exit 0\' TERM',
        '  end=$(date -d "$(squeue -h -j "$SLURM_JOB_ID" -o %e | head -n 1)" +%s 2>/dev/null) '
        f'|| end=$((START_S + {time_limit_s(p.time_limit)}))',
        f'  left=$((end - {margin} - $(date +%s))); [ "$left" -gt 0 ] || left=0',
        '  sleep "$left" & SLEEP_PID=$!',
        '  wait "$SLEEP_PID" || exit 0',
        f'  echo "paddock: the drain is not over {margin}s before the time limit: requeueing now"',
        "  requeue_job",
        "}",
        "forward() {",
        '  [ -z "${REQUEUED:-}" ] || exit 0           # the TERM of our own requeue: this run is over',
        "  ENDING=1",
        '  if [ "$1" = TERM ]; then',
        '    echo "paddock: SIGTERM (scancel, or Slurm ends or requeues the job): draining; not requeueing"',
        '    REQUEUE=; [ -z "${WATCHDOG_PID:-}" ] || kill "$WATCHDOG_PID" 2>/dev/null',
        f'  elif [ -z "${{HEAD_DONE:-}}" ] && [ -z "${{REQUEUE:-}}" ] && [ "${{SLURM_RESTART_COUNT:-0}}" -ge {cap} ]; then',
        f'    echo "paddock: SIG{sig} before the time limit: draining; job $SLURM_JOB_ID was requeued '
        f'${{SLURM_RESTART_COUNT:-0}} times (max_requeues={cap}): it ends here, the run stays in $RUN_DIR '
        '(resume it with a new job on that run_dir)"',
        '  elif [ -z "${HEAD_DONE:-}" ] && [ -z "${REQUEUE:-}" ]; then',
        f'    echo "paddock: SIG{sig} before the time limit: draining, then requeueing"',
        '    REQUEUE=1; watchdog & WATCHDOG_PID=$!',
        "  fi",
        f'  scancel --signal={DRAIN_SIGNAL_NUMBER} "$SLURM_JOB_ID"',
        "}",
        f"trap 'forward {sig}' {sig}",
        "trap 'forward TERM' TERM",
        *_WAIT_HEAD,
        "# (not once this shell was signalled: the steps were too, and a requeued job's id may",
        "# already name its next run)",
        '[ "$HEAD_RC" -eq 0 ] || [ -n "${ENDING:-}" ] || scancel --signal=TERM "$SLURM_JOB_ID"',
        "HEAD_DONE=1",
        *_WAIT_AGENTS,
        'if [ -n "${REQUEUE:-}" ]; then',
        '  if ! kill "$WATCHDOG_PID" 2>/dev/null; then exit 0; fi   # the watchdog requeued the job',
        '  if [ "$HEAD_RC" -eq 0 ]; then requeue_job; exit 0; fi',
        '  echo "paddock: the head failed (exit $HEAD_RC) after the warning: not requeueing; see $RUN_DIR/logs"',
        "fi",
        'exit "$HEAD_RC"',
    ]


# ----------------------------------------------------------------------------- job files
def load_job_file(path: str) -> dict[str, Any]:
    """A job description (YAML): JobParams' keys at the top, `components:` for the components
    (docs/operations.md shows one for a GPU cluster). ParamError names a file that is not one."""
    import yaml
    try:
        with open(path) as f:
            data = yaml.safe_load(f)
    except OSError as exc:
        raise ParamError(f"job description {path}: {exc.strerror or exc}") from None
    except yaml.YAMLError as exc:
        raise ParamError(f"job description {path} is not YAML: {exc}") from None
    if not isinstance(data, dict):
        raise ParamError(f"job description {path} must be a mapping of batch parameters, got {type(data).__name__}")
    return data


# ----------------------------------------------------------------------------- KEY=VALUE
def parse_assignments(items: list[str]) -> dict[str, str]:
    """`["env_nodes=4", ...]` (the command line's KEY=VALUE words) -> {key: text}; see `coerce`."""
    out = {}
    for item in items:
        key, sep, value = item.partition("=")
        if not sep:
            raise ParamError(f"expected KEY=VALUE, got {item!r}; valid parameters: {valid_parameters()}")
        out[key.strip()] = value
    return out
