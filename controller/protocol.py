"""Paddock wire protocol: message types, encode/decode, version, deployment id.

Sans-I/O in the h11 manner: this module turns message objects into bytes and bytes into
validated message objects, and nothing else. The broker, the node agent and the trainer
client own the sockets; they import this module, it imports none of them.

A frame is the body of one ZeroMQ frame (after the ROUTER identity): the UTF-8 JSON object
    {"v": PROTOCOL_VERSION, "dep": "<deployment id>", "type": "<type>", "id": "<msg id>",
     "body": {...}}
Every message type is a frozen dataclass whose fields are exactly the body's keys; the type
annotations are the validation schema, checked at decode (remote's fault:
`RemoteProtocolError`) and at encode (our fault: `LocalProtocolError`). Fields with a
default are optional on the wire. `MESSAGE_TYPES` is the one table mapping type names to
classes. Documented in docs/protocol.md.

Must not import zmq, sqlite3 or anything that does I/O.
"""
from __future__ import annotations

import dataclasses
import json
import math
import typing
import uuid
from dataclasses import dataclass, field
from typing import Any, ClassVar, Literal, Optional, Union

PROTOCOL_VERSION = 1
MAX_FRAME_BYTES = 1 << 20  # 1 MiB, checked on both encode and decode

# ProtocolError reasons: stable codes for counters and logs.
BAD_JSON = "bad_json"
WRONG_VERSION = "wrong_version"
FOREIGN_DEPLOYMENT = "foreign_deployment"
UNKNOWN_TYPE = "unknown_type"
BAD_FIELD = "bad_field"
TOO_LARGE = "too_large"
ERROR_REASONS = (BAD_JSON, WRONG_VERSION, FOREIGN_DEPLOYMENT, UNKNOWN_TYPE, BAD_FIELD, TOO_LARGE)

Outcome = Literal["pass", "fail", "timeout", "infra_error"]
OUTCOMES: tuple[str, ...] = typing.get_args(Outcome)
RejectReason = Literal["stale_token", "unknown_rollout", "cancelled", "draining", "bad_request"]
REJECT_REASONS: tuple[str, ...] = typing.get_args(RejectReason)
# Why the controller refused a client request (Ack.code); the client raises one type per code.
ErrorCode = Literal["unknown_task", "unknown_policy", "unknown_batch", "unknown_node",
                    "policy_conflict", "bad_request", "unexpected"]
ERROR_CODES: tuple[str, ...] = typing.get_args(ErrorCode)


class ProtocolError(Exception):
    """A frame that cannot be turned into a message (or a message into a frame).

    `reason` is one of ERROR_REASONS; `field` names the offending body field for bad_field.
    """

    def __init__(self, reason: str, detail: str = "", field: str | None = None):
        assert reason in ERROR_REASONS, reason
        self.reason = reason
        self.detail = detail
        self.field = field
        super().__init__(f"{reason}: {detail}" if detail else reason)


class RemoteProtocolError(ProtocolError):
    """The peer sent a bad frame: log, count, drop; never crash."""


class LocalProtocolError(ProtocolError):
    """We tried to send a bad message: a bug on this side."""


def new_msg_id() -> str:
    return uuid.uuid4().hex


# --------------------------------------------------------------------------------------
# Message types. `id` is the envelope's message id, not a body field.
# --------------------------------------------------------------------------------------

@dataclass(frozen=True)
class Message:
    TYPE: ClassVar[str] = ""

    def body(self) -> dict[str, Any]:
        return {f.name: _to_json(getattr(self, f.name)) for f in _body_fields(type(self))}

    def check(self) -> None:
        """Cross-field rules beyond the per-field types; raise ProtocolError(BAD_FIELD)."""


def _id_field() -> Any:
    return field(default_factory=new_msg_id, kw_only=True)


# ---- node agent -> controller ----

@dataclass(frozen=True)
class Register(Message):
    TYPE: ClassVar[str] = "register"
    node: str
    slots: int
    images: list[str]
    mem_free_mb: int
    agent_version: str
    held: list[str] = field(default_factory=list)  # rollout ids it still runs (re-register)
    id: str = _id_field()


