"""Node-agent health: one sample per heartbeat, sent to the controller and appended to JSON lines.

`HealthSampler(agent).sample() -> dict` reads the agent's counters (slots, active rollouts,
completions, errors), its sandbox runtime (live sandboxes, warm pools, image mounts, tmpfs use
of the node namespace) and the host (CPU, memory, disk of the run root) through psutil. Keys
(stable; `docs/operations.md` documents them):

  ts, node, agent_version, draining, slots, slots_used, slots_free, sandboxes_active,
  warm_pool, rollouts_total, rollouts_per_s, cpu_percent, mem_used_mb, mem_free_mb,
  mem_percent, rss_mb, tmpfs_used_mb, disk_used_mb, disk_free_mb, image_mounts, errors{...},
  completed, bad_frames (kept for older readers),
  cancelled{code: n} (attempts the agent stopped, by cancel code: states.CancelReason),
  pool_hits, pool_misses (sandbox acquires served by a ready sandbox / made on the spot),
  pool_targets{pool: n}, pool_ready{pool: n} (per warm pool, named image+layers@hostname)

`warm_pool` is the number of ready sandboxes waiting in all pools.

With a `jsonl_dir` (from $PADDOCK_HEALTH_DIR when the agent is built by a job step), each
sample is also appended as one line to `<jsonl_dir>/<node>.jsonl`; the file is rotated to
`.1` past `max_jsonl_bytes`. A failure to read one figure leaves it null: health never stops
the heartbeat.

Must not import: zmq, controller.* (the agent sends what this returns), nodeagent.agent.daemon
or nodeagent.agent.core (it reads the agent it is given).
"""
from __future__ import annotations

import json
import logging
import os
import time
from pathlib import Path
from typing import Callable

import psutil

from nodeagent.agent.version import AGENT_VERSION

log = logging.getLogger(__name__)

HEALTH_DIR_ENV = "PADDOCK_HEALTH_DIR"
MAX_JSONL_BYTES = 64 * 2**20
# Figures that walk the process tree or read every sandbox's mounts cost 100-200 ms on a busy
# 2-core node; they are refreshed at most this often, the cheap ones on every heartbeat.
SLOW_FIGURES_EVERY_S = 5.0
IMAGE_FSTYPES = ("fuse.squashfuse", "squashfs", "fuse.squashfuse_ll")


class HealthSampler:
    def __init__(self, agent, jsonl_dir: str | os.PathLike | None = None,
                 clock: Callable[[], float] = time.monotonic, wall: Callable[[], float] = time.time,
                 max_jsonl_bytes: int = MAX_JSONL_BYTES, slow_every_s: float = SLOW_FIGURES_EVERY_S):
        self.agent, self.clock, self.wall = agent, clock, wall
        self.slow_every_s = slow_every_s
        self._slow: tuple[float, dict] | None = None
        self.jsonl = Path(jsonl_dir) / f"{agent.node}.jsonl" if jsonl_dir else None
        self.max_jsonl_bytes = max_jsonl_bytes
        self._last: tuple[float, int] | None = None
        self._proc = psutil.Process()
        psutil.cpu_percent(interval=None)   # the first call only primes the counter

    def sample(self) -> dict:
        a = self.agent
        active = len(getattr(a, "active", {}))
        completed = int(getattr(a, "completed", 0))
        now = self.clock()
        rate = None
        if self._last is not None and now > self._last[0]:
            rate = round((completed - self._last[1]) / (now - self._last[0]), 3)
        self._last = (now, completed)
        vm = psutil.virtual_memory()
        slots = int(getattr(a, "slots", 0))
        draining = bool(getattr(a, "draining", False))
        out = {
            "ts": round(self.wall(), 3), "node": a.node, "agent_version": AGENT_VERSION,
            "draining": draining, "slots": slots, "slots_used": active,
            "slots_free": 0 if draining else max(slots - active, 0),
            "rollouts_total": completed, "rollouts_per_s": rate,
            "cpu_percent": psutil.cpu_percent(interval=None),
            "mem_used_mb": int((vm.total - vm.available) / 2**20), "mem_free_mb": int(vm.available / 2**20),
            "mem_percent": vm.percent,
            "completed": completed, "bad_frames": int(getattr(a, "bad_frames", 0)),
        }
        out.update(self._slow_figures(now))
        out.update(self._runtime_figures(getattr(a, "runtime", None)))
        out["errors"] = {"bad_frames": out["bad_frames"], "infra_errors": int(getattr(a, "infra_errors", 0))}
        out["cancelled"] = dict(getattr(getattr(a, "core", a), "cancelled", None) or {})
        if self.jsonl is not None:
            self._append(out)
        return out

    # -- parts ------------------------------------------------------------------------------
    def _slow_figures(self, now: float) -> dict:
        if self._slow is None or now - self._slow[0] >= self.slow_every_s:
            figures = {"rss_mb": _safe(lambda: int(self._tree_rss() / 2**20))}
            rt = getattr(self.agent, "runtime", None)
            pid = getattr(rt, "holder_pid", None) if rt is not None else None
            figures["tmpfs_used_mb"] = _safe(lambda: int(_sandbox_tmpfs_bytes(pid) / 2**20)) if pid else None
            self._slow = (now, figures)
        return dict(self._slow[1])

    def _tree_rss(self) -> int:
        total = self._proc.memory_info().rss
        for c in self._proc.children(recursive=True):
            try:
                total += c.memory_info().rss
            except psutil.Error:
                continue
        return total

    def _runtime_figures(self, rt) -> dict:
        out = {"sandboxes_active": None, "warm_pool": None, "image_mounts": None,
               "disk_used_mb": None, "disk_free_mb": None}
        if rt is None:
            return out
        if callable(getattr(rt, "active_sandboxes", None)):
            out["sandboxes_active"] = rt.active_sandboxes()
        if callable(getattr(rt, "pool_stats", None)):
            out.update(rt.pool_stats())
        else:
            pools = getattr(rt, "_pools", None)
            out["warm_pool"] = _safe(lambda: sum(_pool_size(p) for p in (pools or {}).values()))
        state_dir = getattr(rt, "state_dir", None) or getattr(rt, "run_root", None)
        if state_dir:
            du = _safe(lambda: psutil.disk_usage(state_dir))
            if du is not None:
                out["disk_used_mb"], out["disk_free_mb"] = int(du.used / 2**20), int(du.free / 2**20)
        pid = getattr(rt, "holder_pid", None)
        if pid:
            mounts = _safe(lambda: _mounts_of(pid))
            if mounts is not None:
                out["image_mounts"] = sum(fs in IMAGE_FSTYPES for _mnt, fs in mounts)
        return out

    def _append(self, sample: dict) -> None:
        try:
            self.jsonl.parent.mkdir(parents=True, exist_ok=True)
            if self.jsonl.exists() and self.jsonl.stat().st_size > self.max_jsonl_bytes:
                os.replace(self.jsonl, self.jsonl.with_name(self.jsonl.name + ".1"))
            with open(self.jsonl, "a") as f:
                f.write(json.dumps(sample, sort_keys=True) + "\n")
        except OSError as exc:
            log.warning("cannot append health to %s: %s", self.jsonl, exc)


