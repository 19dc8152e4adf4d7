"""In-test Slurm cluster on one machine: munged + slurmctld + N slurmd, each compute node in
its own network and UTS namespace (hostname nodeK), brought up and torn down by one owner.

Importable (``TestCluster``, ``sweep``, ``missing_requirements``); the ops commands (up, status,
down, sweep) are ``python slurm/clusterctl.py ...``, which imports this module (never the reverse).
With ``accounting=True`` the cluster also gets job accounting: a private MariaDB and slurmdbd
(slurm/accounting.py; ``sacct`` works, submitit uses it to see jobs that died).

Users, as on a real cluster: slurmctld (and slurmdbd) run as ``SlurmUser`` (the ``slurm`` user
when it exists), slurmd as root (it starts each job's slurmstepd, which runs the job as its
submitter). With ``job_user``, `job_argv()` / `job_env` run Slurm commands as that ordinary user
(``runuser``: the user's own submission, not ``sbatch --uid``). The working directory must then
be reachable by those users (every ancestor o+x: not a pytest ``tmp_path``); slurm.conf is
world-readable, the state, log and run directories belong to SlurmUser.

Layout: a bridge ``<prefix><id>br`` in the root netns holds ``10.A.B.1/24``; node K lives in
netns ``<prefix>-<id>-nodeK`` behind veth ``<prefix><id>vK`` with eth0 at ``10.A.B.(10+K)``
and no default route. munged and slurmctld run in the root netns. Daemons run in the
foreground as children of the owner (the test process, or the supervisor for ``up``), which
reaps them and stops them by PID. Before any namespace or link exists, a JSON record of the
instance goes to ``REGISTRY_DIR``; ``sweep`` uses the records to clean up after an owner that
was SIGKILLed. The working directory (config, munge key, state, logs) is kept after stop.

Must not import: zmq, nodeagent.*, slurm.clusterctl.
Of the controller it imports only controller.ondisk.fileio (the one atomic write, a leaf).
This is test/ops infrastructure: it runs system commands only (mungekey, munged, slurmctld,
slurmd, sinfo, through slurm.clusterhost; the accounting daemons through slurm.accounting).
"""
from __future__ import annotations

import fcntl
import json
import os
import pwd
import random
import re
import secrets
import shutil
import signal
import socket
import stat
import subprocess
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from controller.ondisk.fileio import atomic_write
from slurm.accounting import Owner, missing_accounting, start_accounting, tcp_listening
from slurm.clusterhost import (  # noqa: F401
    RUNUSER,
    ClusterConfigError,
    ClusterError,
    ClusterStartError,
    ClusterStopError,
    CommandError,
    Names,
    _netns_exists,
    _tail,
    _used_networks,
    bridge_addr,
    choose_subnet,
    create_network,
    default_slurm_user,
    delete_network,
    missing_requirements,
    netns_pids,
    node_addr,
    proc_alive,
    proc_start_ticks,
    reachable_by_others,
    run_cmd,
    send_signal,
    terminate_pids,
    validate_prefix,
)
from slurm.lifeline import die_with_parent

__all__ = ["TestCluster", "sweep", "missing_requirements", "missing_accounting", "render_slurm_conf",
           "render_gres_conf", "gpu_device_files",
           "ClusterError", "ClusterConfigError", "choose_subnet", "proc_alive", "validate_prefix"]

REGISTRY_DIR = Path("/run/paddock-testcluster")
DEFAULT_PREFIX = "pdk"
MAX_NODES = 100
NODE_CPUS = 2
NODE_REAL_MEMORY_MB = 2000
DEFAULT_TASK_PLUGIN = "task/affinity"   # CPU binding, as on a real cluster (task/none hides a step
                                        # that asked for too few CPUs: it would be pinned to one)
GPU_DEVICE_MAJOR = 195
CTLD_PORT_RANGE = (20000, 32000)   # below the ephemeral range, so outgoing sockets don't take it
UNIX_SOCKET_PATH_MAX_BYTES = 107


