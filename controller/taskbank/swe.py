"""The swe importer: SWE-bench / SWE-Gym-style JSONL records into repository tasks.

A record is {instance_id, repo, base_commit, problem_statement, test_patch, FAIL_TO_PASS,
PASS_TO_PASS[, patch, image, setup]}. `repo` is a local git repository: an absolute path, a
path relative to the JSONL file, or (`repos_dir` given) `owner/name` resolved against a
directory of local clones (`<repos_dir>/owner/name`, `<repos_dir>/owner__name` or
`<repos_dir>/name`). The gold `patch` is kept as the hidden reference (`gold.patch`, and the
post-image of each file it changes under `gold/<path>`: validation applies it). `image`
(`sha256:<digest>` of an image in the store, or a path `paddock image build` accepts: rootfs
directory, tarball, OCI layout, `docker save` archive) and `setup` (shell commands run once per
task on the node, captured as a layer) are optional.

The visible tree is the repository at its base commit with a scrubbed `.git` (only the base
commit's history; no reflogs, tags, remotes, stashes or hooks; an index without stat data, so
the same record gives the same bytes, hence the same task id, every time). With an image
store (`store`) the tree becomes a content-addressed read-only layer (`layers.treelayer`,
prefix /work, symlinks and modes kept): every task at the same commit shares one layer, the
task carries its digest, and memory stays bounded by one record. Without a store the tree is
inlined in the package's files (small repositories only; symlinks refused).

Must not import zmq. Runs `git` (argv lists, never a shell).
"""
from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import tempfile
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Optional

from controller.contracts.tasks import Budgets, Limits, Task, TaskError
from layers import build as imagebuild
from layers.store import ImageStore
from layers.treelayer import ensure_tree_layer

TEST_PATCH_FILE = "test.patch"
GOLD_PATCH_FILE = "gold.patch"
GOLD_DIR = "gold"
GIT_TIMEOUT_S = 600.0
REPO_LIMITS = {"memory_mb": 2048, "pids": 256, "disk_mb": 1024}   # a checkout plus its build


class ImportSourceError(TaskError):
    """A source record cannot be imported; the message names the file and line."""


@dataclass(frozen=True)
class SweContext:
    """Where an import puts repository layers and built images, and where clones live."""
    store: Optional[ImageStore] = None
    repos_dir: Optional[Path] = None


def _git(cwd: Path, *argv: str, check: bool = True) -> str:
    cmd = ["git", "-c", "core.hooksPath=/dev/null", "-c", "protocol.file.allow=always",
           "-c", "pack.threads=1", "-c", "gc.writeCommitGraph=false", *argv]
    try:
        proc = subprocess.run(cmd, cwd=cwd, capture_output=True, text=True, timeout=GIT_TIMEOUT_S,
                              env={**os.environ, "GIT_TERMINAL_PROMPT": "0", "GIT_CONFIG_NOSYSTEM": "1",
                                   "HOME": str(cwd)})
    except subprocess.TimeoutExpired:
        raise ImportSourceError(f"{' '.join(cmd)} (in {cwd}) timed out") from None
    if check and proc.returncode != 0:
        raise ImportSourceError(f"{' '.join(cmd)} (in {cwd}) exited {proc.returncode}: "
                                f"{proc.stderr.strip()[:500]}")
    return proc.stdout