def sampler_for(agent) -> HealthSampler:
    """The agent's sampler, made on first use (JSON lines go to $PADDOCK_HEALTH_DIR if set)."""
    s = agent.__dict__.get("_health_sampler")
    if s is None:
        s = agent.__dict__["_health_sampler"] = HealthSampler(agent, os.environ.get(HEALTH_DIR_ENV) or None)
    return s


def _pool_size(pool) -> int:
    if hasattr(pool, "__len__"):
        return len(pool)
    for name in ("size", "ready", "available"):
        v = getattr(pool, name, None)
        v = v() if callable(v) else v
        if isinstance(v, int):
            return v
        if v is not None and hasattr(v, "__len__"):
            return len(v)
    return 0


def _mounts_of(pid: int) -> list[tuple[str, str]]:
    with open(f"/proc/{pid}/mounts") as f:
        return [(ln.split()[1], ln.split()[2]) for ln in f if len(ln.split()) > 2]


def _sandbox_tmpfs_bytes(holder_pid: int) -> int:
    """Bytes used on the tmpfs mounts of the sandboxes (their writable layers and /dev/shm): each
    sandbox monitor has its own mount namespace below the node holder; each namespace is read
    once, each filesystem counted once."""
    holder_ns = os.readlink(f"/proc/{holder_pid}/ns/mnt")
    # Filesystems the holder itself sees (the host's /dev/shm, the node's state tmpfs) are
    # inherited by every builder's namespace: they are not a sandbox's writable layer.
    seen_ns, seen_dev, total = {holder_ns}, set(), 0
    for mnt, _fs in _mounts_of(holder_pid):
        try:
            seen_dev.add(os.stat(f"/proc/{holder_pid}/root{mnt}").st_dev)
        except OSError:
            continue
    for child in psutil.Process(holder_pid).children(recursive=True):
        try:
            ns = os.readlink(f"/proc/{child.pid}/ns/mnt")
            if ns in seen_ns:
                continue
            seen_ns.add(ns)
            for mnt, fs in _mounts_of(child.pid):
                # statvfs of an overlay reports its upper layer: the sandbox's size-capped tmpfs
                if fs not in ("tmpfs", "overlay", "fuse.fuse-overlayfs"):
                    continue
                path = f"/proc/{child.pid}/root{mnt}"
                dev = os.stat(path).st_dev
                if dev not in seen_dev:
                    seen_dev.add(dev)
                    total += _used_bytes(path)
        except (OSError, psutil.Error):
            continue        # the sandbox went away while we looked
    return total


def _used_bytes(path: str) -> int:
    st = os.statvfs(path)
    return (st.f_blocks - st.f_bfree) * st.f_frsize


def _safe(fn):
    try:
        return fn()
    except (OSError, psutil.Error, ValueError):
        return None
