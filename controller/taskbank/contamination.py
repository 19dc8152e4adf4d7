"""Contamination check between a training set and a held-out set.

Four stages over each task's *text* (instruction + visible text files + hidden text files):

- **Near duplicates** (`minhash`): MinHash signatures of word shingles indexed in a MinHash
  LSH (datasketch); each held-out task queries the index, and every candidate training task
  gets its estimated Jaccard similarity. Pairs at or above `jaccard_threshold` are suspects.
- **Exact n-gram overlap** (`ngram`): every word n-gram of the training set goes into one Bloom
  filter (rbloom); a held-out task's overlap is the fraction of its n-grams found in the filter.
  A task at or above `overlap_threshold` is a suspect even when no single training task is
  near it (text stitched from several tasks). The Bloom filter's false-positive rate
  (`bloom_fp_rate`) bounds how much it can overstate overlap.
- **Semantic** (`semantic`, controller/taskbank/semantic.py): sentence embeddings of each task
  (instruction + reference solution); each held-out task's `semantic_top_k` nearest training
  tasks by cosine similarity; pairs at or above `cosine_threshold` are suspects. This is the
  stage that catches rephrased copies, which share few n-grams. A held-out code task (family
  in CODE_FAMILIES) is scored on its prose view, and its score blends that cosine with the
  structural containment of its code in the neighbour's (codetext.structure_grams), weight
  `code_structure_weight`, against `code_cosine_threshold`. It needs the optional extra
  `paddock[semantic]`; without it the stage is skipped and the report says why.
- **Execution** (`execution`, controller/taskbank/execution.py): a held-out code task's own
  hidden tests run, in a sandbox, against the code of its `execution.top_k` nearest training
  neighbours (semantic score at least `execution.min_score`); a neighbour that passes them
  (the task's reference passing and a null solution failing in the same runner) is a suspect.
  Needs an `Executor` (the CLI's runs the farm's sandbox); without one the stage is skipped and
  the report says so.
- **Judge** (`judge`, controller/taskbank/judge.py, off by default): the top candidate pairs
  (suspects, and semantic near-misses at or above `judge.min_cosine`) go to an
  OpenAI-compatible model through the verifier's judge hook; its verdict and reason are in
  the report, and a near-miss it calls a copy becomes a suspect.

The default thresholds are calibrated on public labelled pairs (tests/data/contamination,
`benchmarks/contamination.py`; docs/tasks.md gives the recall and false-positive rates).

Suspects are reported, not removed: the report names both tasks and every score. Runs
automatically when a held-out set is imported into a bank that holds training sets;
`quarantine_suspects` quarantines the suspect held-out tasks (curriculum quarantine) when the
user asks.

Must not import zmq.
"""
from __future__ import annotations

import functools
import hashlib
import json
import logging
import re
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Iterable

from datasketch import MinHash, MinHashLSH
from rbloom import Bloom

from controller.contracts.tasks import Task, TaskSet
from controller.taskbank import codetext, execution, semantic
from controller.taskbank.curriculum import Curriculum
from controller.taskbank.judge import JudgeConfig, judge_pair

log = logging.getLogger(__name__)

_WORD = re.compile(r"[a-z0-9_]+")
STAGES = ("minhash", "ngram", "semantic", "execution", "judge")
CODE_FAMILIES = ("python", "swe")     # held-out tasks judged by `code_cosine_threshold`


