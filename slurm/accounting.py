"""Job accounting of the in-test Slurm cluster (slurm/testcluster.py): a private MariaDB (datadir and
socket under ``<workdir>/dbd``, TCP on 127.0.0.1) and slurmdbd on 127.0.0.1, so ``sacct`` works
and submitit sees jobs that died.

slurmdbd runs as the cluster's SlurmUser (the ``slurm`` user, as slurmctld: slurmdbd accepts
slurmctld's messages only from that uid); its config is ``slurmdbd.conf`` next to slurm.conf,
owned by that user, mode ``0600`` (it holds the database password). MariaDB itself runs as root
(``--user=root``): it is the cluster's database, not part of any job.

The daemons are started through the owner's ``spawn`` and waited on with its ``wait`` (so they
are the owner's children, stopped by PID like the others); host commands run through ``run``,
which raises on failure with argv, exit code and stderr.

Must not import: zmq, nodeagent.*, controller.*, slurm.testcluster (which imports this module).
"""
from __future__ import annotations

import os
import pwd
import secrets
import shutil
import socket
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

ACCOUNTING_COMMANDS = ("mariadb-install-db", "mariadbd", "mariadb", "slurmdbd", "sacct")
DATABASE = "slurm_acct_db"
INSTALL_DB_TIMEOUT_S = 120


def missing_accounting() -> list[str]:
    """Why the cluster cannot have job accounting here ([] if it can)."""
    absent = [c for c in ACCOUNTING_COMMANDS if shutil.which(c) is None]
    return ["not on PATH: " + ", ".join(absent)] if absent else []


def tcp_listening(addr: str, port: int) -> bool:
    """Something accepts TCP connections on addr:port."""
    try:
        socket.create_connection((addr, port), timeout=0.2).close()
        return True
    except OSError:
        return False


def render_slurmdbd_conf(*, munge_socket: Path, dbd_port: int, db_port: int, slurm_user: str,
                         log_dir: Path, run_dir: Path, password: str) -> str:
    """The slurmdbd.conf text (pure)."""
    return "\n".join([
        "AuthType=auth/munge", f"AuthInfo=socket={munge_socket}", "DbdHost=localhost",
        "DbdAddr=127.0.0.1", f"DbdPort={dbd_port}", f"SlurmUser={slurm_user}",
        f"LogFile={log_dir / 'slurmdbd.log'}", f"PidFile={run_dir / 'slurmdbd.pid'}",
        "StorageType=accounting_storage/mysql", "StorageHost=127.0.0.1", f"StoragePort={db_port}",
        f"StorageLoc={DATABASE}", "StorageUser=slurm", f"StoragePass={password}",
    ]) + "\n"


def mariadbd_argv(dbd_dir: Path, log_dir: Path, db_port: int) -> list[str]:
    return ["mariadbd", "--no-defaults", "--user=root", f"--datadir={dbd_dir / 'db'}",
            f"--socket={dbd_dir / 'run' / 'mysqld.sock'}", f"--pid-file={dbd_dir / 'run' / 'mariadb.pid'}",
            "--bind-address=127.0.0.1", f"--port={db_port}", "--skip-name-resolve",
            f"--log-error={log_dir / 'mariadb.err'}",
            "--innodb-log-file-size=8M", "--innodb-buffer-pool-size=16M"]


@dataclass(frozen=True)
class Owner:
    """What the cluster's owner lends the accounting daemons: its spawn, wait and run."""
    spawn: Callable[[str, list[str]], object]            # (name, argv): a foreground child
    wait: Callable[[str, Callable[[], bool]], None]      # (what, condition): raises on deadline
    run: Callable[..., object]                           # run(argv, timeout_s=...): raises on failure


def start_accounting(owner: Owner, *, workdir: Path, conf_dir: Path, log_dir: Path, munge_socket: Path,
                     slurm_user: str, dbd_port: int, db_port: int) -> None:
    """A fresh database each start (like the cluster's state), then MariaDB and slurmdbd."""
    d = workdir / "dbd"
    shutil.rmtree(d, ignore_errors=True)
    for sub in ("db", "run"):
        (d / sub).mkdir(parents=True)
    owner.run(["mariadb-install-db", "--no-defaults", "--user=root", f"--datadir={d / 'db'}", "--skip-test-db",
               "--auth-root-authentication-method=socket"], timeout_s=INSTALL_DB_TIMEOUT_S)
    sock = d / "run" / "mysqld.sock"
    owner.spawn("mariadbd", mariadbd_argv(d, log_dir, db_port))
    owner.wait("mariadbd socket to appear", sock.is_socket)
    password = secrets.token_hex(12)
    owner.run(["mariadb", f"--socket={sock}", "-u", "root", "-e",
               f"CREATE USER 'slurm'@'127.0.0.1' IDENTIFIED BY '{password}'; "
               f"GRANT ALL ON {DATABASE}.* TO 'slurm'@'127.0.0.1';"])
    conf = conf_dir / "slurmdbd.conf"   # slurmdbd reads it next to $SLURM_CONF
    conf.write_text(render_slurmdbd_conf(munge_socket=munge_socket, dbd_port=dbd_port, db_port=db_port,
                                         slurm_user=slurm_user, log_dir=log_dir, run_dir=workdir / "run",
                                         password=password))
    os.chmod(conf, 0o600)
    pw = pwd.getpwnam(slurm_user)
    os.chown(conf, pw.pw_uid, pw.pw_gid)   # slurmdbd refuses a config its SlurmUser does not own
    owner.spawn("slurmdbd", ["slurmdbd", "-D"])
    owner.wait(f"slurmdbd to listen on 127.0.0.1:{dbd_port}", lambda: tcp_listening("127.0.0.1", dbd_port))
