"""Wire protocol: every message type round-trips; every bad frame gets its reason code."""
from __future__ import annotations

import json

import pytest

from controller.contracts import codec
from controller.contracts import protocol as p
from tests.conftest import codec_round_trip, wire_frame

DEP = "dep-test"

SAMPLES: list[p.Message] = [
    p.Register(node="n1", slots=4, images=["sha256:aa"], mem_free_mb=2048, agent_version="0.1"),
    p.Heartbeat(node="n1", slots_free=2, active=2, health={"load": 0.5, "disk_free_mb": 10}),
    p.Heartbeat(),
    p.Ready(node="n1", credit=3),
    p.Started(rollout_id="b000001-00000", attempt=1, token=7),
    p.Result(rollout_id="b000001-00000", attempt=1, token=7, outcome="pass", reward=1.0,
             shards={"rollouts": "runs/r/rollouts/x.parquet"}, infra_reason=None, idem="k1"),
    p.Result(rollout_id="b000001-00000", attempt=2, token=9, outcome="infra_error",
             reward=None, shards={}, infra_reason="sandbox_failed", idem="k2"),
    p.Disconnect(node="n1", reason="sigterm"),
    p.Welcome(node="n1", heartbeat_interval_s=1.0, liveness=3),
    p.Lease(rollout_id="b000001-00000", attempt=1, token=7, lease_ttl_s=60.0,
            task={"name": "add", "files": {"a.py": "x=1\n"}},
            policy=p.PolicyRef(version=2, endpoint="http://127.0.0.1:8000/v1", model="scripted"),
            seed=12345, run_id="run1", run_dir="/shared/runs/run1", batch_id="b000001"),
    p.Ack(ref="abc", ok=True, error=None),
    p.Ack(ref="abc", ok=False, error="duplicate"),
    p.Reject(rollout_id="b000001-00000", attempt=1, token=7, reason="stale_token"),
    p.Drain(reason="maintenance"),
    p.Shutdown(),
    p.PolicyUpdate(policy=p.PolicyRef(3, "http://127.0.0.1:8000/v1", "scripted-v3")),
    p.Submit(idem="s1", tasks=["add", "sha256:bb"], n_per_task=4, policy_version=1),
    p.Submitted(batch_id="b000001", rollouts=8),
    p.PublishPolicy(idem="p1", version=2, endpoint="http://h:1/v1", model="m"),
    p.Watch(batch_id="b000001", after=0),
    p.Results(batch_id="b000001", items=[{"rollout_id": "x", "reward": 1.0}], cursor=3,
              done=False),
    p.Status(),
    p.StatusReply(counts={"queued": 3}, nodes=[{"node": "n1", "alive": True}]),
    p.StatusReply(counts={}, nodes=[], counters={"dispatched": 4, "dropped": {"bad_json": 1}}),
    p.Register(node="n1", slots=2, images=[], mem_free_mb=1, agent_version="0.2",
               held=["b000001-00000"]),
    p.Heartbeat(node="n1", slots_free=0, active=2, health={}, images=["sha256:aa"]),
    p.Ready(node="n1", credit=0, draining=True),
    p.Release(rollout_id="b000001-00000", attempt=1, token=7, reason="drain deadline"),
    p.Welcome(node="n1", heartbeat_interval_s=0.5, liveness=4, session="c1"),
    p.Ack(ref="abc", ok=False, error="unknown tasks: ['x']", code="unknown_task"),
    p.Drain(reason="sigterm", deadline_s=30.0),
    p.Watch(batch_id="b000001", after=3, wait_s=2.5),
    p.Cancel(idem="c1", batch_id="b000001"),
    p.Cancel(idem="c2", batch_id="b000001", reason="deadline"),
    p.Cancelled(batch_id="b000001", rollouts=5),
    p.Cancelled(batch_id="b000001", rollouts=5, reason="shutdown"),
    p.DrainNode(node="n1", deadline_s=None),
    p.Submit(idem="s2", tasks=[], n_per_task=2, policy_version=1,
             sampler=p.BandRequest(n_tasks=8, band=[0.2, 0.8], seed=5)),
    p.Refused(reason="agent_version", detail="agent version '0.0.1' is too old",
              protocol_versions=[1], min_agent_version="0.1"),
]
SAMPLES += [
    p.LeaseBatch(items=[m for m in SAMPLES if isinstance(m, p.Lease)] * 2),
    p.ResultBatch(items=[m for m in SAMPLES if isinstance(m, p.Result)]),
    p.AckBatch(refs=["abc", "def"]),
    p.LeaseBatch(items=[m for m in SAMPLES if isinstance(m, p.Lease)], acks=["abc"]),
    p.LeaseBatch(items=[], acks=["abc"]),
]


