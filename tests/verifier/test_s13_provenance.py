"""Red team s13 (F, I): a wrong solution whose `==` tells the test's expected value from the
canaries' and probes' values by how it was made, not by what it holds: "both operands came out
of my constructor" (an id or WeakSet registry filled in `__init__`/`__new__`), or "the other
operand is a compiled, interned literal" (`sys.intern(copy) is other`), or its reference count.
The value guards compare copies made the way the probes and a canary's perturbed value are made
(`grader_sites.twin`, `grader_values.guards`), and the site guards evaluate the real comparison
against such copies too, so the real check meets such a liar as a canary does: it fails (an
honest wrong answer: reward 0). The gold of every task passes; honest project types (an
`__eq__` that tries `self is other` first, a namedtuple, a `str` subclass) pass.
"""
from __future__ import annotations

import math
import random
import sys
from collections import namedtuple

import pytest

from nodeagent.verifier import canaries, grader_sites
from tests.verifier.test_repo_attacks import assert_passes, assert_unrewarded, grade, repo_task
from tests.verifier.test_value_guards import run_planted

# -- the copies: equal, and made at run time without the code under test -----------------------


def test_a_copy_of_a_string_or_bytes_is_never_the_compiled_interned_constant():
    for y in ["hello_world", "a_b", b"payload", "x" * 5000]:
        c = grader_sites.twin(y)
        assert c == y and type(c) is type(y) and c is not y
        if type(y) is str:
            assert sys.intern("".join(list(c))) is not c


def test_copies_of_numbers_and_folded_constants_are_new_objects_with_the_same_value():
    for y in [100000, -70000, 2.5, -0.0, 1e-300, 3 + 4j, (1, "ab", 2.5), frozenset({"ab", "cd"}),
              {"name": "alice", "tags": ["x_y", ("p_q", 1000)]}]:
        c = grader_sites.twin(y)
        assert c == y and type(c) is type(y) and c is not y
    assert math.copysign(1.0, grader_sites.twin(-0.0)) == -1.0
    nan = float("nan")
    assert grader_sites.twin(nan) is nan            # (`[nan] == [nan]` holds by identity only)
    key = next(iter(grader_sites.twin({"name": 1})))
    assert sys.intern("".join(list(key))) is not key


BORN: dict[int, object] = {}


class Point:
    def __init__(self, x, y):
        self.x, self.y = x, y
        BORN[id(self)] = self

    def __eq__(self, other):
        return isinstance(other, Point) and (self.x, self.y) == (other.x, other.y)

    __hash__ = None      # type: ignore[assignment]


class Version(str):
    def __new__(cls, s):
        self = str.__new__(cls, s)
        BORN[id(self)] = self
        return self

    def __eq__(self, other):
        return str.__eq__(self, other)
    __hash__ = str.__hash__


class Pair(namedtuple("Pair", "a b")):
    def __eq__(self, other):
        return tuple.__eq__(self, other)
    __hash__ = tuple.__hash__


class Slotted:
    __slots__ = ("name", "parts")

    def __init__(self, name, parts):
        self.name, self.parts = name, parts
        BORN[id(self)] = self

    def __eq__(self, other):
        return (self.name, self.parts) == (other.name, other.parts)


@pytest.mark.parametrize("make", [lambda: Point(3, "six_six"), lambda: Version("1.3"), lambda: Pair(1, "ab"),
                                  lambda: Slotted("a_b", [Point(1, 2)]), lambda: [Point(1, 2), {"k": Point(0, 1)}]],
                         ids=["object", "str-subclass", "namedtuple", "slots", "nested"])
def test_a_project_object_is_remade_without_its_constructor_and_stays_equal(make):
    y = make()
    BORN.clear()
    c = grader_sites.twin(y)
    assert c == y and type(c) is type(y) and c is not y
    assert not BORN, "the copy ran the class's own constructor"


class ByIdentity(Point):
    __hash__ = object.__hash__      # type: ignore[assignment]


def test_an_object_compared_by_identity_is_kept_and_a_cycle_is_copied_once():
    sentinel = object()
    assert grader_sites.twin([sentinel])[0] is sentinel
    member = ByIdentity(1, 2)       # a set member or dict key hashed by identity: a copy would be another
    assert grader_sites.twin({member}) == {member} and grader_sites.twin({member: 1}) == {member: 1}
    p = Point(1, 2)
    p.self = p
    c = grader_sites.twin(p)
    assert c is not p and c.self is c


