"""The agent loop: an OpenAI-compatible chat-completions endpoint ⇄ tool calls in a sandbox.

The model sees the task's instruction and three tools (shell, read_file, write_file). Every
tool call is validated against its JSON Schema before it runs; an invalid call becomes an
error observation for the model, never a crash. Budgets: steps, wall seconds, tokens,
observation bytes. Each step is recorded as a row for the `steps` table.

A model server that cannot be reached or answers garbage raises `ModelError`: that is an
infrastructure failure (the rollout is retried), never a reward of 0.
Must not import zmq or the controller.
"""
from __future__ import annotations

import json
import time
import urllib.error
import urllib.request
from dataclasses import dataclass, field
from datetime import datetime, timezone
from typing import Callable

import jsonschema

from nodeagent.sandbox import Sandbox, SandboxError

SYSTEM_PROMPT = ("You are a software agent working in a Linux sandbox. Your files are in /work. "
                 "Use the tools to inspect and change files and run commands. When you are done, "
                 "reply without a tool call; for questions, give the final answer as \\boxed{...}.")

TOOLS = [
    {"type": "function", "function": {
        "name": "shell", "description": "Run a shell command in /work (sh -c). Output is capped.",
        "parameters": {"type": "object", "properties": {"command": {"type": "string", "minLength": 1}},
                       "required": ["command"], "additionalProperties": False}}},
    {"type": "function", "function": {
        "name": "read_file", "description": "Read a text file.",
        "parameters": {"type": "object", "properties": {"path": {"type": "string", "minLength": 1}},
                       "required": ["path"], "additionalProperties": False}}},
    {"type": "function", "function": {
        "name": "write_file", "description": "Create or overwrite a text file.",
        "parameters": {"type": "object", "properties": {"path": {"type": "string", "minLength": 1},
                                                        "content": {"type": "string"}},
                       "required": ["path", "content"], "additionalProperties": False}}},
]
_SCHEMAS = {t["function"]["name"]: t["function"]["parameters"] for t in TOOLS}
TOOL_TIMEOUT_S = 20.0
MODEL_TIMEOUT_S = 60.0


class ModelError(Exception):
    """The model server failed (unreachable, HTTP error, malformed reply): infrastructure."""


@dataclass
class AgentResult:
    steps: list[dict] = field(default_factory=list)
    answer: str | None = None
    stop_reason: str = "stop"       # stop | max_steps | wall_time | tokens
    prompt_tokens: int = 0
    completion_tokens: int = 0
    agent_s: float = 0.0
    tool_errors: int = 0
    # Timed spans: {"kind": model_call|tool_call|sandbox_start|verification, "name", "step",
    # "start_s", "duration_s"}; egress decisions: {"sandbox", "host", "port", "address",
    # "verdict", "reason", "ts"}. Written to the `spans` and `egress` tables.
    spans: list[dict] = field(default_factory=list)
    egress: list[dict] = field(default_factory=list)


def _now() -> datetime:
    return datetime.now(timezone.utc)


def chat(endpoint: str, payload: dict, timeout_s: float = MODEL_TIMEOUT_S) -> dict:
    req = urllib.request.Request(endpoint.rstrip("/") + "/chat/completions",
                                 data=json.dumps(payload).encode(),
                                 headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=timeout_s) as resp:
            body = json.loads(resp.read())
    except urllib.error.HTTPError as exc:
        raise ModelError(f"model server {endpoint} answered HTTP {exc.code}: "
                         f"{exc.read()[:300].decode(errors='replace')}") from None
    except (urllib.error.URLError, OSError, ValueError) as exc:
        raise ModelError(f"model server {endpoint} failed: {exc}") from None
    try:
        choice = body["choices"][0]
        message = choice["message"]
        assert isinstance(message, dict)
    except (KeyError, IndexError, TypeError, AssertionError):
        raise ModelError(f"model server {endpoint} sent a reply without choices[0].message") from None
    return body


