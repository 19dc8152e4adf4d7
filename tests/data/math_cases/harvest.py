"""Rebuild the public labelled math cases (JSONL) from the source repositories' test files.

Reads test files as text and takes out their labelled (gold, prediction, expected) rows with
`ast` (literals only; nothing from the sources is imported or run except one f-string of
`math.sqrt`), so the stored cases can be checked against their origin. Usage:

    python tests/data/math_cases/harvest.py MATH_VERIFY_GIT_DIR HENDRYCKS_GIT_DIR QWEN_GIT_DIR \
        [LIGHTEVAL_GIT_DIR NEMO_SKILLS_GIT_DIR]

With the last two, also `lighteval.jsonl` (rows of lighteval's extractive-match tests that
Math-Verify's suite does not already carry), `nemo_skills.jsonl` (NeMo-Skills' `math_equal`
pairs, both directions as its test asserts) and `mv_mixed.jsonl` (Math-Verify's mixed-number
tests, transcribed: see MV_MIXED).

Each git dir is a bare clone (`git --git-dir=... show COMMIT:path`). Standard library only.
"""
from __future__ import annotations

import ast
import json
import math
import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
MV_COMMIT = "5d148cfaaf99214c2e4ffb4bc497ab042c592a7a"
HENDRYCKS_COMMIT = "985bdc1696e88e8643f081a0ff4719da39f2ae2a"
QWEN_COMMIT = "a45202bd16f1ec06f433442dc1152d0074773465"
MV_FILES = ("test_all", "test_boxed", "test_numina_cases", "test_open_thoughts", "test_strict",
            "test_yujianll")
# Rows whose label is a statement about a non-default Math-Verify option, not about the answer.
MV_SKIP_TESTS = {"test_set_rel_assymetry": "label depends on allow_set_relation_comp",
                 "test_strict_variable_comparison": "strict=False rows label a loose mode"}
# Rows kept in the files but marked "excluded" (the benchmark skips and counts them): their label
# states a Math-Verify extraction rule under a non-default config, not whether the answer is right.
MV_EXCLUDED = {
    "tests/test_all.py::test_latex_notation[5]": "label is Math-Verify's latex-only inline-$ newline rule; the prediction states 9",
    "tests/test_all.py::test_latex_notation[6]": "label is Math-Verify's latex-only inline-\\( newline rule; the prediction states 9",
}
QWEN_TEST = "test_complex_math_expressions"     # Math-Verify's transcription of Qwen's grader cases


def _show(git_dir: str, commit: str, path: str) -> str:
    return subprocess.run(["git", "--git-dir", git_dir, "show", f"{commit}:{path}"],
                          check=True, capture_output=True, text=True).stdout


def _value(node: ast.AST):
    try:
        return ast.literal_eval(node)
    except ValueError:       # the one f-string row: f"{math.sqrt(17):.15f}"
        return eval(compile(ast.Expression(node), "<row>", "eval"), {"math": math, "__builtins__": {}})


def _parametrize_rows(fn: ast.FunctionDef):
    for dec in fn.decorator_list:
        if isinstance(dec, ast.Call) and getattr(dec.func, "attr", "") == "parametrize":
            names = [n.strip() for n in ast.literal_eval(dec.args[0]).split(",")]
            for elt in dec.args[1].elts:
                yield dict(zip(names, (_value(e) for e in elt.elts)))


def harvest_math_verify(git_dir: str) -> tuple[list[dict], list[dict]]:
    mv, qwen = [], []
    for name in MV_FILES:
        path = f"tests/{name}.py"
        tree = ast.parse(_show(git_dir, MV_COMMIT, path))
        for fn in (n for n in tree.body if isinstance(n, ast.FunctionDef)):
            for i, row in enumerate(_parametrize_rows(fn)):
                if "gold" not in row or fn.name in MV_SKIP_TESTS and row.get("strict", True) is False:
                    continue
                if fn.name in MV_SKIP_TESTS and "allow_set_relation_comp" in row:
                    continue
                label = row.get("expected", row.get("result"))
                case = {"gold": row["gold"], "pred": row["pred"], "expected": bool(label),
                        "origin": f"{path}::{fn.name}[{i}]"}
                if case["origin"] in MV_EXCLUDED:
                    case["excluded"] = MV_EXCLUDED[case["origin"]]
                (qwen if fn.name == QWEN_TEST else mv).append(case)
    return mv, qwen


