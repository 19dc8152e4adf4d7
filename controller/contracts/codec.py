"""The codec: message objects to frame bytes and back, validated; the protocol version and
the deployment id.

Sans-I/O in the h11 manner: bytes in, typed messages out, and nothing else. The broker, the
node agent and the trainer client own the sockets; they import this (through the
`controller.contracts.protocol` namespace), it imports none of them.

A frame is the body of one ZeroMQ frame (after the ROUTER identity): the UTF-8 JSON object
    {"v": PROTOCOL_VERSION, "dep": "<deployment id>", "type": "<type>", "id": "<msg id>",
     "body": {...}}
`decode` checks the envelope and the body against the message class's annotations (the
remote's fault: `RemoteProtocolError`); `encode` runs the same checks on what we send (our
fault: `LocalProtocolError`). `MESSAGE_TYPES` is the one table mapping type names to
classes. The hottest messages take the hand-built paths of batching.py. Documented in
docs/protocol.md ("Transport and frame").

No I/O. Must not import: zmq, sqlite3, socket, subprocess, Paddock other than controller.contracts.
"""
from __future__ import annotations

import dataclasses
import json
import math
import typing
from typing import Any, Callable, Literal, Optional, Union

from controller.contracts import batching
from controller.contracts.batching import AckBatch, LeaseBatch, ResultBatch, split
from controller.contracts.errors import (
    BAD_FIELD,
    BAD_JSON,
    FOREIGN_DEPLOYMENT,
    TOO_LARGE,
    UNKNOWN_TYPE,
    WRONG_VERSION,
    LocalProtocolError,
    ProtocolError,
    RemoteProtocolError,
)
from controller.contracts.messages import (
    JSON_ENCODER,
    Ack,
    Cancel,
    Cancelled,
    Disconnect,
    Drain,
    DrainNode,
    Heartbeat,
    Lease,
    Message,
    PolicyUpdate,
    PublishPolicy,
    Ready,
    Refused,
    Register,
    Reject,
    Release,
    Result,
    Results,
    Shutdown,
    Started,
    Status,
    StatusReply,
    Submit,
    Submitted,
    Watch,
    Welcome,
    json_str,
    schema,
    to_json,
)

PROTOCOL_VERSION = 1
PROTOCOL_VERSIONS = (PROTOCOL_VERSION,)  # envelope versions this side speaks
MAX_FRAME_BYTES = 1 << 20  # 1 MiB, checked on both encode and decode
MIN_AGENT_VERSION = (0, 1)  # the oldest agent_version the controller takes at `register`

# The one table: wire type name <-> class.
MESSAGE_TYPES: dict[str, type[Message]] = {cls.TYPE: cls for cls in (
    Register, Heartbeat, Ready, Started, Result, Release, Disconnect,
    Welcome, Refused, Lease, Ack, Reject, Drain, Shutdown, PolicyUpdate,
    Submit, Submitted, PublishPolicy, Watch, Results, Cancel, Cancelled, DrainNode,
    Status, StatusReply, LeaseBatch, ResultBatch, AckBatch,
)}
assert all(name for name in MESSAGE_TYPES), "every message class needs a TYPE"

# Non-negative integer fields (counts, attempts, tokens, cursors).
_NON_NEGATIVE = frozenset({"slots", "mem_free_mb", "slots_free", "active", "credit",
                           "attempt", "token", "liveness", "seed", "n_per_task",
                           "policy_version", "version", "rollouts", "after", "cursor",
                           "n_tasks"})


def agent_version_ok(agent_version: str) -> bool:
    """Whether the controller takes an agent of this version (dotted integers, at least
    MIN_AGENT_VERSION)."""
    try:
        return tuple(int(x) for x in agent_version.split(".")[:2]) >= MIN_AGENT_VERSION
    except ValueError:
        return False


def peek(data: bytes) -> Optional[tuple[Any, Any, Any]]:
    """(v, dep, type) of a frame that is a JSON object, whatever its version; else None.
    For the one decision taken on a frame of another version (answering its `register`)."""
    try:
        frame = _DECODER.decode(data.decode("utf-8")) if len(data) <= MAX_FRAME_BYTES else None
    except ValueError:
        return None
    if not isinstance(frame, dict):
        return None
    return frame.get("v"), frame.get("dep"), frame.get("type")


