"""Bring your own harness: a task's `harness` argv runs inside the sandbox, its model calls go
through the node's gateway, and the farm grades the final state as for the built-in harness.

`run_harness(sandbox, argv, instruction, session, budgets)` runs, in `/work`,
`<argv>` with `OPENAI_BASE_URL=<gateway>` and `OPENAI_API_KEY=<session key>` in its environment,
the instruction on stdin and in `/work/.paddock/instruction.txt`. It is
bounded by the wall budget (the exec's timeout kills its whole process tree), its output by
OUTPUT_CAP_BYTES, and its model calls by the gateway's budgets (calls, tokens, wall time:
a call past them gets HTTP 429). However it ends — exit 0, non-zero, killed at the deadline,
flooding output — the result is a transcript row with its exit code and output tail, and the
stop reason `harness_exit`, `harness_error` (non-zero) or `harness_timeout`, and the verifier
grades what it left -- except when the harness did not exit 0 after a model call that failed
and the model server does not answer a probe that carries nothing of the policy's (a dead or
hung server): that reproduces without the policy, so it is the infrastructure's (`ModelError`,
the attempt's `model_server` reason), never a reward 0. The answer (math tasks) is the content
of the last model reply.

Must not import: zmq, nodeagent.agent, nodeagent.verifier.
"""
from __future__ import annotations

import json
import shlex
import time
from typing import Callable

from controller.contracts.clock import utc_now
from controller.contracts.tasks import Budgets
from nodeagent.harness.loop import AgentResult
from nodeagent.harness.model import PROBE_TIMEOUT_S, ModelError
from nodeagent.sandbox.runtime import Sandbox
from nodeagent.store import tracing

OUTPUT_CAP_BYTES = 64 * 1024
OBSERVATION_TAIL_CHARS = 8192
INSTRUCTION_PATH = "/work/.paddock/instruction.txt"
IN_SANDBOX_BASE_URL = "http://127.0.0.1:3128/v1"


def harness_env(key: str, base_url: str = IN_SANDBOX_BASE_URL) -> dict[str, str]:
    """The harness's environment: the gateway's address and key (the OpenAI SDK's and
    LiteLLM's names), and no proxy for it (the relay's port is the gateway itself)."""
    return {"OPENAI_BASE_URL": base_url, "OPENAI_API_BASE": base_url, "OPENAI_API_KEY": key,
            "NO_PROXY": "127.0.0.1,localhost", "no_proxy": "127.0.0.1,localhost"}


def run_harness(sandbox: Sandbox, argv: tuple[str, ...] | list[str], instruction: str, session,
                budgets: Budgets, clock: Callable[[], float] = time.monotonic, *,
                span_origin: float | None = None, output_cap: int = OUTPUT_CAP_BYTES) -> AgentResult:
    """Run the task's harness in `sandbox` against `session` (a nodeagent.gateway Session).
    Raises SandboxError only when the sandbox itself fails (infrastructure)."""
    res = AgentResult()
    t0 = clock()
    origin = t0 if span_origin is None else span_origin
    started = utc_now()
    sandbox.write_files({INSTRUCTION_PATH: instruction.encode()})
    remaining = max(session.deadline - clock(), 0.1)
    r = sandbox.exec(list(argv), stdin=instruction.encode(), timeout_s=min(budgets.wall_s, remaining),
                     cwd="/work", env={**harness_env(session.key), **tracing.sandbox_env(getattr(session, "trace", None))},
                     output_cap=output_cap)
    wall = clock() - t0
    if r.timed_out:
        res.stop_reason = "harness_timeout"
    elif r.exit_code != 0:
        res.stop_reason = "harness_error"
    else:
        res.stop_reason = "harness_exit"
    out = (r.stdout + (b"\n--- stderr ---\n" + r.stderr if r.stderr else b"")).decode(errors="replace")
    tail = out[-OBSERVATION_TAIL_CHARS:]
    ok_calls = [row for row in session.rows if row["status"] == "ok"]
    res.prompt_tokens = sum(row["prompt_tokens"] or 0 for row in ok_calls)
    res.completion_tokens = sum(row["completion_tokens"] or 0 for row in ok_calls)
    res.answer = session.last_content() or ""
    res.steps.append({
        "step": 0, "role": "harness", "content": None, "tool_name": "harness",
        "tool_args": json_argv(argv), "observation": tail, "exit_code": r.exit_code,
        "started_at": started, "wall_s": wall, "model_s": sum(row["upstream_s"] for row in session.rows),
        "tool_s": wall, "prompt_tokens": res.prompt_tokens, "completion_tokens": res.completion_tokens,
        "logprobs": None, "observation_truncated": bool(r.truncated or len(out) > len(tail)),
        "tool_faults": None})
    res.spans.append({"kind": "tool_call", "name": "harness", "step": 0, "start_s": t0 - origin,
                      "duration_s": wall})
    res.agent_s = wall
    if res.stop_reason != "harness_exit":
        _raise_if_server_down(session, res)
    return res


def _raise_if_server_down(session, res: AgentResult) -> None:
    """A harness that failed after a failed model call: ModelError (infrastructure) when the
    model server does not answer a probe without the policy's output; else nothing (the
    harness's own failure, graded)."""
    rows = session.rows
    probe = getattr(session, "probe", None)
    if not rows or rows[-1]["status"] != "error" or probe is None:
        return
    found = probe(PROBE_TIMEOUT_S)
    if found is None:
        return
    exc = ModelError(f"the harness's last model call failed ({rows[-1]['error']}) and the model server "
                     f"does not answer without the policy's output: {found}")
    exc.result = res
    raise exc


def json_argv(argv) -> str:
    return json.dumps({"argv": list(argv), "shell": " ".join(shlex.quote(a) for a in argv)})


__all__ = ["IN_SANDBOX_BASE_URL", "OUTPUT_CAP_BYTES", "harness_env", "run_harness"]
