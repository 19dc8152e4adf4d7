"""The analyst's side: DuckDB views over committed trajectories, the canned report, replay and
re-scoring of stored rollouts.

May import: controller.contracts, controller.store (catalog); replay and rescore grade through
nodeagent. Must not import: zmq, controller.broker, controller.cli.
"""
