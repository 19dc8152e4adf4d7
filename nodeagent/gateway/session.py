"""One rollout's passage through the gateway: budgets, forwarding, retries across a weight
update, and the exact record of every call (the `model_calls` rows).

`Session.complete(payload, timeout_s)` is the `nodeagent.harness.model.Model` seam, so the
built-in harness calls it in process; `nodeagent.gateway.server` puts it behind HTTP for a
harness inside the sandbox. Each call:
1. is refused with `BudgetExhausted` (kind `calls`, `tokens` or `wall_time`) once the rollout's
   budget is spent; a request's `max_tokens` is clamped to the tokens left;
2. is forwarded to the endpoint and model of the *current* policy version (`upstream()` is read
   per attempt of the call) with the token flags of `wire.upstream_payload`, over one kept
   connection per endpoint (`nodeagent.gateway.upstream`; `close()` closes them);
3. is retried, the environment untouched, when the server refuses or aborts it because a new
   version is being loaded (`wire.is_loading_refusal`: HTTP 503, an error code of
   `wire.LOADING_CODES`, a 200 with `finish_reason: "abort"`; or the connection refused, a
   server restarting): at most `max_version_retries` times, with exponential backoff, within
   the wall budget, each retry under the version the node knows of then (`Follow.refresh`:
   the agent's newest `policy`); the row records the version that answered and the number
   of retries. A streamed call is retried only while nothing of it was forwarded;
4. is streamed (`stream`, from the HTTP front): the server streams, each event is forwarded as
   it comes, the reply is assembled from the chunks (`wire.StreamAssembly`) for the record;
5. is recorded: request messages, tools and other parameters, the reply (without its
   prompt ids, which have their own column), prompt and completion ids and per-token logprobs
   as the server sent them (None when it did not: never invented), finish reason, the parent
   call and whether the prompt extends the previous call's tokens, timings (`gateway_s`: the
   gateway's own time on the call's path, until the reply went out). Budgets are counted at
   once; the row itself is built when `rows` is read, off the call's path (the HTTP front
   sends a reply's bytes as they came, then decodes them: `forward`).
6. carries the rollout's trace: with `trace` (the attempt's root span context,
   `nodeagent.store.tracing.attempt_context`), each request to the model server has a W3C
   `traceparent` header whose parent is the call's model_call span (`model_call_context`:
   the same id the trajectory writer gives the n-th model_call span of the attempt).

`probe` and `unrecorded` reach the current version's server off the record (no row, no
budget): `nodeagent.harness.modelfault` uses them to decide whether a failed call was the
server's doing or the policy's.

Time is injected (`clock` monotonic for durations, `wall` for `started_at`, `sleep` for the
backoff). Must not import: zmq, nodeagent.agent, nodeagent.harness.loop.
"""
from __future__ import annotations

import itertools
import json
import logging
import re
import secrets
import threading
import time
from dataclasses import dataclass
from typing import Any, Callable

from controller.contracts.clock import utc_now
from controller.contracts.tasks import Budgets
from nodeagent.gateway import wire
from nodeagent.gateway.upstream import KeepAliveModel
from nodeagent.harness.model import PROBE_TIMEOUT_S, BudgetExhausted, Model, ModelError, ModelTimeout, decode_reply
from nodeagent.store import tracing

log = logging.getLogger(__name__)

MAX_VERSION_RETRIES = 8
RETRY_BASE_S = 0.05
RETRY_MAX_S = 2.0
_REQUEST_KEYS_APART = ("messages", "tools", "model", "stream", "stream_options")
_ABORT = re.compile(rb'"finish_reason"\s*:\s*"abort"')     # a 200 that is an aborted call
# A stream event read at once even after forwarding began: an abort or an error.
_SPECIAL_EVENT = re.compile(rb'"finish_reason"\s*:\s*"abort"|^\s*\{\s*"error"\s*:|"object"\s*:\s*"error"')
_USAGE_ONLY = re.compile(rb'"choices"\s*:\s*\[\s*\]')


_REPLICAS = itertools.count(secrets.randbelow(1 << 16))   # each node starts at its own replica


def replica(endpoint: str, k: int) -> str:
    """The endpoint a rollout calls when a policy version is served by several replicas: a
    published endpoint may be several URLs separated by spaces (the model servers a Slurm job
    started, slurm/servers.py); the rollouts of a node take them in turn, each rollout keeps its
    replica (its conversation's prefix is cached there)."""
    urls = endpoint.split()
    return urls[k % len(urls)] if len(urls) > 1 else endpoint


