"""`paddock tasks ...`: the task bank from the command line.

  paddock tasks [--bank DIR] import KIND SOURCE --set NAME [--replace] [--split heldout] [--store DIR] [--repos DIR] [--inline]
  paddock tasks [--bank DIR] list [SET]
  paddock tasks [--bank DIR] show TASK [--set NAME] [--hidden]
  paddock tasks [--bank DIR] validate SET [--workers N] [--image IMG]
  paddock tasks [--bank DIR] contamination TRAIN_SET HELDOUT_SET [--json] [thresholds]
  paddock tasks [--bank DIR] curriculum SET [--version V] [--db FILE]

Thin: parses arguments and calls controller.taskbank (bank, importers, contamination,
curriculum, validation) with plain arguments. Operating errors print one line to stderr and
exit 2 (`validate`: 3 if the sandbox fails, 1 if a task is quarantined).

Must not import: zmq, controller.broker.
"""
from __future__ import annotations

import argparse
import contextlib
import json
import sys
from pathlib import Path
from typing import TextIO

import yaml

from controller.contracts.tasks import TaskError
from controller.taskbank import importers
from controller.taskbank.bands import explain, format_counts
from controller.taskbank.bank import DEFAULT_BANK_ENV, TaskBank, find_task, make_set, package_meta
from controller.taskbank.builtin import builtin_taskset
from controller.taskbank.contamination import (
    ContaminationConfig,
    check,
    check_against_training_sets,
    format_suspect,
    quarantine_suspects,
    write_report,
)
from controller.taskbank.curriculum import Curriculum
from controller.taskbank.execution import ExecutionUnavailable
from controller.taskbank.judge import JudgeConfig
from layers.builtin import default_store_root, ensure_builtin_image
from layers.store import ImageStore
from nodeagent.sandbox.runtime import SandboxError, SandboxRuntime, SandboxSpec
from nodeagent.verifier.checkers import judge_score
from nodeagent.verifier.mathanswer import gold_answer, math_verdict
from nodeagent.verifier.validate import (
    QUARANTINE_FILE,
    TaskValidation,
    ValidationStore,
    task_dicts,
    validate_tasks,
    verifier_version,
)


def register(subparsers: argparse._SubParsersAction) -> argparse.ArgumentParser:
    """Add `paddock tasks import | list | show | validate | contamination | curriculum`."""
    p = subparsers.add_parser("tasks", help="the task bank: import, list, show, validate, contamination, "
                                            "curriculum")
    p.add_argument("--bank", metavar="DIR", default=None,
                   help=f"task-bank directory (default ${DEFAULT_BANK_ENV} or ./taskbank)")
    sub = p.add_subparsers(dest="tasks_cmd", required=True)
    add_bank_commands(sub)
    add_validate_command(sub)
    add_contamination_command(sub)
    add_curriculum_command(sub)
    return p


def add_bank_commands(sub: argparse._SubParsersAction) -> None:
    """`import`, `list` and `show` of the `tasks` group."""
    imp = sub.add_parser("import", help="import tasks into a named set")
    imp.add_argument("kind", choices=importers.KINDS, help="source format")
    imp.add_argument("source", help="JSONL file (humaneval, mbpp, math, swe) or a directory of "
                                    "task packages (package)")
    imp.add_argument("--set", dest="set_name", required=True, help="name of the task set")
    imp.add_argument("--replace", action="store_true",
                     help="replace a set of the same name (without it, an existing name is refused)")
    imp.add_argument("--split", choices=("train", "heldout"), default="train")
    imp.add_argument("--no-contamination", action="store_true",
                     help="skip the automatic check of a held-out set against training sets")
    imp.add_argument("--quarantine-suspects", action="store_true",
                     help="quarantine held-out tasks the contamination check suspects")
    imp.add_argument("--store", metavar="DIR", default=None,
                     help="swe: image store for repository layers and record images (default: the "
                          "default image store)")
    imp.add_argument("--repos", metavar="DIR", default=None,
                     help="swe: directory of local clones that `repo: owner/name` records name")
    imp.add_argument("--inline", action="store_true",
                     help="swe: keep the repository in the package's files instead of a layer "
                          "(small repositories only)")
    imp.set_defaults(func=cmd_import)

    ls = sub.add_parser("list", help="list sets, or the tasks of one set")
    ls.add_argument("set_name", nargs="?")
    ls.set_defaults(func=cmd_list)

    show = sub.add_parser("show", help="show one task (by id, id prefix or name)")
    show.add_argument("task", help="task id (sha256:... or a hex prefix) or name")
    show.add_argument("--set", dest="set_name", help="look the name up in this set")
    show.add_argument("--hidden", action="store_true", help="also print hidden files")
    show.set_defaults(func=cmd_show)


