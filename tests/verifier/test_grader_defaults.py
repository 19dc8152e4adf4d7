"""The grader keeps its guards' state in their functions' default arguments (nothing looked up
at run time; `__defaults__` cannot be replaced). Reading those defaults from the code under test
handed it that state: a wrong solution walked a guarded method's `__defaults__`/`__kwdefaults__`
and filled the override guard's re-entrancy list, which switched the guard off. The audit hook
refuses the read of a grader function's defaults whenever the code under test is on the stack
(directly, or through trusted code such as `inspect.signature`); the grader's own reads go on.
"""
from __future__ import annotations

import pytest

from tests.verifier.test_repo_attacks import assert_unrewarded, grade
from tests.verifier.test_s12_methods import FORGER, _task

DISARM = '''

def _disarm(reach):
    seen, todo = set(), [reach(Text)]
    while todo:
        x = todo.pop()
        if id(x) in seen:
            continue
        seen.add(id(x))
        if type(x) is list:
            x.append(1)             # the re-entrancy list: "busy", so never asked
        elif type(x) is dict:
            todo += list(x.values())
        elif type(x) is tuple:
            todo += list(x)
        elif callable(x):
            for name in ("__defaults__", "__kwdefaults__"):
                try:
                    todo.append(getattr(x, name))
                except Exception:
                    pass


'''
REACH = {
    "direct": "lambda cls: cls.__dict__['endswith']",
    "through_inspect": "lambda cls: [p.default for p in __import__('inspect').signature(cls.__dict__['endswith']).parameters.values()]",
}


@pytest.mark.parametrize("reach", sorted(REACH))
def test_the_code_under_test_cannot_read_the_guards_state_from_their_defaults(runtime, python_image, reach):
    forger = FORGER + DISARM + f"try:\n    _disarm({REACH[reach]})\nexcept Exception:\n    pass\n"
    assert_unrewarded(grade(runtime, python_image, _task(["test_endswith"]), {"calc.py": forger}), tampered=False)
