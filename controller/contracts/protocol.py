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
import itertools
import json
import math
import os
import typing
import uuid
from dataclasses import dataclass, field
from typing import Any, Callable, ClassVar, Literal, Optional, Union

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


_ID_PREFIX = uuid.uuid4().hex[:16]  # per process: ids are unique without a syscall each
_ID_COUNTER = itertools.count(1)


def _new_id_prefix() -> None:
    global _ID_PREFIX, _ID_COUNTER
    _ID_PREFIX, _ID_COUNTER = uuid.uuid4().hex[:16], itertools.count(1)


os.register_at_fork(after_in_child=_new_id_prefix)  # a forked child must not reuse ids


def new_msg_id() -> str:
    """32 hex chars: a random per-process prefix and a counter."""
    return f"{_ID_PREFIX}{next(_ID_COUNTER):016x}"


# --------------------------------------------------------------------------------------
# Message types. `id` is the envelope's message id, not a body field.
# --------------------------------------------------------------------------------------

@dataclass(frozen=True)
class Message:
    TYPE: ClassVar[str] = ""

    def body(self) -> dict[str, Any]:
        names, nested = _body_plan(type(self))
        d = self.__dict__
        return {n: _to_json(d[n]) if n in nested else d[n] for n in names}

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
    held: Optional[list[str]] = None  # agent only: rollouts it runs; only these are renewed
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


RefusalReason = Literal["protocol_version", "agent_version"]


@dataclass(frozen=True)
class Refused(Message):
    """Controller -> agent, the answer to a `register` it cannot accept: the agent logs
    `detail` and exits. Its frame layout is the same in every protocol version (an agent of
    another version reads it with `refusal()`)."""
    TYPE: ClassVar[str] = "refused"
    reason: RefusalReason
    detail: str
    protocol_versions: list[int]  # the envelope versions this controller speaks
    min_agent_version: str  # the oldest agent_version it takes
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
class BandRequest:
    """Tasks picked by the controller's curriculum: `n_tasks` of them from those whose
    estimated pass rate lies in `band` [low, high] (plus its exploration share), drawn with
    `seed` (controller/taskbank/curriculum.py `Curriculum.sample`)."""
    n_tasks: int
    band: list[float]
    seed: int


@dataclass(frozen=True)
class Submit(Message):
    TYPE: ClassVar[str] = "submit"
    idem: str
    tasks: list[str]  # task names or ids; empty with a sampler
    n_per_task: int
    policy_version: int
    sampler: Optional[BandRequest] = None  # the controller picks the tasks
    id: str = _id_field()

    def check(self) -> None:
        s = self.sampler
        if s is None:
            return
        if self.tasks:
            raise ProtocolError(BAD_FIELD, "submit: tasks or a sampler, not both", field="tasks")
        if s.n_tasks < 1:
            raise ProtocolError(BAD_FIELD, "submit: sampler.n_tasks must be >= 1",
                                field="sampler.n_tasks")
        if len(s.band) != 2 or not 0.0 <= s.band[0] < s.band[1] <= 1.0:
            raise ProtocolError(BAD_FIELD, f"submit: sampler.band must be [low, high] with "
                                f"0 <= low < high <= 1, got {s.band!r}", field="sampler.band")


@dataclass(frozen=True)
class Submitted(Message):
    TYPE: ClassVar[str] = "submitted"
    batch_id: str
    rollouts: int
    ref: str = ""  # the id of the submit this answers
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
    ref: str = ""  # the id of the watch this answers
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
    ref: str = ""  # the id of the cancel this answers
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
    ref: str = ""  # the id of the status request this answers
    id: str = _id_field()


# ---- batches (several messages in one frame) ----
# Agents whose agent_version is at least BATCH_AGENT_VERSION take `leases` and `acks`; an
# agent sends `result_batch` only once the controller has sent it a batch in this session.
BATCH_AGENT_VERSION = (0, 3)
MAX_BATCH_ITEMS = 256  # per frame; a batch frame over MAX_FRAME_BYTES is split by the sender
MAX_ACKS = 4 * MAX_BATCH_ITEMS  # acknowledged ids per frame


MIN_AGENT_VERSION = (0, 1)  # the oldest agent_version the controller takes at `register`
PROTOCOL_VERSIONS = (PROTOCOL_VERSION,)  # envelope versions this side speaks


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


