"""The components of a Paddock job and the resources each asks Slurm for (pure; slurm/sbatch.py
renders them).

A job has up to five components, each on nodes of its own:

  trainer    the head: controller + your trainer (1 node; its GPUs are the trainer's)
  farm       node agents, one per node (the environment sandboxes)
  inference  model servers (vLLM, SGLang, any OpenAI-compatible server), one per node
  judge      judge model servers, one per node (same contract as inference)
  services   other servers your harnesses call (retrieval, user simulators), one per node

Each component takes the keys of `Component` (its fields: the signature is the list of valid
keys). A server component (inference, judge, services) also runs `command` on each of its nodes
(`paddock job server`, slurm/servers.py): the job waits for `health` on `port`, publishes the
endpoints in the run directory, and POSTs `reload` on every replica at a weight update.

Keys come from a job description (YAML: `components: {inference: {nodes: 2, ...}}`) or the command
line (`inference.nodes=2`); `component_keys(...)` turns either into `{name: Component}`. An
unknown component or key, a bad value or an impossible combination raises ParamError naming the
key (`inference.gres`) and listing the valid ones.

Must not import: zmq, sqlite3 (pure).
"""
from __future__ import annotations

import re
from dataclasses import dataclass, fields, replace
from typing import Any, Mapping

COMPONENTS = ("trainer", "farm", "inference", "judge", "services")
SERVER_COMPONENTS = ("inference", "judge", "services")
NODE_TYPE_KEYS = ("gpus_per_node", "gres", "mem", "partition", "qos", "constraint", "account")
_TOKEN = re.compile(r"[A-Za-z0-9_.-]{1,64}")
_GRES = re.compile(r"[A-Za-z0-9_]+(?::[A-Za-z0-9_.-]+)?(?::\d+)?(?:,[A-Za-z0-9_]+(?::[A-Za-z0-9_.-]+)?(?::\d+)?)*")
_MEM = re.compile(r"\d+[KMGT]?")
_CONSTRAINT = re.compile(r"[A-Za-z0-9_.&|\[\]()*:,-]{1,200}")
_PATH = re.compile(r"/[A-Za-z0-9_./-]*")


class ParamError(ValueError):
    """A batch parameter that is unknown or invalid; the message lists the valid parameters."""


@dataclass(frozen=True)
class Component:
    nodes: int = 0               # nodes of this component (servers: one replica per node)
    gpus_per_node: int = 0       # --gpus-per-node (0: none)
    gres: str = ""               # --gres, e.g. gpu:a100:4 (not with gpus_per_node)
    cpus_per_task: int = 1       # --cpus-per-task of the component and of its srun step
    mem: str = ""                # --mem per node, e.g. 64G ("": the partition's default)
    partition: str = ""          # "": the job's partition (else the cluster's default)
    qos: str = ""
    constraint: str = ""         # --constraint, e.g. a100|h100
    account: str = ""            # "": the job's account
    time: str = ""               # this component's time limit ("": the job's; never above it)
    command: str = ""            # server components: the server command (/bin/sh; $PADDOCK_SERVER_PORT)
    port: int = 8000             # the server's port on its node
    health: str = "/health"      # GET until 200: /health (vLLM, SGLang) or /v1/models
    reload: str = ""             # POSTed on every replica at a weight update ("": none)
    ready_wait_s: int = 600      # the server must be healthy within this long


def valid_component_keys() -> str:
    return (f"components {', '.join(COMPONENTS)}, each with keys "
            + ", ".join(f.name for f in fields(Component)))


def _bad(key: str, why: str) -> ParamError:
    return ParamError(f"batch parameter {key!r} {why}; valid: {valid_component_keys()}")


def coerce_component_value(key: str, value: str) -> Any:
    """`inference.nodes`, "2" (a command line's text) -> 2; ParamError naming the key."""
    name, _, field = key.partition(".")
    types = {f.name: f.type for f in fields(Component)}
    if name not in COMPONENTS or field not in types:
        raise ParamError(f"unknown batch parameter {key!r}; valid: {valid_component_keys()}")
    try:
        return int(value) if types[field] == "int" else value
    except ValueError:
        raise _bad(key, f"must be int, got {value!r}") from None