@dataclass(frozen=True)
class ContaminationConfig:
    shingle_words: int = 5
    num_perm: int = 128
    jaccard_threshold: float = 0.5
    ngram_words: int = 8
    overlap_threshold: float = 0.5
    bloom_fp_rate: float = 0.001
    include_hidden: bool = True
    semantic: bool = True             # run the semantic stage when the extra is installed
    cosine_threshold: float = 0.82        # calibrated on rephrased GSM8K (docs/tasks.md)
    code_cosine_threshold: float = 0.78   # of `semantic_score`, for held-out code tasks (CODE_FAMILIES)
    code_structure_weight: float = 0.5    # of structural containment in `semantic_score`
    code_prose_threshold: float = 1.0     # of the prose cosine alone, where shapes do not compare
    # The two code thresholds for a held-out code task the execution stage gave no verdict on
    # (no sandbox, no tests it can run): calibrated on the semantic stage alone.
    code_cosine_alone: float = 0.54
    code_prose_alone: float = 0.62
    semantic_top_k: int = 1           # nearest training tasks reported per held-out task
    code_view: bool = True            # code tasks scored on their prose view (codetext.py)
    max_tokens: int = 128             # of each task's text (MiniLM's training length)
    judge: JudgeConfig | None = None  # off by default
    # On by default; runs when `check` is given an executor (a sandbox). None: off.
    execution: execution.ExecutionConfig | None = execution.ExecutionConfig()

    def cosine_for(self, family: str, executed: bool = True) -> float:
        """The semantic threshold of a held-out task; for a code task, whether or not the
        execution stage gave a verdict on it (`executed`)."""
        if family not in CODE_FAMILIES:
            return self.cosine_threshold
        return self.code_cosine_threshold if executed else self.code_cosine_alone

    def semantic_score(self, family: str, cosine: float, structure: float | None,
                       executed: bool = True) -> float:
        """What the semantic stage compares with `cosine_for(family, executed)`: the cosine;
        for a held-out code task (1 - w) * cosine + w * structure, w = `code_structure_weight`;
        for a code task whose neighbour's shape does not compare (structure None: one of the
        two is not Python, or has no code) the prose cosine scaled so that reaching the prose
        threshold (`code_prose_threshold`, or `code_prose_alone`) reaches the code one."""
        if family not in CODE_FAMILIES:
            return cosine
        if structure is None:
            return cosine * (self.code_cosine_threshold / self.code_prose_threshold if executed
                             else self.code_cosine_alone / self.code_prose_alone)
        w = self.code_structure_weight
        return (1.0 - w) * cosine + w * structure

    def __post_init__(self) -> None:
        for key in ("jaccard_threshold", "overlap_threshold", "cosine_threshold",
                    "code_cosine_threshold", "code_prose_threshold", "code_cosine_alone",
                    "code_prose_alone"):
            v = getattr(self, key)
            if not 0.0 < v <= 1.0:
                raise ValueError(f"contamination: {key!r} must be in (0, 1], got {v!r}")
        for key in ("shingle_words", "num_perm", "ngram_words", "semantic_top_k", "max_tokens"):
            if getattr(self, key) < 1:
                raise ValueError(f"contamination: {key!r} must be >= 1")
        if not 0.0 <= self.code_structure_weight < 1.0:
            raise ValueError("contamination: 'code_structure_weight' must be in [0, 1)")
        if not 0.0 < self.bloom_fp_rate < 0.5:
            raise ValueError("contamination: 'bloom_fp_rate' must be in (0, 0.5)")


@dataclass(frozen=True)
class Suspect:
    heldout_id: str
    heldout_name: str
    train_id: str | None          # None: n-gram overlap with the training set as a whole
    train_name: str | None
    jaccard: float | None         # MinHash estimate for the pair
    ngram_overlap: float          # fraction of the held-out task's n-grams seen in training
    cosine: float | None = None   # embedding cosine similarity for the pair
    structure: float | None = None   # code tasks: containment of the held-out code's shape
    semantic_score: float | None = None   # what the semantic threshold is compared with
    stages: tuple[str, ...] = ()  # which stages flagged it
    judge_verdict: str | None = None   # contaminated | clean | error; None: not judged
    judge_reason: str | None = None
    execution: str | None = None  # pass | fail: the held-out tests run on the training code; None: not run
    execution_detail: str | None = None   # the binding that passed, or why there is no verdict

    def score(self) -> float:
        semantic_score = self.cosine if self.semantic_score is None else self.semantic_score
        return max(self.jaccard or 0.0, semantic_score or 0.0)


@dataclass
class Report:
    train_set: str
    heldout_set: str
    train_hash: str
    heldout_hash: str
    config: ContaminationConfig
    suspects: list[Suspect] = field(default_factory=list)
    checked: int = 0
    skipped: dict[str, str] = field(default_factory=dict)     # stage -> why it did not run
    seconds: dict[str, float] = field(default_factory=dict)   # stage -> wall time
    embedded: dict[str, int] = field(default_factory=dict)    # texts embedded, found cached
    executed: dict[str, int] = field(default_factory=dict)    # execution stage counts

    def summary_line(self) -> str:
        line = (f"contamination {self.heldout_set} vs {self.train_set}: {len(self.suspects)} "
                f"suspect(s) among {self.checked} held-out tasks")
        for stage in ("semantic", "execution"):
            if stage in self.skipped:
                line += f" ({stage} stage skipped: {self.skipped[stage]})"
        return line

    def to_json(self) -> dict:
        return {"train_set": self.train_set, "heldout_set": self.heldout_set,
                "train_hash": self.train_hash, "heldout_hash": self.heldout_hash,
                "config": asdict(self.config), "checked": self.checked,
                "skipped": self.skipped, "seconds": {k: round(v, 3) for k, v in self.seconds.items()},
                "embedded": self.embedded, "executed": self.executed,
                "suspects": [asdict(s) for s in self.suspects]}


