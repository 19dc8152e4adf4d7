"""The built-in task set "builtin-v1": small Python functions and math problems.

Every Python task gives the agent a stub `solution.py` and two visible pytest tests; the
verifier alone receives `test_hidden.py` (at least four more tests) and `reference.py`, the full
correct content of `solution.py`. Every math task asks for one answer in `\\boxed{...}`; the gold
answer is the math checker's `answer` and the hidden `answer.txt`.

`MATH_DERIVATIONS` gives, for each math task, an independent sympy expression whose value is
the gold answer, so the bank's own tests can prove each gold answer right.

Pure data and string building, no I/O. Must not import: zmq, sqlite3, nodeagent.
"""
from __future__ import annotations

from dataclasses import dataclass

from controller.contracts.tasks import Task, TaskSet

TASKSET_NAME = "builtin-v1"
SOLUTION_FILE = "solution.py"
VISIBLE_TESTS_FILE = "test_visible.py"
HIDDEN_TESTS_FILE = "test_hidden.py"
REFERENCE_FILE = "reference.py"
ANSWER_FILE = "answer.txt"


@dataclass(frozen=True)
class _PySpec:
    """One Python task: `signature` without `def`, a one-paragraph docstring, the reference
    body (indented 4 spaces), and test cases as (expression, expected-literal) pairs."""
    name: str
    signature: str
    doc: str
    body: str
    visible: tuple[tuple[str, str], ...]
    hidden: tuple[tuple[str, str], ...]
    imports: str = ""


@dataclass(frozen=True)
class _MathSpec:
    name: str
    question: str
    answer: str
    derivation: str   # a sympy expression equal to the answer