def speaks_batches(agent_version: str) -> bool:
    """Whether an agent of this version takes `leases` and `acks` frames."""
    try:
        return tuple(int(x) for x in agent_version.split(".")[:2]) >= BATCH_AGENT_VERSION
    except ValueError:
        return False


@dataclass(frozen=True)
class LeaseBatch(Message):
    """Controller -> agent: leases (each as a `lease` would be) and, in the same frame, the
    ids its `ack` (ok) would acknowledge."""
    TYPE: ClassVar[str] = "leases"
    items: list[Lease]
    acks: list[str] = field(default_factory=list)
    id: str = _id_field()

    def check(self) -> None:
        if not self.items and not self.acks:
            raise ProtocolError(BAD_FIELD, "leases: items and acks are both empty",
                                field="items")


@dataclass(frozen=True)
class ResultBatch(Message):
    """Agent -> controller: several results in one frame, each acknowledged by its own id."""
    TYPE: ClassVar[str] = "result_batch"
    items: list[Result]
    id: str = _id_field()

    def check(self) -> None:
        if not self.items:
            raise ProtocolError(BAD_FIELD, "{}: items must not be empty".format(self.TYPE),
                                field="items")


@dataclass(frozen=True)
class AckBatch(Message):
    """Controller -> agent: `ack` (ok true) of each message id in refs."""
    TYPE: ClassVar[str] = "acks"
    refs: list[str]
    id: str = _id_field()

    def check(self) -> None:
        if not self.refs:
            raise ProtocolError(BAD_FIELD, "{}: refs must not be empty".format(self.TYPE),
                                field="refs")


BATCHES: dict[type[Message], type[Message]] = {Lease: LeaseBatch, Result: ResultBatch}


def batched(msgs: list[Message]) -> list[Message]:
    """Leases or results (one type) as batch messages of at most MAX_BATCH_ITEMS each; a
    lone message stays as it is."""
    if len(msgs) == 1:
        return list(msgs)
    cls = BATCHES[type(msgs[0])]
    return [cls(items=list(msgs[i:i + MAX_BATCH_ITEMS]))
            for i in range(0, len(msgs), MAX_BATCH_ITEMS)]


def acks(refs: list[str]) -> list[Message]:
    """`ack` ok of each ref: one Ack for one ref, else AckBatch frames."""
    if len(refs) == 1:
        return [Ack(ref=refs[0], ok=True)]
    return [AckBatch(refs=refs[i:i + MAX_ACKS])
            for i in range(0, len(refs), MAX_ACKS)]


