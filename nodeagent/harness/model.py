"""The model client: one chat completion from an OpenAI-compatible endpoint, checked.

`HTTPModel(endpoint).complete(payload, timeout_s)` POSTs to `<endpoint>/chat/completions`; the
whole request (connect, send, headers, body) must finish within `timeout_s` (a watchdog shuts
the socket at the deadline). `check_reply(body, endpoint)` checks the fields a caller reads
(`choices[0].message` with `content` and `tool_calls`, `usage`) and returns the first choice.
`Model` is the seam the agent loop calls (a replayed rollout implements it too).

Errors: `ModelError` (unreachable, HTTP error, malformed or oversized reply); `ModelTimeout`
(no complete answer in time) is a ModelError; `ContextLengthExceeded` (HTTP 400, 413 or 422
naming the context, in the wording of vLLM, SGLang, llama.cpp, TGI, Ollama or the OpenAI API).
Whose each failure is (the server's or the policy's) is decided by
`nodeagent.harness.modelfault`, with `liveness(endpoint)` (a probe that carries nothing of the
policy) and `HTTPModel.probe` / `unrecorded`. The agent loop and the verifier's
LLM judge both use this module. Must not import: zmq, controller other than
controller.contracts, nodeagent.harness.loop, nodeagent.verifier.
"""
from __future__ import annotations

import http.client
import json
import re
import socket
import threading
import time
import urllib.parse
from typing import Any, Callable, Protocol

MODEL_TIMEOUT_S = 60.0
MAX_RESPONSE_BYTES = 8 * 1024 * 1024
PROBE_TIMEOUT_S = 10.0
UNAVAILABLE = (500, 502, 503, 504)     # what a server (or a proxy in front of it) says when not serving


class ModelError(Exception):
    """The model server failed (unreachable, HTTP error, malformed reply, too slow): infrastructure.
    Raised out of `nodeagent.harness.loop.run_agent`, it carries the steps and spans recorded so
    far in `.result` (an AgentResult)."""

    result: Any = None
    status: int | None = None     # the HTTP status, when the server answered with an error
    body: Any = None              # its decoded JSON body, if it was JSON


class Model(Protocol):
    def complete(self, payload: dict, timeout_s: float) -> dict:
        """One chat completion (already validated by `check_reply`), or ModelError/TimeoutError."""


class ModelTimeout(ModelError):
    """No complete answer within the request's timeout."""


class BudgetExhausted(ModelError):
    """The model gateway refused the call: the rollout's model budget is spent (`kind`: calls,
    tokens or wall_time). The policy's own limit, not an infrastructure failure."""

    def __init__(self, kind: str, message: str) -> None:
        super().__init__(message)
        self.kind = kind


class ContextLengthExceeded(ModelError):
    """The server refused the request as longer than the model's context (HTTP 400, 413, 422).
    `context_tokens` and `prompt_tokens`, when the server's message gives them (vLLM, TGI,
    llama.cpp, SGLang, OpenAI): with `room()` > 0 the prompt fits and only `max_tokens` asked
    too much."""

    context_tokens: int | None = None
    prompt_tokens: int | None = None

    def room(self) -> int | None:
        """Tokens the context leaves for a completion after the prompt, when both are known."""
        if self.context_tokens is None or self.prompt_tokens is None:
            return None
        return self.context_tokens - self.prompt_tokens


# A context overflow, as each server words it (sources in tests/harness/test_modelfault.py):
# vLLM "maximum context length" / "longer than the maximum model length", SGLang "longer than the
# model's context length", llama.cpp "exceeds the available context size"
# (`exceed_context_size_error`), TGI (422) "`inputs` tokens + `max_new_tokens` must be <=" /
# "`inputs` must have less than", Ollama "exceeds the context length", OpenAI
# `context_length_exceeded` / "context window".
_CONTEXT_LENGTH = re.compile(rb"context length|context window|context size|context limit|maximum context|"
                             rb"maximum model length|too many tokens|prompt is too long|input is too long|"
                             rb"context_length_exceeded|exceed_context_size_error|"
                             rb"`?inputs`? tokens \+ `?max_new_tokens`? must be|`?inputs`? must have less than",
                             re.I)
