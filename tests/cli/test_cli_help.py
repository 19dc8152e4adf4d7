"""`paddock ... --help` works for every subcommand, the daemons included (issue 16, item 5).

The subcommands are read from the real parser (`controller.cli.main.build_parser`), walked
recursively, so a command added later is covered without editing this file. Each one's
`--help` runs in-process through `main()` (which, like the installed command, builds only the
chosen command's group); a few run as `python -m controller.cli` subprocesses too.

`paddock controller --help` and `paddock agent --help` print the daemons' own flags: with the
wire and agent engineers' controller/cli/controller.py and controller/cli/agent.py as much as
with the pass-through placeholders they replace.
"""
from __future__ import annotations

import argparse
import subprocess
import sys

import pytest

from controller.cli.main import COMMANDS, build_parser, main


def _subcommands(parser: argparse.ArgumentParser, path: tuple[str, ...] = ()) -> list[tuple[str, ...]]:
    """Every command path below `parser`, parents before children."""
    out: list[tuple[str, ...]] = []
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, sub in action.choices.items():
                out.append(path + (name,))
                out.extend(_subcommands(sub, path + (name,)))
    return out


PATHS = _subcommands(build_parser())
DAEMON_FLAGS = {"controller": ("--deployment", "--run-dir", "--tasks-json", "--endpoint-file"),
                "agent": ("--controller", "--deployment", "--slots", "--image-store")}


def _usage(text: str) -> str:
    """The usage paragraph, on one line."""
    return " ".join(text.split("\n\n")[0].split())


def test_the_walk_finds_every_group_and_the_nested_commands():
    tops = {p[0] for p in PATHS if len(p) == 1}
    assert tops == set(COMMANDS), "COMMANDS in controller/cli/main.py must name exactly the registered commands"
    for nested in (("tasks", "curriculum"), ("sandbox", "run"), ("job", "head"), ("job", "agent"),
                   ("check", "math"), ("image", "build"), ("sbatch", "render"), ("tools", "mcp")):
        assert nested in PATHS


@pytest.mark.parametrize("path", PATHS, ids=" ".join)
def test_help_of_every_subcommand_exits_0_and_names_the_command(path, capsys):
    with pytest.raises(SystemExit) as exc:
        main([*path, "--help"])
    assert exc.value.code == 0
    usage = _usage(capsys.readouterr().out)
    assert usage.startswith("usage: paddock " + " ".join(path)), usage


@pytest.mark.parametrize("daemon", sorted(DAEMON_FLAGS))
def test_the_daemons_help_lists_their_flags(daemon, capsys):
    with pytest.raises(SystemExit) as exc:
        main([daemon, "--help"])
    assert exc.value.code == 0
    out = capsys.readouterr().out
    assert _usage(out).startswith(f"usage: paddock {daemon}")
    for flag in DAEMON_FLAGS[daemon]:
        assert flag in out


def test_paddock_help_lists_every_command(capsys):
    with pytest.raises(SystemExit) as exc:
        main(["--help"])
    assert exc.value.code == 0
    out = capsys.readouterr().out
    for name in COMMANDS:
        assert name in out


@pytest.mark.parametrize("argv", [[], ["controller"], ["agent"], ["tasks", "curriculum"], ["job", "head"]],
                         ids=lambda a: " ".join(a) or "paddock")
def test_help_as_a_command(argv):
    cp = subprocess.run([sys.executable, "-m", "controller.cli", *argv, "--help"],
                        capture_output=True, text=True, timeout=120)
    assert cp.returncode == 0, cp.stderr
    assert _usage(cp.stdout).startswith(" ".join(["usage: paddock", *argv]))
    assert "Traceback" not in cp.stderr


def test_an_unknown_subcommand_exits_2_with_the_usage(capsys):
    with pytest.raises(SystemExit) as exc:
        main(["no-such-command"])
    assert exc.value.code == 2
    assert "usage: paddock" in capsys.readouterr().err
