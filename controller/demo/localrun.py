"""The local farm run (`paddock run`): the whole RL loop on one machine, on real parts.

Builds (or reuses) the built-in image, starts the scripted policy server, a controller process
and N node-agent processes linked by ZeroMQ, then a small trainer submits one batch per policy
version, reads the committed trajectories back with DuckDB, updates the policy by REINFORCE and
publishes the next version through the controller. Ends with a DuckDB summary of the run.
The run is assembled as the Slurm head step assembles its own (controller/farm/assemble.py: the
run directory, the task index, the controller's and agents' command lines, the stop), with the
node agents as child processes instead of job steps. `train` is also the Slurm job's built-in
trainer (controller/demo/builtin_trainer.py). The command line is controller/cli/run.py.

Must not import: slurm, controller.cli (this is a library of the CLI's `paddock run`).
"""
from __future__ import annotations

import json
import logging
import math
import os
import random
import subprocess
import time
import uuid
from dataclasses import asdict, dataclass, fields
from pathlib import Path
from typing import Callable, Optional

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from controller.analysis.defences import CHEATS
from controller.analysis.query import connect, print_summary, summary
from controller.client.api import Client
from controller.contracts.liveness import HEARTBEAT_INTERVAL_S
from controller.contracts.safeload import ParseLimitError, load_yaml
from controller.contracts.states import InfraReason
from controller.contracts.tasks import LIMIT_RANGES, TaskError
from controller.demo.policy_server import PolicyServer, default_params
from controller.demo.swe_policy import PolicyScriptError, SwePlayer, load_policy_script
from controller.demo.trainer import Sample, ScriptedPolicyTrainer, probabilities, strategy_from_plan
from controller.demo.web_policy import WebPlayer
from controller.farm.assemble import (
    COMPACT_EVERY,
    ENDPOINT_FILE,
    HEALTH_DIR_ENV,
    agent_argv,
    controller_argv,
    load_taskset,
    open_run_dir,
    spawn,
    stop_farm,
    task_images,
    validation_cache_dir,
    wait_file,
    write_run_files,
)
from controller.ondisk.keys import key_file_of
from controller.taskbank.conversational import validate_conversational
from controller.taskbank.curriculum import Curriculum, CurriculumConfig
from layers.builtin import default_store_root, ensure_builtin_image
from layers.store import ImageStore

log = logging.getLogger(__name__)



class ConfigError(ValueError):
    """An invalid run config: the message names the key."""