_CONTEXT_STATUSES = (400, 413, 422)
# The numbers in those messages: the served context, the prompt's tokens.
_CONTEXT_TOKENS = re.compile(rb"maximum context length is (\d+)|context length \((\d+) tokens\)|"
                             rb"must be <= (\d+)|\"n_ctx\"\s*:\s*(\d+)|available context size \((\d+) tokens\)")
_PROMPT_TOKENS = re.compile(rb"(\d+) in the messages|request has (\d+) input tokens|Given: (\d+) `inputs` tokens|"
                            rb"\"n_prompt_tokens\"\s*:\s*(\d+)|input \((\d+) tokens\)|messages resulted in (\d+) tokens")


def _first_number(pattern: re.Pattern, raw: bytes) -> int | None:
    m = pattern.search(raw)
    return None if m is None else int(next(g for g in m.groups() if g is not None))


def check_reply(body: Any, endpoint: str) -> dict:
    """The reply's first choice, checked for the fields the harness reads; else ModelError."""
    def bad(what: str) -> ModelError:
        return ModelError(f"model server {endpoint} sent a malformed reply: {what}")
    if not isinstance(body, dict):
        raise bad(f"body is {type(body).__name__}, not an object")
    choices = body.get("choices")
    if not isinstance(choices, list) or not choices or not isinstance(choices[0], dict):
        raise bad("no choices[0]")
    message = choices[0].get("message")
    if not isinstance(message, dict):
        raise bad("choices[0].message is not an object")
    if message.get("content") is not None and not isinstance(message["content"], str):
        raise bad("message.content is neither a string nor null")
    calls = message.get("tool_calls")
    if calls is not None and (not isinstance(calls, list) or not all(isinstance(c, dict) for c in calls)):
        raise bad("message.tool_calls is not an array of objects")
    for c in calls or []:
        if not isinstance(c.get("function"), dict):
            raise bad("a tool call has no 'function' object")
    usage = body.get("usage")
    if usage is not None and not isinstance(usage, dict):
        raise bad("usage is not an object")
    for k in ("prompt_tokens", "completion_tokens"):
        v = (usage or {}).get(k, 0)
        if isinstance(v, bool) or not isinstance(v, int) or v < 0:
            raise bad(f"usage.{k} is not a non-negative integer")
    return choices[0]


class HTTPModel:
    """An OpenAI-compatible endpoint (`.../v1`). The whole request — connect, send, headers,
    body — must finish within `timeout_s`: a watchdog shuts the socket at the deadline, so a
    server that trickles bytes cannot hold a rollout past its budget."""

    def __init__(self, endpoint: str, clock: Callable[[], float] = time.monotonic) -> None:
        u = urllib.parse.urlsplit(endpoint)
        if u.scheme not in ("http", "https") or not u.hostname:
            raise ModelError(f"model endpoint {endpoint!r} is not an http(s) URL")
        self.endpoint, self._u, self._clock = endpoint, u, clock

    def complete(self, payload: dict, timeout_s: float) -> dict:
        if timeout_s <= 0:
            raise ModelTimeout(f"no time left for a request to {self.endpoint}")
        u = self._u
        conn_cls = http.client.HTTPSConnection if u.scheme == "https" else http.client.HTTPConnection
        conn = conn_cls(u.hostname, u.port, timeout=timeout_s)
        expired = threading.Event()

        def expire() -> None:
            expired.set()
            sock = conn.sock
            if sock is not None:
                try:
                    sock.shutdown(socket.SHUT_RDWR)
                except OSError:
                    pass
        watchdog = threading.Timer(timeout_s, expire)
        watchdog.daemon = True
        watchdog.start()
        try:
            conn.request("POST", u.path.rstrip("/") + "/chat/completions", body=json.dumps(payload).encode(),
                         headers={"Content-Type": "application/json"})
            resp = conn.getresponse()
            raw = resp.read(MAX_RESPONSE_BYTES + 1)
            status = resp.status
        except (OSError, http.client.HTTPException) as exc:
            if expired.is_set() or isinstance(exc, TimeoutError):
                raise ModelTimeout(f"model server {self.endpoint} did not answer within {timeout_s:.1f}s") from None
            raise ModelError(f"model server {self.endpoint} failed: {exc!r}") from None
        finally:
            watchdog.cancel()
            conn.close()
        if expired.is_set():
            raise ModelTimeout(f"model server {self.endpoint} did not answer within {timeout_s:.1f}s")
        return decode_reply(self.endpoint, status, raw)


    def probe(self, timeout_s: float = PROBE_TIMEOUT_S) -> str | None:
        """None when the server is alive (`liveness`), else what is wrong."""
        return liveness(self.endpoint, timeout_s)

    def unrecorded(self, payload: dict, timeout_s: float) -> dict:
        """A call made to decide whose a failure is (`nodeagent.harness.modelfault`)."""
        return self.complete(payload, timeout_s)


