"""The state tables and the codes both sides speak: rollout states and their legal
transitions, node states, rollout outcomes, and the reason codes of rejections, refusals and
infrastructure failures.

A state machine is a table here, asserted on every change by its owner (the queue for
rollouts, the broker for nodes): an illegal change is an `AssertionError` naming both states
and the id (a programmer error). Each code list is a `Literal` type (the protocol's message
schemas use it for validation) and the tuple of its values; the named constants are those
values. Documented in docs/protocol.md ("Rollout states", "Node states").

No I/O. Must not import: anything of Paddock, zmq, sqlite3, socket, subprocess.
"""
from __future__ import annotations

import typing
from typing import Literal

# ---- rollout states ----------------------------------------------------------------------

QUEUED = "queued"
LEASED = "leased"
RUNNING = "running"
VERIFYING = "verifying"
COMMITTED = "committed"
RETRY_WAIT = "retry_wait"
DEAD_LETTER = "dead_letter"
CANCELLED = "cancelled"

# The rollout state table: state -> states it may move to. Nothing else is legal.
TRANSITIONS: dict[str, frozenset[str]] = {
    QUEUED: frozenset({LEASED, CANCELLED}),
    LEASED: frozenset({QUEUED, RUNNING, VERIFYING, COMMITTED, RETRY_WAIT, DEAD_LETTER,
                       CANCELLED}),
    RUNNING: frozenset({QUEUED, VERIFYING, COMMITTED, RETRY_WAIT, DEAD_LETTER, CANCELLED}),
    VERIFYING: frozenset({QUEUED, COMMITTED, RETRY_WAIT, DEAD_LETTER, CANCELLED}),
    RETRY_WAIT: frozenset({LEASED, CANCELLED}),
    COMMITTED: frozenset(),
    DEAD_LETTER: frozenset(),
    CANCELLED: frozenset(),
}
STATES: tuple[str, ...] = tuple(TRANSITIONS)
HELD = (LEASED, RUNNING, VERIFYING)  # a node holds a lease on the rollout
LEASABLE = (QUEUED, RETRY_WAIT)
TERMINAL = (COMMITTED, DEAD_LETTER, CANCELLED)
UNFINISHED = tuple(s for s in STATES if s not in TERMINAL)

_LEASE_IS_LEGAL = all(LEASED in TRANSITIONS[s] for s in LEASABLE)
assert _LEASE_IS_LEGAL, "every leasable state must be allowed to become leased"
_COMMIT_IS_LEGAL = all(COMMITTED in TRANSITIONS[s] for s in HELD)
assert _COMMIT_IS_LEGAL, "every held state must be allowed to become committed"


def check_transition(rollout_id: str, old: str, new: str) -> None:
    assert new in TRANSITIONS[old], (
        f"illegal rollout transition {old} -> {new} for rollout {rollout_id}")


# ---- node states (the broker's view of a node agent) -------------------------------------

LIVE, DRAINING, LOST = "live", "draining", "lost"
# A lost node stays lost: if it comes back it registers again, as a new live node.
NODE_TRANSITIONS: dict[str, frozenset[str]] = {
    LIVE: frozenset({DRAINING, LOST}),
    DRAINING: frozenset({LIVE, LOST}),
    LOST: frozenset(),
}
NODE_STATES: tuple[str, ...] = tuple(NODE_TRANSITIONS)


def check_node_transition(node: str, old: str, new: str) -> None:
    assert new == old or new in NODE_TRANSITIONS[old], (
        f"illegal node transition {old} -> {new} for node {node}")


# ---- outcomes ----------------------------------------------------------------------------

Outcome = Literal["pass", "fail", "timeout", "infra_error", "judge_failed"]
OUTCOMES: tuple[str, ...] = typing.get_args(Outcome)
PASS, FAIL, TIMEOUT, INFRA_ERROR, JUDGE_FAILED = OUTCOMES
POLICY_OUTCOMES = (PASS, FAIL, TIMEOUT)  # the policy's doing: committed, scored
# INFRA_ERROR is never the policy's fault: retried, then dead-lettered, never scored.
# JUDGE_FAILED: the rollout's primary check passed but its LLM judge failed after its retries
# (nodeagent/verifier/judge.py): committed with reward NULL, never scored, never trained on.
UNSCORED_OUTCOMES = (JUDGE_FAILED,)
COMMITTED_OUTCOMES = POLICY_OUTCOMES + UNSCORED_OUTCOMES

