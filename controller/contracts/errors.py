"""Protocol errors: whose fault a bad frame is, and why, as stable reason codes.

`RemoteProtocolError` is the peer's fault (a frame that does not decode: log, count, drop,
keep serving); `LocalProtocolError` is ours (a message that cannot be encoded: a bug on this
side). Both are `ProtocolError` with `reason`, one of ERROR_REASONS (the codes counters and
logs use), and `field`, the offending body field for bad_field. Documented in
docs/protocol.md ("Errors").

No I/O. Must not import: anything of Paddock, zmq, sqlite3, socket, subprocess.
"""
from __future__ import annotations

# ProtocolError reasons: stable codes for counters and logs.
BAD_JSON = "bad_json"
WRONG_VERSION = "wrong_version"
FOREIGN_DEPLOYMENT = "foreign_deployment"
UNKNOWN_TYPE = "unknown_type"
BAD_FIELD = "bad_field"
TOO_LARGE = "too_large"
ERROR_REASONS = (BAD_JSON, WRONG_VERSION, FOREIGN_DEPLOYMENT, UNKNOWN_TYPE, BAD_FIELD, TOO_LARGE)


class ProtocolError(Exception):
    """A frame that cannot be turned into a message (or a message into a frame).

    `reason` is one of ERROR_REASONS; `field` names the offending body field for bad_field.
    """

    def __init__(self, reason: str, detail: str = "", field: str | None = None):
        assert reason in ERROR_REASONS, reason
        self.reason = reason
        self.detail = detail
        self.field = field
        super().__init__(f"{reason}: {detail}" if detail else reason)


class RemoteProtocolError(ProtocolError):
    """The peer sent a bad frame: log, count, drop; never crash."""


class LocalProtocolError(ProtocolError):
    """We tried to send a bad message: a bug on this side."""
