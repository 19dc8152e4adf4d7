"""`python -m controller.broker ...`: the controller daemon, as `paddock controller ...`.

Thin: the command line is controller/cli/controller.py's.
"""
import sys

from controller.cli.controller import main

sys.exit(main())
