"""Importers of public tool-use formats: τ²-bench / τ-bench domains (records in their shape,
the domain's tools written as Paddock services) and Harbor task directories; round trip
through the task bank."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from controller.taskbank.bank import load_package, write_package
from controller.taskbank.importers import KINDS, import_source
from controller.taskbank.swe import ImportSourceError

# A small airline domain in τ²-bench's shape: users and reservations, a read and a cancel tool.
SERVICES = {"airline": {
    "state_schema": {"type": "object"},
    "initial_state": "@db.json",
    "operations": {
        "get_reservation_details": {
            "parameters": {"type": "object", "properties": {"reservation_id": {"type": "string"}},
                           "required": ["reservation_id"]},
            "steps": [{"require": {"exists": ["reservations", {"arg": "reservation_id"}]}, "error": "not found"},
                      {"return": {"get": ["reservations", {"arg": "reservation_id"}]}}]},
        "cancel_reservation": {
            "parameters": {"type": "object", "properties": {"reservation_id": {"type": "string"}},
                           "required": ["reservation_id"]},
            "steps": [{"require": {"exists": ["reservations", {"arg": "reservation_id"}]}, "error": "not found"},
                      {"set": [["reservations", {"arg": "reservation_id"}, "status"], "cancelled"]}]}}}}
DB = {"users": {"emma_kim_9957": {"name": "Emma Kim"}},
      "reservations": {"EHGLP3": {"user_id": "emma_kim_9957", "status": "active"},
                       "Q69X3R": {"user_id": "raj_sanchez_7340", "status": "active"}}}
TAU2 = [
    {"id": "0", "description": {"purpose": "refuse"}, "user_scenario": {"persona": None, "instructions": {
        "task_instructions": "You don't want to cancel if you don't get a refund.", "domain": "airline",
        "reason_for_call": "You want to cancel reservation EHGLP3.",
        "known_info": "You are Emma Kim.\nYour user id is emma_kim_9957.", "unknown_info": None}},
     "initial_state": None, "evaluation_criteria": {"actions": [], "communicate_info": [],
                                                    "nl_assertions": ["Agent should refuse."],
                                                    "reward_basis": ["DB", "COMMUNICATE"]}},
    {"id": "7", "user_scenario": {"persona": "Polite.", "instructions": {
        "reason_for_call": "Cancel Q69X3R.", "known_info": "Your user id is raj_sanchez_7340."}},
     "evaluation_criteria": {"actions": [
         {"action_id": "7_0", "name": "get_reservation_details", "arguments": {"reservation_id": "Q69X3R"}},
         {"action_id": "7_1", "name": "cancel_reservation", "arguments": {"reservation_id": "Q69X3R"}}],
         "communicate_info": ["cancelled"]}},
]


@pytest.fixture
def domain(tmp_path):
    d = tmp_path / "airline"
    d.mkdir()
    (d / "tasks.json").write_text(json.dumps(TAU2))
    (d / "services.json").write_text(json.dumps(SERVICES))
    (d / "db.json").write_text(json.dumps(DB))
    (d / "policy.md").write_text("# Airline policy\nCancel only with a refund rule.")
    return d


def test_the_cli_knows_the_new_kinds():
    assert {"tau", "harbor"} <= set(KINDS)


def test_tau2_tasks_become_conversational_tasks_graded_by_replayed_state(domain):
    refuse, cancel = import_source("tau", domain)
    assert refuse.name == "tau/airline/0" and refuse.family == "conversational"
    assert refuse.checker["goal"]["airline"] == DB                       # no action: the state must not change
    assert cancel.checker["goal"]["airline"]["reservations"]["Q69X3R"]["status"] == "cancelled"
    assert cancel.checker["told"] == {"include": ["cancelled"]}
    assert refuse.user["kind"] == "model" and "cancel reservation EHGLP3" in refuse.user["instruction"]
    assert refuse.user["hidden"]["known_info"].startswith("You are Emma Kim")
    assert refuse.instruction.startswith("# Airline policy")
    assert json.loads(refuse.hidden["reference.json"])["nl_assertions"] == ["Agent should refuse."]


def test_tau_v1_records_are_read_too(domain):
    (domain / "tasks.json").write_text(json.dumps([{"user_id": "emma_kim_9957", "instruction": "Cancel EHGLP3.",
                                                    "actions": [{"name": "cancel_reservation",
                                                                 "kwargs": {"reservation_id": "EHGLP3"}}],
                                                    "outputs": []}]))
    task, = import_source("tau", domain)
    assert task.checker["goal"]["airline"]["reservations"]["EHGLP3"]["status"] == "cancelled"
    assert task.user["hidden"] == {"user_id": "emma_kim_9957"}


@pytest.mark.parametrize("edit, match", [
    (lambda d: (d / "services.json").unlink(), "no services.json"),
    (lambda d: (d / "tasks.json").write_text(json.dumps([{**TAU2[1], "evaluation_criteria": {"actions": [
        {"name": "book_flight", "arguments": {}}]}}])), r"task '7': actions \['book_flight'\] are not operations"),
    (lambda d: (d / "tasks.json").write_text(json.dumps([{**TAU2[1], "evaluation_criteria": {"actions": [
        {"name": "cancel_reservation", "arguments": {"reservation_id": "NOPE"}}]}}])), "is refused: not found"),
    (lambda d: (d / "tasks.json").write_text("{oops"), "cannot read a JSON list"),
    (lambda d: (d / "db.json").unlink(), r"initial_state: cannot read .*db.json"),
    # the bounded loaders: a key twice (the last would win silently), a bomb, nesting past the bound
    (lambda d: (d / "services.json").write_text('{"airline": {}, "airline": {}}'), "duplicate key 'airline'"),
    (lambda d: (d / "tasks.json").write_text('[{"id": "0", "id": "1"}]'), "duplicate key 'id'"),
    (lambda d: (d / "db.json").write_text('{"a": 1, "a": 2}'), "initial_state: .*duplicate key 'a'"),
    (lambda d: ((d / "services.json").unlink(), (d / "services.yaml").write_text(
        "a: &a [x, x, x, x, x, x, x, x, x]\nb: &b [*a, *a, *a, *a, *a, *a, *a, *a, *a]\n"
        "c: &c [*b, *b, *b, *b, *b, *b, *b, *b, *b]\nd: &d [*c, *c, *c, *c, *c, *c, *c, *c, *c]\n"
        "e: &e [*d, *d, *d, *d, *d, *d, *d, *d, *d]\nf: &f [*e, *e, *e, *e, *e, *e, *e, *e, *e]\n"
        "g: &g [*f, *f, *f, *f, *f, *f, *f, *f, *f]\nh: [*g, *g, *g, *g, *g, *g, *g, *g, *g]\n")),
     "services.yaml.*(alias|nodes)"),
    (lambda d: (d / "tasks.json").write_text("[" * 200 + "]" * 200), "cannot read a JSON list.*(deep|depth|nest)"),
])
def test_a_bad_domain_or_record_is_an_error_naming_it(domain, edit, match):
    edit(domain)
    with pytest.raises(ImportSourceError, match=match):
        import_source("tau", domain)


def test_an_imported_conversational_task_round_trips_through_the_bank(domain, tmp_path):
    task = import_source("tau", domain)[1]
    back = load_package(write_package(task, tmp_path / "pkg"))
    assert back.task_id == task.task_id and back.services == task.services and back.user == task.user


def harbor_dir(root: Path, name: str = "make-greeting", **env) -> Path:
    d = root / name
    (d / "tests").mkdir(parents=True)
    (d / "solution").mkdir()
    (d / "environment").mkdir()
    env_lines = "".join(f"{k} = {json.dumps(v)}\n" for k, v in env.items())
    (d / "task.toml").write_text('version = "1.0"\n[metadata]\ndifficulty = "easy"\n[verifier]\ntimeout_sec = 30.0\n'
                                 f'[agent]\ntimeout_sec = 300.0\n[environment]\ncpus = 1\nmemory_mb = 512\n{env_lines}')
    (d / "instruction.md").write_text("Write `hello` into /app/greeting.txt.")
    (d / "tests" / "test.sh").write_text('#!/bin/bash\nif grep -qx hello /app/greeting.txt; then echo 1 > '
                                         '/logs/verifier/reward.txt; else echo 0 > /logs/verifier/reward.txt; fi\n')
    (d / "tests" / "test_outputs.py").write_text("def test_x():\n    assert open('/app/greeting.txt').read()\n")
    (d / "solution" / "solve.sh").write_text("echo hello > /app/greeting.txt\n")
    (d / "environment" / "Dockerfile").write_text("FROM ubuntu:24.04\nWORKDIR /app\n")
    return d


def test_a_harbor_task_directory_becomes_a_command_checked_task(tmp_path):
    task, = import_source("harbor", harbor_dir(tmp_path))
    assert task.name == "harbor/make-greeting" and task.instruction == "Write `hello` into /work/greeting.txt."
    assert task.checker["kind"] == "command" and task.checker["timeout_s"] == 30.0
    assert sorted(task.checker["support"]) == ["paddock_harbor_runner.py", "paddock_site/paddock_pytest_guard.py",
                                               "paddock_site/sitecustomize.py", "tests/pytest.ini", "tests/test.sh",
                                               "tests/test_outputs.py"]
    assert "/work/greeting.txt" in task.hidden["tests/test.sh"] and "/tmp/logs/verifier/reward.txt" in task.hidden["tests/test.sh"]
    assert task.hidden["solution/solve.sh"] and task.hidden["environment/Dockerfile"].startswith("FROM")
    assert (task.budgets.wall_s, task.limits.memory_mb) == (300.0, 512)


def test_a_directory_of_harbor_tasks_is_read_and_internet_is_refused(tmp_path):
    harbor_dir(tmp_path, "a")
    harbor_dir(tmp_path, "b")
    assert [t.name for t in import_source("harbor", tmp_path)] == ["harbor/a", "harbor/b"]
    with pytest.raises(ImportSourceError, match="allow_internet"):
        import_source("harbor", harbor_dir(tmp_path / "x", "net", allow_internet=True))
    with pytest.raises(ImportSourceError, match="neither a Harbor task directory"):
        import_source("harbor", tmp_path / "x" / "net" / "tests")
