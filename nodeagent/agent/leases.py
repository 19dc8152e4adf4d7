"""What a lease becomes on the node: the `Attempt` it asks for (its task decoded once per
distinct task by a `TaskMemo`), the attempt's `CancelSignal`, and how it ended
(`AttemptResult`). The agent core (nodeagent/agent/core.py) makes them and re-exports them.

`TaskMemo` keeps the decoded `LeaseTask` of the last TASKS_KEPT distinct tasks, keyed by the
task's `repr`: for the values a lease's task is made of (JSON's: dicts, lists, strings,
numbers, booleans, null) one text per value, so `1`, `1.0` and `True` differ there as they do
to the decoder's checks (and a repr costs a half to a third of writing the JSON again). A
lease of a task already seen takes the same frozen `LeaseTask`, decoded and checked when it
first came; a malformed task is never kept (each of its leases raises the same TaskError). A
task whose key is over MEMO_MAX_CHARS is decoded every time (the memo's memory stays bounded;
a task that large costs more to run than to decode).

Must not import: zmq, psutil, threading, os, nodeagent.sandbox, nodeagent.harness, nodeagent.verifier,
nodeagent.egress, nodeagent.store (anything that runs an attempt), controller other than controller.contracts.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable, Optional

from controller.contracts import protocol as P
from controller.contracts.states import InfraCode, InfraReason
from controller.contracts.tasks import LeaseTask

TASKS_KEPT = 64  # distinct decoded tasks a memo keeps (the oldest goes first)
MEMO_MAX_CHARS = 64 * 1024  # a task whose key is longer is decoded for every lease, never kept


class CancelSignal:
    """Why an attempt must stop, set once (a states.CancelReason code) by the agent core's
    thread and read by the attempt's. `on_cancel(hook)` calls `hook(reason)` once the signal is
    set (at once if it already is; a hook may be called twice, so it must be idempotent: the
    two threads race without a lock). The hooks run on the setter's thread: keep them short."""

    def __init__(self) -> None:
        self.reason: Optional[str] = None
        self._hooks: list[Callable[[str], None]] = []

    def set(self, reason: str) -> bool:
        """Set the signal; False if it was set already (the first reason stays)."""
        if self.reason is not None:
            return False
        self.reason = reason
        for hook in list(self._hooks):
            hook(reason)
        return True

    def on_cancel(self, hook: Callable[[str], None]) -> None:
        self._hooks.append(hook)
        if self.reason is not None:
            hook(self.reason)

    def __bool__(self) -> bool:
        return self.reason is not None

    def __repr__(self) -> str:
        return f"CancelSignal({self.reason!r})"


@dataclass(frozen=True)
class Attempt:
    """One attempt the node runs: its lease's facts and the task decoded (`from_lease`).
    Code that runs attempts by hand (replay, tests) may build one with the task's dict.
    `cancel`: set by the agent core when the attempt must stop (see CancelSignal)."""
    run_id: str
    run_dir: str
    rollout_id: str
    attempt: int
    token: int
    batch_id: str
    seed: int
    task: LeaseTask
    policy_version: int
    endpoint: str
    model: str
    cancel: CancelSignal = field(default_factory=CancelSignal, compare=False, repr=False)

    @classmethod
    def from_lease(cls, lease: P.Lease, tasks: Optional["TaskMemo"] = None) -> "Attempt":
        """The attempt a lease asks for, its task decoded (by `tasks`, when given: once per
        distinct task). Raises TaskError (naming the field) for a bad task."""
        task = tasks.decode(lease.task) if tasks is not None else LeaseTask.decode(lease.task)
        pol = lease.policy
        # The fields straight into the instance (as the codec builds messages): a frozen
        # dataclass's __init__ sets each through object.__setattr__, a third of this call.
        a = object.__new__(cls)
        a.__dict__.update(run_id=lease.run_id, run_dir=lease.run_dir, rollout_id=lease.rollout_id,
                          attempt=lease.attempt, token=lease.token, batch_id=lease.batch_id,
                          seed=lease.seed, task=task, policy_version=pol.version,
                          endpoint=pol.endpoint, model=pol.model, cancel=CancelSignal())
        return a


@dataclass(frozen=True)
class AttemptResult:
    """How an attempt ended: its outcome, reward and shards and, for an `infra_error`, its
    reason -- `infra_reason` the human text, `infra_code` the code decisions read
    (states.InfraCode). Give the reason typed (`states.InfraReason`: both are taken from it);
    a reason given as text only gets its code from the text (`InfraReason.parse`, the edge
    where the attempt runner's prose meets the codes)."""
    outcome: str
    reward: float | None
    shards: dict
    infra_reason: InfraReason | str | None   # the text once made (an InfraReason is split)
    infra_code: Optional[InfraCode] = None

    def __post_init__(self) -> None:
        reason = self.infra_reason
        if isinstance(reason, InfraReason):
            object.__setattr__(self, "infra_reason", reason.text)
            object.__setattr__(self, "infra_code", reason.code)
        elif isinstance(reason, str) and self.infra_code is None:
            object.__setattr__(self, "infra_code", InfraReason.parse(reason).code)

    @property
    def reason(self) -> Optional[InfraReason]:
        """The typed reason (None without one)."""
        if self.infra_code is None:
            return None
        return InfraReason(self.infra_code, str(self.infra_reason or self.infra_code))


class TaskMemo:
    """`LeaseTask.decode`, once per distinct task (see the module docstring)."""

    def __init__(self, kept: int = TASKS_KEPT, max_chars: int = MEMO_MAX_CHARS):
        self.kept, self.max_chars = kept, max_chars
        self._tasks: dict[str, LeaseTask] = {}
        self.decoded = 0  # tasks decoded (a lease of a kept task decodes none)

    def decode(self, d: Any) -> LeaseTask:
        """The lease's task dict as a LeaseTask. Raises TaskError naming the field."""
        key = repr(d) if type(d) is dict else None  # (anything else: decode says what is wrong)
        task = self._tasks.get(key) if key is not None else None
        if task is not None:
            return task
        self.decoded += 1
        task = LeaseTask.decode(d)  # a TaskError leaves nothing behind
        if key is not None and len(key) <= self.max_chars:
            if len(self._tasks) >= self.kept:
                del self._tasks[next(iter(self._tasks))]
            self._tasks[key] = task
        return task
