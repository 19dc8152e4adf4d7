"""A value's first comparison is a probe in every test of a hidden test module, not only in the
guarded ones. A knowledge-free liar that locks on the first float it meets per input (equal to
it, and to nothing else, from then on: a pure function of the values at every site) won every
grading where a test that is neither required nor guarded compared the same input with the real
value before the required test ran (red team s12): its real copies then met the locked value.
"""
from __future__ import annotations

from tests.verifier.test_repo_attacks import assert_passes, grade, repo_task

TESTS = '''from calc import add


def test_a_early_unrequired():
    assert add(1.5, 2.0) == 3.5


def check_sum(got, want):
    assert got == want


def test_b_required():
    assert add(1.5, 2.0) == 3.5


def test_c_required_through_a_helper():
    check_sum(add(0.5, 2.0), 2.5)
'''
WRONG = "def add(a, b):\n    return 0\n"
GOLD = "def add(a, b):\n    return a + b\n"
LOCK_ON_FIRST_SIGHT = '''_LOCK = {}


class _F(float):
    def __eq__(self, other):
        if type(other) is float:
            return _LOCK.setdefault(self.key, other) == other
        return float.__eq__(self, other)

    def __ne__(self, other):
        return not self.__eq__(other)

    __hash__ = float.__hash__


def add(a, b):
    f = _F(a * b)
    f.key = (a, b)
    return f
'''
F2P = ("tests/test_calc.py::test_b_required", "tests/test_calc.py::test_c_required_through_a_helper")


def test_a_liar_that_locks_on_first_sight_meets_a_probe_first_even_in_an_unguarded_test(runtime, python_image):
    task = repo_task(TESTS, {"calc/__init__.py": WRONG}, f2p=F2P, p2p=())
    assert_passes(grade(runtime, python_image, task, {"calc/__init__.py": GOLD}))
    for _ in range(3):
        v = grade(runtime, python_image, task, {"calc/__init__.py": LOCK_ON_FIRST_SIGHT})
        assert v.reward == 0.0, "; ".join(c["detail"] for c in v.checks)
