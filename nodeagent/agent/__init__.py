"""The node agent: its protocol logic as a sans-I/O core (core.py, which the deterministic
simulation drives), the daemon around it (daemon.py: DEALER socket, slot threads, `serve`),
health samples (health.py), the attempt pipeline (attempt.py: sandbox -> harness -> verifier
-> shards) and its version (version.py).

May import: controller.contracts, controller.ondisk, nodeagent.*, layers. Must not import: controller
other than controller.contracts and controller.ondisk (its argparse front is controller/cli/agent.py).
"""
