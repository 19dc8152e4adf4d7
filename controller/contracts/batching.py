"""Batches: several leases, results or acks in one frame, and the hand-built frames of the
hottest messages.

The batch messages (`leases`, `result_batch`, `acks`) and how a sender groups messages into
them (`batched`, `acks`, `for_agent`), splits a frame that is too large (`split`) and how a
receiver takes them apart (`unbatched`); which agents speak them (`speaks_batches`).

The fast paths (`FAST_BODY`, `FAST_BUILD`, used by codec.py): a lease and a result per
rollout, alone or in a batch, built and parsed by hand; a `started` and an agent's
`heartbeat` parsed by hand. Each accepts only the plain common
case and returns None for anything else, which then takes the codec's generic path (and its
precise error); they change the cost, never what is accepted or the JSON's meaning
(tests/contracts/test_protocol.py pins the bytes and checks both paths agree). Documented in
docs/protocol.md ("Batches").

No I/O. Must not import: zmq, sqlite3, socket, subprocess, Paddock other than controller.contracts,
controller.contracts.codec (which imports this module).
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, Callable, ClassVar, Optional, cast

from controller.contracts.errors import BAD_FIELD, ProtocolError
from controller.contracts.messages import (
    JSON_ENCODER,
    Ack,
    Heartbeat,
    Lease,
    Message,
    PolicyRef,
    Result,
    Started,
    id_field,
    json_str,
)
from controller.contracts.states import INFRA_CODES, OUTCOMES

# ---- batches (several messages in one frame) ----
# Agents whose agent_version is at least BATCH_AGENT_VERSION take `leases` and `acks`; an
# agent sends `result_batch` only once the controller has sent it a batch in this session.
BATCH_AGENT_VERSION = (0, 3)
MAX_BATCH_ITEMS = 256  # per frame; a batch frame over MAX_FRAME_BYTES is split by the sender
MAX_ACKS = 4 * MAX_BATCH_ITEMS  # acknowledged ids per frame

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
    id: str = id_field()

    def check(self) -> None:
        if not self.items and not self.acks:
            raise ProtocolError(BAD_FIELD, "leases: items and acks are both empty",
                                field="items")


@dataclass(frozen=True)
class ResultBatch(Message):
    """Agent -> controller: several results in one frame, each acknowledged by its own id."""
    TYPE: ClassVar[str] = "result_batch"
    items: list[Result]
    id: str = id_field()

    def check(self) -> None:
        if not self.items:
            raise ProtocolError(BAD_FIELD, "{}: items must not be empty".format(self.TYPE),
                                field="items")


@dataclass(frozen=True)
class AckBatch(Message):
    """Controller -> agent: `ack` (ok true) of each message id in refs."""
    TYPE: ClassVar[str] = "acks"
    refs: list[str]
    id: str = id_field()

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
    cls: Callable[..., Message] = BATCHES[type(msgs[0])]  # LeaseBatch or ResultBatch
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
    items = cast(list[Any], msg.refs if isinstance(msg, AckBatch) else getattr(msg, "items", None))
    if not isinstance(msg, (LeaseBatch, ResultBatch, AckBatch)) or len(items) < 2:
        raise ValueError(f"cannot split a {msg.TYPE} frame")
    half = len(items) // 2
    if isinstance(msg, AckBatch):
        return [AckBatch(refs=items[:half]), AckBatch(refs=items[half:])]
    return [type(msg)(items=items[:half]), type(msg)(items=items[half:])]

# --------------------------------------------------------------------------------------
# Fast paths for the hottest messages (a lease and a result per rollout, alone or in a
# batch). Each accepts only the plain common case -- every field of exactly its type, within
# its bounds -- and returns None for anything else, which then takes the generic path (and
# its precise error). So they change the cost, never what is accepted or the JSON's meaning;
# tests/contracts/test_protocol.py checks both paths agree.
# --------------------------------------------------------------------------------------

_RESULT_KEYS = frozenset(("rollout_id", "attempt", "token", "outcome", "reward", "shards",
                          "infra_reason", "idem", "id"))
_RESULT_KEYS_CODED = _RESULT_KEYS | {"infra_code"}  # a result with its reason's code
_LEASE_KEYS = frozenset(("rollout_id", "attempt", "token", "lease_ttl_s", "task", "policy",
                         "seed", "run_id", "run_dir", "batch_id", "id"))
_POLICY_KEYS = frozenset(("version", "endpoint", "model"))
_OUTCOME_SET = frozenset(OUTCOMES)
_INFRA_CODE_SET = frozenset(INFRA_CODES)
_isfinite = math.isfinite


def _plain_str_dict(d: Any) -> bool:
    return type(d) is dict and _ONLY_STR.issuperset(map(type, d)) and \
        _ONLY_STR.issuperset(map(type, d.values()))


def _result_fields_ok(d: dict) -> bool:
    reward, infra = d["reward"], d["infra_reason"]
    return (type(d["rollout_id"]) is str and type(d["attempt"]) is int and d["attempt"] >= 0
            and type(d["token"]) is int and d["token"] >= 0 and d["outcome"] in _OUTCOME_SET
            and type(d["outcome"]) is str
            and (reward is None or (type(reward) is float and _isfinite(reward)))
            and _plain_str_dict(d["shards"]) and (infra is None or type(infra) is str)
            and type(d["idem"]) is str and type(d["id"]) is str
            and (infra is not None or d["outcome"] != "infra_error")
            and (d["infra_code"] is None or (type(d["infra_code"]) is str
                                             and d["infra_code"] in _INFRA_CODE_SET)))


def _exact_keys(body: dict, msg_id: Optional[str], want: frozenset) -> bool:
    """The body has exactly the message's fields (`id` given apart, or in the body)."""
    keys = body.keys()
    if msg_id is None:
        return keys == want
    return len(keys) == len(want) - 1 and "id" not in keys and (keys | {"id"}) == want