def frame(msg_type: str, body: dict, **envelope) -> bytes:
    return wire_frame(msg_type, body, DEP, **envelope)


def reason_of(data: bytes, deployment: str = DEP) -> p.RemoteProtocolError:
    with pytest.raises(p.RemoteProtocolError) as info:
        p.decode(data, deployment)
    return info.value


def test_every_message_type_has_a_sample():
    assert {type(m).TYPE for m in SAMPLES} == set(p.MESSAGE_TYPES)


@pytest.mark.parametrize("msg", SAMPLES, ids=lambda m: type(m).TYPE)
def test_every_message_round_trips(msg):
    data = p.encode(msg, DEP)
    assert len(data) <= p.MAX_FRAME_BYTES
    assert p.decode(data, DEP) == msg


def test_frame_envelope_carries_version_deployment_type_and_id():
    msg = p.Ready(node="n1", credit=2)
    f = json.loads(p.encode(msg, DEP))
    assert f == {"v": p.PROTOCOL_VERSION, "dep": DEP, "type": "ready", "id": msg.id,
                 "body": {"node": "n1", "credit": 2, "draining": False}}


def test_message_ids_are_fresh_per_message():
    assert p.Status().id != p.Status().id
    assert len({p.new_msg_id() for _ in range(100)}) == 100


def test_int_widens_to_float_on_decode():
    msg = p.decode(frame("welcome", {"node": "n", "heartbeat_interval_s": 1, "liveness": 3}),
                   DEP)
    assert isinstance(msg.heartbeat_interval_s, float)


def test_lease_policy_decodes_to_a_typed_ref():
    data = p.encode(SAMPLES[9], DEP)
    assert p.decode(data, DEP).policy == p.PolicyRef(2, "http://127.0.0.1:8000/v1", "scripted")


def test_bad_json_is_rejected():
    assert reason_of(b"{not json").reason == p.BAD_JSON
    assert reason_of(b"\xff\xfe").reason == p.BAD_JSON
    assert reason_of(b"[1, 2]").reason == p.BAD_JSON


def test_nan_is_not_json():
    data = frame("result", {}).replace(b'"body": {}', b'"body": {"reward": NaN}')
    assert reason_of(data).reason == p.BAD_JSON


def test_wrong_version_is_rejected():
    assert reason_of(frame("status", {}, v=2)).reason == p.WRONG_VERSION
    assert reason_of(frame("status", {}, v="1")).reason == p.WRONG_VERSION


def test_foreign_deployment_is_rejected():
    data = p.encode(p.Status(), "other-deployment")
    assert reason_of(data).reason == p.FOREIGN_DEPLOYMENT


def test_unknown_type_is_rejected():
    assert reason_of(frame("teleport", {})).reason == p.UNKNOWN_TYPE
    assert reason_of(frame(["status"], {})).reason == p.UNKNOWN_TYPE  # type: ignore[arg-type]


def test_unknown_envelope_key_is_named():
    assert reason_of(frame("status", {}, extra=1)).field == "extra"


def test_too_large_frame_is_rejected_before_parsing():
    data = b" " * (p.MAX_FRAME_BYTES + 1)
    assert reason_of(data).reason == p.TOO_LARGE


def test_too_large_message_is_refused_at_encode():
    big = p.StatusReply(counts={}, nodes=[{"blob": "x" * p.MAX_FRAME_BYTES}])
    with pytest.raises(p.LocalProtocolError) as info:
        p.encode(big, DEP)
    assert info.value.reason == p.TOO_LARGE


