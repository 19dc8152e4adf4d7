"""`paddock agent ...`: run a node agent.

PLACEHOLDER (controller/cli/agent.py belongs to the agent engineer; the lead keeps that version
at merge). It keeps today's pass-through: every word after `agent` goes to
`nodeagent.agent.daemon.main`, whose own parser (prog "paddock agent") prints the help.
"""
from __future__ import annotations

import argparse

from nodeagent.agent import daemon


def register(subparsers: argparse._SubParsersAction) -> None:
    # prefix_chars="\0": no word is an option of this parser, so `--help`, `--node ...` all
    # reach the daemon's parser untouched (REMAINDER alone refuses a leading option)
    p = subparsers.add_parser("agent", help="run a node agent", add_help=False, prefix_chars="\0")
    p.add_argument("rest", nargs=argparse.REMAINDER)
    p.set_defaults(func=lambda args: daemon.main(args.rest))
