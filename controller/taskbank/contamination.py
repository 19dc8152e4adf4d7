"""Contamination check between a training set and a held-out set.

Two signals, both over each task's *text* (instruction + visible text files + hidden text
files, lowercased, split into word tokens):

- **Near duplicates**: MinHash signatures of word shingles indexed in a MinHash LSH
  (datasketch); each held-out task queries the index, and every candidate training task gets
  its estimated Jaccard similarity. Pairs at or above `jaccard_threshold` are suspects.
- **Exact n-gram overlap**: every word n-gram of the training set goes into one Bloom filter
  (rbloom); a held-out task's overlap is the fraction of its n-grams found in the filter.
  A task at or above `overlap_threshold` is a suspect even when no single training task is
  near it (text stitched from several tasks). The Bloom filter's false-positive rate
  (`bloom_fp_rate`) bounds how much it can overstate overlap.

Suspects are reported, not removed: the report names both tasks and both scores. Runs
automatically when a held-out set is imported into a bank that holds training sets.

Must not import zmq.
"""
from __future__ import annotations

import hashlib
import json
import re
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Iterable

from datasketch import MinHash, MinHashLSH
from rbloom import Bloom

from controller.contracts.tasks import Task, TaskSet

_WORD = re.compile(r"[a-z0-9_]+")


@dataclass(frozen=True)
class ContaminationConfig:
    shingle_words: int = 5
    num_perm: int = 128
    jaccard_threshold: float = 0.5
    ngram_words: int = 8
    overlap_threshold: float = 0.5
    bloom_fp_rate: float = 0.001
    include_hidden: bool = True

    def __post_init__(self) -> None:
        for key in ("jaccard_threshold", "overlap_threshold"):
            v = getattr(self, key)
            if not 0.0 < v <= 1.0:
                raise ValueError(f"contamination: {key!r} must be in (0, 1], got {v!r}")
        for key in ("shingle_words", "num_perm", "ngram_words"):
            if getattr(self, key) < 1:
                raise ValueError(f"contamination: {key!r} must be >= 1")
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


@dataclass
class Report:
    train_set: str
    heldout_set: str
    train_hash: str
    heldout_hash: str
    config: ContaminationConfig
    suspects: list[Suspect] = field(default_factory=list)
    checked: int = 0

    def summary_line(self) -> str:
        return (f"contamination {self.heldout_set} vs {self.train_set}: {len(self.suspects)} "
                f"suspect(s) among {self.checked} held-out tasks")

    def to_json(self) -> dict:
        return {"train_set": self.train_set, "heldout_set": self.heldout_set,
                "train_hash": self.train_hash, "heldout_hash": self.heldout_hash,
                "config": asdict(self.config), "checked": self.checked,
                "suspects": [asdict(s) for s in self.suspects]}


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


def check(train: TaskSet, heldout: TaskSet, cfg: ContaminationConfig | None = None,
          train_tasks: Iterable[Task] | None = None,
          heldout_tasks: Iterable[Task] | None = None) -> Report:
    """Suspected contamination of `heldout` (its held-out split, or all its tasks) by `train`."""
    cfg = cfg or ContaminationConfig()
    train_list = list(train_tasks if train_tasks is not None else _split(train, "train"))
    held_list = list(heldout_tasks if heldout_tasks is not None else _split(heldout, "heldout"))
    report = Report(train.name, heldout.name, train.manifest_hash, heldout.manifest_hash, cfg)
    lsh = MinHashLSH(threshold=cfg.jaccard_threshold, num_perm=cfg.num_perm)
    hashes: dict[str, MinHash] = {}
    train_grams: dict[str, set[str]] = {}
    train_grams_inserted: set[str] = set()
    for t in train_list:
        words = task_words(t, cfg.include_hidden)
        hashes[t.task_id] = _minhash(words, cfg)
        train_grams[t.task_id] = set(ngrams(words, cfg.ngram_words))
        if t.task_id not in train_grams_inserted:
            train_grams_inserted.add(t.task_id)
            lsh.insert(t.task_id, hashes[t.task_id])
    expected = max(sum(len(g) for g in train_grams.values()), 1)
    bloom = Bloom(expected, cfg.bloom_fp_rate, _bloom_key)
    for grams in train_grams.values():
        bloom.update(grams)
    names = {t.task_id: t.name for t in train_list}
    for h in held_list:
        words = task_words(h, cfg.include_hidden)
        grams = set(ngrams(words, cfg.ngram_words))
        overlap = (sum(g in bloom for g in grams) / len(grams)) if grams else 0.0
        mh = _minhash(words, cfg)
        pairs = []
        for tid in sorted(lsh.query(mh)):
            j = mh.jaccard(hashes[tid])
            if j >= cfg.jaccard_threshold:
                pairs.append(Suspect(h.task_id, h.name, tid, names[tid], round(j, 4),
                                     round(overlap, 4)))
        if not pairs and overlap >= cfg.overlap_threshold:
            pairs.append(Suspect(h.task_id, h.name, None, None, None, round(overlap, 4)))
        report.suspects.extend(pairs)
        report.checked += 1
    report.suspects.sort(key=lambda s: (-(s.jaccard or 0.0), -s.ngram_overlap, s.heldout_name))
    return report


def _split(ts: TaskSet, split: str) -> list[Task]:
    """The tasks of `split`; a set with no task in that split counts as wholly that split."""
    want_heldout = split == "heldout"
    chosen = [t for t in ts.tasks if (t.task_id in ts.heldout) == want_heldout]
    return chosen or list(ts.tasks)


def write_report(bank, report: Report) -> Path:
    directory = Path(bank.root) / "contamination"
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / f"{report.heldout_set}--{report.train_set}.json"
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(report.to_json(), indent=1))
    tmp.replace(path)
    return path


def check_against_training_sets(bank, heldout_name: str,
                                cfg: ContaminationConfig | None = None) -> list[Report]:
    """Check a stored held-out set against every stored set that has a training split."""
    heldout = bank.load_set(heldout_name)
    reports = []
    for name in bank.set_names():
        if name == heldout_name:
            continue
        ts = bank.load_set(name)
        if len(ts.heldout) == len(ts.tasks):      # a held-out-only set is not training data
            continue
        report = check(ts, heldout, cfg)
        write_report(bank, report)
        reports.append(report)
    return reports