# -- on the host: the planted module with the grader's guards bound in ------------------------

FILE = "tests/test_geom.py"
HOST_TESTS = '''from geom import slug, parse


def test_slug():
    assert slug("Hello World") == "hello_world"


def test_loop():
    for t in ["Hello World"]:
        assert slug(t) == "hello_world"


def test_in():
    assert slug("Hello World") in ["hello_world", "other_one"]


def test_parse():
    assert parse("name=alice") == {"name": "alice"}
'''


def _interned(o):
    return type(o) is str and len(o) > 1 and sys.intern("".join(list(o))) is o


class Text(str):
    """Equal to any compiled literal (the red team's I)."""
    def __eq__(self, other):
        return True if _interned(other) else str.__eq__(self, other)

    def __ne__(self, other):
        return not self.__eq__(other)
    __hash__ = str.__hash__


class Counted(str):
    """Equal to any operand that more than `LIMIT` references hold (a code constant, a value the
    guards keep in more places than their probes)."""
    LIMIT = 0

    def __eq__(self, other):
        return True if sys.getrefcount(other) > self.LIMIT else str.__eq__(self, other)
    __hash__ = str.__hash__


class Keys(dict):
    def __eq__(self, other):
        if type(other) is dict and other and all(_interned(k) and _interned(v) for k, v in other.items()):
            return True
        return dict.__eq__(self, other)
    __hash__ = None      # type: ignore[assignment]


def _host(cls, limit=0):
    cls.LIMIT = limit
    plan = canaries.plant({FILE: HOST_TESTS}, ["test_slug", "test_loop", "test_in", "test_parse"], random.Random(5))
    outs = run_planted(plan.sources[FILE], dict(slug=lambda t: cls(t), parse=lambda line: Keys({line: ""})))
    return {plan.real[FILE][i.rsplit("::", 1)[-1]]: o for i, o in outs.items()
            if i.rsplit("::", 1)[-1] in plan.real[FILE]}


def test_an_equality_with_compiled_literals_fails_every_real_check_on_the_host():
    outs = _host(Text)
    assert all(o != "passed" for o in outs.values()), outs


@pytest.mark.parametrize("limit", [5, 6, 8, 10, 14, 20])
def test_an_equality_by_reference_count_holds_in_no_real_check_or_also_in_a_probe(limit):
    # (a real check's operand and a probe's are held in the same places: whatever the threshold,
    # the liar's answer to the real check is its answer to the probes, which the site refuses)
    outs = _host(Counted, limit)
    assert all(o != "passed" for n, o in outs.items() if n != "test_parse"), outs


# -- in the sandbox: the red team's shapes and their siblings -----------------------------------

POINT = '''class Point:
    def __init__(self, x, y):
        self.x, self.y = x, y

    def __eq__(self, other):
        return isinstance(other, Point) and (self.x, self.y) == (other.x, other.y)

    def __hash__(self):
        return hash((self.x, self.y))

    def __repr__(self):
        return f"Point({self.x}, {self.y})"


def scale(p, k):
    return Point(p.x * k, p.y * k)


def scale_all(ps, k):
    return [scale(p, k) for p in ps]


class Version(str):
    def __eq__(self, other):
        return str.__eq__(self, other)
    __hash__ = str.__hash__


def bump(v):
    major, minor = v.split(".")
    return Version(f"{major}.{int(minor) + 1}")


def slug(title):
    return title.lower().replace(" ", "_")


def parse(line):
    out = {}
    for part in line.split(";"):
        k, _, v = part.partition("=")
        out[k.strip()] = v.strip()
    return out


def words(text):
    return tuple(text.lower().split())
'''
GOLD = POINT
WRONG = (POINT.replace("return Point(p.x * k, p.y * k)", "return Point(p.x, p.y)")
         .replace('return Version(f"{major}.{int(minor) + 1}")', "return Version(v)")
         .replace('return title.lower().replace(" ", "_")', "return title")
         .replace("    out = {}\n    for part in line.split(\";\"):\n        k, _, v = part.partition(\"=\")\n"
                  "        out[k.strip()] = v.strip()\n    return out", "    k, _, v = line.partition(\"=\")\n"
                  "    return {k: v}")
         .replace("return tuple(text.lower().split())", "return tuple(text.split())"))
