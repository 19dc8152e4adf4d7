"""The guard of one rollout attempt: its phase deadlines, its end-to-end deadline and its
cancel signal, enforced by killing what the attempt holds.

An attempt runs in phases -- `create` (the agent's sandbox), `setup` (the task's set-up layer,
its services), `agent` (the harness), `verify`, `teardown` (sandboxes destroyed, the
trajectory written) -- each under a deadline (`Deadlines`, from the task's budgets or the
defaults here), and the whole attempt under `total_s` when the task sets one. The guard holds
every sandbox the attempt's runtime makes (`runtime()`: a wrapper whose `create`/`acquire`
register the sandbox until its `destroy`) and every model-server connection its gateway
session opens (`model_client()`). When a deadline passes or the attempt's cancel signal is
set (nodeagent/agent/core.py `CancelSignal`: a `reject`, a newer lease, the drain deadline,
a `shutdown`), the guard's watchdog thread -- or the canceller's own thread -- kills them at
once: each sandbox's init gets SIGKILL through its pidfd (every process of the sandbox dies;
a tool call blocked in it returns), each model connection is shut down (a call blocked on it
returns). The attempt's thread then unwinds through its ordinary error paths, destroys what
it made, and asks `stop` what happened: `("cancel", code)` or `("deadline", phase)`.

What a stop means for the rollout is decided by its runner (nodeagent/agent/attempt.py): a
cancelled attempt is never reported nor scored; a deadline in the agent phase is the policy's
(`timeout`, reward 0, stop reason `deadline`); one in any other phase is the infrastructure's
(`infra_error` with reason `deadline: <phase> ...`), never a reward of 0. `reason()` is the
stop as a typed reason (`states.InfraReason`: `deadline_<phase>`, or `cancelled`).

Must not import: zmq, controller other than controller.contracts, nodeagent.agent.daemon,
nodeagent.harness.loop.
"""
from __future__ import annotations

import contextlib
import logging
import math
import signal
import socket
import threading
import time
from dataclasses import dataclass
from typing import Any, Callable, Iterator, Optional

from controller.contracts.states import INFRA_CANCELLED, InfraReason
from controller.contracts.tasks import Budgets
from nodeagent.gateway.upstream import KeepAliveModel

log = logging.getLogger(__name__)

PHASES = ("create", "setup", "agent", "verify", "teardown")
# A phase's deadline when the task's budgets leave it at 0 (seconds).
DEFAULT_PHASE_S = {"create": 300.0, "setup": 1800.0, "verify": 1800.0, "teardown": 120.0}
# The agent phase's own budget is the task's `wall_s`, which the harness enforces itself (the
# policy's `wall_time`); the guard kills the phase only this long after it, a backstop for a
# harness stuck past its budget.
AGENT_GRACE_S = 5.0
CANCEL, DEADLINE = "cancel", "deadline"


@dataclass(frozen=True)
class Deadlines:
    """Seconds per phase (`PHASES`) and for the whole attempt (`total_s`; None: none)."""
    create_s: float = DEFAULT_PHASE_S["create"]
    setup_s: float = DEFAULT_PHASE_S["setup"]
    agent_s: float = Budgets().wall_s + AGENT_GRACE_S
    verify_s: float = DEFAULT_PHASE_S["verify"]
    teardown_s: float = DEFAULT_PHASE_S["teardown"]
    total_s: Optional[float] = None

    @classmethod
    def of(cls, b: Budgets) -> "Deadlines":
        """The task's budgets' deadlines; a key left at 0 takes its default."""
        return cls(create_s=b.create_s or DEFAULT_PHASE_S["create"],
                   setup_s=b.setup_s or DEFAULT_PHASE_S["setup"],
                   agent_s=b.wall_s + AGENT_GRACE_S,
                   verify_s=b.verify_s or DEFAULT_PHASE_S["verify"],
                   teardown_s=b.teardown_s or DEFAULT_PHASE_S["teardown"],
                   total_s=b.total_s or None)

    def of_phase(self, phase: str) -> float:
        assert phase in PHASES, f"unknown attempt phase {phase!r}"
        return float(getattr(self, f"{phase}_s"))


