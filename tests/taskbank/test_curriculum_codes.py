"""The curriculum holds a dead letter against its task by the reason's code (states.
TASK_FAULT_CODES), never by how the reason's text begins."""
from __future__ import annotations

import pytest

from controller.contracts.states import InfraReason
from controller.taskbank.curriculum import Curriculum, task_fault

TASKS = ["sha256:a", "sha256:b", "sha256:c"]


@pytest.fixture
def cur(tmp_path):
    with Curriculum(tmp_path / "curriculum.sqlite", TASKS) as c:
        yield c


def test_a_dead_letter_counts_against_its_task_by_its_code(cur):
    for _ in range(3):
        # the task's fault, though its detail begins like the model server's
        cur.record_infra_failure(TASKS[0], InfraReason("setup", "model_server: pip could not reach it"))
        # the rollout's own (the model server), though its detail begins like the task's
        cur.record_infra_failure(TASKS[1], InfraReason("model_server", "task: 503"))
        cur.record_infra_failure(TASKS[2], InfraReason.deadline("total (setup)", "ran past its 60s"))
    assert cur.quarantined() == {TASKS[0]: cur.quarantined()[TASKS[0]]}
    assert cur.quarantined()[TASKS[0]].endswith("last: model_server: pip could not reach it")


@pytest.mark.parametrize("reason,held", [
    ("task: bad field", True), ("sandbox_start: image missing", True), ("verifier: no verdict", True),
    ("deadline: verify: slow", True), ("store: full", False), ("lease_expired", False),
    ("agent_crash: KeyError", False), ("?", False)])
def test_a_reason_given_as_text_is_read_by_its_kind(reason, held):
    assert task_fault(reason) is held
