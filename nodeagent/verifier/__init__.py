"""Grading outside the agent's reach: the fresh grading sandbox, checkers, and the isolated
host-side check runner.

May import: controller.contracts, nodeagent.sandbox. Must not import: zmq, nodeagent.agent.
"""
