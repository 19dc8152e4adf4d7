"""`paddock launch` from Python: submit a Paddock job with submitit, watch it through accounting.

`launch(params) -> JobHandle` submits the single-component layout of slurm/sbatch.py (one task
per node: task 0 runs the head step, tasks 1.. run one node agent each, slurm/jobsteps.py) and
returns a handle whose state comes from Slurm accounting (`sacct`), so a job that dies is seen
as dead, not waited on forever. The command line is controller/cli/slurm.py.

Must not import: sqlite3 (the queue belongs to the controller process).
"""
from __future__ import annotations

import logging
import os
import socket
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import submitit

from slurm.components import SERVER_COMPONENTS
from slurm.jobsteps import AgentStep, HeadStep, check_run_dir, run_agent, run_head
from slurm.sbatch import DRAIN_SIGNAL_NUMBER, JobParams, ParamError, job_of, time_limit_s

log = logging.getLogger("paddock.job")

TERMINAL_STATES = ("COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "NODE_FAIL", "OUT_OF_MEMORY",
                   "BOOT_FAIL", "DEADLINE", "PREEMPTED", "REVOKED")


def job_task(p: JobParams) -> int:
    """What every task of a launched job runs: task 0 the head, the others one node agent each."""
    rank = submitit.JobEnvironment().global_rank
    logging.basicConfig(level=logging.INFO, format=f"%(asctime)s {socket.gethostname()} %(name)s "
                                                   "%(levelname)s %(message)s", force=True)
    common = {"run_dir": p.run_dir, "deployment": f"slurm-{os.environ.get('SLURM_JOB_ID', 'local')}",
              "image_store": p.image_store, "heartbeat_interval_s": p.heartbeat_interval_s}
    if rank == 0:
        rc = run_head(HeadStep(**common, agents=p.agents_needed, agents_wait_s=p.agents_wait_s,
                               drain_timeout_s=60.0, versions=p.versions, rollouts_per_task=p.rollouts_per_task,
                               tasks_limit=p.tasks_limit, taskset=p.taskset, bank=p.bank, trainer=p.trainer,
                               policy_script=p.policy_script, validate=p.validate))
    else:
        rc = run_agent(AgentStep(**common, slots=p.slots_per_node, controller_wait_s=p.controller_wait_s,
                                 sandbox=p.sandbox))
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
    p, comps = job_of(asdict(params) if isinstance(params, JobParams) else
                      dict({"layout": "single", "python": sys.executable}, **params))
    if p.layout != "single":
        raise ParamError("paddock launch submits the single-component layout (submitit cannot submit "
                         "heterogeneous jobs): pass layout=single, or use `paddock sbatch render layout=het`")
    if p.requeue:
        raise ParamError("paddock launch does not requeue its job (requeue=1): render the batch script with "
                         "`paddock sbatch render requeue=1 ...` and submit it with sbatch")
    for name in SERVER_COMPONENTS:
        if comps[name].nodes:
            raise ParamError(f"batch parameter '{name}.nodes': paddock launch runs the trainer and the farm only "
                             "(one submitit task per node); render a job with model servers with "
                             "`paddock sbatch render` and submit it with sbatch")
    node = comps["farm"]       # layout=single: every component asks for the same kind of node
    check_run_dir(Path(p.run_dir))
    ex = submitit.SlurmExecutor(folder=Path(p.run_dir) / "submitit", python=p.python)
    ex.update_parameters(job_name=p.job_name, time=max(time_limit_s(p.time_limit) // 60, 1),
                         nodes=p.env_nodes + 1, ntasks_per_node=1,
                         cpus_per_task=max(comps["trainer"].cpus_per_task, node.cpus_per_task),
                         # srun may not inherit --cpus-per-task (Slurm 22.05-23.02): with CPU
                         # binding each task would be pinned to one CPU
                         srun_args=[f"--cpus-per-task={max(comps['trainer'].cpus_per_task, node.cpus_per_task)}"],
                         partition=node.partition or None, account=node.account or None,
                         **({"gpus_per_node": node.gpus_per_node} if node.gpus_per_node else {}),
                         **({"gres": node.gres} if node.gres else {}),
                         **({"mem": node.mem} if node.mem else {}),
                         **({"qos": node.qos} if node.qos else {}),
                         **({"constraint": node.constraint} if node.constraint else {}),
                         # submitit would ask for USR2, which Slurm sends to every process of the
                         # step, sandboxes included (default action: die). The drain signal is
                         # ignored by default, so only the job steps, which handle it, react.
                         additional_parameters={"signal": f"{DRAIN_SIGNAL_NUMBER}@{p.signal_before_s}"})
    job = ex.submit(job_task, p)
    log.info("submitted job %s (run dir %s)", job.job_id, p.run_dir)
    return JobHandle(job, Path(p.run_dir))
