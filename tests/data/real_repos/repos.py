"""Real repositories' own test suites as SWE-smith-style repository tasks, graded by Paddock.

The corpus (`corpus.yaml` next to this file) names pure-Python projects by a pinned source
distribution on the package index; for each, one real function the project's own tests
exercise (`file`, `function`: a module-level name or `Class.method`). The task's starting
tree is the unpacked sdist with that function broken (`raise NotImplementedError` inserted as
its first statement, after the docstring); the gold patch restores the original; the test
patch only marks the project's own test files as the graded (hidden) copies. FAIL_TO_PASS /
PASS_TO_PASS are measured once with plain pytest in the same image (`measure`), stored in the
corpus, and graded by `grade_project` through the real path: `paddock tasks import swe`
(`controller.taskbank.importers`), then `nodeagent.verifier.validate.validate_task` (which
calls `nodeagent.verifier.grade.verify` in fresh sandboxes) for the gold patch and the null
solution.

Functions:
- `load_corpus()`: the corpus entries (dicts);
- `fetch_sdists(entries, cache)`: `pip download --no-deps --no-binary :all: NAME==VERSION`
  into `cache` (default $PADDOCK_SDIST_CACHE, else /var/tmp/paddock/sdists), only what is
  missing; raises `IndexUnreachable` when pip cannot reach the index;
- `make_repo(entry, sdist, workdir)`: the broken tree as a one-commit git repository, the gold
  patch and the test patch;
- `corpus_image(store, python_image)`: the built-in python image plus the test plugins the
  corpus's configurations name (pytest-cov, pytest-asyncio) and a `.pth` that puts `/work/src`
  and `/work` first on `sys.path` plus the projects' dist-info (what an editable install
  leaves), built once per store;
- `import_task(...)`, `grade_project(...)`, `plain_pytest(...)`, `measure(...)`.

Must not import: zmq, controller.broker, nodeagent.agent (a test and benchmark helper).
"""
from __future__ import annotations

import ast
import json
import os
import re
import subprocess
import sys
import tarfile
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

import yaml

from layers import build as imagebuild
from layers.store import ImageStore

HERE = Path(__file__).resolve().parent
CORPUS = HERE / "corpus.yaml"
SDIST_CACHE_ENV = "PADDOCK_SDIST_CACHE"
DEFAULT_SDIST_CACHE = Path("/var/tmp/paddock/sdists")
DOWNLOAD_PROCESSES = 4
# Test plugins that the corpus's own pytest configurations name (`--cov` in addopts,
# `asyncio_mode`); everything else the suites need is in the built-in image (pytest 7.2.1).
IMAGE_REQUIREMENTS = ("pytest-cov==4.1.0", "coverage==7.4.0", "pytest-asyncio==0.21.1")
SITE_DIR = "usr/local/lib/python3.11/dist-packages"
SRC_PTH = "import sys; sys.path[:0] = ['/work/src', '/work']\n"
SIF_PARTITION_OFFSET = 32768      # layers.sif: the squashfs partition of a built image
IMAGE_RULES = 1
BREAK_LINE = 'raise NotImplementedError("paddock: broken for the task")'
TEST_MARK = "# paddock: the graded copy of the project's own test file\n"


class IndexUnreachable(RuntimeError):
    """pip could not download a source distribution (no network or no package index)."""


def load_corpus(path: Path = CORPUS) -> list[dict]:
    entries = yaml.safe_load(path.read_text())["projects"]
    for e in entries:
        missing = {"name", "version", "file", "function", "tests"} - set(e)
        if missing:
            raise ValueError(f"{path}: project {e.get('name')!r} lacks {sorted(missing)}")
    return entries


def sdist_cache() -> Path:
    return Path(os.environ.get(SDIST_CACHE_ENV) or DEFAULT_SDIST_CACHE)


def _sdist_in(cache: Path, entry: dict) -> Path | None:
    norm = re.sub(r"[-_.]+", "[-_.]", re.escape(entry["name"]).replace("\\", ""))
    pat = re.compile(rf"^{norm}-{re.escape(entry['version'])}\.(tar\.gz|zip)$", re.IGNORECASE)
    for p in sorted(cache.glob("*")) if cache.is_dir() else []:
        if pat.match(p.name):
            return p
    return None


