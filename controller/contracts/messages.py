"""Wire message types: one frozen dataclass per message, and their bodies as JSON values.

Every message type is a frozen dataclass whose fields are exactly its body's keys; the type
annotations are the validation schema the codec checks at decode and at encode (fields with
a default are optional on the wire). `id` is the envelope's message id, not a body field.
The batch messages (several of these in one frame) are in batching.py, the codec and the
type-name table in codec.py. Also here: the one JSON dialect of the wire (`JSON_ENCODER`,
`json_str`), shared by the generic encoder and the hand-built frames. Documented in
docs/protocol.md ("Messages").

No I/O. Must not import: zmq, sqlite3, socket, subprocess, Paddock other than
controller.contracts.errors and controller.contracts.states.
"""
from __future__ import annotations

import dataclasses
import itertools
import json
import os
import typing
import uuid
from dataclasses import dataclass, field
from typing import Any, ClassVar, Optional

from controller.contracts.errors import BAD_FIELD, ProtocolError
from controller.contracts.states import (
    TRAINER_CANCEL_REASONS,
    CancelReason,
    ErrorCode,
    InfraCode,
    InfraReason,
    Outcome,
    RefusalReason,
    RejectReason,
    as_infra_reason,
)

# The one JSON dialect of the wire, made once (json.dumps with options builds one per call).
JSON_ENCODER = json.JSONEncoder(separators=(",", ":"), allow_nan=False)
json_str = json.encoder.encode_basestring_ascii  # a JSON string, as JSON_ENCODER writes it

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
    if typing.TYPE_CHECKING:  # every message class declares the field (id_field()), last
        @property
        def id(self) -> str: ...

    def body(self) -> dict[str, Any]:
        names, nested = _body_plan(type(self))
        d = self.__dict__
        return {n: to_json(d[n]) if n in nested else d[n] for n in names}

    def check(self) -> None:
        """Cross-field rules beyond the per-field types; raise ProtocolError(BAD_FIELD)."""


def id_field() -> Any:
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
    # leases it takes beyond its slots, held waiting for one (docs/protocol.md "Prefetch");
    # omitted from the body when 0, so a controller that predates the field takes the frame
    prefetch: int = 0
    id: str = id_field()

    def body(self) -> dict[str, Any]:
        out = super().body()
        if not self.prefetch:
            del out["prefetch"]
        return out

    def check(self) -> None:
        if self.prefetch < 0:
            raise ProtocolError(BAD_FIELD, f"register: prefetch must be >= 0, got {self.prefetch}",
                                field="prefetch")


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
    id: str = id_field()

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
    id: str = id_field()


@dataclass(frozen=True)
class Started(Message):
    TYPE: ClassVar[str] = "started"
    rollout_id: str
    attempt: int
    token: int
    id: str = id_field()


@dataclass(frozen=True)
class Result(Message):
    TYPE: ClassVar[str] = "result"
    rollout_id: str
    attempt: int
    token: int
    outcome: Outcome
    reward: Optional[float]
    shards: dict[str, str]
    infra_reason: Optional[str]  # the human text ("model_server: connection refused")
    idem: str
    # What decisions read: the reason's code (states.InfraCode). Absent on the wire when None
    # (a verdict, or an agent older than the codes: its prose is parsed, see `reason`).
    infra_code: Optional[InfraCode] = None
    id: str = id_field()

    def check(self) -> None:
        if self.outcome == "infra_error" and self.infra_reason is None:
            raise ProtocolError(BAD_FIELD, "infra_error needs an infra_reason",
                                field="infra_reason")

    def body(self) -> dict[str, Any]:
        out = super().body()
        if out["infra_code"] is None:
            del out["infra_code"]
        return out

    @property
    def reason(self) -> Optional[InfraReason]:
        """The typed reason: `infra_code` with the text; an older agent's prose (no code)
        parsed here, the one place a result's text is read; None without a reason."""
        if self.infra_code is not None:
            return InfraReason(self.infra_code, self.infra_reason or self.infra_code)
        return as_infra_reason(self.infra_reason)


@dataclass(frozen=True)
class Release(Message):
    """The agent hands an unfinished lease back (drain deadline): not a failed attempt."""
    TYPE: ClassVar[str] = "release"
    rollout_id: str
    attempt: int
    token: int
    reason: str
    id: str = id_field()


@dataclass(frozen=True)
class Disconnect(Message):
    TYPE: ClassVar[str] = "disconnect"
    node: str
    reason: str
    id: str = id_field()


# ---- controller -> node agent ----

@dataclass(frozen=True)
class Welcome(Message):
    TYPE: ClassVar[str] = "welcome"
    node: str
    heartbeat_interval_s: float
    liveness: int
    session: str = ""  # the controller instance; a Welcome of another session: re-register
    id: str = id_field()


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
    id: str = id_field()


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
    id: str = id_field()


POLICY_AGENT_VERSION = (0, 4)  # agents from this version take `policy`


def speaks_policy_updates(agent_version: str) -> bool:
    """Whether an agent of this version takes `policy` messages."""
    try:
        return tuple(int(x) for x in agent_version.split(".")[:2]) >= POLICY_AGENT_VERSION
    except ValueError:
        return False


@dataclass(frozen=True)
class PolicyUpdate(Message):
    """The controller's current policy: sent to each agent that takes it when a version is
    published and after its registration. The node's gateway retries a call that a model
    server refused or aborted during a weight update under this policy."""
    TYPE: ClassVar[str] = "policy"
    policy: PolicyRef
    id: str = id_field()


