"""A real third-party harness from the package index, mini-swe-agent (2.x, which calls its model
through LiteLLM), installed into an image and driven by the scripted policy through the node's
gateway: the rollout is graded on the final state, and every `model_calls` row holds exactly the
token ids and logprobs the policy server sent.

The image is the built-in python image's root filesystem plus `pip install --target
/opt/mini-swe-agent` of the pinned harness and a `mini` wrapper on PATH that keeps it offline
(LiteLLM's bundled cost map, no first-run setup, its config dir in /tmp). It is built once per
store, keyed by recipe (base image digest, requirement, build rules), so later runs reuse it.
Building it needs the package index; running it needs no network.
"""
from __future__ import annotations

import json
import os
import sys
import tempfile
from pathlib import Path

import pytest

from controller.analysis.query import connect
from controller.contracts.tasks import Task
from controller.store.catalog import Catalog
from controller.taskbank.builtin import builtin_taskset
from layers import build
from layers.sif import read_sif
from nodeagent.agent.attempt import Attempt, run_attempt

pytestmark = [pytest.mark.sandbox, pytest.mark.slow]

REQUIREMENT = "mini-swe-agent==2.4.6"
IMAGE_PYTHON = "3.11"                     # Debian bookworm's python3: the wheels must match it
TARGET = "/opt/mini-swe-agent"
PIP_TIMEOUT_S = 900.0
# bookworm's glibc is 2.36: every manylinux tag up to it (pip does not expand manylinux_2_x itself)
PLATFORMS = tuple(f"manylinux_2_{m}_x86_64" for m in range(36, 4, -1)) + ("manylinux2014_x86_64", "manylinux1_x86_64")
RECIPE_RULES = 1                          # bump when the recipe below changes
WRAPPER = f"""#!/bin/sh
# mini-swe-agent ({REQUIREMENT}), installed with pip --target {TARGET}; offline settings.
export PYTHONPATH={TARGET}${{PYTHONPATH:+:$PYTHONPATH}}
export LITELLM_LOCAL_MODEL_COST_MAP=True MSWEA_CONFIGURED=true MSWEA_SILENT_STARTUP=1
export MSWEA_COST_TRACKING=ignore_errors MSWEA_GLOBAL_CONFIG_DIR=/tmp/mini-swe-agent
exec python3 -m minisweagent.run.mini "$@"
"""
# The harness command of the task: mini in yolo mode, exiting when the model submits.
MINI_ARGV = ("sh", "-c", 'exec mini --yolo --exit-immediately --model openai/scripted -c mini.yaml '
                         '-o /tmp/mini-swe-agent/traj.json --task "$(cat /work/.paddock/instruction.txt)"')

TASKSET = builtin_taskset()
PY_TASK = TASKSET.by_name()["python/reverse_words"]


def build_mini_image(base_sif: Path, out_sif: Path, workdir: Path) -> None:
    """The base image's tree + the harness (pip --target, binary wheels for the image's python)."""
    with tempfile.TemporaryDirectory(prefix="mini-image-", dir=workdir) as tmp:
        root = Path(tmp) / "rootfs"
        offset = read_sif(base_sif).primary_partition_offset
        build.run_command(["unsquashfs", "-q", "-n", "-o", str(offset), "-d", str(root), str(base_sif)],
                          PIP_TIMEOUT_S)
        build.run_command([sys.executable, "-m", "pip", "install", "-q", "--no-compile",
                           "--disable-pip-version-check", "--only-binary=:all:",
                           "--python-version", IMAGE_PYTHON, "--implementation", "cp",
                           *(a for p in PLATFORMS for a in ("--platform", p)),
                           "--target", str(root) + TARGET, REQUIREMENT], PIP_TIMEOUT_S)
        wrapper = root / "usr/local/bin/mini"
        wrapper.parent.mkdir(parents=True, exist_ok=True)
        wrapper.write_text(WRAPPER)
        os.chmod(wrapper, 0o755)
        build.build_image(root, out_sif, workdir=workdir, metadata={"harness": REQUIREMENT})


@pytest.fixture(scope="session")
def mini_image(image_store, python_image):
    base_digest = "sha256:" + Path(python_image).stem
    recipe = {"kind": "pip-harness", "base": base_digest, "requirement": REQUIREMENT,
              "python": IMAGE_PYTHON, "target": TARGET, "wrapper": WRAPPER, "rules": RECIPE_RULES,
              "build_rules": build.BUILD_RULES_VERSION}
    return image_store.build_or_reuse(
        recipe, lambda out: build_mini_image(Path(python_image), out, image_store.root / "tmp"))[1]


@pytest.fixture(scope="module")
def policy(solving_policy):
    return solving_policy


def mini_task() -> Task:
    fields = {f: getattr(PY_TASK, f) for f in PY_TASK.__dataclass_fields__}
    fields["harness"] = MINI_ARGV
    return Task(**fields)


def test_mini_swe_agent_solves_through_the_gateway_and_every_call_holds_the_served_ids(
        tmp_path, runtime, mini_image, policy):
    task = mini_task()
    lease = {**task.canonical(), "task_id": task.task_id}
    res = run_attempt(runtime, mini_image, "n1", Attempt("run", str(tmp_path), "r1", 1, 1, "b", 1, lease, 7,
                                                        policy.url, "scripted-v7"))
    with Catalog(tmp_path) as cat:
        cat.commit("r1", 1, 1, res.shards, 0.0)
    con = connect(tmp_path)
    stop, exit_code, log_tail = con.execute(
        "SELECT r.stop_reason, s.exit_code, s.observation FROM rollouts r JOIN steps s USING (rollout_id)").fetchone()
    assert (res.outcome, res.reward) == ("pass", 1.0), (res.infra_reason, log_tail)
    assert (stop, exit_code) == ("harness_exit", 0), log_tail
    rows = con.execute("SELECT response, prompt_token_ids, completion_token_ids, completion_logprobs, source, "
                       "status, request_tools FROM model_calls ORDER BY call_index").fetchall()
    assert len(rows) == 3                 # write the solution, run the visible tests, submit
    for response, prompt, completion, lps, source, status, tools in rows:
        assert (source, status) == ("harness", "ok")
        assert [t["function"]["name"] for t in json.loads(tools)] == ["bash"]       # mini's own tool
        assert policy.policy.served[json.loads(response)["id"]] == (prompt, completion, lps)
    last = json.loads(rows[-1][0])["choices"][0]["message"]["tool_calls"][0]["function"]["arguments"]
    assert json.loads(last)["command"] == "echo COMPLETE_TASK_AND_SUBMIT_FINAL_OUTPUT"
