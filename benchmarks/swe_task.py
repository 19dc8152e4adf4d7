"""SWE task start: sandbox create + first exec for a task with a real ~35 MB repository, against
the same for an empty task, one run (issue 15's goal: at most 1.5x).

- empty: `create(SandboxSpec(image))` + `exec(["ls", "/work"])`;
- repo as a layer: the repository (a real source distribution, unpacked) built once into a
  content-addressed layer (`layers.treelayer.ensure_tree_layer`, prefix /work/repo), the
  sandbox created with `layers=(layer,)`, first exec `ls /work/repo`: the node unpacks the
  layer once (timed apart: "first use on the node"), every sandbox then stacks it;
- repo copied per sandbox (the way before layers, for comparison; `--copied N` sandboxes):
  the same files in `spec.files`, written into each sandbox's tmpfs.
Also a one-line edit's diff (changes, bytes) in the layered sandbox.

The repository: `pip download --no-deps --no-binary :all: sympy==1.12` (a 6.7 MB sdist, 32 MB
and 2,100 files unpacked), cached under the image store's tmp/ (or `--repo DIR`).
Prints p50 / p99 of each and the ratio of the layered p50 to the empty p50.

`--grading N` (issue 15's second goal: at most 2x): a real instance (`tests/data/swe/instances.py`,
babel 2.14.0, ~38 MB, imported as a layered swe task in its test-dependency image), its
one-line gold fix graded N times by the verifier (fresh sandbox of the task's image + layers,
the change applied, the hidden tests written, the grader) interleaved with N runs of the same
tests by hand (a sandbox of the same image + layers, the same change and test files, `python3
-m pytest -q FILES` in /work); both timed from sandbox create to destroy.

    PYTHONPATH=. .venv/bin/python benchmarks/swe_task.py [--n 30] [--copied 5] [--repo DIR] [--grading 5]
"""
from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tarfile
import time
from pathlib import Path

from layers import treelayer
from layers.builtin import default_store_root, ensure_busybox_image
from layers.store import ImageStore
from nodeagent.sandbox.runtime import Change, SandboxRuntime, SandboxSpec

SDIST = "sympy==1.12"
LIMITS = {"memory_mb": 256, "pids": 64, "cpu": 1.0, "disk_mb": 64, "nofile": 256}
COPIED_LIMITS = {**LIMITS, "disk_mb": 256, "inodes": 65536}


def pct(xs, q):
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(round(q / 100 * (len(xs) - 1))))]


def fetch_repo(cache: Path) -> Path:
    """The sdist unpacked under `cache` (downloaded once with pip)."""
    name = SDIST.replace("==", "-")
    tree = cache / name
    if tree.is_dir():
        return tree
    cache.mkdir(parents=True, exist_ok=True)
    subprocess.run([sys.executable, "-m", "pip", "download", "--no-deps", "--no-binary", ":all:", SDIST,
                    "-d", str(cache), "-q"], check=True)
    with tarfile.open(cache / f"{name}.tar.gz") as tf:
        tf.extractall(cache, filter="data")
    return tree


def tree_stats(tree: Path) -> tuple[int, int]:
    files = size = 0
    for dirpath, _dirs, names in os.walk(tree):
        for n in names:
            p = os.path.join(dirpath, n)
            if os.path.isfile(p) and not os.path.islink(p):
                files, size = files + 1, size + os.path.getsize(p)
    return files, size


def start_once(rt, spec, path: str) -> float:
    t0 = time.perf_counter()
    sb = rt.create(spec)
    r = sb.exec(["ls", path])
    dt = time.perf_counter() - t0
    assert r.exit_code == 0, r.stderr
    sb.destroy()
    return dt


def files_of(tree: Path) -> dict:
    out = {}
    for dirpath, _dirs, names in os.walk(tree):
        for n in names:
            p = Path(dirpath) / n
            if p.is_file() and not p.is_symlink():
                out[f"repo/{p.relative_to(tree)}"] = p.read_bytes()
    return out


