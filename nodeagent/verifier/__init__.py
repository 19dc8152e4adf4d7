"""Grading outside the agent's reach: `grade.verify` dispatches to one module per checker kind
(`pytestcheck`, `commandcheck`, `answercheck`, each grading in a fresh sandbox from `freshbox`), the in-sandbox pytest
grader (`grader_plugin`, shipped into the sandbox as a file, never imported there from here),
answer checks and the judge (`checkers`), and the isolated host-side check runner (`checks`
client, `checkserver` server process).

May import: controller.contracts, nodeagent.sandbox, nodeagent.harness.model (the judge's
client). Must not import: zmq, nodeagent.agent, nodeagent.harness.loop.
"""