class AttemptGuard:
    """One attempt's deadlines and cancellation. Use `with guard:` around the attempt and
    `with guard.phase(name):` around each phase; `stop` is None until something fired."""

    def __init__(self, deadlines: Deadlines = Deadlines(), cancel: Any = None,
                 clock: Callable[[], float] = time.monotonic, name: str = "attempt") -> None:
        self.deadlines, self.clock, self.name = deadlines, clock, name
        self.stop: Optional[tuple[str, str]] = None      # (CANCEL, code) | (DEADLINE, phase)
        self.phase_name: Optional[str] = None
        self.stopped_at: Optional[float] = None          # clock() when it fired
        self._cv = threading.Condition()
        self._sandboxes: list[Any] = []
        self._models: list["AbortableModel"] = []
        self._due: Optional[tuple[float, str]] = None     # (when, phase to name) of the next deadline
        self._total_due: Optional[float] = None
        self._closed = False
        self._thread: Optional[threading.Thread] = None
        self._cancel = cancel

    # -- lifetime ---------------------------------------------------------------------------
    def __enter__(self) -> "AttemptGuard":
        now = self.clock()
        if self.deadlines.total_s:
            self._total_due = now + self.deadlines.total_s
            self._due = (self._total_due, "total")
        self._thread = threading.Thread(target=self._watch, name=f"guard-{self.name}", daemon=True)
        self._thread.start()
        if self._cancel is not None:   # after the thread: a signal already set fires at once
            self._cancel.on_cancel(lambda reason: self.fire(CANCEL, reason))
        return self

    def __exit__(self, *exc: object) -> None:
        with self._cv:
            self._closed = True
            self._cv.notify_all()

    @contextlib.contextmanager
    def phase(self, name: str) -> Iterator["AttemptGuard"]:
        """Run one phase under its deadline (and the end-to-end one)."""
        due = self.clock() + self.deadlines.of_phase(name)
        with self._cv:
            self.phase_name = name
            nxt = (due, name)
            if self._total_due is not None and self._total_due <= due:
                nxt = (self._total_due, "total")
            self._due = nxt
            self._cv.notify_all()
        try:
            yield self
        finally:
            with self._cv:
                self.phase_name = None
                self._due = (self._total_due, "total") if self._total_due is not None else None
                self._cv.notify_all()

    def _watch(self) -> None:
        with self._cv:
            while not self._closed:
                if self.stop is not None or self._due is None:
                    self._cv.wait()
                    continue
                due, what = self._due
                left = due - self.clock()
                if left > 0:
                    self._cv.wait(min(left, 3600.0))
                    continue
                phase = self.phase_name or "between phases"
                self._fire_locked(DEADLINE, phase if what != "total" else f"total ({phase})")

    # -- stopping ---------------------------------------------------------------------------
    @property
    def stopped(self) -> bool:
        return self.stop is not None

    def fire(self, kind: str, code: str) -> None:
        """Stop the attempt now (idempotent: the first reason stays)."""
        with self._cv:
            self._fire_locked(kind, code)

    def _fire_locked(self, kind: str, code: str) -> None:
        if self.stop is not None:
            return
        self.stop, self.stopped_at = (kind, code), self.clock()
        log.info("%s stopped (%s: %s): killing %d sandboxes, %d model connections", self.name, kind,
                 code, len(self._sandboxes), len(self._models))
        for sb in self._sandboxes:
            _kill(sb)
        for m in self._models:
            m.abort()
        self._cv.notify_all()

    def deadline_phase(self) -> Optional[str]:
        """The phase whose deadline fired (`total (<phase>)` for the end-to-end one), or None."""
        return self.stop[1] if self.stop is not None and self.stop[0] == DEADLINE else None

    def cancelled(self) -> Optional[str]:
        """The cancel code, if the attempt was cancelled."""
        return self.stop[1] if self.stop is not None and self.stop[0] == CANCEL else None

    def reason(self) -> Optional[InfraReason]:
        """Why the attempt was stopped, typed (None if it was not): a cancel is `cancelled`
        (text `cancelled: <cancel code>`); a deadline is its phase's code (`deadline_create`,
        ..., `deadline_total` for the end-to-end one; text `deadline: <phase>: ...`)."""
        if self.stop is None:
            return None
        kind, what = self.stop
        if kind == CANCEL:
            return InfraReason.of(INFRA_CANCELLED, what)
        if what.startswith("total"):
            return InfraReason.deadline(what, f"the attempt ran past its {self.deadlines.total_s:g}s "
                                              "end-to-end deadline")
        if what not in PHASES:      # fired between phases (code `deadline`)
            return InfraReason.deadline(what, "the attempt ran past a deadline between phases")
        return InfraReason.deadline(what, f"the {what} phase ran past its "
                                          f"{self.deadlines.of_phase(what):g}s deadline")

    # -- what the attempt holds -------------------------------------------------------------
    def runtime(self, runtime: Any) -> "GuardedRuntime":
        return GuardedRuntime(runtime, self)

    def hold(self, sb: Any) -> "HeldSandbox":
        """Hold a sandbox until its `destroy`: killed if the attempt stops meanwhile (at once
        if it already has)."""
        with self._cv:
            self._sandboxes.append(sb)
            if self.stop is not None:
                _kill(sb)
        return HeldSandbox(sb, self)

    def _forget(self, sb: Any) -> None:
        with self._cv:  # before its destroy closes the pidfd: a kill never meets a reused fd
            if sb in self._sandboxes:
                self._sandboxes.remove(sb)

    def model_client(self, clock: Callable[[], float] = time.monotonic) -> Callable[[str], "AbortableModel"]:
        """A gateway session's `client` factory whose connections the guard can shut."""
        def make(endpoint: str) -> AbortableModel:
            m = AbortableModel(endpoint, clock)
            with self._cv:
                self._models.append(m)
                if self.stop is not None:
                    m.abort()
            return m
        return make


