"""The `paddock` command line: every argparse parser lives here, one module per group of
subcommands, each with `register(subparsers)`; `main.py` assembles them. Each module parses
its subcommands' arguments and calls into the libraries with plain arguments.

May import anything in the project. Imported by nothing in the project except the Slurm agent
job step (slurm/jobsteps.py), which runs `paddock agent` in its own process through
`controller.cli.agent.register`.
"""
