"""The gateway's wire format, pure: what it adds to a request so that a model server returns
token ids and logprobs, how it reads them back, how calls chain, and SSE for streaming clients.

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


def upstream_payload(payload: dict, model: str, flavor: str = "both") -> dict:
    """The request as forwarded: the rollout's model name, non-streaming, token flags set."""
    if flavor not in FLAVORS:
        raise ValueError(f"gateway flavor {flavor!r}; valid: {', '.join(FLAVORS)}")
    out = {k: v for k, v in payload.items() if k not in ("stream", "stream_options")}
    out["model"] = model
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
    if isinstance(v, list) and all(isinstance(i, int) and not isinstance(i, bool) for i in v):
        return list(v)
    return None


def _floats(v: Any) -> list[float] | None:
    if isinstance(v, list) and all(isinstance(x, (int, float)) and not isinstance(x, bool)
                                   and math.isfinite(x) or x == -math.inf for x in v):
        return [float(x) for x in v]
    return None


def _from_logprob_tokens(content: Any) -> tuple[list[int] | None, list[float] | None]:
    """vLLM `logprobs.content`: (ids if every token is `token_id:<n>`, the logprobs)."""
    if not isinstance(content, list) or not all(isinstance(e, dict) for e in content):
        return None, None
    lps = _floats([e.get("logprob") for e in content])
    ids: list[int] | None = []
    for e in content:
        tok = e.get("token")
        if isinstance(tok, str) and tok.startswith("token_id:") and tok[9:].lstrip("-").isdigit():
            ids.append(int(tok[9:]))
        else:
            ids = None
            break
    return ids, lps


def extract(body: dict) -> Tokens:
    """Token ids and logprobs of a chat-completions reply, in vLLM's or SGLang's form."""
    choice = (body.get("choices") or [{}])[0]
    if not isinstance(choice, dict):
        choice = {}
    prompt = _ints(body.get("prompt_token_ids"))
    if prompt is None:
        prompt = _ints(choice.get("prompt_token_ids"))
    completion = _ints(choice.get("token_ids"))
    lp_ids, lps = _from_logprob_tokens((choice.get("logprobs") or {}).get("content")
                                       if isinstance(choice.get("logprobs"), dict) else None)
    meta = choice.get("meta_info")
    if isinstance(meta, dict) and isinstance(meta.get("output_token_logprobs"), list):
        rows = meta["output_token_logprobs"]
        if all(isinstance(r, (list, tuple)) and len(r) >= 2 for r in rows):
            m_ids, m_lps = _ints([r[1] for r in rows]), _floats([r[0] for r in rows])
            completion = completion if completion is not None else m_ids
            lps = lps if lps is not None else m_lps
    if completion is None:
        completion = lp_ids
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


__all__ = ["FLAVORS", "Tokens", "WireError", "check_request", "extract", "find_parent",
           "is_loading_refusal", "sse", "upstream_payload"]
