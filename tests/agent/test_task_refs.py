"""Tasks travel by reference: content blobs on shared storage, small leases, a node cache."""
from __future__ import annotations

import json

import pytest

from controller.broker.core import admit_tasks
from controller.contracts import protocol as P
from controller.contracts.tasks import LeaseTask, Task, TaskError
from controller.ondisk.taskblobs import (
    MAX_REFERENCE_BYTES,
    blob_path,
    check_reference,
    load_tasks_file,
    write_tasks_file,
)
from controller.taskbank.bank import TaskBank, make_set
from controller.taskbank.blobs import blob_root, publish
from controller.taskbank.builtin import builtin_taskset
from nodeagent.agent.taskcache import TaskCache
from tests.broker import test_broker
from tests.broker.test_broker import Harness, leases, of_type


def _big_task() -> Task:
    return Task(name="swe/huge", family="swe", instruction="fix it",
                files={f"src/f{i}.py": "x = 1\n" * 2000 for i in range(40)},
                hidden={"tests/test_x.py": "def test_x():\n    pass\n"},
                checker={"kind": "pytest", "tests": ["tests/test_x.py"]})


def test_a_published_task_set_is_small_references_to_verified_blobs(tmp_path):
    ts = make_set("s", [*builtin_taskset().tasks[:3], _big_task()])
    refs = publish(ts, "sha256:" + "a" * 64, tmp_path / "blobs")
    big = refs["swe/huge"]
    assert refs[big["task_id"]] is big and set(big) >= {"task_id", "name", "blob", "image_digest"}
    assert "files" not in big and "hidden" not in big
    assert all(len(json.dumps(r)) < MAX_REFERENCE_BYTES for r in refs.values())
    assert blob_path(big["blob"]["root"], big["blob"]["digest"]).stat().st_size == big["blob"]["bytes"] > 400_000
    again = publish(ts, "sha256:" + "a" * 64, tmp_path / "blobs")
    assert again == refs, "publishing is deterministic and idempotent"


def test_runs_on_a_bank_share_its_blobs_and_the_builtin_set_keeps_its_own(tmp_path):
    bank = TaskBank(tmp_path / "bank")
    ts = make_set("s", builtin_taskset().tasks[:3])
    bank.put_set(ts)
    roots = [blob_root(bank.root, ts, tmp_path / run) for run in ("run1", "run2")]
    assert roots == [bank.root / "blobs"] * 2
    first = publish(ts, "sha256:" + "a" * 64, roots[0])
    blobs = sorted((bank.root / "blobs").rglob("*.json"))
    stamps = [p.stat().st_mtime_ns for p in blobs]
    assert publish(ts, "sha256:" + "a" * 64, roots[1]) == first and len(blobs) == 3
    assert [p.stat().st_mtime_ns for p in blobs] == stamps, "a second run writes no task again"
    assert not (tmp_path / "run1").exists() and not (tmp_path / "run2").exists()
    assert blob_root(bank.root, builtin_taskset(), tmp_path / "run3") == tmp_path / "run3" / "blobs"


def test_the_tasks_file_lists_each_task_once_and_the_broker_knows_it_by_name_too(tmp_path):
    ts = make_set("s", builtin_taskset().tasks[:5])
    refs = publish(ts, "sha256:" + "a" * 64, tmp_path / "blobs")
    path = write_tasks_file(tmp_path / "tasks.json", refs)
    assert json.loads(path.read_text()) == {t.task_id: refs[t.task_id] for t in ts.tasks}
    loaded = load_tasks_file(path)
    assert loaded == json.loads(path.read_text())
    admitted, refused = admit_tasks(loaded)
    assert not refused and all(admitted[t.name] is admitted[t.task_id] for t in ts.tasks)
    (tmp_path / "old.json").write_text(json.dumps(refs, indent=2))     # an older run's file
    assert load_tasks_file(tmp_path / "old.json") == json.loads(json.dumps(refs))
    (tmp_path / "cut.json").write_text(path.read_text()[:-4])
    with pytest.raises(ValueError):
        load_tasks_file(tmp_path / "cut.json")


def test_the_node_fetches_a_task_by_digest_once_and_checks_its_hash(tmp_path):
    task = _big_task()
    refs = publish(make_set("s", [task]), "sha256:" + "a" * 64, tmp_path / "shared")
    cache = TaskCache(tmp_path / "node-cache")
    lease_task = LeaseTask.decode(refs[task.name])
    full = cache.resolve(lease_task)
    assert full.task_id == task.task_id and full.files["src/f0.py"] == task.files["src/f0.py"]
    assert full.image_digest == "sha256:" + "a" * 64 and full.split == "train" and full.blob is None
    fresh = TaskCache(tmp_path / "node-cache")         # a restarted agent: the node's copy serves
    assert fresh.resolve(lease_task).instruction == "fix it" and fresh.fetched == 0 and cache.fetched == 1
    blob = refs[task.name]["blob"]
    shared = blob_path(blob["root"], blob["digest"])
    shared.write_bytes(shared.read_bytes().replace(b"fix it", b"fix me"))
    with pytest.raises(TaskError, match="hashes to"):
        TaskCache(tmp_path / "other-node").resolve(lease_task)


def test_an_inlined_oversized_task_is_refused_at_load_and_the_rest_still_runs(tmp_path, monkeypatch):
    inline = dict(_big_task().canonical(), task_id="big", image_digest="sha256:aa")
    monkeypatch.setattr(test_broker, "TASKS", {"good": {"task_id": "good", "image_digest": "sha256:aa"},
                                               "big": inline, "junk": ["not", "a", "task"]})
    h = Harness(tmp_path)
    assert set(h.core.tasks) == {"good"}
    assert "swe/huge" in h.core.refused_tasks["big"] and "junk" in h.core.refused_tasks["junk"]
    h.register("n1", 2)
    out = h.send(b"client", P.Submit(idem="bad", tasks=["good", "big"], n_per_task=1, policy_version=1),
                 tick=False)
    [ack] = of_type(out, P.Ack)
    assert not ack.ok and "swe/huge" in ack.error and "refused when the task set was loaded" in ack.error
    h.submit(tasks=("good",), n=2)
    got = leases(h.tick(), "n1")
    assert len(got) == 2 and all(lease.task["task_id"] == "good" for lease in got)


def test_a_reference_with_a_malformed_blob_is_refused_naming_the_task():
    assert "t1" in check_reference("t1", {"task_id": "x", "blob": {"root": "/r", "digest": "md5:1"}})
    assert check_reference("t1", {"task_id": "x", "blob": {"root": "/r", "digest": "sha256:" + "0" * 64}}) is None
