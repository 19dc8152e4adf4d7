"""Warm pool: per sandbox spec (image + layers + limits), a target number of ready sandboxes.

`WarmPool.take()` hands out a ready sandbox at most once (a deque pop: microseconds), or None
when the pool is empty. It takes no lock the refill thread holds and allocates nothing the
collector tracks: it wakes the refill thread through a `queue.SimpleQueue` (C, lock-free for
the caller), not a `Condition`. A background thread refills it to `target`, backing off
exponentially when creation fails (the failure is logged and counted, never raised into the
caller). A
handed-out sandbox belongs to the caller, who destroys it after use; sandboxes are never
returned to the pool. `stop()` destroys what is still waiting.

`PooledBackend` gives a backend `pool(spec, target)` and `acquire(spec)` over its own `create`:
one pool per spec shape (`pool_key`: image, layers, limits, hostname, egress socket), and a
handout for the very spec object a pool was made with that builds no key. Pooled sandboxes are
made without the spec's `files` (so one pool serves every task of the same image and layers, and
no task's files wait in another task's sandbox); `acquire` writes the files it is asked for.
Both backends mix it in.

`autoscale(scaler, capacity)` puts the pools under a `nodeagent.sandbox.autoscale.Autoscaler`:
every `acquire` of a spec without an egress socket (a socket is per rollout: such a spec never
repeats) is an arrival of its key, and a hit (a ready sandbox) or a miss (made on the spot, its
create latency measured). A manager thread plans every `PLAN_EVERY_S` (and at once after an
arrival): it starts a pool for a key the plan names, sets its target, and stops the pool of a key
that dropped to 0 (idle: its image and layer mounts then go after their grace period).
`pool_stats()` is what the node's health reports.

Imports only the standard library and nodeagent.sandbox.autoscale; the runtime is passed in.
"""
from __future__ import annotations

import collections
import dataclasses
import logging
import os
import queue
import threading
import time
from typing import Callable

from nodeagent.sandbox.autoscale import Autoscaler, Capacity, Cost

log = logging.getLogger(__name__)

MAX_BACKOFF_S = 5.0
IDLE_WAKE_S = 1.0   # how often an idle pool lets the runtime unmount unused images
PLAN_EVERY_S = 1.0  # the autoscaler's planning period (an arrival plans at once)


class WarmPool:
    def __init__(self, runtime, spec, target: int, on_created: Callable[[float], None] | None = None):
        if target < 0:
            raise ValueError(f"warm pool target must be >= 0, not {target}")
        self.runtime, self.spec, self.target = runtime, spec, target
        self.on_created = on_created   # told each refill's create latency (seconds)
        self._ready: collections.deque = collections.deque()
        self._wake = threading.Condition()    # the refill thread tells waiters (`wait_ready`)
        self._kick: queue.SimpleQueue = queue.SimpleQueue()   # anyone wakes the refill thread
        self._stopped = False
        self._thread: threading.Thread | None = None
        self.created = self.handed_out = self.failures = 0
        self.last_error: str | None = None

    def start(self) -> "WarmPool":
        self._thread = threading.Thread(target=self._fill, name="warm-pool", daemon=True)
        self._thread.start()
        return self

    def __len__(self) -> int:
        return len(self._ready)

    def take(self):
        """A ready sandbox (never handed out before), or None if the pool is empty right now."""
        try:
            sb = self._ready.popleft()
        except IndexError:
            sb = None
        else:
            self.handed_out += 1
        self._kick.put(None)
        return sb

    def set_target(self, target: int) -> None:
        self.target = target
        self._kick.put(None)

    def wait_ready(self, n: int | None = None, timeout_s: float = 30.0) -> bool:
        """Block until at least `n` (default: target) sandboxes are ready."""
        want = self.target if n is None else n
        with self._wake:
            return self._wake.wait_for(lambda: len(self._ready) >= want or self._stopped, timeout_s)

    def _fill(self) -> None:
        backoff = 0.05
        while not self._stopped:
            while len(self._ready) > self.target:   # the target went down: the surplus goes
                try:
                    sb = self._ready.pop()           # the newest (a handout takes the oldest)
                except IndexError:
                    break
                try:
                    sb.destroy()
                except Exception as exc:  # noqa: BLE001 - an operating error: logged, go on
                    log.warning("warm pool: destroying a surplus sandbox failed: %s", exc)
            if len(self._ready) >= self.target:
                try:
                    self._kick.get(timeout=IDLE_WAKE_S)
                except queue.Empty:
                    self.runtime.reap_images()   # idle: let unused images go
                continue
            t0 = time.monotonic()
            try:
                sb = self.runtime.create(self.spec)
            except Exception as exc:  # noqa: BLE001 - an operating error: count, back off, retry
                self.failures += 1
                self.last_error = str(exc)
                log.warning("warm pool refill failed (%d so far): %s", self.failures, exc)
                try:
                    self._kick.get(timeout=backoff)   # `stop` cuts the wait short
                except queue.Empty:
                    pass
                backoff = min(backoff * 2, MAX_BACKOFF_S)
                continue
            backoff = 0.05
            if self.on_created is not None:
                self.on_created(time.monotonic() - t0)
            with self._wake:
                if self._stopped:
                    sb.destroy()
                    return
                self._ready.append(sb)
                self.created += 1
                self._wake.notify_all()

    def stop(self) -> None:
        with self._wake:
            self._stopped = True
            self._wake.notify_all()
        self._kick.put(None)
        if self._thread is not None and self._thread is not threading.current_thread():
            self._thread.join(timeout=30)
        while self._ready:
            self._ready.popleft().destroy()


