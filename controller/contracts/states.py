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
from dataclasses import dataclass
from typing import Literal, Optional

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

# ---- infrastructure-failure reasons -------------------------------------------------------

# Why an attempt ended without a verdict, or a rollout without a commit: a code, carried
# beside the human text (`infra_code` beside `infra_reason` on the wire, in the queue's
# `rollouts` and `attempts` rows and in the trajectory's `rollouts` rows). Decisions read the
# code, never the text. The agent's codes: the model server unreachable or failing
# (`model_server`), a sandbox that would not start (`sandbox_start`) or broke under the
# attempt (`sandbox`), the node's store (`store`), the task's content (`task`), its set-up
# (`setup`), grading that cannot reach a verdict (`verifier`), the user simulator
# (`user_sim`), a crash of the agent's own code (`agent_crash`), a `web` task's browser that
# would not start (`browser_start`), a phase past its deadline
# (`deadline_<phase>`; `deadline_total` the end-to-end one, `deadline` one between phases) and
# a cancelled attempt (`cancelled`, never reported). The controller's: a node lost under the
# attempt (`node_lost`), an expired lease (`lease_expired`), a rollout dropped by the
# staleness bound (`stale_policy`), a batch cancelled (`cancelled`). `unknown`: a reason in
# prose (an agent older than the codes) whose kind is none of these.
InfraCode = Literal["model_server", "sandbox_start", "sandbox", "store", "task", "setup", "verifier",
                    "user_sim", "agent_crash", "browser_start", "deadline_create", "deadline_setup",
                    "deadline_agent", "deadline_verify", "deadline_teardown", "deadline_total",
                    "deadline", "node_lost", "lease_expired", "stale_policy", "cancelled", "unknown"]
INFRA_CODES: tuple[InfraCode, ...] = typing.get_args(InfraCode)
(MODEL_SERVER, SANDBOX_START, SANDBOX, STORE, TASK, SETUP, VERIFIER, USER_SIM, AGENT_CRASH,
 BROWSER_START, DEADLINE_CREATE, DEADLINE_SETUP, DEADLINE_AGENT, DEADLINE_VERIFY,
 DEADLINE_TEARDOWN, DEADLINE_TOTAL, DEADLINE, NODE_LOST, LEASE_EXPIRED, STALE_POLICY,
 INFRA_CANCELLED, UNKNOWN_REASON) = INFRA_CODES

# What a failed attempt costs its rollout, by code (the queue's accounting):
# - `loss`: the infrastructure's doing, never the task's -- counted with the attempts lost to
#   a vanished node (`max_node_losses`), not toward the task's `max_attempts`, so an outage
#   does not dead-letter good tasks after a few tries: the model server, a sandbox that would
#   not start or broke, the node's store, a lost node, the node's own phases past their
#   deadlines (making or destroying a sandbox, and the end-to-end deadline);
# - `charged`: toward the task's `max_attempts` (a slow set-up or grading, the task's content,
#   an agent crash, a browser that would not start, a prose reason of unknown kind). An
#   expired lease is charged unless its node went silent: then the queue counts it a loss
#   (`expire_leases(live_nodes)`);
# - `stopped`: not a failure: cancelled work, a rollout dropped by the staleness bound.
InfraClass = Literal["loss", "charged", "stopped"]
LOSS, CHARGED, STOPPED = typing.get_args(InfraClass)
INFRA_CLASS: dict[str, InfraClass] = {
    MODEL_SERVER: LOSS, SANDBOX_START: LOSS, SANDBOX: LOSS, STORE: LOSS, NODE_LOST: LOSS,
    DEADLINE_CREATE: LOSS, DEADLINE_TEARDOWN: LOSS, DEADLINE_TOTAL: LOSS,
    TASK: CHARGED, SETUP: CHARGED, VERIFIER: CHARGED, USER_SIM: CHARGED, AGENT_CRASH: CHARGED,
    BROWSER_START: CHARGED, DEADLINE_SETUP: CHARGED, DEADLINE_AGENT: CHARGED, DEADLINE_VERIFY: CHARGED, DEADLINE: CHARGED,
    LEASE_EXPIRED: CHARGED, UNKNOWN_REASON: CHARGED,
    INFRA_CANCELLED: STOPPED, STALE_POLICY: STOPPED,
}
assert set(INFRA_CLASS) == set(INFRA_CODES), "every infra code needs its class"
# The codes that are the task's own fault: its content or limits, its set-up (or a set-up past
# its deadline), its image or sandbox (a sandbox that would not start), grading that fails
# without the agent too (or past its deadline). A rollout dead-lettered for one of these
# counts against its task in the curriculum (repeated ones quarantine it); every other code
# is the rollout's own making, never held against the task.
TASK_FAULT_CODES = frozenset({TASK, SETUP, SANDBOX_START, VERIFIER, DEADLINE_SETUP,
                              DEADLINE_VERIFY})