# ----------------------------------------------------------------------------- slurm.conf
def render_slurm_conf(*, workdir: Path, munge_socket: Path, cluster_name: str, ctld_host: str,
                      ctld_addr: str, ctld_port: int, node_addrs: dict[str, str],
                      dbd_port: int | None = None, slurm_user: str = "root",
                      task_plugin: str = DEFAULT_TASK_PLUGIN, gpus: dict[str, int] | None = None,
                      partitions: dict[str, tuple[str, ...]] | None = None) -> str:
    """The slurm.conf text: everything lives under workdir; one NodeName line per node; slurmctld
    runs as slurm_user. With dbd_port, job accounting goes to the cluster's own slurmdbd on
    127.0.0.1:dbd_port. `task_plugin` binds tasks to CPUs as a real cluster does (task/affinity);
    `gpus` ({host: count}) gives nodes GPUs (Gres=gpu:N; their device files are in gres.conf,
    `render_gres_conf`); `partitions` ({name: hosts}, the first the default), else one `debug`
    partition of every node."""
    d = workdir
    lines = [
        f"ClusterName={cluster_name}",
        f"SlurmctldHost={ctld_host}({ctld_addr})",
        f"SlurmctldPort={ctld_port}",
        "SlurmdPort=6818",
        f"SlurmUser={slurm_user}", "SlurmdUser=root",
        "AuthType=auth/munge", "CredType=cred/munge",
        f"AuthInfo=socket={munge_socket}",
        f"StateSaveLocation={d}/state",
        f"SlurmdSpoolDir={d}/spool/%n",
        f"SlurmctldPidFile={d}/run/slurmctld.pid",
        f"SlurmdPidFile={d}/run/slurmd-%n.pid",
        f"SlurmctldLogFile={d}/log/slurmctld.log",
        f"SlurmdLogFile={d}/log/slurmd-%n.log",
        "ProctrackType=proctrack/linuxproc", f"TaskPlugin={task_plugin}",
        *(["GresTypes=gpu"] if gpus else []),
        # GPUs as a TRES of the job (scontrol's TRES=...,gres/gpu=N) need the accounting daemon
        *(["AccountingStorageTRES=gres/gpu"] if gpus and dbd_port else []),
        "JobAcctGatherType=jobacct_gather/none",
        *(["AccountingStorageType=accounting_storage/slurmdbd", "AccountingStorageHost=127.0.0.1",
           f"AccountingStoragePort={dbd_port}",
           # the dbd link does not use AuthInfo: without this slurmctld looks for munge's default socket
           f"AccountingStoragePass={munge_socket}"]
          if dbd_port else ["AccountingStorageType=accounting_storage/none"]),
        "JobCompType=jobcomp/none",
        "SelectType=select/cons_tres", "SelectTypeParameters=CR_CPU",
        "SchedulerType=sched/backfill", "SchedulerParameters=sched_interval=1,bf_interval=1",
        "MpiDefault=none", "SwitchType=switch/none",
        "ReturnToService=2", "SlurmdParameters=config_overrides",
        "SlurmctldTimeout=30", "SlurmdTimeout=30", "InactiveLimit=0", "MinJobAge=300",
        "KillWait=5", "Waittime=0", "MessageTimeout=10",
    ]
    for host, addr in node_addrs.items():
        gres = f" Gres=gpu:{gpus[host]}" if gpus and gpus.get(host) else ""
        lines.append(f"NodeName={host} NodeAddr={addr} NodeHostname={host} CPUs={NODE_CPUS} "
                     f"RealMemory={NODE_REAL_MEMORY_MB}{gres} State=UNKNOWN")
    for k, (name, hosts) in enumerate((partitions or {"debug": ("ALL",)}).items()):
        lines.append(f"PartitionName={name} Nodes={','.join(hosts)} Default={'YES' if k == 0 else 'NO'} "
                     "MaxTime=INFINITE State=UP")
    return "\n".join(lines) + "\n"


def gpu_device_files(workdir: Path, host: str, count: int) -> list[Path]:
    """The device files of a node's "GPUs": character devices the cluster makes under
    workdir/dev/<host>/ (major 195, as NVIDIA's; nothing opens them: Slurm only hands them out)."""
    return [workdir / "dev" / host / f"nvidia{i}" for i in range(count)]


def render_gres_conf(workdir: Path, gpus: dict[str, int]) -> str:
    """gres.conf: each GPU node's devices (File=), one line per node."""
    return "".join(f"NodeName={h} Name=gpu File={workdir}/dev/{h}/nvidia[0-{n - 1}]\n"
                   for h, n in gpus.items() if n)


