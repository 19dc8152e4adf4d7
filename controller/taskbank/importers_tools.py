"""Importers of public tool-use and terminal task formats: τ-bench / τ²-bench and Harbor.

  tau     a domain directory: `tasks.json` (τ²-bench: a list of {id, user_scenario:
          {persona, instructions: {reason_for_call, known_info, unknown_info,
          task_instructions}}, initial_state, evaluation_criteria: {actions: [{name,
          arguments}], communicate_info, nl_assertions}}; τ-bench: {user_id, instruction,
          actions: [{name, kwargs}], outputs}), the domain's services in Paddock's form
          (`services.json` or `services.yaml`: {name: service spec}, controller/contracts/
          services.py; an `initial_state` of "@db.json" reads `db.json` of the directory),
          and the agent's policy (`policy.md`, optional)
  harbor  a Harbor task directory (`task.toml`, `instruction.md`, `tests/test.sh`,
          `environment/`, `solution/`), or a directory of them

τ tasks: the user is played by a model (`kind: model`, the node's `user_sim` endpoint) with
the scenario as its goal and the known facts as hidden facts; the goal state is the initial
state with the task's expected actions replayed by the rule engine (an action the services do
not offer, or that their rules refuse, is an import error naming the task); `communicate_info`
becomes `told.include`; `nl_assertions` and the actions are kept in hidden `reference.json`.

Harbor tasks: Harbor's `/app` is Paddock's `/work`; its tests (`tests/...`) are hidden support
files of a `command` checker that runs `tests/test.sh` with `/tests` mapped to where the
verifier puts them and `/logs/verifier` under `/tmp` (the paths are rewritten in the test files
at import, a fixed, documented mapping). The check is `harbor_runner`, shipped as a hidden
support file: it runs test.sh and passes when the reward it wrote is 1 (docs/verifier.md,
"Harbor tasks: the reward file"); a `tests/pytest.ini` is added when `tests/` has no pytest
configuration (else pytest would find the verifier's own, which puts /work first). The agent's
timeout is the wall budget, the verifier's the check's deadline, `[environment]` cpus,
memory and storage the limits. The files the environment's Dockerfile copies into `/app`
(`COPY`/`ADD` from its build context, not `--from` another stage) are task files, beside
`environment/app/`. The Dockerfile is kept as hidden `environment/Dockerfile`; the task runs in `image` (`[environment] paddock_image =
"sha256:..."`, an image built with `paddock image build`), else the built-in python image.
`allow_internet = true` is refused (a task gets no network here). `solution/` is hidden (its
`/app` read as `/work`: validation runs `solve.sh` as the reference).

Every error names the file (and the task). Must not import zmq, nodeagent.
"""
from __future__ import annotations

import json
import posixpath
import re
import tomllib
from pathlib import Path
from typing import Any, Iterator

import yaml

from controller.contracts.safeload import load_json, load_yaml
from controller.contracts.serviceengine import RuleError, replay
from controller.contracts.services import ServiceSpecError, operation_names, validate_services
from controller.contracts.tasks import Budgets, Limits, Task, TaskError
from controller.taskbank import harbor_runner
from controller.taskbank.swe import ImportSourceError

KINDS = ("tau", "harbor")
DEFAULT_POLICY = "You are a customer service agent. Help the user within the rules of the tools you are given."
TAU_OPENING = "Hi, I need some help."
USER_SIM_MODEL = "user-sim"
HARBOR_APP, HARBOR_TESTS, HARBOR_LOGS = "/app", "/verifier/tests/tests", "/tmp/logs/verifier"
HARBOR_RUNNER = "paddock_harbor_runner.py"            # hidden support files, under /verifier/tests
HARBOR_SITE = "paddock_site/sitecustomize.py"
HARBOR_GUARD = "paddock_site/paddock_pytest_guard.py"   # each pytest session's end, to the runner
HARBOR_ARGV = ["python3", "-I", "-B", f"/verifier/tests/{HARBOR_RUNNER}"]
# pytest's configuration for the task's tests when tests/ has none: without it pytest finds the
# verifier's own /verifier/tests/pytest.ini (`pythonpath = /work`: the agent's modules first)
HARBOR_PYTEST_INI = "[pytest]\ncache_dir = /tmp/.pytest_cache\n"
PYTEST_CONFIGS = ("pytest.ini", ".pytest.ini", "pyproject.toml", "tox.ini", "setup.cfg")


