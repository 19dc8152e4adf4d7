"""Whose fault is a failed model call: the model server's (infrastructure) or the policy's.

An infrastructure error is only what reproduces without the policy's output. When a model call
fails, `whose(exc, client, payload, probe_s)` decides:

- a timeout (`ModelTimeout`) on a server that serves is the policy's: its generation outran
  the request's timeout (a completion's length is the policy's choice). Serves = the server
  answers, within `probe_s` each, a liveness probe (`nodeagent.harness.model.liveness`: `GET
  <root>/health` and `GET <endpoint>/models`, none answered 500, 502, 503 or 504) and then the
  same request without the policy's output and with `max_tokens` 1 (`unrecorded`). A server
  that refuses the connection, fails the liveness probe, or cannot produce one token for the
  task's own prompt in time (hung, or so loaded that requests wait in its queue) is
  infrastructure;
- a context overflow (`ContextLengthExceeded`: the wordings of vLLM, SGLang, llama.cpp, TGI,
  Ollama and the OpenAI API, `nodeagent.harness.model`) is the policy's once the conversation
  holds any output of the policy; on the first call (the task's own prompt, nothing of the
  policy) it is infrastructure (the task or the server's context is misconfigured);
- any other 4xx (not 408 or 429) is the policy's when the same request without the policy's
  output (the messages before its first assistant message, `max_tokens` 1) is answered: the
  server refused what the policy wrote (an unknown overflow wording; vLLM's 400 on a tool call
  of the history whose arguments are not JSON). When that reduced request fails too, the fault
  is not the policy's;
- a 500 likewise, when moreover the same request sent again (one token) fails again: llama.cpp
  answers 500 "Failed to parse tool call arguments as JSON" for the policy's malformed tool
  call, every time; a 500 that passes when sent again is the server's;
- everything else (connection refused or reset, 502, 503, 504, a malformed 200) stays
  infrastructure.

The answer is a stop reason (`model_timeout`, `context_length`, `model_refused`) or None
(infrastructure: the exception's message then says what the probe found). The client may be
`HTTPModel`, a gateway `Session` or any `Model` with `probe(timeout_s) -> str | None` and
`unrecorded(payload, timeout_s) -> dict`; a client without them cannot be probed (None).

Must not import: zmq, controller other than controller.contracts, nodeagent.agent,
nodeagent.verifier, nodeagent.harness.loop, nodeagent.gateway.
"""
from __future__ import annotations

from typing import Any

from nodeagent.harness.model import PROBE_TIMEOUT_S, ContextLengthExceeded, ModelError, ModelTimeout

NOT_THE_REQUEST = (408, 429)           # 4xx about the server's state, not the request's content


def agent_free(messages: Any) -> list | None:
    """The messages before the policy's first assistant message, or None when there is none
    (the request holds nothing the policy wrote)."""
    if not isinstance(messages, list):
        return None
    for i, m in enumerate(messages):
        if isinstance(m, dict) and m.get("role") in ("assistant", "tool"):
            return messages[:i]
    return None


def whose(exc: ModelError, client: Any, payload: dict, probe_s: float = PROBE_TIMEOUT_S) -> str | None:
    """The policy's stop reason for the failed call `payload`, or None when the failure is the
    infrastructure's (then `exc`'s message is extended with what the probe found)."""
    prefix = agent_free(payload.get("messages"))
    if isinstance(exc, ContextLengthExceeded):
        if prefix is None:
            _note(exc, "the task's own prompt, before any output of the policy, already exceeds the context")
            return None
        return "context_length"
    if isinstance(exc, ModelTimeout):
        probe, unrecorded = getattr(client, "probe", None), getattr(client, "unrecorded", None)
        if probe is None or unrecorded is None:
            return None
        found = probe(probe_s)
        if found is None:
            found = _fails_without_policy(unrecorded, payload, payload.get("messages") if prefix is None else prefix,
                                          probe_s)
        if found is None:
            return "model_timeout"
        _note(exc, found)
        return None
    status = exc.status
    if status is None or not 400 <= status <= 500 or status in NOT_THE_REQUEST:
        return None
    if prefix is None:
        _note(exc, "refused before any output of the policy")
        return None
    unrecorded = getattr(client, "unrecorded", None)
    if unrecorded is None:
        return None
    if status == 500:                     # the policy's only when it is no passing failure
        again = _fails_without_policy(unrecorded, payload, payload.get("messages"), probe_s)
        if again is None:
            _note(exc, "the same request (one token) was answered when sent again: a passing failure")
            return None
    found = _fails_without_policy(unrecorded, payload, prefix, probe_s)
    if found is not None:
        _note(exc, found)
        return None
    return "model_refused"


def _fails_without_policy(unrecorded: Any, payload: dict, messages: Any, probe_s: float) -> str | None:
    """None when the request `payload` with only `messages` (nothing of the policy's) and one
    token to generate is answered within `probe_s`; else what went wrong."""
    try:
        unrecorded(dict(payload, messages=messages, max_tokens=1), probe_s)
    except ModelError as again:
        return f"the same request without the policy's output fails too: {str(again)[:200]}"
    return None


def _note(exc: ModelError, what: str) -> None:
    exc.args = (f"{exc.args[0] if exc.args else exc}; {what}",) + tuple(exc.args[1:])


__all__ = ["NOT_THE_REQUEST", "agent_free", "whose"]
