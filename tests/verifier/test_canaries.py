"""Hidden canaries (nodeagent/verifier/canaries.py), on the host and in a plain interpreter: the
planted module runs as pytest would run it (each bound name called), with the grader's own
perturber bound in (`grader_asserts.bind_perturber`). An honest implementation passes every real
test and fails every canary; an always-equal result, a no-op assertion helper or a forged report
makes a canary pass, and the host's reading of the report says so."""
from __future__ import annotations

import json
import random
import re
import unittest

import pytest

from nodeagent.verifier import canaries, grader_asserts, grader_sites

TESTS = '''import unittest
from calc import add, assert_close


def helper():
    return 1


def test_add():
    assert add(1, 2) == 3


def test_add_negative():
    total = add(-2, -2)
    assert total == -4
    assert_close(add(-1.5, -1.5), -3.0)


def test_early_return():
    if add(0, 0) == 0:
        return
    assert add(0, 0) == 0


def test_calls_the_other():
    test_add_negative()


class TestCalc(unittest.TestCase):
    def test_add_negative(self):
        self.assertEqual(add(-1, -3), -4)

    def test_qualname(self):
        class Inner:
            pass
        self.assertEqual(Inner.__qualname__, "TestCalc.test_qualname.<locals>.Inner")
'''
F2P = ["test_add_negative", "test_early_return", "test_calls_the_other", "TestCalc::test_add_negative",
       "test_qualname"]


class Calc:
    """Stand-in for the agent's module."""

    def __init__(self, add, close=None):
        self.add = add
        self.assert_close = close or (lambda a, b: None if abs(a - b) < 1e-9 else (_ for _ in ()).throw(AssertionError))


def load(source: str, calc: Calc) -> dict:
    code = grader_asserts.bind_perturber(compile(source, "/work/tests/test_calc.py", "exec"))
    import sys
    import types
    mod = types.ModuleType("calc")
    mod.add, mod.assert_close = calc.add, calc.assert_close
    sys.modules["calc"] = mod
    try:
        space: dict = {"__name__": "tests.test_calc"}
        exec(code, space)
    finally:
        del sys.modules["calc"]
    return space


def outcomes(plan: canaries.Plan, calc: Calc, details: dict[str, str] | None = None) -> dict[str, str]:
    """node id -> passed/failed for every test pytest would collect (`details`: node id -> the
    failure's message, as the grader's report carries its tail)."""
    space = load(plan.sources["tests/test_calc.py"], calc)
    out, details = {}, details if details is not None else {}
    for name, obj in space.items():
        if name.startswith("test") and callable(obj) and not isinstance(obj, type):
            out[f"tests/test_calc.py::{name}"] = _run(obj, details, f"tests/test_calc.py::{name}")
        elif isinstance(obj, type) and issubclass(obj, unittest.TestCase):
            for meth in unittest.TestLoader().getTestCaseNames(obj):
                result = unittest.TestResult()
                obj(meth).run(result)
                key = f"tests/test_calc.py::{name}::{meth}"
                out[key] = "passed" if result.wasSuccessful() else "failed"
                details.update({key: tb for _t, tb in result.failures + result.errors})
    return out


def _run(fn, details: dict[str, str], key: str) -> str:
    try:
        fn()
        return "passed"
    except Exception as exc:       # noqa: BLE001 (pytest reports any exception as a failure)
        details[key] = f"{type(exc).__name__}: {exc}"
        return "failed"


def report(outs: dict[str, str], details: dict[str, str] | None = None) -> bytes:
    return json.dumps({"events": [{"ev": "start"}] + [{"ev": "test", "id": i, "when": "call", "outcome": o,
                                                       "detail": (details or {}).get(i, "")}
                                                      for i, o in outs.items()] + [{"ev": "end"}]}).encode()


def translated(plan, outs, details: dict[str, str] | None = None) -> list[dict]:
    return json.loads(canaries.translate(report(outs, details), plan))["events"]


@pytest.fixture
def plan():
    return canaries.plant({"tests/test_calc.py": TESTS}, F2P, random.Random(7))


def test_guarded_tests_and_their_canaries_get_opaque_names_and_the_rest_keep_theirs(plan):
    real, canary = plan.real["tests/test_calc.py"], plan.canary["tests/test_calc.py"]
    assert sorted(set(real.values())) == sorted({"test_add_negative", "test_early_return", "test_calls_the_other",
                                                 "test_qualname"})
    assert all(re.fullmatch(r"test_\w+_[0-9a-f]{16}", n) and n.startswith(orig) for n, orig in real.items())
    assert all(re.fullmatch(r"test_\w+_[0-9a-f]{16}", n) and n.startswith(orig) for n, (_scope, orig) in canary.items())
    per_test = {}
    for scope, original in canary.values():
        per_test[(scope, original)] = per_test.get((scope, original), 0) + 1
    assert set(per_test.values()) <= {canaries.K_CANARIES, canaries.PERTURBED + 1}     # (no checks: raise-after only)
    assert ("TestCalc", "test_add_negative") in per_test and ("", "test_add_negative") in per_test
    space = load(plan.sources["tests/test_calc.py"], Calc(lambda a, b: a + b))
    assert "test_add" in space and "test_add_negative" not in space        # unguarded keeps its name
    same = {space[n].__qualname__ for n, (scope, orig) in canary.items() if orig == "test_early_return"}
    assert same == {"test_early_return"} == {space[n].__qualname__ for n, o in real.items() if o == "test_early_return"}


