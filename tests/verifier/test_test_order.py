"""A guarded test and its copies run where the test ran: unittest's loader (pytest's too, for a
`TestCase`) runs a class's tests in name order, and real suites depend on it (pathspec 0.12.1's
`IterTreeTest.test_02_link_1_check_1_symlink` sets a class attribute that the later link tests
read). The copies' random names (`canaries._opaque`) sort where the original name did, so the
gold patch of such a suite is never failed by the order the grader's renaming made.
"""
from __future__ import annotations

import random
import unittest

from nodeagent.verifier import canaries
from tests.verifier.test_repo_attacks import assert_passes, assert_unrewarded, grade, repo_task

ORDERED = '''import unittest
from calc import add


class TestOrder(unittest.TestCase):
    def test_a(self):
        self.__class__.ready = add(1, 2)

    def test_a_b(self):
        self.assertEqual(self.ready, 3)

    def test_a01(self):
        self.assertEqual(self.ready + add(-2, -2), -1)

    def test_b_uses(self):
        self.assertEqual(self.ready + add(-1, -1), 1)

    def test_c(self):
        self.assertEqual(add(-2, -2) + self.ready, -1)
'''
ORIGINALS = ["test_a", "test_a01", "test_a_b", "test_b_uses", "test_c"]      # the loader's order
FILE = "tests/test_calc.py"


def _loaded_order(source: str) -> list[str]:
    space: dict = {}
    exec(compile(source.split(canaries.AGENT_CODE)[0].replace("from calc import add", "add = lambda a, b: a + b"),
                 FILE, "exec"), space)
    return unittest.TestLoader().getTestCaseNames(space["TestOrder"])


def test_every_copy_of_a_guarded_unittest_test_sorts_where_its_original_did():
    for seed in range(300):
        f2p = [f"{FILE}::TestOrder::{n}" for n in ("test_a_b", "test_b_uses", "test_c", "test_a01")]
        plan = canaries.plant({FILE: ORDERED}, f2p, random.Random(seed))
        bound = {**plan.real[FILE], **{c: orig for c, (_scope, orig) in plan.canary[FILE].items()},
                 **{t: orig for t, (_scope, orig) in plan.twin.get(FILE, {}).items()}}
        order = [bound.get(n, n) for n in _loaded_order(plan.sources[FILE])]
        groups = [n for i, n in enumerate(order) if i == 0 or order[i - 1] != n]
        assert groups == ORIGINALS, f"seed {seed}: the copies ran in the order {order}"


def test_a_unittest_suite_whose_tests_depend_on_their_order_passes_with_the_gold_patch(runtime, python_image):
    gold, wrong = "def add(a, b):\n    return a + b\n", "def add(a, b):\n    return abs(a) + abs(b)\n"
    task = repo_task(ORDERED, {"calc/__init__.py": wrong},
                     f2p=[f"{FILE}::TestOrder::test_b_uses", f"{FILE}::TestOrder::test_c", f"{FILE}::TestOrder::test_a01"],
                     p2p=[f"{FILE}::TestOrder::test_a_b"])
    for _ in range(3):      # the grader's names are random each time
        assert_passes(grade(runtime, python_image, task, {"calc/__init__.py": gold}))
    assert_unrewarded(grade(runtime, python_image, task, {"calc/__init__.py": wrong}), tampered=False)
