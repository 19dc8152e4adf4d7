"""The grader over real repositories' gold patches: false negatives on the corpus of
tests/data/real_repos/corpus.yaml (pinned sdists from the package index, their own tests).

For each project: the sdist is downloaded (cached, $PADDOCK_SDIST_CACHE or
/var/tmp/paddock/sdists), unpacked into a git repository whose base commit has one function
broken, imported with the swe importer as a layered task in the corpus image, and its gold patch
and the null solution (no change) are graded by `validate_task` (the real `grade.verify` path,
fresh sandboxes). Prints one row per project: project, version, tests (FAIL_TO_PASS +
PASS_TO_PASS), gold verdict, null verdict, wall seconds; then the false negatives (gold not
`pass`) with the grader's detail, and the count.

`--measure` first runs the project's test files with plain pytest in the same image, with and
without the gold patch, and writes FAIL_TO_PASS (failed with the break, passed without) and
five PASS_TO_PASS into the corpus file (the table's `plain` column: passed/failed counts of the
plain run with the gold patch).

    PYTHONPATH=. .venv/bin/python benchmarks/real_repos.py [--only NAME ...] [--measure] [--json OUT]
"""
from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import yaml

from layers.builtin import default_store_root, ensure_builtin_image
from layers.store import ImageStore
from nodeagent.sandbox.runtime import SandboxRuntime
from tests.data.real_repos import repos


def _write_corpus(entries: list[dict], path: Path) -> None:
    head = "".join(line for line in path.read_text().splitlines(keepends=True) if line.startswith("#"))
    body = yaml.safe_dump({"projects": entries}, sort_keys=False, width=120, allow_unicode=True)
    path.write_text(head + body)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--only", nargs="*", help="project names (default: the whole corpus)")
    ap.add_argument("--measure", action="store_true", help="measure FAIL_TO_PASS/PASS_TO_PASS with plain pytest first")
    ap.add_argument("--workers", type=int, default=1, help="projects graded at once (each grades gold and null in parallel)")
    ap.add_argument("--json", help="also write the rows as JSON here")
    args = ap.parse_args(argv)
    entries = repos.load_corpus()
    chosen = [e for e in entries if not args.only or e["name"] in args.only]
    store = ImageStore(default_store_root())
    _, python_image = ensure_builtin_image(store)
    t0 = time.monotonic()
    sdists = repos.fetch_sdists(chosen)
    image = repos.corpus_image(store, python_image, entries)
    print(f"sdists and image ready in {time.monotonic() - t0:.1f} s (image {image[:19]})", file=sys.stderr)
    rt = SandboxRuntime().start()
    rows = []
    try:
        with tempfile.TemporaryDirectory(prefix="paddock-real-repos-") as tmp:
            def one(entry: dict):
                work = Path(tmp) / entry["name"]
                repo = repos.make_repo(entry, sdists[entry["name"]], work)
                if args.measure:
                    probe = dict(entry, fail_to_pass=entry.get("fail_to_pass") or list(entry["tests"]))
                    task = repos.import_task(probe, repo, image, store, work)
                    m = repos.measure(rt, store, task, python_image)
                    entry["fail_to_pass"], entry["pass_to_pass"] = m["fail_to_pass"], m["pass_to_pass"]
                    entry["plain"] = m["plain"]
                    print(f"{entry['name']}: plain pytest fixed {m['plain']['fixed']} broken {m['plain']['broken']}; "
                          f"F2P {len(m['fail_to_pass'])}", file=sys.stderr)
                    if not m["fail_to_pass"]:
                        print(f"  no FAIL_TO_PASS; fixed run tail:\n{m['tails']['fixed']}", file=sys.stderr)
                        return None
                task = repos.import_task(entry, repo, image, store, work)
                return repos.grade_project(rt, task, python_image, entry)
            with ThreadPoolExecutor(max_workers=max(1, args.workers)) as pool:
                rows = [r for r in pool.map(one, chosen) if r is not None]
    finally:
        rt.close()
    if args.measure:
        _write_corpus(entries, repos.CORPUS)
    print(f"{'project':<16} {'version':<9} {'tests':>5}  {'gold':<11} {'null':<11} {'wall s':>6}")
    for r in rows:
        print(f"{r.name:<16} {r.version:<9} {r.tests:>5}  {r.gold:<11} {r.null:<11} {r.wall_s:>6.1f}")
    bad = [r for r in rows if r.false_negative]
    wrong_null = [r for r in rows if r.null not in ("fail", "timeout")]
    print(f"\n{len(rows)} projects: {len(bad)} false negatives (gold not pass), "
          f"{len(wrong_null)} null solutions not scored fail")
    for r in bad:
        print(f"- {r.name} {r.version} gold {r.gold}: {r.gold_detail}")
    for r in wrong_null:
        print(f"- {r.name} {r.version} null {r.null}: {r.null_detail}")
    if args.json:
        Path(args.json).write_text(json.dumps([r.__dict__ for r in rows], indent=1))
    return 1 if bad or wrong_null else 0


if __name__ == "__main__":
    sys.exit(main())
