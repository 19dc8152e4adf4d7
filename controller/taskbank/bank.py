"""The task bank on disk: task packages and task-set manifests (`paddock tasks ...` is
controller/cli/tasks.py).

Layout (docs/tasks.md):

    <bank>/tasks/<hex16>/task.yaml     one package per task, named by its content hash
    <bank>/tasks/<hex16>/files/...     visible tree (placed under /work of the agent's sandbox)
    <bank>/tasks/<hex16>/hidden/...    hidden tree (only the verifier's sandbox sees it)
    <bank>/sets/<name>.yaml            manifest: task ids, names and splits, and its own hash
    <bank>/curriculum.sqlite           pass-rate estimates (controller/taskbank/curriculum.py)
    <bank>/contamination/*.json        contamination reports (controller/taskbank/contamination.py)

Reading a package or manifest checks everything a human could have got wrong and raises
`TaskError` naming the file: missing or unknown keys, a package whose content does not match
its recorded id, a manifest naming an unknown task or listing one id twice with different
names, a manifest whose recorded hash does not match its content.

Package files are written atomically (temp name + rename). Must not import: zmq, nodeagent.
"""
from __future__ import annotations

import json
import os
import re
import shutil
import stat
import tempfile
from dataclasses import asdict, fields
from pathlib import Path
from typing import Any, Iterable

import yaml

from controller.contracts.safeload import Bounds, ParseLimitError, load_yaml
from controller.contracts.tasks import SPLITS, Budgets, Limits, Task, TaskError, TaskSet
from controller.ondisk.fileio import atomic_write

TASK_FILE = "task.yaml"
FILES_DIR = "files"
HIDDEN_DIR = "hidden"
REQUIRED_KEYS = ("name", "family", "instruction", "checker")
OPTIONAL_KEYS = ("id", "image", "protected", "setup", "budgets", "limits", "network", "tools", "layers", "services",
                 "user")
DEFAULT_BANK_ENV = "PADDOCK_TASKBANK"
# A manifest lists up to millions of tasks (7 nodes each) and never needs an alias.
MANIFEST_BOUNDS = Bounds(max_nodes=50_000_000, max_aliases=8, max_bytes=1 << 30)
# A package's files: only regular files (a FIFO would hang the import, a device node stream
# forever), each and all together capped.
MAX_FILE_BYTES = 256 << 20
MAX_TREE_BYTES = 1 << 30
# task.yaml itself: an instruction is at most 1 Mi characters, so 8 MiB is room to spare, and a
# 50 MB document is refused before the (pure Python) YAML parser spends minutes on it.
PACKAGE_BOUNDS = Bounds(max_bytes=8 << 20)
SET_NAME = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.-]{0,127}")
LIST_KEYS = ("protected", "setup", "tools", "layers")


def default_bank_dir() -> Path:
    return Path(os.environ.get(DEFAULT_BANK_ENV) or "taskbank")


# -- one package ----------------------------------------------------------------------------

def _typed_section(path: Path, key: str, value: Any, cls) -> Any:
    if value is None:
        return cls()
    if not isinstance(value, dict):
        raise TaskError(f"{path}: '{key}' must be a mapping")
    valid = [f.name for f in fields(cls)]
    unknown = sorted(set(value) - set(valid))
    if unknown:
        raise TaskError(f"{path}: unknown key '{key}.{unknown[0]}'; valid: {', '.join(valid)}")
    return cls(**value)


def _regular_file(path: Path) -> os.stat_result:
    """lstat of `path`; TaskError naming it unless it is a regular file of at most MAX_FILE_BYTES."""
    st = path.lstat()
    if stat.S_ISLNK(st.st_mode):
        raise TaskError(f"{path}: symbolic links are not allowed in a task package")
    if not stat.S_ISREG(st.st_mode):
        kind = ("a FIFO" if stat.S_ISFIFO(st.st_mode) else "a socket" if stat.S_ISSOCK(st.st_mode)
                else "a device node" if stat.S_ISCHR(st.st_mode) or stat.S_ISBLK(st.st_mode) else "not a regular file")
        raise TaskError(f"{path}: {kind}; a task package holds only regular files and directories")
    if st.st_size > MAX_FILE_BYTES:
        raise TaskError(f"{path}: {st.st_size} bytes; a package file may be at most {MAX_FILE_BYTES} bytes")
    return st


