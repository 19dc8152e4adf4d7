"""Thin ctypes wrappers over the Linux calls the sandbox needs and Python 3.11 lacks.

unshare, setns, mount, umount2, prctl (the node holder's and the Python builder's; the sandbox
init is native: `nodeagent/sandbox/native/sbxinit.c`).
Every failure raises OSError with errno and the call's arguments in the message.
This module only wraps system calls: no policy, no logging, no imports from Paddock.
"""
from __future__ import annotations

import ctypes
import ctypes.util
import os

_libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)

CLONE_NEWNS = 0x00020000
CLONE_NEWCGROUP = 0x02000000
CLONE_NEWUTS = 0x04000000
CLONE_NEWIPC = 0x08000000
CLONE_NEWUSER = 0x10000000
CLONE_NEWPID = 0x20000000
CLONE_NEWNET = 0x40000000

MS_RDONLY = 1
MS_NOSUID = 2
MS_NODEV = 4
MS_NOEXEC = 8
MS_REMOUNT = 32
MS_BIND = 4096
MS_REC = 16384
MS_PRIVATE = 1 << 18
MS_SLAVE = 1 << 19
MS_SHARED = 1 << 20
MNT_DETACH = 2

PR_SET_PDEATHSIG = 1
PR_SET_DUMPABLE = 4
PR_SET_NO_NEW_PRIVS = 38

# Resolve every function now: processes forked from an importer then use them without building
# ctypes function objects of their own (fewer pages copied into each sandbox process).
for _name in ("unshare", "setns", "mount", "umount2", "syscall", "sethostname", "prctl"):
    getattr(_libc, _name)


def _check(rc: int, what: str) -> int:
    if rc == -1:
        err = ctypes.get_errno()
        raise OSError(err, f"{what}: {os.strerror(err)}")
    return rc


def unshare(flags: int) -> None:
    _check(_libc.unshare(ctypes.c_int(flags)), f"unshare({flags:#x})")


def setns(fd: int, nstype: int = 0) -> None:
    _check(_libc.setns(ctypes.c_int(fd), ctypes.c_int(nstype)), f"setns({fd})")


def mount(source: str, target: str, fstype: str | None, flags: int = 0, data: str | None = None) -> None:
    rc = _libc.mount(source.encode(), target.encode(), fstype.encode() if fstype else None,
                     ctypes.c_ulong(flags), data.encode() if data else None)
    _check(rc, f"mount({source!r}, {target!r}, {fstype!r}, {flags:#x}, {data!r})")


def umount(target: str, flags: int = 0) -> None:
    _check(_libc.umount2(target.encode(), ctypes.c_int(flags)), f"umount2({target!r})")


def prctl(option: int, arg2: int = 0) -> None:
    rc = _libc.prctl(ctypes.c_int(option), ctypes.c_ulong(arg2), ctypes.c_ulong(0),
                     ctypes.c_ulong(0), ctypes.c_ulong(0))
    _check(rc, f"prctl({option})")
