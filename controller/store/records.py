"""What the rollout queue takes and hands back: its config, its typed records and its
refusals.

`Lease` is the one controller-side model of a lease: the queue returns it from `lease_to`,
and `Lease.message()` turns it into the protocol's `lease` (adding what the broker knows:
the task's lease form, the policy, the run) -- no other code re-packs it. `HeldLease` is the
key of a lease a node holds (what `held_leases()` and a cancellation's `revoked` list).

Must not import: sqlite3, zmq, controller.broker, controller.cli, nodeagent.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import NamedTuple, Optional

from controller.contracts.messages import Lease as LeaseMessage
from controller.contracts.messages import PolicyRef

STALE_POLICY_ACTIONS = ("rerun", "drop")
LEASE_TTL_S = 300.0  # the one default: a lease not renewed for this long goes back


@dataclass(frozen=True)
class QueueConfig:
    lease_ttl_s: float = LEASE_TTL_S
    max_attempts: int = 4  # the task's own infrastructure failures before dead letter
    max_node_losses: int = 10  # attempts lost with their node or to infrastructure (is_infra_loss)
    backoff_base_s: float = 1.0
    backoff_max_s: float = 30.0
    max_batch_rollouts: int = 100_000
    max_results_per_watch: int = 1000
    max_staleness: Optional[int] = None  # policy versions a queued rollout may lag; None: any
    stale_policy: str = "rerun"  # rerun (with the newest policy) | drop (cancelled, reported)
    replica_dir: Optional[str] = None  # a second copy of ledger and shards (store/replica.py)
    replica_snapshot_mb: int = 256  # a new base snapshot once a generation's log is this big
    replica_keep_generations: int = 4  # generations kept: the point-in-time restore window

    def __post_init__(self) -> None:
        if self.max_staleness is not None and not (
                isinstance(self.max_staleness, int) and self.max_staleness >= 0):
            raise ValueError(f"queue.max_staleness must be an integer >= 0 or null, "
                             f"got {self.max_staleness!r}")
        if self.stale_policy not in STALE_POLICY_ACTIONS:
            raise ValueError(f"queue.stale_policy must be one of {STALE_POLICY_ACTIONS}, "
                             f"got {self.stale_policy!r}")
        for key in ("lease_ttl_s", "backoff_base_s", "backoff_max_s"):
            if not getattr(self, key) > 0:
                raise ValueError(f"queue.{key} must be > 0, got {getattr(self, key)!r}")
        if self.replica_dir is not None and not (isinstance(self.replica_dir, str)
                                                 and self.replica_dir):
            raise ValueError(f"queue.replica_dir must be a directory path or null, "
                             f"got {self.replica_dir!r}")
        for key in ("max_attempts", "max_node_losses", "max_batch_rollouts",
                    "max_results_per_watch", "replica_snapshot_mb", "replica_keep_generations"):
            if not (isinstance(getattr(self, key), int) and getattr(self, key) >= 1):
                raise ValueError(f"queue.{key} must be an integer >= 1, got {getattr(self, key)!r}")


@dataclass(frozen=True)
class Lease:
    """A lease the queue granted: the rollout, its attempt and fencing token, and the node."""
    rollout_id: str
    attempt: int
    token: int
    task_ref: str
    policy_version: int
    seed: int
    batch_id: str
    node: str = ""

    def message(self, *, task: dict, policy: PolicyRef, lease_ttl_s: float, run_id: str,
                run_dir: str) -> LeaseMessage:
        """The protocol `lease` of this grant (task: the task's lease form; policy: the
        published `policy_version`)."""
        assert policy.version == self.policy_version, (self.rollout_id, policy.version)
        return LeaseMessage(rollout_id=self.rollout_id, attempt=self.attempt, token=self.token,
                            lease_ttl_s=lease_ttl_s, task=task, policy=policy, seed=self.seed,
                            run_id=run_id, run_dir=run_dir, batch_id=self.batch_id)


class HeldLease(NamedTuple):
    """The key of a lease a node holds now."""
    rollout_id: str
    node: str
    attempt: int
    token: int


@dataclass(frozen=True)
class Completion:
    accepted: bool
    reason: Optional[str]  # why rejected (stale_token, unknown_rollout, cancelled) or None
    committed: bool  # the rollout is now committed (pass/fail/timeout)
    duplicate: bool = field(default=False, compare=False)  # the stored reply of a repeat


@dataclass(frozen=True)
class Due:
    """A rollout that may be leased now (input to placement)."""
    rollout_id: str
    task_ref: str
    policy_version: int


@dataclass(frozen=True)
class Cancellation:
    rollouts: int  # how many moved to cancelled
    revoked: tuple[HeldLease, ...]  # the leases that were held


@dataclass(frozen=True)
class Policy:
    version: int
    endpoint: str
    model: str
    published_at: float

    def ref(self) -> PolicyRef:
        """The policy as a lease names it."""
        return PolicyRef(version=self.version, endpoint=self.endpoint, model=self.model)


class PolicyConflict(ValueError):
    """A policy version was published twice with different contents."""


class UnknownBatch(KeyError):
    pass
