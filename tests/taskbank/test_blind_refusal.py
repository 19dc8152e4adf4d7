"""Refusal tasks require the look-up (red team s11 §8): a refusal written without looking
anything up passes no built-in conversational task, and `reference_reasons` rejects a task such
a refusal would pass."""
import copy
import dataclasses

import pytest

from controller.contracts.services import compare_state
from controller.taskbank.conversational import conversational_tasks, reference_reasons

TASKS = conversational_tasks()
REFUSALS = ["Sorry, I cannot do that.", "I'm sorry, I can't do that, it cannot be done.",
            "Sorry, this cannot be changed: I cannot add 2 bags and cannot cancel a delivered order."]


def _initial(task):
    return {n: copy.deepcopy(s["initial_state"]) for n, s in task.services.items()}


def _echo(task) -> str:
    """Everything the agent knows without a service call, in one refusal."""
    facts = " ".join(str(v) for v in (task.user.get("hidden") or {}).values())
    return f"Sorry, I cannot do that. {task.user.get('opening', '')} {facts} {task.instruction}"


@pytest.mark.parametrize("task", TASKS, ids=lambda t: t.name)
def test_a_blind_refusal_passes_no_task(task):
    for said in [*REFUSALS, _echo(task)]:
        results = compare_state(task.checker, _initial(task), [said])
        assert not all(ok for _, ok, _ in results), (task.name, said)


@pytest.mark.parametrize("name", ["conversational/retail/refuse-delivered", "conversational/airline/refuse-bags"])
def test_a_refusal_task_that_needs_only_cannot_is_rejected(name):
    task = next(t for t in TASKS if t.name == name)
    assert reference_reasons(task) == []
    weak = dataclasses.replace(task, checker={**task.checker, "told": {"include": ["cannot"]}})
    assert any(r.startswith("hack:blind_refusal") for r in reference_reasons(weak))


# The s11b red team's refusal: no call made, every usual reason named (it passed both refusal tasks).
SHOTGUN = ("Sorry, I cannot do that: it was already delivered (already shipped), and it already has 1 bag, "
           "already has 2 bags, already has 3 bags, the limit is reached.")


@pytest.mark.parametrize("task", TASKS, ids=lambda t: t.name)
def test_a_refusal_naming_every_usual_reason_passes_no_task(task):
    results = compare_state(task.checker, _initial(task), [SHOTGUN])
    assert not all(ok for _, ok, _ in results), task.name


@pytest.mark.parametrize("name", ["conversational/retail/refuse-delivered", "conversational/airline/refuse-bags"])
def test_a_refusal_task_whose_fact_can_be_guessed_by_listing_values_is_rejected(name):
    """Without the excluded sibling values, a refusal that lists every plausible value (the
    required phrase with its numbers run through, the usual status words) meets the goal:
    `reference_reasons` names it."""
    task = next(t for t in TASKS if t.name == name)
    told = {k: v for k, v in task.checker["told"].items() if k != "exclude"}
    guessable = dataclasses.replace(task, checker={**task.checker, "told": told})
    assert any(r.startswith("hack:blind_refusal") for r in reference_reasons(guessable))