# ----------------------------------------------------------------------------- records
def write_record(path: Path, data: dict) -> None:
    """A JSON record (registry entry, cluster.json, supervisor.json), replaced atomically."""
    atomic_write(path, json.dumps(data, indent=1, sort_keys=True))


def _registry_lock(registry_dir: Path):
    registry_dir.mkdir(parents=True, exist_ok=True)
    os.chmod(registry_dir, 0o755)
    fd = os.open(registry_dir / ".lock", os.O_RDWR | os.O_CREAT, 0o600)
    fcntl.flock(fd, fcntl.LOCK_EX)
    return fd


def _unlock(fd: int) -> None:
    fcntl.flock(fd, fcntl.LOCK_UN)
    os.close(fd)


def cleanup_record(record: dict, *, timeout_s: float = 5.0, poll_interval_s: float = 0.05,
                   clock: Callable[[], float] = time.monotonic,
                   sleep: Callable[[float], None] = time.sleep) -> list[int]:
    """Remove what a record describes: its daemons (by PID and start time), any process left in
    its namespaces, the namespaces, veths and bridge. Returns pids that would not die."""
    daemons = {int(p): t for p, t in record.get("pids", {}).items()}
    for ns in record["netns"]:
        daemons.update({p: proc_start_ticks(p) for p in netns_pids(ns)})
    stuck = terminate_pids(daemons, timeout_s=timeout_s, clock=clock, sleep=sleep,
                           poll_interval_s=poll_interval_s)
    delete_network(record["netns"], record["veths"] + [record["bridge"]])
    shutil.rmtree(record["munge_dir"], ignore_errors=True)
    return stuck


def sweep(prefix: str = DEFAULT_PREFIX, *, registry_dir: Path = REGISTRY_DIR) -> list[str]:
    """Remove leftovers of instances with this prefix whose owner is dead (e.g. SIGKILLed):
    daemons, namespaces, veths, bridges and their records. Live instances are left alone.
    Names matching the prefix with no record at all are leftovers too (a record is written
    before any namespace or link and removed after the last one). Returns what was removed."""
    validate_prefix(prefix)
    removed: list[str] = []
    lock = _registry_lock(registry_dir)
    try:
        live_ids = set()
        for path in sorted(registry_dir.glob(f"{prefix}-*.json")):
            m = re.fullmatch(rf"{prefix}-([0-9a-f]{{6}})\.json", path.name)
            if not m:
                continue
            record = json.loads(path.read_text())
            owner = record["owner"]
            if proc_alive(owner["pid"], owner["start_ticks"]):
                live_ids.add(m.group(1))
                continue
            cleanup_record(record)
            path.unlink()
            removed += [record["bridge"], *record["netns"]]
        orphan_ns = [n for n in (os.listdir("/run/netns") if Path("/run/netns").is_dir() else [])
                     if (m := re.fullmatch(rf"{prefix}-([0-9a-f]{{6}})-node\d+", n))
                     and m.group(1) not in live_ids]
        orphan_links = sorted((n for n in os.listdir("/sys/class/net")
                               if (m := re.fullmatch(rf"{prefix}([0-9a-f]{{6}})(br|v\d+)", n))
                               and m.group(1) not in live_ids), key=lambda n: n.endswith("br"))
        orphan_dirs = [p for p in registry_dir.glob(f"{prefix}-*.munge")
                       if (m := re.fullmatch(rf"{prefix}-([0-9a-f]{{6}})\.munge", p.name))
                       and m.group(1) not in live_ids]
        for d in orphan_dirs:
            shutil.rmtree(d, ignore_errors=True)
            removed.append(str(d))
        for ns in orphan_ns:
            terminate_pids({p: proc_start_ticks(p) for p in netns_pids(ns)}, timeout_s=5.0,
                           clock=time.monotonic, sleep=time.sleep, poll_interval_s=0.05)
        delete_network(orphan_ns, orphan_links)
        removed += orphan_ns + orphan_links
    finally:
        _unlock(lock)
    return removed


# ----------------------------------------------------------------------------- the cluster
@dataclass
class _Daemon:
    name: str
    proc: subprocess.Popen
    start_ticks: int | None
    out_path: Path