def scrubbed_checkout(repo: Path, base_commit: str, dest: Path) -> None:
    """Clone `repo` into `dest` at `base_commit` with nothing beyond it: the base commit and
    its ancestors on one branch `main`; no other ref, tag, remote, reflog, stash, hook or
    unreachable object; an index with no stat data (deterministic bytes)."""
    if not (repo / ".git").exists() and not (repo / "HEAD").exists():
        raise ImportSourceError(f"{repo}: not a git repository")
    _git(dest.parent, "clone", "--quiet", "--no-local", "--no-checkout", "--no-tags", str(repo), dest.name)
    full = _git(dest, "rev-parse", "--verify", "--quiet", f"{base_commit}^{{commit}}", check=False).strip()
    if not full:
        raise ImportSourceError(f"{repo}: base commit {base_commit!r} not found")
    _git(dest, "checkout", "--quiet", "-B", "main", full)
    _git(dest, "remote", "remove", "origin")
    for ref in _git(dest, "for-each-ref", "--format=%(refname)").split():
        if ref != "refs/heads/main":
            _git(dest, "update-ref", "-d", ref)
    _git(dest, "reflog", "expire", "--expire=all", "--all")
    # Pack afresh (-F: no object or delta reused from the clone's pack, whose bytes vary from run
    # to run) with one thread: the same record gives the same pack, hence the same layer.
    _git(dest, "repack", "-q", "-a", "-d", "-F")
    _git(dest, "prune", "--expire=now")
    git_dir = dest / ".git"
    head = _git(dest, "rev-parse", "HEAD").strip()
    (git_dir / "refs" / "heads").mkdir(parents=True, exist_ok=True)
    (git_dir / "refs" / "heads" / "main").write_text(head + "\n")
    for leftover in ("logs", "hooks", "FETCH_HEAD", "ORIG_HEAD", "packed-refs", "description", "index"):
        target = git_dir / leftover
        if target.is_dir():
            shutil.rmtree(target)
        elif target.exists():
            target.unlink()
    _git(dest, "read-tree", "HEAD")     # an index without timestamps: same record, same bytes


def _read_tree(root: Path) -> dict[str, bytes]:
    out = {}
    for dirpath, dirnames, filenames in os.walk(root):
        dirnames.sort()
        for name in sorted(filenames) + sorted(d for d in dirnames if os.path.islink(os.path.join(dirpath, d))):
            full = Path(dirpath) / name
            if full.is_symlink():
                raise ImportSourceError(f"{full}: symbolic links need a layered import "
                                        "(`paddock tasks import swe ... --store DIR`)")
            out[full.relative_to(root).as_posix()] = full.read_bytes()
    return out


def patched_paths(patch: str) -> list[str]:
    return sorted(set(re.findall(r"^\+\+\+ b/(\S+)", patch, flags=re.M)))


def resolve_repo(spec: str, source: Path, repos_dir: Optional[Path]) -> Path:
    """The local clone a record's `repo` names (see the module docstring)."""
    path = Path(spec).expanduser()
    if path.is_absolute():
        return path
    candidates = []
    if repos_dir is not None:
        owner, _, name = spec.partition("/")
        candidates += [repos_dir / spec, repos_dir / f"{owner}__{name}", repos_dir / (name or owner)]
    candidates.append(source.parent / path)
    for c in candidates:
        if c.exists():
            return c.resolve()
    raise ImportSourceError(f"repository {spec!r} not found; tried {', '.join(str(c) for c in candidates)}"
                            + ("" if repos_dir else " (give --repos DIR for owner/name records)"))


def task_image(rec: dict, ctx: SweContext) -> str:
    """The record's image: a digest (kept), a buildable path (built once into the store), or
    the built-in python image."""
    image = rec.get("image")
    if not image:
        return "builtin:python"
    if not isinstance(image, str):
        raise ValueError("'image' must be a string")
    if image.startswith("sha256:") or image == "builtin:python":
        return image
    if ctx.store is None:
        raise ValueError(f"'image' {image!r} is a path: building it needs an image store (--store)")
    src = Path(image) if Path(image).is_absolute() else Path(rec["_source_dir"]) / image
    if not src.exists():
        raise ValueError(f"'image' {src} does not exist")
    recipe = {"source": imagebuild.source_content_key(src), "arch": None,
              "build_rules": imagebuild.BUILD_RULES_VERSION}
    digest, _path = ctx.store.build_or_reuse(recipe, lambda out: imagebuild.build_image(src, out))
    return digest


def _apply(cwd: Path, patch: str, name: str, what: str) -> None:
    (cwd.parent / name).write_text(patch)
    try:
        _git(cwd, "apply", "--whitespace=nowarn", str(cwd.parent / name))
    except ImportSourceError as exc:
        raise ImportSourceError(f"the {what} does not apply at the base commit: {exc}") from None


