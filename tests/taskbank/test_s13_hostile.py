"""Hostile task input (red team s13m, part B): a task that could only ever score 0, a package
holding a FIFO or device node, duplicate keys, a set silently replaced, names that forge output.
Each is refused at import with an error naming the task and the field; nothing accepted is lost."""
from __future__ import annotations

import io
import json
import os
import socket
from pathlib import Path

import pytest

from controller.cli.main import main
from controller.contracts.tasks import Task, TaskError
from controller.taskbank.bank import TaskBank, load_package, make_set

GOOD = "name: good\nfamily: math\ninstruction: What is 2+3?\nchecker: {kind: math, answer: '5'}\n"


def _pkg(root: Path, name: str, text: str) -> Path:
    d = root / name
    d.mkdir(parents=True)
    (d / "task.yaml").write_text(text)
    return d


def _import(bank: Path, kind: str, src: Path, set_name: str, *extra: str) -> int:
    return main(["tasks", "--bank", str(bank), "import", kind, str(src), f"--set={set_name}", *extra])


def _stored(bank: Path) -> list[str]:
    tasks = bank / "tasks"
    return sorted(p.name for p in tasks.iterdir()) if tasks.is_dir() else []


# -- B3/B4: a task that can only score 0 ----------------------------------------------------

@pytest.mark.parametrize("timeout", [".inf", ".nan", "1.0e+308", "-.inf", "100000"])
def test_a_checker_timeout_that_is_not_finite_or_beyond_a_day_is_refused_naming_the_field(tmp_path, timeout):
    d = _pkg(tmp_path, "t", GOOD.replace("answer: '5'}", f"answer: '5', timeout_s: {timeout}}}"))
    with pytest.raises(TaskError, match=r"checker\.timeout_s"):
        load_package(d)


@pytest.mark.parametrize("answer", ["'   '", "'\\frac{'"])
def test_a_math_gold_the_math_checker_cannot_read_is_refused_at_import(tmp_path, capsys, answer):
    _pkg(tmp_path / "src", "t", GOOD.replace("answer: '5'", f"answer: {answer}"))
    assert _import(tmp_path / "bank", "package", tmp_path / "src", "s") == 2
    err = capsys.readouterr().err
    assert "checker.answer" in err and "'good'" in err.replace("task 'good'", "'good'")
    assert _stored(tmp_path / "bank") == []


@pytest.mark.parametrize("value", ["null", "NaN", "Infinity", "[5]", "true", "{\"a\": 1}"])
def test_the_math_importer_never_turns_null_nan_or_a_list_into_a_gold_string(tmp_path, capsys, value):
    src = tmp_path / "m.jsonl"
    src.write_text('{"question": "q", "answer": %s}\n' % value)
    assert _import(tmp_path / "bank", "math", src, "s") == 2
    err = capsys.readouterr().err
    assert "m.jsonl:1" in err and "'answer'" in err


def test_math_jsonl_numbers_stay_golds(tmp_path):
    src = tmp_path / "m.jsonl"
    src.write_text('{"question": "q", "answer": 72}\n{"question": "r", "answer": "#### 1,234"}\n')
    assert _import(tmp_path / "bank", "math", src, "s") == 0
    golds = sorted(t.checker["answer"] for t in TaskBank(tmp_path / "bank").load_set("s").tasks)
    assert golds == ["1234", "72"]


def _bank_with_an_unloadable_task(tmp_path):
    """Set `s` of tasks a and b, b's package edited on disk to a NaN deadline (stored before
    deadlines were checked)."""
    bank = TaskBank(tmp_path / "bank")
    a = Task(name="a", family="math", instruction="2+3?", checker={"kind": "math", "answer": "5"})
    b = Task(name="b", family="math", instruction="2+4?", checker={"kind": "math", "answer": "6"})
    bank.put_set(make_set("s", [a, b]))
    yml = bank.package_dir(b.task_id) / "task.yaml"
    yml.write_text(yml.read_text().replace("answer: '6'", "answer: '6'\n  timeout_s: .nan"))
    return bank, a, b


