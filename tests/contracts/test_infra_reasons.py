"""Infrastructure-failure reasons are typed: a code from one vocabulary decides (a loss, the
task's fault, a cancel), the text is for people. On the wire the code is its own field of
`result`; a code outside the vocabulary is refused naming the field; an older agent's prose
is parsed once, at the edge."""
from __future__ import annotations

import json

import pytest

from controller.contracts import codec
from controller.contracts import protocol as p
from controller.contracts import states as S
from controller.contracts.states import InfraReason
from tests.conftest import codec_round_trip, wire_frame

DEP = "dep-test"


def result(**kw) -> p.Result:
    base = dict(rollout_id="b000001-00000", attempt=2, token=9, outcome="infra_error",
                reward=None, shards={}, infra_reason="task: x", idem="k2")
    return p.Result(**{**base, **kw})


def frame(msg_type: str, body: dict) -> bytes:
    return wire_frame(msg_type, body, DEP)


def test_every_code_has_a_class_and_the_task_fault_codes_are_codes():
    assert set(S.INFRA_CLASS) == set(S.INFRA_CODES)
    assert set(S.INFRA_CLASS.values()) == {S.LOSS, S.CHARGED, S.STOPPED}
    assert S.TASK_FAULT_CODES <= set(S.INFRA_CODES)


def test_the_code_decides_even_when_the_text_starts_with_another_kind():
    # A task error whose detail quotes the model server's error: still the task's.
    charged = result(infra_code="task", infra_reason="model_server: refused: task said so")
    assert charged.reason == InfraReason("task", "model_server: refused: task said so")
    assert not charged.reason.is_loss and charged.reason.task_fault
    lost = result(infra_code="model_server", infra_reason="task: the task file names model_server")
    assert lost.reason.is_loss and not lost.reason.task_fault
    assert not S.is_infra_loss(charged.reason) and S.is_infra_loss(lost.reason)


def test_a_detail_with_colons_keeps_its_code_and_the_text_keeps_its_old_form():
    r = InfraReason.of(S.SANDBOX, "mount: /work: device busy")
    assert (r.code, r.text) == ("sandbox", "sandbox: mount: /work: device busy")
    assert InfraReason.parse(r.text) == r
    assert InfraReason.of(S.NODE_LOST, "silent").text == "node_lost: silent"
    assert InfraReason.of(S.LEASE_EXPIRED).text == "lease_expired"


@pytest.mark.parametrize("phase,code,loss,fault", [
    ("create", "deadline_create", True, False), ("teardown", "deadline_teardown", True, False),
    ("total (setup)", "deadline_total", True, False), ("setup", "deadline_setup", False, True),
    ("verify", "deadline_verify", False, True), ("between phases", "deadline", False, False)])
def test_a_deadline_is_coded_by_its_phase(phase, code, loss, fault):
    r = InfraReason.deadline(phase, "ran past: 5s")
    assert r.code == code and r.text == f"deadline: {phase}: ran past: 5s"
    assert (r.is_loss, r.task_fault) == (loss, fault)
    assert InfraReason.parse(r.text) == r    # the prose of an older agent gets the same code


@pytest.mark.parametrize("text,code", [
    ("model_server: connection refused", "model_server"), ("sandbox_start: no image", "sandbox_start"),
    ("store: disk full", "store"), ("agent_crash: KeyError: 'x'", "agent_crash"),
    ("browser_start: chromium: no display", "browser_start"),
    ("cancelled: drain", "cancelled"), ("flaky disk: sda", "unknown"), ("?", "unknown"),
    (" task : spaced", "task")])
def test_older_prose_is_parsed_by_its_kind(text, code):
    assert InfraReason.parse(text) == InfraReason(code, text)


def test_a_code_outside_the_vocabulary_is_a_programmer_error_naming_it():
    with pytest.raises(ValueError, match="'flaky_disk' is not one of"):
        InfraReason("flaky_disk", "x")  # type: ignore[arg-type]


@pytest.mark.parametrize("msg", [
    result(infra_code="sandbox", infra_reason="sandbox: died: OOM"),
    result(infra_code="deadline_total", infra_reason="deadline: total (verify): 60s"),
    result(outcome="pass", reward=1.0, infra_reason=None),
    p.ResultBatch(items=[result(infra_code="task", idem="a"), result(infra_code=None, idem="b"),
                         result(outcome="fail", reward=0.0, infra_reason=None, idem="c")])],
    ids=lambda m: m.TYPE)
def test_the_code_travels_on_both_codec_paths(msg, monkeypatch):
    codec_round_trip(msg, DEP, monkeypatch)


def test_a_result_without_a_code_is_the_frame_it_was_and_its_prose_is_parsed():
    old = result(infra_reason="model_server: connection refused")
    body = json.loads(p.encode(old, DEP))["body"]
    assert "infra_code" not in body            # the frame of an older agent, byte for byte
    got = p.decode(frame("result", body), DEP)
    assert got.infra_code is None and got.reason == InfraReason("model_server", old.infra_reason)
    assert got.reason.is_loss


@pytest.mark.parametrize("fast", [True, False])
@pytest.mark.parametrize("bad", ["flaky_disk", "", 3, "Task"])
def test_an_unknown_code_from_the_wire_is_refused_naming_the_field(bad, fast, monkeypatch):
    if not fast:
        monkeypatch.setattr(codec, "_FAST_BUILD", {})
    body = {**result().body(), "infra_code": bad}
    for data in (frame("result", body),
                 frame("result_batch", {"items": [{**body, "id": "i1"}]})):
        with pytest.raises(p.RemoteProtocolError) as info:
            p.decode(data, DEP)
        assert info.value.field.endswith("infra_code"), info.value.field
        assert "must be" in str(info.value) and "'model_server'" in str(info.value)