def _build_result(body: dict, msg_id: Optional[str]) -> Optional[Message]:
    coded = "infra_code" in body
    if not _exact_keys(body, msg_id, _RESULT_KEYS_CODED if coded else _RESULT_KEYS):
        return None
    msg = object.__new__(Result)
    d = msg.__dict__
    if not coded:
        d["infra_code"] = None
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
    return (f'{{"rollout_id":{json_str(d["rollout_id"])},"attempt":{d["attempt"]},'
            f'"token":{d["token"]},"outcome":"{d["outcome"]}",'
            f'"reward":{"null" if reward is None else float.__repr__(reward)},'
            f'"shards":{JSON_ENCODER.encode(shards) if shards else "{}"},'
            f'"infra_reason":{"null" if infra is None else json_str(infra)},'
            f'"idem":{json_str(d["idem"])}'
            + ("" if d["infra_code"] is None else f',"infra_code":"{d["infra_code"]}"'))


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
        parts.append(f'{head},"id":{json_str(item.id)}}}')
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
            task_json = shared[id(task)] = JSON_ENCODER.encode(task)
        except (TypeError, ValueError):
            return None
    pol_json = shared.get(id(pol))
    if pol_json is None:
        if not (type(pol.version) is int and pol.version >= 0 and type(pol.endpoint) is str
                and type(pol.model) is str):
            return None
        pol_json = shared[id(pol)] = (f'{{"version":{pol.version},"endpoint":{json_str(pol.endpoint)}'
                                      f',"model":{json_str(pol.model)}}}')
    return (f'{{"rollout_id":{json_str(d["rollout_id"])},"attempt":{d["attempt"]},'
            f'"token":{d["token"]},"lease_ttl_s":{ttl!r},"task":{task_json},'
            f'"policy":{pol_json},"seed":{d["seed"]},"run_id":{json_str(d["run_id"])},'
            f'"run_dir":{json_str(d["run_dir"])},"batch_id":{json_str(d["batch_id"])}')


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
        parts.append(f'{head},"id":{json_str(item.id)}}}')
    return f'{{"items":[{",".join(parts)}],"acks":[{",".join(map(json_str, refs))}]}}'


_STARTED_KEYS = frozenset(("rollout_id", "attempt", "token", "id"))
_HEARTBEAT_KEYS = frozenset(("node", "slots_free", "active", "health", "images", "held"))


def _build_started(body: dict, msg_id: Optional[str]) -> Optional[Message]:
    """A `started` (one per rollout from every agent)."""
    if not _exact_keys(body, msg_id, _STARTED_KEYS):
        return None
    msg = object.__new__(Started)
    d = msg.__dict__
    d.update(body)
    if msg_id is not None:
        d["id"] = msg_id
    ok = (type(d["rollout_id"]) is str and type(d["attempt"]) is int and d["attempt"] >= 0
          and type(d["token"]) is int and d["token"] >= 0 and type(d["id"]) is str)
    return msg if ok else None


def _str_list_or_none(v: Any) -> bool:
    # (the types of the items as a set, in C: no Python frame per item; a str subclass is
    # another type, as `type(x) is str` says)
    return v is None or (type(v) is list and _ONLY_STR.issuperset(map(type, v)))


_ONLY_STR = frozenset((str,))


def _build_heartbeat(body: dict, msg_id: Optional[str]) -> Optional[Message]:
    """An agent's `heartbeat` (node, slots_free, active and health given; images and held
    null, absent or lists of strings), as a frame of its own."""
    if msg_id is None or len(body) < 4 or not body.keys() <= _HEARTBEAT_KEYS:
        return None
    get = body.get
    node, free, active, health, images, held = (get("node"), get("slots_free"), get("active"),
                                                get("health"), get("images"), get("held"))
    if not (type(node) is str and type(free) is int and free >= 0 and type(active) is int
            and active >= 0 and type(health) is dict and _str_list_or_none(images)
            and _str_list_or_none(held)):
        return None
    msg = object.__new__(Heartbeat)
    msg.__dict__.update(node=node, slots_free=free, active=active, health=health, images=images,
                        held=held, id=msg_id)
    return msg


FAST_BUILD: dict[type, Callable[[dict, Optional[str]], Optional[Message]]] = {
    Result: _build_result, Lease: _build_lease, Started: _build_started, Heartbeat: _build_heartbeat}
FAST_BODY: dict[type, Callable[[Message], Optional[str]]] = {
    Result: _result_body, ResultBatch: _result_batch_body, Lease: _lease_body,
    LeaseBatch: _lease_batch_body}