_PY: tuple[_PySpec, ...] = (
    _PySpec("reverse_words", "reverse_words(s: str) -> str",
            "Return the words of s in reverse order, joined by single spaces.",
            "    return ' '.join(reversed(s.split()))\n",
            (("reverse_words('hello world')", "'world hello'"), ("reverse_words('a')", "'a'")),
            (("reverse_words('one two three')", "'three two one'"), ("reverse_words('')", "''"),
             ("reverse_words('  lead  trail ')", "'trail lead'"), ("reverse_words('x y')", "'y x'"))),
    _PySpec("fizzbuzz", "fizzbuzz(n: int) -> list[str]",
            "Return the FizzBuzz strings for 1..n: 'Fizz' for multiples of 3, 'Buzz' for multiples "
            "of 5, 'FizzBuzz' for multiples of both, otherwise the number as a string.",
            "    out = []\n"
            "    for i in range(1, n + 1):\n"
            "        s = ('Fizz' if i % 3 == 0 else '') + ('Buzz' if i % 5 == 0 else '')\n"
            "        out.append(s or str(i))\n"
            "    return out\n",
            (("fizzbuzz(3)", "['1', '2', 'Fizz']"), ("fizzbuzz(1)", "['1']")),
            (("fizzbuzz(0)", "[]"), ("fizzbuzz(5)[-1]", "'Buzz'"), ("fizzbuzz(15)[-1]", "'FizzBuzz'"),
             ("len(fizzbuzz(100))", "100"), ("fizzbuzz(7)", "['1', '2', 'Fizz', '4', 'Buzz', 'Fizz', '7']"))),
    _PySpec("is_palindrome", "is_palindrome(s: str) -> bool",
            "Return True if s reads the same backwards, ignoring case and every character that is "
            "not a letter or digit.",
            "    t = [c.lower() for c in s if c.isalnum()]\n    return t == t[::-1]\n",
            (("is_palindrome('racecar')", "True"), ("is_palindrome('hello')", "False")),
            (("is_palindrome('A man, a plan, a canal: Panama')", "True"), ("is_palindrome('')", "True"),
             ("is_palindrome('ab')", "False"), ("is_palindrome('No lemon, no melon')", "True"),
             ("is_palindrome('12 3 21')", "True"))),
    _PySpec("rle_encode", "rle_encode(s: str) -> str",
            "Run-length encode s: each maximal run of one character becomes the character followed "
            "by the run length, e.g. 'aaabcc' -> 'a3b1c2'.",
            "    out = []\n    i = 0\n    while i < len(s):\n        j = i\n"
            "        while j < len(s) and s[j] == s[i]:\n            j += 1\n"
            "        out.append(f'{s[i]}{j - i}')\n        i = j\n    return ''.join(out)\n",
            (("rle_encode('aaabcc')", "'a3b1c2'"), ("rle_encode('x')", "'x1'")),
            (("rle_encode('')", "''"), ("rle_encode('aaaaaaaaaaaa')", "'a12'"),
             ("rle_encode('abab')", "'a1b1a1b1'"), ("rle_encode('zzzy')", "'z3y1'"))),
    _PySpec("gcd", "gcd(a: int, b: int) -> int",
            "Return the greatest common divisor of a and b (never negative); gcd(0, 0) is 0. "
            "Do not use math.gcd.",
            "    a, b = abs(a), abs(b)\n    while b:\n        a, b = b, a % b\n    return a\n",
            (("gcd(12, 18)", "6"), ("gcd(7, 5)", "1")),
            (("gcd(0, 0)", "0"), ("gcd(0, 9)", "9"), ("gcd(-12, 8)", "4"), ("gcd(1071, 462)", "21"),
             ("gcd(9, 0)", "9"))),
    _PySpec("to_roman", "to_roman(n: int) -> str",
            "Return the Roman numeral for n, 1 <= n <= 3999, in standard subtractive form.",
            "    table = [(1000, 'M'), (900, 'CM'), (500, 'D'), (400, 'CD'), (100, 'C'), (90, 'XC'),\n"
            "             (50, 'L'), (40, 'XL'), (10, 'X'), (9, 'IX'), (5, 'V'), (4, 'IV'), (1, 'I')]\n"
            "    out = []\n    for value, sym in table:\n        while n >= value:\n"
            "            out.append(sym)\n            n -= value\n    return ''.join(out)\n",
            (("to_roman(3)", "'III'"), ("to_roman(9)", "'IX'")),
            (("to_roman(1994)", "'MCMXCIV'"), ("to_roman(3999)", "'MMMCMXCIX'"), ("to_roman(40)", "'XL'"),
             ("to_roman(1)", "'I'"), ("to_roman(444)", "'CDXLIV'"))),
    _PySpec("from_roman", "from_roman(s: str) -> int",
            "Return the integer value of the Roman numeral s (standard subtractive form).",
            "    values = {'I': 1, 'V': 5, 'X': 10, 'L': 50, 'C': 100, 'D': 500, 'M': 1000}\n"
            "    total = 0\n    for i, c in enumerate(s):\n"
            "        v = values[c]\n"
            "        if i + 1 < len(s) and values[s[i + 1]] > v:\n            total -= v\n"
            "        else:\n            total += v\n    return total\n",
            (("from_roman('III')", "3"), ("from_roman('IV')", "4")),
            (("from_roman('MCMXCIV')", "1994"), ("from_roman('LVIII')", "58"), ("from_roman('I')", "1"),
             ("from_roman('MMMCMXCIX')", "3999"))),
    _PySpec("flatten", "flatten(xs: list) -> list",
            "Return the elements of the arbitrarily nested list xs in order, with all list nesting "
            "removed.",
            "    out = []\n    for x in xs:\n        if isinstance(x, list):\n            out.extend(flatten(x))\n"
            "        else:\n            out.append(x)\n    return out\n",
            (("flatten([1, [2, 3]])", "[1, 2, 3]"), ("flatten([])", "[]")),
            (("flatten([[[1]], 2, [[3, [4]]]])", "[1, 2, 3, 4]"), ("flatten([[], [[]]])", "[]"),
             ("flatten(['a', ['b', ['c']]])", "['a', 'b', 'c']"), ("flatten([1, 2])", "[1, 2]"))),
    _PySpec("group_anagrams", "group_anagrams(words: list[str]) -> list[list[str]]",
            "Group words that are anagrams of each other. Groups appear in the order of their first "
            "word in the input; words inside a group keep their input order.",
            "    groups = {}\n    for w in words:\n        groups.setdefault(''.join(sorted(w)), []).append(w)\n"
            "    return list(groups.values())\n",
            (("group_anagrams(['ab', 'ba', 'c'])", "[['ab', 'ba'], ['c']]"), ("group_anagrams([])", "[]")),
            (("group_anagrams(['eat', 'tea', 'tan', 'ate', 'nat', 'bat'])",
              "[['eat', 'tea', 'ate'], ['tan', 'nat'], ['bat']]"),
             ("group_anagrams(['x'])", "[['x']]"), ("group_anagrams(['abc', 'cab', 'abc'])", "[['abc', 'cab', 'abc']]"),
             ("group_anagrams(['a', 'b', 'a'])", "[['a', 'a'], ['b']]"))),
    _PySpec("word_count", "word_count(text: str) -> dict[str, int]",
            "Count words case-insensitively, where a word is a maximal run of ASCII letters a-z; "
            "return a dict from lowercase word to count.",
            "    return dict(Counter(re.findall('[a-z]+', text.lower())))\n",
            (("word_count('a b a')", "{'a': 2, 'b': 1}"), ("word_count('')", "{}")),
            (("word_count('Hello, hello!')", "{'hello': 2}"), ("word_count('it\\'s')", "{'it': 1, 's': 1}"),
             ("word_count('A1a')", "{'a': 2}"), ("word_count('The cat; the HAT')", "{'the': 2, 'cat': 1, 'hat': 1}")),
            imports="import re\nfrom collections import Counter\n"),
    _PySpec("is_prime", "is_prime(n: int) -> bool",
            "Return True if n is a prime number (numbers below 2 are not prime).",
            "    if n < 2:\n        return False\n    i = 2\n    while i * i <= n:\n"
            "        if n % i == 0:\n            return False\n        i += 1\n    return True\n",
            (("is_prime(7)", "True"), ("is_prime(8)", "False")),
            (("is_prime(1)", "False"), ("is_prime(2)", "True"), ("is_prime(-7)", "False"),
             ("is_prime(7919)", "True"), ("is_prime(7921)", "False"))),
    _PySpec("primes_up_to", "primes_up_to(n: int) -> list[int]",
            "Return all primes p with p <= n, in increasing order.",
            "    if n < 2:\n        return []\n    sieve = [True] * (n + 1)\n    sieve[0] = sieve[1] = False\n"
            "    for i in range(2, int(n ** 0.5) + 1):\n        if sieve[i]:\n"
            "            for j in range(i * i, n + 1, i):\n                sieve[j] = False\n"
            "    return [i for i, p in enumerate(sieve) if p]\n",
            (("primes_up_to(10)", "[2, 3, 5, 7]"), ("primes_up_to(1)", "[]")),
            (("primes_up_to(2)", "[2]"), ("primes_up_to(30)", "[2, 3, 5, 7, 11, 13, 17, 19, 23, 29]"),
             ("len(primes_up_to(1000))", "168"), ("primes_up_to(-5)", "[]"))),
    _PySpec("fibonacci", "fibonacci(n: int) -> int",
            "Return the n-th Fibonacci number, with fibonacci(0) == 0 and fibonacci(1) == 1.",
            "    a, b = 0, 1\n    for _ in range(n):\n        a, b = b, a + b\n    return a\n",
            (("fibonacci(0)", "0"), ("fibonacci(10)", "55")),
            (("fibonacci(1)", "1"), ("fibonacci(2)", "1"), ("fibonacci(50)", "12586269025"),
             ("fibonacci(20)", "6765"))),
    _PySpec("binary_search", "binary_search(xs: list[int], target: int) -> int",
            "xs is sorted ascending with distinct values; return the index of target in xs, or -1 "
            "if it is absent.",
            "    lo, hi = 0, len(xs) - 1\n    while lo <= hi:\n        mid = (lo + hi) // 2\n"
            "        if xs[mid] == target:\n            return mid\n        if xs[mid] < target:\n"
            "            lo = mid + 1\n        else:\n            hi = mid - 1\n    return -1\n",
            (("binary_search([1, 3, 5], 3)", "1"), ("binary_search([1, 3, 5], 4)", "-1")),
            (("binary_search([], 1)", "-1"), ("binary_search([2], 2)", "0"),
             ("binary_search(list(range(0, 1000, 3)), 999)", "333"), ("binary_search([1, 3, 5], 0)", "-1"),
             ("binary_search([1, 3, 5], 5)", "2"))),
    _PySpec("chunk", "chunk(xs: list, size: int) -> list[list]",
            "Split xs into consecutive pieces of length size (the last may be shorter). "
            "Raise ValueError if size < 1.",
            "    if size < 1:\n        raise ValueError('size must be at least 1')\n"
            "    return [xs[i:i + size] for i in range(0, len(xs), size)]\n",
            (("chunk([1, 2, 3, 4], 2)", "[[1, 2], [3, 4]]"), ("chunk([], 3)", "[]")),
            (("chunk([1, 2, 3], 2)", "[[1, 2], [3]]"), ("chunk([1, 2], 5)", "[[1, 2]]"),
             ("chunk([1, 2, 3], 1)", "[[1], [2], [3]]"),
             ("__import__('pytest').raises(ValueError, chunk, [1], 0).type", "ValueError"))),
    _PySpec("caesar", "caesar(s: str, shift: int) -> str",
            "Shift every ASCII letter of s by shift places in the alphabet, wrapping around and "
            "keeping case; other characters are unchanged. shift may be negative or large.",
            "    out = []\n    for c in s:\n        if 'a' <= c <= 'z':\n"
            "            out.append(chr((ord(c) - 97 + shift) % 26 + 97))\n"
            "        elif 'A' <= c <= 'Z':\n            out.append(chr((ord(c) - 65 + shift) % 26 + 65))\n"
            "        else:\n            out.append(c)\n    return ''.join(out)\n",
            (("caesar('abc', 1)", "'bcd'"), ("caesar('xyz', 3)", "'abc'")),
            (("caesar('Hello, World!', 13)", "'Uryyb, Jbeyq!'"), ("caesar('abc', -1)", "'zab'"),
             ("caesar('Zz', 52)", "'Zz'"), ("caesar('', 5)", "''"))),
    _PySpec("merge_intervals", "merge_intervals(intervals: list[tuple[int, int]]) -> list[tuple[int, int]]",
            "Merge overlapping or touching closed intervals (start, end) and return them sorted by "
            "start, as tuples.",
            "    out = []\n    for s, e in sorted(intervals):\n        if out and s <= out[-1][1]:\n"
            "            out[-1] = (out[-1][0], max(out[-1][1], e))\n        else:\n"
            "            out.append((s, e))\n    return out\n",
            (("merge_intervals([(1, 3), (2, 6)])", "[(1, 6)]"), ("merge_intervals([])", "[]")),
            (("merge_intervals([(8, 10), (1, 3), (2, 6), (15, 18)])", "[(1, 6), (8, 10), (15, 18)]"),
             ("merge_intervals([(1, 4), (4, 5)])", "[(1, 5)]"), ("merge_intervals([(1, 10), (2, 3)])", "[(1, 10)]"),
             ("merge_intervals([(5, 6), (1, 2)])", "[(1, 2), (5, 6)]"))),
    _PySpec("balanced_brackets", "balanced_brackets(s: str) -> bool",
            "Return True if the brackets (), [] and {} in s are balanced and properly nested; other "
            "characters are ignored.",
            "    pairs = {')': '(', ']': '[', '}': '{'}\n    stack = []\n    for c in s:\n"
            "        if c in '([{':\n            stack.append(c)\n        elif c in pairs:\n"
            "            if not stack or stack.pop() != pairs[c]:\n                return False\n"
            "    return not stack\n",
            (("balanced_brackets('([]{})')", "True"), ("balanced_brackets('(]')", "False")),
            (("balanced_brackets('')", "True"), ("balanced_brackets('((')", "False"),
             ("balanced_brackets('a(b)c]')", "False"), ("balanced_brackets('{[()()]}x')", "True"),
             ("balanced_brackets(')(')", "False"))),
    _PySpec("dedupe", "dedupe(xs: list) -> list",
            "Return xs without repeated elements, keeping the first occurrence of each, in order.",
            "    seen = set()\n    out = []\n    for x in xs:\n        if x not in seen:\n"
            "            seen.add(x)\n            out.append(x)\n    return out\n",
            (("dedupe([1, 2, 1])", "[1, 2]"), ("dedupe([])", "[]")),
            (("dedupe([3, 3, 3])", "[3]"), ("dedupe(['b', 'a', 'b', 'c', 'a'])", "['b', 'a', 'c']"),
             ("dedupe([1, 2, 3])", "[1, 2, 3]"), ("dedupe([2, 1, 2, 1])", "[2, 1]"))),
    _PySpec("max_subarray", "max_subarray(xs: list[int]) -> int",
            "Return the largest sum of a non-empty contiguous slice of the non-empty list xs.",
            "    best = cur = xs[0]\n    for x in xs[1:]:\n        cur = max(x, cur + x)\n"
            "        best = max(best, cur)\n    return best\n",
            (("max_subarray([1, -2, 3])", "3"), ("max_subarray([5])", "5")),
            (("max_subarray([-2, 1, -3, 4, -1, 2, 1, -5, 4])", "6"), ("max_subarray([-3, -1, -2])", "-1"),
             ("max_subarray([2, 3, -1, 4])", "8"), ("max_subarray([0, 0])", "0"))),
    _PySpec("transpose", "transpose(matrix: list[list]) -> list[list]",
            "Return the transpose of a rectangular matrix given as a list of rows; the transpose of "
            "[] is [].",
            "    return [list(col) for col in zip(*matrix)]\n",
            (("transpose([[1, 2], [3, 4]])", "[[1, 3], [2, 4]]"), ("transpose([])", "[]")),
            (("transpose([[1, 2, 3]])", "[[1], [2], [3]]"), ("transpose([[1], [2]])", "[[1, 2]]"),
             ("transpose([[1, 2, 3], [4, 5, 6]])", "[[1, 4], [2, 5], [3, 6]]"), ("transpose([[7]])", "[[7]]"))),
    _PySpec("camel_to_snake", "camel_to_snake(name: str) -> str",
            "Convert a CamelCase or camelCase identifier to snake_case: every uppercase letter "
            "except a leading one becomes '_' followed by its lowercase form; a leading uppercase "
            "letter is just lowercased.",
            "    out = []\n    for i, c in enumerate(name):\n        if c.isupper():\n"
            "            out.append(('_' if i else '') + c.lower())\n        else:\n"
            "            out.append(c)\n    return ''.join(out)\n",
            (("camel_to_snake('helloWorld')", "'hello_world'"), ("camel_to_snake('Hello')", "'hello'")),
            (("camel_to_snake('HelloBigWorld')", "'hello_big_world'"), ("camel_to_snake('x')", "'x'"),
             ("camel_to_snake('getX')", "'get_x'"), ("camel_to_snake('already_snake')", "'already_snake'"))),
    _PySpec("digit_sum", "digit_sum(n: int) -> int",
            "Return the sum of the decimal digits of n (the sign is ignored).",
            "    return sum(int(d) for d in str(abs(n)))\n",
            (("digit_sum(123)", "6"), ("digit_sum(0)", "0")),
            (("digit_sum(-45)", "9"), ("digit_sum(99999)", "45"), ("digit_sum(1000)", "1"),
             ("digit_sum(7)", "7"))),
    _PySpec("rotate_list", "rotate_list(xs: list, k: int) -> list",
            "Return xs rotated right by k places (k may exceed len(xs) or be negative, meaning a "
            "left rotation); rotating [] gives [].",
            "    if not xs:\n        return []\n    k %= len(xs)\n    return xs[-k:] + xs[:-k] if k else list(xs)\n",
            (("rotate_list([1, 2, 3], 1)", "[3, 1, 2]"), ("rotate_list([], 4)", "[]")),
            (("rotate_list([1, 2, 3], 3)", "[1, 2, 3]"), ("rotate_list([1, 2, 3], 4)", "[3, 1, 2]"),
             ("rotate_list([1, 2, 3], -1)", "[2, 3, 1]"), ("rotate_list([1, 2, 3, 4], 2)", "[3, 4, 1, 2]"))),
    _PySpec("count_vowels", "count_vowels(s: str) -> int",
            "Return how many characters of s are vowels a, e, i, o, u, in either case.",
            "    return sum(1 for c in s.lower() if c in 'aeiou')\n",
            (("count_vowels('hello')", "2"), ("count_vowels('')", "0")),
            (("count_vowels('AEIOU')", "5"), ("count_vowels('rhythm')", "0"),
             ("count_vowels('Programming Language')", "7"), ("count_vowels('y')", "0"))),
    _PySpec("second_largest", "second_largest(xs: list[int]) -> int | None",
            "Return the second largest distinct value in xs, or None if xs has fewer than two "
            "distinct values.",
            "    values = sorted(set(xs))\n    return values[-2] if len(values) >= 2 else None\n",
            (("second_largest([1, 3, 2])", "2"), ("second_largest([])", "None")),
            (("second_largest([5, 5, 5])", "None"), ("second_largest([4, 4, 3])", "3"),
             ("second_largest([-1, -2])", "-2"), ("second_largest([10, 9, 10, 8])", "9"))),
    _PySpec("pascal_row", "pascal_row(n: int) -> list[int]",
            "Return row n of Pascal's triangle, where row 0 is [1].",
            "    row = [1]\n    for _ in range(n):\n        row = [a + b for a, b in zip([0] + row, row + [0])]\n"
            "    return row\n",
            (("pascal_row(0)", "[1]"), ("pascal_row(2)", "[1, 2, 1]")),
            (("pascal_row(1)", "[1, 1]"), ("pascal_row(4)", "[1, 4, 6, 4, 1]"),
             ("sum(pascal_row(10))", "1024"), ("pascal_row(5)[2]", "10"))),
)

