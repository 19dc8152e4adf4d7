"""MCP for rollouts against the official MCP Python SDK's own server (`MCPServer`, which we did
not write) running inside a task's sandbox, over stdio and over streamable HTTP (uvicorn, with
the SDK's DNS-rebinding protection on): the harness's toolbox lists and calls its tools through
the SDK's clients, passes their generated JSON Schemas through and checks arguments against them.

The image is the built-in python image's root filesystem plus `pip install --target /opt/mcp` of
the pinned SDK (binary wheels for the image's python 3.11), built once per image store, keyed by
recipe. Building it needs the package index; running it needs no network.
"""
from __future__ import annotations

import json
import sys
import tempfile
from pathlib import Path

import pytest

from controller.contracts.tasks import LeaseTask
from layers import build
from layers.sif import read_sif
from nodeagent.agent.replay import ReplayModel
from nodeagent.harness.loop import run_agent
from nodeagent.harness.mcptools import McpRollout
from nodeagent.sandbox.runtime import SandboxSpec

pytestmark = [pytest.mark.sandbox, pytest.mark.slow]

REQUIREMENT = "mcp==2.3.0"
IMAGE_PYTHON = "3.11"                     # Debian bookworm's python3: the wheels must match it
TARGET = "/opt/mcp"
PIP_TIMEOUT_S = 900.0
PLATFORMS = tuple(f"manylinux_2_{m}_x86_64" for m in range(36, 4, -1)) + ("manylinux2014_x86_64", "manylinux1_x86_64")
RECIPE_RULES = 1

SERVER = r'''
import sys
sys.path.insert(0, "/opt/mcp")
from typing import Annotated
from pydantic import Field
from mcp.server.mcpserver import MCPServer

app = MCPServer("inventory")

@app.tool()
def stock(item: str, warehouse: Annotated[int, Field(ge=1, le=9)] = 1) -> str:
    """How many of an item a warehouse holds."""
    return f"{item}@{warehouse}: {len(item) * warehouse}"

if sys.argv[1] == "stdio":
    app.run()
else:
    app.run("streamable-http", host="127.0.0.1", port=int(sys.argv[2]), streamable_http_path="/mcp")
'''


def build_mcp_image(base_sif: Path, out_sif: Path, workdir: Path) -> None:
    with tempfile.TemporaryDirectory(prefix="mcp-image-", dir=workdir) as tmp:
        root = Path(tmp) / "rootfs"
        offset = read_sif(base_sif).primary_partition_offset
        build.run_command(["unsquashfs", "-q", "-n", "-o", str(offset), "-d", str(root), str(base_sif)],
                          PIP_TIMEOUT_S)
        build.run_command([sys.executable, "-m", "pip", "install", "-q", "--no-compile",
                           "--disable-pip-version-check", "--only-binary=:all:",
                           "--python-version", IMAGE_PYTHON, "--implementation", "cp",
                           *(a for p in PLATFORMS for a in ("--platform", p)),
                           "--target", str(root) + TARGET, REQUIREMENT], PIP_TIMEOUT_S)
        build.build_image(root, out_sif, workdir=workdir, metadata={"mcp": REQUIREMENT})


@pytest.fixture(scope="session")
def mcp_image(image_store, python_image):
    recipe = {"kind": "pip-mcp-sdk", "base": "sha256:" + Path(python_image).stem, "requirement": REQUIREMENT,
              "python": IMAGE_PYTHON, "target": TARGET, "rules": RECIPE_RULES,
              "build_rules": build.BUILD_RULES_VERSION}
    return image_store.build_or_reuse(
        recipe, lambda out: build_mcp_image(Path(python_image), out, image_store.root / "tmp"))[1]


def _step(i, *calls, content=""):
    return {"step": i, "role": "assistant", "content": content, "prompt_tokens": 1, "completion_tokens": 1,
            "tool_name": ",".join(c[0] for c in calls) or None, "logprobs": None,
            "tool_args": json.dumps([{"id": f"c{i}.{j}", "name": n, "arguments": a}
                                     for j, (n, a) in enumerate(calls)]) if calls else None}


class Recording:
    def __init__(self, steps):
        self.inner, self.payloads = ReplayModel(steps), []

    def complete(self, payload, timeout_s):
        self.payloads.append(json.loads(json.dumps(payload)))
        return self.inner.complete(payload, timeout_s)


def test_the_sdks_own_server_in_the_sandbox_over_stdio_and_streamable_http(runtime, mcp_image):
    config = {"servers": {"inv": {"transport": "stdio", "command": ["python3", "/work/inventory.py", "stdio"]},
                          "invh": {"transport": "http", "command": ["python3", "/work/inventory.py", "http", "8931"],
                                   "port": 8931, "path": "/mcp", "start_timeout_s": 60}}}
    task = LeaseTask.decode({"task_id": "sha256:" + "cd" * 32, "name": "mcp/sdk", "instruction": "count",
                             "files": {".paddock/mcp.json": json.dumps(config), "inventory.py": SERVER},
                             "tools": ["shell"], "budgets": {"max_steps": 5, "wall_s": 120}})
    mcp = McpRollout.of(task)
    sb = runtime.create(SandboxSpec(image=mcp_image, files=dict(task.files), egress_socket=mcp.relay(None),
                                    limits={"memory_mb": 512, "pids": 64, "disk_mb": 64, "nofile": 256}))
    try:
        toolbox = mcp.toolbox(sb, task)
        steps = [_step(0, ("mcp__inv__stock", '{"item": "bolt", "warehouse": 3}'),
                       ("mcp__invh__stock", '{"item": "nut"}'),
                       ("mcp__invh__stock", '{"item": "nut", "warehouse": 12}')),
                 _step(1, content="done")]
        model = Recording(steps)
        res = run_agent(sb, task.instruction, model, "m", 0, task.budgets, toolbox=toolbox)
        offered = {t["function"]["name"]: t["function"] for t in model.payloads[0]["tools"]}
        assert set(offered) == {"shell", "mcp__inv__stock", "mcp__invh__stock"}
        schema = offered["mcp__inv__stock"]["parameters"]
        assert schema["required"] == ["item"] and schema["properties"]["warehouse"]["maximum"] == 9
        assert offered["mcp__inv__stock"]["description"] == "How many of an item a warehouse holds."
        obs = res.steps[0]["observation"].split("\n")
        assert obs[0] == "bolt@3: 12" and obs[1] == "nut@1: 3"
        assert obs[2].startswith("error: invalid arguments for mcp__invh__stock at warehouse: 12 is greater")
    finally:
        mcp.close()
        sb.destroy()
