"""The contamination check's execution stage (controller/taskbank/execution.py): a held-out code
task's own hidden tests run in the farm's real sandbox against its nearest training tasks' code.

Material: real HumanEval items and their public rephrased copies (tests/data/contamination), and
training code a careless or hostile author would write: a different function that passes weak
tests, code that exits 0 on import, loops for ever, kills every process it can, or plants files
for the runs after it; tests that pass a null solution."""
from __future__ import annotations

import pytest

from controller.cli.tasks import SandboxExecutor
from controller.taskbank import contamination_eval as ev
from controller.taskbank import execution
from controller.taskbank.bank import make_set
from controller.taskbank.contamination import ContaminationConfig, check
from controller.taskbank.importers import humaneval_task
from tests.conftest import sandbox_prerequisites

WHY_NOT = sandbox_prerequisites()


@pytest.fixture(scope="module")
def executor(python_image):
    if WHY_NOT:
        pytest.skip(WHY_NOT)
    with SandboxExecutor(str(python_image)) as ex:
        yield ex


def _row(i: int) -> dict:
    return next(r for r in ev.load_pairs() if r["id"] == f"humaneval-{i:03d}")


def _held(rec: dict):
    return humaneval_task(rec, ev.PAIRS_FILE, 0)


def _train(name: str, code: str):
    return ev.code_task(name, code)


def _judge(held, trains, executor, **cfg):
    pairs = [(held, [(t, 0.9) for t in trains])]
    conf = execution.ExecutionConfig(**{"top_k": len(trains), **cfg})
    out, counts, _ = execution.judge(pairs, conf, executor)
    return [out[(id(held), id(t))] for t in trains], counts


# -- what is parsed, never run ----------------------------------------------------------------

def test_probe_finds_the_function_its_tests_import_and_refuses_what_it_cannot_judge():
    p, why = execution.probe(_held(_row(0)["humaneval"]))
    assert why == "" and p.module == "solution.py" and p.entries == {"has_close_elements": 2}
    assert p.tests == ("test_hidden.py",) and "reference.py" not in p.files
    assert execution.probe(ev.math_task("m", "What is 2 + 2?"))[0] is None
    no_ref = _held(_row(0)["humaneval"])
    no_ref = type(no_ref)(**{**no_ref.__dict__, "hidden": {k: v for k, v in no_ref.hidden.items()
                                                         if k != "reference.py"}})
    assert execution.probe(no_ref) == (None, "no reference solution to confirm the tests run")


def test_bindings_prefer_the_same_name_then_the_arity_and_the_closest_name():
    p, _ = execution.probe(_held(_row(0)["humaneval"]))
    code = ("def helper(x):\n    return x\n\ndef close_elements(a, b):\n    return 1\n\n"
            "def other(a, b):\n    return 2\n")
    assert execution.bindings(p, code, 3) == [{"has_close_elements": "close_elements"},
                                               {"has_close_elements": "other"}]
    same = "def has_close_elements(a, b, c=0):\n    return 0\n" + code
    assert execution.bindings(p, same, 3) == [{"has_close_elements": "has_close_elements"}]
    assert execution.bindings(p, "def f(x):\n    return x\n", 3) == []


def test_examples_are_literal_calls_only():
    text = ('>>> f([1, 2], "a")\nf(3) == 4\nf(__import__("os").system("touch /tmp/pwned"))\n'
            'f(x)\nf([1, 2], "a")\n')
    assert execution.examples(text, "f") == ["([1, 2], 'a')", "(3,)"]


# -- in the sandbox ---------------------------------------------------------------------------

def test_a_rephrased_copy_passes_the_held_out_tests_and_a_different_function_does_not(executor):
    row = _row(0)
    held = _held(row["humaneval"])
    copy = _train("copy", row["copy"])
    other = _train("other", _row(2)["copy"])          # truncate_number: another task, arity 1
    wrong = _train("wrong", "def nearby(numbers, limit):\n    return len(numbers) > 1\n")
    (c, o, w), counts = _judge(held, [copy, other, wrong], executor)
    assert c.verdict == "pass" and "has_close_elements = nearby_elements_exist" in c.detail, c
    assert o == execution.Outcome("fail", "no function of the arity the tests call")
    assert w.verdict == "fail" and "assertion" in w.detail, w
    assert counts["passed"] == 1


def test_weak_tests_do_not_pass_a_different_function_that_the_examples_tell_apart(executor):
    """HumanEval/27 (flip_case) has three asserts, none without letters; a training function
    that also reverses letterless strings passes them. Its own examples tell it apart."""
    held = _held(_row(27)["humaneval"])
    lookalike = _train("lookalike", _row(161)["copy"])   # reverse_or_swapcase
    (out,), _ = _judge(held, [lookalike], executor)
    assert out.verdict == "fail" and "differs from the reference on an example" in out.detail, out


def test_tests_that_a_null_solution_passes_give_no_verdict(executor):
    rec = dict(_row(0)["humaneval"], test="def check(candidate):\n    candidate([1.0], 0.5)\n")
    held = _held(rec)
    (out,), _ = _judge(held, [_train("copy", _row(0)["copy"])], executor)
    assert out.verdict is None and "null solution" in out.detail