def format_suspect(s: Suspect) -> str:
    """One line of the human-readable report."""
    other = s.train_name or "(training set as a whole)"
    jac = "n/a" if s.jaccard is None else f"{s.jaccard:.3f}"
    line = f"  {s.heldout_name}  ~  {other}  jaccard {jac}  ngram_overlap {s.ngram_overlap:.3f}"
    if s.cosine is not None:
        line += f"  cosine {s.cosine:.3f}"
    if s.structure is not None:
        line += f"  structure {s.structure:.3f}  code_score {s.semantic_score:.3f}"
    if s.execution is not None:
        line += f"  execution {s.execution} ({s.execution_detail})"
    if s.judge_verdict is not None:
        line += f"  judge {s.judge_verdict}: {(s.judge_reason or '').splitlines()[-1:] or ''}"
    return line


def task_words(task: Task, include_hidden: bool = True) -> list[str]:
    parts = [task.instruction]
    trees = [task.files] + ([task.hidden] if include_hidden else [])
    for tree in trees:
        for rel in sorted(tree):
            if isinstance(tree[rel], str) and not rel.startswith(".git/"):
                parts.append(tree[rel])
    return _WORD.findall("\n".join(parts).lower())


def ngrams(words: list[str], n: int) -> list[str]:
    if len(words) < n:
        return [" ".join(words)] if words else []
    return [" ".join(words[i:i + n]) for i in range(len(words) - n + 1)]


def _minhash(words: list[str], cfg: ContaminationConfig) -> MinHash:
    m = MinHash(num_perm=cfg.num_perm, seed=1)
    grams = ngrams(words, cfg.shingle_words)
    if grams:
        m.update_batch([g.encode() for g in grams])
    return m


def _bloom_key(gram: str) -> int:
    # Stable across processes (Python's str hash is salted per process).
    return int.from_bytes(hashlib.blake2b(gram.encode(), digest_size=16).digest(), "big", signed=True)


# -- the stages -----------------------------------------------------------------------------

@dataclass
class _Pair:
    jaccard: float | None = None
    cosine: float | None = None
    structure: float | None = None


def _lexical(train_list: list[Task], held_list: list[Task], cfg: ContaminationConfig,
             ids: dict[int, str]) -> tuple[dict[str, dict[str, _Pair]], dict[str, float]]:
    """MinHash pairs at or above the Jaccard threshold, and each held-out task's n-gram overlap."""
    lsh = MinHashLSH(threshold=cfg.jaccard_threshold, num_perm=cfg.num_perm)
    hashes: dict[str, MinHash] = {}
    train_grams: dict[str, set[str]] = {}
    for t in train_list:
        words, tid = task_words(t, cfg.include_hidden), ids[id(t)]
        if tid not in hashes:
            hashes[tid] = _minhash(words, cfg)
            lsh.insert(tid, hashes[tid])
        train_grams[tid] = set(ngrams(words, cfg.ngram_words))
    expected = max(sum(len(g) for g in train_grams.values()), 1)
    bloom = Bloom(expected, cfg.bloom_fp_rate, _bloom_key)
    for grams in train_grams.values():
        bloom.update(grams)
    pairs: dict[str, dict[str, _Pair]] = {}
    overlaps: dict[str, float] = {}
    for h in held_list:
        words = task_words(h, cfg.include_hidden)
        grams = set(ngrams(words, cfg.ngram_words))
        overlaps[ids[id(h)]] = (sum(g in bloom for g in grams) / len(grams)) if grams else 0.0
        mh = _minhash(words, cfg)
        found = pairs.setdefault(ids[id(h)], {})
        for tid in sorted(lsh.query(mh)):
            j = mh.jaccard(hashes[tid])
            if j >= cfg.jaccard_threshold:
                found[tid] = _Pair(jaccard=round(j, 4))
    return pairs, overlaps


@functools.lru_cache(maxsize=4)
def default_embedder(max_tokens: int) -> semantic.Embedder:
    """One embedder per process and max_tokens (loading the model takes a moment)."""
    return semantic.load_embedder(max_tokens)


