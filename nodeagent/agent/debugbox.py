"""One task's rollout sandbox, for a person: `paddock sandbox debug TASK`.

`debug_sandbox(runtime, image, task)` makes the sandbox a rollout of `task` gets, through the
attempt pipeline's own steps (`nodeagent.agent.attempt`): the task decoded and its content
fetched by digest as on a lease (`_task_of`), its layers and set-up layer
(`task_sandbox_layers`: built once per task and image, reused), and the spec `rollout_spec`
builds — image, limits, visible files, layers — the one `agentphase.run_agent_phase` acquires. The task's
network policy is the rollout's: its egress proxy socket when it allows hosts, no route when
it is `none`. The relay of the sandbox is a `nodeagent.harness.sandboxlink.SandboxLink` whose
other connections are that proxy (or refused): the shell comes back through it, as the
browser's DevTools channel does, and the shell's environment loses the proxy variables a
task without network never has. A task that declares MCP servers (`.paddock/mcp.json`) gets them
started as in a rollout (`nodeagent.harness.mcptools.McpRollout`), and its relay is theirs.

`shell(box, stdin_fd, stdout_fd, interactive)` runs `sh` in the sandbox behind a link: on a
pseudo-terminal where the sandbox has one, else on pipes (a native sandbox mounts no /dev/pts;
a rollout has none either); when stdin is not a terminal the commands are read from it.
`replay_calls(box, steps)` runs a recorded rollout's tool calls (the `steps` rows' `tool_args`)
through the harness's own `Toolbox`, in order, and yields each observation.

On exit the link, the sandbox (processes, mounts, cgroup) and the egress registration are gone.
Must not import: zmq, nodeagent.agent.daemon.
"""
from __future__ import annotations

import json
import os
import select
import socket
import uuid
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterator

from controller.contracts.tasks import LeaseTask
from nodeagent.agent.attempt import _task_of, task_sandbox_layers
from nodeagent.agent.core import Attempt
from nodeagent.egress import proxy as egress
from nodeagent.harness.mcptools import McpRollout, McpToolbox
from nodeagent.harness.sandboxlink import SandboxLink, frame
from nodeagent.harness.tools import Toolbox, ToolResult
from nodeagent.sandbox.runtime import SandboxRuntime, SandboxSpec
from nodeagent.verifier.grade import as_bytes

SHELL_TAG = "debug-shell"


def rollout_spec(image: Path, task: LeaseTask, relay: str | None, layers: tuple[Path, ...]) -> SandboxSpec:
    """The agent sandbox's spec of a rollout of `task` (what `agentphase.run_agent_phase` acquires)."""
    return SandboxSpec(image=image, limits=dict(task.limits), files={k: as_bytes(v) for k, v in task.files.items()},
                       egress_socket=relay, layers=layers)


@dataclass
class DebugBox:
    sandbox: Any
    task: LeaseTask
    spec: SandboxSpec
    link: SandboxLink
    egress_socket: str | None      # the task's egress proxy socket (None: network "none")
    toolbox: Any = None            # the rollout's tools (with its MCP servers' when it declares some)

    @property
    def relayed(self) -> bool:
        """A rollout of this task has a relay (egress, or its MCP servers' links): its commands
        see the proxy variables; else they do not, and neither does the shell."""
        return self.egress_socket is not None or isinstance(self.toolbox, McpToolbox)

    def facts(self) -> dict:
        """What this sandbox is, for the person at the shell (and the tests)."""
        sb = self.sandbox
        return {"task": self.task.name, "task_id": self.task.task_id, "image": str(self.spec.image),
                "image_digest": self.task.image_digest, "layers": [str(p) for p in self.spec.layers],
                "setup": list(self.task.setup), "files": sorted(self.task.files),
                "limits": dict(self.spec.limits), "network": self.task.network
                if isinstance(self.task.network, str) else list(self.task.network),
                "sandbox": sb.id, "init_pid": sb.init_pid_host, "cgroup": sb.cgroup_paths,
                "link_dir": os.path.dirname(self.link.path),
                "state_dir": getattr(sb.runtime, "state_dir", None)}


