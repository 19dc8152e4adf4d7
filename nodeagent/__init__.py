"""The node agent: one per compute node. Runs rollouts in sandboxes, grades them, writes
trajectory shards.

May import from the controller only `controller.contracts`.
"""
