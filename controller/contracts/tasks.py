"""Task packages: the model, its canonical content hash, and task-set manifests.

A task is what one rollout attempts: an instruction the agent sees, visible files placed in
the agent's `/work`, hidden files that only the verifier's sandbox ever receives, a checker
spec, budgets and sandbox limits. Its id is the hash of its canonical content, so any change
to any field is a different task.

File contents are text (`str`) or, for files that are not UTF-8 (a scrubbed `.git` of a
repository task), `bytes`; the canonical form encodes bytes as `{"base64": ...}` so it stays
JSON. The on-disk package format lives in controller/taskbank/bank.py (docs/tasks.md).

`LeaseTask` is the task as a lease carries it to a node (`Task.canonical()` plus the bank's
`task_id`, `image_digest`, `taskset_hash` and `split`), decoded once when the lease arrives
(`LeaseTask.decode`); a malformed one is a `TaskError` naming the field.

`GradedTask` is what the verifier receives: the fields grading reads, file contents as `str` or
`bytes`, the checker spec typed and validated (`CheckerSpec`). It is built once at the
grader's caller's edge: from the node's `LeaseTask` (`GradedTask.of`) or from a task's JSON
(`GradedTask.from_json`: a task file, a run's tasks.json, a validation's task); a malformed
one is a `TaskError` naming the task and the field. Nothing downstream decodes or changes it.

No I/O beyond reading task files. Must not import: zmq, sqlite3, socket, subprocess, Paddock
other than controller.contracts.
"""
from __future__ import annotations

import base64
import dataclasses
import hashlib
import json
import math
import re
from dataclasses import dataclass, field
from typing import Any, Mapping, Optional

from controller.contracts.browser_tools import browser_tool_set
from controller.contracts.checkerspec import CheckerSpec, SpecError, validate_spec
from controller.contracts.network import PolicyError, parse_policy
from controller.contracts.services import ServiceSpecError, validate_services, validate_user
from controller.contracts.tools import ToolSetError, tool_set

FAMILIES = ("python", "math", "swe", "conversational", "web")
SPLITS = ("train", "heldout")
CHECKER_KINDS = ("pytest", "math", "exact", "regex", "command", "state", "webstate")
IMAGES = ("builtin:python", "builtin:browser")
MAX_NAME_CHARS = 256
MAX_INSTRUCTION_CHARS = 1 << 20
# control characters (a newline in a name forges a row of `paddock tasks list`), line separators
_CONTROL = re.compile(r"[\x00-\x1f\x7f-\x9f\u2028\u2029]")


class TaskError(ValueError):
    """A task package is malformed; the message names the task and the field."""


class BudgetError(TaskError):
    """A task's budgets are malformed; the message names the key."""


class LimitError(TaskError):
    """A sandbox limit is zero, negative, not finite or beyond any node; the message names the key."""


# (type, smallest, largest) of every sandbox limit and budget. The largest values are beyond
# any node this runs on (1 TiB of memory, the kernel's pid_max ceiling): a value above them is
# a typo, not a big machine. A node refuses a task above its own capacity when it runs it.
LIMIT_RANGES: dict[str, tuple[type, float, float]] = {
    "memory_mb": (int, 1, 1 << 20), "pids": (int, 1, 4_194_304), "disk_mb": (int, 1, 1 << 20),
    "cpu": (float, 0.01, 1024.0), "nofile": (int, 3, 1 << 20),
}
BUDGET_RANGES: dict[str, tuple[type, float, float]] = {
    "max_steps": (int, 1, 100_000), "wall_s": (float, 0.001, 7 * 86400.0),
    "max_tokens": (int, 1, 1 << 30), "observation_bytes": (int, 1, 1 << 30),
    "max_model_calls": (int, 0, 1_000_000),
    # Deadlines (docs/tasks.md "Deadlines"): seconds per phase of a rollout attempt on the node
    # and for the whole attempt; 0 takes the node's default (nodeagent/agent/guard.py), and
    # `total_s` 0 means no end-to-end deadline beyond the phases'.
    "create_s": (float, 0.0, 7 * 86400.0), "setup_s": (float, 0.0, 7 * 86400.0),
    "verify_s": (float, 0.0, 7 * 86400.0), "teardown_s": (float, 0.0, 7 * 86400.0),
    "total_s": (float, 0.0, 30 * 86400.0),
    # The harness's no-progress detector (docs/harness.md): the same tool call with the same
    # observation this many times, or this many turns in a row without output, end the
    # episode as the policy's failure; 0 takes the default (nodeagent/harness/progress.py).
    "no_progress_repeats": (int, 0, 1_000_000), "no_output_turns": (int, 0, 1_000_000),
}
# Budget keys a run's config may default for the tasks that leave them at 0.
RUN_DEFAULT_KEYS = ("create_s", "setup_s", "verify_s", "teardown_s", "total_s", "no_progress_repeats",
                    "no_output_turns")
