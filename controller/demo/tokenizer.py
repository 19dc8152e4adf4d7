"""The scripted policy's own small tokenizer and chat template: deterministic token ids, so the
token-level wire format (prompt ids, completion ids, per-token logprobs) is tested end to end
without a real model.

A token is a run of word characters or one other non-space character; its id is
`FIRST_WORD_ID + blake2b(token) mod WORD_IDS` (stable across processes and machines). A chat
renders as, per message, `<role id> tokens(content) tokens(tool calls) END`, then `ASSISTANT`
(the generation prompt); a completion is `tokens(content) tokens(tool calls) END`. So the
prompt of the next turn of a linear conversation extends the previous prompt plus its
completion token for token (the property the gateway's `prompt_extends_previous` flag tests).

`token_fields(request, message, strategy_logprob)` shapes what a request asked for in the
forms vLLM and SGLang use: vLLM (`return_token_ids`: top-level `prompt_token_ids` and
`choices[0].token_ids`; `logprobs`: `choices[0].logprobs.content[]`, each token written
`token_id:<id>` under `return_tokens_as_token_ids`) and SGLang (`return_prompt_token_ids`:
`choices[0].prompt_token_ids`; `return_meta_info`: `choices[0].meta_info.output_token_logprobs`
as `[logprob, id, text]`). The scripted policy is deterministic once its strategy is drawn, so
every completion token has logprob 0.0 except the strategy's name in the first turn, which
carries log p(strategy).

Pure functions; must not import: sockets, zmq, sqlite3, nodeagent.
"""
from __future__ import annotations

import hashlib
import json
import re
from typing import Any, Iterable

SYSTEM, USER, ASSISTANT, TOOL, END = 1, 2, 3, 4, 5
ROLE_IDS = {"system": SYSTEM, "developer": SYSTEM, "user": USER, "assistant": ASSISTANT, "tool": TOOL}
FIRST_WORD_ID = 256
WORD_IDS = 65_000
VOCAB_SIZE = FIRST_WORD_ID + WORD_IDS
_TOKEN = re.compile(r"\w+|[^\w\s]")
_SPECIAL_TEXT = {SYSTEM: "<|system|>", USER: "<|user|>", ASSISTANT: "<|assistant|>", TOOL: "<|tool|>",
                 END: "<|end|>"}


def split(text: str) -> list[str]:
    """The tokens of `text` as strings."""
    return _TOKEN.findall(text)


def token_id(token: str) -> int:
    digest = hashlib.blake2b(token.encode(), digest_size=8).digest()
    return FIRST_WORD_ID + int.from_bytes(digest, "big") % WORD_IDS


def encode(text: str) -> list[int]:
    return [token_id(t) for t in split(text)]


def token_text(ids: Iterable[int], text_tokens: Iterable[str]) -> list[str]:
    """Display text per id: the special tokens' names, else the token string given."""
    out, words = [], iter(text_tokens)
    for i in ids:
        out.append(_SPECIAL_TEXT[i] if i in _SPECIAL_TEXT else next(words))
    return out


def _content_text(content: Any) -> str:
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    return "".join(p.get("text", "") for p in content if isinstance(p, dict))


def _calls_text(calls: Any) -> str:
    """Tool calls as the template writes them: `name arguments` per call (arguments verbatim)."""
    parts = []
    for c in calls or []:
        fn = c.get("function") or {} if isinstance(c, dict) else {}
        args = fn.get("arguments")
        parts.append(f"{fn.get('name') or ''} {args if isinstance(args, str) else json.dumps(args)}")
    return " ".join(parts)


def message_tokens(message: dict) -> list[str]:
    """The word tokens of one message (content, then tool calls), without the role/END ids."""
    return split(_content_text(message.get("content"))) + split(_calls_text(message.get("tool_calls")))


def render_prompt(messages: list[dict]) -> tuple[list[int], list[str]]:
    """(prompt ids, prompt tokens as text) of a conversation, ending with the generation prompt."""
    ids: list[int] = []
    words: list[str] = []
    for m in messages:
        toks = message_tokens(m)
        ids.append(ROLE_IDS.get(m.get("role"), USER))
        ids.extend(token_id(t) for t in toks)
        ids.append(END)
        words.extend(toks)
    ids.append(ASSISTANT)
    return ids, token_text(ids, words)


def render_completion(message: dict) -> tuple[list[int], list[str]]:
    """(completion ids, tokens as text) of one assistant message, ending with END."""
    toks = message_tokens(message)
    ids = [token_id(t) for t in toks] + [END]
    return ids, token_text(ids, toks)


TOKEN_FLAGS = ("return_token_ids", "return_prompt_token_ids", "return_meta_info")


def wants_tokens(req: dict) -> bool:
    """Does the request ask for the token-level wire format (any server's spelling)?"""
    return any(bool(req.get(k)) for k in TOKEN_FLAGS)


def token_fields(req: dict, message: dict, strategy: str | None, strategy_logprob: float | None
                 ) -> tuple[dict, dict, dict]:
    """(top-level fields, choice fields, usage) for a token-level reply to `req`."""
    prompt_ids, _ = render_prompt(req["messages"])
    ids, texts = render_completion(message)
    lps = [0.0] * len(ids)
    if strategy is not None and strategy_logprob is not None and strategy in texts:
        lps[texts.index(strategy)] = strategy_logprob
    top: dict[str, Any] = {}
    choice: dict[str, Any] = {}
    if req.get("return_token_ids"):
        top["prompt_token_ids"] = prompt_ids
        choice["token_ids"] = ids
    if req.get("return_prompt_token_ids"):
        choice["prompt_token_ids"] = prompt_ids
    if req.get("logprobs"):
        as_ids = bool(req.get("return_tokens_as_token_ids"))
        choice["logprobs"] = {"content": [
            {"token": f"token_id:{i}" if as_ids else t, "logprob": lp, "bytes": None, "top_logprobs": []}
            for i, t, lp in zip(ids, texts, lps)]}
    if req.get("return_meta_info"):
        choice["meta_info"] = {"prompt_tokens": len(prompt_ids), "completion_tokens": len(ids),
                               "output_token_logprobs": [[lp, i, None] for i, lp in zip(ids, lps)]}
    usage = {"prompt_tokens": len(prompt_ids), "completion_tokens": len(ids),
             "total_tokens": len(prompt_ids) + len(ids)}
    return top, choice, usage


__all__ = ["TOKEN_FLAGS", "token_fields", "wants_tokens", "ASSISTANT", "END", "FIRST_WORD_ID", "ROLE_IDS", "SYSTEM", "TOOL", "USER", "VOCAB_SIZE",
           "encode", "message_tokens", "render_completion", "render_prompt", "split", "token_id"]