def test_hostile_training_code_cannot_pass_or_spoil_the_runs_after_it(executor):
    """Code that exits 0 on import, loops for ever, kills every process it may, or leaves a
    process behind that rewrites every test file it can find: none passes, and the honest copy
    tried after them still does."""
    row = _row(0)
    held = _held(row["humaneval"])
    sig = "def has_close_elements(numbers, threshold):\n    return True\n"
    hostile = [
        _train("exit0", "import os\nos._exit(0)\n" + sig),
        _train("forever", "while True:\n    pass\n" + sig),
        _train("killer", "import os, signal\ntry:\n    os.kill(-1, signal.SIGKILL)\nexcept OSError:\n"
                         "    pass\n" + sig),
        _train("planter", "import os, time\nif os.fork() == 0:\n    os.setsid()\n    for _ in range(400):\n"
                          "        for root, _, names in os.walk('/tmp'):\n            for n in names:\n"
                          "                try:\n                    open(os.path.join(root, n), 'w').write("
                          "'def test_x():\\n    pass\\n')\n                except OSError:\n"
                          "                    pass\n        time.sleep(0.005)\n    os._exit(0)\n" + sig),
    ]
    outs, _ = _judge(held, hostile + [_train("copy", row["copy"])], executor, timeout_s=3.0)
    assert [o.verdict for o in outs] == ["fail"] * 4 + ["pass"], outs
    assert outs[0].detail == "exited 0 without finishing the tests"
    assert outs[1].detail == "time limit"


def test_a_check_with_no_code_candidate_never_asks_for_a_sandbox():
    """Semantic stage off: no neighbour to run, so the executor is never asked for a sandbox
    (the CLI's starts its runtime only then), no verdict is claimed and no time is booked."""
    asked = []

    class Counting:
        def sandbox(self):
            asked.append(1)
            raise AssertionError("a sandbox was asked for with nothing to run")
    row = _row(0)
    train = make_set("train", [_train("copy", row["copy"])])
    held = make_set("held", [_held(row["humaneval"])], "heldout")
    report = check(train, held, ContaminationConfig(semantic=False), executor=Counting())
    assert report.checked == 1 and asked == []
    assert "execution" not in report.seconds and report.executed == {}
    assert not any(s.execution for s in report.suspects)


def test_a_sandbox_that_fails_mid_batch_costs_verdicts_never_a_crash_or_a_pass():
    class Broken:
        def sandbox(self):
            raise RuntimeError("the holder died")
    row = _row(0)
    held = _held(row["humaneval"])
    (out,), counts = _judge(held, [_train("copy", row["copy"])], Broken())
    assert out.verdict is None and "the holder died" in out.detail and counts["passed"] == 0


def test_an_executor_that_cannot_start_skips_the_stage_in_the_report():
    """With the semantic stage on (embedder required), a code candidate exists; the executor
    cannot start: `skipped.execution` says why, and the semantic verdicts stand."""
    from controller.taskbank import semantic
    try:
        semantic.load_embedder()
    except semantic.SemanticUnavailable as exc:
        pytest.skip(str(exc))

    class NoSandbox:
        def sandbox(self):
            raise execution.ExecutionUnavailable("no sandbox here: user namespaces are off")
    row = _row(0)
    report = check(make_set("train", [_train("copy", row["copy"])]),
                   make_set("held", [_held(row["humaneval"])], "heldout"), executor=NoSandbox())
    assert report.skipped["execution"] == "no sandbox here: user namespaces are off"
    assert "execution stage skipped" in report.summary_line()
    assert all(s.execution is None for s in report.suspects)


def test_importing_a_held_out_humaneval_file_runs_its_tests_against_the_bank_s_training_code(
        tmp_path, executor, capsys):
    """The user's path: a training set holding a rephrased copy is in the bank; importing the
    public HumanEval item as held-out names the copy, stage `execution`, in the report."""
    import json

    from controller.cli.main import main
    from controller.taskbank import semantic
    from controller.taskbank.bank import TaskBank
    try:
        semantic.load_embedder()
    except semantic.SemanticUnavailable as exc:
        pytest.skip(str(exc))
    row = _row(0)
    bank = TaskBank(tmp_path / "bank")
    bank.put_set(make_set("train", [_train("copy", row["copy"]), _train("other", _row(2)["copy"])]))
    src = tmp_path / "he.jsonl"
    src.write_text(json.dumps(row["humaneval"]) + "\n")
    assert main(["tasks", "--bank", str(bank.root), "import", "humaneval", str(src), "--set", "he",
                 "--split", "heldout"]) == 0
    assert "1 suspect(s) among 1 held-out tasks" in capsys.readouterr().out
    report = json.loads((bank.root / "contamination" / "he--train.json").read_text())
    (s,) = report["suspects"]
    assert s["train_name"] == "code/copy" and "execution" in s["stages"], s
    assert s["execution"] == "pass" and report["executed"]["passed"] == 1
