"""The sandbox's seccomp filter: built once with libseccomp, installed by each sandbox's init.

Why libseccomp (through ctypes on `libseccomp.so.2`, which apt itself depends on, so every
Debian has it) rather than hand-written BPF: it resolves syscall names per architecture,
emits the architecture check and the x32 guard (a syscall number with bit 30 set on x86_64),
and orders comparisons correctly; hand-numbered tables are where filters go wrong. The
Python bindings (python3-seccomp) exist only for the system interpreter, not a venv.

`build()` returns the raw BPF program (bytes of `struct sock_filter`), exported once in the
node holder into a memfd that every builder inherits; the native init
(`nodeagent/sandbox/native/sbxinit.c`) reads it and loads it with one `prctl(PR_SET_SECCOMP)`, so no
library call runs in a sandbox. Denied calls fail with EPERM (clone3
with ENOSYS, so the C library falls back to clone, whose namespace flags are checked); the
default is allow. Calls from a foreign architecture kill the process.

Standard library only.
"""
from __future__ import annotations

import ctypes
import errno
import os

# Denied outright (EPERM). The notes' list: mounts (old and new API), namespaces, tracing and
# cross-process memory, keyrings, bpf, perf, io_uring, userfaultfd, handles, kernel modules and
# kexec, and the host-wide knobs a namespaced root must not reach; and the scheduling calls
# that would undo the CPU cap held without a cgroup (the init's CPU slice and SCHED_BATCH,
# nodeagent.sandbox.usercaps: set before the filter is loaded, inherited by every command).
DENIED = (
    "mount", "umount", "umount2", "pivot_root", "chroot", "fsopen", "fsconfig", "fsmount", "fspick",
    "move_mount", "open_tree", "mount_setattr",
    "unshare", "setns",
    "ptrace", "process_vm_readv", "process_vm_writev", "kcmp", "pidfd_getfd",
    "keyctl", "add_key", "request_key",
    "bpf", "perf_event_open", "userfaultfd", "fanotify_init",
    "io_uring_setup", "io_uring_enter", "io_uring_register",
    "open_by_handle_at", "name_to_handle_at",
    "init_module", "finit_module", "delete_module", "kexec_load", "kexec_file_load",
    "reboot", "swapon", "swapoff", "acct", "quotactl", "quotactl_fd", "syslog", "vhangup",
    "settimeofday", "clock_settime", "clock_adjtime", "adjtimex",
    "iopl", "ioperm", "lookup_dcookie", "uselib", "ustat", "sysfs", "_sysctl", "nfsservctl",
    "setdomainname", "sethostname",
    "sched_setaffinity", "sched_setscheduler", "sched_setattr",
)
CLONE_NS_FLAGS = (0x00020000, 0x02000000, 0x04000000, 0x08000000, 0x10000000, 0x20000000,
                  0x40000000, 0x00000080)   # NEWNS CGROUP UTS IPC USER PID NET, NEWTIME
SOCKET_FAMILIES_DENIED = {"AF_KEY": 15, "AF_PACKET": 17, "AF_ALG": 38, "AF_VSOCK": 40}
AF_NETLINK, NETLINK_ROUTE = 16, 0
PERSONALITY_FLAGS_DENIED = (0x0040000, 0x0100000, 0x0200000, 0x0400000)  # no-ASLR, page 0, compat, RIE
IOCTL_DENIED = {"TIOCSTI": 0x5412, "TIOCLINUX": 0x541C}

SCMP_ACT_ALLOW = 0x7FFF0000
SCMP_CMP_EQ, SCMP_CMP_NE, SCMP_CMP_MASKED_EQ = 4, 1, 7


def _errno(e: int) -> int:
    return 0x00050000 | (e & 0xFFFF)


SCMP_FLTATR_CTL_OPTIMIZE = 8      # libseccomp's enum scmp_filter_attr
SCMP_OPTIMIZE_BINARY_TREE = 2


