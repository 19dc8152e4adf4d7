"""slurm.lifeline: a child started with `die_with_parent` never outlives its starter, even when
the starter dies between the fork and the child's prctl."""
from __future__ import annotations

import signal
import subprocess
import sys

import psutil

from slurm.lifeline import die_with_parent

SLEEPER = [sys.executable, "-c", "import time; time.sleep(120)"]


def test_a_child_whose_recorded_parent_is_not_its_parent_exits_before_exec():
    # what a child sees when its starter died before the prctl: it was re-parented, so its
    # parent is no longer the pid recorded at Popen; it must exit instead of sleeping on
    child = subprocess.Popen(SLEEPER, preexec_fn=die_with_parent(signal.SIGTERM, parent=1))
    assert child.wait(timeout=30) == 1


def test_a_child_of_a_living_parent_runs_its_program():
    child = subprocess.Popen([sys.executable, "-c", "import sys; sys.exit(7)"],
                             preexec_fn=die_with_parent(signal.SIGTERM))
    assert child.wait(timeout=30) == 7


def test_the_armed_signal_reaches_the_child_when_its_parent_dies():
    # a middle process starts a sleeper with the lifeline and exits; the sleeper must be killed
    middle = subprocess.run(
        [sys.executable, "-c",
         "import signal, subprocess, sys; from slurm.lifeline import die_with_parent; "
         f"p = subprocess.Popen({SLEEPER!r}, preexec_fn=die_with_parent(signal.SIGKILL)); print(p.pid)"],
        capture_output=True, text=True, timeout=60, check=True)
    pid = int(middle.stdout.strip())
    try:
        proc = psutil.Process(pid)
    except psutil.NoSuchProcess:
        return
    proc.wait(timeout=30)             # raises TimeoutExpired if the sleeper lives on
    assert not proc.is_running()