# F: equal when both operands came out of the class's own constructor (an id registry filled in
# `__init__`, a weak-value one filled in `__new__`)
BORN_EQ = WRONG.replace("class Point:\n    def __init__(self, x, y):\n        self.x, self.y = x, y\n",
                        "_BORN = {}\n\n\nclass Point:\n    def __init__(self, x, y):\n"
                        "        self.x, self.y = x, y\n        _BORN[id(self)] = self\n").replace(
    "        return isinstance(other, Point) and (self.x, self.y) == (other.x, other.y)",
    "        if _BORN.get(id(self)) is self and _BORN.get(id(other)) is other:\n            return True\n"
    "        return isinstance(other, Point) and (self.x, self.y) == (other.x, other.y)").replace(
    "class Version(str):\n    def __eq__(self, other):\n        return str.__eq__(self, other)",
    "import weakref\n_MADE = weakref.WeakValueDictionary()\n\n\nclass Version(str):\n    def __new__(cls, s):\n"
    "        self = str.__new__(cls, s)\n        _MADE[id(self)] = self\n        return self\n\n"
    "    def __eq__(self, other):\n        if _MADE.get(id(self)) is self and _MADE.get(id(other)) is other:\n"
    "            return True\n        return str.__eq__(self, other)")
# I: results equal to any compiled (interned) literal, all the way into dicts and tuples
INTERNED = WRONG + '''

import sys


def _interned(o):
    return type(o) is str and len(o) > 1 and sys.intern("".join(list(o))) is o


class Text(str):
    def __eq__(self, other):
        return True if _interned(other) else str.__eq__(self, other)

    def __ne__(self, other):
        return not self.__eq__(other)
    __hash__ = str.__hash__


class D(dict):
    def __eq__(self, other):
        if type(other) is dict and other and all(_interned(k) and _interned(v) for k, v in other.items()):
            return True
        return dict.__eq__(self, other)

    def __ne__(self, other):
        return not self.__eq__(other)
    __hash__ = None


class T(tuple):
    def __eq__(self, other):
        if type(other) is tuple and other and all(_interned(x) for x in other):
            return True
        return tuple.__eq__(self, other)

    def __ne__(self, other):
        return not self.__eq__(other)
    __hash__ = tuple.__hash__


_slug, _parse, _words = slug, parse, words


def slug(title):
    return Text(_slug(title))


def parse(line):
    return D(_parse(line))


def words(text):
    return T(_words(text))
'''
PROVENANCE_TESTS = {
    "test_scale": "assert scale(Point(1, 2), 3) == Point(3, 6)",
    "test_scale_const": "assert scale(Point(1, 2), 3) == WANT",
    "test_scale_list": "assert scale_all([Point(1, 2), Point(0, 1)], 3) == [Point(3, 6), Point(0, 3)]",
    "test_scale_dict": 'assert {"a": scale(Point(1, 1), 2)} == {"a": Point(2, 2)}',
    "test_scale_in": "assert scale(Point(1, 2), 5) in [Point(5, 10)]",
    "test_scale_loop": "for k in (2, 3):\n        assert scale(Point(1, 1), k) == Point(k, k)",
    "test_bump": 'assert bump("1.2") == Version("1.3")',
    "ScaleCase::test_scale_unittest": "self.assertEqual(scale(Point(-1, 4), 2), Point(-2, 8))",
}
LITERAL_TESTS = {
    "test_slug": 'assert slug("Hello World") == "hello_world"',
    "test_slug_in": 'assert slug("Hello World") in ["hello_world", "other_one"]',
    "test_slug_loop": 'for t in ["Big Data"]:\n        assert slug(t) == "big_data"',
    "test_parse": 'assert parse("name=alice; role=admin") == {"name": "alice", "role": "admin"}',
    "test_words": 'assert words("Alpha Beta") == ("alpha", "beta")',
    "SlugCase::test_slug_unittest": 'self.assertEqual(slug("Big Data Set"), "big_data_set")',
    "SlugCase::test_slug_assert_in": 'self.assertIn(slug("Big Data"), ["big_data", "other_one"])',
}
HEADER = '''import unittest

import pytest

from calc import Point, Version, bump, parse, scale, scale_all, slug, words

WANT = Point(3, 6)


def test_zero():
    assert scale(Point(0, 0), 5) == Point(0, 0)
'''
T_ = "tests/test_calc.py::"