def component_keys(nested: Mapping[str, Any] | None, dotted: Mapping[str, Any],
                   defaults: Mapping[str, Mapping[str, Any]]) -> dict[str, Component]:
    """{name: Component} from a YAML `components:` mapping and `name.key` values (which win),
    over `defaults` ({name: {key: value}}, from the job's own keys); every component is there
    (nodes=0: absent). ParamError names an unknown component or key, or a bad value."""
    known = {f.name: f.type for f in fields(Component)}
    merged: dict[str, dict[str, Any]] = {n: dict(defaults.get(n, {})) for n in COMPONENTS}
    if nested is not None and not isinstance(nested, Mapping):
        raise _bad("components", f"must be a mapping of component name to keys, got {type(nested).__name__}")
    for name, keys in (nested or {}).items():
        if name not in COMPONENTS:
            raise ParamError(f"unknown component {name!r}; valid: {valid_component_keys()}")
        if not isinstance(keys, Mapping):
            raise _bad(f"components.{name}", f"must be a mapping of keys, got {keys!r}")
        for k, v in keys.items():
            if k not in known:
                raise ParamError(f"unknown batch parameter '{name}.{k}'; valid: {valid_component_keys()}")
            merged[name][k] = v
    for key, v in dotted.items():
        name, _, k = key.partition(".")
        if name not in COMPONENTS or k not in known:
            raise ParamError(f"unknown batch parameter {key!r}; valid: {valid_component_keys()}")
        merged[name][k] = v
    out = {}
    for name, keys in merged.items():
        for k, v in keys.items():
            want = {"int": int, "str": str}[known[k]]
            if isinstance(v, bool) or not isinstance(v, want):
                raise _bad(f"{name}.{k}", f"must be {known[k]}, got {v!r}")
        out[name] = Component(**keys)
    return out


