"""The gateway's wire format, pure: what it adds to a request so that a model server returns
token ids and logprobs, how it reads them back (from one reply, or from a stream's chunks:
`StreamAssembly`), how calls chain, and SSE for a client streaming from a non-streaming source.

Request flags, by server (`FLAVORS`):
- vLLM: `logprobs: true`, `top_logprobs: 0`, `return_token_ids: true` (top-level
  `prompt_token_ids`, `choices[0].token_ids`), `return_tokens_as_token_ids: true` (each
  `logprobs.content[].token` is `token_id:<id>`, so ids survive a server without
  `return_token_ids`);
- SGLang: `logprobs: true`, `return_prompt_token_ids: true` (`choices[0].prompt_token_ids`),
  `return_meta_info: true` (`choices[0].meta_info.output_token_logprobs`: `[logprob, id, text]`).
`"both"` (the default) sends both sets; each server ignores the other's keys.

`extract(body)` returns what the reply holds and nothing else: a field that is absent or
malformed is None (recorded as NULL and counted), never reconstructed from text.

Must not import: sockets, zmq, nodeagent.agent.
"""
from __future__ import annotations

import json
import math
from dataclasses import dataclass
from typing import Any, Sequence

FLAVORS = ("both", "vllm", "sglang")
_VLLM = {"logprobs": True, "top_logprobs": 0, "return_token_ids": True, "return_tokens_as_token_ids": True}
_SGLANG = {"logprobs": True, "return_prompt_token_ids": True, "return_meta_info": True}
LOADING_CODES = ("model_loading", "policy_loading", "weights_updating")
MAX_PARENT_SEARCH = 64        # earlier calls searched for a branch's parent


class WireError(ValueError):
    """A client request the gateway refuses (HTTP 400); the message names the field."""


def upstream_payload(payload: dict, model: str, flavor: str = "both", stream: bool = False) -> dict:
    """The request as forwarded: the rollout's model name, token flags set; streamed (with the
    usage chunk) when `stream`, else not."""
    if flavor not in FLAVORS:
        raise ValueError(f"gateway flavor {flavor!r}; valid: {', '.join(FLAVORS)}")
    out = {k: v for k, v in payload.items() if k not in ("stream", "stream_options")}
    out["model"] = model
    if stream:
        out["stream"], out["stream_options"] = True, {"include_usage": True}
    if flavor in ("both", "vllm"):
        out.update(_VLLM)
    if flavor in ("both", "sglang"):
        out.update(_SGLANG)
    return out


def check_request(payload: Any) -> None:
    if not isinstance(payload, dict):
        raise WireError("request body must be a JSON object")
    messages = payload.get("messages")
    if not isinstance(messages, list) or not messages or not all(isinstance(m, dict) for m in messages):
        raise WireError("'messages' must be a non-empty array of objects")
    if "tools" in payload and payload["tools"] is not None and not isinstance(payload["tools"], list):
        raise WireError("'tools' must be an array")
    n = payload.get("n", 1)
    if n not in (1, None):
        raise WireError("'n' must be 1 (one call, one record)")


@dataclass(frozen=True)
class Tokens:
    prompt_ids: list[int] | None
    completion_ids: list[int] | None
    logprobs: list[float] | None
    finish_reason: str | None


def _ints(v: Any) -> list[int] | None:
    if type(v) is list and all(type(i) is int for i in v):        # bool is not int here
        return v
    return None


def _floats(v: Any) -> list[float] | None:
    """Finite numbers or -inf (a token the sampler could not have drawn), as floats."""
    if type(v) is not list or not all(type(x) is float or type(x) is int for x in v):
        return None
    out = [float(x) for x in v]
    total = sum(out)                  # NaN if any is NaN (or +inf with -inf), +inf if any is +inf
    return None if total != total or total == math.inf else out


def _token_ids(content: list) -> list[int] | None:
    """vLLM `logprobs.content[].token` as `token_id:<n>` (return_tokens_as_token_ids)."""
    ids: list[int] = []
    for e in content:
        tok = e.get("token")
        if type(tok) is str and tok.startswith("token_id:") and tok[9:].lstrip("-").isdigit():
            ids.append(int(tok[9:]))
        else:
            return None
    return ids