# How an attempt that did not commit ended (the queue's attempts table), besides OUTCOMES.
RELEASED, REVOKED, ATTEMPT_CANCELLED = "released", "revoked", "cancelled"

# ---- reason codes ------------------------------------------------------------------------

# Why the controller refused an agent's result, started or release (`reject`).
RejectReason = Literal["stale_token", "unknown_rollout", "cancelled", "draining", "bad_request"]
REJECT_REASONS: tuple[str, ...] = typing.get_args(RejectReason)
STALE_TOKEN, UNKNOWN_ROLLOUT, REJECT_CANCELLED, REJECT_DRAINING, REJECT_BAD_REQUEST = \
    REJECT_REASONS

# Why a rollout's work was stopped before it finished (`cancel`, `cancelled`; the node agent's
# log and health): a code, never prose. The first three a trainer may give in its `cancel`;
# a node agent also stops an attempt for the last three. Cancelled work is never scored.
CancelReason = Literal["cancelled_by_trainer", "deadline", "shutdown", "lease_revoked", "drain",
                       "superseded"]
CANCEL_REASONS: tuple[str, ...] = typing.get_args(CancelReason)
(CANCELLED_BY_TRAINER, CANCEL_DEADLINE, CANCEL_SHUTDOWN, LEASE_REVOKED, CANCEL_DRAIN,
 CANCEL_SUPERSEDED) = CANCEL_REASONS
TRAINER_CANCEL_REASONS = (CANCELLED_BY_TRAINER, CANCEL_DEADLINE, CANCEL_SHUTDOWN)


def cancel_reason_of_reject(reject: str) -> str:
    """The cancel code a node agent records when the controller rejects the attempt it runs:
    its batch was cancelled (by the trainer), or the lease is no longer its own (a stale token,
    an unknown rollout: the lease was revoked, fenced by a newer one)."""
    return CANCELLED_BY_TRAINER if reject == REJECT_CANCELLED else LEASE_REVOKED


# Why the controller refused a client request (`ack` code); the client raises one type per code.
ErrorCode = Literal["unknown_task", "unknown_policy", "unknown_batch", "unknown_node",
                    "policy_conflict", "bad_request", "unexpected"]
ERROR_CODES: tuple[str, ...] = typing.get_args(ErrorCode)
(UNKNOWN_TASK, UNKNOWN_POLICY, UNKNOWN_BATCH, UNKNOWN_NODE, POLICY_CONFLICT, BAD_REQUEST,
 UNEXPECTED) = ERROR_CODES

# Why the controller refused an agent's `register` (`refused`).
RefusalReason = Literal["protocol_version", "agent_version"]
REFUSAL_REASONS: tuple[str, ...] = typing.get_args(RefusalReason)
REFUSED_PROTOCOL_VERSION, REFUSED_AGENT_VERSION = REFUSAL_REASONS

# Infrastructure-failure reasons the controller itself records (an agent's infra_error
# carries its own, free-form `infra_reason`).
LEASE_EXPIRED = "lease_expired"
STALE_POLICY = "stale_policy"
NODE_LOST = "node_lost"  # recorded as "node_lost: <why>"

# An agent's `infra_reason` starts with its kind ("model_server: connection refused"). These
# kinds are the infrastructure's doing, never the task's -- the model server unreachable or
# failing, a sandbox that would not start or broke under the attempt, the node's store -- so
# they count with the attempts lost to a vanished node (`max_node_losses`), not toward the
# task's `max_attempts`: an outage does not dead-letter good tasks after a few tries. Every
# other kind (`task`, `setup`, `verifier`, `agent_crash`, ...) is charged to the task.
INFRA_LOSS_KINDS: tuple[str, ...] = ("model_server", "sandbox_start", "sandbox", "store")


# An attempt phase past its deadline is `infra_error` with reason "deadline: <phase>: ..."
# (nodeagent/agent/guard.py). The node's phases (making or destroying a sandbox) and the
# end-to-end deadline are losses; a slow set-up or grading is the task's.
DEADLINE = "deadline"
DEADLINE_LOSS_PHASES = ("create", "teardown", "total")


def is_infra_loss(infra_reason: str | None) -> bool:
    """Is this agent-reported `infra_reason` the infrastructure's fault (a loss, counted
    toward `max_node_losses`) rather than the task's (toward `max_attempts`)?"""
    kind, _, rest = (infra_reason or "").partition(":")
    kind = kind.strip()
    if kind == DEADLINE:
        return rest.strip().startswith(DEADLINE_LOSS_PHASES)
    return kind in INFRA_LOSS_KINDS or kind == NODE_LOST
