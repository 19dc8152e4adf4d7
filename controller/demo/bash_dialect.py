"""The scripted policy's bash dialect: how its scripts read to a harness whose only tool is
`bash` (mini-swe-agent's `BASH_TOOL`, SWE-agent-style scaffolds), so that a real third-party
harness can be driven by the scripted policy through the gateway.

A request is in the dialect when its `tools` are exactly one function named `bash` (`wants_bash`).
Then the policy
- finds the task whose instruction the first user message *contains* (`find_task`): such a
  harness wraps the instruction in its own template ("Please solve this issue: ...");
- plays each step of the strategy's script as one `bash` tool call (`command_of`):
  `write_file` becomes `printf '%s' <content> > <path>` (the bytes exactly, shell-quoted),
  `read_file` becomes `cat -- <path>`, `shell` is its command, and the final answer becomes
  `echo COMPLETE_TASK_AND_SUBMIT_FINAL_OUTPUT` (mini-swe-agent's submit command), the answer
  kept as the message's content.

Pure: no sockets, no state. Must not import controller.demo.policy_server (it imports this),
zmq or nodeagent.
"""
from __future__ import annotations

import shlex
from typing import Any, Mapping, TypeVar

SUBMIT_COMMAND = "echo COMPLETE_TASK_AND_SUBMIT_FINAL_OUTPUT"
BASH_TOOL_NAME = "bash"

T = TypeVar("T")


def wants_bash(tools: Any) -> bool:
    """Is `tools` (a request's `tools`) exactly one function tool named `bash`?"""
    if not isinstance(tools, list) or len(tools) != 1 or not isinstance(tools[0], dict):
        return False
    fn = tools[0].get("function")
    return tools[0].get("type", "function") == "function" and isinstance(fn, dict) \
        and fn.get("name") == BASH_TOOL_NAME


def find_task(tasks: Mapping[str, T], text: str) -> T | None:
    """The task whose instruction `text` contains (the longest such instruction), or None."""
    best: tuple[int, T] | None = None
    for instruction, task in tasks.items():
        if instruction and instruction in text and (best is None or len(instruction) > best[0]):
            best = (len(instruction), task)
    return None if best is None else best[1]


def command_of(tool: str | None, arguments: Mapping[str, str]) -> str:
    """The bash command playing one script step: a tool call (`tool`, `arguments`) of the
    built-in harness's tools, or the final answer (`tool` None)."""
    if tool is None:
        return SUBMIT_COMMAND
    if tool == "write_file":
        return f"printf '%s' {shlex.quote(arguments['content'])} > {shlex.quote(arguments['path'])}"
    if tool == "read_file":
        return f"cat -- {shlex.quote(arguments['path'])}"
    if tool == "shell":
        return arguments["command"]
    raise AssertionError(f"no bash form for the script's tool {tool!r}")


__all__ = ["BASH_TOOL_NAME", "SUBMIT_COMMAND", "command_of", "find_task", "wants_bash"]