def extract(body: dict) -> Tokens:
    """Token ids and logprobs of a chat-completions reply, in vLLM's or SGLang's form."""
    choice = (body.get("choices") or [{}])[0]
    if not isinstance(choice, dict):
        choice = {}
    prompt = _ints(body.get("prompt_token_ids"))
    if prompt is None:
        prompt = _ints(choice.get("prompt_token_ids"))
    completion = _ints(choice.get("token_ids"))
    lps = None
    lp = choice.get("logprobs")
    content = lp.get("content") if isinstance(lp, dict) else None
    if type(content) is list and all(type(e) is dict for e in content):
        lps = _floats([e.get("logprob") for e in content])
    else:
        content = None
    meta = choice.get("meta_info")
    if isinstance(meta, dict) and isinstance(meta.get("output_token_logprobs"), list) \
            and (completion is None or lps is None):
        rows = meta["output_token_logprobs"]
        if all(isinstance(r, (list, tuple)) and len(r) >= 2 for r in rows):
            if completion is None:
                completion = _ints([r[1] for r in rows])
            if lps is None:
                lps = _floats([r[0] for r in rows])
    if completion is None and content is not None:
        completion = _token_ids(content)
    if completion is not None and lps is not None and len(lps) != len(completion):
        lps = None            # misaligned: unusable for a gradient, so recorded as missing
    finish = choice.get("finish_reason")
    return Tokens(prompt, completion, lps, finish if isinstance(finish, str) else None)


def find_parent(history: Sequence[tuple[list[int] | None, list[int] | None]],
                prompt: list[int] | None) -> tuple[int | None, bool | None]:
    """(parent call index, prompt extends the previous call) for a call whose prompt ids are
    `prompt`, given earlier calls' (prompt ids, completion ids). The parent is the latest
    earlier call whose prompt + completion is a prefix of this prompt. Unknown ids → (None, None)."""
    if prompt is None or not history:
        return None, (None if prompt is None else False)
    last = len(history) - 1
    for i in range(last, max(-1, last - MAX_PARENT_SEARCH), -1):
        p, c = history[i]
        if p is None or c is None:
            continue
        n = len(p) + len(c)
        if n <= len(prompt) and prompt[:len(p)] == p and prompt[len(p):n] == c:
            return i, i == last
    prev_p, prev_c = history[last]
    return None, (None if prev_p is None or prev_c is None else False)


def is_loading_refusal(status: int | None, body: Any) -> bool:
    """A server refusing or aborting a call because a new policy version is being loaded."""
    if isinstance(body, dict):
        err = body.get("error")
        if isinstance(err, dict) and err.get("code") in LOADING_CODES:
            return True
        choices = body.get("choices")
        if status == 200 and isinstance(choices, list) and choices and isinstance(choices[0], dict) \
                and choices[0].get("finish_reason") == "abort":
            return True
    return status == 503


