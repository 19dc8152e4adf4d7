"""Where a sandbox runtime keeps its node state: one directory per user, checked before use.

`default_run_root()` is `$XDG_RUNTIME_DIR/paddock` when that directory can serve (owned by the
user, and reachable by the node holder, which runs as a subordinate uid: every ancestor
searchable by others — systemd's `/run/user/<uid>` is `0700`, so usually it cannot), else
`/tmp/paddock-<uid>`. `ensure_run_root()` makes it `0711` (the holder's ids need to pass through;
nobody else may list it) and refuses, naming the path and the fix, one that is a symlink, not a
directory, owned by someone else, or writable by group or others: a shared fixed path in /tmp
would let one user squat or redirect another's state. The node state dir itself is made inside
it by the runtime (`0711`; its contents live on a tmpfs of the holder's private mount namespace).

Only the standard library and nodeagent.sandbox.spec. Must not import: zmq, controller.*,
nodeagent.agent, nodeagent.harness, nodeagent.verifier.
"""
from __future__ import annotations

import logging
import os
import stat

from nodeagent.sandbox.spec import SandboxError

log = logging.getLogger(__name__)

RUN_ROOT_MODE = 0o711
XDG_SUBDIR = "paddock"
FALLBACK_PARENT = "/tmp"


def _searchable_by_others(path: str) -> bool:
    """Every directory from / to `path` (inclusive) has o+x."""
    cur = os.path.abspath(path)
    while True:
        try:
            if not os.stat(cur).st_mode & 0o001:
                return False
        except OSError:
            return False
        if cur == "/":
            return True
        cur = os.path.dirname(cur)


def xdg_candidate(env: dict | None = None, uid: int | None = None) -> str | None:
    """`$XDG_RUNTIME_DIR/paddock` if `$XDG_RUNTIME_DIR` is set, ours and reachable by the holder."""
    env = os.environ if env is None else env
    uid = os.geteuid() if uid is None else uid
    xdg = env.get("XDG_RUNTIME_DIR")
    if not xdg or not os.path.isabs(xdg):
        return None
    try:
        st = os.lstat(xdg)
    except OSError:
        return None
    if not stat.S_ISDIR(st.st_mode) or st.st_uid != uid:
        return None
    if not _searchable_by_others(xdg):
        log.debug("XDG_RUNTIME_DIR %s is not searchable by the sandbox ids: state goes to %s", xdg,
                  FALLBACK_PARENT)
        return None
    return os.path.join(xdg, XDG_SUBDIR)


def default_run_root(env: dict | None = None, uid: int | None = None) -> str:
    """The per-user run root: `$XDG_RUNTIME_DIR/paddock` when usable, else /tmp/paddock-<uid>."""
    uid = os.geteuid() if uid is None else uid
    return xdg_candidate(env, uid) or os.path.join(FALLBACK_PARENT, f"paddock-{uid}")


def check_owned_dir(path: str, uid: int | None = None, what: str = "state directory") -> None:
    """Refuse `path` unless it is a real directory owned by `uid`, not writable by group or others."""
    uid = os.geteuid() if uid is None else uid
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        raise SandboxError(f"sandbox {what} {path} does not exist") from None
    fix = f"remove it (`rm -rf {path}`) and start again, or choose another run_root"
    if stat.S_ISLNK(st.st_mode):
        raise SandboxError(f"sandbox {what} {path} is a symlink (to {os.readlink(path)!r}); refusing to "
                           f"follow it: {fix}")
    if not stat.S_ISDIR(st.st_mode):
        raise SandboxError(f"sandbox {what} {path} is not a directory: {fix}")
    if st.st_uid != uid:
        raise SandboxError(f"sandbox {what} {path} is owned by uid {st.st_uid}, not by this user "
                           f"(uid {uid}): another user made it; {fix} (as its owner or an admin)")
    if st.st_mode & 0o022:
        raise SandboxError(f"sandbox {what} {path} is writable by group or others (mode "
                           f"{st.st_mode & 0o777:o}): `chmod go-w {path}`, or {fix}")


def ensure_run_root(path: str, uid: int | None = None) -> str:
    """Make the run root (`0711`) if it is missing, then check it (`check_owned_dir`)."""
    uid = os.geteuid() if uid is None else uid
    try:
        os.mkdir(path, RUN_ROOT_MODE)
        os.chmod(path, RUN_ROOT_MODE)   # the umask may have taken o+x
    except FileExistsError:
        pass
    except FileNotFoundError:
        raise SandboxError(f"sandbox run root {path}: its parent {os.path.dirname(path)} does not "
                           f"exist; create it or choose another run_root") from None
    except PermissionError as exc:
        raise SandboxError(f"sandbox run root {path} cannot be created ({exc.strerror}): choose a "
                           f"run_root in a directory this user may write") from None
    check_owned_dir(path, uid, "run root")
    return path
