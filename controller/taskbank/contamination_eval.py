"""Measuring the contamination check on labelled pairs: recall, false-positive rate, calibration.

The labelled data (tests/data/contamination/pairs.jsonl, README there) has one row per
benchmark item: the held-out text, its contaminated `copy` (rephrased or translated), hard
`negatives` (different problems close to it), a `domain` (math | code | mmlu), a `variant`
(rephrase | translate-*) and a `split` (calib: used to choose thresholds; test: held out from
that choice, used to report).

Set-based, as the check runs: for a group of rows and a fold (0 or 1), the training set holds
the copies of every other row (starting at the fold) and the negatives of all rows; the
held-out set holds every row's held-out text; a held-out task is contaminated iff its copy is
in the training set. Both folds together score every row once as contaminated and once as
clean. `stage_scores` runs the real `check` with permissive thresholds and keeps each
held-out task's best score per stage; `calibrate` picks, per stage, the lowest threshold whose
false-positive rate on the calibration split stays within a target; `evaluate` gives recall and
FPR at given thresholds.

Must not import zmq.
"""
from __future__ import annotations

import dataclasses
import itertools
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Iterable, Sequence

from controller.contracts.safeload import load_jsonl
from controller.contracts.tasks import Task
from controller.taskbank import execution, importers, semantic
from controller.taskbank.bank import make_set
from controller.taskbank.contamination import ContaminationConfig, check

PAIRS_FILE = Path(__file__).resolve().parents[2] / "tests" / "data" / "contamination" / "pairs.jsonl"
SCORED_STAGES = ("minhash", "ngram", "semantic", "execution")
_DOCSTRING_END = re.compile(r'("""|\'\'\'|\*/)')


@dataclass(frozen=True)
class Scored:
    """One held-out task in one fold: its label and its best score per stage."""
    row_id: str
    domain: str
    variant: str
    contaminated: bool
    minhash: float
    ngram: float
    semantic: float           # best semantic score (code rows: of neighbours whose shapes compare)
    prose: float = -1.0       # code rows: best prose cosine of a neighbour whose shape does not compare
    execution: float = -1.0   # best semantic score of a neighbour that passed the tests; -1: none
    executed: bool = False    # the execution stage gave a verdict (pass or fail) on a neighbour

    def score(self, stage: str) -> float:
        return getattr(self, stage)


def load_pairs(path: str | Path = PAIRS_FILE) -> list[dict]:
    return load_jsonl(path)


def math_task(name: str, question: str) -> Task:
    """A math task shaped as the math importer makes it."""
    return Task(name=f"math/{name}", family="math", hidden={"answer.txt": "0"},
                instruction="Solve the following problem. Put only the final answer in "
                            "\\boxed{...}.\n\n" + question.strip(),
                checker={"kind": "math", "answer": "0"})


def code_task(name: str, code: str) -> Task:
    """A code task shaped as the HumanEval importer makes it: the prompt (the code up to the end
    of its first docstring or comment block) in the instruction and a stub, the whole code as
    the hidden reference."""
    marks = [m.end() for m in _DOCSTRING_END.finditer(code)]
    prompt = code[:marks[1]] if len(marks) >= 2 else code[:600]
    return Task(name=f"code/{name}", family="python",
                instruction="Complete the function in /work/solution.py so that it does what its "
                            "docstring says. Hidden tests check it.\n\n" + prompt,
                files={"solution.py": prompt + "\n    raise NotImplementedError\n"},
                hidden={"reference.py": code, "test_hidden.py": "def test_check():\n    pass\n"},
                checker={"kind": "pytest", "tests": ["test_hidden.py"]})


def to_task(row: dict, role: str, text: str) -> Task:
    """The row's held-out task (a code row's as the HumanEval importer makes it from its
    `humaneval` record, hidden tests included) or a training task of `text`."""
    name = f"{row['id']}-{role}"
    if row["domain"] != "code":
        return math_task(name, text)
    if role == "heldout" and row.get("humaneval"):
        return importers.humaneval_task(row["humaneval"], PAIRS_FILE, 0)
    return code_task(name, text)


