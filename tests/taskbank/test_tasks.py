"""Task packages and manifests on disk: round trips, hashes, and errors that name the file."""
from __future__ import annotations

import io
from pathlib import Path

import pytest
import yaml

from controller.contracts.tasks import Task, TaskError, TaskSet
from controller.taskbank.bank import TaskBank, find_task, load_package, make_set, write_package
from controller.taskbank.builtin import builtin_taskset

BUILTIN = builtin_taskset()


def _task(name="python/x", body="def f():\n    return 1\n") -> Task:
    return Task(name=name, family="python", instruction="make f return 1",
                files={"solution.py": "def f():\n    pass\n", "data/blob.bin": b"\xff\x00\xfe"},
                hidden={"test_hidden.py": "from solution import f\n\ndef test_f():\n    assert f() == 1\n",
                        "reference.py": body},
                checker={"kind": "pytest", "tests": ["test_hidden.py"]})


def test_package_round_trip_keeps_the_content_hash_including_binary_files(tmp_path):
    task = _task()
    write_package(task, tmp_path / "pkg")
    assert (tmp_path / "pkg" / "files" / "data" / "blob.bin").read_bytes() == b"\xff\x00\xfe"
    assert (tmp_path / "pkg" / "hidden" / "reference.py").exists()
    again = load_package(tmp_path / "pkg")
    assert again.task_id == task.task_id
    assert again.files["data/blob.bin"] == b"\xff\x00\xfe"


def test_utf8_bytes_and_text_are_the_same_content():
    a = _task()
    b = Task(**{**a.__dict__, "files": {**a.files, "solution.py": a.files["solution.py"].encode()}})
    assert a.task_id == b.task_id


def test_every_field_changes_the_task_id():
    base = _task()
    assert _task(body="def f():\n    return 2\n").task_id != base.task_id
    assert _task(name="python/y").task_id != base.task_id


def test_builtin_set_round_trips_through_the_bank_with_the_same_manifest_hash(tmp_path):
    bank = TaskBank(tmp_path / "bank")
    bank.put_set(BUILTIN)
    loaded = bank.load_set(BUILTIN.name)
    assert loaded.manifest_hash == BUILTIN.manifest_hash
    assert {t.task_id for t in loaded.tasks} == {t.task_id for t in BUILTIN.tasks}


def test_manifest_hash_covers_the_split():
    train = make_set("s", BUILTIN.tasks[:3], "train")
    held = make_set("s", BUILTIN.tasks[:3], "heldout")
    assert train.manifest_hash != held.manifest_hash
    assert held.heldout == {t.task_id for t in BUILTIN.tasks[:3]}


@pytest.mark.parametrize("edit, message", [
    (lambda m: m.pop("checker"), "missing key(s) checker"),
    (lambda m: m.update(colour="red"), "unknown key(s) colour"),
    (lambda m: m["limits"].update(gpus=1), "unknown key 'limits.gpus'"),
    (lambda m: m.update(family="chess"), "'family' must be one of"),
    (lambda m: m.update(instruction="changed"), "but the package records id"),
])
def test_a_bad_package_names_the_file_and_the_problem(tmp_path, edit, message):
    pkg = write_package(_task(), tmp_path / "pkg")
    meta = yaml.safe_load((pkg / "task.yaml").read_text())
    edit(meta)
    (pkg / "task.yaml").write_text(yaml.safe_dump(meta))
    with pytest.raises(TaskError) as e:
        load_package(pkg)
    assert str(pkg / "task.yaml") in str(e.value) and message in str(e.value)


def test_a_symlink_in_a_package_is_refused(tmp_path):
    pkg = write_package(_task(), tmp_path / "pkg")
    (pkg / "files" / "link").symlink_to("/etc/passwd")
    with pytest.raises(TaskError, match="symbolic links"):
        load_package(pkg)


def _stored_set(tmp_path) -> tuple[TaskBank, Path]:
    bank = TaskBank(tmp_path / "bank")
    return bank, bank.put_set(make_set("small", BUILTIN.tasks[:2]))