def refusal(data: bytes, deployment: str) -> Optional[str]:
    """The detail of a `refused` frame of ANY protocol version for this deployment (the
    layout that never changes: {"type": "refused", "dep": ..., "body": {"detail": str}});
    None for any other frame."""
    try:
        frame = _DECODER.decode(data.decode("utf-8")) if len(data) <= MAX_FRAME_BYTES else None
    except ValueError:
        return None
    if not (isinstance(frame, dict) and frame.get("type") == Refused.TYPE
            and frame.get("dep") == deployment and isinstance(frame.get("body"), dict)):
        return None
    detail = frame["body"].get("detail")
    return detail if isinstance(detail, str) else "refused (no detail)"


# --------------------------------------------------------------------------------------
# encode / decode
# --------------------------------------------------------------------------------------

_FAST_BODY = batching.FAST_BODY
_FAST_BUILD = batching.FAST_BUILD

def encode(msg: Message, deployment: str) -> bytes:
    """Validate `msg` and return its frame bytes. Raises LocalProtocolError."""
    cls = type(msg)
    fast = _FAST_BODY.get(cls)
    if fast is not None:  # the hottest messages: the same bytes' meaning, built by hand
        fast_body = fast(msg)
        if fast_body is not None:
            try:
                msg.check()
            except ProtocolError as e:
                raise LocalProtocolError(e.reason, e.detail, e.field) from None
            return _sized(f'{{"v":{PROTOCOL_VERSION},"dep":{json_str(deployment)},"type":"{cls.TYPE}",'
                          f'"id":{json_str(msg.id)},"body":{fast_body}}}'.encode())
    if MESSAGE_TYPES.get(cls.TYPE) is not cls:
        raise LocalProtocolError(UNKNOWN_TYPE, f"{cls.__name__} is not a registered message")
    try:
        body = msg.body()
        _checked_body(cls, body)  # same validation the receiver will run
        msg.check()
    except ProtocolError as e:
        raise LocalProtocolError(e.reason, e.detail, e.field) from None
    frame = {"v": PROTOCOL_VERSION, "dep": deployment, "type": cls.TYPE, "id": msg.id,
             "body": body}
    try:
        data = JSON_ENCODER.encode(frame).encode()
    except (TypeError, ValueError) as e:
        raise LocalProtocolError(BAD_JSON, str(e)) from None
    return _sized(data)


def _sized(data: bytes) -> bytes:
    if len(data) > MAX_FRAME_BYTES:
        raise LocalProtocolError(TOO_LARGE, f"{len(data)} bytes > {MAX_FRAME_BYTES}")
    return data


def encode_frames(msg: Message, deployment: str) -> list[bytes]:
    """`encode`, except that a batch too large for one frame goes as several."""
    try:
        return [encode(msg, deployment)]
    except LocalProtocolError as exc:
        if exc.reason != TOO_LARGE:
            raise
        try:
            halves = split(msg)
        except ValueError:
            raise exc from None
        return [f for half in halves for f in encode_frames(half, deployment)]


def decode(data: bytes, deployment: str) -> Message:
    """Parse and validate one frame. Raises RemoteProtocolError with a reason code."""
    try:
        return _decode(data, deployment)
    except RemoteProtocolError:
        raise
    except ProtocolError as e:
        raise RemoteProtocolError(e.reason, e.detail, e.field) from None


def _decode(data: bytes, deployment: str) -> Message:
    if len(data) > MAX_FRAME_BYTES:
        raise ProtocolError(TOO_LARGE, f"{len(data)} bytes > {MAX_FRAME_BYTES}")
    try:
        frame = _parse(data.decode("utf-8") if isinstance(data, bytes) else data)
    except (ValueError, UnicodeDecodeError) as e:  # UnicodeDecodeError is a ValueError too
        raise ProtocolError(BAD_JSON, str(e)) from None
    if not isinstance(frame, dict):
        raise ProtocolError(BAD_JSON, "frame is not a JSON object")
    v = frame.get("v")
    if type(v) is not int or v != PROTOCOL_VERSION:
        raise ProtocolError(WRONG_VERSION, f"got {v!r}, speak {PROTOCOL_VERSION}")
    if frame.get("dep") != deployment:
        raise ProtocolError(FOREIGN_DEPLOYMENT, f"got {frame.get('dep')!r}")
    mtype = frame.get("type")
    cls = MESSAGE_TYPES.get(mtype) if isinstance(mtype, str) else None
    if cls is None:
        raise ProtocolError(UNKNOWN_TYPE, f"{frame.get('type')!r}")
    msg_id, body = frame.get("id"), frame.get("body")
    if not isinstance(msg_id, str):
        raise ProtocolError(BAD_FIELD, "envelope id must be str", field="id")
    if not isinstance(body, dict):
        raise ProtocolError(BAD_FIELD, "envelope body must be dict", field="body")
    if len(frame) != 5:  # v, dep, type, id and body are there (checked above): any more?
        extra = sorted(set(frame) - _ENVELOPE_KEYS)
        raise ProtocolError(BAD_FIELD, f"unknown envelope keys {extra}", field=extra[0])
    return _build(cls, body, msg_id=msg_id)


