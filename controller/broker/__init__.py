"""The controller daemon: the sans-I/O broker core over the durable queue (core.py), the
pure placement (placement.py), what it derives from the committed queue -- the catalog,
written after each COMMIT, and the persisted status counters (ledger.py) --, its one config
object (config.py), the ZeroMQ ROUTER loop around it (daemon.py), and its Prometheus
metrics (metrics.py).

May import: controller.contracts, controller.store, controller.taskbank. Must not import:
nodeagent. (Only `__main__.py`, the thin `python -m controller.broker` entry point, imports
controller.cli.controller.)
"""
