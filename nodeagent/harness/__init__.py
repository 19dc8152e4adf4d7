"""The built-in agent loop (model server <-> tool calls in a sandbox) and the agent's tools.

May import: controller.contracts, nodeagent.sandbox, nodeagent.egress. Must not import: zmq,
nodeagent.agent, nodeagent.verifier.
"""
