"""The prose view of code tasks (controller/taskbank/codetext.py) and the template lines that
the semantic stage leaves out (semantic.set_texts); no model needed."""
from __future__ import annotations

import numpy as np

from controller.contracts.tasks import Task
from controller.taskbank import codetext, semantic

HELD = '''from typing import List


def below_zero(operations: List[int]) -> bool:
    """ Detect if at any point the balance of the account falls below zero.
    >>> below_zero([1, 2, -4, 5])
    True
    """
    balance = 0
    for op in operations:
        balance += op
        if balance < 0:
            return True
    return False
'''


def code_task(name: str, ref: str) -> Task:
    return Task(name=name, family="python", instruction="Complete the function.\n\n" + ref[:40],
                files={"solution.py": "raise NotImplementedError\n"},
                hidden={"reference.py": ref, "test_hidden.py": "def test_x():\n    assert 1\n"},
                checker={"kind": "pytest", "tests": ["test_hidden.py"]})


def test_the_prose_view_keeps_names_docstrings_and_comments_not_code():
    view = codetext.code_view(HELD + "# walk the list once\n")
    assert view.splitlines()[0] == "below zero"
    assert "falls below zero" in view and "walk the list once" in view and ">>> below_zero" in view
    assert "balance += op" not in view


def test_code_without_prose_is_its_own_view_and_c_code_is_read_by_regex():
    assert codetext.code_view("def f(x):\n    return x + 1\n") == "def f(x):\n    return x + 1\n"
    c = "/* Sum the digits of n. */\nint sumDigits(int n) {\n  return n % 10;\n}\n"
    view = codetext.code_view(c)
    assert "sum digits" in view and "Sum the digits of n." in view and "return" not in view
    assert codetext.name_words("sortArrayFast") == "sort array fast"


def test_a_task_without_code_has_no_prose_view():
    math = Task(name="m", family="math", instruction="What is 2 + 2?", hidden={"answer.txt": "4"},
                checker={"kind": "math", "answer": "4"})
    assert codetext.task_code_view(math) is None
    assert "below zero" in codetext.task_code_view(code_task("c", HELD))


def test_template_lines_shared_by_a_family_are_left_out():
    tasks = [Task(name=f"m{i}", family="math", hidden={"answer.txt": "0"},
                  instruction=f"Solve the following problem.\n\nTom has {i} apples.",
                  checker={"kind": "math", "answer": "0"}) for i in range(4)]
    texts = semantic.set_texts(tasks)
    assert texts == [f"Tom has {i} apples." for i in range(4)]
    assert semantic.set_texts(tasks[:2]) == [semantic.task_text(t) for t in tasks[:2]]


class BagEmbedder:
    model_id = "bag"

    def embed(self, texts):
        out = np.zeros((len(texts), semantic.DIMENSION), dtype=np.float32)
        for i, t in enumerate(texts):
            for w in t.split():
                out[i, hash(w) % semantic.DIMENSION] += 1
        return semantic.normalise(out + 1e-6)


def test_task_vectors_are_unit_vectors_weighting_text_and_prose():
    tasks = [code_task("a", HELD), code_task("b", HELD.replace("op", "item")),
             Task(name="m", family="math", instruction="Tom has 3 apples.", hidden={"answer.txt": "3"},
                  checker={"kind": "math", "answer": "3"})]
    for w in (0.0, 0.3, None):
        vecs = semantic.task_vectors(BagEmbedder(), tasks, text_weight=w)
        assert np.allclose(np.linalg.norm(vecs, axis=1), 1.0, atol=1e-5)
    vecs = semantic.task_vectors(BagEmbedder(), tasks, text_weight=0.0)
    assert vecs[0] @ vecs[1] > 0.99          # the renamed variable is not in the prose


GCD = '''def greatest_common_divisor(a: int, b: int) -> int:
    """ Return a greatest common divisor of two integers a and b
    >>> greatest_common_divisor(3, 5)
    1
    """
    while b:
        a, b = b, a % b
    return a
'''
GCD_COPY = '''def find_highest_common_factor(num1: int, num2: int) -> int:
    """
    This function returns the highest common factor of two integers, num1 and num2
    >>> find_highest_common_factor(60, 45)
    15
    """
    pass  # filler command
    while num2:  # replacing for loop with while loop
        num1, num2 = num2, num1 % num2
    return num1

print(find_highest_common_factor(21, 14))  # Expected output: 7
'''


def test_the_code_shape_survives_renaming_padding_and_new_doctest_values():
    toks = codetext.structure_tokens(GCD)
    assert toks[:4] == ["def", "ID", "(", "ID"] and "int" in toks and "while" in toks
    assert "S" not in toks and "greatest_common_divisor" not in toks     # docstring dropped
    held, copy = codetext.structure_grams(GCD), codetext.structure_grams(GCD_COPY)
    assert codetext.containment(held, copy) == 1.0       # the copy holds every gram of the original
    assert codetext.containment(copy, held) < 1.0        # not the other way round (it is padded)
    other = codetext.structure_grams(HELD)
    assert codetext.containment(held, other) < 0.5
    assert codetext.containment(frozenset(), copy) == 0.0


def test_code_the_python_tokenizer_cannot_read_gets_its_shape_from_the_fallback():
    js = "function add(a, b) { // sum\n  return a + \"x\" + `y` + 1;\n}\n"
    toks = codetext.structure_tokens(js)
    assert toks[:4] == ["ID", "ID", "(", "ID"] and "0" in toks and "S" in toks
    assert "//" not in toks and "sum" not in toks          # the comment is dropped