def _read_tree(root: Path) -> dict[str, str | bytes]:
    out: dict[str, str | bytes] = {}
    if not root.exists():
        return out
    total = 0
    for dirpath, dirnames, filenames in os.walk(root):
        dirnames.sort()
        for name in sorted(filenames) + [d for d in dirnames if os.path.islink(os.path.join(dirpath, d))]:
            full = Path(dirpath) / name
            rel = full.relative_to(root).as_posix()
            _regular_file(full)
            # O_NONBLOCK: a file swapped for a FIFO after the check cannot block the open
            fd = os.open(full, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
            with os.fdopen(fd, "rb") as f:
                if not stat.S_ISREG(os.fstat(fd).st_mode):
                    raise TaskError(f"{full}: not a regular file")
                data = f.read(MAX_FILE_BYTES + 1)
            total += len(data)
            if len(data) > MAX_FILE_BYTES or total > MAX_TREE_BYTES:
                raise TaskError(f"{full}: a package file may be at most {MAX_FILE_BYTES} bytes and a "
                                f"package's files at most {MAX_TREE_BYTES} bytes together")
            out[rel] = data
    return out


def _string_list(path: Path, key: str, value: Any) -> tuple[str, ...]:
    """A list of strings (a bare string is refused: `setup: 'rm -rf /'` is not eight commands)."""
    if value is None:
        return ()
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        raise TaskError(f"'{key}' must be a list of strings, got {type(value).__name__}"
                        + (f" holding {type(next(v for v in value if not isinstance(v, str))).__name__}"
                           if isinstance(value, list) else ""))
    return tuple(value)


def load_package(directory: str | os.PathLike) -> Task:
    """Read a task package directory (task.yaml + files/ + hidden/) into a Task."""
    directory = Path(directory)
    path = directory / TASK_FILE
    try:
        _regular_file(path)
        meta = load_yaml(path, PACKAGE_BOUNDS)
    except OSError as exc:
        raise TaskError(f"{path}: cannot read task package: {exc.strerror}") from None
    except ParseLimitError as exc:
        raise TaskError(str(exc)) from None
    if not isinstance(meta, dict):
        raise TaskError(f"{path}: must be a mapping of keys to values")
    odd = [k for k in meta if not isinstance(k, str)]
    if odd:
        raise TaskError(f"{path}: key {odd[0]!r} is not a string; valid keys: "
                        f"{', '.join(REQUIRED_KEYS + OPTIONAL_KEYS)}")
    missing = [k for k in REQUIRED_KEYS if k not in meta]
    if missing:
        raise TaskError(f"{path}: missing key(s) {', '.join(missing)}")
    unknown = sorted(set(meta) - set(REQUIRED_KEYS) - set(OPTIONAL_KEYS))
    if unknown:
        raise TaskError(f"{path}: unknown key(s) {', '.join(unknown)}; valid: "
                        f"{', '.join(REQUIRED_KEYS + OPTIONAL_KEYS)}")
    try:
        task = Task(
            name=meta["name"], family=meta["family"], instruction=meta["instruction"],
            image=meta.get("image", "builtin:python"),
            files=_read_tree(directory / FILES_DIR), hidden=_read_tree(directory / HIDDEN_DIR),
            checker=meta["checker"] or {}, protected=_string_list(path, "protected", meta.get("protected")),
            setup=_string_list(path, "setup", meta.get("setup")),
            budgets=_typed_section(path, "budgets", meta.get("budgets"), Budgets),
            limits=_typed_section(path, "limits", meta.get("limits"), Limits),
            network=meta.get("network", "none"), tools=_string_list(path, "tools", meta.get("tools")),
            layers=_string_list(path, "layers", meta.get("layers")), services=meta.get("services") or {},
            user=meta.get("user") or {})
    except TaskError as exc:
        raise TaskError(f"{path}: {exc}") from None
    except (TypeError, AttributeError) as exc:
        raise TaskError(f"{path}: malformed field: {exc}") from None
    recorded = meta.get("id")
    if recorded is not None and recorded != task.task_id:
        raise TaskError(f"{path}: content hashes to {task.task_id} but the package records id "
                        f"{recorded} (edited after it was written?)")
    return task


def package_meta(task: Task) -> dict[str, Any]:
    return {"id": task.task_id, "name": task.name, "family": task.family,
            "instruction": task.instruction, "image": task.image,
            "checker": json.loads(json.dumps(task.checker)), "protected": list(task.protected),
            "setup": list(task.setup), "budgets": asdict(task.budgets),
            "limits": asdict(task.limits),
            "network": task.network if task.network == "none" else list(task.network),
            **({"tools": list(task.tools)} if task.tools else {}),
            **({"layers": list(task.layers)} if task.layers else {}),
            **({"services": json.loads(json.dumps(task.services))} if task.services else {}),
            **({"user": json.loads(json.dumps(task.user))} if task.user else {})}


def write_package(task: Task, directory: str | os.PathLike) -> Path:
    """Write `task` as a package at `directory` (built in a temp dir, then renamed into place)."""
    directory = Path(directory)
    directory.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=".pkg-", dir=directory.parent))
    try:
        (tmp / TASK_FILE).write_text(yaml.safe_dump(package_meta(task), sort_keys=False,
                                                    allow_unicode=True, width=100))
        for sub, tree in ((FILES_DIR, task.files), (HIDDEN_DIR, task.hidden)):
            for rel, content in tree.items():
                target = tmp / sub / rel
                target.parent.mkdir(parents=True, exist_ok=True)
                target.write_bytes(content.encode() if isinstance(content, str) else content)
        os.rename(tmp, directory)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return directory