_MATH: tuple[_MathSpec, ...] = (
    _MathSpec("sum_1_to_100", "What is the sum of the integers from 1 to 100 inclusive?", "5050",
              "summation(k, (k, 1, 100))"),
    _MathSpec("choose_10_3", "In how many ways can a committee of 3 people be chosen from 10 people?",
              "120", "binomial(10, 3)"),
    _MathSpec("two_heads_of_three", "A fair coin is tossed 3 times. What is the probability of getting "
              "exactly two heads? Give the answer as a fraction.", "3/8", "binomial(3, 2) / Integer(8)"),
    _MathSpec("linear_equation", "Solve for x: 3x + 7 = 25.", "6", "solve(3*x + 7 - 25, x)[0]"),
    _MathSpec("square_diagonal", "What is the length of the diagonal of a square with side length 2? "
              "Give the exact value in simplest radical form.", "2\\sqrt{2}", "sqrt(2**2 + 2**2)"),
    _MathSpec("factorial_ratio", "Compute 12!/10!.", "132", "factorial(12) / factorial(10)"),
    _MathSpec("gcd_84_126", "What is the greatest common divisor of 84 and 126?", "42", "gcd(84, 126)"),
    _MathSpec("fraction_sum", "Compute 1/2 + 1/4 as a fraction in lowest terms.", "3/4",
              "Rational(1, 2) + Rational(1, 4)"),
    _MathSpec("derangements_4", "How many permutations of 4 distinct items leave no item in its "
              "original position?", "9", "subfactorial(4)"),
    _MathSpec("product_of_roots", "What is the product of the roots of 2x^2 - 7x + 3 = 0? Give the "
              "answer as a fraction.", "3/2", "Mul(*solve(2*x**2 - 7*x + 3, x))"),
    _MathSpec("banana_arrangements", "How many distinct arrangements of the letters of the word "
              "BANANA are there?", "60", "factorial(6) / (factorial(3) * factorial(2))"),
    _MathSpec("power_mod", "What is the remainder when 2^10 is divided by 7?", "2", "Mod(2**10, 7)"),
    _MathSpec("triangle_area_345", "What is the area of a triangle with side lengths 3, 4 and 5?", "6",
              "Integer(3) * 4 / 2"),
    _MathSpec("point_distance", "What is the distance between the points (1, 2) and (4, 6)?", "5",
              "sqrt((4 - 1)**2 + (6 - 2)**2)"),
    _MathSpec("simplify_sqrt_50", "Simplify the square root of 50 to simplest radical form.",
              "5\\sqrt{2}", "sqrt(50)"),
    _MathSpec("divisors_360", "How many positive divisors does 360 have?", "24", "divisor_count(360)"),
    _MathSpec("hexagon_angles", "What is the sum of the interior angles of a hexagon, in degrees?",
              "720", "(6 - 2) * 180"),
    _MathSpec("lcm_12_18", "What is the least common multiple of 12 and 18?", "36", "lcm(12, 18)"),
    _MathSpec("dice_sum_seven", "Two fair six-sided dice are rolled. What is the probability that "
              "the sum is 7? Give the answer as a fraction.", "1/6", "Rational(6, 36)"),
    _MathSpec("larger_root", "What is the larger root of x^2 - 2x - 1 = 0? Give the exact value.",
              "1+\\sqrt{2}", "Max(*solve(x**2 - 2*x - 1, x))"),
)

