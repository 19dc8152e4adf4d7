"""The run assembler: what the local run (`paddock run`) and the Slurm head step (`paddock job
head`) share, so that the local run is the Slurm job with processes instead of job steps.

A run is: a run directory (0700, the run's CURVE keys, `tasks.json` with its on-disk index
`tasks.json.index`, `run.json`, `logs/`), one controller process (`paddock controller`), node
agents (`paddock agent`: child processes here, one job step per node on Slurm) and a trainer.
This module loads the task set and its images, writes the run directory, renders the controller's
and an agent's command line, starts a daemon with its log, waits for a file a daemon writes, and
stops the farm (a shutdown request to the controller, which stops the agents, then a bounded
wait, which covers the controller's wait for a running compaction: no compaction of the run is
left running when `stop_farm` returns). The trainer and the start-up validation are the caller's: the local run trains in
process with the scripted policy, the Slurm head starts a trainer command.

Must not import: controller.demo, controller.cli, nodeagent, slurm.
"""
from __future__ import annotations

import json
import logging
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Iterable, Optional

from controller.broker.config import BrokerConfig
from controller.broker.curve import ensure_run_keys
from controller.client.api import Client
from controller.contracts.tasks import TaskError
from controller.ondisk.keys import key_file_of, private_dir
from controller.ondisk.taskblobs import write_tasks_file
from controller.store.catalog import compaction_holder
from controller.store.taskindex import build as build_task_index
from controller.taskbank.bank import TaskBank
from controller.taskbank.blobs import blob_root, publish
from controller.taskbank.builtin import TASKSET_NAME, builtin_taskset
from controller.taskbank.conversational import TASKSET_NAME as CONVERSATIONAL_NAME
from controller.taskbank.conversational import conversational_taskset
from controller.taskbank.webtasks import TASKSET_NAME as WEB_TASKSET_NAME
from controller.taskbank.webtasks import web_taskset
from layers.builtin import ensure_browser_image, ensure_builtin_image
from layers.store import ImageNotFound

log = logging.getLogger(__name__)

COMPACT_EVERY = 20_000    # commits between automatic compactions of a run's shards
PADDOCK_CLI = (sys.executable, "-m", "controller.cli")   # the daemons run as `paddock controller|agent`
ENDPOINT_FILE = "controller.endpoint"   # the controller writes its endpoint here once it serves
TASKS_FILE = "tasks.json"
RUN_FILE = "run.json"
HEALTH_DIR_ENV = "PADDOCK_HEALTH_DIR"   # the node agent's health stream directory (nodeagent/agent/health.py)
STOP_WAIT_S = 30.0        # how long the farm's processes get to exit after the shutdown request
COMPACT_WAIT_S = BrokerConfig.compact_wait_s   # the controller's wait for a running compaction at shutdown
TERM_WAIT_S = 5.0         # after a SIGTERM, before the SIGKILL

BUILTIN_IMAGE = "builtin:python"
BROWSER_IMAGE = "builtin:browser"       # web tasks (layers.builtin.ensure_browser_image)


# ----------------------------------------------------------------------------- the task set
def load_taskset(name: str, bank: str = ""):
    """The built-in task set ("builtin"), or task set `name` from the task bank at `bank`."""
    if name in ("builtin", TASKSET_NAME):
        return builtin_taskset()
    if name in ("conversational", CONVERSATIONAL_NAME):
        return conversational_taskset()
    if name in ("builtin-web", WEB_TASKSET_NAME):
        return web_taskset()
    return TaskBank(bank or None).load_set(name)


def task_images(taskset, store) -> dict[str, tuple[str, Path]]:
    """Task id -> (image digest, SIF path) for every task of the set: `builtin:python` is built
    or reused; `sha256:<hex>` must already be in `store` (`paddock image build ... --store`).
    TaskError names the task and the image it lacks."""
    out: dict[str, tuple[str, Path]] = {}
    resolved: dict[str, tuple[str, Path]] = {}
    for t in taskset.tasks:
        if t.image not in resolved:
            if t.image == BUILTIN_IMAGE:
                resolved[t.image] = ensure_builtin_image(store)
            elif t.image == BROWSER_IMAGE:
                resolved[t.image] = ensure_browser_image(store)
            elif t.image.startswith("sha256:"):
                try:
                    resolved[t.image] = (t.image, store.get(t.image))
                except ImageNotFound:
                    raise TaskError(f"task {t.name!r}: image {t.image} is not in the image store at "
                                    f"{store.root}; build it there with `paddock image build SRC --store "
                                    f"{store.root}`") from None
            else:
                raise TaskError(f"task {t.name!r}: image {t.image!r} is neither {BUILTIN_IMAGE!r} nor "
                                f"'sha256:<digest>' of an image in the store")
        out[t.task_id] = resolved[t.image]
    return out


