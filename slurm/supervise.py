"""Supervision of the node agent inside its job step: an agent that exits unexpectedly is
started again, with backoff, within the same step (so the node's capacity comes back for the
rest of the job); after `max_failures` failures within `window_s` the node is given up.

States and their legal transitions (asserted on every change; one table, as STYLE.md asks):

    STARTING  -> RUNNING (spawned)          | BACKOFF (the spawn failed)
    RUNNING   -> STOPPED (exit 0, or exit after a stop was asked)
              -> BACKOFF (any other exit: crash, OOM kill, a signal)
              -> FATAL   (an exit in FATAL_EXITS: bad arguments, no sandbox runtime, a refused
                          agent version do not improve with retries)
              -> STOPPING (the job's drain or end signal)
    BACKOFF   -> STARTING (the delay is over) | FATAL (max_failures within window_s)
              -> STOPPED (a stop was asked while waiting)
    STOPPING  -> STOPPED
    STOPPED, FATAL: terminal

The delay after the k-th failure in the window is min(backoff_base_s * 2**(k-1), backoff_max_s).
A restarted agent registers under the same node name; the controller then releases the leases
the dead agent held (`release_node` on register), so they are leased again: nothing is lost.

FATAL is reported: `on_fatal(report)` (the agent step asks the controller to drain the node, so
nothing is leased to it, and writes `<run_dir>/health/<node>.supervisor.json`), and the step
exits EXIT_NODE_DRAINED. Every transition is logged at INFO as `supervisor STATE -> STATE`.

Must not import: zmq, sqlite3, nodeagent.* (it runs `paddock agent` as a child process).
"""
from __future__ import annotations

import logging
import signal
import subprocess
import time
from collections import deque
from dataclasses import dataclass, field
from typing import Callable

log = logging.getLogger("paddock.supervisor")

STARTING, RUNNING, BACKOFF, STOPPING, STOPPED, FATAL = (
    "STARTING", "RUNNING", "BACKOFF", "STOPPING", "STOPPED", "FATAL")
TRANSITIONS = {
    STARTING: {RUNNING, BACKOFF, STOPPED},
    RUNNING: {STOPPED, BACKOFF, FATAL, STOPPING},
    BACKOFF: {STARTING, FATAL, STOPPED},
    STOPPING: {STOPPED},
    STOPPED: set(),
    FATAL: set(),
}
FATAL_EXITS = {2: "bad arguments, or no sandbox runtime", 3: "the controller refused the agent's version"}
EXIT_NODE_DRAINED = 6


@dataclass
class Policy:
    max_failures: int = 3           # failures within window_s that give the node up
    window_s: float = 300.0
    backoff_base_s: float = 1.0
    backoff_max_s: float = 30.0
    stop_grace_s: float = 90.0      # after SIGTERM (the agent drains), SIGKILL


@dataclass
class Report:
    node: str
    state: str
    restarts: int
    failures: list[dict] = field(default_factory=list)   # {"at": wall time, "exit": code}
    reason: str = ""


