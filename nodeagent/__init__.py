"""The node agent: one per compute node. Runs rollouts in sandboxes, grades them, writes
trajectory shards.

May import from the controller only `controller.contracts` (the vocabulary) and `controller.ondisk`
(the shared on-disk formats). Must not import: controller other than contracts and ondisk.
"""
