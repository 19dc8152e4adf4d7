"""What the agent's output and tool calls contain is the agent's responsibility: one rollout
attempt (`run_attempt`, what a node agent's slot runs) on real sandboxes, driven by a scripted
tool-calling model server (outside Paddock), never ends `infra_error` (masked, retried, never
scored) or crashes because of it.

- /work holding what its diff cannot carry (content past 8 MiB, a tree deeper than
  `DIFF_MAX_DEPTH`) is the rollout's `fail`, reward 0, with a `diff` check naming the path and the
  limit; what it can carry (names and symlink targets that are not UTF-8) is graded.
- A tool call whose arguments the sandbox cannot carry (a NUL, a lone surrogate, a command line
  past Linux's MAX_ARG_STRLEN) is answered to the model as an error and the conversation goes on.
- A solution that stretches grading (it stalls pytest's start until just under the checker's
  time limit) is graded once, compared with the baseline, and is `fail`: never a verify-phase
  deadline (an infrastructure error that is also charged to the task).
An honest rollout, with a little more than source in /work, still passes."""
from __future__ import annotations

import json
import time

import pyarrow.parquet as pq
import pytest

from controller.contracts.checkerspec import CheckerSpec
from controller.taskbank.builtin import builtin_taskset
from nodeagent.agent.attempt import Attempt, run_attempt
from nodeagent.sandbox import sbxinit
from nodeagent.verifier import grade
from tests.conftest import FakeModel, reply
from tests.verifier.test_infra_escapes import pkg_task

pytestmark = pytest.mark.sandbox


def shell(command: str) -> tuple[str, str]:
    return "shell", json.dumps({"command": command, "timeout_s": 60})


def python_task(**budgets) -> dict:
    t = next(t for t in builtin_taskset().tasks if t.family == "python")
    d = {**t.canonical(), "task_id": t.task_id}
    d["budgets"] = {**d["budgets"], **budgets}
    return d


def run(runtime, image, tmp_path, task: dict, calls: list[tuple[str, str]]):
    pol = FakeModel([reply(calls=[c], usage=(5, 5)) for c in calls] + [reply("done", usage=(5, 5))])
    try:
        res = run_attempt(runtime, image, "n1", Attempt("run", str(tmp_path), "r1", 1, 1, "b", 0, task, 0, pol.url, "m"))
    finally:
        pol.close()
    return res, pol


def checks_of(tmp_path, res) -> list[dict]:
    return pq.read_table(tmp_path / res.shards["checks"]).to_pylist()


# -- the diff of /work ----------------------------------------------------------------------------

def test_content_past_the_diff_cap_is_the_rollouts_fail_naming_the_file(runtime, python_image, tmp_path):
    res, _ = run(runtime, python_image, tmp_path, python_task(),
                 [shell("head -c 9437184 /dev/zero > /work/scratch.bin")])
    assert (res.outcome, res.reward, res.infra_reason) == ("fail", 0.0, None)
    (diff,) = [c for c in checks_of(tmp_path, res) if c["check"] == "diff"]
    assert diff["verdict"] == "fail" and "/work/scratch.bin" in diff["detail"] and "8388608" in diff["detail"]
    assert runtime.active_sandboxes() == 0


def test_a_tree_deeper_than_the_diff_carries_is_the_rollouts_fail(runtime, python_image, tmp_path):
    res, _ = run(runtime, python_image, tmp_path, python_task(),
                 [shell("cd /work && python3 -c 'import os\nfor i in range(1100):\n    os.mkdir(\"d\"); os.chdir(\"d\")'")])
    assert (res.outcome, res.reward, res.infra_reason) == ("fail", 0.0, None)
    (diff,) = [c for c in checks_of(tmp_path, res) if c["check"] == "diff"]
    assert f"more than {sbxinit.DIFF_MAX_DEPTH} levels" in diff["detail"]


def test_names_and_symlink_targets_that_are_not_utf8_are_graded(runtime, python_image, tmp_path):
    res, _ = run(runtime, python_image, tmp_path, python_task(),
                 [shell("python3 -c \"import os; os.symlink(b'/tmp/\\xff', b'/work/cache'); "
                        "open(b'/work/caf\\xe9.txt', 'w').write('x')\"")])
    assert (res.outcome, res.reward, res.infra_reason) == ("fail", 0.0, None)    # the stub, graded
    assert "diff" not in {c["check"] for c in checks_of(tmp_path, res)}


@pytest.mark.parametrize("loop", [
    "while :; do mkdir -p /work/r/a/b/c && echo x > /work/r/a/b/c/f; rm -rf /work/r; done",   # entries vanish
    "while :; do head -c 100000 /dev/zero >> /work/grow.bin; done",                          # a file grows
], ids=["vanishing", "growing"])
def test_a_process_left_changing_work_while_it_is_diffed_is_the_rollouts_doing(runtime, python_image, tmp_path,
                                                                               loop):
    res, _ = run(runtime, python_image, tmp_path, python_task(),
                 [shell(f"nohup sh -c '{loop}' >/dev/null 2>&1 & sleep 0.3; echo started")])
    assert (res.outcome, res.reward, res.infra_reason) == ("fail", 0.0, None)


