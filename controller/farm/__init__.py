"""One run of the farm, assembled: the run directory (keys, the tasks file and its on-disk index,
`run.json`), the controller's and node agents' command lines, their start and their stop
(`assemble.py`). The local run (`controller.demo.localrun`, node agents as processes) and the
Slurm head step (`slurm.jobsteps`, node agents as job steps) both build their run with it.

Must not import: controller.demo, controller.cli, nodeagent, slurm.
"""