@dataclass(frozen=True)
class Heartbeat(Message):
    """Both directions. From an agent it carries all four fields; from the controller none."""
    TYPE: ClassVar[str] = "heartbeat"
    node: Optional[str] = None
    slots_free: Optional[int] = None
    active: Optional[int] = None
    health: Optional[dict] = None
    images: Optional[list[str]] = None  # agent only: image digests now mounted on the node
    id: str = _id_field()

    def check(self) -> None:
        given = [getattr(self, n) is not None for n in ("node", "slots_free", "active", "health")]
        if any(given) and not all(given):
            raise ProtocolError(BAD_FIELD, "agent heartbeat needs node, slots_free, active "
                                "and health together", field="node")


@dataclass(frozen=True)
class Ready(Message):
    TYPE: ClassVar[str] = "ready"
    node: str
    credit: int  # how many more leases the agent can take now
    draining: bool = False  # the agent is draining (SIGTERM or a drain request)
    id: str = _id_field()


@dataclass(frozen=True)
class Started(Message):
    TYPE: ClassVar[str] = "started"
    rollout_id: str
    attempt: int
    token: int
    id: str = _id_field()


@dataclass(frozen=True)
class Result(Message):
    TYPE: ClassVar[str] = "result"
    rollout_id: str
    attempt: int
    token: int
    outcome: Outcome
    reward: Optional[float]
    shards: dict[str, str]
    infra_reason: Optional[str]
    idem: str
    id: str = _id_field()

    def check(self) -> None:
        if self.outcome == "infra_error" and self.infra_reason is None:
            raise ProtocolError(BAD_FIELD, "infra_error needs an infra_reason",
                                field="infra_reason")


@dataclass(frozen=True)
class Release(Message):
    """The agent hands an unfinished lease back (drain deadline): not a failed attempt."""
    TYPE: ClassVar[str] = "release"
    rollout_id: str
    attempt: int
    token: int
    reason: str
    id: str = _id_field()


@dataclass(frozen=True)
class Disconnect(Message):
    TYPE: ClassVar[str] = "disconnect"
    node: str
    reason: str
    id: str = _id_field()


# ---- controller -> node agent ----

@dataclass(frozen=True)
class Welcome(Message):
    TYPE: ClassVar[str] = "welcome"
    node: str
    heartbeat_interval_s: float
    liveness: int
    session: str = ""  # the controller instance; a Welcome of another session: re-register
    id: str = _id_field()


@dataclass(frozen=True)
class PolicyRef:
    version: int
    endpoint: str
    model: str


@dataclass(frozen=True)
class Lease(Message):
    TYPE: ClassVar[str] = "lease"
    rollout_id: str
    attempt: int
    token: int
    lease_ttl_s: float
    task: dict
    policy: PolicyRef
    seed: int
    run_id: str
    run_dir: str
    batch_id: str
    id: str = _id_field()


@dataclass(frozen=True)
class Ack(Message):
    TYPE: ClassVar[str] = "ack"
    ref: str  # the acknowledged message's id
    ok: bool
    error: Optional[str] = None
    code: Optional[ErrorCode] = None  # why a request was refused (ok false), for typed errors
    id: str = _id_field()


@dataclass(frozen=True)
class Reject(Message):
    TYPE: ClassVar[str] = "reject"
    rollout_id: str
    attempt: int
    token: int
    reason: RejectReason
    id: str = _id_field()


@dataclass(frozen=True)
class Drain(Message):
    TYPE: ClassVar[str] = "drain"
    reason: str = ""
    deadline_s: Optional[float] = None  # seconds to finish in-flight work, then hand it back
    id: str = _id_field()


@dataclass(frozen=True)
class Shutdown(Message):
    TYPE: ClassVar[str] = "shutdown"
    reason: str = ""
    id: str = _id_field()


# ---- trainer client <-> controller ----

@dataclass(frozen=True)
class Submit(Message):
    TYPE: ClassVar[str] = "submit"
    idem: str
    tasks: list[str]  # task names or ids
    n_per_task: int
    policy_version: int
    id: str = _id_field()


@dataclass(frozen=True)
class Submitted(Message):
    TYPE: ClassVar[str] = "submitted"
    batch_id: str
    rollouts: int
    id: str = _id_field()