def iter_source(kind: str, source: Path) -> Iterator[Task]:
    if kind == "tau":
        yield from tau_tasks(Path(source))
    elif kind == "harbor":
        yield from harbor_tasks(Path(source))
    else:
        raise ImportSourceError(f"unknown import kind {kind!r}; valid: {', '.join(KINDS)}")


# -- τ-bench / τ²-bench -------------------------------------------------------------------------

def _load_services(domain: Path) -> dict:
    for name in ("services.json", "services.yaml", "services.yml"):
        path = domain / name
        if path.exists():
            break
    else:
        raise ImportSourceError(f"{domain}: no services.json or services.yaml (the domain's tools as Paddock "
                                f"services, docs/tasks.md 'Writing a service and a user goal')")
    try:
        # the bounded loaders: duplicate keys, bombs and oversized files are refused by name
        services = load_json(path) if path.suffix == ".json" else load_yaml(path)
    except (ValueError, yaml.YAMLError) as exc:
        raise ImportSourceError(f"{path}: not valid {path.suffix[1:].upper()}: {exc}") from None
    if not isinstance(services, dict):
        raise ImportSourceError(f"{path}: must map service names to service specs")
    for name, spec in services.items():
        if isinstance(spec, dict) and isinstance(spec.get("initial_state"), str) and spec["initial_state"].startswith("@"):
            data = domain / spec["initial_state"][1:]
            try:
                spec["initial_state"] = load_json(data)
            except (OSError, ValueError) as exc:
                raise ImportSourceError(f"{path}: services.{name}.initial_state: cannot read {data}: {exc}") from None
    try:
        return validate_services(services)
    except ServiceSpecError as exc:
        raise ImportSourceError(f"{path}: {exc}") from None


def _tau_record(rec: dict) -> tuple[str, dict, list[tuple[str, dict]], list[str], list[str]]:
    """(id, user goal fields, expected calls, communicate_info, nl_assertions) of a τ² or τ record."""
    if "user_scenario" in rec:
        scen = rec.get("user_scenario") or {}
        ins = scen.get("instructions") or {}
        if isinstance(ins, str):
            ins = {"task_instructions": ins}
        crit = rec.get("evaluation_criteria") or {}
        calls = [(a["name"], dict(a.get("arguments") or {})) for a in crit.get("actions") or ()]
        goal = " ".join(str(ins.get(k) or "").strip() for k in ("reason_for_call", "task_instructions")).strip()
        user = {"persona": str(scen.get("persona") or ""), "instruction": goal,
                "hidden": {k: str(ins[k]).strip() for k in ("known_info", "unknown_info") if ins.get(k)}}
        return (str(rec["id"]), user, calls, [str(c) for c in crit.get("communicate_info") or ()],
                [str(a) for a in crit.get("nl_assertions") or ()])
    calls = [(a["name"], dict(a.get("kwargs") or a.get("arguments") or {})) for a in rec.get("actions") or ()]
    user = {"persona": "", "instruction": str(rec["instruction"]),
            "hidden": {"user_id": str(rec["user_id"])} if rec.get("user_id") else {}}
    return (str(rec.get("id", rec.get("user_id", "?"))), user, calls, [str(o) for o in rec.get("outputs") or ()], [])