def harvest_hendrycks(git_dir: str) -> list[dict]:
    path = "modeling/math_equivalence_test.py"
    tree = ast.parse(_show(git_dir, HENDRYCKS_COMMIT, path))
    out = []
    for fn in ast.walk(tree):
        if not isinstance(fn, ast.FunctionDef) or not fn.name.startswith("test"):
            continue
        env, verdict = {}, None
        for stmt in fn.body:
            if isinstance(stmt, ast.Assign):
                env[stmt.targets[0].id] = ast.literal_eval(stmt.value)
            elif isinstance(stmt, ast.Expr) and isinstance(stmt.value, ast.Call):
                verdict = stmt.value.func.attr == "assertTrue"
        out.append({"gold": env["test_in"], "pred": env["test_out"], "expected": verdict,
                    "origin": f"{path}::{fn.name}"})
    return out


# Pairs left commented out in Qwen's evaluation/grader.py::_test_math_equal that Math-Verify's
# transcription does not carry; labelled here by the project (label_by: paddock), see README.
QWEN_EXTRA = [
    {"gold": "33.3", "pred": "\\frac{100}{3}", "expected": True},
    {"gold": "(\\begin{pmatrix}0.29\\\\0.196\\\\-0.186\\\\\\end{pmatrix})",
     "pred": "\\begin{pmatrix}0.290243531202435\\\\0.196008371385084\\\\-0.186381278538813\\end{pmatrix}",
     "expected": True},
]


LIGHTEVAL_COMMIT = "16318bb4cc736cfb29d72eb31bd19c55d0283565"
LIGHTEVAL_PATH = "tests/unit/metrics/test_extractive_match.py"
LIGHTEVAL_SKIP = {"test_extraction_abc", "test_multilingual_extraction_abc"}   # option-index extraction, not math
NEMO_COMMIT = "0b012df8a09cd4730d31b16e90a0d8f13d145fb8"
NEMO_PATH = "tests/test_math_equal.py"
MV_MIXED_COMMIT = "05aa3a67e1e5aa4a0dbecea17550a17cc2d5ed2d"
# Math-Verify tests/test_mixed_number_extraction.py (commit above) asserts verify(parse(a), parse(b))
# inside test bodies rather than parametrize rows; these are its (gold, prediction, expected)
# statements, transcribed. Left out: rows that state a parser behaviour rather than a verdict
# ("11\n5/6" keeps 5, "4 4/9 2" reads 2, "11 6/6" is not 12).
MV_MIXED = [
    ("40/9", "The answer is 4 4/9.", True, "test_mixed_number_is_equivalent_to_improper_fraction"),
    ("4", "The answer is 4 4/9.", False, "test_mixed_number_does_not_match_only_its_whole_number_prefix"),
    ("11 + 4/9", "11 - 4/9", False, "test_explicit_addition_and_subtraction_remain_distinct"),
    ("40/9", "4 4/9", True, "test_parse_positive_mixed_number_as_complete_value"),
    ("-40/9", "-4 4/9", True, "test_parse_negative_mixed_number_as_negative_complete_value"),
    ("71/6", "11 5/6", True, "test_parse_mixed_number_with_optional_positive_sign[unsigned]"),
    ("71/6", "+11 5/6", True, "test_parse_mixed_number_with_optional_positive_sign[explicit-positive]"),
    ("4/9", "0 4/9", True, "test_parse_mixed_number_with_zero_whole_part"),
    ("4", "4 0/9", True, "test_parse_mixed_number_with_zero_numerator_as_whole_value"),
    ("9004/9", "1 000 4/9", True, "test_parse_mixed_number_with_spaced_thousands_whole_part"),
    ("4", "4 4/0", False, "test_invalid_mixed_number_has_no_finite_component_equivalence[zero-denominator]"),
    ("4", "4 0/0", False, "test_invalid_mixed_number_has_no_finite_component_equivalence[zero-over-zero]"),
    ("-4", "-4 0/0", False, "test_invalid_mixed_number_has_no_finite_component_equivalence[negative]"),
    ("1000", "1 000 0/0", False, "test_invalid_mixed_number_has_no_finite_component_equivalence[spaced-thousands]"),
    ("139/90", "11/10 4/9", False, "test_non_mixed_syntax_does_not_gain_an_implicit_operation[fractional-whole]"),
    ("103/9", "11.0 4/9", False, "test_non_mixed_syntax_does_not_gain_an_implicit_operation[decimal-whole]"),
    ("103/9", "(11) 4/9", False, "test_non_mixed_syntax_does_not_gain_an_implicit_operation[parenthesized-whole]"),
    ("71/6", "11\n5/6", False, "test_line_separator_does_not_form_a_mixed_number[newline]"),
    ("40/900", "4 4/9%", True, "test_mixed_number_percentage_applies_to_complete_value[symbol]"),
    ("40/9", "4 4/9%", False, "test_mixed_number_percentage_applies_to_complete_value[symbol]"),
    ("40/900", "4 4/9 percent", True, "test_mixed_number_percentage_applies_to_complete_value[spaced-percent]"),
    ("40/9", "4 + 4/9", True, "test_existing_expression_syntax_is_unchanged[sum]"),
    ("5", "10/2", True, "test_existing_expression_syntax_is_unchanged[fraction]"),
    ("5", "$5.00", True, "test_existing_expression_syntax_is_unchanged[currency-decimal]"),
    ("7/25", "28%", True, "test_existing_expression_syntax_is_unchanged[percentage]"),
]