def add_validate_command(sub: argparse._SubParsersAction) -> None:
    """`paddock tasks validate SET` (the verifier's check of every task of a set)."""
    p = sub.add_parser("validate", help="run reference, null and hack solutions of every task; "
                                        "quarantine the tasks that fail")
    p.add_argument("set_name", metavar="SET", help="task set name in the bank, or 'builtin'")
    p.add_argument("--workers", type=int, default=2, help="parallel verifications (default 2)")
    p.add_argument("--image", help="image path or sha256:<digest> (default: the built-in python image)")
    p.set_defaults(func=cmd_validate)


def add_contamination_command(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("contamination", help="copies of training tasks in a held-out set (MinHash LSH, "
                                             "n-gram Bloom filter, sentence embeddings, optional judge)")
    p.add_argument("train_set")
    p.add_argument("heldout_set")
    d = ContaminationConfig()
    p.add_argument("--jaccard", type=float, default=d.jaccard_threshold,
                   help=f"MinHash Jaccard threshold for a suspected pair (default {d.jaccard_threshold})")
    p.add_argument("--overlap", type=float, default=d.overlap_threshold,
                   help=f"n-gram overlap threshold (default {d.overlap_threshold})")
    p.add_argument("--ngram", type=int, default=d.ngram_words,
                   help=f"words per n-gram for exact overlap (default {d.ngram_words})")
    p.add_argument("--shingle", type=int, default=d.shingle_words,
                   help=f"words per MinHash shingle (default {d.shingle_words})")
    p.add_argument("--cosine", type=float, default=d.cosine_threshold,
                   help=f"embedding cosine threshold (default {d.cosine_threshold}, calibrated: docs/tasks.md)")
    p.add_argument("--code-cosine", type=float, default=d.code_cosine_threshold,
                   help=f"threshold for held-out code tasks of their blended score: prose cosine mixed "
                        f"with code-shape overlap, docs/tasks.md (default {d.code_cosine_threshold})")
    p.add_argument("--no-semantic", action="store_true", help="skip the embedding stage")
    p.add_argument("--no-execution", action="store_true",
                   help="skip the execution stage (held-out code tasks' tests run on their nearest "
                        "training tasks' code, in a sandbox)")
    p.add_argument("--judge-endpoint", metavar="URL",
                   help="OpenAI-compatible endpoint of a judge model for the top candidates (off by default)")
    p.add_argument("--judge-model", help="the judge's model name (with --judge-endpoint)")
    p.add_argument("--quarantine-suspects", action="store_true",
                   help="quarantine the suspect held-out tasks in the bank's curriculum")
    p.add_argument("--json", action="store_true", help="print the report as JSON")
    p.set_defaults(func=cmd_contamination)


def add_curriculum_command(sub: argparse._SubParsersAction) -> None:
    """`paddock tasks curriculum SET [--version V] [--db FILE]`: estimates, classes, quarantine."""
    p = sub.add_parser("curriculum", help="pass-rate estimates, band classes and quarantine "
                                          "of a set's tasks")
    p.add_argument("set_name", metavar="SET")
    p.add_argument("--version", type=int, default=None,
                   help="target policy version (default: the newest recorded)")
    p.add_argument("--db", help="curriculum database (default <bank>/curriculum.sqlite)")
    p.set_defaults(func=cmd_curriculum)


# -- import, list, show ---------------------------------------------------------------------

def cmd_import(args: argparse.Namespace, out: TextIO | None = None) -> int:
    out = out or sys.stdout
    bank = TaskBank(args.bank)
    try:
        manifest = bank.manifest_path(args.set_name)
        tasks = importers.import_source(args.kind, Path(args.source), _swe_context(args))
        for task in tasks:
            unreadable = math_gold_error(task.checker)
            if unreadable:
                raise TaskError(f"task {task.name[:80]!r}: 'checker.answer' {unreadable}")
        taskset = make_set(args.set_name, tasks, args.split)
        if manifest.exists() and not getattr(args, "replace", False) and not _same_set(bank, taskset):
            raise TaskError(f"task set {args.set_name!r} already exists at {manifest} with other content; "
                            f"import under another name, or pass --replace to replace it")
        path = bank.put_set(taskset)
    except (TaskError, OSError) as exc:
        print(f"paddock tasks import: {exc}", file=sys.stderr)
        return 2
    print(f"set {taskset.name}: {len(taskset.tasks)} tasks ({args.split}), manifest "
          f"{taskset.manifest_hash} at {path}", file=out)
    if args.split == "heldout" and not args.no_contamination:
        with SandboxExecutor() as executor:
            reports = check_against_training_sets(bank, taskset.name, quarantine=args.quarantine_suspects,
                                                  executor=executor)
        for report in reports:
            print(report.summary_line(), file=out)
    return 0


def _same_set(bank: TaskBank, taskset) -> bool:
    """The stored set of that name has the same manifest (re-importing it changes nothing)."""
    try:
        return bank.load_set(taskset.name).manifest_hash == taskset.manifest_hash
    except TaskError:
        return False


def math_gold_error(checker) -> str | None:
    """Why a math checker's gold cannot be graded against (the math checker cannot read it, or
    reads it as something its own boxed form does not match), or None. Such a task could only
    ever score 0."""
    if checker.get("kind") != "math":
        return None
    gold = str(checker.get("answer", ""))
    read = gold_answer(gold)
    if read is None:
        return f"{gold[:80]!r} cannot be read by the math checker"
    verdict = math_verdict(gold, "\\boxed{" + read + "}")
    if not verdict["ok"]:
        return f"{gold[:80]!r} is not read as a whole by the math checker ({verdict['detail'][:120]})"
    return None


def _swe_context(args: argparse.Namespace) -> importers.SweContext:
    if args.kind != "swe":
        return importers.SweContext()
    store = None if getattr(args, "inline", False) else ImageStore(getattr(args, "store", None) or default_store_root())
    repos = getattr(args, "repos", None)
    return importers.SweContext(store=store, repos_dir=Path(repos).resolve() if repos else None)


def existing_bank(args: argparse.Namespace) -> TaskBank:
    """The bank a reading command names; TaskError when `--bank DIR` names no directory (a
    typo must not read as an empty bank). `import` creates its bank instead."""
    bank = TaskBank(args.bank)
    if args.bank and not bank.root.is_dir():
        raise TaskError(f"task bank {bank.root} does not exist (import a set into it first: "
                        f"`paddock tasks --bank {bank.root} import ...`)")
    return bank


def cmd_list(args: argparse.Namespace, out: TextIO | None = None) -> int:
    out = out or sys.stdout
    try:
        bank = existing_bank(args)
        if args.set_name:
            ts = bank.load_set(args.set_name)
            for t in sorted(ts.tasks, key=lambda t: t.name):
                split = "heldout" if t.task_id in ts.heldout else "train"
                print(f"{t.task_id[:19]}  {split:7}  {t.family:6}  {t.name}", file=out)
            return 0
        for name in bank.set_names():
            ts = bank.load_set(name)
            print(f"{name}  {len(ts.tasks)} tasks ({len(ts.heldout)} heldout)  "
                  f"{ts.manifest_hash}", file=out)
    except TaskError as exc:
        print(f"paddock tasks list: {exc}", file=sys.stderr)
        return 2
    return 0


def cmd_show(args: argparse.Namespace, out: TextIO | None = None) -> int:
    out = out or sys.stdout
    try:
        task = find_task(existing_bank(args), args.task, args.set_name)
    except TaskError as exc:
        print(f"paddock tasks show: {exc}", file=sys.stderr)
        return 2
    meta = package_meta(task)
    print(yaml.safe_dump(meta, sort_keys=False, allow_unicode=True, width=100), end="", file=out)
    print("files:", file=out)
    for rel, content in sorted(task.files.items()):
        print(f"  {rel} ({len(content)} {'chars' if isinstance(content, str) else 'bytes'})",
              file=out)
    print("hidden:", file=out)
    for rel, content in sorted(task.hidden.items()):
        print(f"  {rel}" + (f"\n{content}" if args.hidden and isinstance(content, str) else ""),
              file=out)
    return 0


# -- validate, contamination, curriculum -----------------------------------------------------

def cmd_validate(args: argparse.Namespace, out: TextIO | None = None) -> int:
    out = out or sys.stdout
    try:
        if args.set_name == "builtin":
            taskset = builtin_taskset()
            directory = Path(getattr(args, "bank", None) or "taskbank")
            broken: list[tuple[dict, str]] = []
        else:
            bank, broken = TaskBank(getattr(args, "bank", None)), []
            taskset, directory = bank.load_set(args.set_name, broken), Path(bank.root)
    except (ValueError, OSError) as exc:
        print(f"paddock tasks validate: {exc}", file=sys.stderr)
        return 2
    store = ValidationStore(directory)
    for entry, error in broken:     # a task that cannot even be read: refused, the others go on
        v = TaskValidation(task_id=str(entry.get("task_id")), name=str(entry.get("name")), ok=False,
                           reasons=[f"cannot be loaded: {error}"], verifier_version=verifier_version())
        store.record(v)
        print(f"QUARANTINED {v.name}\n    {v.reasons[0]}", file=out)
    images = ImageStore(default_store_root())
    image = images.resolve(args.image) if args.image else ensure_builtin_image(images)[1]

    def show(v: TaskValidation, cached: bool) -> None:
        mark = "ok " if v.ok else "QUARANTINED"
        print(f"{mark} {v.name}{' (cached)' if cached else ''}" + "".join(f"\n    {r}" for r in v.reasons), file=out)
    try:
        with SandboxRuntime() as rt:
            results = validate_tasks(rt, image, task_dicts(taskset), store, args.workers, show)
    except SandboxError as exc:
        print(f"paddock tasks validate: sandbox failed: {exc}", file=sys.stderr)
        return 3
    bad = [v for v in results if not v.ok] + [None] * len(broken)
    print(f"{len(results) + len(broken) - len(bad)}/{len(results) + len(broken)} tasks valid; quarantine: {directory / QUARANTINE_FILE}", file=out)
    return 1 if bad else 0


class SandboxExecutor:
    """The contamination check's execution stage runs here: each `sandbox()` is a fresh sandbox
    of the built-in Python image (or `image`), no network, capped, whose runs are `python3 -I
    -c script`, each under an in-sandbox uid of its own. The runtime starts at the first sandbox (a check with
    no code candidates starts none); `close()` ends it."""

    LIMITS = {"memory_mb": 1024, "pids": 128, "disk_mb": 256, "nofile": 256, "cpu": 1}
    FIRST_UID = 100     # runs are uids 100, 101, ... of the sandbox's id slice

    def __init__(self, image: str | None = None) -> None:
        self._image, self._rt = image, None

    @contextlib.contextmanager
    def sandbox(self):
        if self._rt is None:
            try:
                images = ImageStore(default_store_root())
                self._image = images.resolve(self._image) if self._image else ensure_builtin_image(images)[1]
                self._rt = SandboxRuntime().start()
            except (SandboxError, OSError, ValueError) as exc:
                raise ExecutionUnavailable(f"no sandbox here: {exc}") from None
        with self._rt.create(SandboxSpec(self._image, limits=dict(self.LIMITS))) as sb:
            def run(script: str, stdin: bytes, timeout_s: float, run_no: int) -> tuple[int, str]:
                uid = self.FIRST_UID + run_no % (self._rt.slice_size - self.FIRST_UID)
                r = sb.exec(["python3", "-I", "-c", script], stdin=stdin, timeout_s=timeout_s,
                            cwd="/tmp", uid=uid)
                return (-9 if r.timed_out else r.exit_code), r.stdout.decode(errors="replace")
            yield run

    def close(self) -> None:
        if self._rt is not None:
            self._rt.close()
            self._rt = None

    def __enter__(self) -> "SandboxExecutor":
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def cmd_contamination(args: argparse.Namespace, out: TextIO | None = None) -> int:
    out = out or sys.stdout
    bank = TaskBank(args.bank)
    try:
        judge = (JudgeConfig(args.judge_endpoint, args.judge_model or "", score=judge_score)
                 if args.judge_endpoint else None)
        cfg = ContaminationConfig(shingle_words=args.shingle, jaccard_threshold=args.jaccard,
                                  ngram_words=args.ngram, overlap_threshold=args.overlap,
                                  cosine_threshold=args.cosine, code_cosine_threshold=args.code_cosine,
                                  semantic=not args.no_semantic, judge=judge,
                                  **({"execution": None} if args.no_execution else {}))
        with SandboxExecutor() as executor:
            report = check(bank.load_set(args.train_set), bank.load_set(args.heldout_set), cfg,
                           cache_dir=bank.root / "embeddings", executor=executor)
    except (TaskError, ValueError) as exc:
        print(f"paddock tasks contamination: {exc}", file=sys.stderr)
        return 2
    write_report(bank, report)
    if args.quarantine_suspects:
        quarantine_suspects(bank, [report])
    if args.json:
        print(json.dumps(report.to_json(), indent=1), file=out)
        return 0
    print(report.summary_line(), file=out)
    for s in report.suspects:
        print(format_suspect(s), file=out)
    return 0


def cmd_curriculum(args: argparse.Namespace, out: TextIO | None = None) -> int:
    out = out or sys.stdout
    try:
        bank = existing_bank(args)
        ts = bank.load_set(args.set_name)
    except TaskError as exc:
        print(f"paddock tasks curriculum: {exc}", file=sys.stderr)
        return 2
    with Curriculum(args.db or bank.root / "curriculum.sqlite", [t.task_id for t in ts.tasks]) as c:
        version = c.latest_version() if args.version is None else args.version
        est, classes, q = c.estimates(version), c.classify(version), c.quarantined()
        names = {t.task_id: t.name for t in ts.tasks}
        print(f"policy version {version}: " + format_counts(c.occupancy(version), skip_zero=False),
              file=out)
        print(f"  (explore = {explain('explore', c.cfg.bands)})", file=out)
        for tid in sorted(c.task_ids, key=lambda t: (classes[t], names[t])):
            e = est[tid]
            extra = f"  {q[tid]}" if tid in q else ""
            print(f"  {classes[tid]:11} {e.mean:5.2f} (evidence {e.evidence:5.1f})  {names[tid]}{extra}",
                  file=out)
    return 0
