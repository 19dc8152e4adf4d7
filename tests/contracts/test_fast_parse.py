"""A frame's JSON read by the decoder's scanner directly (codec._parse) and its envelope
checked without a set per frame: the same objects, the same refusals (reason, field and
message) as `json.JSONDecoder.decode` and the envelope's checks always gave."""
from __future__ import annotations

import json

import pytest

from controller.contracts import codec
from controller.contracts import protocol as p

DEP = "dep-1"
FRAME = p.encode(p.Started(rollout_id="r1", attempt=1, token=7), DEP).decode()

TEXTS = [
    FRAME, " " + FRAME, FRAME + " ", FRAME + "\n", FRAME + "{}", FRAME + "x", FRAME[:-1],
    FRAME[:10], "{", "{}", "{} ", "[]", '"x"', "1", "", " ", "{\"a\": NaN}", '{"a": Infinity}',
    '{"a":1,}', '{"a":1}}', "{\"a\":\"\\ud800\"}", '{"a":"\x01"}', '{"a" :1 , "b":[ 1 ,2 ]}',
]


def _outcome(fn, text):
    try:
        return ("ok", fn(text))
    except ValueError as e:  # JSONDecodeError and the NaN refusal alike
        return (type(e).__name__, str(e))


@pytest.mark.parametrize("text", TEXTS)
def test_the_scanner_path_parses_and_refuses_as_decode(text):
    assert _outcome(codec._parse, text) == _outcome(codec._DECODER.decode, text)


def _refusal(data: bytes):
    try:
        return ("ok", p.decode(data, DEP))
    except p.RemoteProtocolError as e:
        return (e.reason, e.field, str(e))


ENVELOPES = [
    {"v": p.PROTOCOL_VERSION, "dep": DEP, "type": "started", "id": "m1",
     "body": {"rollout_id": "r1", "attempt": 1, "token": 7}},
]
_base = ENVELOPES[0]
ENVELOPES += [
    {**_base, "extra": 1}, {**_base, "a": 1, "z": 2}, {k: v for k, v in _base.items() if k != "id"},
    {k: v for k, v in _base.items() if k != "body"}, {**_base, "id": 3}, {**_base, "body": []},
    {**_base, "id": 3, "body": []}, {**_base, "id": 3, "extra": 1},
    {k: v for k, v in _base.items() if k != "v"}, {**_base, "dep": "other"},
    {**_base, "type": "nope"}, {**_base, "v": True},
]


@pytest.mark.parametrize("i", range(len(ENVELOPES)))
def test_the_envelope_is_refused_with_the_same_reason_field_and_message(i):
    frame = ENVELOPES[i]
    got = _refusal(json.dumps(frame).encode())
    want = {
        0: ("ok", p.Started(rollout_id="r1", attempt=1, token=7, id="m1")),
        1: (p.BAD_FIELD, "extra", "bad_field: unknown envelope keys ['extra']"),
        2: (p.BAD_FIELD, "a", "bad_field: unknown envelope keys ['a', 'z']"),
        3: (p.BAD_FIELD, "id", "bad_field: envelope id must be str"),
        4: (p.BAD_FIELD, "body", "bad_field: envelope body must be dict"),
        5: (p.BAD_FIELD, "id", "bad_field: envelope id must be str"),
        6: (p.BAD_FIELD, "body", "bad_field: envelope body must be dict"),
        7: (p.BAD_FIELD, "id", "bad_field: envelope id must be str"),
        8: (p.BAD_FIELD, "id", "bad_field: envelope id must be str"),
    }.get(i)  # (not ENVELOPES.index: {"v": True} == {"v": 1})
    if want is None:  # version, deployment, type: refused before the envelope's fields
        assert got[0] in (p.WRONG_VERSION, p.FOREIGN_DEPLOYMENT, p.UNKNOWN_TYPE)
    else:
        assert got == want