def test_a_manifest_naming_an_unknown_task_is_an_error_naming_the_manifest(tmp_path):
    bank, path = _stored_set(tmp_path)
    m = yaml.safe_load(path.read_text())
    m["tasks"][0]["task_id"] = "sha256:" + "0" * 64
    m.pop("manifest_hash")
    path.write_text(yaml.safe_dump(m))
    with pytest.raises(TaskError) as e:
        bank.load_set("small")
    assert str(path) in str(e.value) and "unknown task" in str(e.value)


def test_a_duplicate_task_id_with_different_content_is_an_error(tmp_path):
    bank, path = _stored_set(tmp_path)
    m = yaml.safe_load(path.read_text())
    m["tasks"].append({**m["tasks"][0], "name": "another/name"})
    path.write_text(yaml.safe_dump(m))
    with pytest.raises(TaskError, match="listed twice with different content"):
        bank.load_set("small")


def test_a_hand_edited_manifest_does_not_match_its_hash(tmp_path):
    bank, path = _stored_set(tmp_path)
    m = yaml.safe_load(path.read_text())
    m["tasks"][0]["split"] = "heldout"
    path.write_text(yaml.safe_dump(m))
    with pytest.raises(TaskError, match="edited by hand"):
        bank.load_set("small")


def test_duplicate_names_in_one_set_are_refused():
    t = BUILTIN.tasks[0]
    other = Task(**{**t.__dict__, "instruction": t.instruction + " (v2)"})
    with pytest.raises(TaskError, match="duplicate task names"):
        TaskSet("dup", (t, other))


def test_find_task_by_prefix_and_by_name(tmp_path):
    bank, _ = _stored_set(tmp_path)
    t = BUILTIN.tasks[1]
    assert find_task(bank, t.task_id[7:15]).task_id == t.task_id
    assert find_task(bank, t.name).task_id == t.task_id
    with pytest.raises(TaskError, match="no task"):
        find_task(bank, "nope/none")


def test_cli_list_and_show(tmp_path):
    from controller.cli.main import build_parser
    bank, _ = _stored_set(tmp_path)
    out = io.StringIO()
    args = build_parser().parse_args(["tasks", "--bank", str(bank.root), "list"])
    assert args.func(args, out=out) == 0
    assert out.getvalue().startswith("small  2 tasks (0 heldout)")
    out = io.StringIO()
    args = build_parser().parse_args(["tasks", "--bank", str(bank.root), "show",
                                      BUILTIN.tasks[0].name, "--hidden"])
    assert args.func(args, out=out) == 0
    assert "reference.py" in out.getvalue() and BUILTIN.tasks[0].task_id in out.getvalue()


def test_network_allowlist_and_tool_set_are_task_fields_that_validate():
    from controller.contracts.tasks import Task, TaskError
    base = dict(name="t", family="math", instruction="2+2?", checker={"kind": "math", "answer": "4"})
    plain = Task(**base)
    assert "tools" not in plain.canonical() and plain.canonical()["network"] == "none"
    allowed = Task(**base, network="pypi.org:443, *.pythonhosted.org", tools=["shell", "read_file"])
    assert allowed.network == ("pypi.org:443", "*.pythonhosted.org")
    assert allowed.canonical()["network"] == ["pypi.org:443", "*.pythonhosted.org"]
    assert Task(**base, network={"allow": ["pypi.org:443", "*.pythonhosted.org"]},
                tools=("shell", "read_file")).task_id == allowed.task_id
    assert allowed.task_id != plain.task_id
    with pytest.raises(TaskError, match="'network'.*public suffix"):
        Task(**base, network=["*.com"])
    with pytest.raises(TaskError, match="'network'.*IP literal"):
        Task(**base, network=["10.0.0.1"])
    with pytest.raises(TaskError, match="'tools'.*unknown tool"):
        Task(**base, tools=["shell", "rm_rf"])


