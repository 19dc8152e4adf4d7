"""The node agent daemon: its DEALER loop, slots, drain, health samples, and the attempt
pipeline (sandbox -> harness -> verifier -> shards).

May import: controller.contracts, nodeagent.*, layers.
"""
