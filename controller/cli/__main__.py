"""`python -m controller.cli`: the same as the `paddock` command."""
import sys

from controller.cli.main import main

sys.exit(main())