def test_checker_spec_is_checked_against_the_verifiers_schema_when_the_task_is_made():
    from controller.contracts.tasks import Task, TaskError
    base = dict(name="t", family="python", instruction="do it", files={"solution.py": "x = 1\n"},
                hidden={"test_h.py": "def test(): pass\n"})
    Task(**base, checker={"kind": "pytest", "tests": ["test_h.py"], "fail_to_pass": ["test_h.py::test"]})
    Task(**base, checker={"kind": "command", "argv": ["python3", "-c", "pass"]})
    with pytest.raises(TaskError, match=r"unknown field\(s\) \['tset'\]"):
        Task(**base, checker={"kind": "pytest", "tests": ["test_h.py"], "tset": 1})


def test_declared_budgets_are_the_ones_the_harness_enforces():
    from controller.contracts.tasks import Budgets as Declared
    from nodeagent.harness.loop import Budgets as Enforced
    assert Enforced is Declared


@pytest.mark.parametrize("image", ["ubuntu:22.04", "sha256:abc", "", "builtin:rust"])
def test_an_image_reference_that_no_store_can_hold_is_refused_by_name(image):
    base = dict(name="t", family="math", instruction="1+1?", hidden={"answer.txt": "2"},
                checker={"kind": "math", "answer": "2"})
    with pytest.raises(TaskError, match=r"task 't': 'image' must be 'builtin:python' or 'sha256:<64 hex"):
        Task(**base, image=image)
    assert Task(**base, image="sha256:" + "a" * 64).image.startswith("sha256:")


def _budgeted(**budgets):
    from controller.contracts.tasks import Budgets
    return Task(name="python/x", family="python", instruction="make f return 1",
                files={"solution.py": "def f():\n    pass\n"}, hidden={"test_hidden.py": "def test_f(): pass\n"},
                checker={"kind": "pytest", "tests": ["test_hidden.py"]},
                budgets=Budgets(max_steps=7, wall_s=30.0, **budgets))


def test_the_deadline_and_progress_budgets_leave_existing_task_ids_where_they_were():
    # ids computed by the code before these budget keys existed
    assert _budgeted().task_id == "sha256:c994c83fac2e4b6b97618a5ed57d10ef7f15b7b6e1c19f5c62aee2882f3363a6"
    assert _budgeted(total_s=0.0, no_progress_repeats=0).task_id == _budgeted().task_id
    import hashlib
    ids = sorted(t.task_id for t in BUILTIN.tasks)
    assert hashlib.sha256("".join(ids).encode()).hexdigest() == \
        "94faef994adb744973d6f735445858367792a2d89525df582319e7c8a2996e84"
    # a task that sets one is another task
    assert len({_budgeted(total_s=60.0).task_id, _budgeted(setup_s=60.0).task_id, _budgeted().task_id,
                _budgeted(no_progress_repeats=3).task_id, _budgeted(no_output_turns=3).task_id}) == 5


@pytest.mark.parametrize("key,value,match", [
    ("total_s", -1.0, "'total_s' must be a number from 0"), ("setup_s", "60", "'setup_s' must be a number"),
    ("no_progress_repeats", 2.5, "'no_progress_repeats' must be an integer"), ("deadline_s", 5, "unknown budget key"),
])
def test_bad_deadline_budgets_name_the_key(key, value, match):
    from controller.contracts.tasks import BudgetError, Budgets
    with pytest.raises(BudgetError, match=match):
        Budgets.from_dict({key: value})


def test_a_runs_defaults_fill_only_what_the_task_leaves_at_0():
    from controller.contracts.tasks import BudgetError, Budgets
    b = Budgets(total_s=30.0).with_run_defaults({"total_s": 600, "setup_s": 5, "no_output_turns": 4})
    assert (b.total_s, b.setup_s, b.no_output_turns, b.verify_s) == (30.0, 5.0, 4, 0.0)
    with pytest.raises(BudgetError, match="'max_steps' is not one of"):
        Budgets().with_run_defaults({"max_steps": 3})
    with pytest.raises(BudgetError, match="'setup_s' must be a number"):
        Budgets().with_run_defaults({"setup_s": -2})