@dataclass(frozen=True)
class RunConfig:
    agents: int = 2
    slots_per_agent: int = 2
    versions: int = 8
    rollouts_per_task: int = 1
    learning_rate: float = 4.0
    runs_dir: str = "runs"
    image_store: str = ""
    heartbeat_interval_s: float = HEARTBEAT_INTERVAL_S
    lease_ttl_s: float = 300.0
    start_timeout_s: float = 60.0
    tasks_limit: int = 0              # 0: every built-in task
    seed: int = 0                     # curriculum sampling seed (the run is reproducible)
    curriculum_db: str = ""           # "": <runs_dir>/curriculum.sqlite, kept across runs
    validate: str = "quick"           # quick | full | off: validate the task set first (validation.py)
    taskset: str = "builtin"          # "builtin", or a task set stored in the bank (`paddock tasks import`)
    bank: str = ""                    # the task bank directory ("": $PADDOCK_TASKBANK, else ./taskbank)
    compact_every: int = COMPACT_EVERY  # the controller merges small shards after every N commits (0: never)
    policy_script: str = ""           # per-task scripts of swe tasks for the scripted policy (swe_policy.py)
    metrics_port: Optional[int] = None  # the controller's Prometheus metrics port (0: any free; None: off)

    def __post_init__(self) -> None:
        for key in ("agents", "slots_per_agent", "versions", "rollouts_per_task"):
            v = getattr(self, key)
            if isinstance(v, bool) or not isinstance(v, int) or v < 1:
                raise ConfigError(f"config key {key!r} must be an integer >= 1, got {v!r}")
        for key in ("tasks_limit", "seed"):
            v = getattr(self, key)
            if isinstance(v, bool) or not isinstance(v, int) or v < 0:
                raise ConfigError(f"config key {key!r} must be an integer >= 0, got {v!r}")
        for key in ("learning_rate", "heartbeat_interval_s", "lease_ttl_s", "start_timeout_s"):
            v = getattr(self, key)
            if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v) or v <= 0:
                raise ConfigError(f"config key {key!r} must be a finite number > 0, got {v!r}")
        for key in ("runs_dir", "image_store", "curriculum_db", "taskset", "bank", "policy_script"):
            if not isinstance(getattr(self, key), str):
                raise ConfigError(f"config key {key!r} must be a string, got {getattr(self, key)!r}")
        if isinstance(self.compact_every, bool) or not isinstance(self.compact_every, int) or self.compact_every < 0:
            raise ConfigError(f"config key 'compact_every' must be an integer >= 0, got {self.compact_every!r}")
        mp = self.metrics_port
        if mp is not None and (isinstance(mp, bool) or not isinstance(mp, int) or not 0 <= mp <= 65535):
            raise ConfigError(f"config key 'metrics_port' must be a port number 0-65535 (0: any free "
                              f"port), got {mp!r}")
        if self.validate not in ("quick", "full", "off"):
            raise ConfigError(f"config key 'validate' must be quick, full or off, got {self.validate!r}")
        if self.agents * self.slots_per_agent > 62:
            raise ConfigError("config keys 'agents' x 'slots_per_agent' must not exceed 62 sandboxes")

    @classmethod
    def load(cls, path: str | None, overrides: dict) -> "RunConfig":
        data = {}
        if path:
            try:
                data = load_yaml(path)
            except OSError as exc:
                raise ConfigError(f"cannot read config {path}: {exc.strerror or exc}") from None
            except ParseLimitError as exc:
                raise ConfigError(f"config {exc}") from None
            data = {} if data is None else data
            if not isinstance(data, dict):
                raise ConfigError(f"config {path} must be a mapping of keys to values")
        data.update({k: v for k, v in overrides.items() if v is not None})
        known = {f.name for f in fields(cls)}
        unknown = sorted(set(data) - known)
        if unknown:
            raise ConfigError(f"unknown config key {unknown[0]!r}; valid keys: {', '.join(sorted(known))}")
        return cls(**data)


LOCAL_FAMILIES = ("python", "math", "conversational")     # what the local run's scripted policy can play
PLAYER_FAMILIES = ("web",)              # ... with its own players (controller/demo/web_policy.py)
SCRIPTED_FAMILIES = ("swe",)            # ... and, given a policy script, these


def reason_of(item: dict) -> InfraReason | str:
    """A dead letter's reason as the results give it: typed when the row has its code."""
    code, text = item.get("infra_code"), item.get("infra_reason")
    return InfraReason(code, text) if code and text else text or "?"


def scripted_players(taskset, policy_script: str = "") -> dict[str, SwePlayer]:
    """The scripted policy's extra players for `taskset` (`ScriptedPolicy(players=...)`): the swe
    player when a policy script is given. TaskError names a family it cannot play, a swe task the
    script has no variants for, or what is wrong with the script."""
    families = {t.family for t in taskset.tasks}
    playable = LOCAL_FAMILIES + (SCRIPTED_FAMILIES if policy_script else ())
    others = sorted(families - set(playable) - set(PLAYER_FAMILIES))
    if others:
        hint = " (swe tasks: give a policy script, --policy-script FILE)" if "swe" in others else ""
        raise TaskError(f"the scripted policy plays {', '.join(playable[:-1])} and {playable[-1]} tasks; task set {taskset.name!r} "
                        f"also has {', '.join(others)} tasks{hint}; or run them with your own trainer "
                        f"(`paddock sbatch render trainer=...`, docs/operations.md)")
    web = {"web": WebPlayer()} if "web" in families else {}
    if not policy_script:
        return web
    try:
        script = load_policy_script(policy_script)
    except PolicyScriptError as exc:
        raise TaskError(str(exc)) from None
    missing = script.missing(taskset.tasks)
    if missing:
        raise TaskError(f"policy script {policy_script} has no variants for task {missing[0]!r} "
                        f"({len(missing)} swe tasks lack one)")
    return {**web, "swe": SwePlayer(script)}


