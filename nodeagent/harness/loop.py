"""The agent loop: an OpenAI-compatible chat-completions endpoint ⇄ tool calls in a sandbox.

The model sees the task's instruction and the task's tool set (`nodeagent.harness.tools`; the
names and schemas are `controller.contracts.tools`). Every tool call, whichever toolbox serves it
(built-in, a task's services, MCP servers, the browser), passes one check here first
(`controller.contracts.tools.call_error`: arguments that are not a JSON object, nested too deep,
a non-finite or oversized number or a lone surrogate anywhere, what a command line cannot carry),
then its toolbox validates it against its JSON Schema before it runs; an invalid call becomes an
error observation for the model, never a crash. Budgets (`Budgets`): steps, wall seconds — enforced
also during a model call, whose timeout is the remaining budget —, tokens and observation bytes.
Each assistant message is one step row (the `steps` table); each model call and tool call is
one span (the `spans` table).

A failed model call is the infrastructure's only when it reproduces without the policy's output
(`nodeagent.harness.modelfault.whose`): a server that cannot be reached, answers 5xx or
garbage, or does not answer within `model_timeout_s` and then fails a liveness probe raises
`ModelError`: an infrastructure failure (the rollout is retried), never a reward of 0. A
failure of the policy's making ends the rollout, graded as is, with stop reason
`model_timeout` (the server is alive: the policy's generation outran the request's timeout),
`context_length` (its transcript overflowed the model's context) or `model_refused` (a 4xx the
same request without the policy's output does not get); `model_fault` says what failed.
Running out of the wall budget is the policy's own fault (`stop_reason = "wall_time"`).

The model is behind the `Model` seam (`nodeagent.harness.model`): `HTTPModel` speaks the wire
format; the node's gateway session (`nodeagent.gateway.session`, which records every call)
and `replay` implement it too. A gateway that refuses a call because the rollout's model
budget is spent (`BudgetExhausted`) stops the loop with that budget as stop reason. Seeded tool
faults (`faults`, a task's `tool_faults`) replace or delay tool calls; each step row lists
the faults of its calls in `tool_faults`.

Conversations (a task with `services` and a `user`): the task's mock services
(`nodeagent.services.host.ServiceHost`) add their operations to the tools; the instruction
goes into the system prompt (`CONVERSATION_PROMPT`) and the simulated user
(`nodeagent.harness.usersim`) opens. An assistant message without a tool call is a message to
the user: the user's reply is the next `user` message, unless the user stops (`stop_reason =
"user_stop"`). Every user turn is a step row with `role = "user"`; `step` numbers all rows.

No progress (`nodeagent.harness.progress`): the same tool call answered by the same observation
`no_progress_repeats` times, or `no_output_turns` turns in a row without output, end the
episode with stop reason `no_progress` or `no_output`: the policy's failure (the attempt's
runner scores it 0 without grading), never an infrastructure error.

Stopping from outside (`stop`, a callable the attempt's runner passes: its cancel signal or a
deadline, nodeagent/agent/guard.py): checked before every model call and every tool call; once
it says stop, the loop ends with stop reason `stopped`, and a model or sandbox failure caused
by the stop (the guard kills the sandbox and shuts the model connection) ends it the same way
instead of raising.
Must not import zmq,
controller.* outside contracts, nodeagent.agent or nodeagent.verifier.
"""
from __future__ import annotations

import json
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Iterable

from controller.contracts.clock import utc_now
from controller.contracts.tasks import Budgets
from controller.contracts.tools import call_error
from nodeagent.harness import modelfault
from nodeagent.harness.faults import ToolFaults, faulted_result
from nodeagent.harness.model import (
    MODEL_TIMEOUT_S,
    PROBE_TIMEOUT_S,
    BudgetExhausted,
    ContextLengthExceeded,
    HTTPModel,
    Model,
    ModelError,
    ModelTimeout,
)
from nodeagent.harness.progress import ProgressDetector
from nodeagent.harness.tools import MAX_ARGUMENT_BYTES, Toolbox, ToolResult
from nodeagent.sandbox.runtime import Sandbox, SandboxError
from nodeagent.services.host import ToolRouter

CONVERSATION_PROMPT = ("You are an assistant talking with a user. Use the tools to look up and change records "
                       "as the user asks and as the operator's instructions allow. Write to the user in plain "
                       "messages (without a tool call).\n\nOperator's instructions:\n")
SYSTEM_PROMPT = ("You are a software agent working in a Linux sandbox. Your files are in /work. "
                 "Use the tools to inspect and change files and run commands. When you are done, "
                 "reply without a tool call; for questions, give the final answer as \\boxed{...}.")