def lease_tasks(taskset, images: str | dict[str, tuple[str, Path]]) -> dict[str, dict]:
    """Task ref (name and id) -> the task dict a lease carries to a node agent. `images`: one
    image digest for every task, or `task_images()`."""
    out = {}
    for t in taskset.tasks:
        d = t.canonical()
        digest = images if isinstance(images, str) else images[t.task_id][0]
        d.update(task_id=t.task_id, image_digest=digest, taskset_hash=taskset.manifest_hash,
                 split="heldout" if t.task_id in taskset.heldout else "train")
        out[t.task_id] = d
        out[t.name] = d
    return out


def validation_cache_dir(store_root: Path) -> Path:
    """Where task validations are cached: next to the images when this user may write there (one
    cache for everyone sharing the store), else in the user's own cache directory (a shared store
    an admin keeps read-only for ordinary users)."""
    shared = store_root / "validation"
    if os.access(shared if shared.is_dir() else store_root, os.W_OK):
        return shared
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "paddock" / "validation"


# ----------------------------------------------------------------------------- the run directory
def open_run_dir(run_dir: Path) -> Path:
    """The run directory (0700: hidden tests, rewards and the run's keys are the owner's) with
    its `logs/` and the run's CURVE keys, made before any daemon starts (every peer loads them).
    Returns the key file. KeyFileError names what is wrong with an existing one."""
    private_dir(run_dir)
    (run_dir / "logs").mkdir(exist_ok=True)
    key_file = key_file_of(run_dir)
    ensure_run_keys(key_file)
    return key_file


def write_run_files(run_dir: Path, taskset, images: dict[str, tuple[str, Path]], bank: str, info: dict) -> None:
    """What the controller serves from: the task set's content published by digest (in the bank,
    or beside the run), `tasks.json` (each task's small lease reference) and its on-disk index
    (built once here, so the controller opens it without reading an entry), and `run.json`
    (`info`: what the run is)."""
    tasks_json = run_dir / TASKS_FILE
    write_tasks_file(tasks_json, publish(taskset, images, blob_root(bank, taskset, run_dir)))
    build_task_index(tasks_json)
    (run_dir / RUN_FILE).write_text(json.dumps(info, indent=2))


# ----------------------------------------------------------------------------- the processes
def controller_argv(run_dir: Path, deployment: str, heartbeat_interval_s: float, *,
                    bind: Optional[str] = None, lease_ttl_s: Optional[float] = None,
                    compact_every: int = COMPACT_EVERY, metrics_port: Optional[int] = None,
                    metrics_addr: Optional[str] = None, curriculum_db: Optional[Path] = None) -> list[str]:
    """`paddock controller` serving the run in `run_dir`."""
    argv = [*PADDOCK_CLI, "controller"]
    if bind is not None:
        argv += ["--bind", bind]
    argv += ["--deployment", deployment, "--run-dir", str(run_dir), "--tasks-json", str(run_dir / TASKS_FILE),
             "--endpoint-file", str(run_dir / ENDPOINT_FILE), "--key-file", str(key_file_of(run_dir)),
             "--heartbeat-interval-s", str(heartbeat_interval_s)]
    if lease_ttl_s is not None:
        argv += ["--lease-ttl-s", str(lease_ttl_s)]
    argv += ["--compact-every", str(compact_every)]
    if metrics_port is not None:
        argv += ["--metrics-port", str(metrics_port)]
        if metrics_addr is not None:
            argv += ["--metrics-addr", metrics_addr]
    if curriculum_db is not None:
        argv += ["--curriculum-db", str(curriculum_db)]
    return argv


def agent_argv(run_dir: Path, node: str, endpoint: str, deployment: str, *, slots: int, image_store: str,
               subid_share: str, heartbeat_interval_s: float, sandbox: str = "native") -> list[str]:
    """`paddock agent` for node `node` of the run in `run_dir`, dialling `endpoint` (and
    following the endpoint file when the controller moves)."""
    argv = [*PADDOCK_CLI, "agent", "--node", node, "--controller", endpoint,
            "--key-file", str(key_file_of(run_dir)), "--endpoint-file", str(run_dir / ENDPOINT_FILE),
            "--deployment", deployment, "--slots", str(slots), "--image-store", image_store,
            "--subid-share", subid_share, "--heartbeat-interval-s", str(heartbeat_interval_s)]
    return argv + (["--sandbox", sandbox] if sandbox != "native" else [])