class StreamAssembly:
    """A streamed reply put back together, chunk by chunk (`add`), as the one reply `extract`
    reads (`body()`): content, reasoning and tool-call deltas concatenated (tool calls by
    `index`), vLLM's top-level `prompt_token_ids` (first chunk) and per-chunk
    `choices[0].token_ids` and `logprobs.content`, SGLang's `choices[0].prompt_token_ids` and
    per-chunk `meta_info.output_token_logprobs`, both concatenated in arrival order; the finish
    reason and the usage chunk. A field no chunk carried stays absent (recorded as NULL)."""

    def __init__(self) -> None:
        self.head: dict[str, Any] = {}
        self.content: list[str] = []
        self.reasoning: list[str] = []
        self.calls: dict[int, dict[str, Any]] = {}
        self.prompt_ids: Any = None
        self.choice_prompt_ids: Any = None
        self.ids: list[Any] | None = None
        self.lp_content: list[Any] | None = None
        self.meta_lps: list[Any] | None = None
        self.finish: str | None = None
        self.usage: Any = None
        self.output = False              # a chunk carried content, a tool call or tokens

    def add(self, chunk: dict) -> None:
        if not self.head:
            self.head = {k: chunk.get(k) for k in ("id", "created", "model")}
        if "prompt_token_ids" in chunk and self.prompt_ids is None:
            self.prompt_ids = chunk["prompt_token_ids"]
        if chunk.get("usage"):
            self.usage = chunk["usage"]
        choices = chunk.get("choices")
        if not isinstance(choices, list) or not choices or not isinstance(choices[0], dict):
            return
        c = choices[0]
        delta = c.get("delta") if isinstance(c.get("delta"), dict) else {}
        if isinstance(delta.get("content"), str) and delta["content"]:
            self.content.append(delta["content"])
            self.output = True
        for key in ("reasoning_content", "reasoning"):
            if isinstance(delta.get(key), str) and delta[key]:
                self.reasoning.append(delta[key])
                self.output = True
        for tc in delta.get("tool_calls") or []:
            if not isinstance(tc, dict):
                continue
            self.output = True
            call = self.calls.setdefault(tc.get("index", len(self.calls)), {"name": [], "arguments": []})
            for k in ("id", "type"):
                if tc.get(k):
                    call[k] = tc[k]
            fn = tc.get("function") if isinstance(tc.get("function"), dict) else {}
            if isinstance(fn.get("name"), str):
                call["name"].append(fn["name"])
            if isinstance(fn.get("arguments"), str):
                call["arguments"].append(fn["arguments"])
        if "prompt_token_ids" in c and self.choice_prompt_ids is None:
            self.choice_prompt_ids = c["prompt_token_ids"]
        if isinstance(c.get("token_ids"), list):
            self.ids = (self.ids or []) + c["token_ids"]
            self.output = self.output or bool(c["token_ids"])
        lp = c.get("logprobs")
        if isinstance(lp, dict) and isinstance(lp.get("content"), list):
            self.lp_content = (self.lp_content or []) + lp["content"]
        meta = c.get("meta_info")
        if isinstance(meta, dict) and isinstance(meta.get("output_token_logprobs"), list):
            self.meta_lps = (self.meta_lps or []) + meta["output_token_logprobs"]
        if isinstance(c.get("finish_reason"), str):
            self.finish = c["finish_reason"]

    def body(self) -> dict:
        message: dict[str, Any] = {"role": "assistant", "content": "".join(self.content)}
        if self.reasoning:
            message["reasoning_content"] = "".join(self.reasoning)
        if self.calls:
            message["tool_calls"] = [
                {"id": c.get("id"), "type": c.get("type", "function"),
                 "function": {"name": "".join(c["name"]), "arguments": "".join(c["arguments"])}}
                for _, c in sorted(self.calls.items(), key=lambda kv: kv[0] if isinstance(kv[0], int) else 0)]
        choice: dict[str, Any] = {"index": 0, "message": message,
                                  "logprobs": {"content": self.lp_content} if self.lp_content is not None else None,
                                  "finish_reason": self.finish}
        if self.ids is not None:
            choice["token_ids"] = self.ids
        if self.choice_prompt_ids is not None:
            choice["prompt_token_ids"] = self.choice_prompt_ids
        if self.meta_lps is not None:
            choice["meta_info"] = {"output_token_logprobs": self.meta_lps}
        out: dict[str, Any] = {"id": self.head.get("id"), "object": "chat.completion",
                               "created": self.head.get("created"), "model": self.head.get("model"),
                               "choices": [choice], "usage": self.usage}
        if self.prompt_ids is not None:
            out["prompt_token_ids"] = self.prompt_ids
        return out


def sse(body: dict, include_usage: bool = False) -> bytes:
    """A complete reply as an OpenAI stream (`text/event-stream`): one delta with the whole
    message (tool calls indexed), the finish chunk, the usage chunk if asked, `[DONE]`."""
    choice = body["choices"][0]
    msg = choice.get("message") or {}
    delta: dict[str, Any] = {"role": "assistant", "content": msg.get("content") or ""}
    if msg.get("tool_calls"):
        delta["tool_calls"] = [dict(c, index=i) for i, c in enumerate(msg["tool_calls"])]
    base = {"id": body.get("id", "chatcmpl-gateway"), "object": "chat.completion.chunk",
            "created": body.get("created", 0), "model": body.get("model", "")}
    chunks = [dict(base, choices=[{"index": 0, "delta": delta, "logprobs": choice.get("logprobs"),
                                   "finish_reason": None}]),
              dict(base, choices=[{"index": 0, "delta": {}, "finish_reason": choice.get("finish_reason")}])]
    if include_usage:
        chunks.append(dict(base, choices=[], usage=body.get("usage")))
    return b"".join(b"data: " + json.dumps(c).encode() + b"\n\n" for c in chunks) + b"data: [DONE]\n\n"


__all__ = ["FLAVORS", "StreamAssembly", "Tokens", "WireError", "check_request", "extract", "find_parent",
           "is_loading_refusal", "sse", "upstream_payload"]