def _semantic(train_list: list[Task], held_list: list[Task], cfg: ContaminationConfig,
              embedder: semantic.Embedder, cache_dir: Path | None, ids: dict[int, str],
              stats: semantic.EmbedStats | None = None) -> dict[str, list[tuple[str, float, float | None]]]:
    """Each held-out task's nearest training tasks: [(train_id, cosine, structure)], best
    first by cosine; structure (codetext.containment) for a held-out code task and a
    neighbour whose codes both parse as Python, else None."""
    cache = (semantic.EmbeddingCache(cache_dir, embedder.model_id, cfg.max_tokens)
             if cache_dir is not None else None)
    tasks = train_list + held_list
    vecs = semantic.task_vectors(embedder, tasks, cache,
                                 semantic.TEXT_WEIGHT if cfg.code_view else None,
                                 stats=stats, split=len(train_list))
    k = cfg.semantic_top_k if cfg.execution is None else max(cfg.semantic_top_k, cfg.execution.top_k)
    idx, sims = semantic.nearest(vecs[len(train_list):], vecs[:len(train_list)], k)
    grams: dict[int, frozenset[str] | None] = {}

    def shape(j: int) -> frozenset[str] | None:   # a training task's grams, when asked for
        if j not in grams:
            code = codetext.task_code(train_list[j])
            grams[j] = codetext.structure_grams(code) \
                if code is not None and codetext.is_python(code) else None
        return grams[j]

    out: dict[str, list[tuple[str, float, float | None]]] = {}
    for h, row, srow in zip(held_list, idx, sims):
        code = codetext.task_code(h) if h.family in CODE_FAMILIES else None
        held_grams = codetext.structure_grams(code) \
            if code is not None and codetext.is_python(code) else None
        found = []
        for j, c in zip(row, srow):
            train_grams = shape(int(j)) if held_grams is not None else None
            structure = None if train_grams is None else \
                round(codetext.containment(held_grams, train_grams), 4)
            found.append((ids[id(train_list[j])], round(float(c), 4), structure))
        out[ids[id(h)]] = found
    return out


def _judge(suspects: list[Suspect], near: list[Suspect], cfg: JudgeConfig,
           texts: dict[str, str]) -> list[Suspect]:
    """Judge the top candidates; return the suspects (with verdicts) plus near-misses judged copies."""
    candidates = sorted((s for s in suspects if s.train_id is not None), key=lambda s: -s.score())
    candidates += sorted(near, key=lambda s: -s.score())
    judged: dict[tuple[str, str | None], Suspect] = {}
    for s in candidates[:cfg.top_k]:
        verdict, reason = judge_pair(cfg, texts[s.heldout_id], texts[s.train_id])
        log.info("contamination judge heldout=%s train=%s verdict=%s", s.heldout_name,
                 s.train_name, verdict)
        judged[(s.heldout_id, s.train_id)] = _with(s, judge_verdict=verdict, judge_reason=reason)
    out = [judged.get((s.heldout_id, s.train_id), s) for s in suspects]
    out += [_with(judged[(s.heldout_id, s.train_id)], stages=("judge",)) for s in near
            if judged.get((s.heldout_id, s.train_id), s).judge_verdict == "contaminated"]
    return out


def _with(s: Suspect, **changes) -> Suspect:
    return Suspect(**{**asdict(s), **changes})


def check(train: TaskSet, heldout: TaskSet, cfg: ContaminationConfig | None = None,
          train_tasks: Iterable[Task] | None = None,
          heldout_tasks: Iterable[Task] | None = None,
          embedder: semantic.Embedder | None = None,
          cache_dir: str | Path | None = None,
          executor: execution.Executor | None = None) -> Report:
    """Suspected contamination of `heldout` (its held-out split, or all its tasks) by `train`.

    `embedder` replaces the default model (tests); `cache_dir` keeps embeddings across runs;
    `executor` runs the execution stage's sandbox (none: the stage is skipped).
    """
    cfg = cfg or ContaminationConfig()
    t0 = time.monotonic()
    # A task id is a hash of the whole task (about 0.5 ms): computed once per task, here.
    ids: dict[int, str] = {}
    train_list = list(train_tasks) if train_tasks is not None else _split(train, "train", ids)
    held_list = list(heldout_tasks) if heldout_tasks is not None else _split(heldout, "heldout", ids)
    ids.update((id(t), t.task_id) for t in train_list + held_list if id(t) not in ids)
    report = Report(train.name, heldout.name, train.manifest_hash, heldout.manifest_hash, cfg)
    report.seconds["task ids"] = time.monotonic() - t0
    t0 = time.monotonic()
    pairs, overlaps = _lexical(train_list, held_list, cfg, ids)
    report.seconds["lexical"] = time.monotonic() - t0
    nearest = _run_semantic(report, train_list, held_list, cfg, embedder, cache_dir, ids)
    names = {ids[id(t)]: t.name for t in train_list}
    ran = _run_execution(report, train_list, held_list, nearest, cfg, executor, ids)
    suspects, near = _merge(held_list, pairs, overlaps, nearest, names, cfg, ids, ran)
    if cfg.judge is not None:
        t0 = time.monotonic()
        texts = {ids[id(t)]: semantic.task_text(t) for t in train_list + held_list}
        suspects = _judge(suspects, near, cfg.judge, texts)
        report.seconds["judge"] = time.monotonic() - t0
    else:
        report.skipped["judge"] = "off (no judge configured)"
    report.checked = len(held_list)
    report.suspects = sorted(suspects, key=lambda s: (-s.score(), -s.ngram_overlap, s.heldout_name))
    return report