@contextmanager
def debug_sandbox(runtime: SandboxRuntime, image: Path, task: dict | LeaseTask) -> Iterator[DebugBox]:
    """The task's rollout sandbox (see the module doc); everything of it is gone on exit.
    Raises TaskError (the task), SetupError (its set-up failed), SandboxError, PolicyError."""
    probe = Attempt(run_id="debug", run_dir="", rollout_id="debug", attempt=0, token=0, batch_id="debug",
                    seed=0, task=task, policy_version=0, endpoint="", model="")   # type: ignore[arg-type]
    lease = _task_of(probe)
    layers = task_sandbox_layers(runtime, image, lease)
    egress_id = f"debug-{uuid.uuid4().hex[:12]}"
    relay = egress.open_for_task(lease.network, egress_id)
    mcp = McpRollout.of(lease) if not lease.harness else None
    link = SandboxLink(fallback=relay) if mcp is None else None
    sb = None
    try:
        path = mcp.relay(relay) if mcp is not None else link.path      # type: ignore[union-attr]
        sb = runtime.create(rollout_spec(image, lease, path, layers))
        spec = rollout_spec(image, lease, path if mcp is not None else relay, layers)
        toolbox = mcp.toolbox(sb, lease) if mcp is not None else \
            Toolbox(sb, lease.tools, observation_bytes=lease.budgets.observation_bytes)
        yield DebugBox(sb, lease, spec, mcp.link if mcp is not None else link, relay, toolbox)  # type: ignore[arg-type]
    finally:
        if mcp is not None:
            mcp.close()
        if link is not None:
            link.close()
        if sb is not None:
            sb.destroy()
        egress.close_for_task(egress_id)


def shell(box: DebugBox, stdin_fd: int, stdout_fd: int, interactive: bool, rows: int = 24, cols: int = 80) -> str:
    """Run a shell in the box, joined to the two descriptors until it exits (or stdin ends and
    it has answered); returns how it ran: "pty" or "pipes"."""
    how: list[str] = []
    argv = ["sh", "-i"] if interactive else ["sh"]
    sock = box.link.open(box.sandbox, "pty", SHELL_TAG, argv, cwd="/work",
                         network=box.relayed, rows=rows, cols=cols, how=how, framed=True)
    mode = "pty" if how and how[0] == "ok pty" else "pipes"
    restore = _raw(stdin_fd) if interactive and mode == "pty" else None
    try:
        _pump(sock, stdin_fd, stdout_fd)
    finally:
        if restore is not None:
            restore()
        sock.close()
    return mode


def _raw(fd: int):
    import termios
    import tty
    saved = termios.tcgetattr(fd)
    tty.setraw(fd)
    return lambda: termios.tcsetattr(fd, termios.TCSADRAIN, saved)


def _pump(sock: socket.socket, in_fd: int, out_fd: int) -> None:
    """stdin to the shell (framed: the relay cannot carry a half-close), the shell to stdout;
    stdin's end closes the shell's stdin, the shell's end stops."""
    fds = [sock.fileno(), in_fd]
    while True:
        ready, _, _ = select.select(fds, [], [])
        if sock.fileno() in ready:
            data = sock.recv(65536)
            if not data:
                return
            view = memoryview(data)
            while view:
                view = view[os.write(out_fd, view):]
        if in_fd in ready:
            data = os.read(in_fd, 65536)
            if not data:
                fds.remove(in_fd)
            sock.sendall(frame(data))      # frame(b""): the end of the shell's input


def recorded_calls(steps: list[dict]) -> list[tuple[int, dict]]:
    """(step, {"id", "name", "arguments"}) of every recorded tool call, in order."""
    out: list[tuple[int, dict]] = []
    for row in sorted(steps, key=lambda r: r["step"]):
        raw = row.get("tool_args")
        if not raw:
            continue
        calls = json.loads(raw) if isinstance(raw, str) else raw
        if isinstance(calls, dict):       # one call recorded as its argument object
            calls = [{"id": "call_0", "name": row.get("tool_name"), "arguments": json.dumps(calls)}]
        out.extend((int(row["step"]), dict(c)) for c in calls)
    return out


def replay_calls(box: DebugBox, steps: list[dict]) -> Iterator[tuple[int, dict, ToolResult]]:
    """Run the recorded tool calls in the box with the rollout's toolbox (the harness's tools,
    the task's tool set and observation cap, its MCP servers' tools); yields (step, call,
    result). Raises SandboxError."""
    for step, call in recorded_calls(steps):
        yield step, call, box.toolbox.call(call.get("name"), call.get("arguments"), budget_s=box.task.budgets.wall_s)


__all__ = ["DebugBox", "SHELL_TAG", "debug_sandbox", "recorded_calls", "replay_calls", "rollout_spec", "shell"]
