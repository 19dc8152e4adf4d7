"""Mock services as data: the contract's validation, the rule engine, and the per-rollout host
(in a real sandbox: the engine runs there, the state stays on the node, a forged reply is
caught)."""
from __future__ import annotations

import copy
import json

import pytest

from controller.contracts import serviceengine as engine
from controller.contracts.services import (
    OPERATORS,
    STATEMENTS,
    ServiceSpecError,
    compare_state,
    validate_services,
    validate_user,
)
from controller.contracts.tasks import Task, TaskError
from controller.taskbank.conversational import CALENDAR, SHOP, conversational_taskset
from nodeagent.services.host import ServiceHost, ServiceRuleError

COUNTER = {
    "state_schema": {"type": "object", "required": ["n"], "properties": {"n": {"type": "integer", "maximum": 2}}},
    "initial_state": {"n": 0},
    "operations": {"bump": {"parameters": {"type": "object", "properties": {"by": {"type": "integer"}},
                                           "required": ["by"], "additionalProperties": False},
                            "steps": [{"set": [["n"], {"add": [{"get": ["n"]}, {"arg": "by"}]}]},
                                      {"return": {"get": ["n"]}}]}},
}


def test_the_engine_implements_exactly_the_contracts_operators_and_statements():
    implemented = {name[3:] for name in dir(engine._Run) if name.startswith("op_")}
    assert implemented == set(OPERATORS)
    run = engine._Run({}, {})
    for stmt in STATEMENTS:   # every statement is understood (an unknown one raises RuleError)
        step = {"require": True} if stmt == "require" else {"let": {}} if stmt == "let" else \
            {stmt: [["x"], 1]} if stmt in ("set", "append") else {"delete": ["x"]} if stmt == "delete" else {stmt: 1}
        try:
            run.run([step])
        except engine.Refused:
            pass


def test_an_operation_changes_a_copy_and_a_refusal_changes_nothing():
    state = copy.deepcopy(SHOP["initial_state"])
    out = engine.apply(SHOP, state, "cancel_order", {"order_id": "W1001", "reason": "no longer needed"})
    assert out["ok"] and out["state"]["orders"]["W1001"]["status"] == "cancelled"
    assert state["orders"]["W1001"]["status"] == "pending"
    again = engine.apply(SHOP, out["state"], "cancel_order", {"order_id": "W1001", "reason": "no longer needed"})
    assert again == {"ok": False, "error": "only pending orders can be cancelled"}
    assert engine.apply(SHOP, state, "get_order", {"order_id": "nope"}) == {"ok": False, "error": "no such order"}


def test_created_ids_come_from_the_rules():
    out = engine.apply(CALENDAR, CALENDAR["initial_state"], "create_event",
                       {"title": "x", "date": "2026-01-01", "start": "09:00", "end": "10:00", "attendees": []})
    assert out["result"] == {"event_id": "E3"} and "E3" in out["state"]["events"]


@pytest.mark.parametrize("services, match", [
    ({"s": {**COUNTER, "operations": {"shell": COUNTER["operations"]["bump"]}}}, "built-in tool"),
    ({"s": {**COUNTER, "initial_state": {"n": "zero"}}}, r"initial_state.n does not match"),
    ({"s": {**COUNTER, "operations": {"bump": {**COUNTER["operations"]["bump"], "steps": [{"sett": 1}]}}}},
     r"steps\[0\]: a step must have exactly one of"),
    ({"s": {**COUNTER, "operations": {"bump": {**COUNTER["operations"]["bump"],
                                                "steps": [{"return": {"exec": "rm -rf /"}}]}}}}, "unknown operator 'exec'"),
    ({"s": {**COUNTER, "state_schema": {"type": "nonsense"}}}, "state_schema is not a valid JSON Schema"),
    ({"a": COUNTER, "b": COUNTER}, "also used by service 'a'"),
    ({"s": {**COUNTER, "extra": 1}}, "Additional properties"),
])
def test_a_malformed_service_is_refused_naming_the_field(services, match):
    with pytest.raises(ServiceSpecError, match=match):
        validate_services(services)


def test_a_task_with_a_malformed_service_or_user_is_refused_at_load():
    with pytest.raises(TaskError, match="services.s.initial_state"):
        Task(name="c/x", family="conversational", instruction="i", checker={"kind": "state", "goal": {"s": {}}},
             services={"s": {**COUNTER, "initial_state": {}}})
    with pytest.raises(ServiceSpecError, match=r"replies\[0\].say names \['zip'\]"):
        validate_user({"instruction": "x", "opening": "hi", "replies": [{"when": "zip", "say": "{zip}"}]})
    with pytest.raises(TaskError, match="checker kind 'state' needs 'services'"):
        Task(name="c/x", family="conversational", instruction="i", checker={"kind": "state", "goal": {"s": {}}})