def check_components(comps: Mapping[str, Component], job_limit_s: int, time_limit_s, layout: str) -> None:
    """Impossible combinations, each named by its key (ParamError)."""
    t = comps["trainer"]
    if t.nodes != 1:
        raise _bad("trainer.nodes", f"must be 1 (the head runs on one node), got {t.nodes}")
    if comps["farm"].nodes < 1:
        raise _bad("farm.nodes", f"must be >= 1 (node agents run the rollouts), got {comps['farm'].nodes}")
    for name, c in comps.items():
        key = lambda k: f"{name}.{k}"   # noqa: E731
        for k in ("nodes", "gpus_per_node", "ready_wait_s"):
            if getattr(c, k) < 0:
                raise _bad(key(k), f"must be >= 0, got {getattr(c, k)}")
        if c.cpus_per_task < 1:
            raise _bad(key("cpus_per_task"), f"must be >= 1, got {c.cpus_per_task}")
        if c.gpus_per_node and c.gres:
            raise _bad(key("gres"), f"and {name}.gpus_per_node both ask for GPUs: give one "
                                    f"(gpus_per_node={c.gpus_per_node} or gres={c.gres!r})")
        if c.gres and not _GRES.fullmatch(c.gres):
            raise _bad(key("gres"), f"must be name[:type][:count][,...] (e.g. gpu:a100:4), got {c.gres!r}")
        if c.mem and not _MEM.fullmatch(c.mem):
            raise _bad(key("mem"), f"must be a number with an optional K, M, G or T suffix, got {c.mem!r}")
        for k in ("partition", "qos", "account"):
            v = getattr(c, k)
            if v and not _TOKEN.fullmatch(v):
                raise _bad(key(k), f"must be 1-64 characters of [A-Za-z0-9_.-], got {v!r}")
        if c.constraint and not _CONSTRAINT.fullmatch(c.constraint):
            raise _bad(key("constraint"), f"must be a Slurm feature expression (letters, digits, & | [ ] ( ) * : ,), "
                                          f"got {c.constraint!r}")
        if c.time:
            s = time_limit_s(c.time)
            if s is None:
                raise _bad(key("time"), f"must be minutes or [D-]HH:MM:SS, got {c.time!r}")
            if s > job_limit_s:
                raise _bad(key("time"), f"({s}s) must not exceed the job's time_limit ({job_limit_s}s)")
        if "\0" in c.command or "\n" in c.command:
            raise _bad(key("command"), "must be one command line (no NUL or newline)")
        if not 1 <= c.port <= 65535:
            raise _bad(key("port"), f"must be a TCP port (1-65535), got {c.port}")
        for k in ("health", "reload"):
            v = getattr(c, k)
            if (v or k == "health") and not _PATH.fullmatch(v):
                raise _bad(key(k), f"must be a URL path starting with / (e.g. /health), got {v!r}")
        if name in SERVER_COMPONENTS:
            if c.nodes and not c.command:
                raise _bad(key("command"), f"is required: {name} runs your server (vLLM, SGLang, ...) on its "
                                           f"{c.nodes} node(s)")
            if c.command and not c.nodes:
                raise _bad(key("nodes"), f"must be >= 1 to run {name}.command")
        elif c.command or c.reload:
            k = "command" if c.command else "reload"
            raise _bad(key(k), f"is for server components ({', '.join(SERVER_COMPONENTS)}); the trainer's "
                               "command is the job's `trainer` key")
    with_mem = [n for n, c in comps.items() if c.nodes and c.mem]
    if with_mem:
        # sbatch carries a component's --mem into the later components that give none
        # (measured on Slurm 22.05): each one must say its own
        for name, c in comps.items():
            if c.nodes and not c.mem:
                raise _bad(f"{name}.mem", f"must be given too: {with_mem[0]}.mem is, and Slurm would carry "
                                          f"it over to {name}; give every component its memory")
    if layout == "single":
        present = [(n, c) for n, c in comps.items() if c.nodes]
        first_name, first = present[0]
        for name, c in present[1:]:
            for k in NODE_TYPE_KEYS:
                if getattr(c, k) != getattr(first, k):
                    raise _bad(f"{name}.{k}", f"({getattr(c, k)!r}) differs from {first_name}.{k} "
                                              f"({getattr(first, k)!r}): layout=single is one job on one kind "
                                              "of node; use layout=het (a heterogeneous job)")
            if c.time != first.time:
                raise _bad(f"{name}.time", "differs between components: layout=single has one time limit")


def with_defaults(c: Component, **defaults: Any) -> Component:
    """`c` with its empty keys filled from the job's (partition, account)."""
    return replace(c, **{k: v for k, v in defaults.items() if v and not getattr(c, k)})


def sbatch_options(c: Component) -> list[str]:
    """The resource options of one component (after --nodes / --ntasks...)."""
    out = [f"--cpus-per-task={c.cpus_per_task}"]
    out += [f"--gpus-per-node={c.gpus_per_node}"] if c.gpus_per_node else []
    out += [f"--gres={c.gres}"] if c.gres else []
    out += [f"--mem={c.mem}"] if c.mem else []
    out += [f"--partition={c.partition}"] if c.partition else []
    out += [f"--qos={c.qos}"] if c.qos else []
    out += [f"--constraint={c.constraint}"] if c.constraint else []
    out += [f"--account={c.account}"] if c.account else []
    out += [f"--time={c.time}"] if c.time else []
    return out


def step_options(c: Component) -> list[str]:
    """What every srun step of the component repeats: its CPUs (Slurm 22.05's release notes: srun
    no longer reads the job's --cpus-per-task; with CPU binding a step of one CPU per task is
    pinned to one core) and its GPUs."""
    out = [f"--cpus-per-task={c.cpus_per_task}"]
    out += [f"--gpus-per-node={c.gpus_per_node}"] if c.gpus_per_node else []
    out += [f"--gres={c.gres}"] if c.gres else []
    return out