def fold_sets(rows: Sequence[dict], fold: int) -> tuple[list[Task], list[Task], dict[str, bool]]:
    """(training tasks, held-out tasks, held-out task id -> contaminated) for one fold."""
    train, held, labels = [], [], {}
    for i, row in enumerate(rows):
        h = to_task(row, "heldout", row["heldout"])
        held.append(h)
        labels[h.task_id] = i % 2 == fold
        if labels[h.task_id]:
            train.append(to_task(row, "copy", row["copy"]))
        train.extend(to_task(row, f"neg{j}", neg) for j, neg in enumerate(row["negatives"]))
    return train, held, labels


def stage_scores(rows: Sequence[dict], embedder: semantic.Embedder | None = None,
                 cache_dir: str | Path | None = None,
                 cfg: ContaminationConfig | None = None,
                 executor: execution.Executor | None = None) -> list[Scored]:
    """Every row scored in both folds by the real check, thresholds permissive; with an
    executor, the execution stage too (every neighbour of the top k run, whatever its score)."""
    base = cfg or ContaminationConfig()
    # The code threshold is lowered with the prose one so that semantic scores keep their scale.
    loose = ContaminationConfig(**{**base.__dict__, "jaccard_threshold": 0.02,
                                   "overlap_threshold": 1.0, "cosine_threshold": 0.001,
                                   "code_cosine_threshold": 0.001,
                                   "code_prose_threshold": 0.001 * base.code_prose_threshold
                                   / base.code_cosine_threshold,
                                   "code_cosine_alone": 0.001,
                                   "code_prose_alone": 0.001 * base.code_prose_alone
                                   / base.code_cosine_alone,
                                   "semantic_top_k": 1, "judge": None,
                                   "execution": None if base.execution is None else
                                   execution.ExecutionConfig(**{**base.execution.__dict__,
                                                                "min_score": 0.0})})
    by_id = {to_task(r, "heldout", r["heldout"]).task_id: r for r in rows}
    out = []
    for fold in (0, 1):
        train, held, labels = fold_sets(rows, fold)
        report = check(make_set("train", train), make_set("held", held, "heldout"), loose,
                       embedder=embedder, cache_dir=cache_dir, executor=executor)
        if "semantic" in report.skipped:
            raise semantic.SemanticUnavailable(report.skipped["semantic"])
        best: dict[str, dict[str, float]] = {h.task_id: {"minhash": 0.0, "ngram": 0.0,
                                                         "semantic": 0.0, "execution": -1.0,
                                                         "prose": -1.0}
                                             for h in held}
        executed: dict[str, bool] = {}
        for s in report.suspects:
            b = best[s.heldout_id]
            b["minhash"] = max(b["minhash"], s.jaccard or 0.0)
            b["ngram"] = max(b["ngram"], s.ngram_overlap)
            if by_id[s.heldout_id]["domain"] == "code" and s.structure is None:
                b["prose"] = max(b["prose"], s.cosine or 0.0)   # compared with code_prose_threshold
            else:
                b["semantic"] = max(b["semantic"], s.semantic_score or 0.0)
            if s.execution is not None:
                executed[s.heldout_id] = True
            if s.execution == "pass":
                b["execution"] = max(b["execution"], s.semantic_score or 0.0)
        out.extend(Scored(by_id[tid]["id"], by_id[tid]["domain"], by_id[tid]["variant"],
                          labels[tid], **best[tid], executed=executed.get(tid, False))
                   for tid in labels)
    return out


def rates(scored: Iterable[Scored], flagged) -> tuple[float, float, int, int]:
    """(recall, false-positive rate, positives, negatives) of a predicate over Scored."""
    scored = list(scored)
    pos = [s for s in scored if s.contaminated]
    neg = [s for s in scored if not s.contaminated]
    recall = sum(map(flagged, pos)) / len(pos) if pos else float("nan")
    fpr = sum(map(flagged, neg)) / len(neg) if neg else float("nan")
    return recall, fpr, len(pos), len(neg)