def test_the_host_validates_arguments_and_keeps_the_schema_invariant():
    host = ServiceHost({"c": COUNTER})
    assert host.call("bump", '{"by": "two"}').error == "invalid_arguments"
    assert host.call("bump", "{not json").error == "malformed_json"
    assert host.call("nope", "{}").error == "unknown_tool"
    assert host.call("bump", '{"by": 2}').observation == "2"
    refused = host.call("bump", '{"by": 1}')                        # n = 3 breaks maximum: 2
    assert refused.error == "refused" and "invalid state" in refused.observation
    assert host.final_state() == {"c": {"n": 2}}
    assert [e["ok"] for e in host.log] == [True, False]


def test_a_rule_the_engine_cannot_evaluate_is_the_tasks_fault():
    bad = {**COUNTER, "operations": {"bump": {**COUNTER["operations"]["bump"], "steps": [{"return": {"var": "x"}}]}}}
    with pytest.raises(ServiceRuleError, match="variable 'x' is not bound"):
        ServiceHost({"c": bad}).call("bump", '{"by": 1}')


def test_compare_state_by_fields_and_by_what_was_told():
    spec = {"goal": {"c": {"n": 2, "note": "x"}}, "match": "fields", "fields": ["/c/n"],
            "told": {"include": ["Done"], "exclude": ["sorry"]}}
    results = compare_state(spec, {"c": {"n": 2, "note": "other"}}, ["all DONE"])
    assert [ok for _, ok, _ in results] == [True, True, True]
    results = compare_state({**spec, "match": "exact"}, {"c": {"n": 2}}, ["sorry, done"])
    assert [ok for _, ok, _ in results] == [False, True, False]
    assert "/c/note" in results[0][2]


def test_every_built_in_task_goal_is_the_reference_replayed():
    from controller.taskbank.conversational import reference_reasons
    for task in conversational_taskset().tasks:
        assert reference_reasons(task) == [], task.name


# -- in a real sandbox --------------------------------------------------------------------------

@pytest.fixture
def sandbox(runtime, python_image):
    from nodeagent.sandbox.runtime import SandboxSpec
    sb = runtime.create(SandboxSpec(image=python_image))
    yield sb
    sb.destroy()


@pytest.mark.sandbox
def test_operations_run_in_the_sandbox_and_the_state_stays_outside(sandbox):
    host = ServiceHost({"c": COUNTER}, sandbox)
    assert host.call("bump", '{"by": 1}').observation == "1"
    assert host.sandbox_ops == 1 and host.tampered == []
    listing = sandbox.exec(["sh", "-c", "ls -ln /srv/paddock-service; echo x > /srv/paddock-service/c.json"])
    assert b"engine.py" in listing.stdout and listing.exit_code != 0       # readable, not the agent's to change
    assert b"state" not in listing.stdout                                   # no state file


@pytest.mark.sandbox
def test_a_forged_reply_from_a_shadowed_interpreter_is_refused_as_tampering(sandbox):
    host = ServiceHost({"c": COUNTER}, sandbox)
    forged = json.dumps({"ok": True, "result": 99, "state": {"n": 99}})
    # as if the agent had found a way to put its own python3 first on the service's PATH
    sandbox.write_files({"/usr/local/bin/python3": f"#!/bin/sh\ncat >/dev/null\nprintf '%s' '{forged}'\n"},
                        owner="system", mode=0o755)
    out = host.call("bump", '{"by": 1}')
    assert out.error == "service_unavailable" and "nothing changed" in out.observation
    assert host.final_state() == {"c": {"n": 0}} and host.tampered and "differs" in host.tampered[0]


@pytest.mark.sandbox
def test_an_engine_that_cannot_run_is_infrastructure_never_a_score(sandbox):
    from nodeagent.sandbox.runtime import SandboxError
    host = ServiceHost({"c": COUNTER}, sandbox)
    sandbox.write_files({"/usr/local/bin/python3": "#!/bin/sh\nexit 3\n"}, owner="system", mode=0o755)
    with pytest.raises(SandboxError, match=r"engine failed in the sandbox \(exit 3"):
        host.call("bump", '{"by": 1}')
    assert host.final_state() == {"c": {"n": 0}} and host.tampered == []


@pytest.mark.sandbox
def test_a_state_larger_than_stdin_goes_through_a_file_the_agent_cannot_change(sandbox):
    big = {**COUNTER, "state_schema": {"type": "object"},
           "initial_state": {"n": 0, "blob": ["x" * 100] * 1000}}            # ~100 KB of state
    host = ServiceHost({"c": big}, sandbox)
    assert host.call("bump", '{"by": 1}').observation == "1" and host.tampered == []
    r = sandbox.exec(["sh", "-c", "echo {} > /srv/paddock-service/c.state.json"])
    assert r.exit_code != 0 and host.call("bump", '{"by": 1}').observation == "2"


@pytest.mark.sandbox
def test_the_agents_sandbox_holds_neither_the_goal_nor_the_reference(sandbox):
    task = conversational_taskset().by_name()["conversational/assistant/schedule"]
    ServiceHost(task.services, sandbox).install()
    marker = "Booked: budget review"          # in the goal (a reference call's argument) only
    assert marker in json.dumps(task.checker["goal"]) and marker not in json.dumps(task.services)
    r = sandbox.exec(["sh", "-c", f"grep -rlsF '{marker}' / --exclude-dir=proc --exclude-dir=sys; true"],
                     timeout_s=60)
    assert r.stdout == b""
