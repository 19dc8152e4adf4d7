"""Grading outside the agent's reach: the fresh grading sandbox (`grade`), the in-sandbox pytest
grader (`grader_plugin`, shipped into the sandbox as a file, never imported there from here),
answer checks and the judge (`checkers`), and the isolated host-side check runner (`checks`
client, `checkserver` server process).

May import: controller.contracts, nodeagent.sandbox, nodeagent.harness.model (the judge's
client). Must not import: zmq, nodeagent.agent, nodeagent.harness.loop.
"""