def test_wrong_field_type_names_the_field_and_expected_type():
    err = reason_of(frame("ready", {"node": "n1", "credit": "3"}))
    assert err.reason == p.BAD_FIELD
    assert err.field == "credit"
    assert "'credit' must be int" in str(err)


def test_bool_is_not_an_int():
    assert reason_of(frame("ready", {"node": "n1", "credit": True})).field == "credit"


def test_negative_counts_are_rejected():
    assert reason_of(frame("ready", {"node": "n1", "credit": -1})).field == "credit"


def test_missing_field_is_named():
    err = reason_of(frame("started", {"rollout_id": "r", "attempt": 1}))
    assert (err.reason, err.field) == (p.BAD_FIELD, "token")


def test_unknown_field_is_named():
    err = reason_of(frame("ready", {"node": "n1", "credit": 1, "bonus": 2}))
    assert (err.reason, err.field) == (p.BAD_FIELD, "bonus")


def test_nested_field_path_is_named():
    body = json.loads(p.encode(SAMPLES[9], DEP))["body"]
    body["policy"]["version"] = "two"
    assert reason_of(frame("lease", body)).field == "policy.version"
    body = json.loads(p.encode(SAMPLES[0], DEP))["body"]
    body["images"] = ["ok", 3]
    assert reason_of(frame("register", body)).field == "images[1]"


def test_outcome_must_be_one_of_the_typed_outcomes():
    body = json.loads(p.encode(SAMPLES[5], DEP))["body"]
    body["outcome"] = "success"
    err = reason_of(frame("result", body))
    assert err.field == "outcome"
    assert "'pass'" in str(err)


def test_infra_error_needs_a_reason():
    body = json.loads(p.encode(SAMPLES[6], DEP))["body"]
    body["infra_reason"] = None
    assert reason_of(frame("result", body)).field == "infra_reason"


def test_partial_agent_heartbeat_is_rejected():
    assert reason_of(frame("heartbeat", {"node": "n1"})).reason == p.BAD_FIELD


def test_envelope_fields_are_checked():
    assert reason_of(frame("status", {}, id=5)).field == "id"
    assert reason_of(frame("status", [], )).field == "body"


def test_encode_refuses_an_invalid_message_as_our_fault():
    with pytest.raises(p.LocalProtocolError) as info:
        p.encode(p.Ready(node="n1", credit="lots"), DEP)  # type: ignore[arg-type]
    assert (info.value.reason, info.value.field) == (p.BAD_FIELD, "credit")


def test_decode_never_raises_anything_but_protocol_errors_on_garbage():
    import random
    rng = random.Random(7)
    good = [p.encode(m, DEP) for m in SAMPLES]
    for _ in range(2000):
        data = bytearray(rng.choice(good))
        for _ in range(rng.randint(1, 4)):
            data[rng.randrange(len(data))] = rng.randrange(256)
        try:
            p.decode(bytes(data), DEP)
        except p.RemoteProtocolError as e:
            assert e.reason in p.ERROR_REASONS


def test_every_message_type_and_field_is_documented():
    import dataclasses
    import pathlib
    doc = (pathlib.Path(__file__).parents[2] / "docs" / "protocol.md").read_text()
    for name, cls in p.MESSAGE_TYPES.items():
        assert f"`{name}` —" in doc, name
        for f in dataclasses.fields(cls):
            if f.name != "id":
                assert f"`{f.name}`" in doc, (name, f.name)


# ---- batches ----------------------------------------------------------------------------------

def _lease(i: int, task: dict | None = None) -> p.Lease:
    return p.Lease(rollout_id=f"b000001-{i:05d}", attempt=1, token=i + 1, lease_ttl_s=60.0,
                   task=task or {"name": "add"}, policy=p.PolicyRef(1, "http://h/v1", "m"),
                   seed=i, run_id="r", run_dir="/d", batch_id="b000001")