class TestCluster:
    """munged + slurmctld + `nodes` slurmd (one per netns+UTS ns), owned by this process.

    After start(): `conf` (slurm.conf path), `env` (os.environ without inherited SLURM_*
    variables, plus SLURM_CONF), `nodes` (("node1", ...)), `node_addrs` ({host: address}),
    `netns` ({host: netns name}), `controller_addr`, `ctld_port`, `pids` ({name: pid}),
    `slurm_user`, `job_user`; `job_argv(argv)` and `job_env` run a command as the job user.
    The daemons get SIGTERM if the thread that called start() exits (PR_SET_PDEATHSIG)."""

    __test__ = False  # not a pytest test class despite the name

    def __init__(self, workdir: str | os.PathLike, nodes: int = 3, name_prefix: str = DEFAULT_PREFIX,
                 *, start_timeout_s: float = 30.0, stop_timeout_s: float = 10.0,
                 poll_interval_s: float = 0.05, registry_dir: Path = REGISTRY_DIR,
                 clock: Callable[[], float] = time.monotonic,
                 sleep: Callable[[float], None] = time.sleep, accounting: bool = False,
                 slurm_user: str | None = None, job_user: str | None = None,
                 task_plugin: str = DEFAULT_TASK_PLUGIN, gpus: dict[str, int] | None = None,
                 partitions: dict[str, tuple[str, ...]] | None = None):
        if not 1 <= nodes <= MAX_NODES:
            raise ClusterConfigError(f"nodes={nodes}: must be between 1 and {MAX_NODES}")
        self.workdir = Path(workdir).resolve()
        if re.search(r"[\s#=\\\"']", str(self.workdir)):
            raise ClusterConfigError(f"workdir {str(self.workdir)!r}: slurm.conf cannot hold paths "
                                     "with whitespace, quotes, '#', '=' or backslashes")
        self.names = Names(validate_prefix(name_prefix), secrets.token_hex(3))
        self.slurm_user = slurm_user or default_slurm_user()
        self.job_user = job_user
        for role, user in (("slurm_user", self.slurm_user), ("job_user", job_user)):
            try:
                user and pwd.getpwnam(user)
            except KeyError:
                raise ClusterConfigError(f"{role} {user!r} does not exist on this machine "
                                         "(scripts/setup.sh makes the test users)") from None
        self.registry_dir = Path(registry_dir)
        # munged wants o+x on every directory above its socket, which a pytest tmp dir (0700)
        # lacks: the socket lives in the registry instead, in a per-instance 0711 directory
        self.munge_socket = self.registry_dir / self.names.munge_dir_name / "munge.socket"
        if len(os.fsencode(self.munge_socket)) > UNIX_SOCKET_PATH_MAX_BYTES:
            raise ClusterConfigError(f"registry_dir {str(registry_dir)!r} is too long for a unix "
                                     f"socket path ({UNIX_SOCKET_PATH_MAX_BYTES} bytes)")
        self.nodes = tuple(f"node{k}" for k in range(1, nodes + 1))
        for role, hosts in (("gpus", list(gpus or {})),
                            *((f"partition {n}", list(h)) for n, h in (partitions or {}).items())):
            unknown = [h for h in hosts if h not in self.nodes]
            if unknown:
                raise ClusterConfigError(f"{role}: no node {unknown[0]!r} (nodes: {', '.join(self.nodes)})")
        self.task_plugin, self.gpus, self.partitions = task_plugin, dict(gpus or {}), partitions
        self.conf = self.workdir / "etc" / "slurm.conf"
        self.env: dict[str, str] = {}
        self.node_addrs: dict[str, str] = {}
        self.netns = {h: self.names.netns(k) for k, h in enumerate(self.nodes, 1)}
        self.controller_addr = ""
        self.ctld_port = 0
        self.accounting = accounting
        self.dbd_port = 0
        self.start_timeout_s, self.stop_timeout_s = start_timeout_s, stop_timeout_s
        self.poll_interval_s = poll_interval_s
        self._clock, self._sleep = clock, sleep
        self._daemons: list[_Daemon] = []
        self._record: dict | None = None
        self._lock = threading.Lock()

    # -- public --------------------------------------------------------------------------
    @property
    def pids(self) -> dict[str, int]:
        return {d.name: d.proc.pid for d in self._daemons}

    @property
    def log_dir(self) -> Path:
        return self.workdir / "log"

    def job_argv(self, argv: list[str]) -> list[str]:
        """argv run as the job user (its own submission: `runuser -u USER -- argv`); as is without one."""
        return [RUNUSER, "-u", self.job_user, "--", *argv] if self.job_user else list(argv)

    @property
    def job_env(self) -> dict[str, str]:
        """The environment for `job_argv`: a plain login-like one for the job user plus SLURM_CONF
        (sbatch exports it to the job); `env` without a job user."""
        if not self.job_user:
            return dict(self.env)
        pw = pwd.getpwnam(self.job_user)
        return {"PATH": "/usr/local/bin:/usr/bin:/bin:/usr/sbin:/sbin", "LANG": "C.UTF-8", "HOME": pw.pw_dir,
                "USER": pw.pw_name, "LOGNAME": pw.pw_name, "SLURM_CONF": str(self.conf)}

    def node_argv(self, host: str, argv: list[str]) -> list[str]:
        """argv that runs `argv` "on" node `host`: in its netns and a UTS ns named after it."""
        return ["nsenter", f"--net=/run/netns/{self.netns[host]}", "--", "unshare", "--uts",
                "--", "sh", "-c", 'hostname "$0" && exec "$@"', host, *argv]

    def start(self) -> "TestCluster":
        missing = missing_requirements()
        if missing:
            raise ClusterStartError("cannot run the in-test cluster here: " + "; ".join(missing))
        try:
            self._prepare_workdir()
            self._setup_network_and_record()
            self._write_conf()
            self._start_munged()
            if self.accounting:
                self._start_accounting()
            self._start_slurmctld()
            for host in self.nodes:
                self._spawn(f"slurmd-{host}",
                            self.node_argv(host, ["slurmd", "-D", "-f", str(self.conf), "-N", host]))
            self._wait_nodes_idle()
        except BaseException as start_error:
            try:
                self.stop()
            except ClusterError as stop_error:  # keep the start failure as the reported one
                start_error.add_note(f"and stop() after the failed start: {stop_error}")
            raise
        return self

    def stop(self) -> None:
        """Stop slurmds, anything left in the node namespaces, slurmctld, munged (SIGTERM, then
        SIGKILL after stop_timeout_s); delete namespaces, veths, bridge, record. Idempotent."""
        with self._lock:
            if self._record is None and not self._daemons:
                return
            stuck: list[int] = []
            slurmds = [d for d in self._daemons if d.name.startswith("slurmd-")]
            others = [d for d in reversed(self._daemons) if d not in slurmds]
            stuck += self._terminate(slurmds)
            leftovers = {p: proc_start_ticks(p) for ns in self.netns.values() for p in netns_pids(ns)}
            stuck += terminate_pids(leftovers, timeout_s=self.stop_timeout_s, clock=self._clock,
                                    sleep=self._sleep, poll_interval_s=self.poll_interval_s)
            for d in others:
                stuck += self._terminate([d])
            self._daemons = []
            if self._record is not None:
                delete_network(self._record["netns"], self._record["veths"] + [self._record["bridge"]])
                shutil.rmtree(self._record["munge_dir"], ignore_errors=True)
                (self.registry_dir / self.names.record_name).unlink(missing_ok=True)
                self._record["state"] = "stopped"
                write_record(self.workdir / "cluster.json", self._record)
                self._record = None
            if stuck:
                raise ClusterStopError(f"processes still alive after SIGKILL: {stuck}")

    def __enter__(self) -> "TestCluster":
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()

    def daemon_exits(self) -> dict[str, int]:
        """{daemon name: exit code} for daemons that have exited (reaps them)."""
        return {d.name: d.proc.returncode for d in self._daemons if d.proc.poll() is not None}

    # -- steps ----------------------------------------------------------------------------
    def _prepare_workdir(self) -> None:
        w = self.workdir
        # a fresh cluster each start: slurmctld refuses state saved under another ClusterName;
        # and job ids start again at 1, so slurmd's remembered credentials (spool/<node>/
        # cred_state) would revoke the new job 1 ("Job credential revoked")
        shutil.rmtree(w / "state", ignore_errors=True)
        shutil.rmtree(w / "spool", ignore_errors=True)
        for sub in ("etc", "state", "spool", "log", "run", *(f"spool/{h}" for h in self.nodes)):
            (w / sub).mkdir(parents=True, exist_ok=True)
        os.chmod(w, 0o755)
        os.chmod(w / "etc", 0o755)
        if (self.slurm_user != "root" or self.job_user) and not reachable_by_others(w):
            raise ClusterConfigError(
                f"workdir {w}: users {self.slurm_user!r}/{self.job_user!r} cannot reach it (a directory "
                "above it lacks o+x, e.g. a pytest tmp_path): use one under /tmp (mode 0755)")
        sl = pwd.getpwnam(self.slurm_user)
        for sub in ("state", "log", "run"):   # slurmctld writes here after it dropped root
            os.chown(w / sub, sl.pw_uid, sl.pw_gid)
        munge = w / "munge"
        munge.mkdir(mode=0o700, exist_ok=True)
        key = munge / "munge.key"
        if not key.exists():
            run_cmd(["mungekey", "--create", f"--keyfile={key}"])
        os.chmod(key, 0o400)
        self.env = {k: v for k, v in os.environ.items() if not k.startswith("SLURM_")}
        self.env["SLURM_CONF"] = str(self.conf)

    def _setup_network_and_record(self) -> None:
        lock = _registry_lock(self.registry_dir)
        try:
            subnet = choose_subnet(_used_networks(), random.Random())
            self.controller_addr = bridge_addr(subnet)
            self.node_addrs = {h: node_addr(subnet, k) for k, h in enumerate(self.nodes, 1)}
            me = os.getpid()
            self._record = {
                "prefix": self.names.prefix, "id": self.names.instance_id, "state": "starting",
                "workdir": str(self.workdir), "conf": str(self.conf), "subnet": str(subnet),
                "owner": {"pid": me, "start_ticks": proc_start_ticks(me)},
                "bridge": self.names.bridge, "netns": list(self.netns.values()),
                "veths": [self.names.veth(k) for k in range(1, len(self.nodes) + 1)],
                "node_addrs": self.node_addrs, "controller_addr": self.controller_addr,
                "pids": {}, "daemons": {},
            }
            self._record["munge_dir"] = str(self.munge_socket.parent)
            self._save_record()
            self.munge_socket.parent.mkdir(mode=0o711)
            os.chmod(self.munge_socket.parent, 0o711)  # munged: o+x, and no o+w
            create_network(self.names, subnet, len(self.nodes))
        finally:
            _unlock(lock)

    def _save_record(self) -> None:
        assert self._record is not None
        write_record(self.registry_dir / self.names.record_name, self._record)
        write_record(self.workdir / "cluster.json", self._record)

    def _write_conf(self) -> None:
        self.ctld_port = _free_port(self.controller_addr)
        self._record["ctld_port"] = self.ctld_port
        if self.accounting:
            self.dbd_port = _free_port("127.0.0.1")
            self._record["dbd_port"] = self.dbd_port
        self.conf.write_text(render_slurm_conf(
            workdir=self.workdir, munge_socket=self.munge_socket, cluster_name=f"{self.names.prefix}{self.names.instance_id}",
            ctld_host=socket.gethostname().split(".")[0], ctld_addr=self.controller_addr,
            ctld_port=self.ctld_port, node_addrs=self.node_addrs, dbd_port=self.dbd_port or None,
            slurm_user=self.slurm_user, task_plugin=self.task_plugin, gpus=self.gpus,
            partitions=self.partitions))
        os.chmod(self.conf, 0o644)   # every user's sbatch/srun reads it
        if self.gpus:
            for host, n in self.gpus.items():
                for k, dev in enumerate(gpu_device_files(self.workdir, host, n)):
                    dev.parent.mkdir(parents=True, exist_ok=True)
                    if not dev.exists():
                        os.mknod(dev, 0o666 | stat.S_IFCHR, os.makedev(GPU_DEVICE_MAJOR, k))
            gres = self.conf.parent / "gres.conf"
            gres.write_text(render_gres_conf(self.workdir, self.gpus))
            os.chmod(gres, 0o644)

    def _spawn(self, name: str, argv: list[str]) -> _Daemon:
        out_path = self.log_dir / f"{name}.out"
        with open(out_path, "ab") as out:
            try:
                proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=out,
                                        stderr=subprocess.STDOUT, env=self.env,
                                        start_new_session=True, preexec_fn=die_with_parent(signal.SIGTERM))
            except OSError as e:
                raise ClusterStartError(f"cannot start {name} ({argv!r}): {e}") from e
        d = _Daemon(name, proc, proc_start_ticks(proc.pid), out_path)
        self._daemons.append(d)
        self._record["pids"][str(proc.pid)] = d.start_ticks
        self._record["daemons"][name] = proc.pid
        self._save_record()
        return d

    def _start_munged(self) -> None:
        m = self.workdir / "munge"
        self._spawn("munged", ["munged", "-F", f"--socket={self.munge_socket}",
                               f"--key-file={m}/munge.key", f"--seed-file={m}/munged.seed",
                               f"--pid-file={m}/munged.pid",   # munged: not in run/ (SlurmUser owns it)
                               f"--log-file={self.log_dir}/munged.log"])
        self._wait("munged socket to appear", self.munge_socket.is_socket)

    def _start_accounting(self) -> None:
        db_port = _free_port("127.0.0.1")
        self._record["db_port"] = db_port
        start_accounting(Owner(spawn=self._spawn, wait=self._wait, run=run_cmd), workdir=self.workdir,
                         conf_dir=self.conf.parent, log_dir=self.log_dir, munge_socket=self.munge_socket,
                         slurm_user=self.slurm_user, dbd_port=self.dbd_port, db_port=db_port)

    def _start_slurmctld(self) -> None:
        self._spawn("slurmctld", ["slurmctld", "-D", "-i", "-f", str(self.conf)])
        self._wait(f"slurmctld to listen on {self.controller_addr}:{self.ctld_port}",
                   lambda: tcp_listening(self.controller_addr, self.ctld_port))

    def _wait_nodes_idle(self) -> None:
        want = set(self.nodes)
        last = {"states": ""}

        def all_idle() -> bool:
            cp = run_cmd(["sinfo", "-h", "-N", "-o", "%N %T"], env=self.env, check=False)
            last["states"] = (cp.stdout + cp.stderr).strip()
            idle = {ln.split()[0] for ln in cp.stdout.splitlines()
                    if len(ln.split()) == 2 and ln.split()[1] == "idle"}
            return want <= idle
        self._wait("all nodes to be idle in sinfo", all_idle, lambda: f"last sinfo: {last['states']}")
        self._record["state"] = "up"
        self._save_record()

    def _wait(self, what: str, cond: Callable[[], bool],
              detail: Callable[[], str] = lambda: "") -> None:
        deadline = self._clock() + self.start_timeout_s
        while not cond():
            exited = self.daemon_exits()
            if exited:
                raise ClusterStartError(f"while waiting for {what}: daemons exited {exited}\n"
                                        + self._log_tails())
            if self._clock() >= deadline:
                raise ClusterStartError(f"timed out after {self.start_timeout_s}s waiting for "
                                        f"{what}. {detail()}\n" + self._log_tails())
            self._sleep(self.poll_interval_s)

    def _log_tails(self) -> str:
        parts = [f"workdir {self.workdir}"]
        for path in sorted(self.log_dir.glob("*")):
            parts.append(f"--- {path.name}:\n{_tail(path)}")
        return "\n".join(parts)

    def _terminate(self, daemons: list[_Daemon]) -> list[int]:
        def reap() -> None:
            for d in daemons:
                d.proc.poll()
        return terminate_pids({d.proc.pid: d.start_ticks for d in daemons if d.proc.poll() is None},
                              timeout_s=self.stop_timeout_s, clock=self._clock, sleep=self._sleep,
                              poll_interval_s=self.poll_interval_s, reap=reap)


def _free_port(addr: str) -> int:
    rng = random.Random()
    for _ in range(200):
        port = rng.randrange(*CTLD_PORT_RANGE)
        with socket.socket() as s:
            try:
                s.bind(("0.0.0.0", port))
                return port
            except OSError:
                continue
    raise ClusterStartError(f"no free TCP port in {CTLD_PORT_RANGE} for slurmctld on {addr}")
