"""The shared vocabularies both sides speak: wire messages and codec, rollout and node state
tables with outcome and reason codes, the task model, checker specs, network policy, tool
schemas, the trajectory schema.

A leaf: no I/O, no sockets, no database. It is the only part of `controller` the node agent
imports. Must not import: zmq, sqlite3, controller.* outside contracts, nodeagent, layers.
"""