# Budget keys added after the first task ids were made: left out of the canonical form at 0.
LATER_BUDGET_KEYS = ("max_model_calls", "create_s", "setup_s", "verify_s", "teardown_s", "total_s",
                     "no_progress_repeats", "no_output_turns")


def checked_number(key: str, value: Any, kind: type, lo: float, hi: float, what: str = "limit",
                   error: type | None = None) -> int | float:
    """`value` as `kind` if it is a finite number in [lo, hi]; else an error naming `key`."""
    error = error or LimitError
    ok = (not isinstance(value, bool) and isinstance(value, (int, float)) and math.isfinite(value)
          and lo <= value <= hi and (kind is not int or int(value) == value))
    if not ok:
        noun = "an integer" if kind is int else "a number"
        raise error(f"{what} {key!r} must be {noun} from {_num(lo, kind)} to {_num(hi, kind)}, got {value!r}")
    return kind(value)


def _num(x: float, kind: type) -> str:
    return str(int(x)) if kind is int else f"{x:g}"


def check_limits(limits: Mapping[str, Any], what: str = "limit") -> dict[str, int | float]:
    """Every known limit in `limits` checked (see LIMIT_RANGES); unknown keys are an error."""
    out = {}
    for key, value in limits.items():
        if key not in LIMIT_RANGES:
            raise LimitError(f"{what} {key!r} is unknown; valid: {', '.join(LIMIT_RANGES)}")
        out[key] = checked_number(key, value, *LIMIT_RANGES[key], what=what)
    return out


@dataclass(frozen=True)
class Budgets:
    """A task's rollout budgets: declared here, enforced by the node's harness
    (nodeagent.harness.loop imports this class; the controller never imports the node agent)."""
    max_steps: int = 12
    wall_s: float = 120.0
    max_tokens: int = 32768
    observation_bytes: int = 16384
    # Model calls the gateway answers per rollout; 0 means max_steps (left out of the task's
    # canonical form at 0, so existing task ids do not move).
    max_model_calls: int = 0
    # Deadlines and the no-progress detector (BUDGET_RANGES): 0 means the node's default.
    create_s: float = 0.0
    setup_s: float = 0.0
    verify_s: float = 0.0
    teardown_s: float = 0.0
    total_s: float = 0.0
    no_progress_repeats: int = 0
    no_output_turns: int = 0

    @classmethod
    def from_dict(cls, d: dict | None) -> "Budgets":
        d = dict(d or {})
        unknown = sorted(set(d) - set(cls.__dataclass_fields__))
        if unknown:
            raise BudgetError(f"unknown budget key {unknown[0]!r}; valid: {sorted(cls.__dataclass_fields__)}")
        for key in BUDGET_RANGES:
            if key in d:
                v = d[key]
                d[key] = checked_number(key, v, *BUDGET_RANGES[key], what="budget", error=BudgetError)
        return cls(**d)

    def __post_init__(self) -> None:
        for key, (kind, lo, hi) in BUDGET_RANGES.items():
            checked_number(key, getattr(self, key), kind, lo, hi, what="budget", error=BudgetError)

    def with_run_defaults(self, run: Mapping[str, Any] | None) -> "Budgets":
        """These budgets with a run's defaults (its config) for the deadline and no-progress
        keys (RUN_DEFAULT_KEYS) the task leaves at 0: the task's own values win. A key outside
        RUN_DEFAULT_KEYS, or a bad value, raises BudgetError naming it."""
        if not run:
            return self
        unknown = sorted(set(run) - set(RUN_DEFAULT_KEYS))
        if unknown:
            raise BudgetError(f"run budget default {unknown[0]!r} is not one of {list(RUN_DEFAULT_KEYS)}")
        given: dict[str, Any] = {k: checked_number(k, v, *BUDGET_RANGES[k], what="run budget default",
                                                   error=BudgetError) for k, v in run.items()}
        return dataclasses.replace(self, **{k: v for k, v in given.items() if not getattr(self, k)})