# -- the bank -------------------------------------------------------------------------------

class TaskBank:
    """A directory of task packages and task-set manifests."""

    def __init__(self, root: str | os.PathLike | None = None):
        self.root = Path(root) if root is not None else default_bank_dir()

    @property
    def tasks_dir(self) -> Path:
        return self.root / "tasks"

    @property
    def sets_dir(self) -> Path:
        return self.root / "sets"

    def package_dir(self, task_id: str) -> Path:
        return self.tasks_dir / task_id.removeprefix("sha256:")[:16]

    def put_task(self, task: Task) -> Path:
        """Store a package (idempotent); a stored package with other content is an error."""
        directory = self.package_dir(task.task_id)
        if directory.exists():
            stored = load_package(directory)
            if stored.task_id != task.task_id:
                raise TaskError(f"{directory}: holds task {stored.task_id}, not {task.task_id} "
                                f"(duplicate task id prefix with different content)")
            return directory
        try:
            return write_package(task, directory)
        except OSError:
            if directory.exists():       # a concurrent writer won the rename: same content
                return directory
            raise

    def get_task(self, task_id: str) -> Task:
        directory = self.package_dir(task_id)
        if not (directory / TASK_FILE).exists():
            raise TaskError(f"task {task_id} is not in the bank at {self.root}")
        task = load_package(directory)
        if task.task_id != task_id:
            raise TaskError(f"{directory}: content hashes to {task.task_id}, expected {task_id}")
        return task

    def manifest_path(self, name: str) -> Path:
        if not isinstance(name, str) or not SET_NAME.fullmatch(name):
            raise TaskError(f"task set name {str(name)[:80]!r}: use 1 to 128 letters, digits, '-', '_' and '.' "
                            f"(not starting with '.' or '-')")
        return self.sets_dir / f"{name}.yaml"

    def put_set(self, taskset: TaskSet) -> Path:
        """Store every task of the set and its manifest; return the manifest path. A set name
        that cannot be stored is refused before any package is written."""
        self.manifest_path(taskset.name)
        for task in taskset.tasks:
            self.put_task(task)
        manifest = taskset.manifest()
        manifest["manifest_hash"] = taskset.manifest_hash
        path = self.manifest_path(taskset.name)
        path.parent.mkdir(parents=True, exist_ok=True)
        atomic_write(path, yaml.safe_dump(manifest, sort_keys=False, width=100), fsync=False)
        return path

    def set_names(self) -> list[str]:
        if not self.sets_dir.is_dir():
            return []
        return sorted(p.stem for p in self.sets_dir.glob("*.yaml"))

    def load_set(self, name: str, broken: list[tuple[dict, str]] | None = None) -> TaskSet:
        """A stored set (`broken`: see `load_manifest`)."""
        path = self.manifest_path(name)
        if not path.exists():
            known = ", ".join(self.set_names()) or "none"
            raise TaskError(f"task set {name!r} not found at {path} (known sets: {known})")
        return load_manifest(path, self, broken)

    def splits(self, name: str) -> dict[str, list[str]]:
        """Split → task ids of a stored set."""
        ts = self.load_set(name)
        out: dict[str, list[str]] = {s: [] for s in SPLITS}
        for t in ts.tasks:
            out["heldout" if t.task_id in ts.heldout else "train"].append(t.task_id)
        return out