def tau_tasks(domain: Path) -> Iterator[Task]:
    tasks_file = domain / "tasks.json" if domain.is_dir() else domain
    domain = tasks_file.parent
    try:
        records = load_json(tasks_file)
    except (OSError, ValueError) as exc:
        raise ImportSourceError(f"{tasks_file}: cannot read a JSON list of tasks: {exc}") from None
    if not isinstance(records, list):
        raise ImportSourceError(f"{tasks_file}: must be a JSON list of tasks")
    services = _load_services(domain)
    owner = operation_names(services)
    policy = (domain / "policy.md").read_text() if (domain / "policy.md").exists() else DEFAULT_POLICY
    name = domain.name or "domain"
    for i, rec in enumerate(records):
        where = f"{tasks_file}: task {i}"
        try:
            tid, user, calls, told, assertions = _tau_record(rec)
        except (KeyError, TypeError, AttributeError) as exc:
            raise ImportSourceError(f"{where}: not a τ-bench or τ²-bench task: missing {exc}") from None
        where = f"{tasks_file}: task {tid!r}"
        if (rec.get("initial_state") or {}).get("initialization_data") or (rec.get("initial_state") or {}).get(
                "initialization_actions"):
            raise ImportSourceError(f"{where}: initial_state (per-task initialisation) is not supported; "
                                    f"put it in the domain's initial state")
        unknown = sorted({c for c, _ in calls} - set(owner))
        if unknown:
            raise ImportSourceError(f"{where}: actions {unknown} are not operations of the domain's services "
                                    f"({', '.join(sorted(owner)) or 'none'})")
        goal = {}
        try:
            for svc, spec in services.items():
                goal[svc] = replay(spec, spec["initial_state"], [(c, a) for c, a in calls if owner[c] == svc])
        except RuleError as exc:
            raise ImportSourceError(f"{where}: {exc}") from None
        checker: dict[str, Any] = {"kind": "state", "goal": goal}
        if told:
            checker["told"] = {"include": told}
        goal_user = {"kind": "model", "model": USER_SIM_MODEL, "opening": TAU_OPENING, "temperature": 0.0,
                     **{k: v for k, v in user.items() if v}, "instruction": user["instruction"] or "Get help."}
        reference = {"calls": [{"name": c, "arguments": a} for c, a in calls], "nl_assertions": assertions,
                     "final": " ".join(told)}
        try:
            yield Task(name=f"tau/{name}/{tid}", family="conversational",
                       instruction=f"{policy.strip()}\n\nTicket: tau/{name}/{tid}.", checker=checker,
                       hidden={"reference.json": json.dumps(reference, indent=1, sort_keys=True)},
                       services=services, user=goal_user, budgets=Budgets(max_steps=30, wall_s=600.0))
        except TaskError as exc:
            raise ImportSourceError(f"{where}: {exc}") from None


# -- Harbor -----------------------------------------------------------------------------------

def _harbor_text(text: str) -> str:
    """Harbor's conventional paths to Paddock's (see the module docstring)."""
    text = re.sub(r"(?<![\w.])/tests(?=/|\b)", HARBOR_TESTS, text)
    text = text.replace("/logs/verifier", HARBOR_LOGS)
    return re.sub(r"(?<![\w.])/app(?=/|\b)", "/work", text)


def _tree(root: Path, prefix: str, where: Path) -> dict[str, str | bytes]:
    out: dict[str, str | bytes] = {}
    if not root.is_dir():
        return out
    for path in sorted(root.rglob("*")):
        if path.is_symlink():
            raise ImportSourceError(f"{where}: {path.relative_to(where)} is a symbolic link")
        if path.is_file():
            data = path.read_bytes()
            try:
                out[f"{prefix}{path.relative_to(root).as_posix()}"] = data.decode()
            except UnicodeDecodeError:
                out[f"{prefix}{path.relative_to(root).as_posix()}"] = data
    return out


def _copied_into_app(env_dir: Path, where: Path) -> dict[str, str | bytes]:
    """The files the environment's Dockerfile copies from its build context into `/app` (the
    agent's /work): `COPY`/`ADD` lines without `--from`, their destination absolute or relative
    to the last `WORKDIR`, a source file or directory of the context (`environment/`, else the
    task directory, as a compose file's `context: ..` makes it; never outside the task). Other instructions (a
    `RUN pip install`) are the image's business: the task runs in `paddock_image` or the
    built-in one."""
    dockerfile = env_dir / "Dockerfile"
    if not dockerfile.is_file():
        return {}
    out: dict[str, str | bytes] = {}
    workdir = "/"
    text = re.sub(r"\\\n", " ", dockerfile.read_text(errors="replace"))
    for line in text.splitlines():
        words = line.split("#", 1)[0].split() if not line.lstrip().startswith("#") else []
        if not words:
            continue
        op, args = words[0].upper(), [w for w in words[1:] if not w.startswith("--")]
        if op == "WORKDIR" and args:
            workdir = posixpath.join(workdir, args[0])
        if op not in ("COPY", "ADD") or any(w.startswith("--from") for w in words) or len(args) < 2:
            continue
        dest = posixpath.normpath(posixpath.join(workdir, args[-1]))
        if dest != HARBOR_APP and not dest.startswith(HARBOR_APP + "/"):
            continue
        for src in args[:-1]:     # the context: environment/, or the task (a compose file's `context: ..`)
            path = next((p for p in ((env_dir / src).resolve(), (where / src).resolve())
                         if p.is_relative_to(where.resolve()) and p.exists()), None)
            if path is None:
                raise ImportSourceError(f"{dockerfile.relative_to(where)}: {op} {src}: not in the build context")
            base = dest[len(HARBOR_APP):].lstrip("/")
            if path.is_dir():
                out.update({posixpath.join(base, rel): t for rel, t in _tree(path, "", where).items()})
            else:
                into_dir = args[-1].endswith("/") or len(args) > 2 or dest == HARBOR_APP
                rel = posixpath.join(base, path.name) if into_dir else base
                out.update({rel: t for t in _tree_file(path)})
    return out