def _kill(sb: Any) -> None:
    """SIGKILL the sandbox's init (every process of its PID namespace dies with it). A backend
    whose handle has no pidfd but a `kill()` is asked to kill; otherwise its tool calls end at
    their own timeouts and the attempt destroys it when it unwinds."""
    if getattr(sb, "destroyed", False):
        return
    pidfd = getattr(sb, "_pidfd", None)
    try:
        if isinstance(pidfd, int):
            signal.pidfd_send_signal(pidfd, signal.SIGKILL)
        elif callable(getattr(sb, "kill", None)):
            sb.kill()
    except (ProcessLookupError, OSError) as exc:
        log.debug("killing sandbox %s: %s", getattr(sb, "id", "?"), exc)


class HeldSandbox:
    """A sandbox as the attempt sees it: everything its handle does; `destroy` lets go of it
    first (the guard no longer kills it)."""

    def __init__(self, sb: Any, guard: AttemptGuard) -> None:
        self._sb, self._guard = sb, guard

    def __getattr__(self, name: str) -> Any:
        return getattr(self._sb, name)

    def destroy(self) -> None:
        self._guard._forget(self._sb)
        self._sb.destroy()

    def __enter__(self) -> "HeldSandbox":
        return self

    def __exit__(self, *exc: object) -> None:
        self.destroy()


class GuardedRuntime:
    """The node's sandbox runtime as one attempt uses it: every sandbox it makes is held by
    the attempt's guard (`create`, `acquire`); everything else is the runtime's."""

    def __init__(self, runtime: Any, guard: AttemptGuard) -> None:
        self._runtime, self._guard = runtime, guard

    def __getattr__(self, name: str) -> Any:
        return getattr(self._runtime, name)

    def create(self, *a: Any, **k: Any) -> HeldSandbox:
        return self._guard.hold(self._runtime.create(*a, **k))

    def acquire(self, *a: Any, **k: Any) -> HeldSandbox:
        return self._guard.hold(self._runtime.acquire(*a, **k))


class AbortableModel(KeepAliveModel):
    """The gateway's kept connection to a model server, which the guard can shut from another
    thread (`abort`): a call blocked on it fails at once, and no new connection is opened."""

    def __init__(self, endpoint: str, clock: Callable[[], float] = time.monotonic) -> None:
        super().__init__(endpoint, clock)
        self.aborted = False

    def abort(self) -> None:
        self.aborted = True
        _shut(self._sock)

    def _connect(self, timeout_s: float) -> None:
        if self.aborted:
            raise ConnectionAbortedError("the attempt was stopped")
        super()._connect(timeout_s)
        if self.aborted:          # stopped while connecting: abort() saw no socket yet
            _shut(self._sock)


def _shut(sock: Optional[socket.socket]) -> None:
    if sock is not None:
        try:
            sock.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass


def remaining(guard: Optional[AttemptGuard]) -> float:
    """Seconds to the guard's end-to-end deadline (infinite without one)."""
    if guard is None or guard._total_due is None:
        return math.inf
    return guard._total_due - guard.clock()


__all__ = ["AGENT_GRACE_S", "AbortableModel", "AttemptGuard", "CANCEL", "DEADLINE", "DEFAULT_PHASE_S",
           "Deadlines", "GuardedRuntime", "HeldSandbox", "PHASES", "remaining"]
