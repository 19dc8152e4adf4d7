"""The controller daemon: the sans-I/O broker core over the durable queue, the ZeroMQ ROUTER
loop around it, and its Prometheus metrics.

May import: controller.contracts, controller.store, controller.taskbank. Must not import:
nodeagent, controller.cli.
"""
