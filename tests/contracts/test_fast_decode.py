"""The hand-parsed `started` and agent `heartbeat` (contracts/batching.py FAST_BUILD) decode
exactly what the codec's generic path decodes, and refuse exactly what it refuses, with the
same reason and field: every body below, valid or not, alone and (a `started`) inside a
batch, is decoded both ways and the answers compared."""
from __future__ import annotations

import itertools
import json

import pytest

from controller.contracts import codec
from controller.contracts import protocol as p

DEP = "dep-fast"

STARTED = {"rollout_id": "b000001-00007", "attempt": 2, "token": 41}
HEARTBEAT = {"node": "node00001", "slots_free": 3, "active": 29, "health": {"load": 1.5},
             "images": ["sha256:" + "a" * 64], "held": ["b1-00001", "b1-00002"]}
# values of every JSON kind (and edge values of the right kind) put in each field in turn
VALUES = [None, True, False, 0, -1, 7, 2**40, 1.0, float("-0.0"), "", "x\u2603\"q", [], ["a"], ["a", 1],
          [None], {}, {"k": "v"}, {"k": [1, None]}]


def _frame(mtype: str, body: dict, msg_id="m1") -> bytes:
    return json.dumps({"v": 1, "dep": DEP, "type": mtype, "id": msg_id, "body": body}).encode()


def _both(data: bytes, monkeypatch) -> tuple:
    def one():
        try:
            m = p.decode(data, DEP)
            return ("ok", type(m), m)
        except p.RemoteProtocolError as e:
            return ("err", e.reason, e.field)
    fast = one()
    with monkeypatch.context() as m:
        m.setattr(codec, "_FAST_BUILD", {})
        generic = one()
    return fast, generic


def _bodies(base: dict) -> list[dict]:
    out = [dict(base)]
    for key, value in itertools.product(list(base) + ["extra", "id"], VALUES):
        out.append({**base, key: value})
    for key in base:  # each field missing
        out.append({k: v for k, v in base.items() if k != key})
    return out


@pytest.mark.parametrize("mtype,base", [("started", STARTED), ("heartbeat", HEARTBEAT),
                                        ("heartbeat", {**HEARTBEAT, "images": None, "held": None}),
                                        ("heartbeat", {k: HEARTBEAT[k] for k in ("node", "slots_free",
                                                                                 "active", "health")})])
def test_the_hand_parsed_messages_decode_and_refuse_as_the_generic_path(mtype, base, monkeypatch):
    bodies = _bodies(base)
    fast_hits = 0
    for body in bodies:
        fast, generic = _both(_frame(mtype, body), monkeypatch)
        assert fast == generic, (body, fast, generic)
        fast_hits += fast[0] == "ok"
    assert fast_hits >= 5  # the valid variants are there, not only refusals


def test_a_started_in_a_result_batch_item_position_is_still_refused(monkeypatch):
    """A batch carries results only: a `started` body there is refused the same both ways."""
    item = {**STARTED, "id": "i1"}
    fast, generic = _both(_frame("result_batch", {"items": [item]}), monkeypatch)
    assert fast == generic and fast[0] == "err"


def test_the_fast_path_takes_the_agents_frames(monkeypatch):
    """The frames agents send are the ones hand-parsed (the generic builder is not reached)."""
    msgs = [p.Started(**STARTED), p.Heartbeat(**HEARTBEAT),
            p.Heartbeat(**{**HEARTBEAT, "images": None, "held": None})]
    frames = [p.encode(m, DEP) for m in msgs]
    calls = []
    real = codec._checked_body
    monkeypatch.setattr(codec, "_checked_body", lambda cls, body: calls.append(cls) or real(cls, body))
    assert [p.decode(f, DEP) for f in frames] == msgs
    assert calls == []