def _lighteval_value(node: ast.AST):
    if isinstance(node, ast.Attribute):          # Language.FRENCH and the like
        return node.attr
    return ast.literal_eval(node)


def harvest_lighteval(git_dir: str, known: set[tuple[str, str]]) -> list[dict]:
    """lighteval's extractive-match rows with match types latex/expr, less those Math-Verify's
    suite already carries (same gold and prediction)."""
    tree = ast.parse(_show(git_dir, LIGHTEVAL_COMMIT, LIGHTEVAL_PATH))
    out = []
    for fn in (n for n in tree.body if isinstance(n, ast.FunctionDef) and n.name not in LIGHTEVAL_SKIP):
        for dec in fn.decorator_list:
            if not (isinstance(dec, ast.Call) and getattr(dec.func, "attr", "") == "parametrize"):
                continue
            names = [n.strip() for n in ast.literal_eval(dec.args[0]).split(",")]
            for i, elt in enumerate(dec.args[1].elts):
                row = dict(zip(names, (_lighteval_value(e) for e in elt.elts)))
                if (row["gold"], row["pred"]) in known:
                    continue
                out.append({"gold": row["gold"], "pred": row["pred"], "expected": bool(row["expected"]),
                            "origin": f"{LIGHTEVAL_PATH}::{fn.name}[{i}]"})
    return out


def harvest_nemo(git_dir: str) -> list[dict]:
    """NeMo-Skills' math_equal pairs; its test asserts each pair in both directions."""
    tree = ast.parse(_show(git_dir, NEMO_COMMIT, NEMO_PATH))
    out = []
    for fn in (n for n in tree.body if isinstance(n, ast.FunctionDef)):
        expected = fn.name == "test_correct_examples"
        for dec in fn.decorator_list:
            if not (isinstance(dec, ast.Call) and getattr(dec.func, "attr", "") == "parametrize"):
                continue
            for i, elt in enumerate(dec.args[1].elts):
                a, b = (_value(e) for e in elt.elts)
                for j, (gold, pred) in enumerate(((a, b), (b, a))):
                    if gold is None:
                        continue
                    out.append({"gold": str(gold), "pred": None if pred is None else str(pred),
                                "expected": expected, "origin": f"{NEMO_PATH}::{fn.name}[{i}]{'ab'[j]}"})
    return out


def main(argv: list[str]) -> int:
    mv_dir, hendrycks_dir, _qwen_dir = argv[:3]     # Qwen rows come via Math-Verify + QWEN_EXTRA
    mv, qwen = harvest_math_verify(mv_dir)
    for extra in QWEN_EXTRA:
        qwen.append({**extra, "origin": "evaluation/grader.py::_test_math_equal", "label_by": "paddock"})
    sets = {"math_verify": mv, "hendrycks": harvest_hendrycks(hendrycks_dir), "qwen": qwen}
    if len(argv) == 5:
        known = {(c["gold"], c["pred"]) for c in mv + qwen}
        sets["lighteval"] = harvest_lighteval(argv[3], known)
        sets["nemo_skills"] = harvest_nemo(argv[4])
        sets["mv_mixed"] = [{"gold": g, "pred": p, "expected": e, "origin": f"tests/test_mixed_number_extraction.py::{t}"}
                            for g, p, e, t in MV_MIXED]
    for name, cases in sets.items():
        with open(HERE / f"{name}.jsonl", "w", encoding="utf-8") as fh:
            for c in cases:
                fh.write(json.dumps(c, ensure_ascii=False) + "\n")
        print(name, len(cases), "must-reject:", sum(not c["expected"] for c in cases))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