def test_a_batch_keeps_each_items_message_id_and_fields():
    leases = [_lease(i) for i in range(3)]
    got = p.decode(p.encode(p.LeaseBatch(items=leases), DEP), DEP)
    assert got.items == leases and [m.id for m in got.items] == [m.id for m in leases]
    assert p.unbatched(got) == leases


def test_a_bad_item_in_a_batch_rejects_the_frame_with_its_field():
    r = p.Result(rollout_id="x", attempt=1, token=1, outcome="pass", reward=1.0, shards={},
                 infra_reason=None, idem="k")
    item = {**r.body(), "id": r.id, "outcome": "infra_error"}  # infra_error without a reason
    assert reason_of(frame("result_batch", {"items": [item]})).field == "infra_reason"
    assert reason_of(frame("result_batch", {"items": [r.body()]})).field == "items[0]"  # no id
    assert reason_of(frame("leases", {"items": [], "acks": []})).field == "items"
    assert reason_of(frame("acks", {"refs": ["a", 3]})).field == "refs[1]"


def test_batched_chunks_and_a_lone_message_stays_plain():
    leases = [_lease(i) for i in range(p.MAX_BATCH_ITEMS + 5)]
    assert p.batched(leases[:1]) == leases[:1]
    chunks = p.batched(leases)
    assert [len(c.items) for c in chunks] == [p.MAX_BATCH_ITEMS, 5]
    assert [(type(m), m.ref, m.ok) for m in p.acks(["a"])] == [(p.Ack, "a", True)]
    assert [m.refs for m in p.acks(["a", "b"])] == [["a", "b"]]
    (both,) = p.for_agent(leases[:2], ["a"])
    assert both.items == leases[:2] and both.acks == ["a"]
    assert p.for_agent(leases[:1], []) == leases[:1] and p.for_agent([], []) == []
    assert [type(m) for m in p.unbatched(both)] == [p.Ack, p.Lease, p.Lease]