def fetch_sdists(entries: list[dict], cache: Path | None = None, timeout_s: float = 900.0) -> dict[str, Path]:
    """{name: sdist path}; downloads what `cache` lacks in one pip call."""
    cache = cache or sdist_cache()
    cache.mkdir(parents=True, exist_ok=True)
    want = [e for e in entries if _sdist_in(cache, e) is None]

    def download(chunk: list[dict]) -> None:
        argv = [sys.executable, "-m", "pip", "download", "-q", "--no-deps", "--no-binary", ":all:",
                "--disable-pip-version-check", "-d", str(cache), *(f"{e['name']}=={e['version']}" for e in chunk)]
        try:
            proc = subprocess.run(argv, capture_output=True, text=True, timeout=timeout_s, check=False)
        except subprocess.TimeoutExpired:
            raise IndexUnreachable(f"pip download timed out after {timeout_s:.0f} s") from None
        if proc.returncode != 0:
            raise IndexUnreachable(f"pip download failed (exit {proc.returncode}): {proc.stderr.strip()[-600:]}")
    if want:        # pip builds each sdist's metadata: a few processes at once, not one long queue
        with ThreadPoolExecutor(max_workers=DOWNLOAD_PROCESSES) as pool:
            list(pool.map(download, [want[i::DOWNLOAD_PROCESSES] for i in range(min(DOWNLOAD_PROCESSES, len(want)))]))
    out = {}
    for e in entries:
        p = _sdist_in(cache, e)
        if p is None:
            raise IndexUnreachable(f"{e['name']}=={e['version']}: no sdist in {cache} after pip download")
        out[e["name"]] = p
    return out


def _git(cwd: Path, *argv: str) -> str:
    env = {**os.environ, "GIT_AUTHOR_NAME": "paddock", "GIT_AUTHOR_EMAIL": "paddock@example.invalid",
           "GIT_COMMITTER_NAME": "paddock", "GIT_COMMITTER_EMAIL": "paddock@example.invalid",
           "GIT_AUTHOR_DATE": "2024-01-01T00:00:00Z", "GIT_COMMITTER_DATE": "2024-01-01T00:00:00Z",
           "GIT_CONFIG_NOSYSTEM": "1", "HOME": str(cwd)}
    return subprocess.run(["git", "-c", "core.hooksPath=/dev/null", *argv], cwd=cwd, check=True,
                          capture_output=True, text=True, env=env).stdout


def _ours(member: tarfile.TarInfo, dest: str) -> tarfile.TarInfo:
    """The `data` filter, owned by us (git refuses a repository of another owner)."""
    return tarfile.data_filter(member, dest).replace(uid=os.getuid(), gid=os.getgid(), uname="", gname="")


def break_function(source: str, function: str) -> str:
    """`source` with `raise NotImplementedError(...)` as the first statement of `function`
    (`name` or `Class.name`; the last definition wins, as at run time), after its docstring."""
    tree = ast.parse(source)
    scope: list[ast.stmt] = tree.body
    *outer, leaf = function.split(".")
    for cls in outer:
        found = [n for n in scope if isinstance(n, ast.ClassDef) and n.name == cls]
        if not found:
            raise ValueError(f"class {cls!r} not found")
        scope = found[-1].body
    defs = [n for n in scope if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef)) and n.name == leaf]
    if not defs:
        raise ValueError(f"function {function!r} not found")
    body = defs[-1].body
    first = body[1] if (len(body) > 1 and isinstance(body[0], ast.Expr)
                        and isinstance(body[0].value, ast.Constant) and isinstance(body[0].value.value, str)) else body[0]
    lines = source.splitlines(keepends=True)
    if first.lineno == defs[-1].lineno:
        raise ValueError(f"{function!r}: a one-line body cannot be broken this way")
    indent = re.match(r"[ \t]*", lines[first.lineno - 1]).group(0)
    lines.insert(first.lineno - 1, f"{indent}{BREAK_LINE}\n")
    return "".join(lines)


@dataclass
class Repo:
    path: Path
    base: str
    gold: str           # the unified diff that restores the function
    test_patch: str     # marks the graded test files