def _run_semantic(report: Report, train_list: list[Task], held_list: list[Task],
                  cfg: ContaminationConfig, embedder: semantic.Embedder | None,
                  cache_dir: str | Path | None, ids: dict[int, str]
                  ) -> dict[str, list[tuple[str, float, float | None]]]:
    if not cfg.semantic:
        report.skipped["semantic"] = "off (semantic = False)"
        return {}
    if not train_list or not held_list:
        return {}
    try:
        embedder = embedder or default_embedder(cfg.max_tokens)
    except semantic.SemanticUnavailable as exc:
        log.warning("contamination: semantic stage skipped: %s", exc)
        report.skipped["semantic"] = str(exc)
        return {}
    t0 = time.monotonic()
    stats = semantic.EmbedStats()
    found = _semantic(train_list, held_list, cfg, embedder,
                      Path(cache_dir) if cache_dir is not None else None, ids, stats)
    report.seconds["semantic"] = time.monotonic() - t0
    report.seconds["semantic: embedding"] = stats.seconds
    report.embedded = {"embedded": stats.embedded, "cached": stats.cached}
    return found


def _run_execution(report: Report, train_list: list[Task], held_list: list[Task],
                   nearest: dict[str, list[tuple[str, float, float | None]]],
                   cfg: ContaminationConfig, executor: execution.Executor | None,
                   ids: dict[int, str]) -> dict[tuple[str, str], execution.Outcome]:
    """The execution stage's outcome per (held-out id, training id) of code tasks' neighbours."""
    if cfg.execution is None:
        report.skipped["execution"] = "off (execution = None)"
        return {}
    code_held = [h for h in held_list if h.family in CODE_FAMILIES]
    if not code_held or not nearest:
        return {}
    if executor is None:
        report.skipped["execution"] = "no sandbox to run tests in (no executor given)"
        return {}
    by_id = {ids[id(t)]: t for t in train_list}
    pairs = [(h, [(by_id[tid], cfg.semantic_score(h.family, cos, structure))
                  for tid, cos, structure in nearest.get(ids[id(h)], [])]) for h in code_held]
    try:
        outcomes, counts, seconds = execution.judge(pairs, cfg.execution, executor)
    except execution.ExecutionUnavailable as exc:
        log.warning("contamination: execution stage skipped: %s", exc)
        report.skipped["execution"] = str(exc)
        return {}
    report.seconds["execution"] = seconds
    report.executed = counts
    return {(ids[id(h)], ids[id(t)]): o for h, ts in pairs for t, _ in ts
            if (o := outcomes.get((id(h), id(t)))) is not None}