def load_manifest(path: Path, bank: TaskBank, broken: list[tuple[dict, str]] | None = None) -> TaskSet:
    """Read a manifest, resolve its tasks in `bank`, check its recorded hash. With `broken` (a
    list), a task that cannot be read is appended there as (manifest entry, error) and left out
    instead of failing the whole set (the hash is then not checked): `tasks validate` refuses
    that task and goes on with the others."""
    try:
        data = load_yaml(path, MANIFEST_BOUNDS)
    except OSError as exc:
        raise TaskError(f"{path}: cannot read manifest: {exc.strerror or exc}") from None
    except ParseLimitError as exc:
        raise TaskError(f"manifest {exc}") from None
    if not isinstance(data, dict) or not isinstance(data.get("tasks"), list):
        raise TaskError(f"{path}: a manifest needs 'name' and a 'tasks' list")
    unknown = sorted(set(data) - {"name", "tasks", "manifest_hash"})
    if unknown:
        raise TaskError(f"{path}: unknown key(s) {', '.join(unknown)}")
    seen: dict[str, dict] = {}
    tasks, heldout = [], set()
    for i, entry in enumerate(data["tasks"]):
        if not isinstance(entry, dict) or set(entry) != {"task_id", "name", "split"}:
            raise TaskError(f"{path}: tasks[{i}] must have exactly task_id, name and split")
        if entry["split"] not in SPLITS:
            raise TaskError(f"{path}: tasks[{i}].split {entry['split']!r} is not one of {SPLITS}")
        tid = entry["task_id"]
        if tid in seen:
            if seen[tid] != entry:
                raise TaskError(f"{path}: task id {tid} is listed twice with different "
                                f"content ({seen[tid]['name']!r} and {entry['name']!r})")
            continue
        seen[tid] = entry
        try:
            try:
                task = bank.get_task(tid)
            except TaskError as exc:
                raise TaskError(f"{path}: tasks[{i}] names an unknown task: {exc}") from None
            if task.name != entry["name"]:
                raise TaskError(f"{path}: tasks[{i}] says name {entry['name']!r} but task {tid} "
                                f"is named {task.name!r}")
        except TaskError as exc:
            if broken is None:
                raise
            broken.append((dict(entry), str(exc)))
            continue
        tasks.append(task)
        if entry["split"] == "heldout":
            heldout.add(tid)
    try:
        ts = TaskSet(name=str(data.get("name")), tasks=tuple(tasks), heldout=frozenset(heldout))
    except TaskError as exc:
        raise TaskError(f"{path}: {exc}") from None
    recorded = data.get("manifest_hash")
    if recorded is not None and not broken and recorded != ts.manifest_hash:
        raise TaskError(f"{path}: content hashes to {ts.manifest_hash} but the manifest records "
                        f"{recorded} (edited by hand?)")
    return ts


def make_set(name: str, tasks: Iterable[Task], split: str = "train") -> TaskSet:
    if split not in SPLITS:
        raise TaskError(f"split {split!r} is not one of {SPLITS}")
    tasks = tuple(tasks)
    by_id: dict[str, Task] = {}
    for t in tasks:
        by_id.setdefault(t.task_id, t)
    unique = tuple(by_id.values())
    heldout = frozenset(by_id) if split == "heldout" else frozenset()
    return TaskSet(name=name, tasks=unique, heldout=heldout)


def find_task(bank: TaskBank, ref: str, set_name: str | None = None) -> Task:
    """A task by id, id prefix (4+ hex digits) or name; in one set if `set_name` is given."""
    if set_name:
        ts = bank.load_set(set_name)
        for t in ts.tasks:
            if ref in (t.name, t.task_id) or t.task_id.removeprefix("sha256:").startswith(ref):
                return t
        raise TaskError(f"no task {ref!r} in set {set_name!r}")
    hexref = ref.removeprefix("sha256:")
    if bank.tasks_dir.is_dir():
        hits = [d for d in sorted(bank.tasks_dir.iterdir()) if not d.name.startswith(".")
                and (d.name.startswith(hexref[:16]) and len(hexref) >= 4)]
        if len(hits) == 1:
            return load_package(hits[0])
        if len(hits) > 1:
            raise TaskError(f"task id prefix {ref!r} is ambiguous: {len(hits)} tasks match")
        for name in bank.set_names():
            for t in bank.load_set(name).tasks:
                if t.name == ref:
                    return t
    raise TaskError(f"no task {ref!r} in the bank at {bank.root}")
