"""`paddock agent --budget-default KEY=VALUE`: the run's deadline and no-progress defaults,
checked before the agent starts (a bad pair exits 2 naming it) and handed to every attempt."""
from __future__ import annotations

import subprocess
import sys

import pytest

from controller.cli.agent import run_budgets
from controller.contracts.tasks import BudgetError, Budgets
from nodeagent.agent.daemon import NodeAgent


def test_pairs_become_typed_run_defaults_that_a_task_leaves_at_zero():
    got = run_budgets(["total_s=30", "no_progress_repeats=5", "verify_s=2.5"])
    assert got == {"total_s": 30, "no_progress_repeats": 5, "verify_s": 2.5}
    b = Budgets(total_s=7).with_run_defaults(got)
    assert (b.total_s, b.no_progress_repeats, b.verify_s) == (7, 5, 2.5)   # the task's own value wins


@pytest.mark.parametrize("pairs, named", [
    (["total_s"], "not KEY=VALUE"), (["total_s=soon"], "'soon' is not a number"),
    (["wall_s=5"], "'wall_s' is not one of"), (["total_s=-1"], "'total_s' must be"),
    (["no_progress_repeats=2.5"], "must be an integer"), (["total_s=nan"], "'total_s' must be"),
])
def test_a_bad_pair_is_refused_naming_it(pairs, named):
    with pytest.raises(ValueError, match=named):
        run_budgets(pairs)


def test_the_agent_refuses_a_bad_default_before_it_connects():
    r = subprocess.run([sys.executable, "-m", "controller.cli.main", "agent", "--deployment", "d", "--insecure",
                        "--controller", "tcp://127.0.0.1:9", "--noop-s", "0", "--budget-default", "wall_s=5"],
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 2 and "'wall_s' is not one of" in r.stderr, r.stderr


def test_the_node_agent_keeps_the_checked_defaults_for_its_attempts():
    agent = NodeAgent("n1", "tcp://127.0.0.1:9", "d", 1, insecure=True, runner=lambda a: None,
                      run_budgets={"total_s": 60})
    assert agent.run_budgets == {"total_s": 60}
    with pytest.raises(BudgetError, match="create_s"):
        NodeAgent("n1", "tcp://127.0.0.1:9", "d", 1, insecure=True, runner=lambda a: None,
                  run_budgets={"create_s": -3})