def test_validate_refuses_a_task_that_cannot_be_loaded_and_goes_on_with_the_others(tmp_path):
    """A package stored before timeouts were checked (edited on disk): `load_set` with a
    `broken` list leaves it out and names it; without one, the error names the task."""
    bank, a, b = _bank_with_an_unloadable_task(tmp_path)
    with pytest.raises(TaskError, match="timeout_s"):
        bank.load_set("s")
    broken: list = []
    ts = bank.load_set("s", broken)
    assert [t.name for t in ts.tasks] == ["a"]
    assert [e["name"] for e, _ in broken] == ["b"] and "finite" in broken[0][1]


# -- B5: FIFOs, sockets and device nodes in a package ----------------------------------------

def test_a_fifo_in_a_package_is_refused_by_name_without_hanging(tmp_path):
    d = _pkg(tmp_path, "t", GOOD)
    (d / "files").mkdir()
    os.mkfifo(d / "files" / "pipe")
    with pytest.raises(TaskError, match=r"files/pipe: a FIFO"):
        load_package(d)


def test_a_fifo_as_task_yaml_or_jsonl_source_is_refused(tmp_path, capsys):
    d = tmp_path / "src" / "t"
    d.mkdir(parents=True)
    os.mkfifo(d / "task.yaml")
    with pytest.raises(TaskError, match="a FIFO"):
        load_package(d)
    os.mkfifo(tmp_path / "m.jsonl")
    assert _import(tmp_path / "bank", "math", tmp_path / "m.jsonl", "s") == 2
    assert "not a regular file" in capsys.readouterr().err


def test_a_socket_in_a_package_is_refused(tmp_path):
    d = _pkg(tmp_path, "t", GOOD)
    (d / "hidden").mkdir()
    path = d / "hidden" / "s"
    if len(str(path)) > 100:
        pytest.skip("socket path too long for AF_UNIX")
    with socket.socket(socket.AF_UNIX) as s:
        s.bind(str(path))
        with pytest.raises(TaskError, match=r"hidden/s: a socket"):
            load_package(d)


# -- B7: duplicate keys ---------------------------------------------------------------------

def test_a_second_checker_key_is_refused_naming_the_key(tmp_path):
    d = _pkg(tmp_path, "t", GOOD + "checker: {kind: math, answer: '6'}\n")
    with pytest.raises(TaskError, match="duplicate key 'checker'"):
        load_package(d)


def test_a_duplicate_json_key_in_a_jsonl_record_is_refused(tmp_path, capsys):
    src = tmp_path / "m.jsonl"
    src.write_text('{"question": "q", "answer": "5", "answer": "6"}\n')
    assert _import(tmp_path / "bank", "math", src, "s") == 2
    assert "duplicate key 'answer'" in capsys.readouterr().err


# -- B6/B11: a set is never silently replaced; a refused import stores nothing ---------------

def test_importing_into_an_existing_set_name_needs_replace(tmp_path, capsys):
    bank = tmp_path / "bank"
    _pkg(tmp_path / "one", "good", GOOD)
    _pkg(tmp_path / "two", "other", GOOD.replace("name: good", "name: other"))
    assert _import(bank, "package", tmp_path / "one", "kept") == 0
    assert _import(bank, "package", tmp_path / "one", "kept") == 0      # the same set again: no change
    assert _import(bank, "package", tmp_path / "two", "kept") == 2
    assert "already exists" in capsys.readouterr().err
    assert [t.name for t in TaskBank(bank).load_set("kept").tasks] == ["good"]
    assert _import(bank, "package", tmp_path / "two", "kept", "--replace") == 0
    assert [t.name for t in TaskBank(bank).load_set("kept").tasks] == ["other"]


@pytest.mark.parametrize("set_name", ["", " ", "a b", "a\nb", "x" * 300, "-x", "'; DROP TABLE x;--"])
def test_a_bad_set_name_is_refused_and_stores_no_package(tmp_path, capsys, set_name):
    _pkg(tmp_path / "src", "good", GOOD)
    assert _import(tmp_path / "bank", "package", tmp_path / "src", set_name) == 2
    assert "task set name" in capsys.readouterr().err
    assert _stored(tmp_path / "bank") == []