def grading_costs(rt, store: ImageStore, n: int, instance: str = "babel") -> None:
    """The verifier's cost for a one-line fix against the same tests run by hand (see above)."""
    import json
    import tempfile

    from controller.taskbank.importers import SweContext, import_source
    from layers.builtin import ensure_builtin_image
    from nodeagent.verifier import grade
    from nodeagent.verifier.validate import own_image, reference_of, sandbox_layers
    from tests.data.swe import instances
    spec = instances.INSTANCES[instance]
    _, python_image = ensure_builtin_image(store)
    digest = instances.test_image(store, python_image)
    with tempfile.TemporaryDirectory(prefix="paddock-bench-swe-") as tmp:
        repo, base = instances.make_repo(spec, instances.sdist_path(spec, store.root / "tmp" / "sdists"), Path(tmp))
        (Path(tmp) / "swe.jsonl").write_text(json.dumps(instances.record(spec, repo, base, digest)) + "\n")
        t0 = time.perf_counter()
        [task] = import_source("swe", Path(tmp) / "swe.jsonl", SweContext(store=store))
        print(f"instance {spec['instance_id']}: imported in {time.perf_counter() - t0:.1f} s")
    d = grade.graded_task(dict(task.canonical(), task_id=task.task_id))
    image = own_image(python_image, d)
    layers = sandbox_layers(rt, image, d)
    files, _ = reference_of(d)
    fix = [Change(f"/work/{rel}", "modified", text.encode() if isinstance(text, str) else text, 0o644)
           for rel, text in files.items()]
    tests = {f"/work/{rel}": grade.as_bytes(task.hidden[rel]) for rel in task.checker["tests"]}

    def graded() -> float:
        t = time.perf_counter()
        v = grade.verify(rt, image, d, fix, None, layers=layers)
        assert v.outcome == "pass", (v.outcome, v.checks[-1:])
        return time.perf_counter() - t

    def by_hand() -> float:
        t = time.perf_counter()
        with rt.create(SandboxSpec(image=image, limits=dict(task.limits.__dict__), layers=layers)) as sb:
            sb.apply(fix)
            sb.write_files(tests, owner="agent", mode=0o644)
            r = sb.exec(["python3", "-m", "pytest", "-q", "-p", "no:cacheprovider", *task.checker["tests"]],
                        cwd="/work", timeout_s=600)
            assert r.exit_code == 0, (r.stdout + r.stderr)[-800:]
        return time.perf_counter() - t
    graded(), by_hand()       # warm both (page cache, layer unpacked on the node)
    g, h = [], []
    for _ in range(n):        # interleaved: the same machine load for both
        g.append(graded())
        h.append(by_hand())
    print(f"{'':32s} {'p50 s':>8s} {'max s':>8s}")
    print(f"{'graded by the verifier':32s} {statistics.median(g):8.2f} {max(g):8.2f}")
    print(f"{'same tests by hand':32s} {statistics.median(h):8.2f} {max(h):8.2f}")
    print(f"ratio graded / by hand (p50): {statistics.median(g) / statistics.median(h):.2f}  (goal <= 2)")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--n", type=int, default=30)
    ap.add_argument("--copied", type=int, default=5, help="sandboxes with the repository copied in (0: skip)")
    ap.add_argument("--repo", type=Path, default=None)
    ap.add_argument("--grading", type=int, default=0, metavar="N",
                    help="also time grading a real instance's one-line fix against running its tests by hand")
    ap.add_argument("--grading-only", action="store_true", help="only the grading comparison")
    args = ap.parse_args()
    store = ImageStore(default_store_root())
    if args.grading_only:
        with SandboxRuntime(degrade=True) as rt:
            grading_costs(rt, store, args.grading or 5)
        return
    _, image = ensure_busybox_image(store)
    tree = args.repo or fetch_repo(store.root / "tmp" / "sdists")
    n_files, n_bytes = tree_stats(tree)
    t0 = time.perf_counter()
    _, layer = treelayer.ensure_tree_layer(store, tree, "/work/repo")
    print(f"repository {tree.name}: {n_files} files, {n_bytes / 1e6:.1f} MB; layer {layer.stat().st_size / 1e6:.1f} MB "
          f"(built or found in {time.perf_counter() - t0:.2f} s)")
    empty, layered = SandboxSpec(image=image, limits=LIMITS), SandboxSpec(image=image, limits=LIMITS, layers=(layer,))
    with SandboxRuntime(degrade=True) as rt:
        first = start_once(rt, layered, "/work/repo")
        for _ in range(3):   # warm both paths
            start_once(rt, empty, "/work")
            start_once(rt, layered, "/work/repo")
        e, lay = [], []
        for _ in range(args.n):   # interleaved: the same machine load for both
            e.append(start_once(rt, empty, "/work"))
            lay.append(start_once(rt, layered, "/work/repo"))
        with rt.create(layered) as sb:
            sb.exec(["sh", "-c", "echo '# one line' >> /work/repo/sympy/__init__.py"])
            changes = sb.diff("/work")
        copied = []
        if args.copied:
            spec = SandboxSpec(image=image, limits=COPIED_LIMITS, files=files_of(tree))
            copied = [start_once(rt, spec, "/work/repo") for _ in range(args.copied)]
    ms = lambda x: f"{x * 1e3:8.2f}"   # noqa: E731
    print(f"{'':32s} {'p50 ms':>8s} {'p99 ms':>8s}")
    print(f"{'empty task':32s} {ms(statistics.median(e))} {ms(pct(e, 99))}")
    print(f"{'repo as a layer':32s} {ms(statistics.median(lay))} {ms(pct(lay, 99))}")
    if copied:
        print(f"{'repo copied per sandbox':32s} {ms(statistics.median(copied))} {ms(pct(copied, 99))}")
    print(f"first use of the layer on the node (unpack + start): {first * 1e3:.1f} ms")
    print(f"ratio layered / empty (p50): {statistics.median(lay) / statistics.median(e):.2f}  (goal <= 1.5)")
    if copied:
        print(f"ratio copied / empty (p50): {statistics.median(copied) / statistics.median(e):.1f}")
    print(f"one-line edit: {len(changes)} change(s), {sum(len(c.data or b'') for c in changes)} bytes")
    if args.grading:
        with SandboxRuntime(degrade=True) as rt:
            grading_costs(rt, store, args.grading)


if __name__ == "__main__":
    main()