def make_repo(entry: dict, sdist: Path, workdir: Path) -> Repo:
    """The sdist unpacked, `entry['function']` broken, committed as the base of branch main."""
    workdir.mkdir(parents=True, exist_ok=True)
    with tarfile.open(sdist) as tf:
        top = tf.getnames()[0].split("/")[0]
        tf.extractall(workdir, filter=_ours)
    repo = workdir / top
    target = repo / entry["file"]
    original = target.read_text()
    target.write_text(break_function(original, entry["function"]))
    _git(repo, "init", "-q", "-b", "main")
    _git(repo, "add", "-A", "-f")
    _git(repo, "commit", "-qm", "base: the sdist with one function broken")
    base = _git(repo, "rev-parse", "HEAD").strip()
    target.write_text(original)
    gold = _git(repo, "diff")
    _git(repo, "checkout", "-q", "--", entry["file"])
    for rel in entry["tests"]:
        with open(repo / rel, "a") as f:
            f.write(TEST_MARK)
    test_patch = _git(repo, "diff")
    _git(repo, "checkout", "-q", "--", ".")
    return Repo(repo, base, gold, test_patch)


def record(entry: dict, repo: Repo, image: str) -> dict:
    """The swe JSONL record of the task (`paddock tasks import swe` reads it)."""
    return {"instance_id": f"{entry['name']}-{entry['version']}-{entry['function']}", "repo": str(repo.path),
            "base_commit": repo.base, "image": image, "patch": repo.gold, "test_patch": repo.test_patch,
            "problem_statement": f"`{entry['function']}` in {entry['file']} raises NotImplementedError; "
                                 "restore its behaviour.",
            "FAIL_TO_PASS": list(entry.get("fail_to_pass") or []), "PASS_TO_PASS": list(entry.get("pass_to_pass") or [])}


