"""Checkers and the isolated check runner: real processes, real deadlines, a real HTTP judge."""
from __future__ import annotations

import os

import pytest

from controller.contracts.checkerspec import SpecError, validate_spec
from nodeagent.verifier import checkers
from nodeagent.verifier.checks import CheckInfraError, CheckRunner
from tests.conftest import FakeChatServer, alive, wait_for


@pytest.fixture(scope="module")
def runner():
    with CheckRunner(preload=("nodeagent.verifier.checkers",)) as r:
        yield r



# -- the runner -------------------------------------------------------------------------------

def test_function_check_returns_its_value(runner):
    r = runner.run("nodeagent.verifier.checkers:exact_match", ["42", " 42 "])
    assert (r.outcome, r.value) == ("ok", True)


def test_a_check_that_raises_is_an_error_with_the_reason(runner):
    r = runner.run("math:sqrt", [-1])
    assert r.outcome == "error" and "math domain error" in r.detail


def test_a_check_that_dies_by_signal_is_crashed(runner):
    r = runner.run("os:abort")
    assert r.outcome == "crashed"


def test_a_hanging_check_is_killed_and_does_not_hold_up_the_others(runner):
    hang = runner.submit("time:sleep", [3600], timeout_s=4.0)
    quick = [runner.submit("nodeagent.verifier.checkers:exact_match", ["a", "a"]) for _ in range(20)]
    assert all(f.result(timeout=10).value is True for f in quick)
    assert not hang.done()          # the others finished while the hang was still running
    r = hang.result(timeout=10)
    assert r.outcome == "timeout" and r.wall_s < 8


def test_the_whole_process_group_dies_at_the_deadline(runner, tmp_path):
    pidfile = tmp_path / "pid"
    r = runner.run(argv=["sh", "-c", f"sleep 3600 & echo $! > {pidfile}; wait"], timeout_s=2)
    assert r.outcome == "timeout"
    wait_for(lambda: not alive(int(pidfile.read_text())), 10.0, "the check\'s process gone")


def test_a_process_that_escapes_its_group_is_swept(runner, tmp_path):
    pidfile = tmp_path / "pid"
    r = runner.run(argv=["sh", "-c", f"setsid sleep 3600 & echo $! > {pidfile}"], timeout_s=5)
    assert (r.outcome, r.exit_code) == ("ok", 0)
    wait_for(lambda: pidfile.exists() and pidfile.read_text().strip(), 10.0, "the check\'s pid file")
    wait_for(lambda: not alive(int(pidfile.read_text())), 10.0, "the check\'s process gone")


def test_unbounded_allocation_hits_the_address_space_limit(runner):
    r = runner.run("builtins:bytearray", [1 << 40], limits={"memory_mb": 64})
    assert r.outcome == "error" and "MemoryError" in r.detail


def test_an_output_flood_is_cut_at_the_cap(runner):
    r = runner.run(argv=["yes"], output_cap=4096, timeout_s=10)
    assert r.outcome == "output_cap" and r.wall_s < 5


def test_a_command_check_gives_exit_code_and_output(runner):
    r = runner.run(argv=["sh", "-c", "cat; echo out; exit 3"], stdin=b"in\n")
    assert (r.outcome, r.exit_code, r.stdout) == ("ok", 3, b"in\nout\n")


def test_a_dead_server_fails_pending_checks_as_infrastructure():
    with CheckRunner(preload=()) as r:
        fut = r.submit("time:sleep", [3600], timeout_s=60)
        os.kill(r.server_pid, 9)
        with pytest.raises(CheckInfraError):
            fut.result(timeout=10)


# -- answers ----------------------------------------------------------------------------------

@pytest.mark.parametrize("text,want", [
    ("so \\boxed{\\frac{1}{2}} done", "\\frac{1}{2}"),
    ("nested \\boxed{x^{2}+1}", "x^{2}+1"),
    ("The answer is: 42.", "42"),
    ("first 3 then 7", "7"),
    ("no numbers here", None),
])
def test_extract_answer(text, want):
    assert checkers.extract_answer(text) == want