class _ArgCmp(ctypes.Structure):
    _fields_ = [("arg", ctypes.c_uint), ("op", ctypes.c_int),
                ("datum_a", ctypes.c_uint64), ("datum_b", ctypes.c_uint64)]


class SeccompError(Exception):
    """libseccomp is missing or refused the filter."""


def _lib():
    try:
        lib = ctypes.CDLL("libseccomp.so.2", use_errno=True)
    except OSError as exc:
        raise SeccompError(f"libseccomp.so.2 not found ({exc}): apt-get install libseccomp2") from None
    lib.seccomp_init.restype = ctypes.c_void_p
    lib.seccomp_init.argtypes = [ctypes.c_uint32]
    lib.seccomp_release.argtypes = [ctypes.c_void_p]
    lib.seccomp_syscall_resolve_name.argtypes = [ctypes.c_char_p]
    lib.seccomp_rule_add_array.argtypes = [ctypes.c_void_p, ctypes.c_uint32, ctypes.c_int,
                                           ctypes.c_uint, ctypes.POINTER(_ArgCmp)]
    lib.seccomp_export_bpf.argtypes = [ctypes.c_void_p, ctypes.c_int]
    lib.seccomp_attr_set.argtypes = [ctypes.c_void_p, ctypes.c_int, ctypes.c_uint32]
    return lib


def build() -> bytes:
    """The filter as raw BPF instructions (8 bytes each)."""
    lib = _lib()
    ctx = lib.seccomp_init(SCMP_ACT_ALLOW)
    if not ctx:
        raise SeccompError("seccomp_init failed")
    # Dispatch on the syscall number as a binary tree (libseccomp >= 2.5): the same rules in a
    # shorter program, which every sandbox init loads (about 155 -> 70 us here). Older
    # libseccomp refuses the attribute; the linear program it makes is the same filter.
    lib.seccomp_attr_set(ctx, SCMP_FLTATR_CTL_OPTIMIZE, SCMP_OPTIMIZE_BINARY_TREE)
    try:
        def rule(name: str, action: int, *cmps: tuple[int, int, int, int]) -> None:
            nr = lib.seccomp_syscall_resolve_name(name.encode())
            if nr < 0:
                return   # not a syscall on this architecture (e.g. iopl on arm64)
            arr = (_ArgCmp * max(len(cmps), 1))(*[_ArgCmp(*c) for c in cmps])
            rc = lib.seccomp_rule_add_array(ctx, action, nr, len(cmps), arr)
            if rc < 0:
                raise SeccompError(f"seccomp rule for {name} {cmps}: {os.strerror(-rc)}")

        eperm = _errno(errno.EPERM)
        for name in DENIED:
            rule(name, eperm)
        rule("clone3", _errno(errno.ENOSYS))
        for flag in CLONE_NS_FLAGS:
            rule("clone", eperm, (0, SCMP_CMP_MASKED_EQ, flag, flag))
        for fam in SOCKET_FAMILIES_DENIED.values():
            rule("socket", eperm, (0, SCMP_CMP_EQ, fam, 0))
        rule("socket", eperm, (0, SCMP_CMP_EQ, AF_NETLINK, 0), (2, SCMP_CMP_NE, NETLINK_ROUTE, 0))
        for flag in PERSONALITY_FLAGS_DENIED:
            rule("personality", eperm, (0, SCMP_CMP_MASKED_EQ, flag, flag))
        for req in IOCTL_DENIED.values():
            rule("ioctl", eperm, (1, SCMP_CMP_MASKED_EQ, 0xFFFFFFFF, req))
        fd = os.memfd_create("seccomp-bpf")
        try:
            rc = lib.seccomp_export_bpf(ctx, fd)
            if rc < 0:
                raise SeccompError(f"seccomp_export_bpf: {os.strerror(-rc)}")
            return os.pread(fd, 1 << 20, 0)
        finally:
            os.close(fd)
    finally:
        lib.seccomp_release(ctx)
