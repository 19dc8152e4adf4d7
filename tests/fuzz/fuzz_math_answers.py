"""Atheris fuzz target for the math answer checker (`nodeagent.verifier.mathanswer`).

Each input is split into a gold and a prediction (random text, LaTeX fragments from a small
dictionary mixed in). Properties checked on every input:
1. `math_verdict` returns {"ok": bool, "detail": str} and never raises;
2. a fixed integer gold never accepts a boxed integer that differs from it;
3. nor a hedge that offers it next to a different value (`7 \\lor v`, `x=7, x=v`, `7 (or v)`,
   `v = 7`, `7 \\approx v`, a `cases` block, a nested box), after any fuzzed prefix.
Run alone:  python tests/fuzz/fuzz_math_answers.py -atheris_runs=2000
(`tests/fuzz/test_math_fuzz.py` runs it for a bounded number of iterations in CI.)
Must not import zmq or the controller.
"""
from __future__ import annotations

import sys

import atheris

with atheris.instrument_imports(include=["nodeagent.verifier.mathanswer", "nodeagent.verifier.mathnorm"]):
    from nodeagent.verifier import mathanswer

FRAGMENTS = ("\\boxed{", "}", "\\frac{", "}{", "\\sqrt{", "\\text{", "(", ")", "[", "]", "\\{", "\\}",
             ",", ", ", ".", "=", "x", "\\pi", "^", "_", "\\%", "$", "\\left(", "\\right)", "\\in",
             "answer: ", "\\cup", "\\infty", "-", "1", "2", "10", "000", "&", "\\\\",
             "\\begin{pmatrix}", "\\end{pmatrix}", "\\!", "{,}", "\\approx", "\\le")
FIXED_GOLD = 7
HEDGES = ("\\boxed{{7 \\lor {v}}}", "\\boxed{{x=7, x={v}}}", "\\boxed{{7 (or {v})}}", "\\boxed{{{v} = 7}}",
          "\\boxed{{7 \\approx {v}}}", "\\boxed{{\\begin{{cases}} 7 \\\\ {v} \\end{{cases}}}}", "\\boxed{{\\boxed{{7}} {v}}}",
          "answer: 7 \\text{{ or }} {v}")


def _text(fdp: atheris.FuzzedDataProvider, n: int) -> str:
    parts = []
    for _ in range(fdp.ConsumeIntInRange(0, n)):
        if fdp.ConsumeBool():
            parts.append(FRAGMENTS[fdp.ConsumeIntInRange(0, len(FRAGMENTS) - 1)])
        else:
            parts.append(fdp.ConsumeUnicodeNoSurrogates(fdp.ConsumeIntInRange(0, 8)))
    return "".join(parts)


def check_one(data: bytes) -> None:
    fdp = atheris.FuzzedDataProvider(data)
    gold, pred = _text(fdp, 12), _text(fdp, 24)
    v = mathanswer.math_verdict(gold, pred)
    assert isinstance(v, dict) and isinstance(v["ok"], bool) and isinstance(v["detail"], str), v
    other = fdp.ConsumeIntInRange(-10**6, 10**6)
    if other != FIXED_GOLD:
        wrong = f"{pred} so the answer is \\boxed{{{other}}}"
        assert not mathanswer.math_equal(str(FIXED_GOLD), wrong), (other, wrong)
        hedge = HEDGES[fdp.ConsumeIntInRange(0, len(HEDGES) - 1)].format(v=other)
        assert not mathanswer.math_equal(str(FIXED_GOLD), f"{pred}\n{hedge}"), (other, hedge)


def main(argv: list[str]) -> None:
    atheris.Setup(argv, check_one)
    atheris.Fuzz()


if __name__ == "__main__":
    main(sys.argv)