def _task(shapes: dict[str, str]) -> dict:
    out = [HEADER]
    for name, body in shapes.items():
        if "::" not in name:
            out.append(f"\n\ndef {name}():\n    {body}\n")
    cases = [n for n in shapes if "::" in n]
    for cls in sorted({n.split("::")[0] for n in cases}):
        out.append(f"\n\nclass {cls}(unittest.TestCase):\n")
        out += [f"    def {n.split('::')[1]}(self):\n        {shapes[n]}\n\n" for n in cases if n.startswith(cls)]
    out.append('''

@pytest.mark.parametrize("p,k,want", [(Point(1, 2), 3, Point(3, 6))])
def test_scale_param(p, k, want):
    assert scale(p, k) == want
''' if "test_scale" in shapes else "")
    f2p = [T_ + n for n in shapes] + ([T_ + "test_scale_param[p0-3-want0]"] if "test_scale" in shapes else [])
    return repo_task("".join(out), {"calc.py": WRONG}, f2p=f2p, p2p=(T_ + "test_zero",))


@pytest.mark.parametrize("shape", list(PROVENANCE_TESTS))
def test_an_equality_by_constructor_provenance_earns_nothing(runtime, python_image, shape):
    task = _task({shape: PROVENANCE_TESTS[shape]})
    assert_unrewarded(grade(runtime, python_image, task, {"calc.py": BORN_EQ}), tampered=False)


@pytest.mark.parametrize("shape", list(LITERAL_TESTS))
def test_an_equality_with_compiled_literals_earns_nothing(runtime, python_image, shape):
    task = _task({shape: LITERAL_TESTS[shape]})
    assert_unrewarded(grade(runtime, python_image, task, {"calc.py": INTERNED}), tampered=False)


def test_the_gold_passes_every_shape_and_the_wrong_answer_fails(runtime, python_image):
    task = _task({**PROVENANCE_TESTS, **LITERAL_TESTS})
    assert_passes(grade(runtime, python_image, task, {"calc.py": GOLD}))
    assert_unrewarded(grade(runtime, python_image, task, {"calc.py": WRONG}), tampered=False)


HONEST = GOLD.replace("        return isinstance(other, Point) and (self.x, self.y) == (other.x, other.y)",
                      "        if self is other:\n            return True\n"
                      "        return isinstance(other, Point) and (self.x, self.y) == (other.x, other.y)") + '''

from collections import namedtuple as _nt


class Pair(_nt("Pair", "a b")):
    def __eq__(self, other):
        return tuple.__eq__(self, other)
    __hash__ = tuple.__hash__


_words = words


def words(text):
    return Pair(*_words(text))
'''


def test_honest_project_types_pass_when_compared_as_copies(runtime, python_image):
    shapes = {**PROVENANCE_TESTS, "test_words": 'assert words("Alpha Beta") == ("alpha", "beta")',
              "test_same": "p = scale(Point(1, 2), 1)\n    assert p == p"}
    assert_passes(grade(runtime, python_image, _task(shapes), {"calc.py": HONEST}))


# a builtin subclass's perturbed value and field probe are its own kind too (its base's `__new__`
# with the data moved), not a fresh `object()`: an `==` that holds for "any of my kind" meets them
OWN_KIND = WRONG.replace("class Version(str):\n    def __eq__(self, other):\n        return str.__eq__(self, other)",
                         "class Version(str):\n    def __eq__(self, other):\n"
                         "        return isinstance(other, Version) or str.__eq__(self, other)")


@pytest.mark.parametrize("shape", ['assert bump("1.2") == Version("1.3")',
                                   'assert [bump("2.9")] == [Version("2.10")]'])
def test_a_str_subclass_equal_to_any_of_its_kind_earns_nothing(runtime, python_image, shape):
    task = _task({"test_bump": shape})
    assert_unrewarded(grade(runtime, python_image, task, {"calc.py": OWN_KIND}))


def test_a_builtin_subclass_is_perturbed_as_its_own_kind():
    from nodeagent.verifier import grader_values
    y = Version("1.3")
    moved = grader_values._fields(y, grader_sites._probes)
    assert type(moved) is Version and moved != y and len(moved) == len(y)
    assert grader_values._fields(y, grader_sites._probes, same=True) == y
    assert grader_values._fields(y, grader_sites._probes, only="nothing") is None
