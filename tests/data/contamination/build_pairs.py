"""Rebuild pairs.jsonl from the public sources (see README.md): not run by the tests.

    python tests/data/contamination/build_pairs.py LLM_DECONTAMINATOR_GIT GSM8K_GIT HUMAN_EVAL_GIT > pairs.jsonl

The arguments are git directories (bare clones are fine): lm-sys/llm-decontaminator,
openai/grade-school-math and openai/human-eval (whose `prompt`, `test` and `entry_point` make
the held-out code task as the HumanEval importer makes it, hidden tests included). The math hard negatives are the two GSM8K *train* questions nearest
to each held-out question under the semantic stage's own embedder (the hardest negatives for
it), so building needs the `paddock[semantic]` extra.
"""
from __future__ import annotations

import csv
import gzip
import io
import json
import subprocess
import sys

from controller.taskbank.semantic import load_embedder, nearest

N_MATH = 400
N_MMLU = 100


def _git_show(gitdir: str, path: str) -> str:
    return subprocess.run(["git", "--git-dir", gitdir, "show", f"HEAD:{path}"], check=True,
                          capture_output=True, text=True).stdout


def _jsonl(gitdir: str, path: str) -> list[dict]:
    return [json.loads(line) for line in _git_show(gitdir, path).splitlines() if line.strip()]


def _split(i: int) -> str:
    return "calib" if i % 2 == 0 else "test"


def math_rows(decon: str, gsm: str) -> list[dict]:
    test = _jsonl(gsm, "grade_school_math/data/test.jsonl")
    train = [r["question"] for r in _jsonl(gsm, "grade_school_math/data/train.jsonl")]
    reph = _jsonl(decon, "data/rephrase/rephrase_gsm8k.jsonl")
    emb = load_embedder()
    held = [r["question"] for r in test[:N_MATH]]
    idx, _ = nearest(emb.embed(held), emb.embed(train), k=2)
    rows = []
    for i, (orig, r) in enumerate(zip(test[:N_MATH], reph)):
        q, _, ans = r["text"].removeprefix("Question: ").partition("\nAnswer:")
        assert ans.strip().split()[-1] == orig["answer"].split("####")[-1].strip(), i
        rows.append({"id": f"gsm8k-test-{i:04d}", "domain": "math", "variant": "rephrase",
                     "split": _split(i), "heldout": orig["question"], "copy": q.strip(),
                     "negatives": [train[j] for j in idx[i]]})
    return rows


def code_rows(decon: str, human_eval: str) -> list[dict]:
    orig = [r["text"] for r in _jsonl(decon, "data/test/HumanEval.jsonl")]
    raw = subprocess.run(["git", "--git-dir", human_eval, "show", "HEAD:data/HumanEval.jsonl.gz"],
                         check=True, capture_output=True).stdout
    he = [json.loads(line) for line in gzip.decompress(raw).decode().splitlines() if line.strip()]
    reph = [r["text"] for r in _jsonl(decon, "data/rephrase/humaneval_python.jsonl")]
    c = [r["text"] for r in _jsonl(decon, "data/rephrase/humaneval_c.jsonl")]
    js = [r["text"] for r in _jsonl(decon, "data/rephrase/humaneval_js.jsonl")]
    db = _jsonl(decon, "data/database/CodeAlpacaDB.jsonl")
    rows = []
    for i, text in enumerate(orig):
        assert db[i]["test"].strip() == text.strip(), i
        assert (he[i]["prompt"] + he[i]["canonical_solution"]).strip() == text.strip(), i
        negs = [t for t, judged in zip(db[i]["train"], db[i]["results"]) if not judged][:2]
        base = {"domain": "code", "split": _split(i), "heldout": text,
                "humaneval": {k: he[i][k] for k in ("task_id", "prompt", "canonical_solution",
                                                    "test", "entry_point")}}
        rows.append({**base, "id": f"humaneval-{i:03d}", "variant": "rephrase",
                     "copy": reph[i], "negatives": negs})
        rows.append({**base, "id": f"humaneval-{i:03d}-c", "variant": "translate-c",
                     "copy": c[i], "negatives": []})
        rows.append({**base, "id": f"humaneval-{i:03d}-js", "variant": "translate-js",
                     "copy": js[i], "negatives": []})
    return rows


def mmlu_rows(decon: str) -> list[dict]:
    table = list(csv.reader(io.StringIO(_git_show(decon, "data/rephrase/sociology_test.csv"))))
    zh = _jsonl(decon, "data/rephrase/sociology_test_chinese_filtered_question.jsonl")
    rows = []
    for i, (rec, z) in enumerate(zip(table[:N_MMLU], zh)):
        q = rec[0] + "\n" + "\n".join(f"{k}. {v}" for k, v in zip("ABCD", rec[1:5]))
        rows.append({"id": f"mmlu-sociology-{i:03d}-zh", "domain": "mmlu",
                     "variant": "translate-zh", "split": _split(i), "heldout": q,
                     "copy": z["text"], "negatives": []})
    return rows


def main(argv: list[str]) -> int:
    decon, gsm, human_eval = argv
    for row in math_rows(decon, gsm) + code_rows(decon, human_eval) + mmlu_rows(decon):
        if not row["copy"].strip():     # a few rephrasings in the source are empty
            continue
        print(json.dumps(row, ensure_ascii=False))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
