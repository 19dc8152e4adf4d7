"""Paddock wire protocol: the one namespace call sites use (`from controller.contracts import
protocol as P`).

It defines nothing; it gathers what lives in its parts:
- errors.py   ProtocolError, RemoteProtocolError, LocalProtocolError, the reason codes
- messages.py the message dataclasses, PolicyRef, BandRequest, new_msg_id
- batching.py the batch messages (`leases`, `result_batch`, `acks`), batched / acks /
              for_agent / split / unbatched, speaks_batches, the hand-built fast frames
- codec.py    encode / decode / encode_frames, MESSAGE_TYPES, PROTOCOL_VERSION,
              MAX_FRAME_BYTES, peek / refusal, agent_version_ok
- states.py   the outcome and reason codes messages carry (Outcome, RejectReason, ...)
Documented in docs/protocol.md.

No I/O. Must not import: zmq, sqlite3, socket, subprocess, Paddock other than controller.contracts.
"""
from __future__ import annotations

from controller.contracts.batching import (
                                           BATCH_AGENT_VERSION,
                                           BATCHES,
                                           MAX_ACKS,
                                           MAX_BATCH_ITEMS,
                                           AckBatch,
                                           LeaseBatch,
                                           ResultBatch,
                                           acks,
                                           batched,
                                           for_agent,
                                           speaks_batches,
                                           split,
                                           unbatched,
)
from controller.contracts.codec import (
                                           MAX_FRAME_BYTES,
                                           MESSAGE_TYPES,
                                           MIN_AGENT_VERSION,
                                           PROTOCOL_VERSION,
                                           PROTOCOL_VERSIONS,
                                           agent_version_ok,
                                           decode,
                                           encode,
                                           encode_frames,
                                           peek,
                                           refusal,
)
from controller.contracts.errors import (
                                           BAD_FIELD,
                                           BAD_JSON,
                                           ERROR_REASONS,
                                           FOREIGN_DEPLOYMENT,
                                           TOO_LARGE,
                                           UNKNOWN_TYPE,
                                           WRONG_VERSION,
                                           LocalProtocolError,
                                           ProtocolError,
                                           RemoteProtocolError,
)
from controller.contracts.messages import (
                                           POLICY_AGENT_VERSION,
                                           Ack,
                                           BandRequest,
                                           Cancel,
                                           Cancelled,
                                           Disconnect,
                                           Drain,
                                           DrainNode,
                                           Heartbeat,
                                           Lease,
                                           Message,
                                           PolicyRef,
                                           PolicyUpdate,
                                           PublishPolicy,
                                           Ready,
                                           Refused,
                                           Register,
                                           Reject,
                                           Release,
                                           Result,
                                           Results,
                                           Shutdown,
                                           Started,
                                           Status,
                                           StatusReply,
                                           Submit,
                                           Submitted,
                                           Watch,
                                           Welcome,
                                           new_msg_id,
                                           speaks_policy_updates,
)
from controller.contracts.states import (
                                           CANCEL_REASONS,
                                           ERROR_CODES,
                                           OUTCOMES,
                                           REJECT_REASONS,
                                           TRAINER_CANCEL_REASONS,
                                           CancelReason,
                                           ErrorCode,
                                           Outcome,
                                           RefusalReason,
                                           RejectReason,
)

__all__ = [
    # errors
    "BAD_FIELD", "BAD_JSON", "ERROR_REASONS", "FOREIGN_DEPLOYMENT", "TOO_LARGE", "UNKNOWN_TYPE",
    "WRONG_VERSION", "LocalProtocolError", "ProtocolError", "RemoteProtocolError",
    # codes
    "ERROR_CODES", "OUTCOMES", "REJECT_REASONS", "ErrorCode", "Outcome", "RefusalReason",
    "RejectReason", "CANCEL_REASONS", "TRAINER_CANCEL_REASONS", "CancelReason",
    # messages
    "Ack", "BandRequest", "Cancel", "Cancelled", "Disconnect", "Drain", "DrainNode", "Heartbeat",
    "Lease", "Message", "POLICY_AGENT_VERSION", "PolicyRef", "PolicyUpdate", "PublishPolicy",
    "Ready", "Refused", "Register", "Reject",
    "Release", "Result", "Results", "Shutdown", "Started", "Status", "StatusReply", "Submit",
    "Submitted", "Watch", "Welcome", "new_msg_id", "speaks_policy_updates",
    # batching
    "BATCH_AGENT_VERSION", "BATCHES", "MAX_ACKS", "MAX_BATCH_ITEMS", "AckBatch", "LeaseBatch",
    "ResultBatch", "acks", "batched", "for_agent", "speaks_batches", "split", "unbatched",
    # codec
    "MAX_FRAME_BYTES", "MESSAGE_TYPES", "MIN_AGENT_VERSION", "PROTOCOL_VERSION",
    "PROTOCOL_VERSIONS", "agent_version_ok", "decode", "encode", "encode_frames", "peek",
    "refusal",
]
