"""The trajectory shard writer: Parquet files per table per attempt, written atomically.

May import: controller.contracts. Must not import: zmq.
"""