TOOL_TIMEOUT_S = 20.0
PROBE_FLOOR_S = 1.0           # each probe of a failed model call gets at least this (modelfault)
MAX_CALLS_PER_STEP = 16       # tool calls run per assistant message; the rest are refused
STOPPED = "stopped"           # stop reason: the runner stopped the loop (cancel, deadline)


@dataclass
class AgentResult:
    steps: list[dict] = field(default_factory=list)
    answer: str | None = None
    stop_reason: str = "stop"       # stop | user_stop | max_steps | wall_time | tokens | calls | model_error
    #                                 | context_length | model_timeout | model_refused (the policy's, modelfault)
    #                                 | no_progress | no_output (nodeagent.harness.progress) | stopped (from outside)
    #                                 (an external harness: harness_exit | harness_error | harness_timeout)
    prompt_tokens: int = 0
    completion_tokens: int = 0
    agent_s: float = 0.0
    tool_errors: int = 0
    tool_faults: int = 0
    # Timed spans: {"kind": model_call|tool_call|sandbox_start|verification, "name", "step",
    # "start_s", "duration_s"}; egress decisions: {"sandbox", "host", "port", "address",
    # "verdict", "reason", "ts"}. Written to the `spans` and `egress` tables.
    spans: list[dict] = field(default_factory=list)
    egress: list[dict] = field(default_factory=list)
    model_fault: str | None = None  # the failed call that ended the rollout as the policy's doing


def _assistant_message(message: dict) -> dict:
    out: dict[str, Any] = {"role": "assistant", "content": message.get("content")}
    if message.get("tool_calls"):
        out["tool_calls"] = message["tool_calls"]
    return out


def _call_record(i: int, call: dict) -> dict:
    fn = call.get("function") or {}
    args = fn.get("arguments")
    return {"id": str(call.get("id") or f"call_{i}"), "name": fn.get("name"),
            "arguments": args if isinstance(args, str) else json.dumps(args)}


def run_agent(sandbox: Sandbox, instruction: str, endpoint: str | Model, model: str, seed: int,
              budgets: dict | Budgets, clock: Callable[[], float] = time.monotonic, *,
              tools: Iterable[str] | None = None, model_timeout_s: float = MODEL_TIMEOUT_S,
              tool_timeout_s: float = TOOL_TIMEOUT_S,
              egress_decisions: Callable[[], list[dict]] | None = None,
              span_origin: float | None = None, faults: ToolFaults | None = None,
              sleep: Callable[[float], None] = time.sleep, services=None, user=None,
              toolbox: Any = None, stop: Callable[[], bool] | None = None,
              progress: ProgressDetector | None = None) -> AgentResult:
    """Run the agent until it stops or a budget runs out. Raises ModelError / SandboxError
    (infrastructure); every failure the model causes is an observation in the transcript.
    Spans' `start_s` count from `span_origin` (a `clock()` value; default: the agent's start).
    `toolbox`: tools already bound (a web task's `nodeagent.harness.browser_tools.BrowserToolbox`)
    instead of the sandbox's shell tools. `stop`: asked before every model and tool call (see
    the module docstring); `progress`: the no-progress detector (default: from the budgets)."""
    b = budgets if isinstance(budgets, Budgets) else Budgets.from_dict(budgets)
    client: Model = HTTPModel(endpoint, clock) if isinstance(endpoint, str) else endpoint
    if toolbox is None:
        toolbox = Toolbox(sandbox, tools, observation_bytes=b.observation_bytes, timeout_s=tool_timeout_s)
    if services is not None:
        toolbox = ToolRouter(toolbox, services)
    res = AgentResult()
    t0 = clock()
    if user is None:
        messages: list[dict] = [{"role": "system", "content": SYSTEM_PROMPT},
                                {"role": "user", "content": instruction}]
    else:
        messages = [{"role": "system", "content": CONVERSATION_PROMPT + instruction}]
        _user_turn(res, user.opening(), messages, utc_now(), 0.0)
    deadline = t0 + b.wall_s
    origin = t0 if span_origin is None else span_origin
    watch = _Watch(stop or (lambda: False), progress or ProgressDetector.of(b))
    try:
        for step in range(b.max_steps):
            if not _step(res, step, client, toolbox, messages, model, seed, b, clock, origin, deadline,
                         model_timeout_s, (faults, sleep), user, watch):
                break
        else:
            res.stop_reason = "max_steps"
    except (ModelError, SandboxError) as exc:
        if watch.stop():          # the failure is the stop's doing (a killed sandbox, a shut socket)
            res.stop_reason = STOPPED
            return res
        if isinstance(exc, SandboxError):
            raise
        res.stop_reason = "model_error"
        exc.result = res
        raise
    finally:
        res.agent_s = clock() - t0
        if egress_decisions is not None:
            res.egress = list(egress_decisions())
    return res


@dataclass
class _Watch:
    """What ends a loop from outside its budgets: the runner's `stop`, the progress detector."""
    stop: Callable[[], bool]
    progress: ProgressDetector


