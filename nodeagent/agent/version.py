"""The node agent's version, which it sends at registration and in every health sample.

The controller refuses agents older than `protocol.MIN_AGENT_VERSION`; from
`protocol.BATCH_AGENT_VERSION` on, an agent takes `leases` and `acks` batches. A leaf: the
daemon, its core and the health sampler all import it, so it imports nothing.

Must not import: anything of Paddock.
"""
from __future__ import annotations

AGENT_VERSION = "0.4.0"  # >= protocol.BATCH_AGENT_VERSION (`leases`, `acks`), POLICY_AGENT_VERSION (`policy`)