@pytest.mark.parametrize("gold,pred", [
    ("1/2", "\\boxed{0.5}"), ("3/8", "\\boxed{\\frac{3}{8}}"), ("2\\sqrt{2}", "\\boxed{\\sqrt{8}}"),
    ("1+\\sqrt{2}", "\\boxed{\\sqrt{2}+1}"), ("5050", "answer: 5,050"), ("720", "\\boxed{720^\\circ}"),
    ("6", "x = 6, so \\boxed{x=6}"),
])
def test_equivalent_math_answers_match(gold, pred):
    assert checkers.math_equal(gold, pred)


@pytest.mark.parametrize("gold,pred", [("5050", "\\boxed{5051}"), ("3/8", "\\boxed{3/7}"),
                                       ("2\\sqrt{2}", "\\boxed{2\\sqrt{3}}"), ("6", "passed")])
def test_different_math_answers_do_not_match(gold, pred):
    assert not checkers.math_equal(gold, pred)


def test_an_answer_that_is_code_is_never_run(tmp_path):
    """The math checker parses answers, it never evaluates them as Python."""
    marker = tmp_path / "ran"
    code = f"__import__('os').system('touch {marker}')"
    for text in (code, f"\\boxed{{{code}}}", f"answer: {code}", f"${code}$"):
        assert not checkers.math_equal("0", text)
    assert not marker.exists()


def test_unparseable_answer_is_a_fail_with_the_reason():
    v = checkers.answer_verdict("math", "5", "I cannot say")
    assert v == {"ok": False, "detail": "unparseable answer: no \\boxed{}, 'answer:' or number found"}
    assert checkers.answer_verdict("math", "5", None)["detail"] == "no answer given"


def test_exact_and_regex():
    assert checkers.answer_verdict("exact", "Paris", " Paris\n")["ok"]
    assert not checkers.answer_verdict("exact", "Paris", "paris")["ok"]
    assert checkers.answer_verdict("regex", r"[A-Z]{3}-\d+", "ABC-12")["ok"]
    assert not checkers.answer_verdict("regex", r"[A-Z]{3}-\d+", "ABC-12 and more")["ok"]


def paddock(argv: list[str]) -> int:
    """`paddock` with only the verifier's subcommands registered (the full parser imports everything)."""
    import argparse

    from controller.cli import verify as verify_cli
    ap = argparse.ArgumentParser(prog="paddock")
    verify_cli.register(ap.add_subparsers(dest="command", required=True))
    args = ap.parse_args(argv)
    return args.func(args)


def test_check_math_command_prints_true_or_false(capsys):
    main = paddock
    assert main(["check", "math", "--gold", "1/2", "--pred", "\\boxed{0.5}"]) == 0
    assert capsys.readouterr().out.strip() == "true"
    assert main(["check", "math", "--gold", "1/2", "--pred", "\\boxed{0.6}"]) == 1
    assert capsys.readouterr().out.strip() == "false"


# -- specs ------------------------------------------------------------------------------------

@pytest.mark.parametrize("spec,message", [
    (None, "task has no checker"),
    ({}, "task has no checker"),
    ({"kind": "magic"}, "checker.kind must be one of"),
    ({"kind": "math", "answer": "1", "tolerance": 0.1}, "unknown field(s) ['tolerance']"),
    ({"kind": "math"}, "'answer' is a required property"),
    ({"kind": "pytest", "tests": []}, "checker.tests"),
    ({"kind": "regex", "answer": "("}, "not a valid regular expression"),
    ({"kind": "math", "answer": "1", "judge": {"endpoint": "ftp://x", "model": "m", "rubric": "r"}},
     "checker.judge.endpoint"),
])
def test_bad_checker_specs_are_rejected_naming_the_field(spec, message):
    with pytest.raises(SpecError, match=None) as exc:
        validate_spec(spec)
    assert message in str(exc.value)


def test_pytest_spec_must_name_files_the_task_has():
    task = {"files": {"test_a.py": ""}, "hidden": {}}
    with pytest.raises(SpecError, match="missing from the task"):
        validate_spec({"kind": "pytest", "tests": ["test_a.py", "test_b.py"]}, task)