def _step(res: AgentResult, step: int, client: Model, toolbox: Toolbox, messages: list[dict],
          model: str, seed: int, b: Budgets, clock, origin: float, deadline: float,
          model_timeout_s: float, inject: tuple[ToolFaults | None, Callable[[float], None]],
          user=None, watch: _Watch | None = None) -> bool:
    """One assistant message and its tool calls (or, to a user, the user's reply); False when
    the loop must stop. `step` counts assistant messages; the row's `step` counts all rows."""
    row_no = len(res.steps)
    if watch is not None and watch.stop():
        res.stop_reason = STOPPED
        return False
    remaining = deadline - clock()
    if remaining <= 0:
        res.stop_reason = "wall_time"
        return False
    started, m0 = utc_now(), clock()
    payload = {"model": model, "messages": messages, "tools": toolbox.definitions(), "seed": seed,
               "logprobs": True,
               "max_tokens": max(1, b.max_tokens - res.prompt_tokens - res.completion_tokens)}
    try:
        body = _complete(client, payload, min(model_timeout_s, remaining), clock)
    except ModelError as exc:
        span = {"kind": "model_call", "name": model, "step": row_no, "start_s": m0 - origin,
                "duration_s": clock() - m0}
        if isinstance(exc, (BudgetExhausted, ModelTimeout, ContextLengthExceeded)):
            res.spans.append(span)
        if isinstance(exc, BudgetExhausted):
            res.stop_reason = exc.kind
            return False
        if isinstance(exc, ModelTimeout) and remaining <= model_timeout_s:
            res.stop_reason = "wall_time"
            return False
        if watch is not None and watch.stop():
            raise                 # the stop's doing (a shut socket): run_agent ends the loop
        # the probes (at most three) end within the wall budget, or within PROBE_FLOOR_S each past
        # it: well inside the attempt guard's grace, so a stop never lands mid-probe
        probe_s = max(min(PROBE_TIMEOUT_S, model_timeout_s, (deadline - clock()) / 3), PROBE_FLOOR_S)
        reason = modelfault.whose(exc, client, payload, probe_s)
        if reason is None:
            raise
        if span not in res.spans:
            res.spans.append(span)
        res.stop_reason = reason  # the policy's doing: the rollout ends here and is graded as is
        res.model_fault = str(exc)
        return False
    model_s = clock() - m0
    res.spans.append({"kind": "model_call", "name": model, "step": row_no, "start_s": m0 - origin,
                      "duration_s": model_s})
    choice = body["choices"][0]
    message = choice["message"]
    usage = body.get("usage") or {}
    p_tok, c_tok = int(usage.get("prompt_tokens", 0)), int(usage.get("completion_tokens", 0))
    res.prompt_tokens += p_tok
    res.completion_tokens += c_tok
    logprobs = choice.get("logprobs")
    calls = [_call_record(i, c) for i, c in enumerate(message.get("tool_calls") or [])]
    messages.append(_assistant_message(message))
    row = {"step": row_no, "role": "assistant", "content": message.get("content"),
           "tool_name": None, "tool_args": None, "observation": None, "exit_code": None,
           "started_at": started, "model_s": model_s, "tool_s": 0.0,
           "prompt_tokens": p_tok, "completion_tokens": c_tok,
           "logprobs": json.dumps(logprobs) if logprobs else None, "observation_truncated": None,
           "tool_faults": None}
    res.steps.append(row)
    if not calls:
        row["wall_s"] = clock() - m0
        res.answer = message.get("content") or ""
        res.stop_reason = "stop"
        if user is None:
            return False
        started, u0 = utc_now(), clock()
        turn = user.reply(res.answer)
        _user_turn(res, turn, messages, started, clock() - u0)
        if turn.stop:
            res.stop_reason = "user_stop"
            return False
        return True
    t_tool = clock()
    try:
        observations, truncated, first_code, faults = _run_calls(res, step, calls, toolbox, messages, clock, origin,
                                                                 deadline, inject, row_no,
                                                                 watch.stop if watch is not None else None)
    except SandboxError:
        if watch is None or not watch.stop():
            raise
        # the sandbox was killed under the call by the stop: the row records the calls, no observation
        row.update(tool_name=",".join(str(c["name"]) for c in calls), tool_args=json.dumps(calls),
                   observation="", observation_truncated=False, tool_s=clock() - t_tool, wall_s=clock() - m0)
        res.stop_reason = STOPPED
        return False
    row.update(tool_faults=json.dumps(faults) if faults else None, tool_name=",".join(str(c["name"]) for c in calls), tool_args=json.dumps(calls),
               observation="\n".join(observations), exit_code=first_code, observation_truncated=truncated,
               tool_s=clock() - t_tool, wall_s=clock() - m0)
    if watch is not None:
        if watch.stop():
            res.stop_reason = STOPPED
            return False
        fired = watch.progress.turn(message.get("content"), [(c["name"], c["arguments"], o)
                                                             for c, o in zip(calls, observations)])
        if fired is not None:
            res.stop_reason = fired
            return False
    if res.prompt_tokens + res.completion_tokens >= b.max_tokens:
        res.stop_reason = "tokens"
        return False
    return True