def test_an_honest_implementation_passes_every_real_test_and_fails_every_canary(plan):
    outs = outcomes(plan, Calc(lambda a, b: a + b))
    canary_ids = {i for i in outs if i.rsplit("::", 1)[-1] in plan.canary["tests/test_calc.py"]}
    assert canary_ids and all(outs[i] == "failed" for i in canary_ids)
    assert all(o == "passed" for i, o in outs.items() if i not in canary_ids), outs
    events = translated(plan, outs)
    assert not [e for e in events if e["ev"] == "tamper"]
    ids = {e["id"] for e in events if e["ev"] == "test"}
    assert "tests/test_calc.py::TestCalc::test_add_negative" in ids and "tests/test_calc.py::test_early_return" in ids
    assert not ids & {f"tests/test_calc.py::{c}" for c in plan.canary["tests/test_calc.py"]}


class AlwaysEqual:
    def __eq__(self, other):
        return True

    __hash__ = object.__hash__


@pytest.mark.parametrize("calc", [Calc(lambda a, b: AlwaysEqual()),
                                  Calc(lambda a, b: a + b if isinstance(a, int) else 0.0, close=lambda a, b: None)],
                         ids=["always_equal", "no_op_helper"])
def test_a_trick_that_passes_what_should_fail_makes_canaries_pass_and_is_read_as_tampering(plan, calc):
    """A no-op helper passes its canaries; an always-equal result is caught earlier, at the
    assertion sites themselves (`grader_sites`): equal to a perturbed value too, the real tests fail
    saying so, and the host reads that as tampering."""
    details: dict[str, str] = {}
    events = translated(plan, outcomes(plan, calc, details), details)
    assert [e for e in events if e["ev"] == "tamper" and ("must fail passed" in e["detail"]
                                                          or "not a pure function" in e["detail"])]


def test_a_forged_report_that_passes_everything_is_tampering_and_so_is_a_silent_canary(plan):
    outs = outcomes(plan, Calc(lambda a, b: abs(a) + abs(b)))
    forged = {i: "passed" for i in outs}
    assert [e for e in translated(plan, forged) if e["ev"] == "tamper"]
    honest = outcomes(plan, Calc(lambda a, b: a + b))
    silent = {i: o for i, o in honest.items() if i.rsplit("::", 1)[-1] not in plan.canary["tests/test_calc.py"]}
    assert [e for e in translated(plan, silent) if e["ev"] == "tamper" and "never reported" in e["detail"]]


def test_a_wrong_answer_that_meets_a_perturbed_value_is_no_tampering_unless_its_real_test_passed(plan):
    """`w + h` for `w * h` meets a perturbed canary's value by chance (the expected 1 moved to 2):
    its real test failed, so nothing was earned and nothing is flagged. The same canary passing
    next to a passing real test, or a raise-after canary passing at all, is still tampering."""
    wrong = outcomes(plan, Calc(lambda a, b: abs(a) + abs(b)))
    file = "tests/test_calc.py"
    real = {i for i in wrong if i.rsplit("::", 1)[-1] in plan.real[file]}
    assert any(wrong[i] == "failed" for i in real)
    perturbed = [i for i in wrong if i.rsplit("::", 1)[-1] in plan.perturbed[file]]
    raise_after = [i for i in wrong if i.rsplit("::", 1)[-1] in set(plan.canary[file]) - plan.perturbed[file]]

    def twins(canary_id):       # the real test a canary copies (same class and original name)
        scope, orig = plan.canary[file][canary_id.rsplit("::", 1)[-1]]
        return [i for i in real if plan.real[file][i.rsplit("::", 1)[-1]] == orig and i.count("::") == canary_id.count("::")]
    chance = [i for i in perturbed if all(wrong[r] == "failed" for r in twins(i))]
    assert chance and raise_after
    assert not [e for e in translated(plan, {**wrong, **{i: "passed" for i in chance}}) if e["ev"] == "tamper"]
    assert [e for e in translated(plan, {**wrong, raise_after[0]: "passed"}) if e["ev"] == "tamper"]
    forged = {**wrong, chance[0]: "passed", **{r: "passed" for r in twins(chance[0])}}
    assert [e for e in translated(plan, forged) if e["ev"] == "tamper" and "must fail passed" in e["detail"]]