def test_an_honest_solution_with_more_than_source_in_work_still_passes(runtime, python_image, tmp_path):
    task = python_task()
    sol = next(rel for rel in task["files"] if rel.endswith(".py") and not rel.startswith("test"))
    res, _ = run(runtime, python_image, tmp_path, task,
                 [("write_file", json.dumps({"path": sol, "content": task["hidden"]["reference.py"]})),
                  shell("head -c 3000000 /dev/urandom > /work/data.bin && mkdir -p /work/build/a/b/c/d/e/f "
                        "&& ln -s /tmp /work/build/tmp && python3 -c \"open(b'/work/build/\\xff', 'w')\""),
                  # what running a large suite leaves: bytecode past the diff's 8 MiB (never graded)
                  shell("mkdir -p /work/__pycache__ && head -c 9437184 /dev/urandom > /work/__pycache__/big.cpython-311.pyc")])
    assert (res.outcome, res.reward, res.infra_reason) == ("pass", 1.0, None)


# -- tool-call arguments -------------------------------------------------------------------------

@pytest.mark.parametrize("call, names", [
    (("shell", '{"command": "echo a\\u0000b > /work/notes.txt"}'), ["at command", "NUL"]),
    (("shell", '{"command": "echo \\ud800 > /work/notes.txt"}'), ["at command", "lone surrogate", "U+D800"]),
    (("write_file", '{"path": "notes.txt", "content": "x\\udfffy"}'), ["at content", "lone surrogate"]),
    (("read_file", '{"path": "/work/a\\u0000b"}'), ["at path", "NUL"]),
    (("search", '{"pattern": "\\ud83d"}'), ["at pattern", "lone surrogate"]),
    (shell("echo " + "y" * 200_000), ["at command", "131071 bytes"]),
    (("shell", '{"command": "ls", "timeout_s": NaN}'), ["at timeout_s", "not a finite number"]),
], ids=["nul-shell", "surrogate-shell", "surrogate-content", "nul-path", "surrogate-pattern", "argv-200KB", "nan"])
def test_arguments_the_sandbox_cannot_carry_are_a_tool_error_and_the_rollout_goes_on(
        runtime, python_image, tmp_path, call, names):
    res, pol = run(runtime, python_image, tmp_path, python_task(), [call, shell("echo still-here")])
    assert (res.outcome, res.reward, res.infra_reason) == ("fail", 0.0, None)    # graded: the stub
    first, second = pol.tool_replies()
    assert first.startswith("error: invalid arguments for") and all(n in first for n in names), first
    assert "still-here" in second                       # the conversation went on
    assert len(pol.requests) == 3


def test_an_edit_of_a_file_past_the_init_reply_is_a_tool_error_not_a_dead_sandbox(runtime, python_image, tmp_path):
    """`edit` reads the whole file: a 40 MB one filled the sandbox init's 32 MiB reply, which
    read as a dead init (`sandbox: ... init is gone`, an infrastructure error)."""
    res, pol = run(runtime, python_image, tmp_path, python_task(),
                   [shell("head -c 40000000 /dev/zero | tr '\\0' a > /work/big.txt"),
                    ("edit", json.dumps({"path": "big.txt", "old": "zzz", "new": "y"})), shell("echo still-here")])
    assert (res.outcome, res.reward, res.infra_reason) == ("fail", 0.0, None)
    _, edit, last = pol.tool_replies()
    assert edit.startswith("error: /work/big.txt is larger than") and "still-here" in last


# -- the verify phase ----------------------------------------------------------------------------

def test_a_solution_that_stalls_grading_is_graded_fail_not_a_verify_deadline(runtime, python_image, tmp_path):
    """The package stalls the task's conftest for just under the checker's limit, then exits:
    pytest "did not start". Before, that was retried (twice the time) and the verify phase's
    deadline fired: `deadline: verify:`, an infrastructure error charged to the task. The
    baseline is known (validation seeds it), so the stall costs one grading."""
    task = dict(pkg_task(conftest=True), task_id="agentfault-stall", budgets={"verify_s": 14.0})
    task["checker"] = dict(task["checker"], timeout_s=10.0)
    grade.BASELINE.seed(grade.graded_task(task), python_image, {"reference": "pass", "null": "fail"})
    stall = "import os, time\ntime.sleep(8)\nos._exit(0)\n"
    t0 = time.monotonic()
    res, _ = run(runtime, python_image, tmp_path, task,
                 [("write_file", json.dumps({"path": "pkg/__init__.py", "content": stall}))])
    assert (res.outcome, res.reward, res.infra_reason) == ("fail", 0.0, None), time.monotonic() - t0
    checks = checks_of(tmp_path, res)
    assert [c["verdict"] for c in checks if c["verdict"] == "infra_error"] == ["infra_error"]   # no retry
    assert "grades cleanly without them" in checks[-1]["detail"]


def test_the_default_verify_deadline_covers_what_a_long_checker_may_take():
    """A checker that may run 900 s (terminal-bench verifiers do) gets more than the 1800 s default:
    its grading, the baseline's and the retries."""
    assert grade.verify_time_s(CheckerSpec(kind="pytest", timeout_s=900)) >= 6 * 900
    assert grade.verify_time_s(CheckerSpec(kind="math")) >= 6 * grade.ANSWER_TIMEOUT_S