def node_capacity() -> dict[str, float]:
    """This node's ceiling for each sandbox limit: memory and CPUs it has, the kernel's pid_max."""
    cap = {key: hi for key, (_k, _lo, hi) in LIMIT_RANGES.items()}
    try:
        with open("/proc/meminfo") as f:
            total_kb = next(int(line.split()[1]) for line in f if line.startswith("MemTotal:"))
        cap["memory_mb"] = total_kb // 1024
    except (OSError, StopIteration, ValueError):
        pass
    cap["cpu"] = float(len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1)
    try:
        with open("/proc/sys/kernel/pid_max") as f:
            cap["pids"] = min(cap["pids"], int(f.read()))
    except (OSError, ValueError):
        pass
    return cap


def check_task_limits(taskset, names: list[str], capacity: dict[str, float]) -> None:
    """Every task the run plays fits this machine (the local run's only node): ConfigError
    naming the task and the limit otherwise, before any daemon starts."""
    wanted = set(names)
    for t in taskset.tasks:
        if t.name not in wanted:
            continue
        for key, value in asdict(t.limits).items():
            if key in ("memory_mb", "cpu") and value > capacity[key]:
                raise ConfigError(f"config key 'taskset': task {t.name!r} asks for limits.{key} = {value:g}, "
                                  f"more than this machine has ({capacity[key]:g})")


def _validate(taskset, names, validate, images, store, run_dir: Path, cfg, console) -> list[str]:
    """The node side's check (`validate`) for every task but the conversational ones, which the
    task bank checks itself, and the web ones (not validated at start-up) (their reference calls replayed by the rule engine:
    `controller.taskbank.conversational.validate_conversational`); quarantined tasks of both
    go to `<run_dir>/quarantine.json`."""
    family = {t.name: t.family for t in taskset.tasks}
    conv = [n for n in names if family[n] == "conversational"]
    # Web tasks have no reference solution the start-up validation can apply (their reference is
    # a browser session: tests/web plays every built-in one).
    web = [n for n in names if family[n] == "web"]
    if web and cfg.validate != "off":
        console.print(f"validation: {len(web)} web tasks are not validated at start-up "
                      "(no applicable reference solution)")
    others = [n for n in names if family[n] not in ("conversational", "web")]
    kept = validate(taskset, others, {t.name: images[t.task_id][1] for t in taskset.tasks},
                    validation_cache_dir(Path(store.root)), run_dir,
                    cfg.validate, workers=cfg.agents * cfg.slots_per_agent, console=console) if others else []
    if conv and cfg.validate != "off":
        conv_ok, conv_bad = validate_conversational(taskset, conv)
        qfile = run_dir / "quarantine.json"
        quarantined = json.loads(qfile.read_text()) if qfile.exists() else {}
        qfile.write_text(json.dumps({**quarantined, **conv_bad}, indent=2, sort_keys=True))
        console.print(f"validated {len(conv)} conversational tasks (reference replay); quarantined {len(conv_bad)}"
                      + "".join(f"\n  {n}: {b['reasons'][0]}" for n, b in conv_bad.items()))
        conv = conv_ok
    keep = set(kept) | set(conv) | set(web)
    return [n for n in names if n in keep]


