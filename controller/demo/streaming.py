"""The scripted policy's streamed replies: a finished chat-completions reply cut into the
`chat.completion.chunk` events vLLM sends for `stream: true`, so the gateway's stream assembly
is tested against the server's own ids and logprobs.

`chunks(reply, include_usage)` is, in order: a first chunk with the role (and vLLM's top-level
`prompt_token_ids`, SGLang's `choices[0].prompt_token_ids` when the reply has them), then
STREAM_PIECES chunks each with a slice of the content, of the tool calls' arguments (the
call's id, type and name in the first slice carrying it), of `choices[0].token_ids`, of
`logprobs.content` and of `meta_info.output_token_logprobs`, then the finish chunk, then the
usage chunk when asked. `abort_chunks(reply)` is an in-flight call aborted by a weight update
(vLLM's `finish_reason: "abort"`, no output). `sse(chunks)` writes them as server-sent events
ending with `data: [DONE]`.

Pure; must not import: sockets, zmq, sqlite3, nodeagent.
"""
from __future__ import annotations

import json
from typing import Any

STREAM_PIECES = 3


def _cut(seq: Any, i: int, n: int) -> Any:
    return seq[i * len(seq) // n:(i + 1) * len(seq) // n]


def _base(reply: dict) -> dict:
    return {"id": reply["id"], "object": "chat.completion.chunk", "created": reply["created"],
            "model": reply["model"]}


def chunks(reply: dict, include_usage: bool = False, pieces: int = STREAM_PIECES) -> list[dict]:
    choice = reply["choices"][0]
    msg = choice["message"]
    first: dict[str, Any] = {"index": 0, "delta": {"role": "assistant", "content": ""},
                             "logprobs": None, "finish_reason": None}
    if "prompt_token_ids" in choice:
        first["prompt_token_ids"] = choice["prompt_token_ids"]
    out = [dict(_base(reply), choices=[first])]
    if "prompt_token_ids" in reply:
        out[0]["prompt_token_ids"] = reply["prompt_token_ids"]
    content = msg.get("content") or ""
    calls = msg.get("tool_calls") or []
    lp = (choice.get("logprobs") or {}).get("content")
    meta = (choice.get("meta_info") or {}).get("output_token_logprobs")
    for i in range(pieces):
        delta: dict[str, Any] = {}
        text = _cut(content, i, pieces)
        if text:
            delta["content"] = text
        tcs = []
        for j, call in enumerate(calls):
            args = _cut(call["function"]["arguments"], i, pieces)
            tc: dict[str, Any] = {"index": j, "function": {"arguments": args}}
            if i == 0:
                tc.update(id=call["id"], type=call["type"])
                tc["function"]["name"] = call["function"]["name"]
            if args or i == 0:
                tcs.append(tc)
        if tcs:
            delta["tool_calls"] = tcs
        c: dict[str, Any] = {"index": 0, "delta": delta, "finish_reason": None,
                             "logprobs": {"content": _cut(lp, i, pieces)} if lp is not None else None}
        if "token_ids" in choice:
            c["token_ids"] = _cut(choice["token_ids"], i, pieces)
        if meta is not None:
            c["meta_info"] = {"output_token_logprobs": _cut(meta, i, pieces)}
        out.append(dict(_base(reply), choices=[c]))
    out.append(dict(_base(reply), choices=[{"index": 0, "delta": {}, "logprobs": None,
                                            "finish_reason": choice["finish_reason"]}]))
    if include_usage:
        out.append(dict(_base(reply), choices=[], usage=reply["usage"]))
    return out


def abort_chunks(reply: dict) -> list[dict]:
    """A streamed call aborted before any output (the role chunk, then `abort`)."""
    return [dict(_base(reply), choices=[{"index": 0, "delta": {"role": "assistant", "content": ""},
                                         "logprobs": None, "finish_reason": None}]),
            dict(_base(reply), choices=[{"index": 0, "delta": {}, "logprobs": None, "finish_reason": "abort"}])]


def aborted(reply: dict) -> dict:
    """A non-streamed call aborted by a weight update: 200, no output, `finish_reason: abort`."""
    out = dict(reply, choices=[{"index": 0, "message": {"role": "assistant", "content": ""},
                                "logprobs": None, "finish_reason": "abort"}])
    out["usage"] = dict(reply.get("usage") or {}, completion_tokens=0)
    out.pop("prompt_token_ids", None)
    return out


def sse(events: list[dict]) -> list[bytes]:
    return [b"data: " + json.dumps(e).encode() + b"\n\n" for e in events] + [b"data: [DONE]\n\n"]


__all__ = ["STREAM_PIECES", "abort_chunks", "aborted", "chunks", "sse"]