MATH_DERIVATIONS: dict[str, str] = {f"math/{m.name}": m.derivation for m in _MATH}


def _function_name(spec: _PySpec) -> str:
    return spec.signature.split("(", 1)[0]


def _stub(spec: _PySpec) -> str:
    return f'def {spec.signature}:\n    """{spec.doc}"""\n    raise NotImplementedError\n'


def _reference(spec: _PySpec) -> str:
    head = spec.imports + ("\n\n" if spec.imports else "")
    return f'{head}def {spec.signature}:\n    """{spec.doc}"""\n{spec.body}'


def _test_file(spec: _PySpec, cases: tuple[tuple[str, str], ...], prefix: str) -> str:
    lines = [f"from solution import {_function_name(spec)}", ""]
    for i, (expr, expected) in enumerate(cases):
        lines += ["", f"def test_{prefix}_{i}():", f"    assert {expr} == {expected}", ""]
    return "\n".join(lines)


def _python_task(spec: _PySpec) -> Task:
    fn = _function_name(spec)
    instruction = (
        f"Implement the function `{fn}` in /work/solution.py.\n\n"
        f"Signature: def {spec.signature}\n{spec.doc}\n\n"
        f"The file already holds a stub with this signature. /work/test_visible.py has example "
        f"tests you can run with `cd /work && python3 -m pytest -q test_visible.py`; hidden tests "
        f"check more cases. Do not modify or delete the test files.")
    return Task(
        name=f"python/{spec.name}", family="python", instruction=instruction,
        files={SOLUTION_FILE: _stub(spec), VISIBLE_TESTS_FILE: _test_file(spec, spec.visible, "visible")},
        hidden={HIDDEN_TESTS_FILE: _test_file(spec, spec.hidden, "hidden"), REFERENCE_FILE: _reference(spec)},
        checker={"kind": "pytest", "tests": [HIDDEN_TESTS_FILE, VISIBLE_TESTS_FILE]},
        protected=(VISIBLE_TESTS_FILE,),
    )


def _math_task(spec: _MathSpec) -> Task:
    instruction = (f"Solve the following problem. Put only the final answer in \\boxed{{...}}.\n\n"
                   f"{spec.question}")
    return Task(name=f"math/{spec.name}", family="math", instruction=instruction,
                hidden={ANSWER_FILE: spec.answer}, checker={"kind": "math", "answer": spec.answer})


def builtin_taskset() -> TaskSet:
    """The built-in task set: one Python-function task per spec, then one math task per spec."""
    tasks = tuple(_python_task(s) for s in _PY) + tuple(_math_task(s) for s in _MATH)
    return TaskSet(name=TASKSET_NAME, tasks=tasks)
