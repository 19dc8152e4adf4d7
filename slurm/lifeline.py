"""A child process that dies with the process that started it: `die_with_parent(sig)` is a
`preexec_fn` for `subprocess.Popen` that sets PR_SET_PDEATHSIG in the child between fork and exec,
and exits the child when its parent is already gone by then (the signal is armed only for a parent
alive at the prctl: a parent SIGKILLed between the fork and the prctl would otherwise leave the
child running for ever as an orphan).

Must not import: zmq, nodeagent.*, controller.*, slurm.jobsteps, slurm.testcluster, slurm.clusterhost.
"""
from __future__ import annotations

import ctypes
import os
import signal
from typing import Callable

PR_SET_PDEATHSIG = 1


def die_with_parent(sig: int = signal.SIGTERM, parent: int | None = None) -> Callable[[], None]:
    """The `preexec_fn` to pass to Popen (call this in the parent: it records the parent's pid,
    or `parent` when given)."""
    parent = os.getpid() if parent is None else parent

    def arm() -> None:  # runs in the child between fork and exec
        ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, sig)
        if os.getppid() != parent:   # the parent died before the prctl: no signal will come
            os._exit(1)
    return arm