def run_local(cfg: RunConfig, validate: Callable[..., list[str]], console=None) -> Path:
    """The whole local run; `validate` is the node side's start-up check of the task set
    (`nodeagent.verifier.validate.validate_for_run`, handed in by the CLI)."""

    console = console or Console()
    try:
        taskset = load_taskset(cfg.taskset, cfg.bank)
    except TaskError as exc:
        raise ConfigError(f"config key 'taskset': {exc}") from None
    try:
        players = scripted_players(taskset, cfg.policy_script)
    except TaskError as exc:
        key = "policy_script" if cfg.policy_script and "policy script" in str(exc) else "taskset"
        raise ConfigError(f"config key {key!r}: {exc}") from None
    names = [t.name for t in taskset.tasks][: cfg.tasks_limit or None]
    check_task_limits(taskset, names, node_capacity())
    store = ImageStore(cfg.image_store or default_store_root())
    with console.status("image: building or reusing the built-in python image") as st:
        digest, image_path = ensure_builtin_image(store, progress=lambda m: st.update(f"image: {m}"))
        try:
            images = task_images(taskset, store)
        except TaskError as exc:
            raise ConfigError(f"config key 'taskset': {exc}") from None
    console.print(f"task set {taskset.name} ({len(names)} tasks); image {digest[:19]}… at {image_path}")
    run_id = time.strftime("%Y%m%d-%H%M%S-") + uuid.uuid4().hex[:6]
    run_dir = (Path(cfg.runs_dir) / run_id).resolve()
    Path(cfg.runs_dir).mkdir(parents=True, exist_ok=True)
    run_dir.mkdir()
    key_file = open_run_dir(run_dir)   # 0700, logs/, the run's keys: before any daemon
    write_run_files(run_dir, taskset, images, cfg.bank, {
        "run_id": run_id, "taskset": taskset.name, "taskset_hash": taskset.manifest_hash, "image": digest,
        "config": asdict(cfg), "curriculum": asdict(local_curriculum_config(cfg))})
    names = _validate(taskset, names, validate, images, store, run_dir, cfg, console)
    deployment = f"local-{run_id}"
    procs: list[subprocess.Popen] = []
    with PolicyServer(taskset, players=players) as policy:
        try:
            ctl = spawn(controller_argv(run_dir, deployment, cfg.heartbeat_interval_s, lease_ttl_s=cfg.lease_ttl_s,
                                        compact_every=cfg.compact_every, metrics_port=cfg.metrics_port),
                        run_dir / "logs" / "controller.log")
            procs.append(ctl)
            endpoint = wait_file(run_dir / ENDPOINT_FILE, ctl, cfg.start_timeout_s, "controller")
            metrics_file = run_dir / (ENDPOINT_FILE + ".metrics")
            if metrics_file.exists():     # written before the endpoint
                console.print(f"metrics {metrics_file.read_text().strip()}")
            # each agent appends its health samples to <run>/health/<node>.jsonl (`paddock health`)
            health_env = {HEALTH_DIR_ENV: str(run_dir / "health")}
            for i in range(cfg.agents):
                procs.append(spawn(agent_argv(run_dir, f"local-{i + 1}", endpoint, deployment,
                                              slots=cfg.slots_per_agent, image_store=str(store.root),
                                              subid_share=f"{i}/{cfg.agents}",
                                              heartbeat_interval_s=cfg.heartbeat_interval_s),
                                   run_dir / "logs" / f"agent-{i + 1}.log",
                                   # the node's judge and user_sim services: the policy server's scripted ones
                                   env={**health_env, **{k: os.environ.get(k, policy.url) for k in
                                                         ("PADDOCK_JUDGE_ENDPOINT", "PADDOCK_USER_SIM_ENDPOINT")}}))
            console.print(f"controller {endpoint}, {cfg.agents} node agents, policy server {policy.url}")
            train(cfg, policy, endpoint, deployment, run_dir, taskset, names, default_params(), console)
        finally:
            stop_farm(procs, endpoint if (run_dir / ENDPOINT_FILE).exists() else None, deployment,
                      key_file, "run finished", run_dir=run_dir)   # returns with no compaction running
    print_summary(summary(run_dir), run_dir, out=None)
    return run_dir


# Each scored rollout's first assistant message (its `plan:` line; a conversation's step 0 is the
# user's opening). judge_failed and infra_error rows have no reward: never trained on.
FIRST_ASSISTANT_SQL = (
    "SELECT r.task_family, s.content, r.reward FROM rollouts r JOIN steps s "
    "USING (rollout_id, attempt, fencing_token) WHERE s.role = 'assistant' AND r.batch_id = ? "
    "AND r.reward IS NOT NULL QUALIFY row_number() OVER (PARTITION BY rollout_id, attempt, fencing_token "
    "ORDER BY s.step) = 1")


