"""Rebuild the public labelled math cases (JSONL) from the source repositories' test files.

Reads test files as text and takes out their labelled (gold, prediction, expected) rows with
`ast` (literals only; nothing from the sources is imported or run except one f-string of
`math.sqrt`), so the stored cases can be checked against their origin. Usage:

    python tests/data/math_cases/harvest.py MATH_VERIFY_GIT_DIR HENDRYCKS_GIT_DIR QWEN_GIT_DIR

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


def main(argv: list[str]) -> int:
    mv_dir, hendrycks_dir, _qwen_dir = argv     # Qwen rows come via Math-Verify + QWEN_EXTRA
    mv, qwen = harvest_math_verify(mv_dir)
    for extra in QWEN_EXTRA:
        qwen.append({**extra, "origin": "evaluation/grader.py::_test_math_equal", "label_by": "paddock"})
    sets = {"math_verify": mv, "hendrycks": harvest_hendrycks(hendrycks_dir), "qwen": qwen}
    for name, cases in sets.items():
        with open(HERE / f"{name}.jsonl", "w", encoding="utf-8") as fh:
            for c in cases:
                fh.write(json.dumps(c, ensure_ascii=False) + "\n")
        print(name, len(cases), "must-reject:", sum(not c["expected"] for c in cases))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