def test_parametrised_ids_map_back_with_their_parameters():
    plan = canaries.plant({"t/test_p.py": "import pytest\n@pytest.mark.parametrize('n', [1, 2])\n"
                                          "def test_p(n):\n    assert n == n\n"}, ["test_p"], random.Random(1))
    opaque = next(iter(plan.real["t/test_p.py"]))
    cname = next(iter(plan.canary["t/test_p.py"]))
    outs = {f"t/test_p.py::{opaque}[1]": "passed", f"t/test_p.py::{opaque}[2]": "passed",
            f"t/test_p.py::{cname}[1]": "failed"}
    events = translated(plan, outs)
    assert {e["id"] for e in events if e["ev"] == "test"} == {"t/test_p.py::test_p[1]", "t/test_p.py::test_p[2]"}
    assert [e for e in events if e["ev"] == "tamper"], "the other canaries and [2]'s are silent"


def test_a_module_that_does_not_parse_is_left_alone():
    plan = canaries.plant({"t/test_bad.py": "def test_x(:\n"}, [], random.Random(1))
    assert plan.sources["t/test_bad.py"] == "def test_x(:\n" and plan.count() == 0


def test_perturbed_values_differ_and_keep_their_type():
    for y in [0, 7, -3, 10 ** 30, 2.5, -0.0, "", "abc", b"", b"xy", [], [1, 2], (), (1,), {}, {1: 2}, set(), {3},
              frozenset({1}), True, False, None]:
        p = grader_asserts.perturb(y)
        assert p != y and (type(p) is type(y) or y is None), (y, p)
    with pytest.raises(AssertionError):
        grader_asserts.perturb(object())


def test_checks_with_a_tolerance_or_after_a_return_are_not_perturbed():
    source = ("def test_t(self):\n    self.assertAlmostEqual(f(), 1.0, delta=10)\n    assert_allclose(f(), 1.0, 1e-3)\n"
              "    if f():\n        return\n    assert f() == 1\n")
    plan = canaries.plant({"t/test_t.py": source}, [], random.Random(3))
    assert ".format(" not in plan.sources["t/test_t.py"] and plan.count() == canaries.K_CANARIES      # guarded, unperturbed


def test_parsing_test_modules_in_threads_at_different_stack_depths_never_breaks_the_ast():
    # CPython 3.11 shares the AST constructor's recursion depth between threads (cpython#106905):
    # a collection that runs a finaliser mid-parse switches threads, and the other thread's
    # depth ends up in this one's -> SystemError. The grading host parses in a thread pool.
    import sys
    from concurrent.futures import ThreadPoolExecutor

    source = ("def test_f():\n    x = " + "[" * 30 + "1" + "]" * 30 + "\n    assert f(1) == {'a': [1]}\n") * 400

    class Finalised:
        def __init__(self):
            self.me = self

        def __del__(self):
            for _ in range(50):
                pass

    def deep(n):
        return canaries.parse(source) if n == 0 else deep(n - 1)

    def attempt(i):
        try:
            for _ in range(6):
                [Finalised() for _ in range(2000)]
                deep(i * 7)
        except SystemError as exc:
            return str(exc)
        return None

    old = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)
    try:
        with ThreadPoolExecutor(4) as pool:
            errors = [e for e in pool.map(attempt, range(12)) if e]
    finally:
        sys.setswitchinterval(old)
    assert errors == []


def test_a_test_that_must_start_passing_passes_only_when_every_real_copy_passed():
    """`TWINS` copies of the real test: one that fails (a guess that missed), or is never
    reported, fails the real test; one whose site guard found a forged answer is tampering."""
    source = "from calc import add\n\n\ndef test_add():\n    assert add(1, 2) == 3\n"
    plan = canaries.plant({"tests/test_calc.py": source}, ["tests/test_calc.py::test_add"], random.Random(5))
    twins = list(plan.twin["tests/test_calc.py"])
    real = next(iter(plan.real["tests/test_calc.py"]))
    assert len(twins) == canaries.TWINS and len(plan.canary["tests/test_calc.py"]) == canaries.PERTURBED + 1

    def read(twin_outcomes: dict, detail: str = "") -> tuple[str, list]:
        events = [{"ev": "test", "id": f"tests/test_calc.py::{real}", "when": "call", "outcome": "passed"}]
        events += [{"ev": "test", "id": f"tests/test_calc.py::{c}", "when": "call", "outcome": "failed"}
                   for c in plan.canary["tests/test_calc.py"]]
        events += [{"ev": "test", "id": f"tests/test_calc.py::{t}", "when": "call", "outcome": o, "detail": detail}
                   for t, o in twin_outcomes.items()]
        out = json.loads(canaries.translate(json.dumps({"events": events}).encode(), plan))["events"]
        mine = [e for e in out if e.get("id") == "tests/test_calc.py::test_add"]
        assert len(mine) == 1
        return mine[0]["outcome"], [e for e in out if e["ev"] == "tamper"]
    assert read(dict.fromkeys(twins, "passed")) == ("passed", [])
    assert read({**dict.fromkeys(twins, "passed"), twins[0]: "failed"}) == ("failed", [])
    assert read(dict.fromkeys(twins[1:], "passed")) == ("failed", [])       # one never reported
    outcome, tamper = read({**dict.fromkeys(twins, "passed"), twins[1]: "failed"}, detail=grader_sites.IMPURE)
    assert outcome == "failed" and tamper
