"""Paddock on Slurm: the batch-script renderer, the job steps (`paddock job head|agent`), the
submitit launcher, and the in-test cluster used by the test suite.

May import: controller.*, nodeagent.*, layers.
"""
