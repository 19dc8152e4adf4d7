"""A scripted policy's steps: a tool call (`ToolStep`) or a final message (`FinalStep`).

Pure data. Must not import: zmq, nodeagent, controller.demo.policy_server.
"""
from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class ToolStep:
    name: str                   # shell | read_file | write_file | a service operation ...
    arguments: dict


@dataclass(frozen=True)
class FinalStep:
    content: str


Step = ToolStep | FinalStep

__all__ = ["FinalStep", "Step", "ToolStep"]
