"""The task set's index on disk (controller/store/taskindex.py): the same admission as the
whole-file dict, opened without reading an entry, rebuilt when the file changes."""
from __future__ import annotations

import json
import os

from controller.broker.core import admit_tasks
from controller.ondisk.taskblobs import load_tasks_file, write_tasks_file
from controller.store.taskindex import TaskIndex, index_path, open_index
from controller.taskbank.bank import make_set
from controller.taskbank.blobs import publish
from controller.taskbank.builtin import builtin_taskset


def _tasks_file(tmp_path, n=6):
    ts = make_set("s", builtin_taskset().tasks[:n])
    refs = publish(ts, "sha256:" + "a" * 64, tmp_path / "blobs")
    return write_tasks_file(tmp_path / "tasks.json", refs), ts


def test_the_index_admits_and_names_what_the_whole_file_dict_does(tmp_path):
    path, ts = _tasks_file(tmp_path)
    admitted, refused = admit_tasks(load_tasks_file(path))
    index = open_index(path)
    assert isinstance(index, TaskIndex) and index_path(path).is_file()
    assert sorted(index) == sorted(admitted) and len(index) == len(admitted)
    assert all(index[k] == admitted[k] for k in admitted), "each reference reads back as written"
    assert index.refused == refused == {}
    assert index.task_count() == len(ts.tasks) and sorted(index.task_ids()) == sorted(t.task_id for t in ts.tasks)
    for t in ts.tasks:
        assert index.ref_of_id(t.task_id) == t.name, "a task is leased under its name, as admit_tasks does"
        assert t.name in index and t.task_id in index
    assert "nope" not in index and index.ref_of_id("sha256:" + "0" * 64) is None
    assert {index.task_id_at(n) for n in range(1, index.task_count() + 1)} == {t.task_id for t in ts.tasks}


def test_a_refused_entry_is_named_with_its_reason_and_the_others_run(tmp_path):
    path, ts = _tasks_file(tmp_path, 3)
    data = json.loads(path.read_text())
    data["bad"] = {"name": "inlined", "files": {"x": "y" * 20_000}, "task_id": "sha256:" + "b" * 64}
    data["noid"] = {"name": "noid"}
    path.write_text("{\n" + ",\n".join(json.dumps(k) + ":" + json.dumps(v) for k, v in data.items()) + "\n}\n")
    index = open_index(path)
    _, refused = admit_tasks(load_tasks_file(path))
    assert set(index.refused) == set(refused) >= {"bad", "noid"}
    assert "over the" in index.refused["bad"] and "bad" not in index
    assert index.task_count() == 3


def test_the_index_is_rebuilt_when_the_tasks_file_changes_and_reused_when_not(tmp_path):
    path, ts = _tasks_file(tmp_path, 4)
    first = open_index(path)
    stamp = index_path(path).stat().st_mtime_ns
    assert open_index(path).task_count() == 4 and index_path(path).stat().st_mtime_ns == stamp
    first.close()
    refs = publish(make_set("s", builtin_taskset().tasks[:2]), "sha256:" + "a" * 64, tmp_path / "blobs")
    write_tasks_file(path, refs)
    os.utime(path, ns=(stamp + 10**9, stamp + 10**9))
    assert open_index(path).task_count() == 2


def test_a_hand_written_indented_tasks_file_is_indexed_too(tmp_path):
    path, ts = _tasks_file(tmp_path, 3)
    data = json.loads(path.read_text())
    path.write_text(json.dumps(data, indent=2))
    assert open_index(path).task_count() == 3
