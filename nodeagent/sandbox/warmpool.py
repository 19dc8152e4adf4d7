"""Warm pool: per sandbox spec (image + limits), a target number of ready sandboxes.

`WarmPool.take()` hands out a ready sandbox at most once (a deque pop: microseconds), or None
when the pool is empty. It takes no lock the refill thread holds and allocates nothing the
collector tracks: it wakes the refill thread through a `queue.SimpleQueue` (C, lock-free for
the caller), not a `Condition`. A background thread refills it to `target`, backing off
exponentially when creation fails (the failure is logged and counted, never raised into the
caller). A
handed-out sandbox belongs to the caller, who destroys it after use; sandboxes are never
returned to the pool. `stop()` destroys what is still waiting.

`PooledBackend` gives a backend `pool(spec, target)` and `acquire(spec)` over its own `create`:
one pool per spec shape (image, limits, hostname, egress), and a handout for the very spec object
a pool was made with that builds no key. Both backends mix it in.

Imports only the standard library; the runtime is passed in.
"""
from __future__ import annotations

import collections
import logging
import queue
import threading

log = logging.getLogger(__name__)

MAX_BACKOFF_S = 5.0
IDLE_WAKE_S = 1.0   # how often an idle pool lets the runtime unmount unused images


class WarmPool:
    def __init__(self, runtime, spec, target: int):
        if target < 0:
            raise ValueError(f"warm pool target must be >= 0, not {target}")
        self.runtime, self.spec, self.target = runtime, spec, target
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
            if len(self._ready) >= self.target:
                try:
                    self._kick.get(timeout=IDLE_WAKE_S)
                except queue.Empty:
                    self.runtime.reap_images()   # idle: let unused images go
                continue
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
    return (str(spec.image), tuple(str(p) for p in spec.layers), tuple(sorted(spec.limits.items())),
            spec.hostname, spec.egress_socket)


class PooledBackend:
    """Warm pools for a backend that has `create(spec)`, a `_lock` and called `_init_pools()`."""

    _lock: threading.Lock

    def _init_pools(self) -> None:
        self._pools: dict[tuple, WarmPool] = {}
        # id(spec) -> (spec, pool) for the spec object a pool was made with: a handout for it
        # builds no key (allocates nothing the collector tracks, so it never triggers a collection)
        self._pool_of_spec: dict[int, tuple] = {}

    def pool(self, spec, target: int) -> WarmPool:
        """Keep `target` ready sandboxes of `spec` (started in the background); see `acquire`."""
        with self._lock:
            p = self._pools.get(pool_key(spec))
            if p is None:
                p = self._pools[pool_key(spec)] = WarmPool(self, spec, target).start()
            else:
                p.set_target(target)
            self._pool_of_spec[id(spec)] = (spec, p)
        return p

    def acquire(self, spec, timeout_s: float = 30.0):
        """A ready sandbox from the pool of `spec` if one exists, else a fresh one. Use once."""
        known = self._pool_of_spec.get(id(spec))
        p = known[1] if known is not None and known[0] is spec else self._pools.get(pool_key(spec))
        if p is not None:
            sb = p.take()
            if sb is not None:
                if spec.files:
                    sb.write_files({f"/work/{k}": v for k, v in spec.files.items()})
                return sb
        return self.create(spec)

    def reap_images(self) -> list[str]:
        """What an idle pool calls: a backend with image mounts unmounts unused ones."""
        return []

    def _stop_pools(self) -> None:
        self._pool_of_spec.clear()
        for p in list(self._pools.values()):
            p.stop()
        self._pools.clear()
