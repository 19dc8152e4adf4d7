"""The `paddock` command line: every argparse parser lives here; each module parses its
subcommands' arguments and calls into the libraries with plain arguments.

May import anything in the project; nothing in the project imports it.
"""