def spawn(argv: list[str], log_path: Path, env: Optional[dict[str, str]] = None,
          ignore: Iterable[signal.Signals] = ()) -> subprocess.Popen:
    """Start a daemon with its output appended to `log_path`; `ignore`: signals it starts with
    ignored (the disposition survives exec: a controller that must outlive a job's drain)."""
    ignored = tuple(ignore)
    f = open(log_path, "ab")
    return subprocess.Popen(argv, stdout=f, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                            env={**os.environ, **(env or {})},
                            preexec_fn=(lambda: [signal.signal(s, signal.SIG_IGN) for s in ignored])
                            if ignored else None)


def wait_file(path: Path, proc: subprocess.Popen, timeout_s: float, what: str) -> str:
    """The text `proc` writes to `path` once it serves; RuntimeError if it exits first or does
    not write it within `timeout_s`."""
    deadline = time.monotonic() + timeout_s
    while not path.exists():
        if proc.poll() is not None:
            raise RuntimeError(f"{what} exited with code {proc.returncode} before starting; see its log")
        if time.monotonic() > deadline:
            raise RuntimeError(f"{what} did not start within {timeout_s}s")
        time.sleep(0.05)
    return path.read_text().strip()


def stop_farm(procs: list[subprocess.Popen], endpoint: Optional[str], deployment: str, key_file: Path,
              reason: str, wait_s: float = STOP_WAIT_S, compact_wait_s: float = COMPACT_WAIT_S,
              run_dir: Optional[Path] = None) -> None:
    """Stop a run's processes (`procs[0]` the controller): a shutdown request to the controller
    while it runs (it stops the agents and flushes the catalog), then each process gets until
    the deadline to exit (the controller `compact_wait_s` more: it lets a running compaction
    finish first), then SIGTERM, then SIGKILL. Then `wait_compaction`: no compaction of the run
    (`run_dir`, by default the key file's directory, where `open_run_dir` puts it) is left
    running. Shard files are synced to disk at the end."""
    if endpoint and procs and procs[0].poll() is None:
        try:
            with Client(endpoint, deployment, timeout_s=5, retries=2, key_file=key_file) as c:
                c.shutdown(reason)
        except Exception as exc:  # the controller may already be gone
            log.warning("controller shutdown request failed: %s", exc)
    start = time.monotonic()
    for p in reversed(procs):
        _stop(p, start + wait_s + (compact_wait_s if p is procs[0] else 0.0))
    wait_compaction(run_dir or key_file.parent, compact_wait_s)
    os.sync()


def _stop(p: subprocess.Popen, deadline: float) -> None:
    """Wait for `p` until `deadline` (monotonic), then SIGTERM, then SIGKILL."""
    try:
        p.wait(timeout=max(deadline - time.monotonic(), 0.1))
    except subprocess.TimeoutExpired:
        log.warning("pid %d did not exit in time: SIGTERM", p.pid)
        p.terminate()
        try:
            p.wait(timeout=TERM_WAIT_S)
        except subprocess.TimeoutExpired:
            p.kill()
            p.wait()


def wait_compaction(run_dir: Path, wait_s: float = COMPACT_WAIT_S, poll_s: float = 0.05) -> Optional[int]:
    """Return once no compaction runs on `run_dir` (none holds its `catalog/compact.lock`): one
    left by a controller that did not wait for it (killed) gets `wait_s` to finish, then is
    killed (SIGKILL; compaction is crash-safe and the next one finishes it) when it runs on this
    host. Returns the pid killed, or None."""
    deadline = time.monotonic() + wait_s
    while (holder := compaction_holder(run_dir)) is not None:
        if time.monotonic() < deadline:
            time.sleep(poll_s)
            continue
        pid, host = holder
        if pid <= 0 or host != os.uname().nodename:
            log.warning("a compaction of %s (pid %s on %s) still runs after %.0fs: leaving it",
                        run_dir, pid or "?", host or "?", wait_s)
            return None
        log.warning("compaction pid %d still running on %s after %.0fs: killing it (the next "
                    "compaction finishes it)", pid, run_dir, wait_s)
        try:
            os.kill(pid, signal.SIGKILL)
        except OSError as exc:
            log.warning("cannot kill compaction pid %d: %s", pid, exc)
            return None
        gone_by = time.monotonic() + TERM_WAIT_S
        while compaction_holder(run_dir) == holder and time.monotonic() < gone_by:
            time.sleep(poll_s)    # its lock goes with it
        return pid
    return None