def _tree_file(path: Path) -> list[str | bytes]:
    data = path.read_bytes()
    try:
        return [data.decode()]
    except UnicodeDecodeError:
        return [data]


def harbor_task(task_dir: Path) -> Task:
    where = task_dir / "task.toml"
    try:
        meta = tomllib.loads(where.read_text())
    except (OSError, tomllib.TOMLDecodeError) as exc:
        raise ImportSourceError(f"{where}: {exc}") from None
    if not (task_dir / "instruction.md").exists():
        raise ImportSourceError(f"{task_dir}: no instruction.md")
    if not (task_dir / "tests" / "test.sh").exists():
        raise ImportSourceError(f"{task_dir}: no tests/test.sh (Harbor's verifier entry point)")
    env = meta.get("environment") or {}
    if env.get("allow_internet"):
        raise ImportSourceError(f"{where}: environment.allow_internet = true: tasks here run with no network")
    tests = {rel: _harbor_text(t) if isinstance(t, str) else t
             for rel, t in _tree(task_dir / "tests", "tests/", task_dir).items()}
    runner = {HARBOR_RUNNER: Path(harbor_runner.__file__).read_text(), HARBOR_SITE: harbor_runner.SITECUSTOMIZE,
              HARBOR_GUARD: harbor_runner.PYTEST_GUARD}
    # reward.json is read (first, as Harbor does) only when the tests write one: otherwise one
    # found there was written by the code under test
    json_flag = [harbor_runner.JSON_FLAG] if any(isinstance(t, str) and "reward.json" in t
                                                 for t in tests.values()) else []
    if not any(f"tests/{name}" in tests for name in PYTEST_CONFIGS):
        runner["tests/pytest.ini"] = HARBOR_PYTEST_INI
    solution = {rel: _harbor_text(t) if isinstance(t, str) else t      # validation runs solve.sh in /work
                for rel, t in _tree(task_dir / "solution", "solution/", task_dir).items()}
    hidden = {**tests, **solution,
              **_tree(task_dir / "environment", "environment/", task_dir), **runner}
    files = {**_copied_into_app(task_dir / "environment", task_dir),
             **_tree(task_dir / "environment" / "app", "", task_dir)}
    verifier_s = float((meta.get("verifier") or {}).get("timeout_sec", 60.0))
    agent_s = float((meta.get("agent") or {}).get("timeout_sec", 600.0))
    limits = Limits(memory_mb=int(env.get("memory_mb", Limits.memory_mb)),
                    cpu=float(env.get("cpus", Limits.cpu)),
                    disk_mb=int(env.get("storage_mb", Limits.disk_mb)))
    instruction = _harbor_text((task_dir / "instruction.md").read_text())
    try:
        return Task(name=f"harbor/{task_dir.name}", family="swe", instruction=instruction, files=files,
                    hidden=hidden, image=str(env.get("paddock_image") or "builtin:python"),
                    checker={"kind": "command", "argv": HARBOR_ARGV + json_flag,
                             "support": sorted({*tests, *runner}),
                             "timeout_s": verifier_s},
                    budgets=Budgets(wall_s=agent_s, max_steps=50), limits=limits)
    except TaskError as exc:
        raise ImportSourceError(f"{where}: {exc}") from None


def harbor_tasks(source: Path) -> Iterator[Task]:
    if (source / "task.toml").exists():
        yield harbor_task(source)
        return
    dirs = sorted(p for p in source.iterdir() if (p / "task.toml").exists()) if source.is_dir() else []
    if not dirs:
        raise ImportSourceError(f"{source}: neither a Harbor task directory (task.toml) nor a directory of them")
    for d in dirs:
        yield harbor_task(d)


__all__ = ["KINDS", "harbor_task", "harbor_tasks", "iter_source", "tau_tasks"]