def liveness(endpoint: str, timeout_s: float = PROBE_TIMEOUT_S) -> str | None:
    """None when the model server at `endpoint` (`.../v1`) is alive, else what is wrong. Each
    probe is a GET with a socket timeout of `timeout_s`; any HTTP answer that is not
    `UNAVAILABLE` (a route the server lacks included: 404, 405, 501) comes from a live server."""
    u = urllib.parse.urlsplit(endpoint)
    if u.scheme not in ("http", "https") or not u.hostname:
        return f"model endpoint {endpoint!r} is not an http(s) URL"
    for path in ("/health", u.path.rstrip("/") + "/models"):
        conn_cls = http.client.HTTPSConnection if u.scheme == "https" else http.client.HTTPConnection
        conn = conn_cls(u.hostname, u.port, timeout=timeout_s)
        try:
            conn.request("GET", path, headers={"Accept": "application/json"})
            resp = conn.getresponse()
            resp.read(65536)
            status = resp.status
        except (OSError, http.client.HTTPException) as exc:
            return f"the liveness probe GET {path} failed: {exc!r}"
        finally:
            conn.close()
        if status in UNAVAILABLE:
            return f"the liveness probe GET {path} answered HTTP {status}"
    return None



def chat(endpoint: str, payload: dict, timeout_s: float = MODEL_TIMEOUT_S) -> dict:
    return HTTPModel(endpoint).complete(payload, timeout_s)


__all__ = ["BudgetExhausted", "ContextLengthExceeded", "HTTPModel", "MAX_RESPONSE_BYTES", "MODEL_TIMEOUT_S", "Model", "ModelError",
           "ModelTimeout", "PROBE_TIMEOUT_S", "UNAVAILABLE", "chat", "check_reply", "decode_reply", "liveness"]


def decode_reply(endpoint: str, status: int, raw: bytes) -> dict:
    """A chat-completions reply's body, checked; or the ModelError (with `status` and `body`
    when the server sent them) that says what is wrong. The one reading of a reply, for the
    harness's client and the node gateway."""
    if len(raw) > MAX_RESPONSE_BYTES:
        raise ModelError(f"model server {endpoint} sent more than {MAX_RESPONSE_BYTES} bytes")
    if status in _CONTEXT_STATUSES and _CONTEXT_LENGTH.search(raw[:4096]):
        over = ContextLengthExceeded(f"model server {endpoint}: the conversation exceeds the model's "
                                     f"context: {raw[:300].decode(errors='replace')}")
        over.status = status
        over.context_tokens = _first_number(_CONTEXT_TOKENS, raw[:4096])
        over.prompt_tokens = _first_number(_PROMPT_TOKENS, raw[:4096])
        raise over
    if status != 200:
        err = ModelError(f"model server {endpoint} answered HTTP {status}: {raw[:300].decode(errors='replace')}")
        err.status = status
        try:
            err.body = json.loads(raw)
        except (ValueError, RecursionError):
            pass
        raise err
    try:
        body = json.loads(raw)
    except (ValueError, RecursionError) as exc:   # RecursionError: nested past the JSON reader
        raise ModelError(f"model server {endpoint} sent a body that is not JSON: {exc}") from None
    check_reply(body, endpoint)
    return body