def run_tool(sandbox: Sandbox, name: str, raw_args: str, obs_cap: int) -> tuple[str, int | None]:
    """Run one tool call; returns (observation, exit code or None). Invalid calls are observations."""
    if name not in _SCHEMAS:
        return f"error: unknown tool {name!r}; available: {sorted(_SCHEMAS)}", None
    try:
        args = json.loads(raw_args or "{}")
        jsonschema.validate(args, _SCHEMAS[name])
    except json.JSONDecodeError as exc:
        return f"error: arguments of {name} are not valid JSON: {exc}", None
    except jsonschema.ValidationError as exc:
        return f"error: invalid arguments for {name}: {exc.message}", None
    if name == "shell":
        r = sandbox.exec(["sh", "-c", args["command"]], timeout_s=TOOL_TIMEOUT_S, output_cap=obs_cap)
        text = (r.stdout + r.stderr).decode(errors="replace")
        if r.timed_out:
            text += f"\n[timed out after {TOOL_TIMEOUT_S:.0f}s]"
        return text[:obs_cap], r.exit_code
    path = args["path"] if args["path"].startswith("/") else "/work/" + args["path"]
    if name == "read_file":
        r = sandbox.exec(["cat", "--", path], timeout_s=TOOL_TIMEOUT_S, output_cap=obs_cap)
        return (r.stdout if r.exit_code == 0 else r.stderr).decode(errors="replace")[:obs_cap], r.exit_code
    r = sandbox.exec(["sh", "-c", 'mkdir -p "$(dirname "$1")" && cat > "$1"', "write_file", path],
                     stdin=args["content"].encode(), timeout_s=TOOL_TIMEOUT_S, output_cap=obs_cap)
    if r.exit_code == 0:
        return f"wrote {len(args['content'].encode())} bytes to {path}", 0
    return r.stderr.decode(errors="replace")[:obs_cap], r.exit_code


def run_agent(sandbox: Sandbox, instruction: str, endpoint: str, model: str, seed: int,
              budgets: dict, clock: Callable[[], float] = time.monotonic) -> AgentResult:
    max_steps = int(budgets.get("max_steps", 12))
    wall_s = float(budgets.get("wall_s", 120.0))
    max_tokens = int(budgets.get("max_tokens", 32768))
    obs_cap = int(budgets.get("observation_bytes", 16384))
    messages = [{"role": "system", "content": SYSTEM_PROMPT}, {"role": "user", "content": instruction}]
    res = AgentResult()
    t0 = clock()
    for step in range(max_steps):
        if clock() - t0 > wall_s:
            res.stop_reason = "wall_time"
            break
        started, m0 = _now(), clock()
        body = chat(endpoint, {"model": model, "messages": messages, "tools": TOOLS, "seed": seed,
                               "logprobs": True})
        model_s = clock() - m0
        message = body["choices"][0]["message"]
        usage = body.get("usage") or {}
        res.prompt_tokens += int(usage.get("prompt_tokens", 0))
        res.completion_tokens += int(usage.get("completion_tokens", 0))
        logprobs = body["choices"][0].get("logprobs")
        calls = message.get("tool_calls") or []
        messages.append({k: v for k, v in message.items() if k in ("role", "content", "tool_calls")})
        row = {"step": step, "role": "assistant", "content": message.get("content"),
               "tool_name": None, "tool_args": None, "observation": None, "exit_code": None,
               "started_at": started, "model_s": model_s, "tool_s": 0.0,
               "prompt_tokens": int(usage.get("prompt_tokens", 0)),
               "completion_tokens": int(usage.get("completion_tokens", 0)),
               "logprobs": json.dumps(logprobs) if logprobs else None}
        if not calls:
            row["wall_s"] = clock() - m0
            res.steps.append(row)
            res.answer = message.get("content") or ""
            res.stop_reason = "stop"
            break
        observations = []
        t_tool = clock()
        for call in calls:
            fn = call.get("function") or {}
            obs, code = run_tool(sandbox, str(fn.get("name")), fn.get("arguments") or "{}", obs_cap)
            if code is None:
                res.tool_errors += 1
            observations.append((call.get("id", ""), fn.get("name"), fn.get("arguments"), obs, code))
            messages.append({"role": "tool", "tool_call_id": call.get("id", ""), "content": obs})
        first = observations[0]
        row.update(tool_name=first[1], tool_args=first[2],
                   observation="\n".join(o[3] for o in observations), exit_code=first[4],
                   tool_s=clock() - t_tool, wall_s=clock() - m0)
        res.steps.append(row)
        if res.prompt_tokens + res.completion_tokens > max_tokens:
            res.stop_reason = "tokens"
            break
    else:
        res.stop_reason = "max_steps"
    res.agent_s = clock() - t0
    return res


__all__ = ["AgentResult", "ModelError", "SandboxError", "TOOLS", "run_agent", "run_tool", "chat"]
