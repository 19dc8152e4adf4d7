"""The state checker (`checker.kind: state`): a conversational rollout's final service state
against the task's goal state, plus what the agent told the user.

`grade_state(spec, conversation)` returns the verdict's fields as a dict (`outcome`, `reward`,
`components`, `checks`, `tampered`); `grade.verify` wraps it. `conversation` is what the
rollout's harness captured on the node (nodeagent/agent/attempt.py): `final_state` ({service:
state}, from `nodeagent.services.host.ServiceHost`, which holds the state outside the agent's
sandbox), `tampered` (service replies that did not verify: the agent interfered with the
service's interpreter), `told` (the agent's messages to the user).

- `match: exact` (default): each service named in `goal` must equal its goal state exactly;
- `match: fields`: each JSON pointer of `fields` (`/service/key/...`) must resolve to the same
  value in the final and the goal state (both missing counts as equal);
- `told.include`: each phrase must appear (case-insensitive) in some message to the user;
  `told.exclude`: none may.

The goal lives in the checker spec, which reaches only the node's verifier: the agent's
sandbox never holds it, and nothing the agent says or writes is read as a verdict. Any failed
check or any tampering is `fail` (reward 0). No conversation captured is an infrastructure
error (`StateCheckError`), never a score.

Must not import: zmq, controller.* outside contracts, nodeagent.agent, nodeagent.harness.loop,
nodeagent.verifier.grade.
"""
from __future__ import annotations

import json
from typing import Any, Mapping

_MISSING = object()


class StateCheckError(Exception):
    """No state to grade: infrastructure, never a score."""


def _check(name: str, verdict: str, detail: str) -> dict:
    return {"check": name, "verdict": verdict, "detail": detail[:4000], "wall_s": 0.0}


def _canon(v: Any) -> str:
    return json.dumps(v, sort_keys=True, separators=(",", ":"))


def pointer(doc: Any, ptr: str) -> Any:
    """RFC 6901 JSON pointer lookup; `_MISSING` when a segment is absent."""
    node = doc
    for raw in ptr.split("/")[1:]:
        seg = raw.replace("~1", "/").replace("~0", "~")
        if isinstance(node, Mapping):
            node = node.get(seg, _MISSING)
        elif isinstance(node, list) and seg.isdigit() and int(seg) < len(node):
            node = node[int(seg)]
        else:
            return _MISSING
        if node is _MISSING:
            return _MISSING
    return node


def differences(got: Any, want: Any, path: str = "", limit: int = 8) -> list[str]:
    """Up to `limit` JSON pointers where `got` differs from `want`, with both values."""
    out: list[str] = []

    def walk(g, w, p):
        if len(out) >= limit:
            return
        if isinstance(g, Mapping) and isinstance(w, Mapping):
            for k in sorted(set(g) | set(w)):
                walk(g.get(k, _MISSING), w.get(k, _MISSING), f"{p}/{k}")
        elif _canon_or(g) != _canon_or(w):
            out.append(f"{p or '/'}: {_show(g)} != goal {_show(w)}")
    walk(got, want, path)
    return out


def _canon_or(v: Any) -> str:
    return "<missing>" if v is _MISSING else _canon(v)


def _show(v: Any) -> str:
    return _canon_or(v)[:200]


def grade_state(spec: Mapping[str, Any], conversation: Mapping[str, Any] | None) -> dict:
    """The verdict of a state checker (see the module docstring)."""
    if not conversation or not isinstance(conversation.get("final_state"), Mapping):
        raise StateCheckError("the rollout captured no service state to grade")
    final = conversation["final_state"]
    checks = [_check("state:final", "recorded", _canon(final))]
    tampered = list(conversation.get("tampered") or ())
    if tampered:
        checks.append(_check("service_integrity", "tampered", "; ".join(tampered)))
        return {"outcome": "fail", "reward": 0.0, "tampered": True, "checks": checks,
                "components": {"correct": 0.0, "state": 0.0, "tamper": 1.0}}
    goal = spec["goal"]
    ok = True
    if spec.get("match", "exact") == "fields":
        for ptr in spec["fields"]:
            got, want = pointer(final, ptr), pointer(goal, ptr)
            same = _canon_or(got) == _canon_or(want)
            ok &= same
            checks.append(_check(f"state:{ptr}", "pass" if same else "fail",
                                 "as the goal" if same else f"{_show(got)} != goal {_show(want)}"))
    else:
        for svc in sorted(goal):
            diffs = differences(final.get(svc, _MISSING), goal[svc], f"/{svc}")
            ok &= not diffs
            checks.append(_check(f"state:{svc}", "fail" if diffs else "pass",
                                 "; ".join(diffs) if diffs else "equals the goal state"))
    state_ok = ok
    told = spec.get("told") or {}
    said = "\n".join(str(m) for m in conversation.get("told") or ()).lower()
    for phrase in told.get("include", ()):
        hit = phrase.lower() in said
        ok &= hit
        checks.append(_check(f"told:include:{phrase}"[:200], "pass" if hit else "fail",
                             "said to the user" if hit else "never said to the user"))
    for phrase in told.get("exclude", ()):
        hit = phrase.lower() in said
        ok &= not hit
        checks.append(_check(f"told:exclude:{phrase}"[:200], "fail" if hit else "pass",
                             "said to the user" if hit else "not said"))
    return {"outcome": "pass" if ok else "fail", "reward": float(ok), "tampered": False, "checks": checks,
            "components": {"correct": float(ok), "state": float(state_ok)}}


__all__ = ["StateCheckError", "differences", "grade_state", "pointer"]