def _merge(held_list: list[Task], pairs: dict[str, dict[str, _Pair]], overlaps: dict[str, float],
           nearest: dict[str, list[tuple[str, float, float | None]]], names: dict[str, str],
           cfg: ContaminationConfig, ids: dict[int, str],
           ran: dict[tuple[str, str], execution.Outcome]) -> tuple[list[Suspect], list[Suspect]]:
    """(suspects, semantic near-misses for the judge), one entry per held-out/training pair."""
    suspects: list[Suspect] = []
    near: list[Suspect] = []
    judge_floor = cfg.judge.min_cosine if cfg.judge is not None else 1.1
    for h in held_list:
        hid = ids[id(h)]
        found = dict(pairs.get(hid, {}))
        for rank, (tid, cos, structure) in enumerate(nearest.get(hid, [])):
            run = ran.get((hid, tid))
            if rank >= cfg.semantic_top_k and (run is None or run.verdict != "pass"):
                continue        # neighbours past the reported ones count only by execution
            pair = found.setdefault(tid, _Pair())
            pair.cosine, pair.structure = cos, structure
        overlap = round(overlaps[hid], 4)
        executed = any(ran.get((hid, tid)) is not None and ran[(hid, tid)].verdict is not None
                       for tid, _, _ in nearest.get(hid, []))
        cosine_threshold = cfg.cosine_for(h.family, executed)
        flagged = []
        for tid in sorted(found):
            p = found[tid]
            score = None if p.cosine is None else \
                round(cfg.semantic_score(h.family, p.cosine, p.structure, executed), 4)
            stages = tuple(st for st, hit in (
                ("minhash", p.jaccard is not None and p.jaccard >= cfg.jaccard_threshold),
                ("ngram", overlap >= cfg.overlap_threshold),
                ("semantic", score is not None and score >= cosine_threshold)) if hit)
            run = ran.get((hid, tid))
            if run is not None and run.verdict == "pass":
                stages += ("execution",)
            s = Suspect(hid, h.name, tid, names[tid], p.jaccard, overlap, p.cosine,
                        p.structure, score, stages,
                        execution=run.verdict if run else None,
                        execution_detail=run.detail if run else None)
            if {"minhash", "semantic", "execution"} & set(stages):
                flagged.append(s)
            elif score is not None and score >= judge_floor:
                near.append(s)
        if not flagged and overlap >= cfg.overlap_threshold:
            flagged.append(Suspect(hid, h.name, None, None, None, overlap, stages=("ngram",)))
        suspects.extend(flagged)
    return suspects, near


def _split(ts: TaskSet, split: str, ids: dict[int, str]) -> list[Task]:
    """The tasks of `split`; a set with no task in that split counts as wholly that split.
    Adds each task's id to `ids` (by the task object's identity)."""
    want_heldout = split == "heldout"
    ids.update((id(t), t.task_id) for t in ts.tasks)
    chosen = [t for t in ts.tasks if (ids[id(t)] in ts.heldout) == want_heldout]
    return chosen or list(ts.tasks)


def write_report(bank, report: Report) -> Path:
    directory = Path(bank.root) / "contamination"
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / f"{report.heldout_set}--{report.train_set}.json"
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(report.to_json(), indent=1))
    tmp.replace(path)
    return path


def quarantine_suspects(bank, reports: Iterable[Report], db_path: str | Path | None = None
                        ) -> dict[str, str]:
    """Quarantine every suspect held-out task (not judged clean) in the bank's curriculum;
    return task id -> reason. The quarantine holds until `Curriculum.release`."""
    reasons: dict[str, str] = {}
    for r in reports:
        for s in r.suspects:
            if s.judge_verdict == "clean" or s.heldout_id in reasons:
                continue
            scores = ", ".join(f"{k} {v:.3f}" for k, v in (("cosine", s.cosine),
                                                           ("structure", s.structure),
                                                           ("jaccard", s.jaccard),
                                                           ("ngram_overlap", s.ngram_overlap))
                               if v is not None)
            where = f"{r.train_set}/{s.train_name}" if s.train_name else f"set {r.train_set}"
            reasons[s.heldout_id] = f"contaminated: near {where} ({scores}; {'+'.join(s.stages)})"
    if reasons:
        with Curriculum(db_path or Path(bank.root) / "curriculum.sqlite", reasons) as cur:
            for tid, reason in sorted(reasons.items()):
                cur.quarantine(tid, reason)
    return reasons


def check_against_training_sets(bank, heldout_name: str, cfg: ContaminationConfig | None = None,
                                quarantine: bool = False,
                                executor: execution.Executor | None = None) -> list[Report]:
    """Check a stored held-out set against every stored set that has a training split;
    with `quarantine`, quarantine the suspects (`quarantine_suspects`)."""
    heldout = bank.load_set(heldout_name)
    reports = []
    for name in bank.set_names():
        if name == heldout_name:
            continue
        ts = bank.load_set(name)
        if len(ts.heldout) == len(ts.tasks):      # a held-out-only set is not training data
            continue
        report = check(ts, heldout, cfg, cache_dir=Path(bank.root) / "embeddings", executor=executor)
        write_report(bank, report)
        reports.append(report)
    if quarantine:
        quarantine_suspects(bank, reports)
    return reports