def _complete(client: Model, payload: dict, timeout_s: float, clock) -> dict:
    """One completion. A context overflow whose prompt fits (the server says how many tokens it
    has and the context holds) asked for too many completion tokens: `max_tokens` is lowered to
    what the context leaves and the call is sent once more (the harness asked too much, neither
    the policy nor the server failed)."""
    t0 = clock()
    try:
        return client.complete(payload, timeout_s)
    except ContextLengthExceeded as exc:
        room, asked = exc.room(), payload.get("max_tokens")
        if room is None or room <= 0 or not isinstance(asked, int) or asked <= room:
            raise
        payload["max_tokens"] = room
        return client.complete(payload, max(timeout_s - (clock() - t0), 0.001))


def _run_calls(res: AgentResult, step: int, calls: list[dict], toolbox: Toolbox, messages: list[dict],
               clock, origin: float, deadline: float,
               inject: tuple[ToolFaults | None, Callable[[float], None]] = (None, time.sleep),
               row_no: int | None = None,
               stop: Callable[[], bool] | None = None) -> tuple[list[str], bool, int | None, list[dict]]:
    """Run one message's tool calls (at most MAX_CALLS_PER_STEP); (observations, any truncated,
    the first call's exit code, the faults injected). Once `stop()` says so, no further call runs."""
    observations, truncated, first_code, faults = [], False, None, []
    plan, sleep = inject
    for i, call in enumerate(calls):
        if stop is not None and stop():
            break
        s0 = clock()
        fault = plan.draw(step, i) if plan is not None and i < MAX_CALLS_PER_STEP else None
        if fault is not None:
            res.tool_faults += 1
            faults.append({"call": i, "tool": str(call["name"]), "kind": fault})
        if i >= MAX_CALLS_PER_STEP:
            out = ToolResult(f"error: at most {MAX_CALLS_PER_STEP} tool calls run per message; "
                             "this one was not run", None, "too_many_calls")
        elif fault in ("error", "kill"):
            out = faulted_result(fault)
        elif (refused := _refused(call)) is not None:
            out = refused
        else:
            if fault == "latency":
                sleep(min(plan.latency_s, max(deadline - s0, 0.0)))
            out = toolbox.call(call["name"], call["arguments"], budget_s=max(deadline - clock(), 0.1))
        res.spans.append({"kind": "tool_call", "name": str(call["name"]), "step": step if row_no is None else row_no,
                          "start_s": s0 - origin, "duration_s": clock() - s0})
        if out.error is not None and fault is None:
            res.tool_errors += 1
        if i == 0:
            first_code = out.exit_code
        truncated = truncated or out.truncated
        observations.append(out.observation)
        messages.append({"role": "tool", "tool_call_id": call["id"], "content": out.observation})
    return observations, truncated, first_code, faults


def _refused(call: dict) -> ToolResult | None:
    """The tool error for arguments no toolbox may be handed (`call_error`: not an object, too
    deep, a non-finite or oversized number, a lone surrogate, an argument the sandbox's command
    line cannot carry), or None: the one check every toolbox's calls pass."""
    error = call_error(call["name"], call["arguments"], MAX_ARGUMENT_BYTES)
    if error is None:
        return None
    name = call["name"] if isinstance(call["name"], str) and call["name"].isidentifier() else repr(call["name"])
    return ToolResult(f"error: invalid arguments for {name} {error}", None, "invalid_arguments")


def _user_turn(res: AgentResult, turn, messages: list[dict], started, wall_s: float) -> None:
    """Record a simulated user's message as a step row (`role = "user"`) and, unless the user
    stopped, send it to the model."""
    res.steps.append({"step": len(res.steps), "role": "user", "content": turn.content, "tool_name": None,
                      "tool_args": None, "observation": None, "exit_code": None, "started_at": started,
                      "model_s": turn.model_s, "tool_s": 0.0, "wall_s": wall_s,
                      "prompt_tokens": turn.prompt_tokens, "completion_tokens": turn.completion_tokens,
                      "logprobs": None, "observation_truncated": None, "tool_faults": None})
    if not turn.stop:
        messages.append({"role": "user", "content": turn.content})


__all__ = ["AgentResult", "CONVERSATION_PROMPT", "MAX_CALLS_PER_STEP", "STOPPED", "SYSTEM_PROMPT", "TOOL_TIMEOUT_S",
           "run_agent"]
