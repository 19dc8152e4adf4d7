"""A training command for the Slurm job (`paddock sbatch render ... trainer="python3 slurm_trainer.py"`).

The head step runs it on the head node once enough node agents registered, with the farm's
coordinates in its environment: PADDOCK_ENDPOINT, PADDOCK_DEPLOYMENT, PADDOCK_RUN_DIR,
PADDOCK_TASKSET, PADDOCK_TASKSET_HASH, PADDOCK_TASKBANK, PADDOCK_HEAD_ADDR. Its exit code is the
job's. Before the time limit it gets SIGTERM (checkpoint and exit), once the agents have drained
(the rollouts they were running are done).

This one stands in for a real trainer: it serves the scripted policy of the built-in task set
(an OpenAI-compatible server; yours would be your inference server), publishes it as policy
version 0, asks for one scored rollout of the first PADDOCK_EXAMPLE_TASKS tasks (default 4) and
writes the rewards to $PADDOCK_RUN_DIR/trainer-result.json.
"""
import json
import os
import signal
import sys

from controller.client import BandRequest, Client
from controller.demo.policy_server import PolicyServer
from controller.farm.assemble import load_taskset


class EndOfTime(Exception):
    """SIGTERM from the head: the job's time is nearly up."""


def _end_of_time(signum, frame):
    raise EndOfTime()


def main() -> int:
    signal.signal(signal.SIGTERM, _end_of_time)
    taskset = load_taskset(os.environ["PADDOCK_TASKSET"], os.environ.get("PADDOCK_TASKBANK", ""))
    names = [t.name for t in taskset.tasks][: int(os.environ.get("PADDOCK_EXAMPLE_TASKS", "4"))]
    rewards, stopped = {}, False
    with PolicyServer(taskset, host=os.environ["PADDOCK_HEAD_ADDR"]) as policy, \
            Client(os.environ["PADDOCK_ENDPOINT"], os.environ["PADDOCK_DEPLOYMENT"]) as client:
        client.publish_policy(0, policy.url, model="scripted-v0")
        if os.environ.get("PADDOCK_EXAMPLE_SAMPLER"):      # let the controller's curriculum pick
            batch = client.submit(sampler=BandRequest(n_tasks=len(names), band=[0.2, 0.8], seed=0),
                                  n_per_task=1, policy=0)
        else:
            batch = client.submit(names, n_per_task=1, policy=0)
        try:
            for item in client.results(batch):
                if item["state"] == "committed":
                    rewards[item["task_ref"]] = item["reward"]
        except EndOfTime:
            stopped = True          # a real trainer saves a checkpoint here
    with open(os.path.join(os.environ["PADDOCK_RUN_DIR"], "trainer-result.json"), "w") as f:
        json.dump({"taskset_hash": os.environ["PADDOCK_TASKSET_HASH"], "rewards": rewards, "stopped": stopped}, f)
    print(f"{len(rewards)} scored rollouts of {len(names)} tasks" + (" (stopped at the time limit)" if stopped else ""),
          flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