# -- the judge hook against a local fake OpenAI server ------------------------------------------

class FakeJudge(FakeChatServer):
    def __init__(self, reply: str):
        self.reply = reply
        super().__init__(lambda req: (200, self.reply), model="judge")


def test_judge_score_is_parsed_from_the_reply():
    fake = FakeJudge("Clear and correct.\nSCORE: 0.75")
    try:
        score, _ = checkers.judge_score({"endpoint": fake.url, "model": "judge", "rubric": "be clear"},
                                        "say hi", "hi", "")
    finally:
        fake.close()
    assert score == 0.75
    assert "be clear" in fake.requests[0]["messages"][0]["content"]


def test_judge_without_a_score_is_an_infrastructure_error():
    fake = FakeJudge("I like it")
    try:
        with pytest.raises(checkers.JudgeError, match="no 'SCORE: x' line"):
            checkers.judge_score({"endpoint": fake.url, "model": "judge", "rubric": "r"}, "t", "a", "")
    finally:
        fake.close()


def test_judge_adds_a_weighted_component_to_the_reward(runner):
    from nodeagent.verifier import grade as verifier
    fake = FakeJudge("SCORE: 0.5")
    task = {"name": "math/t", "checker": {"kind": "math", "answer": "4", "judge": {
        "endpoint": fake.url, "model": "judge", "rubric": "show work", "weight": 0.2}}}
    try:
        v = verifier.verify(None, None, verifier.graded_task(task), [], "so \\boxed{4}", runner=runner)
    finally:
        fake.close()
    assert v.outcome == "pass"
    assert v.reward == pytest.approx(0.8 * 1.0 + 0.2 * 0.5)
    assert v.components["judge"] == 0.5 and v.components["weights"] == {"correct": 0.8, "judge": 0.2}


def test_a_killed_server_leaves_no_check_running(tmp_path):
    pidfile = tmp_path / "pid"
    with CheckRunner(preload=()) as r:
        fut = r.submit(argv=["sh", "-c", f"echo $$ > {pidfile}; exec sleep 3600"], timeout_s=60)
        wait_for(lambda: pidfile.exists() and pidfile.read_text().strip(), 10.0, "the check\'s pid file")
        os.kill(r.server_pid, 9)
        with pytest.raises(CheckInfraError):
            fut.result(timeout=10)
    wait_for(lambda: not alive(int(pidfile.read_text())), 10.0, "the check\'s process gone")


@pytest.mark.parametrize("text,ok", [
    (r"\boxed{3} or \boxed{5} or \boxed{4}", False),       # a spray with gold last
    (r"\boxed{4} \boxed{7}", False),                        # gold first
    ("answer: 3\nanswer: 4", False),
    (r"so \boxed{4}. Final: \boxed{4}", True),              # the same answer twice
    (r"\boxed{\frac{8}{2}} = \boxed{4.0}", True),           # two forms of one value
])
def test_several_different_final_answers_pass_only_if_every_one_is_right(text, ok):
    from nodeagent.verifier.checkers import answer_verdict, math_equal
    assert math_equal("4", text) is ok
    assert answer_verdict("math", "4", text)["ok"] is ok


@pytest.mark.parametrize("instruction, ok", [
    ("What is the square root of 2?", False),                               # exact gold, no rounding asked
    ("What is the square root of 2? Round to the nearest hundredth.", True),
    ("Give the square root of 2 in simplest radical form.", False),
])
def test_the_tasks_instruction_reaches_the_math_check_through_the_runner(runner, instruction, ok):
    # the task's prompt decides whether a decimal for an exact gold was asked for (mathanswer)
    from nodeagent.verifier import grade as verifier
    task = {"name": "math/root2", "instruction": instruction, "checker": {"kind": "math", "answer": "\\sqrt{2}"}}
    v = verifier.verify(None, None, verifier.graded_task(task), [], "so \\boxed{1.41}", runner=runner)
    assert (v.outcome, v.reward) == (("pass", 1.0) if ok else ("fail", 0.0))
