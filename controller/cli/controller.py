"""`paddock controller ...`: run the controller daemon.

PLACEHOLDER (controller/cli/controller.py belongs to the wire engineer; the lead keeps that
version at merge). It keeps today's pass-through: every word after `controller` goes to
`controller.broker.core.main`, whose own parser (prog "paddock controller") prints the help.

Must not import: nodeagent.
"""
from __future__ import annotations

import argparse

from controller.broker import core


def register(subparsers: argparse._SubParsersAction) -> None:
    # prefix_chars="\0": no word is an option of this parser, so `--help`, `--bind ...` all
    # reach the daemon's parser untouched (REMAINDER alone refuses a leading option)
    p = subparsers.add_parser("controller", help="run the controller daemon", add_help=False, prefix_chars="\0")
    p.add_argument("rest", nargs=argparse.REMAINDER)
    p.set_defaults(func=lambda args: core.main(args.rest))