_ENVELOPE_KEYS = frozenset(("v", "dep", "type", "id", "body"))


def _reject_constant(name: str) -> Any:
    raise ValueError(f"{name} is not JSON")


# One decoder, made once (json.loads with options builds one per call).
_DECODER = json.JSONDecoder(parse_constant=_reject_constant)
_scan_once = _DECODER.scan_once  # type: ignore[attr-defined]  # (set by __init__: the C scanner)


def _parse(text: str) -> Any:
    """`_DECODER.decode(text)`: a frame as senders write it (an object, no whitespace around
    it) is read by the decoder's scanner directly, without `decode`'s and `raw_decode`'s
    Python frames; anything else (whitespace, extra data, an error) by `decode` itself, so
    what is accepted and every error message are `decode`'s."""
    if text[:1] == "{":
        try:
            obj, end = _scan_once(text, 0)
        except (ValueError, StopIteration):
            return _DECODER.decode(text)
        if end == len(text):
            return obj
    return _DECODER.decode(text)


def _checked_body(cls: type[Message], body: dict) -> dict[str, Any]:
    """The body's fields validated and converted; raises ProtocolError(BAD_FIELD)."""
    fields = schema(cls)[1]
    if not body.keys() <= fields.keys():
        name = sorted(body.keys() - fields.keys())[0]
        raise ProtocolError(BAD_FIELD, f"{cls.TYPE}: unknown field {name!r}", field=name)
    kwargs: dict[str, Any] = {}
    for name, (check, required) in _field_checkers(cls).items():
        if name not in body:
            if required:
                raise ProtocolError(BAD_FIELD, f"{cls.TYPE}: missing field {name!r}", field=name)
            continue
        kwargs[name] = check(body[name], name, cls.TYPE)
    return kwargs


_FIELD_CHECKERS: dict[type, dict[str, tuple[Checker, bool]]] = {}


def _field_checkers(cls: type[Message]) -> dict[str, tuple[Checker, bool]]:
    got = _FIELD_CHECKERS.get(cls)
    if got is None:
        hints, fields = schema(cls)
        got = _FIELD_CHECKERS[cls] = {
            name: (_checker(hints[name]), f.default is dataclasses.MISSING
                   and f.default_factory is dataclasses.MISSING)
            for name, f in fields.items()}
    return got


def _build(cls: type[Message], body: dict, msg_id: str | None = None) -> Message:
    fast = _FAST_BUILD.get(cls)
    if fast is not None:
        msg = fast(body, msg_id)
        if msg is not None:
            return msg
    kwargs = _checked_body(cls, body)
    # The frozen dataclass's __init__ sets each field through object.__setattr__; the
    # validated kwargs go straight into the instance dict (the defaults filled in first).
    msg = object.__new__(cls)
    d = msg.__dict__
    if msg_id is not None:
        kwargs["id"] = msg_id
    for name, default, factory in _defaults(cls):
        if name not in kwargs:
            d[name] = factory() if factory is not None else default
    d.update(kwargs)
    msg.check()
    return msg


_DEFAULTS: dict[type, list[tuple[str, Any, Optional[Callable[[], Any]]]]] = {}


def _defaults(cls: type) -> list[tuple[str, Any, Optional[Callable[[], Any]]]]:
    """(name, default, default factory or None) of each field with a default, id included."""
    got = _DEFAULTS.get(cls)
    if got is None:
        got = _DEFAULTS[cls] = [
            (f.name, f.default, None if f.default_factory is dataclasses.MISSING
             else f.default_factory) for f in dataclasses.fields(cls)
            if f.default is not dataclasses.MISSING or f.default_factory is not dataclasses.MISSING]
    return got


def _type_name(tp: Any) -> str:
    if tp is type(None):
        return "null"
    origin = typing.get_origin(tp)
    if origin is Literal:
        return " | ".join(repr(a) for a in typing.get_args(tp))
    if origin is Union:
        return " | ".join(_type_name(a) for a in typing.get_args(tp))
    if origin is not None:
        return f"{origin.__name__}[{', '.join(_type_name(a) for a in typing.get_args(tp))}]"
    return getattr(tp, "__name__", str(tp))


Checker = Callable[[Any, str, str], Any]
_CHECKERS: dict[Any, Checker] = {}


