"""`paddock`: the one command-line entry point. Builds the parser from each CLI module's
`register(subparsers)` and calls the chosen subcommand's `func(args)`.

  paddock run | sandbox run                            local farm run, one sandboxed command   (run.py)
  paddock tasks import|list|show|validate|...          the task bank                           (tasks.py)
  paddock query | compact | report | replay | rescore  the analyst's commands                  (analysis.py)
  paddock check | verify                               the verifier                            (verify.py)
  paddock image build|inspect                          images (squashfs in SIF)                (image.py)
  paddock egress check / tools list|mcp                egress decisions, the agent's tools     (egress.py, tools.py)
  paddock top | agents | health | drain                ops view of a running farm              (ops.py)
  paddock sbatch render | launch | job head|agent      Slurm                                   (slurm.py)
  paddock controller / paddock agent                   the daemons                             (controller.py, agent.py)

`COMMANDS` maps each command to the module that registers it. `paddock <command> ...` imports
only that module, so a daemon or a quick command does not load every library (DuckDB, the
sandbox runtime, datasketch/scipy); `paddock --help` and `build_parser()` load them all
(tests/cli/test_cli_help.py checks that `COMMANDS` and the modules' commands agree).

An unknown option prints the usage of the subcommand it was given to (`paddock tasks list
--x` prints `usage: paddock tasks list ...`) and exits 2, as every usage error does.

Thin: no logic of its own. Nothing in the project imports this module.
"""
from __future__ import annotations

import argparse
import importlib
import sys

COMMANDS = {
    "run": "run", "sandbox": "run",
    "tasks": "tasks",
    "query": "analysis", "compact": "analysis", "report": "analysis", "replay": "analysis",
    "rescore": "analysis",
    "check": "verify", "verify": "verify",
    "image": "image", "egress": "egress", "tools": "tools",
    "top": "ops", "agents": "ops", "health": "ops", "drain": "ops",
    "sbatch": "slurm", "launch": "slurm", "job": "slurm",
    "controller": "controller", "agent": "agent",
    "export": "export",
    "store": "store",
}
GROUPS = tuple(dict.fromkeys(COMMANDS.values()))   # in the order of `paddock --help`


def build_parser(groups: tuple[str, ...] = GROUPS) -> argparse.ArgumentParser:
    """The `paddock` parser with the commands of `groups` (default: every command)."""
    ap = argparse.ArgumentParser(prog="paddock", description="RL environment farm for Slurm clusters.")
    sub = ap.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for group in groups:
        # imported here, not at the top: `main` imports only the chosen command's module
        importlib.import_module(f"controller.cli.{group}").register(sub)
    return ap


def chosen_parser(ap: argparse.ArgumentParser, argv: list[str]) -> argparse.ArgumentParser:
    """The innermost (sub)parser `argv` names: `paddock tasks list --x` -> the `tasks list` parser."""
    parser = ap
    for token in argv:
        subs = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
        if not subs:
            break
        if token in subs[0].choices:
            parser = subs[0].choices[token]
    return parser


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    group = COMMANDS.get(argv[0]) if argv else None
    ap = build_parser((group,) if group else GROUPS)
    args, extra = ap.parse_known_args(argv)
    if extra:       # the subcommand's own usage, not the top level's (exit 2)
        chosen_parser(ap, argv).error(f"unrecognized arguments: {' '.join(extra)}")
    return int(args.func(args) or 0)


if __name__ == "__main__":
    sys.exit(main())