def test_ids(rec: dict, key: str) -> list[str]:
    """A list of test ids; the public SWE-bench files hold it as a JSON-encoded string."""
    value = rec.get(key) or []
    if isinstance(value, str):
        try:
            value = json.loads(value)
        except ValueError:
            raise ValueError(f"{key!r} is a string but not a JSON list of test ids: {value[:80]!r}") from None
    if not isinstance(value, list) or not all(isinstance(v, str) and v for v in value):
        raise ValueError(f"{key!r} must be a list of test ids (strings)")
    return value


def _hidden_of(work: Path, tmp: Path, test_patch: str, gold: str) -> dict[str, Any]:
    """The hidden tree: the test patch, its test files after it, and the gold reference."""
    patched = tmp / "patched"
    _git(tmp, "clone", "--quiet", "--no-local", str(work), "patched")
    _apply(patched, test_patch, TEST_PATCH_FILE, "test_patch")
    hidden: dict[str, Any] = {TEST_PATCH_FILE: test_patch}
    for rel in patched_paths(test_patch):
        hidden[rel] = (patched / rel).read_bytes()
    if gold:
        _apply(patched, gold, GOLD_PATCH_FILE, "gold patch")
        hidden[GOLD_PATCH_FILE] = gold
        for rel in patched_paths(gold):
            if (patched / rel).is_file():
                hidden[f"{GOLD_DIR}/{rel}"] = (patched / rel).read_bytes()
    return hidden


def swe_task(rec: dict, source: Path, lineno: int, ctx: SweContext = SweContext()) -> Task:
    repo = resolve_repo(str(rec["repo"]), source, ctx.repos_dir)
    base, test_patch = rec["base_commit"], rec["test_patch"]
    gold = rec.get("patch") or ""
    if not isinstance(gold, str):
        raise ValueError("'patch' (the gold fix) must be a unified diff string")
    f2p, p2p = test_ids(rec, "FAIL_TO_PASS"), test_ids(rec, "PASS_TO_PASS")
    if not f2p:
        raise ValueError("'FAIL_TO_PASS' must list at least one test")
    test_files = patched_paths(test_patch)
    if not test_files:
        raise ValueError("'test_patch' changes no file ('+++ b/<path>' lines)")
    setup = rec.get("setup") or []
    if isinstance(setup, str):
        setup = [setup]
    if not isinstance(setup, list) or not all(isinstance(c, str) and c for c in setup):
        raise ValueError("'setup' must be a list of shell commands")
    image = task_image({**rec, "_source_dir": str(source.parent)}, ctx)
    files: dict[str, Any] = {}
    layers: tuple[str, ...] = ()
    with tempfile.TemporaryDirectory(prefix="paddock-swe-") as tmp_name:
        tmp = Path(tmp_name)
        work = tmp / "repo"
        scrubbed_checkout(repo, base, work)
        hidden = _hidden_of(work, tmp, test_patch, gold)
        if ctx.store is not None:
            layers = (ensure_tree_layer(ctx.store, work, "/work")[0],)
        else:
            files = _read_tree(work)
    protected = tuple(p for p in test_files if p in files)
    name = rec.get("instance_id", f"{source.stem}-{lineno}")
    instruction = (f"The repository is checked out at /work (git, branch main). Resolve this "
                   f"issue by changing the code; do not modify the tests.\n\n"
                   f"{rec['problem_statement'].strip()}")
    limits = {"limits": Limits(**{**asdict(Limits()), **REPO_LIMITS})} if layers else {}
    return Task(name=f"swe/{slug(name)}", family="swe", instruction=instruction, image=image,
                files=files, hidden=hidden, protected=protected, setup=tuple(setup), layers=layers,
                checker={"kind": "pytest", "tests": test_files, "fail_to_pass": f2p, "pass_to_pass": p2p},
                budgets=Budgets(max_steps=30, wall_s=600.0), **limits)


def slug(text: str) -> str:
    return re.sub(r"[^A-Za-z0-9._-]+", "_", str(text)).strip("_") or "task"