def _checker(tp: Any) -> Checker:
    """The validating converter for one annotation, built once (the hot path of decode)."""
    got = _CHECKERS.get(tp)
    if got is None:
        got = _CHECKERS[tp] = _compile(tp)
    return got


def _compile(tp: Any) -> Checker:
    def bad(value: Any, path: str, mtype: str) -> ProtocolError:
        return ProtocolError(BAD_FIELD, f"{mtype}: field {path!r} must be {_type_name(tp)}, "
                             f"got {type(value).__name__} {value!r:.60}", field=path)

    for compile_kind in (_compile_generic, _compile_class, _compile_scalar):
        check = compile_kind(tp, bad)
        if check is not None:
            return check
    raise AssertionError(f"protocol schema uses unsupported type {tp!r}")


def _compile_generic(tp: Any, bad: Callable) -> Optional[Checker]:
    """Optional/union, Literal, list[...] and dict[str, ...] annotations."""
    origin, args = typing.get_origin(tp), typing.get_args(tp)
    if origin is Union:
        nullable = type(None) in args
        arms = [_checker(a) for a in args if a is not type(None)]

        def check(v, path, mtype):
            if v is None and nullable:
                return None
            for arm in arms:
                try:
                    return arm(v, path, mtype)
                except ProtocolError:
                    pass
            raise bad(v, path, mtype)
    elif origin is Literal:
        allowed = frozenset(args)

        def check(v, path, mtype):
            if not isinstance(v, str) or v not in allowed:
                raise bad(v, path, mtype)
            return v
    elif origin is list:
        item, item_tp = _checker(args[0]), args[0]

        def check(v, path, mtype):
            if not isinstance(v, list):
                raise bad(v, path, mtype)
            if item_tp is str and all(isinstance(x, str) for x in v):
                return v
            return [item(x, f"{path}[{i}]", mtype) for i, x in enumerate(v)]
    elif origin is dict:
        val, val_tp = _checker(args[1]), args[1]

        def check(v, path, mtype):
            if not isinstance(v, dict):
                raise bad(v, path, mtype)
            if val_tp is str and all(isinstance(x, str) for x in v.values()):
                return v
            return {k: val(x, f"{path}.{k}", mtype) for k, x in v.items()}
    else:
        return None
    return check


def _compile_class(tp: Any, bad: Callable) -> Optional[Checker]:
    """A message (an item of a batch) or a nested dataclass (PolicyRef, BandRequest)."""
    if isinstance(tp, type) and issubclass(tp, Message):
        def check(v, path, mtype):
            fast = _FAST_BUILD.get(tp)
            if fast is not None and type(v) is dict:
                msg = fast(v, None)
                if msg is not None:
                    return msg
            if isinstance(v, tp):
                v = to_json(v)
            if not isinstance(v, dict) or not isinstance(v.get("id"), str):
                raise bad(v, path, mtype)
            body = dict(v)
            return _build(tp, body, msg_id=body.pop("id"))
        return check
    if not dataclasses.is_dataclass(tp):
        return None
    hints = typing.get_type_hints(tp)
    names = frozenset(f.name for f in dataclasses.fields(tp))
    checks = {k: _checker(hints[k]) for k in names}

    def check_dataclass(v, path, mtype):
        if isinstance(v, tp):
            v = dataclasses.asdict(v)
        if not isinstance(v, dict) or v.keys() != names:
            raise bad(v, path, mtype)
        return tp(**{k: checks[k](x, f"{path}.{k}", mtype) for k, x in v.items()})
    return check_dataclass


def _compile_scalar(tp: Any, bad: Callable) -> Optional[Checker]:
    """bool, int (counts non-negative), float (finite; an int widens), str, dict."""
    if tp is bool:
        def check(v, path, mtype):
            if type(v) is not bool:
                raise bad(v, path, mtype)
            return v
    elif tp is int:
        def check(v, path, mtype):
            if type(v) is not int or (v < 0 and path.rpartition(".")[2] in _NON_NEGATIVE):
                raise bad(v, path, mtype)
            return v
    elif tp is float:
        def check(v, path, mtype):
            if type(v) not in (int, float) or not math.isfinite(v):
                raise bad(v, path, mtype)
            return float(v)
    elif tp is str:
        def check(v, path, mtype):
            if not isinstance(v, str):
                raise bad(v, path, mtype)
            return v
    elif tp is dict:
        def check(v, path, mtype):
            if not isinstance(v, dict):
                raise bad(v, path, mtype)
            return v
    else:
        return None
    return check
