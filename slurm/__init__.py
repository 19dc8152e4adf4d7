"""Paddock on Slurm: the job's components and their resources (components.py), the batch-script
renderer (sbatch.py), the job steps `paddock job head|agent|server` (jobsteps.py, servers.py, with
the agent's supervisor supervise.py), the submitit launcher (launch.py), and the in-test cluster
used by the test suite (testcluster.py, with its ops script clusterctl.py). Their command lines are
controller/cli/slurm.py.

May import: controller.*, nodeagent.*, layers. testcluster.py and clusterctl.py import none of
them (but controller.ondisk.fileio).
"""