@dataclass(frozen=True)
class Limits:
    memory_mb: int = 256
    pids: int = 64
    disk_mb: int = 64
    cpu: float = 1.0
    nofile: int = 256

    def __post_init__(self) -> None:
        check_limits(dataclasses.asdict(self))


@dataclass(frozen=True)
class Task:
    name: str
    family: str
    instruction: str
    image: str = "builtin:python"
    files: Mapping[str, str] = field(default_factory=dict)
    hidden: Mapping[str, str] = field(default_factory=dict)
    checker: Mapping[str, Any] = field(default_factory=dict)
    protected: tuple[str, ...] = ()
    setup: tuple[str, ...] = ()
    budgets: Budgets = Budgets()
    limits: Limits = Limits()
    # "none", or an egress allowlist (docs/egress.md): a comma-separated string, a list of
    # entries or {"allow": [...]}; stored as "none" or a tuple of entries.
    network: Any = "none"
    # The agent's tool set (names from nodeagent/harness/tools.py); empty means every tool.
    tools: tuple[str, ...] = ()
    # Bring your own harness: an argv run inside the sandbox (installed in the task's image)
    # with OPENAI_BASE_URL/OPENAI_API_KEY pointing at the node's model gateway; empty means the
    # built-in harness. (docs/harness.md)
    harness: tuple[str, ...] = ()
    # Seeded tool faults for the built-in harness, e.g. {"seed": 1, "error": 0.1, "latency":
    # 0.2, "latency_s": 0.5, "kill": 0.05} (rates per tool call; nodeagent/harness/faults.py).
    tool_faults: Mapping[str, Any] = field(default_factory=dict)
    # Read-only layers under the visible files, bottom first: digests (`sha256:<hex>`) of
    # squashfs layers in the image store (a repository at its base commit, built by the swe
    # importer with `layers.treelayer`); the node stacks them under the sandbox's upper dir.
    layers: tuple[str, ...] = ()
    # Mock services (controller/contracts/services.py): {name: {state_schema, initial_state,
    # operations}}; their operations are the agent's tools. Run per rollout on the node.
    services: Mapping[str, Any] = field(default_factory=dict)
    # The simulated user's goal (controller/contracts/services.py USER_SCHEMA); empty: no user.
    user: Mapping[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        object.__setattr__(self, "network", _normalise_network(self.network))
        if isinstance(self.layers, (list, tuple)):
            object.__setattr__(self, "layers", tuple(self.layers))
        if isinstance(self.tools, (list, tuple)):
            object.__setattr__(self, "tools", tuple(self.tools))
        if isinstance(self.harness, (list, tuple)):
            object.__setattr__(self, "harness", tuple(self.harness))
        # One content, one form: bytes that are UTF-8 text are stored as str, so a task read
        # back from disk hashes the same as the task that was written.
        for key in ("files", "hidden"):
            value = getattr(self, key)
            if isinstance(value, Mapping):
                object.__setattr__(self, key, {p: as_text_if_utf8(v) for p, v in value.items()})
        validate(self)

    def canonical(self) -> dict[str, Any]:
        """Every field as JSON-safe data; bytes file contents become {"base64": ...}."""
        d = dataclasses.asdict(self)
        for key in ("files", "hidden"):
            d[key] = {p: encode_content(v) for p, v in d[key].items()}
        # Fields added later are left out at their defaults, so existing task ids do not move.
        if not self.tools:
            del d["tools"]
        else:
            d["tools"] = list(self.tools)
        for key in ("harness", "tool_faults", "layers", "services", "user"):
            if not d[key]:
                del d[key]
            elif key in ("harness", "layers"):
                d[key] = list(getattr(self, key))
        for key in LATER_BUDGET_KEYS:
            if not d["budgets"][key]:
                del d["budgets"][key]
        if d["network"] != "none":
            d["network"] = list(self.network)
        return d

    @property
    def task_id(self) -> str:
        blob = json.dumps(self.canonical(), sort_keys=True, separators=(",", ":"))
        return "sha256:" + hashlib.sha256(blob.encode()).hexdigest()

    @property
    def short_id(self) -> str:
        return self.task_id[7:19]


def as_text_if_utf8(value: Any) -> Any:
    if isinstance(value, (bytes, bytearray)):
        try:
            return bytes(value).decode("utf-8")
        except UnicodeDecodeError:
            return bytes(value)
    return value


def encode_content(value: str | bytes) -> str | dict[str, str]:
    """A file's content in canonical JSON: text as is, bytes as {"base64": ...}."""
    if isinstance(value, bytes):
        return {"base64": base64.b64encode(value).decode()}
    return value


def decode_content(value: str | Mapping[str, str]) -> str | bytes:
    """Inverse of `encode_content` (used by whoever receives a task as JSON)."""
    if isinstance(value, Mapping):
        return base64.b64decode(value["base64"])
    return value


def _safe_relpath(path: str) -> bool:
    parts = path.split("/")
    return bool(path) and not path.startswith("/") and ".." not in parts and "" not in parts


def validate(task: Task) -> None:
    if not task.name or not isinstance(task.name, str):
        raise TaskError("task: 'name' must be a non-empty string")
    where = f"task {task.name[:80]!r}"
    if len(task.name) > MAX_NAME_CHARS or _CONTROL.search(task.name) or task.name != task.name.strip():
        raise TaskError(f"{where}: 'name' must be at most {MAX_NAME_CHARS} characters, without control "
                        f"characters or leading or trailing spaces")
    if not isinstance(task.instruction, str):
        raise TaskError(f"{where}: 'instruction' must be a string, got {type(task.instruction).__name__}")
    if len(task.instruction) > MAX_INSTRUCTION_CHARS:
        raise TaskError(f"{where}: 'instruction' is {len(task.instruction)} characters; the limit is "
                        f"{MAX_INSTRUCTION_CHARS}")
    if not isinstance(task.checker, Mapping):
        raise TaskError(f"{where}: 'checker' must be a mapping with a 'kind', got {type(task.checker).__name__}")
    if task.family not in FAMILIES:
        raise TaskError(f"{where}: 'family' must be one of {FAMILIES}, got {task.family!r}")
    if not task.instruction.strip():
        raise TaskError(f"{where}: 'instruction' is empty")
    if not isinstance(task.image, str) or not (task.image in IMAGES
                                               or re.fullmatch(r"sha256:[0-9a-f]{64}", task.image)):
        raise TaskError(f"{where}: 'image' must be 'builtin:python' or 'sha256:<64 hex digits>' of an image "
                        f"built with `paddock image build` ('builtin:browser' for web tasks), got {task.image!r}")
    for key in ("files", "hidden"):
        for path, text in getattr(task, key).items():
            if not _safe_relpath(path):
                raise TaskError(f"{where}: '{key}' path {path!r} must be relative, without '..'")
            if not isinstance(text, (str, bytes)):
                raise TaskError(f"{where}: '{key}[{path}]' must be text or bytes")
    kind = task.checker.get("kind")
    if kind not in CHECKER_KINDS:
        raise TaskError(f"{where}: 'checker.kind' must be one of {CHECKER_KINDS}, got {kind!r}")
    if kind == "pytest":
        tests = task.checker.get("tests") or []
        missing = [t for t in tests if t not in task.hidden and t not in task.files and not task.layers]
        if not tests or missing:
            raise TaskError(f"{where}: 'checker.tests' names files that are not in the task: {missing or tests}")
    if kind in ("math", "exact", "regex") and "answer" not in task.checker:
        raise TaskError(f"{where}: 'checker.answer' is required for checker kind {kind!r}")
    try:
        validate_spec(dict(task.checker), {"files": task.files, "hidden": task.hidden})
    except SpecError as exc:
        raise TaskError(f"{where}: {exc}") from None
    for digest in task.layers:
        if not isinstance(digest, str) or not re.fullmatch(r"sha256:[0-9a-f]{64}", digest):
            raise TaskError(f"{where}: 'layers' entries must be 'sha256:<64 hex digits>' of layers in the "
                            f"image store, got {digest!r}")
    for path in task.protected:
        if path not in task.files:
            raise TaskError(f"{where}: protected path {path!r} is not a visible file")
    if task.network != "none":
        try:
            parse_policy(list(task.network))
        except PolicyError as exc:
            raise TaskError(f"{where}: 'network': {exc}") from None
    if task.harness and not all(isinstance(a, str) and a for a in task.harness):
        raise TaskError(f"{where}: 'harness' must be a list of non-empty strings (an argv)")
    if not isinstance(task.tool_faults, Mapping):
        raise TaskError(f"{where}: 'tool_faults' must be an object")
    if task.family == "web":
        _validate_web(task, where)
    elif task.tools:
        try:
            tool_set(task.tools)
        except ToolSetError as exc:
            raise TaskError(f"{where}: 'tools': {exc}") from None
    try:
        if task.services:
            validate_services(task.services)
        if task.user:
            validate_user(task.user)
    except ServiceSpecError as exc:
        raise TaskError(f"{where}: {exc}") from None
    if kind == "state" and not task.services:
        raise TaskError(f"{where}: checker kind 'state' needs 'services' (the state it compares)")
    if (task.user or task.services) and task.harness:
        raise TaskError(f"{where}: 'services' and a simulated 'user' work through the built-in harness; "
                        f"drop 'harness'")


def _validate_web(task: "Task", where: str) -> None:
    """A web task acts through the browser only: its tools are browser tools (never a shell,
    which could reach the app's files), its checker is `webstate`, its network is none (the
    browser reaches the task's own app inside the sandbox), and it has no harness of its own."""
    try:
        browser_tool_set(task.tools or None)
    except ToolSetError as exc:
        raise TaskError(f"{where}: 'tools': {exc}") from None
    if task.checker.get("kind") != "webstate":
        raise TaskError(f"{where}: a web task's 'checker.kind' must be 'webstate', got {task.checker.get('kind')!r}")
    if task.network != "none":
        raise TaskError(f"{where}: a web task's 'network' must be 'none' (its app runs inside the sandbox)")
    if task.harness:
        raise TaskError(f"{where}: a web task cannot name its own 'harness'")


def _normalise_network(network: Any) -> Any:
    """'none' stays 'none'; an allowlist (string, list or {"allow": [...]}) becomes a tuple."""
    if network is None or network == "none":
        return "none"
    if isinstance(network, Mapping) and set(network) == {"allow"}:
        network = network["allow"]
    if isinstance(network, str):
        network = [e.strip() for e in network.split(",") if e.strip()]
    if isinstance(network, (list, tuple)) and network and all(isinstance(e, str) for e in network):
        return tuple(network)
    raise TaskError(f"'network' must be 'none', a list of allowed hosts or {{'allow': [...]}}, "
                    f"got {network!r}")


@dataclass(frozen=True)
class TaskSet:
    """A manifest: task ids with their split, hashed as a whole."""
    name: str
    tasks: tuple[Task, ...]
    heldout: frozenset[str] = frozenset()   # task ids in the held-out split

    def __post_init__(self) -> None:
        names = [t.name for t in self.tasks]
        dupes = sorted({n for n in names if names.count(n) > 1})
        if dupes:
            raise TaskError(f"task set {self.name!r}: duplicate task names {dupes}")

    def manifest(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "tasks": sorted(
                ({"task_id": t.task_id, "name": t.name,
                  "split": "heldout" if t.task_id in self.heldout else "train"} for t in self.tasks),
                key=lambda d: d["name"]),
        }

    @property
    def manifest_hash(self) -> str:
        blob = json.dumps(self.manifest(), sort_keys=True, separators=(",", ":"))
        return "sha256:" + hashlib.sha256(blob.encode()).hexdigest()

    def by_id(self) -> dict[str, Task]:
        return {t.task_id: t for t in self.tasks}

    def by_name(self) -> dict[str, Task]:
        return {t.name: t for t in self.tasks}


# -- the task on the node -------------------------------------------------------------------
_LIMIT_KEYS = tuple(Limits.__dataclass_fields__)


@dataclass(frozen=True)
class LeaseTask:
    """A task as a lease carries it to a node, decoded once on arrival (`decode`): file
    contents are `str` or `bytes` (the wire's {"base64": ...} decoded), budgets are `Budgets`.

    Only `task_id` is required: a controller may lease bare tasks ({"task_id", "image_digest"})
    to agents that run no sandbox (tests, benchmarks); every other field has the default of
    `Task`, and the attempt pipeline refuses a task it cannot run (no instruction, no image).
    `limits` keeps the keys the lease gave (they go to the sandbox and the rollouts row as is).
    """
    task_id: str
    image_digest: str = ""
    name: str = ""
    family: str = ""
    instruction: str = ""
    files: Mapping[str, str | bytes] = field(default_factory=dict)
    hidden: Mapping[str, str | bytes] = field(default_factory=dict)
    checker: Mapping[str, Any] = field(default_factory=dict)
    protected: tuple[str, ...] = ()
    budgets: Budgets = Budgets()
    limits: Mapping[str, int | float] = field(default_factory=lambda: dataclasses.asdict(Limits()))
    network: Any = "none"  # "none" or a tuple of allowlist entries (as `Task.network`)
    tools: Optional[tuple[str, ...]] = None  # None: every tool
    harness: tuple[str, ...] = ()            # empty: the built-in harness
    tool_faults: Mapping[str, Any] = field(default_factory=dict)
    taskset_hash: str = ""
    split: Optional[str] = None
    layers: tuple[str, ...] = ()             # layer digests in the image store, bottom first
    setup: tuple[str, ...] = ()              # set-up commands, run once per task on the node
    # A reference lease: {"root", "digest", "bytes"} of the task's content blob (the node
    # fetches it: nodeagent/agent/taskcache.py); None when the lease carries the content.
    blob: Optional[Mapping[str, Any]] = None
    services: Mapping[str, Any] = field(default_factory=dict)   # mock services (empty: none)
    user: Mapping[str, Any] = field(default_factory=dict)       # the simulated user's goal (empty: none)
    raw: Mapping[str, Any] = field(default_factory=dict, repr=False, compare=False)

    @classmethod
    def decode(cls, d: Any) -> "LeaseTask":
        """The lease's task dict, checked field by field. Raises TaskError naming the field."""
        if not isinstance(d, Mapping):
            raise TaskError(f"lease task must be an object, got {type(d).__name__}")
        out: dict[str, Any] = {"task_id": _text(d, "task_id", required=True), "raw": d}
        for key in ("image_digest", "name", "family", "instruction", "taskset_hash"):
            out[key] = _text(d, key)
        if out["image_digest"] and not re.fullmatch(r"sha256:\S+", out["image_digest"]):
            raise TaskError(f"lease task 'image_digest' must be 'sha256:<digest>', got {out['image_digest']!r}")
        out["files"], out["hidden"] = _contents(d, "files"), _contents(d, "hidden")
        checker = d.get("checker") or {}
        if not isinstance(checker, Mapping):
            raise TaskError(f"lease task 'checker' must be an object, got {checker!r}")
        out["checker"] = dict(checker)
        out["protected"] = _names(d, "protected") or ()
        out["tools"] = _names(d, "tools")
        out["harness"] = _names(d, "harness") or ()
        faults = d.get("tool_faults") or {}
        if not isinstance(faults, Mapping):
            raise TaskError(f"lease task 'tool_faults' must be an object, got {faults!r}")
        out["tool_faults"] = dict(faults)
        out["budgets"] = Budgets.from_dict(d.get("budgets"))
        out["limits"] = _limits(d.get("limits"))
        out["network"] = _normalise_network(d.get("network"))
        split = d.get("split")
        if split is not None and split not in SPLITS:
            raise TaskError(f"lease task 'split' must be one of {SPLITS}, got {split!r}")
        out["split"] = split
        out["layers"] = _names(d, "layers") or ()
        out["setup"] = _names(d, "setup") or ()
        blob = d.get("blob")
        if blob is not None and not (isinstance(blob, Mapping) and isinstance(blob.get("root"), str)
                                     and isinstance(blob.get("digest"), str)):
            raise TaskError(f"lease task 'blob' must be an object with 'root' and 'digest', got {blob!r}")
        out["blob"] = dict(blob) if blob is not None else None
        for key in ("services", "user"):
            v = d.get(key) or {}
            if not isinstance(v, Mapping):
                raise TaskError(f"lease task {key!r} must be an object, got {type(v).__name__}")
            out[key] = dict(v)
        return cls(**out)

    def with_content(self, content: Mapping[str, Any]) -> "LeaseTask":
        """The full task of a reference lease: the blob's content (`Task.canonical()`) under
        the lease's own metadata (id, image, task set, split). TaskError if the blob is not the
        task the lease names."""
        if content.get("name") not in (None, self.name) and self.name:
            raise TaskError(f"task blob {self.blob and self.blob.get('digest')} holds task "
                            f"{content.get('name')!r}, not {self.name!r}")
        meta = {k: v for k, v in self.raw.items() if k != "blob"}
        return LeaseTask.decode({**content, **meta, "limits": content.get("limits", meta.get("limits"))})

    @property
    def checker_kind(self) -> str:
        return str(self.checker.get("kind", "?"))


@dataclass(frozen=True)
class GradedTask:
    """A task as the verifier grades it (module docstring). `ident` keys what is known about
    the task (its `task_id`, or for a task without one the hash of its JSON); `image` is the
    task's own image reference (`builtin:python`, `sha256:...` or ""), `image_digest` the
    bank's digest a lease carries; `layers` (digests, bottom first) and `setup` make its
    sandbox's stack (nodeagent/verifier/validate.py `sandbox_layers`)."""
    name: str
    checker: CheckerSpec
    task_id: str = ""
    ident: str = ""
    family: str = ""
    instruction: str = ""
    image: str = ""
    image_digest: str = ""
    files: Mapping[str, str | bytes] = field(default_factory=dict)
    hidden: Mapping[str, str | bytes] = field(default_factory=dict)
    protected: tuple[str, ...] = ()
    limits: Mapping[str, int | float] = field(default_factory=dict)     # as given; empty: the sandbox's
    layers: tuple[str, ...] = ()
    setup: tuple[str, ...] = ()
    services: Mapping[str, Any] = field(default_factory=dict)

    @classmethod
    def of(cls, task: LeaseTask) -> "GradedTask":
        """The lease's task, its checker spec validated. TaskError naming the task and field."""
        image = _text(task.raw, "image")
        limits = task.limits if task.raw.get("limits") else {}      # none given: the sandbox's defaults
        try:
            spec = CheckerSpec.decode(dict(task.checker) or None, {"files": task.files, "hidden": task.hidden})
        except SpecError as exc:
            raise TaskError(f"task {task.name or None!r}: {exc}") from None
        return cls(name=task.name, checker=spec, task_id=task.task_id, ident=task.task_id, family=task.family,
                   instruction=task.instruction, image=image, image_digest=task.image_digest, files=task.files,
                   hidden=task.hidden, protected=task.protected, limits=limits, layers=task.layers,
                   setup=task.setup, services=task.services)

    @classmethod
    def from_json(cls, d: Any) -> "GradedTask":
        """A task's JSON (its canonical form, with or without `task_id`), decoded as a lease's
        task is (`LeaseTask.decode`) and its checker spec validated. TaskError naming the field."""
        if not isinstance(d, Mapping):
            raise TaskError(f"a task must be an object, got {type(d).__name__}")
        task_id = d.get("task_id") or ""
        ident = task_id if isinstance(task_id, str) and task_id else "content:" + hashlib.sha256(json.dumps(
            {k: v for k, v in d.items() if not k.startswith("_")}, sort_keys=True, default=repr).encode()).hexdigest()
        graded = cls.of(LeaseTask.decode({**d, "task_id": ident}))
        return dataclasses.replace(graded, task_id=task_id if isinstance(task_id, str) else "")


def _text(d: Mapping, key: str, required: bool = False) -> str:
    v = d.get(key)
    if v is None and not required:
        return ""
    if not isinstance(v, str) or (required and not v):
        raise TaskError(f"lease task {key!r} must be a {'non-empty ' if required else ''}string, got {v!r}")
    return v


def _contents(d: Mapping, key: str) -> dict[str, str | bytes]:
    files = d.get(key) or {}
    if not isinstance(files, Mapping):
        raise TaskError(f"lease task {key!r} must be an object of path -> content, got {type(files).__name__}")
    out = {}
    for path, v in files.items():
        ok = isinstance(path, str) and (isinstance(v, (str, bytes)) or (
            isinstance(v, Mapping) and set(v) == {"base64"} and isinstance(v["base64"], str)))
        if not ok:
            raise TaskError(f"lease task '{key}[{path}]' must be text, bytes or {{'base64': ...}}")
        try:
            out[path] = decode_content(v)
        except ValueError as exc:  # binascii.Error: not base64
            raise TaskError(f"lease task '{key}[{path}]' is not valid base64: {exc}") from None
    return out


def _names(d: Mapping, key: str) -> Optional[tuple[str, ...]]:
    v = d.get(key)
    if v is None:
        return None
    if isinstance(v, str) or not isinstance(v, (list, tuple)) or not all(isinstance(n, str) for n in v):
        raise TaskError(f"lease task {key!r} must be a list of strings, got {v!r}")
    return tuple(v)


def _limits(v: Any) -> dict[str, int | float]:
    if v is None:
        return dataclasses.asdict(Limits())
    if not isinstance(v, Mapping):
        raise TaskError(f"lease task 'limits' must be an object, got {v!r}")
    check_limits(v, what="lease task limit")
    return dict(v)