# -- B8/B9/B10/B13: wrong types, odd keys, control characters, sizes ------------------------

def test_setup_as_a_string_is_refused_not_split_into_characters(tmp_path):
    d = _pkg(tmp_path, "t", GOOD + "setup: 'rm -rf /'\n")
    with pytest.raises(TaskError, match="'setup' must be a list of strings"):
        load_package(d)


def test_an_integer_key_is_a_clear_error(tmp_path):
    d = _pkg(tmp_path, "t", GOOD + "1: x\n")
    with pytest.raises(TaskError, match="key 1 is not a string"):
        load_package(d)


@pytest.mark.parametrize("name", ["good\nsha256:deadbeef  train  math  forged", "a\x00b", "a\x1b[31m", " a", "x" * 300])
def test_a_task_name_with_control_characters_or_too_long_is_refused(name):
    with pytest.raises(TaskError, match="'name' must be"):
        Task(name=name, family="math", instruction="2+3?", checker={"kind": "math", "answer": "5"})


def test_an_instruction_that_is_not_text_or_too_large_is_refused():
    with pytest.raises(TaskError, match="'instruction' must be a string"):
        Task(name="t", family="math", instruction=5, checker={"kind": "math", "answer": "5"})  # type: ignore[arg-type]
    with pytest.raises(TaskError, match="'instruction' is 2097152 characters"):
        Task(name="t", family="math", instruction="x" * (2 << 20), checker={"kind": "math", "answer": "5"})


def test_a_refused_import_leaves_the_bank_as_it_was(tmp_path):
    bank = tmp_path / "bank"
    _pkg(tmp_path / "one", "good", GOOD)
    assert _import(bank, "package", tmp_path / "one", "kept") == 0
    before = _stored(bank)
    _pkg(tmp_path / "bad", "b", GOOD.replace("answer: '5'", "answer: '5', timeout_s: .inf"))
    out = io.StringIO()
    assert _import(bank, "package", tmp_path / "bad", "new") == 2
    assert _stored(bank) == before and out.getvalue() == ""
    assert json.dumps([t.name for t in TaskBank(bank).load_set("kept").tasks]) == '["good"]'


def test_an_oversized_task_yaml_is_refused_before_it_is_parsed(tmp_path):
    d = _pkg(tmp_path, "t", GOOD.replace("What is 2+3?", "x" * (9 << 20)))
    with pytest.raises(TaskError, match="larger than 8388608 bytes"):
        load_package(d)


@pytest.mark.parametrize("timeout", ["nan", "inf", "0", "-1", "1e308"])
def test_paddock_check_refuses_a_timeout_that_is_not_finite_and_positive(capsys, timeout):
    with pytest.raises(SystemExit) as e:
        main(["check", "math", "--gold", "5", "--pred", "5", "--timeout", timeout])
    assert e.value.code == 2 and "--timeout: must be > 0" in capsys.readouterr().err


def test_tasks_validate_quarantines_an_unloadable_task_and_validates_the_rest(tmp_path, monkeypatch, capsys):
    import contextlib

    from controller.cli import tasks as cli_tasks
    bank, a, b = _bank_with_an_unloadable_task(tmp_path)
    seen: list = []

    def fake_validate(rt, image, tasks, store, workers, show):
        seen.extend(d["name"] for d in tasks)
        return [cli_tasks.TaskValidation(task_id=d["task_id"], name=d["name"], ok=True) for d in tasks]
    monkeypatch.setattr(cli_tasks, "validate_tasks", fake_validate)
    monkeypatch.setattr(cli_tasks, "SandboxRuntime", contextlib.nullcontext)
    monkeypatch.setattr(cli_tasks, "ensure_builtin_image", lambda images: (None, "img"))
    assert main(["tasks", "--bank", str(bank.root), "validate", "s"]) == 1
    out = capsys.readouterr().out
    assert seen == ["a"] and "QUARANTINED b" in out and "1/2 tasks valid" in out
    quarantine = json.loads((bank.root / "quarantine.json").read_text())
    assert "timeout_s" in quarantine[b.task_id]["reasons"][0]