@dataclass(frozen=True)
class PublishPolicy(Message):
    TYPE: ClassVar[str] = "publish_policy"
    idem: str
    version: int
    endpoint: str
    model: str
    id: str = _id_field()


@dataclass(frozen=True)
class Watch(Message):
    TYPE: ClassVar[str] = "watch"
    batch_id: str
    after: int  # cursor: the last commit sequence number already seen
    wait_s: float = 0.0  # long poll: answer when something commits or after wait_s
    id: str = _id_field()


@dataclass(frozen=True)
class Results(Message):
    TYPE: ClassVar[str] = "results"
    batch_id: str
    items: list[dict]
    cursor: int
    done: bool
    id: str = _id_field()


@dataclass(frozen=True)
class Cancel(Message):
    TYPE: ClassVar[str] = "cancel"
    idem: str
    batch_id: str
    id: str = _id_field()


@dataclass(frozen=True)
class Cancelled(Message):
    TYPE: ClassVar[str] = "cancelled"
    batch_id: str
    rollouts: int  # how many rollouts this cancel moved to cancelled
    id: str = _id_field()


@dataclass(frozen=True)
class DrainNode(Message):
    """Client -> controller: drain one node (answered by ack; ok false if the node is unknown)."""
    TYPE: ClassVar[str] = "drain_node"
    node: str
    deadline_s: Optional[float] = None
    id: str = _id_field()


@dataclass(frozen=True)
class Status(Message):
    TYPE: ClassVar[str] = "status"
    id: str = _id_field()


@dataclass(frozen=True)
class StatusReply(Message):
    TYPE: ClassVar[str] = "status_reply"
    counts: dict
    nodes: list[dict]
    counters: dict = field(default_factory=dict)  # broker counters (dispatched, dropped...)
    id: str = _id_field()


# The one table: wire type name <-> class.
MESSAGE_TYPES: dict[str, type[Message]] = {cls.TYPE: cls for cls in (
    Register, Heartbeat, Ready, Started, Result, Release, Disconnect,
    Welcome, Lease, Ack, Reject, Drain, Shutdown,
    Submit, Submitted, PublishPolicy, Watch, Results, Cancel, Cancelled, DrainNode,
    Status, StatusReply,
)}
assert all(name for name in MESSAGE_TYPES), "every message class needs a TYPE"

# Non-negative integer fields (counts, attempts, tokens, cursors).
_NON_NEGATIVE = frozenset({"slots", "mem_free_mb", "slots_free", "active", "credit",
                           "attempt", "token", "liveness", "seed", "n_per_task",
                           "policy_version", "version", "rollouts", "after", "cursor"})


# --------------------------------------------------------------------------------------
# encode / decode
# --------------------------------------------------------------------------------------

def encode(msg: Message, deployment: str) -> bytes:
    """Validate `msg` and return its frame bytes. Raises LocalProtocolError."""
    cls = type(msg)
    if MESSAGE_TYPES.get(cls.TYPE) is not cls:
        raise LocalProtocolError(UNKNOWN_TYPE, f"{cls.__name__} is not a registered message")
    try:
        body = msg.body()
        _build(cls, body)  # same validation the receiver will run
    except ProtocolError as e:
        raise LocalProtocolError(e.reason, e.detail, e.field) from None
    frame = {"v": PROTOCOL_VERSION, "dep": deployment, "type": cls.TYPE, "id": msg.id,
             "body": body}
    try:
        data = json.dumps(frame, separators=(",", ":"), allow_nan=False).encode()
    except (TypeError, ValueError) as e:
        raise LocalProtocolError(BAD_JSON, str(e)) from None
    if len(data) > MAX_FRAME_BYTES:
        raise LocalProtocolError(TOO_LARGE, f"{len(data)} bytes > {MAX_FRAME_BYTES}")
    return data


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
        frame = json.loads(data, parse_constant=_reject_constant)
    except (ValueError, UnicodeDecodeError) as e:
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
    for key, kind in (("id", str), ("body", dict)):
        if not isinstance(frame.get(key), kind):
            raise ProtocolError(BAD_FIELD, f"envelope {key} must be {kind.__name__}", field=key)
    extra = sorted(set(frame) - {"v", "dep", "type", "id", "body"})
    if extra:
        raise ProtocolError(BAD_FIELD, f"unknown envelope keys {extra}", field=extra[0])
    return _build(cls, frame["body"], msg_id=frame["id"])