class Supervisor:
    """Run `spawn()` (a Popen) until it exits cleanly or a stop is asked; restart it with
    backoff when it exits unexpectedly. `run()` returns the step's exit status."""

    def __init__(self, node: str, spawn: Callable[[], subprocess.Popen], policy: Policy | None = None, *,
                 on_fatal: Callable[[Report], None] = lambda r: None,
                 on_restart: Callable[[Report], None] = lambda r: None,
                 clock: Callable[[], float] = time.monotonic, wall: Callable[[], float] = time.time,
                 sleep: Callable[[float], None] = time.sleep, poll_s: float = 0.1) -> None:
        self.node, self._spawn, self.policy = node, spawn, policy or Policy()
        self._on_fatal, self._on_restart = on_fatal, on_restart
        self._clock, self._wall, self._sleep, self.poll_s = clock, wall, sleep, poll_s
        self.state = STARTING
        self.proc: subprocess.Popen | None = None
        self._failures: deque[float] = deque()
        self.report = Report(node, STARTING, 0)
        self.stop_asked: str | None = None
        self.up_since: float | None = None

    # -- state -------------------------------------------------------------------------------
    def _move(self, new: str, why: str = "") -> None:
        assert new in TRANSITIONS[self.state], f"illegal supervisor transition {self.state} -> {new}"
        log.info("supervisor %s -> %s on %s%s", self.state, new, self.node, f": {why}" if why else "")
        self.state = self.report.state = new

    def request_stop(self, why: str) -> None:
        """The job's drain or end signal (safe in a signal handler: the loop acts on it): the
        agent gets SIGTERM (it drains); no more restarts."""
        self.stop_asked = self.stop_asked or why

    # -- the loop ------------------------------------------------------------------------------
    def run(self) -> int:
        while True:
            if self.state == STARTING:
                if self.stop_asked:
                    self._move(STOPPED, self.stop_asked)
                    return 0
                try:
                    self.proc = self._spawn()
                except OSError as exc:
                    self._failed(f"spawn failed: {exc}", None)
                    continue
                self.up_since = self._clock()
                self._move(RUNNING, f"pid {self.proc.pid}")
            elif self.state in (RUNNING, STOPPING):
                if self.stop_asked and self.state == RUNNING and self.proc.poll() is None:
                    self._move(STOPPING, self.stop_asked)
                    self.proc.send_signal(signal.SIGTERM)
                    self._stop_deadline = self._clock() + self.policy.stop_grace_s
                rc = self.proc.poll()
                if rc is None:
                    if self.state == STOPPING and self._clock() > self._stop_deadline:
                        log.warning("agent on %s did not stop %.0fs after SIGTERM: killing it",
                                    self.node, self.policy.stop_grace_s)
                        self.proc.kill()
                        self.proc.wait()
                        self._move(STOPPED, "killed after the drain grace")
                        return 0
                    self._sleep(self.poll_s)
                    continue
                if self.state == STOPPING or rc == 0:     # drained on the job's signal, or the run is over
                    self._move(STOPPED, f"exit {rc}")
                    return 0
                if rc in FATAL_EXITS:
                    self.report.reason = f"the agent exited {rc} ({FATAL_EXITS[rc]}): not restarted"
                    self._move(FATAL, self.report.reason)
                    self._on_fatal(self.report)
                    return rc
                self._failed(f"exit {rc}", rc)
            elif self.state == BACKOFF:
                if self.stop_asked:
                    self._move(STOPPED, self.stop_asked)
                    return 0
                if self._clock() >= self._backoff_until:
                    self.report.restarts += 1
                    self._move(STARTING, f"restart {self.report.restarts}")
                    self._on_restart(self.report)
                else:
                    self._sleep(min(self.poll_s, self._backoff_until - self._clock()))
            else:   # pragma: no cover - terminal states return above
                raise AssertionError(self.state)
            if self.state == FATAL:
                return EXIT_NODE_DRAINED

    def _failed(self, why: str, rc: int | None) -> None:
        now = self._clock()
        self._failures.append(now)
        while self._failures and self._failures[0] < now - self.policy.window_s:
            self._failures.popleft()
        self.report.failures.append({"at": self._wall(), "exit": rc, "why": why})
        k = len(self._failures)
        if k >= self.policy.max_failures:
            self.report.reason = (f"the agent failed {k} times within {self.policy.window_s:.0f}s "
                                  f"(last: {why}): node given up")
            if self.state == STARTING:       # a spawn that failed: through BACKOFF, as the table says
                self._move(BACKOFF, why)
            self._move(FATAL, self.report.reason)
            self._on_fatal(self.report)
            return
        delay = min(self.policy.backoff_base_s * 2 ** (k - 1), self.policy.backoff_max_s)
        self._backoff_until = now + delay
        self._move(BACKOFF, f"{why}; restart in {delay:.1f}s ({k} of {self.policy.max_failures} "
                            f"failures within {self.policy.window_s:.0f}s)")
