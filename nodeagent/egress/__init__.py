"""Egress: the pure policy decision and the node-local proxy that enforces it.

May import: controller.contracts. Must not import: zmq, nodeagent.agent.
"""