def calibrate(scored: Sequence[Scored], stage: str, max_fpr: float) -> float:
    """The lowest threshold (rounded up to 0.01) whose FPR on `scored` is at most `max_fpr`."""
    for t100 in range(1, 101):
        t = t100 / 100
        if rates(scored, lambda s: s.score(stage) >= t)[1] <= max_fpr:
            return t
    return 1.0


def threshold(thresholds: dict[str, float], stage: str, domain: str, executed: bool = False) -> float:
    """A stage's threshold for a row; `semantic_code` applies to code rows the execution stage
    gave a verdict on, `semantic_code_alone` to the others."""
    if stage == "semantic" and domain == "code":
        key = "semantic_code" if executed else "semantic_code_alone"
        return thresholds.get(key, thresholds.get("semantic_code", thresholds["semantic"]))
    return thresholds[stage]


def flag_stage(thresholds: dict[str, float], stage: str):
    """The stage's decision on a row; a code row's semantic stage also flags a prose-only
    neighbour at or above `semantic_prose` (`semantic_prose_alone` without an execution
    verdict: the check's `code_prose_threshold`, `code_prose_alone`)."""
    def flag(s: Scored) -> bool:
        if stage == "semantic" and s.domain == "code":
            key = "semantic_prose" if s.executed else "semantic_prose_alone"
            if s.prose >= thresholds.get(key, thresholds.get("semantic_prose", 2.0)):
                return True
        return s.score(stage) >= threshold(thresholds, stage, s.domain, s.executed)
    return flag


def flag_any(thresholds: dict[str, float]):
    """The check's decision at these thresholds: any stage at or above its threshold."""
    return lambda s: any(flag_stage(thresholds, st)(s) for st in SCORED_STAGES)


def defaults(cfg: ContaminationConfig | None = None) -> dict[str, float]:
    cfg = cfg or ContaminationConfig()
    return {"minhash": cfg.jaccard_threshold, "ngram": cfg.overlap_threshold,
            "semantic": cfg.cosine_threshold, "semantic_code": cfg.code_cosine_threshold,
            "semantic_prose": cfg.code_prose_threshold,
            "semantic_code_alone": cfg.code_cosine_alone, "semantic_prose_alone": cfg.code_prose_alone,
            "execution": cfg.execution.min_score if cfg.execution is not None else 2.0}


def calibrate_all(calib: Sequence[Scored], max_fpr: float) -> dict[str, float]:
    """Per stage on the pooled calibration rows; the semantic stage per domain (math, code). For
    code, on a grid of 0.02 (highest recall with FPR at most `max_fpr` on the code rows, the
    highest thresholds among equals): first the two semantic thresholds (shape-blended and
    prose-only) for rows without an execution verdict, from the semantic stage alone on every
    code row; then, with those fixed, the two for rows with a verdict and the execution
    threshold, chosen together."""
    fitted = {st: calibrate(calib, st, max_fpr) for st in SCORED_STAGES}
    fitted["semantic"] = calibrate([s for s in calib if s.domain != "code"], "semantic", max_fpr)
    code = [s for s in calib if s.domain == "code"]
    fitted["semantic_code"] = calibrate(code, "semantic", max_fpr)

    def search(rows, keys, grids, stages):
        best = None
        for values in itertools.product(*grids):
            th = {**fitted, **{k: v / 100 for k, v in zip(keys, values)}}
            flags = [flag_stage(th, st) for st in stages]
            recall, fpr, _, _ = rates(rows, lambda s, flags=flags: any(f(s) for f in flags))
            if fpr <= max_fpr and (best is None or (recall, *values) >= best[0]):
                best = ((recall, *values), th)
        return fitted if best is None else best[1]
    alone = [dataclasses.replace(s, executed=False) for s in code]
    fitted = search(alone, ("semantic_code_alone", "semantic_prose_alone"),
                    (range(40, 101, 2), range(50, 101, 2)), ("semantic",))
    if any(s.executed for s in code):
        fitted = search(code, ("semantic_code", "semantic_prose", "execution"),
                        (range(40, 101, 2), range(50, 101, 2), range(0, 101, 2)),
                        ("semantic", "execution"))
    return fitted
