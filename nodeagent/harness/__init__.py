"""The built-in agent loop (`loop`: model server <-> tool calls in a sandbox), the model client
(`model`, also the verifier's judge client) and the agent's tools (`tools`; their names and
schemas are `controller.contracts.tools`).

May import: controller.contracts, nodeagent.sandbox, nodeagent.egress. Must not import: zmq,
nodeagent.agent, nodeagent.verifier.
"""
