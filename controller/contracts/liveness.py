"""The liveness defaults both ends of the control plane start from (Paranoid Pirate): how often
a peer sends a sign of life, and how many silent intervals make it lost. The controller's
`BrokerConfig` and the node agent's `AgentConfig` take their defaults from here, so one value
holds for both sides unless a run sets its own (`--heartbeat-interval-s`).

Pure data. Must not import: zmq, nodeagent, controller.store, controller.broker, controller.cli.
"""
from __future__ import annotations

HEARTBEAT_INTERVAL_S = 1.0  # seconds between signs of life, both directions
LIVENESS = 5  # silent intervals before a peer is declared lost (the agent: before it reconnects)
