"""The controller's durable state: the rollout queue (SQLite: leases, fencing tokens, retries,
dead letter, idempotency keys) and the catalog of committed trajectory rows.

Must not import: zmq, controller.broker, controller.cli, nodeagent.
"""