@dataclass(frozen=True)
class Upstream:
    """Where the current policy version is served."""
    version: int
    endpoint: str
    model: str


class Follow:
    """A rollout's upstream: its lease's version, until a call is refused or aborted because
    a new version is being loaded; then (`refresh`) the node's current policy if it is newer
    (`current()` gives an object with `version`, `endpoint`, `model`, or None). Never older."""

    def __init__(self, start: Upstream, current: Callable[[], Any]) -> None:
        self.up, self._current = start, current

    def __call__(self) -> Upstream:
        return self.up

    def refresh(self) -> Upstream:
        cur = self._current()
        if cur is not None and cur.version > self.up.version:
            log.info("the rollout follows policy version %d (was %d)", cur.version, self.up.version)
            self.up = Upstream(cur.version, cur.endpoint, cur.model)
        return self.up


@dataclass(frozen=True)
class GatewayBudgets:
    max_calls: int
    max_tokens: int
    wall_s: float

    @classmethod
    def of(cls, b: Budgets) -> "GatewayBudgets":
        """A task's budgets as the gateway enforces them: calls default to the step budget."""
        return cls(max_calls=b.max_model_calls or b.max_steps, max_tokens=b.max_tokens, wall_s=b.wall_s)


class Session:
    """The gateway's state for one rollout attempt. Thread-safe: calls are serialised."""

    def __init__(self, upstream: Upstream | Callable[[], Upstream], budgets: GatewayBudgets, *,
                 source: str = "builtin", flavor: str = "both",
                 clock: Callable[[], float] = time.monotonic, wall: Callable[[], Any] = utc_now,
                 sleep: Callable[[float], None] = time.sleep,
                 client: Callable[[str], Model] | None = None,
                 max_version_retries: int = MAX_VERSION_RETRIES,
                 trace: tracing.TraceContext | None = None) -> None:
        if flavor not in wire.FLAVORS:
            raise ValueError(f"gateway flavor {flavor!r}; valid: {', '.join(wire.FLAVORS)}")
        self._upstream = upstream if callable(upstream) else (lambda: upstream)
        self.budgets, self.source, self.flavor = budgets, source, flavor
        self._clock, self._wall, self._sleep = clock, wall, sleep
        self._client = client or (lambda endpoint: KeepAliveModel(endpoint, clock))
        self._clients: dict[str, Model] = {}
        self._replica = next(_REPLICAS)   # which replica of a policy served by several (`replica`)
        self.max_version_retries = max_version_retries
        self.key = "pdk-" + secrets.token_hex(16)     # the OPENAI_API_KEY a harness is given
        self.deadline = clock() + budgets.wall_s
        self._rows: list[dict] = []
        self._pending: list[tuple] = []     # calls recorded but not yet written out as rows
        self.tokens_used = 0
        self._charged = 0               # calls counted against the budget (all but refusals)
        self._history: list[tuple[list[int] | None, list[int] | None]] = []
        self._lock = threading.Lock()
        self.trace = trace              # the attempt's root span (tracing.attempt_context) or None

    # -- the Model seam ---------------------------------------------------------------------

    def complete(self, payload: dict, timeout_s: float) -> dict:
        with self._lock:
            return self._call(payload, timeout_s)[0]

    def forward(self, payload: dict, timeout_s: float, send: Callable[[bytes], None]) -> dict:
        """The HTTP front's call: a 200 reply's bytes go to `send` as the model server sent
        them, before the gateway decodes and records them (off the client's path); returns
        the decoded reply. A reply that fails to decode after it was sent is recorded as an
        error (ModelError with `forwarded` set)."""
        with self._lock:
            return self._call(payload, timeout_s, send=send)[0]

    def stream(self, payload: dict, timeout_s: float, emit: Callable[[bytes], None]) -> dict:
        """A `stream: true` call, streamed from the model server: `emit(data)` gets each
        server-sent event's data for the client (ending with b"[DONE]"); returns the reply as
        assembled from the chunks (what is recorded)."""
        with self._lock:
            return self._call(payload, timeout_s, emit)[0]

    def close(self) -> None:
        """Close the kept connections to the model servers (the rows stay)."""
        with self._lock:
            for client in self._clients.values():
                close = getattr(client, "close", None)
                if close is not None:
                    close()
            self._clients.clear()

    @property
    def calls(self) -> int:
        return len(self._rows) + len(self._pending)

    @property
    def rows(self) -> list[dict]:
        """The model_calls rows so far, in call order (a call's row is built when first read)."""
        with self._lock:
            if self._pending:
                for p in self._pending:
                    self._rows.append(self._row(*p))
                self._pending.clear()
            return self._rows

    def last_content(self) -> str | None:
        """The content of the last answered call's message (a harness's final answer)."""
        for row in reversed(self.rows):
            if row["status"] == "ok":
                return json.loads(row["response"])["choices"][0]["message"].get("content")
        return None

    # -- one call -----------------------------------------------------------------------------

    def _check_budget(self, now: float) -> None:
        b = self.budgets
        if self._charged >= b.max_calls:
            raise BudgetExhausted("calls", f"the rollout's budget of {b.max_calls} model calls is spent")
        if self.tokens_used >= b.max_tokens:
            raise BudgetExhausted("tokens", f"the rollout's budget of {b.max_tokens} tokens is spent")
        if now >= self.deadline:
            raise BudgetExhausted("wall_time", f"the rollout's wall budget of {b.wall_s}s is spent")

    def _call(self, payload: dict, timeout_s: float, emit: Callable[[bytes], None] | None = None,
              send: Callable[[bytes], None] | None = None) -> tuple[dict, bytes | None]:
        t_in, started = self._clock(), self._wall()
        wire.check_request(payload)
        call_trace = tracing.model_call_context(self.trace, self.calls) if self.trace is not None else None
        try:
            self._check_budget(t_in)
        except BudgetExhausted as exc:
            self._record(payload, started, t_in, None, None, 0, 0.0, "budget", str(exc))
            raise
        left = self.budgets.max_tokens - self.tokens_used
        payload = dict(payload)
        for key in ("max_tokens", "max_completion_tokens"):
            if key in payload or key == "max_tokens":
                asked = payload.get(key)
                payload[key] = left if not isinstance(asked, int) or isinstance(asked, bool) else min(asked, left)
        retries, upstream_s, passthrough = 0, 0.0, False
        while True:
            up = self._upstream()
            remaining = min(timeout_s, self.deadline - self._clock())
            t0 = self._clock()
            try:
                if remaining <= 0:
                    raise ModelTimeout("no wall budget left for the model call")
                client = self._client_for(up.endpoint)
                if call_trace is not None and hasattr(client, "traceparent"):
                    client.traceparent = call_trace.header()
                fwd = wire.upstream_payload(payload, up.model, self.flavor, stream=emit is not None
                                            and hasattr(client, "stream"))
                if emit is not None:
                    body, raw = self._stream_once(client, fwd, remaining, emit, payload), None
                elif send is not None and hasattr(client, "exchange"):
                    status, raw = client.exchange(fwd, remaining)
                    if status != 200 or _ABORT.search(raw):
                        body = decode_reply(up.endpoint, status, raw)    # raises unless an abort
                    else:
                        passthrough = True         # sent as it came, read afterwards
                elif hasattr(client, "complete_raw"):
                    body, raw = client.complete_raw(fwd, remaining)
                else:
                    body, raw = client.complete(fwd, remaining), None
                status, err = 200, None
            except ModelError as exc:
                body, status, err = exc.body, exc.status, exc
            except OSError as exc:                 # `emit`: the client went away mid-stream
                upstream_s += self._clock() - t0
                self._record(payload, started, t_in, up, None, retries, upstream_s, "error",
                             f"the client closed the stream: {exc!r}")
                raise
            upstream_s += self._clock() - t0
            if passthrough:
                return self._send_then_record(payload, started, t_in, up, raw, retries, upstream_s, send), raw
            refused = wire.is_loading_refusal(status, body) or bool(err is not None and getattr(err, "refused", False))
            if refused and not (err is not None and getattr(err, "forwarded", False)) \
                    and retries < self.max_version_retries and self._clock() < self.deadline:
                retries += 1
                if err is not None and getattr(err, "refused", False):
                    # say what happened: a refused connection is also what "nothing serves
                    # this endpoint" looks like, not only a restart to load weights
                    log.warning("model server %s refused the connection (not running, or restarting "
                                "to load a version); retry %d of the call (version %d)",
                                up.endpoint, retries, up.version)
                else:
                    log.info("model server is loading a new version; retry %d of the call (version %d)",
                             retries, up.version)
                self._sleep(min(RETRY_BASE_S * 2 ** (retries - 1), RETRY_MAX_S,
                                max(self.deadline - self._clock(), 0.0)))
                refresh = getattr(self._upstream, "refresh", None)
                if refresh is not None:
                    refresh()                   # the version the node knows of now
                continue
            if err is not None:
                self._record(payload, started, t_in, up, None, retries, upstream_s, "error", str(err))
                raise err
            if refused:           # an abort still there after the last retry: not a reply
                err = ModelError(f"model server {up.endpoint} kept aborting the call (a weight update) "
                                 f"after {retries} retries")
                self._record(payload, started, t_in, up, None, retries, upstream_s, "error", str(err))
                raise err
            self._record(payload, started, t_in, up, body, retries, upstream_s, "ok", None)
            if send is not None:
                send(raw if raw is not None else json.dumps(body).encode())
            return body, raw

    def _send_then_record(self, payload: dict, started, t_in: float, up: Upstream, raw: bytes,
                          retries: int, upstream_s: float, send: Any) -> dict:
        """A 200 reply sent to the client as it came, then decoded and recorded."""
        gateway_s = max(self._clock() - t_in - upstream_s, 0.0)
        try:
            send(raw)
        except OSError:               # the client went away: the call is still recorded
            self._after_send(payload, started, t_in, up, raw, retries, upstream_s, gateway_s)
            raise
        return self._after_send(payload, started, t_in, up, raw, retries, upstream_s, gateway_s)

    def _after_send(self, payload: dict, started, t_in: float, up: Upstream, raw: bytes, retries: int,
                    upstream_s: float, gateway_s: float) -> dict:
        try:
            body = decode_reply(up.endpoint, 200, raw)
        except ModelError as exc:
            exc.forwarded = True
            self._record(payload, started, t_in, up, None, retries, upstream_s, "error", str(exc), gateway_s)
            raise
        self._record(payload, started, t_in, up, body, retries, upstream_s, "ok", None, gateway_s)
        return body

    def _stream_once(self, client: Any, fwd: dict, timeout_s: float, emit: Callable[[bytes], None],
                     payload: dict) -> dict:
        """One streamed exchange: each event's data is passed to `emit` as it arrives, except
        that events are held back until one carries output, so that a refusal or an abort
        before any output is retried unseen; the reply is assembled from the chunks. An abort
        after output was forwarded is a ModelError with `forwarded` set (not retried)."""
        want_usage = bool((payload.get("stream_options") or {}).get("include_usage"))
        if not hasattr(client, "stream"):          # a Model without streaming (replay, tests)
            body = client.complete(fwd, timeout_s)
            if not wire.is_loading_refusal(200, body):
                for event in wire.sse(body, want_usage).split(b"\n\n")[:-1]:
                    emit(event[6:])
            return body
        asm, held, forwarded, later = wire.StreamAssembly(), [], False, []
        events = client.stream(fwd, timeout_s)
        try:
            for data in events:
                if data == b"[DONE]":
                    break
                if forwarded and not _SPECIAL_EVENT.search(data):
                    later.append(data)             # the harness's now: sent at once, read after [DONE]
                    if want_usage or not _USAGE_ONLY.search(data):
                        emit(data)
                    continue
                chunk = _event(data, forwarded)
                asm.add(chunk)
                if asm.finish == "abort":
                    if forwarded:
                        err = ModelError("the model server aborted the streamed call after part of it was "
                                         "forwarded (a weight update)")
                        err.forwarded = True
                        raise err
                    return asm.body()              # retried by the caller, nothing forwarded
                if chunk.get("usage") and not chunk.get("choices") and not want_usage:
                    continue                       # the usage chunk only the gateway asked for
                if not forwarded and not asm.output and asm.finish is None:
                    held.append(data)
                    continue
                for h in held:
                    emit(h)
                held, forwarded = [], True
                emit(data)
        finally:
            close = getattr(events, "close", None)
            if close is not None:
                close()
        for h in held:
            emit(h)
        emit(b"[DONE]")
        for data in later:
            asm.add(_event(data, True))
        return asm.body()

    # -- whose is a failure (nodeagent.harness.modelfault): calls that are not the rollout's ------

    def probe(self, timeout_s: float = PROBE_TIMEOUT_S) -> str | None:
        """None when the current policy version's server is alive, else what is wrong (a
        client that cannot be probed: a Model given as the endpoint without `probe`)."""
        client = self._client_for(self._upstream().endpoint)
        probe = getattr(client, "probe", None)
        return probe(timeout_s) if probe is not None else "the model client cannot be probed"

    def unrecorded(self, payload: dict, timeout_s: float) -> dict:
        """`payload` sent to the current version's server as a call would be (its model, its
        token flags), but neither recorded nor counted against the rollout's budgets."""
        up = self._upstream()
        client = self._client_for(up.endpoint)
        fwd = wire.upstream_payload(payload, up.model, self.flavor, stream=False)
        call = getattr(client, "unrecorded", None) or client.complete
        return call(fwd, timeout_s)      # the caller bounds it: not the rollout's wall time

    def _client_for(self, endpoint: "str | Model") -> Model:
        if not isinstance(endpoint, str):
            return endpoint             # a Model given as the endpoint (replay, tests)
        endpoint = replica(endpoint, self._replica)
        c = self._clients.get(endpoint)
        if c is None:
            c = self._clients[endpoint] = self._client(endpoint)
        return c

    def _record(self, payload: dict, started, t_in: float, up: Upstream | None, body: dict | None,
                retries: int, upstream_s: float, status: str, error: str | None,
                gateway_s: float | None = None) -> None:
        """Count the call (budgets are exact at once); its row is built when `rows` is read.
        The messages list is copied: a harness appends to its own list after the call."""
        usage = (body or {}).get("usage") or {}
        if status == "ok":
            self.tokens_used += _int(usage.get("prompt_tokens")) + _int(usage.get("completion_tokens"))
        if status != "budget":
            self._charged += 1
        if gateway_s is None:
            gateway_s = max(self._clock() - t_in - upstream_s, 0.0)
        msgs = payload.get("messages")
        self._pending.append((dict(payload, messages=list(msgs) if isinstance(msgs, list) else msgs),
                              started, up, body, retries, upstream_s, status, error, gateway_s))

    def _row(self, payload: dict, started, up: Upstream | None, body: dict | None, retries: int,
             upstream_s: float, status: str, error: str | None, gateway_s: float) -> dict:
        toks = wire.extract(body) if body is not None else wire.Tokens(None, None, None, None)
        if status == "ok":
            parent, extends = wire.find_parent(self._history, toks.prompt_ids)
            self._history.append((toks.prompt_ids, toks.completion_ids))
        else:
            parent, extends = None, None
        usage = (body or {}).get("usage") or {}
        p_tok, c_tok = usage.get("prompt_tokens"), usage.get("completion_tokens")
        params = {k: v for k, v in payload.items() if k not in _REQUEST_KEYS_APART}
        return {
            "call_index": len(self._rows), "parent_call": parent, "prompt_extends_previous": extends,
            "source": self.source, "step": None,
            "call_policy_version": up.version if up else None, "model": up.model if up else None,
            "request_model": payload.get("model") if isinstance(payload.get("model"), str) else None,
            "request_messages": json.dumps(payload.get("messages")),
            "request_tools": json.dumps(payload["tools"]) if payload.get("tools") else None,
            "request_params": json.dumps(params, sort_keys=True, default=str),
            "response": json.dumps(_without_prompt_ids(body)) if body is not None else None,
            "finish_reason": toks.finish_reason, "prompt_token_ids": toks.prompt_ids,
            "completion_token_ids": toks.completion_ids, "completion_logprobs": toks.logprobs,
            "prompt_tokens": p_tok if isinstance(p_tok, int) else None,
            "completion_tokens": c_tok if isinstance(c_tok, int) else None,
            "status": status, "error": error, "retries": retries, "started_at": started,
            "upstream_s": upstream_s, "gateway_s": gateway_s,
        }


def _event(data: bytes, forwarded: bool) -> dict:
    """One stream event's chunk; a ModelError (with `forwarded`) for one that is not a chunk."""
    try:
        chunk = json.loads(data)
    except ValueError:
        chunk = None
    if not isinstance(chunk, dict) or "error" in chunk or chunk.get("object") == "error":
        err = ModelError(f"model server sent a stream event that is not a chunk: "
                         f"{data[:300].decode(errors='replace')}")
        err.body, err.forwarded = chunk, forwarded
        raise err
    return chunk


def _int(v: Any) -> int:
    return v if isinstance(v, int) and not isinstance(v, bool) else 0


def _without_prompt_ids(body: dict) -> dict:
    """The reply as stored in `response`: the prompt ids live in their own list column."""
    out = {k: v for k, v in body.items() if k != "prompt_token_ids"}
    if isinstance(out.get("choices"), list):
        out["choices"] = [{k: v for k, v in c.items() if k != "prompt_token_ids"} if isinstance(c, dict) else c
                          for c in out["choices"]]
    return out


__all__ = ["BudgetExhausted", "Follow", "GatewayBudgets", "Session", "Upstream"]