def for_agent(leases: list[Lease], refs: list[str]) -> list[Message]:
    """Leases and acks (ok) for one agent in as few frames as they fit: `leases` frames
    carrying the acks too; a lone lease or lone acks as `lease` / `ack` / `acks`."""
    if not leases:
        return acks(refs) if refs else []
    if len(leases) == 1 and not refs:
        return list(leases)
    out: list[Message] = []
    for i in range(max(-(-len(leases) // MAX_BATCH_ITEMS), -(-len(refs) // MAX_ACKS))):
        out.append(LeaseBatch(items=list(leases[i * MAX_BATCH_ITEMS:(i + 1) * MAX_BATCH_ITEMS]),
                              acks=list(refs[i * MAX_ACKS:(i + 1) * MAX_ACKS])))
    return out


def unbatched(msg: Message) -> list[Message]:
    """The messages a batch carries (a plain message: itself)."""
    if isinstance(msg, LeaseBatch):
        return [Ack(ref=r, ok=True) for r in msg.acks] + list(msg.items)
    if isinstance(msg, ResultBatch):
        return list(msg.items)
    if isinstance(msg, AckBatch):
        return [Ack(ref=r, ok=True) for r in msg.refs]
    return [msg]


def split(msg: Message) -> list[Message]:
    """A batch in two halves (for a frame over MAX_FRAME_BYTES); ValueError if it cannot."""
    if isinstance(msg, LeaseBatch) and msg.acks:  # the acks apart, then the leases
        return acks(msg.acks) + (for_agent(msg.items, []) if msg.items else [])
    items = msg.refs if isinstance(msg, AckBatch) else getattr(msg, "items", None)
    if not isinstance(msg, (LeaseBatch, ResultBatch, AckBatch)) or len(items) < 2:
        raise ValueError(f"cannot split a {msg.TYPE} frame")
    half = len(items) // 2
    if isinstance(msg, AckBatch):
        return [AckBatch(refs=items[:half]), AckBatch(refs=items[half:])]
    return [type(msg)(items=items[:half]), type(msg)(items=items[half:])]


# The one table: wire type name <-> class.
MESSAGE_TYPES: dict[str, type[Message]] = {cls.TYPE: cls for cls in (
    Register, Heartbeat, Ready, Started, Result, Release, Disconnect,
    Welcome, Refused, Lease, Ack, Reject, Drain, Shutdown,
    Submit, Submitted, PublishPolicy, Watch, Results, Cancel, Cancelled, DrainNode,
    Status, StatusReply, LeaseBatch, ResultBatch, AckBatch,
)}
assert all(name for name in MESSAGE_TYPES), "every message class needs a TYPE"

# Non-negative integer fields (counts, attempts, tokens, cursors).
_NON_NEGATIVE = frozenset({"slots", "mem_free_mb", "slots_free", "active", "credit",
                           "attempt", "token", "liveness", "seed", "n_per_task",
                           "policy_version", "version", "rollouts", "after", "cursor",
                           "n_tasks"})


# --------------------------------------------------------------------------------------
# encode / decode
# --------------------------------------------------------------------------------------

def encode(msg: Message, deployment: str) -> bytes:
    """Validate `msg` and return its frame bytes. Raises LocalProtocolError."""
    cls = type(msg)
    fast = _FAST_BODY.get(cls)
    if fast is not None:  # the hottest messages: the same bytes' meaning, built by hand
        body = fast(msg)
        if body is not None:
            try:
                msg.check()
            except ProtocolError as e:
                raise LocalProtocolError(e.reason, e.detail, e.field) from None
            return _sized(f'{{"v":{PROTOCOL_VERSION},"dep":{_q(deployment)},"type":"{cls.TYPE}",'
                          f'"id":{_q(msg.id)},"body":{body}}}'.encode())
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
        data = _ENCODER.encode(frame).encode()
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
        frame = _DECODER.decode(data.decode("utf-8") if isinstance(data, bytes) else data)
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
    for key, kind in (("id", str), ("body", dict)):
        if not isinstance(frame.get(key), kind):
            raise ProtocolError(BAD_FIELD, f"envelope {key} must be {kind.__name__}", field=key)
    extra = sorted(set(frame) - {"v", "dep", "type", "id", "body"})
    if extra:
        raise ProtocolError(BAD_FIELD, f"unknown envelope keys {extra}", field=extra[0])
    return _build(cls, frame["body"], msg_id=frame["id"])


def _reject_constant(name: str) -> Any:
    raise ValueError(f"{name} is not JSON")


# One encoder and one decoder, made once (json.dumps/loads with options build one per call).
_ENCODER = json.JSONEncoder(separators=(",", ":"), allow_nan=False)
_DECODER = json.JSONDecoder(parse_constant=_reject_constant)


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


def _checked_body(cls: type[Message], body: dict) -> dict[str, Any]:
    """The body's fields validated and converted; raises ProtocolError(BAD_FIELD)."""
    fields = _schema(cls)[1]
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
        hints, fields = _schema(cls)
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


_BODY_PLANS: dict[type, tuple[tuple[str, ...], frozenset[str]]] = {}


def _body_plan(cls: type) -> tuple[tuple[str, ...], frozenset[str]]:
    """The body field names of a message class, and those whose values need _to_json
    (a PolicyRef or nested messages); the others are JSON values as they are."""
    got = _BODY_PLANS.get(cls)
    if got is None:
        hints, fields = _schema(cls)
        nested = frozenset(n for n in fields if any(
            isinstance(t, type) and dataclasses.is_dataclass(t)
            for t in (hints[n], *typing.get_args(hints[n]))))
        got = _BODY_PLANS[cls] = (tuple(fields), nested)
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


def _check_value(value: Any, tp: Any, path: str, mtype: str) -> Any:
    """Return `value` converted to `tp` (ints widen to float, dicts to dataclasses)."""
    return _checker(tp)(value, path, mtype)


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
    elif isinstance(tp, type) and issubclass(tp, Message):  # an item of a batch
        def check(v, path, mtype):
            fast = _FAST_BUILD.get(tp)
            if fast is not None and type(v) is dict:
                msg = fast(v, None)
                if msg is not None:
                    return msg
            if isinstance(v, tp):
                v = _to_json(v)
            if not isinstance(v, dict) or not isinstance(v.get("id"), str):
                raise bad(v, path, mtype)
            body = dict(v)
            return _build(tp, body, msg_id=body.pop("id"))
    elif dataclasses.is_dataclass(tp):
        hints = typing.get_type_hints(tp)
        names = frozenset(f.name for f in dataclasses.fields(tp))

        checks = {k: _checker(hints[k]) for k in names}

        def check(v, path, mtype):
            if isinstance(v, tp):
                v = dataclasses.asdict(v)
            if not isinstance(v, dict) or v.keys() != names:
                raise bad(v, path, mtype)
            return tp(**{k: checks[k](x, f"{path}.{k}", mtype) for k, x in v.items()})
    elif tp is bool:
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
        raise AssertionError(f"protocol schema uses unsupported type {tp!r}")
    return check


def _to_json(value: Any) -> Any:
    if isinstance(value, PolicyRef):
        return {"version": value.version, "endpoint": value.endpoint, "model": value.model}
    if isinstance(value, Message):
        out = value.body()
        out["id"] = value.id
        return out
    if isinstance(value, BandRequest):
        return {"n_tasks": value.n_tasks, "band": list(value.band), "seed": value.seed}
    if isinstance(value, list) and value and isinstance(value[0], Message):
        return [_to_json(v) for v in value]
    return value


# --------------------------------------------------------------------------------------
# Fast paths for the hottest messages (a lease and a result per rollout, alone or in a
# batch). Each accepts only the plain common case -- every field of exactly its type, within
# its bounds -- and returns None for anything else, which then takes the generic path (and
# its precise error). So they change the cost, never what is accepted or the JSON's meaning;
# tests/test_protocol.py checks both paths agree.
# --------------------------------------------------------------------------------------

_q = json.encoder.encode_basestring_ascii  # a JSON string, as the generic encoder writes it
_RESULT_KEYS = frozenset(("rollout_id", "attempt", "token", "outcome", "reward", "shards",
                          "infra_reason", "idem", "id"))
_LEASE_KEYS = frozenset(("rollout_id", "attempt", "token", "lease_ttl_s", "task", "policy",
                         "seed", "run_id", "run_dir", "batch_id", "id"))
_POLICY_KEYS = frozenset(("version", "endpoint", "model"))
_OUTCOME_SET = frozenset(OUTCOMES)
_isfinite = math.isfinite


def _plain_str_dict(d: Any) -> bool:
    return type(d) is dict and all(type(k) is str and type(v) is str for k, v in d.items())


def _result_fields_ok(d: dict) -> bool:
    reward, infra = d["reward"], d["infra_reason"]
    return (type(d["rollout_id"]) is str and type(d["attempt"]) is int and d["attempt"] >= 0
            and type(d["token"]) is int and d["token"] >= 0 and d["outcome"] in _OUTCOME_SET
            and type(d["outcome"]) is str
            and (reward is None or (type(reward) is float and _isfinite(reward)))
            and _plain_str_dict(d["shards"]) and (infra is None or type(infra) is str)
            and type(d["idem"]) is str and type(d["id"]) is str
            and (infra is not None or d["outcome"] != "infra_error"))


def _exact_keys(body: dict, msg_id: Optional[str], want: frozenset) -> bool:
    """The body has exactly the message's fields (`id` given apart, or in the body)."""
    keys = body.keys()
    if msg_id is None:
        return keys == want
    return len(keys) == len(want) - 1 and "id" not in keys and (keys | {"id"}) == want


def _build_result(body: dict, msg_id: Optional[str]) -> Optional[Message]:
    if not _exact_keys(body, msg_id, _RESULT_KEYS):
        return None
    msg = object.__new__(Result)
    d = msg.__dict__
    d.update(body)
    if msg_id is not None:
        d["id"] = msg_id
    return msg if _result_fields_ok(d) else None


def _build_lease(body: dict, msg_id: Optional[str]) -> Optional[Message]:
    if not _exact_keys(body, msg_id, _LEASE_KEYS):
        return None
    pol = body["policy"]
    if type(pol) is not dict or pol.keys() != _POLICY_KEYS:
        return None
    version = pol["version"]
    if not (type(version) is int and version >= 0 and type(pol["endpoint"]) is str
            and type(pol["model"]) is str):
        return None
    msg = object.__new__(Lease)
    d = msg.__dict__
    d.update(body)
    if msg_id is not None:
        d["id"] = msg_id
    ttl = d["lease_ttl_s"]
    if type(ttl) is not float or not _isfinite(ttl) or not _lease_scalars_ok(d):
        return None
    d["policy"] = PolicyRef(version, pol["endpoint"], pol["model"])
    return msg


def _lease_scalars_ok(d: dict) -> bool:
    return (type(d["rollout_id"]) is str and type(d["attempt"]) is int and d["attempt"] >= 0
            and type(d["token"]) is int and d["token"] >= 0 and type(d["task"]) is dict
            and type(d["seed"]) is int and d["seed"] >= 0 and type(d["run_id"]) is str
            and type(d["run_dir"]) is str and type(d["batch_id"]) is str
            and type(d["id"]) is str)


def _result_json(m: Message) -> Optional[str]:
    d = m.__dict__
    if not _result_fields_ok(d):
        return None
    reward, infra, shards = d["reward"], d["infra_reason"], d["shards"]
    return (f'{{"rollout_id":{_q(d["rollout_id"])},"attempt":{d["attempt"]},'
            f'"token":{d["token"]},"outcome":"{d["outcome"]}",'
            f'"reward":{"null" if reward is None else float.__repr__(reward)},'
            f'"shards":{_ENCODER.encode(shards) if shards else "{}"},'
            f'"infra_reason":{"null" if infra is None else _q(infra)},'
            f'"idem":{_q(d["idem"])}')


def _result_body(m: Message) -> Optional[str]:
    head = _result_json(m)
    return None if head is None else head + "}"


def _result_batch_body(m: Message) -> Optional[str]:
    items = m.__dict__["items"]
    if type(items) is not list:
        return None
    parts = []
    for item in items:
        head = _result_json(item) if type(item) is Result else None
        if head is None:
            return None
        parts.append(f'{head},"id":{_q(item.id)}}}')
    return f'{{"items":[{",".join(parts)}]}}'


def _lease_json(m: Message, shared: dict) -> Optional[str]:
    """A lease's body (without the closing brace). `shared` caches the JSON of the task and
    policy objects during one encode (a batch's leases mostly share them)."""
    d = m.__dict__
    ttl, task, pol = d["lease_ttl_s"], d["task"], d["policy"]
    if not ((type(ttl) is float or type(ttl) is int) and _isfinite(ttl)
            and type(pol) is PolicyRef and _lease_scalars_ok(d)):
        return None
    task_json = shared.get(id(task))
    if task_json is None:
        try:
            task_json = shared[id(task)] = _ENCODER.encode(task)
        except (TypeError, ValueError):
            return None
    pol_json = shared.get(id(pol))
    if pol_json is None:
        if not (type(pol.version) is int and pol.version >= 0 and type(pol.endpoint) is str
                and type(pol.model) is str):
            return None
        pol_json = shared[id(pol)] = (f'{{"version":{pol.version},"endpoint":{_q(pol.endpoint)}'
                                      f',"model":{_q(pol.model)}}}')
    return (f'{{"rollout_id":{_q(d["rollout_id"])},"attempt":{d["attempt"]},'
            f'"token":{d["token"]},"lease_ttl_s":{ttl!r},"task":{task_json},'
            f'"policy":{pol_json},"seed":{d["seed"]},"run_id":{_q(d["run_id"])},'
            f'"run_dir":{_q(d["run_dir"])},"batch_id":{_q(d["batch_id"])}')


def _lease_body(m: Message) -> Optional[str]:
    head = _lease_json(m, {})
    return None if head is None else head + "}"


def _lease_batch_body(m: Message) -> Optional[str]:
    items, refs = m.__dict__["items"], m.__dict__["acks"]
    if type(items) is not list or type(refs) is not list or not all(
            type(r) is str for r in refs):
        return None
    shared: dict = {}
    parts = []
    for item in items:
        head = _lease_json(item, shared) if type(item) is Lease else None
        if head is None:
            return None
        parts.append(f'{head},"id":{_q(item.id)}}}')
    return f'{{"items":[{",".join(parts)}],"acks":[{",".join(map(_q, refs))}]}}'


_FAST_BUILD: dict[type, Callable[[dict, Optional[str]], Optional[Message]]] = {
    Result: _build_result, Lease: _build_lease}
_FAST_BODY: dict[type, Callable[[Message], Optional[str]]] = {
    Result: _result_body, ResultBatch: _result_batch_body, Lease: _lease_body,
    LeaseBatch: _lease_batch_body}