# A phase past its deadline (nodeagent/agent/guard.py PHASES; `total (<phase>)` for the
# end-to-end deadline) -> its code.
_DEADLINE_CODES: dict[str, InfraCode] = {
    "create": DEADLINE_CREATE, "setup": DEADLINE_SETUP, "agent": DEADLINE_AGENT,
    "verify": DEADLINE_VERIFY, "teardown": DEADLINE_TEARDOWN, "total": DEADLINE_TOTAL}
# How the human text of a code begins (the code itself unless listed): the text keeps the
# form it had before the codes ("deadline: create: ...", "node_lost: ..."), which analysts'
# queries split on the first colon.
_TEXT_HEADS = {code: f"deadline: {phase}" for phase, code in _DEADLINE_CODES.items()}


@dataclass(frozen=True)
class InfraReason:
    """Why an attempt or a rollout failed without a verdict: its `code` (`InfraCode`, what
    decisions read) and its human `text` (what `infra_reason` carries, for the log and the
    analyst). Make one with `of` (or `deadline`); `parse` is for prose from an older agent."""
    code: InfraCode
    text: str

    def __post_init__(self) -> None:
        if self.code not in INFRA_CLASS:
            raise ValueError(f"infra code {self.code!r} is not one of {', '.join(INFRA_CODES)}")

    @classmethod
    def of(cls, code: InfraCode, detail: object = "") -> "InfraReason":
        """The reason `code` with a human detail: text `"<code>: <detail>"` (the code alone
        without a detail)."""
        head = _TEXT_HEADS.get(code, code)
        detail = str(detail)
        return cls(code, f"{head}: {detail}" if detail else head)

    @classmethod
    def deadline(cls, phase: str, detail: str) -> "InfraReason":
        """A phase past its deadline: `phase` as the guard names it (`create`, ...,
        `total (<phase>)`); text `"deadline: <phase>: <detail>"`."""
        return cls(_DEADLINE_CODES.get(phase.split(" ", 1)[0], DEADLINE),
                   f"deadline: {phase}: {detail}")

    @classmethod
    def parse(cls, text: str) -> "InfraReason":
        """The code of a reason given only as prose ("model_server: connection refused", the
        form before codes): its kind is the text up to the first colon (a deadline's phase the
        part after it). The one place prose is read; a kind that is no code is `unknown`."""
        kind, _, rest = text.partition(":")
        kind = kind.strip()
        if kind == DEADLINE:
            phase = rest.strip().partition(":")[0].strip()
            return cls(_DEADLINE_CODES.get(phase.split(" ", 1)[0], DEADLINE), text)
        return cls(typing.cast(InfraCode, kind) if kind in INFRA_CLASS else UNKNOWN_REASON, text)

    @property
    def infra_class(self) -> InfraClass:
        """What the failure costs its rollout: `loss`, `charged` or `stopped` (INFRA_CLASS)."""
        return INFRA_CLASS[self.code]

    @property
    def is_loss(self) -> bool:
        """The infrastructure's fault (toward `max_node_losses`), not the task's."""
        return INFRA_CLASS[self.code] == LOSS

    @property
    def task_fault(self) -> bool:
        """The task's own fault (TASK_FAULT_CODES): held against it in the curriculum."""
        return self.code in TASK_FAULT_CODES


def as_infra_reason(reason: "InfraReason | str | None") -> Optional[InfraReason]:
    """A reason as its typed form: an InfraReason as it is, prose through `InfraReason.parse`
    (the edge where an older peer's text meets the codes), None as None."""
    if reason is None or isinstance(reason, InfraReason):
        return reason
    return InfraReason.parse(reason)


def is_infra_loss(reason: "InfraReason | str | None") -> bool:
    """Is this reason the infrastructure's fault (a loss, counted toward `max_node_losses`)
    rather than the task's (toward `max_attempts`)? Reads the code (prose is parsed first)."""
    typed = as_infra_reason(reason)
    return typed is not None and typed.is_loss
