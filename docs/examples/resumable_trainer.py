"""A trainer that survives its own `kill -9`: run it again and it carries on where it died.

Each training step submits one batch under a key naming the step (a re-run of the step gets
the same batch back, never a second one) and folds every result into its state; the state
and the cursor of the last result folded in are checkpointed together, atomically, so after
a restart `results(batch, after=cursor)` yields exactly the results not yet folded in: none
twice, none skipped.

The farm's coordinates come from the environment: PADDOCK_RUN_DIR (the client finds the
controller through RUN_DIR/controller.endpoint, and follows it if the controller restarts on
another port), PADDOCK_DEPLOYMENT, PADDOCK_TASKS (comma-separated task refs),
TRAINER_CHECKPOINT (default ./trainer-checkpoint.json) and TRAINER_STEPS (default 3).
Tested by tests/client/test_client.py (killed at random moments, restarted until done).
"""
import json
import os
from pathlib import Path

from controller.client import Client

run_dir = os.environ["PADDOCK_RUN_DIR"]
deployment = os.environ["PADDOCK_DEPLOYMENT"]
tasks = os.environ.get("PADDOCK_TASKS", "python/fizzbuzz,python/gcd").split(",")
checkpoint = Path(os.environ.get("TRAINER_CHECKPOINT", "trainer-checkpoint.json"))
steps = int(os.environ.get("TRAINER_STEPS", "3"))


def save(state: dict) -> None:
    """Write the checkpoint atomically (a kill leaves the old one or the new one)."""
    tmp = checkpoint.with_name(checkpoint.name + ".tmp")
    with open(tmp, "w") as fh:
        json.dump(state, fh)
        fh.flush()
        os.fsync(fh.fileno())
    os.replace(tmp, checkpoint)


# --8<-- [start:loop]
state = json.loads(checkpoint.read_text()) if checkpoint.exists() else \
    {"step": 0, "cursor": 0, "seen": [], "reward_sum": 0.0}
with Client.for_run(run_dir, deployment) as client:
    client.publish_policy(1, "http://127.0.0.1:8000/v1", model="my-policy-v1")  # idempotent
    while state["step"] < steps:
        # The same key on every run of this step: a trainer killed inside submit() gets the
        # batch it had already made, not a second one.
        batch = client.submit(tasks, n_per_task=4, policy=1,
                              key=f"{Path(run_dir).name}/step-{state['step']}")
        for item in client.results(batch, after=state["cursor"]):
            state["seen"].append(item["rollout_id"])        # your training update goes here
            state["reward_sum"] += item["reward"] or 0.0
            state["cursor"] = item["cursor"]                # checkpointed with the update
            save(state)
        state.update(step=state["step"] + 1, cursor=0)      # the next step's batch
        save(state)
# --8<-- [end:loop]
print(f"done: {steps} steps, {len(state['seen'])} results, reward sum {state['reward_sum']:.1f}")