@dataclass(frozen=True)
class Ack(Message):
    TYPE: ClassVar[str] = "ack"
    ref: str  # the acknowledged message's id
    ok: bool
    error: Optional[str] = None
    code: Optional[ErrorCode] = None  # why a request was refused (ok false), for typed errors
    id: str = id_field()


@dataclass(frozen=True)
class Reject(Message):
    TYPE: ClassVar[str] = "reject"
    rollout_id: str
    attempt: int
    token: int
    reason: RejectReason
    id: str = id_field()


@dataclass(frozen=True)
class Drain(Message):
    TYPE: ClassVar[str] = "drain"
    reason: str = ""
    deadline_s: Optional[float] = None  # seconds to finish in-flight work, then hand it back
    id: str = id_field()


@dataclass(frozen=True)
class Shutdown(Message):
    TYPE: ClassVar[str] = "shutdown"
    reason: str = ""
    id: str = id_field()


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
    id: str = id_field()

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
    id: str = id_field()


@dataclass(frozen=True)
class PublishPolicy(Message):
    TYPE: ClassVar[str] = "publish_policy"
    idem: str
    version: int
    endpoint: str
    model: str
    id: str = id_field()


@dataclass(frozen=True)
class Watch(Message):
    TYPE: ClassVar[str] = "watch"
    batch_id: str
    after: int  # cursor: the last commit sequence number already seen
    wait_s: float = 0.0  # long poll: answer when something commits or after wait_s
    id: str = id_field()


@dataclass(frozen=True)
class Results(Message):
    TYPE: ClassVar[str] = "results"
    batch_id: str
    items: list[dict]
    cursor: int
    done: bool
    ref: str = ""  # the id of the watch this answers
    id: str = id_field()


@dataclass(frozen=True)
class Cancel(Message):
    """Client -> controller: cancel a batch. `reason` is a code (states.CancelReason), one of
    those a trainer gives (TRAINER_CANCEL_REASONS): its held leases are revoked at once."""
    TYPE: ClassVar[str] = "cancel"
    idem: str
    batch_id: str
    reason: CancelReason = "cancelled_by_trainer"
    id: str = id_field()

    def check(self) -> None:
        if self.reason not in TRAINER_CANCEL_REASONS:
            raise ProtocolError(BAD_FIELD, f"cancel: reason must be one of {list(TRAINER_CANCEL_REASONS)}, "
                                f"got {self.reason!r}", field="reason")


@dataclass(frozen=True)
class Cancelled(Message):
    TYPE: ClassVar[str] = "cancelled"
    batch_id: str
    rollouts: int  # how many rollouts this cancel moved to cancelled
    ref: str = ""  # the id of the cancel this answers
    reason: CancelReason = "cancelled_by_trainer"  # the cancel's reason, as recorded
    id: str = id_field()


@dataclass(frozen=True)
class DrainNode(Message):
    """Client -> controller: drain one node (answered by ack; ok false if the node is unknown)."""
    TYPE: ClassVar[str] = "drain_node"
    node: str
    deadline_s: Optional[float] = None
    id: str = id_field()


@dataclass(frozen=True)
class Status(Message):
    TYPE: ClassVar[str] = "status"
    id: str = id_field()


@dataclass(frozen=True)
class StatusReply(Message):
    TYPE: ClassVar[str] = "status_reply"
    counts: dict
    nodes: list[dict]
    counters: dict = field(default_factory=dict)  # broker counters (dispatched, dropped...)
    ref: str = ""  # the id of the status request this answers
    id: str = id_field()


# --------------------------------------------------------------------------------------
# Bodies as JSON values (the schema of each class computed once).
# --------------------------------------------------------------------------------------

_SCHEMAS: dict[type, tuple[dict[str, Any], dict[str, dataclasses.Field]]] = {}


def schema(cls: type) -> tuple[dict[str, Any], dict[str, dataclasses.Field]]:
    """(type hints, body fields) of a message or nested dataclass, computed once per class."""
    got = _SCHEMAS.get(cls)
    if got is None:
        got = _SCHEMAS[cls] = (typing.get_type_hints(cls),
                               {f.name: f for f in dataclasses.fields(cls) if f.name != "id"})
    return got


_BODY_PLANS: dict[type, tuple[tuple[str, ...], frozenset[str]]] = {}


def _body_plan(cls: type) -> tuple[tuple[str, ...], frozenset[str]]:
    """The body field names of a message class, and those whose values need to_json
    (a PolicyRef or nested messages); the others are JSON values as they are."""
    got = _BODY_PLANS.get(cls)
    if got is None:
        hints, fields = schema(cls)
        nested = frozenset(n for n in fields if any(
            isinstance(t, type) and dataclasses.is_dataclass(t)
            for t in (hints[n], *typing.get_args(hints[n]))))
        got = _BODY_PLANS[cls] = (tuple(fields), nested)
    return got


def to_json(value: Any) -> Any:
    if isinstance(value, PolicyRef):
        return {"version": value.version, "endpoint": value.endpoint, "model": value.model}
    if isinstance(value, Message):
        out = value.body()
        out["id"] = value.id
        return out
    if isinstance(value, BandRequest):
        return {"n_tasks": value.n_tasks, "band": list(value.band), "seed": value.seed}
    if isinstance(value, list) and value and isinstance(value[0], Message):
        return [to_json(v) for v in value]
    return value
