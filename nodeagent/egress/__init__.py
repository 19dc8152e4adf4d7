"""Egress: the pure decision (`policy`) and the node-local proxy that enforces it (`proxy`).
What a task's `network` field means is `controller.contracts.network`.

May import: controller.contracts, nodeagent.sandbox (the error type). Must not import: zmq,
nodeagent.agent.
"""
