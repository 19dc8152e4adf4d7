"""The run's CURVE key file and the private run directory: the on-disk contract between the
controller (which makes the keys, controller/broker/curve.py) and every peer that loads them
(node agents, trainer clients, `paddock top`).

`RUN/controller.key` is one JSON object, mode 0600, owned by the user of the run (the pattern
of Jupyter's connection files):

    {"format": "paddock-curve-1",
     "server_public": Z85, "server_secret": Z85,    the controller's key pair
     "client_public": Z85, "client_secret": Z85}    the one key pair the controller lets in

(Z85: ZeroMQ's 40-character text form of a 32-byte Curve25519 key.) A peer that holds the file
may connect; the controller answers nobody else. `read_key_file` refuses, with the path and the
fix in the message and before anything starts, a file that is missing, a symlink, not a regular
file, owned by another user, or readable or writable by group or others (`KeyFileError`).
`private_dir` makes the run directory 0700 (hidden tests, rewards and the key are the owner's).

This module reads and writes files only; no sockets, no key generation (that needs libzmq).
Must not import: zmq, anything of Paddock.
"""
from __future__ import annotations

import json
import os
import stat
from dataclasses import asdict, dataclass
from pathlib import Path

KEY_FILE = "controller.key"  # in the run directory
FORMAT = "paddock-curve-1"
KEY_MODE = 0o600
RUN_DIR_MODE = 0o700
Z85_KEY_CHARS = 40


class KeyFileError(Exception):
    """A key file (or private directory) that must not be used; the message names the path
    and the fix."""


@dataclass(frozen=True)
class RunKeys:
    """The run's two CURVE key pairs, Z85 text (what pyzmq's curve options take)."""
    server_public: str
    server_secret: str
    client_public: str
    client_secret: str

    def __post_init__(self) -> None:
        for name, value in asdict(self).items():
            if not isinstance(value, str) or len(value) != Z85_KEY_CHARS:
                raise ValueError(f"{name} must be a {Z85_KEY_CHARS}-character Z85 key")

    def __repr__(self) -> str:  # never print a secret into a log
        return f"RunKeys(server_public={self.server_public!r}, client_public={self.client_public!r})"


def key_file_of(run_dir: str | os.PathLike) -> Path:
    return Path(run_dir) / KEY_FILE


def check_private_file(path: str | os.PathLike) -> os.stat_result:
    """The file's stat if it is a regular file (not a symlink) of this user, mode 0600 or
    stricter; else KeyFileError saying what is wrong and how to fix it."""
    p = Path(path)
    try:
        st = os.lstat(p)
    except FileNotFoundError:
        raise KeyFileError(
            f"no key file at {p}: the controller makes it in the run directory when it "
            f"starts; start the controller first (or pass --key-file PATH / key_file= to the "
            f"run's own controller.key)") from None
    except OSError as exc:
        raise KeyFileError(f"cannot read the key file {p}: {exc.strerror}; it must be "
                           f"readable by you (the run's owner)") from None
    if stat.S_ISLNK(st.st_mode):
        raise KeyFileError(f"key file {p} is a symlink: refusing it (someone else could point "
                           f"it anywhere); use the run directory's real controller.key")
    if not stat.S_ISREG(st.st_mode):
        raise KeyFileError(f"key file {p} is not a regular file")
    if st.st_uid != os.geteuid():
        raise KeyFileError(f"key file {p} is owned by uid {st.st_uid}, not by you (uid "
                           f"{os.geteuid()}): only the run's owner may hold its keys; run as "
                           f"that user, or start a run of your own")
    if st.st_mode & 0o077:
        raise KeyFileError(f"key file {p} has mode {stat.S_IMODE(st.st_mode):04o}: others may "
                           f"read it; fix: chmod 600 {p} (and, as anyone may have copied it, "
                           f"better start a new run: its keys are new)")
    return st


def read_key_file(path: str | os.PathLike) -> RunKeys:
    """The run's keys from `path`, after `check_private_file`. KeyFileError otherwise."""
    check_private_file(path)
    try:
        data = json.loads(Path(path).read_text())
        if data.get("format") != FORMAT:
            raise ValueError(f"format {data.get('format')!r}, expected {FORMAT!r}")
        return RunKeys(data["server_public"], data["server_secret"], data["client_public"],
                       data["client_secret"])
    except (OSError, ValueError, KeyError, TypeError, AttributeError) as exc:
        raise KeyFileError(f"key file {path} is not a Paddock key file ({exc}); remove it and "
                           f"let the controller make a new one at its next start") from None


def write_key_file(path: str | os.PathLike, keys: RunKeys) -> bool:
    """Create `path` (0600, never over an existing file, never through a symlink) holding
    `keys`; False when it already exists (another process made it first: read that one)."""
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
    try:
        fd = os.open(path, flags, KEY_MODE)
    except FileExistsError:
        return False
    try:
        os.fchmod(fd, KEY_MODE)  # whatever the umask
        os.write(fd, json.dumps({"format": FORMAT, **asdict(keys)}, indent=1).encode() + b"\n")
        os.fsync(fd)
    finally:
        os.close(fd)
    return True


def private_dir(path: str | os.PathLike) -> Path:
    """Make `path` (and missing parents) and make it 0700: a run directory holds hidden tests,
    rewards and the key. KeyFileError for a symlink, a non-directory, or another user's."""
    p = Path(path)
    p.mkdir(parents=True, exist_ok=True, mode=RUN_DIR_MODE)
    st = os.lstat(p)
    if stat.S_ISLNK(st.st_mode) or not stat.S_ISDIR(st.st_mode):
        raise KeyFileError(f"run directory {p} is a symlink or not a directory: refusing it; "
                           f"give the real path of a directory of your own")
    if st.st_uid != os.geteuid():
        raise KeyFileError(f"run directory {p} is owned by uid {st.st_uid}, not by you (uid "
                           f"{os.geteuid()}): use a run directory of your own")
    if stat.S_IMODE(st.st_mode) != RUN_DIR_MODE:
        os.chmod(p, RUN_DIR_MODE)
    return p