def test_a_batch_over_the_frame_limit_goes_as_several_frames():
    big = {"blob": "x" * (p.MAX_FRAME_BYTES // 3)}
    leases = [_lease(i, big) for i in range(4)]
    with pytest.raises(p.LocalProtocolError):
        p.encode(p.LeaseBatch(items=leases), DEP)
    frames = p.encode_frames(p.LeaseBatch(items=leases), DEP)
    assert len(frames) >= 2 and all(len(f) <= p.MAX_FRAME_BYTES for f in frames)
    assert [m for f in frames for m in p.unbatched(p.decode(f, DEP))] == leases
    frames = p.encode_frames(p.LeaseBatch(items=leases, acks=["a", "b"]), DEP)
    got = [m for f in frames for m in p.unbatched(p.decode(f, DEP))]
    assert [m.ref for m in got if isinstance(m, p.Ack)] == ["a", "b"]
    assert [m for m in got if isinstance(m, p.Lease)] == leases
    with pytest.raises(p.LocalProtocolError):  # one lease alone too large: still our bug
        p.encode_frames(_lease(0, {"blob": "x" * p.MAX_FRAME_BYTES}), DEP)


def test_which_agents_speak_batches():
    assert p.speaks_batches("0.3.0") and p.speaks_batches("1.0")
    assert not p.speaks_batches("0.2.0") and not p.speaks_batches("sim")


# ---- the hand-built paths of the hottest messages (lease, result and their batches) ----

EDGE_CASES: list[p.Message] = [
    p.Lease(rollout_id='quote"back\\slash\nnewline\u00e9\ud800', attempt=0, token=0,
            lease_ttl_s=60, task={"n": float("1e-300"), "unicode": "\u2603", "nested": [1, None]},
            policy=p.PolicyRef(version=0, endpoint="http://h/\"v1", model="m\u00e9"),
            seed=0, run_id="r", run_dir="/x y", batch_id="b"),
    p.Result(rollout_id="r\u2603", attempt=3, token=2**40, outcome="timeout", reward=None,
             shards={"rollouts": "a\"b"}, infra_reason="x", idem="k"),
    p.Result(rollout_id="r", attempt=1, token=1, outcome="fail", reward=-0.0, shards={},
             infra_reason=None, idem="k"),
]


@pytest.mark.parametrize("msg", [m for m in SAMPLES + EDGE_CASES if type(m) in codec._FAST_BODY]
                         + [p.ResultBatch(items=EDGE_CASES[1:]),
                            p.LeaseBatch(items=EDGE_CASES[:1] * 2, acks=["a\"b"])],
                         ids=lambda m: m.TYPE)
def test_hand_built_frames_mean_what_the_generic_encoder_writes(msg, monkeypatch):
    codec_round_trip(msg, DEP, monkeypatch)


@pytest.mark.parametrize("field,value", [("attempt", -1), ("token", True), ("outcome", "won"),
                                         ("reward", float("nan")), ("shards", {"a": 1}),
                                         ("idem", None)])
def test_a_bad_result_is_refused_with_the_same_error_on_the_fast_path(field, value):
    bad = p.Result(**{**SAMPLES[5].__dict__, field: value})
    for msg in (bad, p.ResultBatch(items=[SAMPLES[5], bad])):
        with pytest.raises(p.LocalProtocolError) as info:
            p.encode(msg, DEP)
        assert info.value.reason == p.BAD_FIELD and field in info.value.field


@pytest.mark.parametrize("field,value", [("seed", -3), ("lease_ttl_s", "60"),
                                         ("task", ["not", "a", "dict"]), ("run_dir", 7)])
def test_a_bad_lease_is_refused_on_the_fast_path_and_decoded_the_same(field, value):
    lease = next(m for m in SAMPLES if isinstance(m, p.Lease))
    with pytest.raises(p.LocalProtocolError):
        p.encode(p.Lease(**{**lease.__dict__, field: value}), DEP)
    body = json.loads(p.encode(lease, DEP))["body"]
    body[field] = value
    err = reason_of(frame("lease", body))
    assert err.reason == p.BAD_FIELD and err.field == field


def test_an_int_reward_or_ttl_still_widens_to_float_past_the_fast_path():
    body = json.loads(p.encode(SAMPLES[5], DEP))["body"]
    body["reward"] = 1
    msg = p.decode(frame("result", body), DEP)
    assert msg.reward == 1.0 and type(msg.reward) is float


def test_a_submit_names_tasks_or_a_valid_band_request():
    ok = p.Submit(idem="s", tasks=[], n_per_task=1, policy_version=1,
                  sampler=p.BandRequest(n_tasks=2, band=[0, 1], seed=0))
    assert p.decode(p.encode(ok, DEP), DEP).sampler.band == [0.0, 1.0]
    body = json.loads(p.encode(ok, DEP))["body"]
    for bad, where in (({"tasks": ["t1"]}, "tasks"),
                       ({"sampler": {**body["sampler"], "band": [0.5, 0.5]}}, "sampler.band"),
                       ({"sampler": {**body["sampler"], "n_tasks": 0}}, "sampler.n_tasks"),
                       ({"sampler": {**body["sampler"], "extra": 1}}, "sampler")):
        err = reason_of(frame("submit", {**body, **bad}))
        assert err.reason == p.BAD_FIELD and err.field == where, (bad, err)


def test_a_cancel_without_a_reason_is_the_trainers_and_a_node_side_reason_is_refused():
    assert p.decode(frame("cancel", {"idem": "c", "batch_id": "b"}), DEP).reason == "cancelled_by_trainer"
    for bad in ("lease_revoked", "drain", "Cancelled_By_Trainer", "", 3):
        err = reason_of(frame("cancel", {"idem": "c", "batch_id": "b", "reason": bad}))
        assert (err.reason, err.field) == ("bad_field", "reason"), bad
    assert set(p.TRAINER_CANCEL_REASONS) < set(p.CANCEL_REASONS)


def test_every_reject_reason_maps_to_a_cancel_code():
    from controller.contracts.states import cancel_reason_of_reject
    codes = {r: cancel_reason_of_reject(r) for r in p.REJECT_REASONS}
    assert codes["cancelled"] == "cancelled_by_trainer" and codes["stale_token"] == "lease_revoked"
    assert set(codes.values()) <= set(p.CANCEL_REASONS)