def train(cfg, policy, endpoint, deployment, run_dir, taskset, names, params, console) -> None:
    """One batch per policy version from the curriculum sampler; each batch's committed rows
    update the scripted policy (REINFORCE), published to the controller as the next version."""
    trainer = ScriptedPolicyTrainer(params, lr=cfg.learning_rate)
    by_id = {t.task_id: t.name for t in taskset.tasks if t.name in set(names)}
    curriculum = Curriculum(cfg.curriculum_db or Path(cfg.runs_dir) / "curriculum.sqlite", by_id,
                            local_curriculum_config(cfg))
    rng = random.Random(cfg.seed)
    total = cfg.versions * len(names) * cfg.rollouts_per_task
    with Client(endpoint, deployment, key_file=key_file_of(run_dir)) as client, Progress(
            TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
            console=console) as bar:
        job = bar.add_task("rollouts", total=total)
        for version in range(cfg.versions):
            policy.set_policy(version, params)
            client.publish_policy(version, policy.url, f"scripted-v{version}")
            picks = curriculum.sample(total // cfg.versions, rng, version)
            batch_id = client.submit([by_id[t] for t in picks], 1, version)
            passed = seen = 0
            for item in client.results(batch_id):
                seen += 1
                passed += item.get("outcome") == "pass"
                if item.get("state") == "dead_letter":      # a broken task, not a bad agent
                    curriculum.record_infra_failure(item["task_ref"], reason_of(item))
                bar.update(job, advance=1, description=f"policy v{version}: {passed}/{seen} passed")
            con = connect(run_dir)
            rows = con.execute(
                FIRST_ASSISTANT_SQL, [batch_id]).fetchall()
            _record_outcomes(curriculum, con, batch_id)
            con.close()
            del con         # lets go of the run's readers lock: compaction may unlink what it replaced
            occupancy = curriculum.occupancy(version)   # through this version: what `paddock report` shows
            samples = []
            for family, content, reward in rows:
                if family not in params:      # a family its own player plays (swe_policy.py)
                    continue
                try:
                    samples.append(Sample(family, strategy_from_plan(content), float(reward)))
                except ValueError:
                    continue
            params = trainer.update(samples)
            probs = probabilities(params)
            cheats = sum(s.strategy in CHEATS[s.family] for s in samples)
            paid = sum(s.strategy in CHEATS[s.family] and s.reward > 0 for s in samples)
            p_cheat = max(sum(p for k, p in probs[f].items() if k in CHEATS[f]) for f in probs)
            classes = ", ".join(f"{k} {n}" for k, n in occupancy.items() if n)
            bar.console.print(f"v{version}: tasks {classes}; pass {passed}/{seen}, cheat attempts {cheats} ({paid} rewarded); "
                              f"next policy p(solve) python={probs['python']['solve']:.2f} "
                              f"math={probs['math']['solve']:.2f} "
                              f"conversational={probs['conversational']['solve']:.2f}, p(cheat) <= {p_cheat:.3f}")
        policy.set_policy(cfg.versions, params)


def local_curriculum_config(cfg: RunConfig):
    """The local run samples each task `rollouts_per_task` times per version, so with the default
    decay (0.5) a task's weighted evidence never exceeds `rollouts_per_task` and every task would
    stay "explore" for ever. Its policy moves a little per version, so older versions keep more
    weight here: with one rollout per version a task is classified from its fourth version on."""
    return CurriculumConfig(decay=0.9 if cfg.rollouts_per_task < 3 else 0.5)


def _record_outcomes(curriculum, con, batch_id: str) -> None:
    """Feed a batch's committed outcomes to the curriculum; the solution is the hash of the
    agent's actions and final answer (the same actions make the same diff)."""
    rows = con.execute(
        "SELECT r.rollout_id, r.task_id, r.policy_version, r.outcome, md5(coalesce(any_value(r.answer), "
        "'') || '|' || coalesce(string_agg(s.tool_args, '|' ORDER BY s.step), '')) "
        "FROM rollouts r LEFT JOIN steps s USING (rollout_id, attempt, fencing_token) "
        "WHERE r.batch_id = ? GROUP BY ALL", [batch_id]).fetchall()
    for rollout_id, task_id, version, outcome, solution in rows:
        curriculum.record(task_id, version, outcome, solution, rollout_id)