def _reject_constant(name: str) -> Any:
    raise ValueError(f"{name} is not JSON")


def _body_fields(cls: type) -> list[dataclasses.Field]:
    return [f for f in dataclasses.fields(cls) if f.name != "id"]


_SCHEMAS: dict[type, tuple[dict[str, Any], dict[str, dataclasses.Field]]] = {}


def _schema(cls: type) -> tuple[dict[str, Any], dict[str, dataclasses.Field]]:
    """(type hints, body fields) of a message or nested dataclass, computed once per class."""
    got = _SCHEMAS.get(cls)
    if got is None:
        got = _SCHEMAS[cls] = (typing.get_type_hints(cls),
                               {f.name: f for f in dataclasses.fields(cls) if f.name != "id"})
    return got


def _build(cls: type[Message], body: dict, msg_id: str | None = None) -> Message:
    hints, fields = _schema(cls)
    extra = set(body) - set(fields)
    if extra:
        name = sorted(extra)[0]
        raise ProtocolError(BAD_FIELD, f"{cls.TYPE}: unknown field {name!r}", field=name)
    kwargs: dict[str, Any] = {}
    for name, f in fields.items():
        if name not in body:
            if f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING:
                raise ProtocolError(BAD_FIELD, f"{cls.TYPE}: missing field {name!r}", field=name)
            continue
        kwargs[name] = _check_value(body[name], hints[name], name, cls.TYPE)
    if msg_id is not None:
        kwargs["id"] = msg_id
    msg = cls(**kwargs)
    msg.check()
    return msg


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


def _check_value(value: Any, tp: Any, path: str, mtype: str) -> Any:
    """Return `value` converted to `tp` (ints widen to float, dicts to dataclasses)."""
    def bad() -> ProtocolError:
        return ProtocolError(BAD_FIELD, f"{mtype}: field {path!r} must be {_type_name(tp)}, "
                             f"got {type(value).__name__} {value!r:.60}", field=path)
    origin = typing.get_origin(tp)
    if origin is Union:
        for arm in typing.get_args(tp):
            if arm is type(None) and value is None:
                return None
        for arm in typing.get_args(tp):
            if arm is not type(None):
                try:
                    return _check_value(value, arm, path, mtype)
                except ProtocolError:
                    pass
        raise bad()
    if origin is Literal:
        if not isinstance(value, str) or value not in typing.get_args(tp):
            raise bad()
        return value
    if origin is list:
        if not isinstance(value, list):
            raise bad()
        (item_tp,) = typing.get_args(tp)
        return [_check_value(v, item_tp, f"{path}[{i}]", mtype) for i, v in enumerate(value)]
    if origin is dict:
        if not isinstance(value, dict):
            raise bad()
        _, val_tp = typing.get_args(tp)
        return {k: _check_value(v, val_tp, f"{path}.{k}", mtype) for k, v in value.items()}
    if dataclasses.is_dataclass(tp):
        if isinstance(value, tp):
            value = dataclasses.asdict(value)
        if not isinstance(value, dict) or set(value) != {f.name for f in dataclasses.fields(tp)}:
            raise bad()
        hints = _schema(tp)[0]
        return tp(**{k: _check_value(v, hints[k], f"{path}.{k}", mtype)
                     for k, v in value.items()})
    if tp is bool:
        if type(value) is not bool:
            raise bad()
        return value
    if tp is int:
        if type(value) is not int or (path.split(".")[-1] in _NON_NEGATIVE and value < 0):
            raise bad()
        return value
    if tp is float:
        if type(value) not in (int, float) or not math.isfinite(value):
            raise bad()
        return float(value)
    if tp is str:
        if not isinstance(value, str):
            raise bad()
        return value
    if tp is dict:
        if not isinstance(value, dict):
            raise bad()
        return value
    raise AssertionError(f"protocol schema uses unsupported type {tp!r} at {mtype}.{path}")


def _to_json(value: Any) -> Any:
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return dataclasses.asdict(value)
    return value
