"""`paddock top` in a real terminal: tmux runs it against a live local farm (a controller and
two node agents over ZeroMQ, as in tests/cli/test_ops.py) and the test reads the screen the way
an operator does: capture-pane of an 80x24 and of a wide terminal, a node going lost, `q`
and Ctrl-C leaving the terminal as it was. Skips when tmux is missing (Debian `tmux`)."""
from __future__ import annotations

import shlex
import shutil
import subprocess
import sys

import pytest

from tests.cli.test_ops import HB_S, LIVENESS, ROOT, Farm, wait_for

FIRST_FRAME_S = 60      # a fresh interpreter importing the CLI on a loaded 2-core machine
pytestmark = pytest.mark.skipif(shutil.which("tmux") is None,
                                reason="tmux is not installed (Debian package tmux)")


class Terminal:
    """One tmux server of our own (its own socket) with one window running one command."""

    def __init__(self, tmp_path, argv: list[str], width: int, height: int):
        self.socket = str(tmp_path / "tmux.sock")
        self.conf = tmp_path / "tmux.conf"       # read when our server starts: no user config
        self.conf.write_text("set -g remain-on-exit on\nset -g status off\n")
        # COLUMNS/LINES from the test process would override the size of the pane
        env = f"env -u COLUMNS -u LINES PYTHONPATH={shlex.quote(str(ROOT))} TERM=xterm-256color"
        # tmux 3.3a does not always record a pane's exit status (#{pane_dead_status} stays
        # empty), so a small shell writes it to a file; its INT trap is a handler, not SIG_IGN,
        # so the command itself still gets Ctrl-C with the default action
        self.status_file = tmp_path / "exit-status"
        script = f"trap : INT; {shlex.join(argv)}; echo $? > {shlex.quote(str(self.status_file))}"
        self.tmux("new-session", "-d", "-x", str(width), "-y", str(height), "-s", "top",
                  f"cd {shlex.quote(str(ROOT))} && {env} sh -c {shlex.quote(script)}")

    def tmux(self, *args: str) -> str:
        return subprocess.run(["tmux", "-f", str(self.conf), "-S", self.socket, *args], check=True, text=True,
                              capture_output=True, timeout=10).stdout

    def screen(self) -> list[str]:
        return self.tmux("capture-pane", "-p", "-t", "top").rstrip("\n").split("\n")

    def text(self) -> str:
        return "\n".join(self.screen())

    def dead(self) -> tuple[bool, str]:
        """(the command has exited, its exit status; 128+N for a signal N)."""
        try:
            status = self.status_file.read_text().strip()
        except FileNotFoundError:
            return False, ""
        return status != "", status

    def close(self) -> None:
        subprocess.run(["tmux", "-S", self.socket, "kill-server"], capture_output=True, timeout=10)


@pytest.fixture
def farm(tmp_path):
    f = Farm(tmp_path / "run1", ("n1", "n2"))
    try:
        wait_for(lambda: f.states() == {"n1": "live", "n2": "live"}, 10, "both agents live")
        yield f
    finally:
        f.stop()


def wait_screen(term: Terminal, cond, timeout_s: float, what: str) -> None:
    """wait_for(cond(screen text)); on a timeout the message shows the screen."""
    try:
        wait_for(lambda: cond(term.text()), timeout_s, what)
    except AssertionError as exc:
        raise AssertionError(f"{exc}; the screen:\n{term.text()}") from None


def top_argv(farm) -> list[str]:
    return [sys.executable, "-m", "controller.cli", "top", "--run", str(farm.run_dir),
            "--interval-s", "0.2"]


@pytest.fixture
def terminal(tmp_path, farm, request):
    width, height = request.param
    term = Terminal(tmp_path, top_argv(farm), width, height)
    try:
        yield term
    finally:
        term.close()


@pytest.mark.parametrize("terminal", [(80, 24)], indirect=True)
def test_top_fits_80x24_shows_every_node_and_marks_a_lost_one(farm, terminal):
    wait_screen(terminal, lambda t: "n2" in t and "SLOTS" in t, FIRST_FRAME_S,
                "the first frame of paddock top")
    screen = terminal.screen()
    assert len(screen) <= 24 and all(len(line) <= 80 for line in screen), screen
    text = terminal.text()
    heading = next(ln for ln in screen if ln.startswith("│ NODE")).split("│")[1:-1]
    assert [h.strip() for h in heading] == ["NODE", "STATE", "SLOTS", "SBX", "MEM", "DISK", "HB",
                                            "R/S", "ERR/M"], text
    assert "SLOTS busy/all  SBX sandboxes  MEM, DISK free  HB heartbeat age" in text
    rows = {ln.split("│")[1].strip(): ln for ln in screen if ln.startswith("│ n")}
    assert set(rows) == {"n1", "n2"} and all("live" in r and "0/2" in r for r in rows.values()), text
    assert "q quit" in text
    farm.silence("n2")
    wait_for(lambda: any(ln.startswith("│ n2") and "LOST" in ln for ln in terminal.screen()),
             HB_S * LIVENESS + 10, "n2 marked LOST on screen")
    assert "lost 1" in terminal.text()


@pytest.mark.parametrize("terminal", [(160, 40)], indirect=True)
def test_a_wide_terminal_gets_the_extra_columns(farm, terminal):
    wait_screen(terminal, lambda t: "VERSION" in t and "n2" in t, FIRST_FRAME_S,
                "a wide frame of paddock top")
    screen = terminal.screen()
    assert all(len(line) <= 160 for line in screen)
    heading = next(ln for ln in screen if ln.startswith("│ NODE")).split("│")[1:-1]
    assert [h.strip() for h in heading] == ["NODE", "STATE", "BUSY/SLOTS", "SANDBOXES",
                                            "MEM FREE", "DISK FREE", "HB AGE", "ROLL/S",
                                            "ERR/MIN", "CPU%", "TMPFS", "POOL", "LEASES", "VERSION"]


@pytest.mark.parametrize("terminal", [(80, 24)], indirect=True)
def test_q_quits_cleanly_and_leaves_the_alternate_screen(farm, terminal):
    wait_screen(terminal, lambda t: "SLOTS" in t, FIRST_FRAME_S, "the first frame")
    terminal.tmux("send-keys", "-t", "top", "q")
    wait_for(lambda: terminal.dead()[0], 10, "paddock top to exit on q")
    assert terminal.dead()[1] == "0"
    assert "SLOTS" not in terminal.text()      # the alternate screen is gone


@pytest.mark.parametrize("terminal", [(80, 24)], indirect=True)
def test_ctrl_c_quits_cleanly(farm, terminal):
    wait_screen(terminal, lambda t: "SLOTS" in t, FIRST_FRAME_S, "the first frame")
    terminal.tmux("send-keys", "-t", "top", "C-c")
    wait_for(lambda: terminal.dead()[0], 10, "paddock top to exit on Ctrl-C")
    assert terminal.dead()[1] == "0"
    assert "Traceback" not in terminal.text() and "SLOTS" not in terminal.text()


def test_the_terminal_reports_the_exit_status_of_its_command(tmp_path):
    term = Terminal(tmp_path, ["sh", "-c", "exit 3"], 80, 24)
    try:
        wait_for(lambda: term.dead()[0], 10, "the command to finish")
        assert term.dead()[1] == "3"
    finally:
        term.close()