def corpus_image(store: ImageStore, python_image: Path, entries: list[dict]) -> str:
    """The digest of the corpus's test image (see the module docstring), built once per store."""
    dists = sorted((e["dist"], e["version"]) for e in entries if e.get("dist"))
    recipe = {"kind": "paddock-real-repos-image", "python_image": python_image.stem, "pip": list(IMAGE_REQUIREMENTS),
              "pth": SRC_PTH, "dists": dists, "rules": IMAGE_RULES}

    def builder(out: Path) -> None:
        with tempfile.TemporaryDirectory(prefix="paddock-real-repos-", dir=store.root / "tmp") as tmp:
            rootfs = Path(tmp) / "rootfs"
            subprocess.run(["unsquashfs", "-q", "-n", "-o", str(SIF_PARTITION_OFFSET), "-d", str(rootfs),
                            str(python_image)], check=True, capture_output=True)
            site = rootfs / SITE_DIR
            proc = subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--no-compile", "--no-deps",
                                   "--disable-pip-version-check", "--only-binary", ":all:",
                                   "--target", str(site), *IMAGE_REQUIREMENTS],
                                  capture_output=True, text=True, timeout=900, check=False)
            if proc.returncode != 0:
                raise IndexUnreachable(f"pip install --target failed: {proc.stderr.strip()[-600:]}")
            (site / "00-paddock-work-src.pth").write_text(SRC_PTH)
            for name, version in dists:       # the metadata an editable install leaves
                meta = site / f"{name}-{version}.dist-info"
                meta.mkdir()
                (meta / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n")
            imagebuild.build_image(rootfs, out)
    (store.root / "tmp").mkdir(parents=True, exist_ok=True)
    digest, _path = store.build_or_reuse(recipe, builder)
    return digest


def import_task(entry: dict, repo: Repo, image: str, store: ImageStore, workdir: Path) -> dict:
    """The task as `paddock tasks import swe` makes it (a layered import), as a task dict."""
    from controller.taskbank.importers import SweContext, import_source
    src = workdir / f"{entry['name']}.jsonl"
    src.write_text(json.dumps(record(entry, repo, image)) + "\n")
    [task] = import_source("swe", src, SweContext(store=store))
    return dict(task.canonical(), task_id=task.task_id)


# -- plain pytest in the same image: what the project's suite says without Paddock's grader ------

_VERBOSE = re.compile(r"^(\S.*?) (PASSED|FAILED|ERROR|SKIPPED|XFAIL|XPASS)\s*$", re.MULTILINE)   # `-v`, classic style
_ANSI = re.compile(r"\x1b\[[0-9;]*m")


def plain_pytest(runtime, store: ImageStore, task: dict, python_image: Path, gold: bool,
                 timeout_s: float = 300.0) -> tuple[dict[str, str], str]:
    """({node id: outcome}, output tail) of `python3 -m pytest -v FILES` in /work of a sandbox
    of the task's image and layers, with or without the gold patch applied."""
    from nodeagent.sandbox.runtime import Change, SandboxSpec
    from nodeagent.verifier.grade import graded_task
    from nodeagent.verifier.validate import own_image, reference_of, sandbox_layers
    graded = graded_task(task)
    image = own_image(python_image, graded)
    layers = sandbox_layers(runtime, image, graded)
    changes = []
    if gold:
        files, _ = reference_of(graded)
        changes = [Change(f"/work/{rel}", "modified", t.encode() if isinstance(t, str) else t, 0o644)
                   for rel, t in files.items()]
    sb = runtime.acquire(SandboxSpec(image=image, limits=dict(task.get("limits") or {}), layers=layers))
    try:
        if changes:
            sb.apply(changes)
        r = sb.exec(["python3", "-m", "pytest", "-v", "-o", "console_output_style=classic", "-p", "no:cacheprovider",
                     *task["checker"]["tests"]],
                    cwd="/work", timeout_s=timeout_s, output_cap=4 << 20)
    finally:
        sb.destroy()
    out = _ANSI.sub("", r.stdout.decode(errors="replace"))
    results: dict[str, str] = {}
    for nodeid, kind in _VERBOSE.findall(out):
        if results.get(nodeid) in (None, "passed"):       # a teardown ERROR after PASSED counts
            results[nodeid] = kind.lower()
    return results, (out + r.stderr.decode(errors="replace"))[-1200:]


def measure(runtime, store: ImageStore, task: dict, python_image: Path, p2p_sample: int = 5) -> dict:
    """FAIL_TO_PASS (failed or erred with the break, passed with the original) and a sample
    of PASS_TO_PASS (passed with both), by plain pytest."""
    broken, tail_b = plain_pytest(runtime, store, task, python_image, gold=False)
    fixed, tail_f = plain_pytest(runtime, store, task, python_image, gold=True)
    f2p = sorted(t for t, o in fixed.items() if o == "passed" and broken.get(t) in ("failed", "error"))
    both = sorted(t for t, o in fixed.items() if o == "passed" and broken.get(t) == "passed")
    step = max(1, len(both) // max(1, p2p_sample))
    return {"fail_to_pass": f2p, "pass_to_pass": both[::step][:p2p_sample],
            "plain": {"fixed": _count(fixed), "broken": _count(broken)},
            "tails": {"fixed": tail_f, "broken": tail_b}}


def _count(results: dict[str, str]) -> dict[str, int]:
    out: dict[str, int] = {}
    for o in results.values():
        out[o] = out.get(o, 0) + 1
    return out


# -- grading through Paddock ----------------------------------------------------------------------

@dataclass
class Graded:
    name: str
    version: str
    tests: int                      # FAIL_TO_PASS + PASS_TO_PASS
    gold: str                       # pass / fail / timeout / infra_error
    null: str
    wall_s: float
    gold_detail: str = ""
    null_detail: str = ""
    features: list = field(default_factory=list)

    @property
    def false_negative(self) -> bool:
        return self.gold != "pass"


def grade_project(runtime, task: dict, python_image: Path, entry: dict, clock=time.monotonic) -> Graded:
    """Gold and null graded by `validate_task` (quick: reference and null, through `verify`)."""
    from nodeagent.verifier.validate import validate_task
    t0 = clock()
    v = validate_task(runtime, python_image, task, workers=2, quick=True)
    ref = v.cases.get("reference", {"outcome": "infra_error", "detail": "; ".join(v.reasons)})
    null = v.cases.get("null", {"outcome": "-", "detail": ""})
    return Graded(entry["name"], entry["version"], len(entry.get("fail_to_pass") or []) + len(entry.get("pass_to_pass") or []),
                  ref["outcome"], null["outcome"], clock() - t0, ref.get("detail", ""), null.get("detail", ""),
                  list(entry.get("features") or []))