def pool_key(spec) -> tuple:
    """What makes two specs' sandboxes interchangeable before their files are written."""
    return (str(spec.image), tuple(str(p) for p in spec.layers), tuple(sorted(spec.limits.items())),
            spec.hostname, spec.egress_socket)


def key_name(key: tuple) -> str:
    """A short, stable name of a pool key for health: image file stem, layer count, hostname."""
    stem = os.path.basename(key[0]).split(".")[0][:12]
    return f"{stem}+{len(key[1])}L@{key[3]}"


def _bare(spec):
    """The spec a pool makes sandboxes of: no files (written at the handout)."""
    return dataclasses.replace(spec, files={}) if spec.files else spec


def _destroy_quietly(sb) -> None:
    try:
        sb.destroy()
    except Exception as exc:  # noqa: BLE001 - logged: the caller gets a fresh sandbox anyway
        log.warning("destroying sandbox %s failed: %s", getattr(sb, "id", "?"), exc)


class PooledBackend:
    """Warm pools for a backend that has `create(spec)`, a `_lock` and called `_init_pools()`."""

    _lock: threading.Lock

    def _init_pools(self) -> None:
        self._pools: dict[tuple, WarmPool] = {}
        # id(spec) -> (spec, pool) for the spec object a pool was made with: a handout for it
        # builds no key (allocates nothing the collector tracks, so it never triggers a collection)
        self._pool_of_spec: dict[int, tuple] = {}
        self._scaler: Autoscaler | None = None
        self._scale_lock = threading.Lock()        # the scaler's state and the scaled keys
        self._scaled: dict[tuple, object] = {}     # key -> bare spec, for the pools the scaler runs
        self._targets: dict[tuple, int] = {}
        self._plan_kick = threading.Event()
        self._manager: threading.Thread | None = None
        self.pool_hits = self.pool_misses = 0

    def pool(self, spec, target: int) -> WarmPool:
        """Keep `target` ready sandboxes of `spec` (started in the background); see `acquire`."""
        with self._lock:
            p = self._pools.get(pool_key(spec))
            if p is None:
                p = self._pools[pool_key(spec)] = WarmPool(self, _bare(spec), target).start()
            else:
                p.set_target(target)
            self._pool_of_spec[id(spec)] = (spec, p)
        return p

    def acquire(self, spec, timeout_s: float = 30.0):
        """A ready sandbox from the pool of `spec` if one waits, else a fresh one; never one
        handed out before. Use once, then destroy. Under `autoscale`, an arrival of its key."""
        known = self._pool_of_spec.get(id(spec))
        key = None
        if known is not None and known[0] is spec:
            p = known[1]
        else:
            key = pool_key(spec)
            p = self._pools.get(key)
        scaled = self._scaler is not None and spec.egress_socket is None
        if scaled:
            key = key or pool_key(spec)
            self._arrival(key, spec)
        sb = p.take() if p is not None else None
        if sb is not None and spec.files:
            try:
                sb.write_files({f"/work/{k}": v for k, v in spec.files.items()})
            except Exception as exc:  # noqa: BLE001 - it died while it waited: make a fresh one
                log.warning("warm sandbox %s unusable at the handout (%s): making a fresh one", sb.id, exc)
                _destroy_quietly(sb)
                sb = None
        if sb is not None:
            self._count(scaled, hit=True)
            return sb
        t0 = time.monotonic()
        sb = self.create(spec)
        if scaled or p is not None:
            self._count(scaled, hit=False)
        if scaled:
            with self._scale_lock:
                if self._scaler is not None:
                    self._scaler.created(key, time.monotonic() - t0)
        return sb

    def _count(self, scaled: bool, hit: bool) -> None:
        if scaled:          # slot threads acquire at once: the counters under the scaler's lock
            with self._scale_lock:
                self.pool_hits, self.pool_misses = self.pool_hits + hit, self.pool_misses + (not hit)
        else:
            self.pool_hits, self.pool_misses = self.pool_hits + hit, self.pool_misses + (not hit)

    # -- the autoscaler ---------------------------------------------------------------------
    def autoscale(self, scaler: Autoscaler, capacity: Callable[[], Capacity],
                  cost: Callable[[object], Cost] = lambda spec: Cost()) -> None:
        """Size pools by `scaler` from now on: `capacity()` bounds each plan (the node agent's
        free slots and memory), `cost(spec)` is what one ready sandbox of a spec holds."""
        self._scaler, self._capacity, self._cost = scaler, capacity, cost
        self._manager = threading.Thread(target=self._manage, name="warm-pool-scaler", daemon=True)
        self._manager.start()

    def _arrival(self, key: tuple, spec) -> None:
        with self._scale_lock:
            if self._scaler is None:
                return
            self._scaler.arrival(key, self._cost(spec))
            if key not in self._scaled:
                self._scaled[key] = _bare(spec)
        self._plan_kick.set()

    def _manage(self) -> None:
        while self._scaler is not None:
            self._plan_kick.wait(PLAN_EVERY_S)
            self._plan_kick.clear()
            if self._scaler is None:
                return
            try:
                self.plan_pools()
            except Exception:  # noqa: BLE001 - a planning bug must not end the pools' management
                log.exception("warm pool planning failed")

    def plan_pools(self) -> dict:
        """One planning pass (the manager thread's; tests may call it): pools started, resized,
        stopped to the plan. Returns the plan (key -> target)."""
        try:
            capacity = self._capacity()
        except Exception as exc:  # noqa: BLE001 - a failed figure: hold nothing new this pass
            log.warning("warm pool capacity unknown (%s): no pool this pass", exc)
            capacity = Capacity(sandboxes=0)
        with self._scale_lock:
            scaler = self._scaler
            if scaler is None:
                return {}
            plan = scaler.plan(capacity)
            specs = {k: self._scaled[k] for k in plan if k in self._scaled}
            for k, n in plan.items():
                if n == 0 and not scaler.knows(k):     # idle: forgotten, its pool stops
                    self._scaled.pop(k, None)
            self._targets = {k: n for k, n in plan.items() if k in self._scaled}
        stop = []
        with self._lock:
            for k, n in plan.items():
                p = self._pools.get(k)
                if n == 0 and p is not None and k not in self._scaled:
                    stop.append(self._pools.pop(k))
                elif p is not None:
                    p.set_target(n)
                elif n > 0 and k in specs:
                    self._pools[k] = WarmPool(self, specs[k], n, self._created_cb(k)).start()
        for p in stop:       # outside the lock: their refill threads create under it
            p.stop()
        return plan

    def _created_cb(self, key: tuple) -> Callable[[float], None]:
        def created(seconds: float) -> None:
            with self._scale_lock:
                if self._scaler is not None:
                    self._scaler.created(key, seconds)
        return created

    def pool_stats(self) -> dict:
        """Hits, misses, ready sandboxes and the targets per pool (named by `key_name`)."""
        with self._lock:
            ready = {k: len(p) for k, p in self._pools.items()}
        return {"pool_hits": self.pool_hits, "pool_misses": self.pool_misses, "warm_pool": sum(ready.values()),
                "pool_targets": {key_name(k): n for k, n in self._targets.items()},
                "pool_ready": {key_name(k): n for k, n in ready.items()}}

    def reap_images(self) -> list[str]:
        """What an idle pool calls: a backend with image mounts unmounts unused ones."""
        return []

    def _stop_pools(self) -> None:
        if self._scaler is not None or self.pool_hits:
            log.info("warm pools stopped: %d handouts ready, %d made on the spot",
                     self.pool_hits, self.pool_misses)
        self._scaler = None
        self._plan_kick.set()
        if self._manager is not None and self._manager is not threading.current_thread():
            self._manager.join(timeout=30)
        self._pool_of_spec.clear()
        with self._lock:
            pools, self._pools = list(self._pools.values()), {}
        for p in pools:
            p.stop()
