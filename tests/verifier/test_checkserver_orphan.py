"""A check server that dies between forking a spare and the spare's PR_SET_PDEATHSIG leaves no
orphan (nodeagent/verifier/checkserver.py `fork_spare`): the spare sees that its parent is no
longer the server and exits, instead of waiting for a request for ever (and running it).
The interleaving is forced: the spare's prctl first waits until the server process has exited."""
from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import textwrap

from tests.conftest import wait_for

# A server process that forks one spare and exits at once; the spare's prctl waits for that.
SERVER_DIES_FIRST = textwrap.dedent("""
    import ctypes, os, select, socket, sys
    import nodeagent.verifier.checkserver as cs
    server = os.getpid()
    real = ctypes.CDLL(None, use_errno=True)

    class ServerGoneFirst:
        def prctl(self, *args):
            try:
                fd = os.pidfd_open(server)
            except ProcessLookupError:
                pass
            else:
                select.select([fd], [], [])     # readable once the server has exited
            return real.prctl(*args)

    cs._LIBC = ServerGoneFirst()
    srv = cs._Server(socket.socket(fileno=int(sys.argv[1])), spares=1)
    srv.fork_spare()
    print(next(iter(srv.spares.values())).pid, flush=True)
    os._exit(0)
""")


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rpartition(")")[2].split()[0] not in ("Z", "X")
    except FileNotFoundError:
        return False


def test_a_spare_whose_server_died_before_its_pdeathsig_exits_by_itself():
    ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    server = subprocess.Popen([sys.executable, "-c", SERVER_DIES_FIRST, str(theirs.fileno())],
                              pass_fds=[theirs.fileno()], stdout=subprocess.PIPE, text=True)
    theirs.close()
    spare = 0
    try:
        spare = int(server.stdout.readline())
        assert server.wait(timeout=60) == 0
        # `ours` holds the spare's request pipe (handed over the control socket), as a client
        # would: without the check the spare waits on it for ever, its PDEATHSIG never comes
        wait_for(lambda: not _alive(spare), 30, f"the orphaned spare {spare} to exit")
    finally:
        if spare and _alive(spare):
            os.kill(spare, signal.SIGKILL)
        ours.close()
