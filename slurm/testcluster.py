"""In-test Slurm cluster on one machine: munged + slurmctld + N slurmd, each compute node in
its own network and UTS namespace (hostname nodeK), brought up and torn down by one owner.

Importable (``TestCluster``, ``sweep``, ``missing_requirements``); the ops commands (up, status,
down, sweep) are ``python slurm/clusterctl.py ...``, which imports this module (never the reverse).
With ``accounting=True`` the cluster also gets job accounting: a private MariaDB and slurmdbd
(``sacct`` works; submitit uses it to see jobs that died).

Layout: a bridge ``<prefix><id>br`` in the root netns holds ``10.A.B.1/24``; node K lives in
netns ``<prefix>-<id>-nodeK`` behind veth ``<prefix><id>vK`` with eth0 at ``10.A.B.(10+K)``
and no default route. munged and slurmctld run in the root netns. Daemons run in the
foreground as children of the owner (the test process, or the supervisor for ``up``), which
reaps them and stops them by PID. Before any namespace or link exists, a JSON record of the
instance goes to ``REGISTRY_DIR``; ``sweep`` uses the records to clean up after an owner that
was SIGKILLed. The working directory (config, munge key, state, logs) is kept after stop.

Must not import: zmq, nodeagent.*, controller.* other than controller.contracts.fileio (the one
atomic write, a leaf), slurm.clusterctl (this is test/ops infrastructure; it only runs
system commands: ip, nsenter, unshare, mungekey, munged, slurmctld, slurmd, sinfo, and for
accounting mariadb-install-db, mariadbd, mariadb, slurmdbd).
"""
from __future__ import annotations

import ctypes
import fcntl
import ipaddress
import json
import os
import random
import re
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Iterable

from controller.contracts.fileio import atomic_write

REGISTRY_DIR = Path("/run/paddock-testcluster")
DEFAULT_PREFIX = "pdk"
MAX_PREFIX_CHARS = 5          # "<prefix><6 hex>v<k>" must fit IFNAMSIZ-1 = 15 characters
MAX_NODES = 100
NODE_CPUS = 2
NODE_REAL_MEMORY_MB = 2000
CTLD_PORT_RANGE = (20000, 32000)   # below the ephemeral range, so outgoing sockets don't take it
SUBNET_SECOND_OCTETS = range(160, 224)  # 10.160.0.0/11: the /24s we choose from
REQUIRED_COMMANDS = ("ip", "nsenter", "unshare", "mungekey", "munged", "slurmctld", "slurmd",
                     "sinfo", "srun")
ACCOUNTING_COMMANDS = ("mariadb-install-db", "mariadbd", "mariadb", "slurmdbd", "sacct")
UNIX_SOCKET_PATH_MAX_BYTES = 107
LOG_TAIL_LINES = 15


# ----------------------------------------------------------------------------- errors
class ClusterError(Exception):
    """An operating failure of the in-test cluster (bring-up, teardown, host commands)."""


class ClusterConfigError(ClusterError, ValueError):
    """A bad argument to TestCluster (prefix, node count, working directory)."""


class CommandError(ClusterError):
    """A host command failed; carries argv, exit code (None: did not run/timed out), stderr."""

    def __init__(self, argv: list[str], exit_code: int | None, stderr: str):
        self.argv, self.exit_code, self.stderr = list(argv), exit_code, stderr
        super().__init__(f"command {argv!r} failed (exit {exit_code}): {stderr.strip()}")


class ClusterStartError(ClusterError):
    """The cluster did not come up; the message names the step and carries log tails."""


class ClusterStopError(ClusterError):
    """Something the cluster started is still there after the stop deadline."""


# ----------------------------------------------------------------------------- host helpers
def run_cmd(argv: list[str], *, env: dict | None = None, timeout_s: float = 30.0,
            check: bool = True) -> subprocess.CompletedProcess:
    """Run a host command; failures become CommandError with argv, exit code and stderr."""
    try:
        cp = subprocess.run(argv, capture_output=True, text=True, env=env, timeout=timeout_s,
                            stdin=subprocess.DEVNULL)
    except FileNotFoundError:
        raise CommandError(argv, None, f"{argv[0]}: not found on PATH") from None
    except subprocess.TimeoutExpired:
        raise CommandError(argv, None, f"timed out after {timeout_s}s") from None
    if check and cp.returncode != 0:
        raise CommandError(argv, cp.returncode, cp.stderr)
    return cp


def missing_requirements() -> list[str]:
    """Why the cluster cannot run here ([] if it can): not root, or commands not on PATH."""
    missing = []
    if os.geteuid() != 0:
        missing.append("needs root (network namespaces, slurmd)")
    absent = [c for c in REQUIRED_COMMANDS if shutil.which(c) is None]
    if absent:
        missing.append("not on PATH: " + ", ".join(absent))
    return missing


def missing_accounting() -> list[str]:
    """Why the cluster cannot have job accounting here ([] if it can)."""
    absent = [c for c in ACCOUNTING_COMMANDS if shutil.which(c) is None]
    return ["not on PATH: " + ", ".join(absent)] if absent else []


def _proc_stat(pid: int) -> tuple[str, int] | None:
    """(state letter, start time in clock ticks) of pid, or None if there is no such process."""
    try:
        raw = Path(f"/proc/{pid}/stat").read_text()
    except (FileNotFoundError, ProcessLookupError):
        return None
    fields = raw[raw.rindex(")") + 2:].split()
    return fields[0], int(fields[19])


def proc_start_ticks(pid: int) -> int | None:
    st = _proc_stat(pid)
    return None if st is None else st[1]


def proc_alive(pid: int, start_ticks: int | None = None) -> bool:
    """True if pid runs (a zombie counts as dead: PID 1 here reaps orphans lazily) and, when
    start_ticks is given, is the same process that was recorded (not a reused PID)."""
    st = _proc_stat(pid)
    if st is None or st[0] in ("Z", "X"):
        return False
    return start_ticks is None or st[1] == start_ticks


def send_signal(pid: int, sig: int) -> None:
    """`kill(pid, sig)`; a process that is already gone is not an error."""
    try:
        os.kill(pid, sig)
    except ProcessLookupError:
        pass


def terminate_pids(pids: dict[int, int | None], *, timeout_s: float,
                   clock: Callable[[], float], sleep: Callable[[float], None],
                   poll_interval_s: float, reap: Callable[[], None] = lambda: None) -> list[int]:
    """SIGTERM each pid (checked against its recorded start time), SIGKILL what is left after
    timeout_s, wait again; return the pids still alive. `reap` lets an owner reap its children."""
    live = {p: t for p, t in pids.items() if proc_alive(p, t)}
    for sig in (signal.SIGTERM, signal.SIGKILL):
        for pid in live:
            send_signal(pid, sig)
        deadline = clock() + timeout_s
        while True:
            reap()
            live = {p: t for p, t in live.items() if proc_alive(p, t)}
            if not live or clock() >= deadline:
                break
            sleep(poll_interval_s)
        if not live:
            return []
    return sorted(live)


def _die_with_parent() -> None:  # runs in the child between fork and exec
    libc = ctypes.CDLL(None, use_errno=True)
    libc.prctl(1, signal.SIGTERM)   # PR_SET_PDEATHSIG: a SIGKILLed owner takes its daemons along


def _tail(path: Path, lines: int = LOG_TAIL_LINES) -> str:
    try:
        text = path.read_text(errors="replace").splitlines()[-lines:]
    except FileNotFoundError:
        return "    (missing)"
    return "\n".join("    " + line for line in text) or "    (empty)"


# ----------------------------------------------------------------------------- naming, network
@dataclass(frozen=True)
class Names:
    """Host-wide names of one instance: unique by (prefix, random id)."""
    prefix: str
    instance_id: str

    @property
    def bridge(self) -> str:
        return f"{self.prefix}{self.instance_id}br"

    def netns(self, k: int) -> str:
        return f"{self.prefix}-{self.instance_id}-node{k}"

    def veth(self, k: int) -> str:
        return f"{self.prefix}{self.instance_id}v{k}"

    @property
    def record_name(self) -> str:
        return f"{self.prefix}-{self.instance_id}.json"

    @property
    def munge_dir_name(self) -> str:
        return f"{self.prefix}-{self.instance_id}.munge"


def validate_prefix(prefix: str) -> str:
    if not re.fullmatch(rf"[a-z]{{1,{MAX_PREFIX_CHARS}}}", prefix):
        raise ClusterConfigError(
            f"name_prefix {prefix!r} must be 1..{MAX_PREFIX_CHARS} lowercase letters "
            "(it is part of interface names limited to 15 characters)")
    return prefix


def _used_networks() -> list[ipaddress.IPv4Network]:
    nets = []
    for argv in (["ip", "-4", "-o", "addr", "show"], ["ip", "-4", "route", "show", "table", "all"]):
        for tok in run_cmd(argv).stdout.split():
            try:
                if "/" in tok and tok[0].isdigit():
                    nets.append(ipaddress.ip_network(tok, strict=False))
            except ValueError:
                continue
    return nets


def choose_subnet(used: Iterable[ipaddress.IPv4Network],
                  rng: random.Random) -> ipaddress.IPv4Network:
    """A random private /24 in 10.160.0.0/11 that overlaps no network in `used`."""
    used = list(used)
    candidates = [(a, b) for a in SUBNET_SECOND_OCTETS for b in range(256)]
    rng.shuffle(candidates)
    for a, b in candidates:
        net = ipaddress.ip_network(f"10.{a}.{b}.0/24")
        if not any(net.overlaps(u) for u in used):
            return net
    raise ClusterStartError("no free /24 left in 10.160.0.0/11 for the cluster bridge")


def node_addr(subnet: ipaddress.IPv4Network, k: int) -> str:
    return str(subnet.network_address + 10 + k)


def bridge_addr(subnet: ipaddress.IPv4Network) -> str:
    return str(subnet.network_address + 1)


def _link_exists(name: str) -> bool:
    return Path("/sys/class/net", name).exists()


def _netns_exists(name: str) -> bool:
    return Path("/run/netns", name).exists()


def create_network(names: Names, subnet: ipaddress.IPv4Network, nodes: int) -> None:
    plen = subnet.prefixlen
    run_cmd(["ip", "link", "add", names.bridge, "type", "bridge"])
    run_cmd(["ip", "addr", "add", f"{bridge_addr(subnet)}/{plen}", "dev", names.bridge])
    run_cmd(["ip", "link", "set", names.bridge, "up"])
    for k in range(1, nodes + 1):
        ns, veth = names.netns(k), names.veth(k)
        run_cmd(["ip", "netns", "add", ns])
        run_cmd(["ip", "link", "add", veth, "type", "veth", "peer", "name", "eth0", "netns", ns])
        run_cmd(["ip", "link", "set", veth, "master", names.bridge, "up"])
        run_cmd(["ip", "-n", ns, "addr", "add", f"{node_addr(subnet, k)}/{plen}", "dev", "eth0"])
        run_cmd(["ip", "-n", ns, "link", "set", "eth0", "up"])
        run_cmd(["ip", "-n", ns, "link", "set", "lo", "up"])


def netns_pids(ns: str) -> list[int]:
    if not _netns_exists(ns):
        return []
    cp = run_cmd(["ip", "netns", "pids", ns], check=False)
    return [int(p) for p in cp.stdout.split() if p.isdigit()]


def delete_network(netns: Iterable[str], links: Iterable[str]) -> None:
    """Delete namespaces then links (veths first, bridge last); absent ones are skipped."""
    # deleting a netns removes its veth peer, and the root-side end goes away asynchronously:
    # a failed delete of something that is gone by now is success
    for ns in netns:
        try:
            run_cmd(["ip", "netns", "del", ns]) if _netns_exists(ns) else None
        except CommandError:
            if _netns_exists(ns):
                raise
    for link in links:
        try:
            run_cmd(["ip", "link", "del", link]) if _link_exists(link) else None
        except CommandError:
            if _link_exists(link):
                raise


# ----------------------------------------------------------------------------- slurm.conf
def render_slurm_conf(*, workdir: Path, munge_socket: Path, cluster_name: str, ctld_host: str,
                      ctld_addr: str, ctld_port: int, node_addrs: dict[str, str],
                      dbd_port: int | None = None) -> str:
    """The slurm.conf text: everything lives under workdir; one NodeName line per node. With
    dbd_port, job accounting goes to the cluster's own slurmdbd on 127.0.0.1:dbd_port."""
    d = workdir
    lines = [
        f"ClusterName={cluster_name}",
        f"SlurmctldHost={ctld_host}({ctld_addr})",
        f"SlurmctldPort={ctld_port}",
        "SlurmdPort=6818",
        "SlurmUser=root", "SlurmdUser=root",
        "AuthType=auth/munge", "CredType=cred/munge",
        f"AuthInfo=socket={munge_socket}",
        f"StateSaveLocation={d}/state",
        f"SlurmdSpoolDir={d}/spool/%n",
        f"SlurmctldPidFile={d}/run/slurmctld.pid",
        f"SlurmdPidFile={d}/run/slurmd-%n.pid",
        f"SlurmctldLogFile={d}/log/slurmctld.log",
        f"SlurmdLogFile={d}/log/slurmd-%n.log",
        "ProctrackType=proctrack/linuxproc", "TaskPlugin=task/none",
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
        lines.append(f"NodeName={host} NodeAddr={addr} NodeHostname={host} CPUs={NODE_CPUS} "
                     f"RealMemory={NODE_REAL_MEMORY_MB} State=UNKNOWN")
    lines.append("PartitionName=debug Nodes=ALL Default=YES MaxTime=INFINITE State=UP")
    return "\n".join(lines) + "\n"


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
    `netns` ({host: netns name}), `controller_addr`, `ctld_port`, `pids` ({name: pid}).
    The daemons get SIGTERM if the thread that called start() exits (PR_SET_PDEATHSIG)."""

    __test__ = False  # not a pytest test class despite the name

    def __init__(self, workdir: str | os.PathLike, nodes: int = 3, name_prefix: str = DEFAULT_PREFIX,
                 *, start_timeout_s: float = 30.0, stop_timeout_s: float = 10.0,
                 poll_interval_s: float = 0.05, registry_dir: Path = REGISTRY_DIR,
                 clock: Callable[[], float] = time.monotonic,
                 sleep: Callable[[float], None] = time.sleep, accounting: bool = False):
        if not 1 <= nodes <= MAX_NODES:
            raise ClusterConfigError(f"nodes={nodes}: must be between 1 and {MAX_NODES}")
        self.workdir = Path(workdir).resolve()
        if re.search(r"[\s#=\\\"']", str(self.workdir)):
            raise ClusterConfigError(f"workdir {str(self.workdir)!r}: slurm.conf cannot hold paths "
                                     "with whitespace, quotes, '#', '=' or backslashes")
        self.names = Names(validate_prefix(name_prefix), secrets.token_hex(3))
        self.registry_dir = Path(registry_dir)
        # munged wants o+x on every directory above its socket, which a pytest tmp dir (0700)
        # lacks: the socket lives in the registry instead, in a per-instance 0711 directory
        self.munge_socket = self.registry_dir / self.names.munge_dir_name / "munge.socket"
        if len(os.fsencode(self.munge_socket)) > UNIX_SOCKET_PATH_MAX_BYTES:
            raise ClusterConfigError(f"registry_dir {str(registry_dir)!r} is too long for a unix "
                                     f"socket path ({UNIX_SOCKET_PATH_MAX_BYTES} bytes)")
        self.nodes = tuple(f"node{k}" for k in range(1, nodes + 1))
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
            ctld_port=self.ctld_port, node_addrs=self.node_addrs, dbd_port=self.dbd_port or None))

    def _spawn(self, name: str, argv: list[str]) -> _Daemon:
        out_path = self.log_dir / f"{name}.out"
        with open(out_path, "ab") as out:
            try:
                proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=out,
                                        stderr=subprocess.STDOUT, env=self.env,
                                        start_new_session=True, preexec_fn=_die_with_parent)
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
                               f"--pid-file={self.workdir}/run/munged.pid",
                               f"--log-file={self.log_dir}/munged.log"])
        self._wait("munged socket to appear", self.munge_socket.is_socket)

    def _start_accounting(self) -> None:
        """A private MariaDB (datadir and socket under workdir/dbd, TCP on 127.0.0.1) and slurmdbd on
        127.0.0.1:dbd_port, both foreground children like the other daemons."""
        d = self.workdir / "dbd"
        shutil.rmtree(d, ignore_errors=True)      # a fresh database each start, like the state
        for sub in ("db", "run"):
            (d / sub).mkdir(parents=True)
        sock = d / "run" / "mysqld.sock"
        db_port = _free_port("127.0.0.1")
        self._record["db_port"] = db_port
        run_cmd(["mariadb-install-db", "--no-defaults", "--user=root", f"--datadir={d / 'db'}", "--skip-test-db",
                 "--auth-root-authentication-method=socket"], timeout_s=120)
        self._spawn("mariadbd", ["mariadbd", "--no-defaults", "--user=root", f"--datadir={d / 'db'}",
                                 f"--socket={sock}", f"--pid-file={d / 'run' / 'mariadb.pid'}",
                                 "--bind-address=127.0.0.1", f"--port={db_port}", "--skip-name-resolve",
                                 f"--log-error={self.log_dir / 'mariadb.err'}",
                                 "--innodb-log-file-size=8M", "--innodb-buffer-pool-size=16M"])
        self._wait("mariadbd socket to appear", sock.is_socket)
        password = secrets.token_hex(12)
        run_cmd(["mariadb", f"--socket={sock}", "-u", "root", "-e",
                 f"CREATE USER 'slurm'@'127.0.0.1' IDENTIFIED BY '{password}'; "
                 "GRANT ALL ON slurm_acct_db.* TO 'slurm'@'127.0.0.1';"])
        conf = self.conf.parent / "slurmdbd.conf"   # slurmdbd reads it next to $SLURM_CONF
        conf.write_text("\n".join([
            "AuthType=auth/munge", f"AuthInfo=socket={self.munge_socket}", "DbdHost=localhost",
            "DbdAddr=127.0.0.1", f"DbdPort={self.dbd_port}", "SlurmUser=root",
            f"LogFile={self.log_dir / 'slurmdbd.log'}", f"PidFile={self.workdir / 'run' / 'slurmdbd.pid'}",
            "StorageType=accounting_storage/mysql", "StorageHost=127.0.0.1", f"StoragePort={db_port}",
            "StorageLoc=slurm_acct_db", "StorageUser=slurm", f"StoragePass={password}",
        ]) + "\n")
        os.chmod(conf, 0o600)
        self._spawn("slurmdbd", ["slurmdbd", "-D"])

        def listening() -> bool:
            try:
                socket.create_connection(("127.0.0.1", self.dbd_port), timeout=0.2).close()
                return True
            except OSError:
                return False
        self._wait(f"slurmdbd to listen on 127.0.0.1:{self.dbd_port}", listening)

    def _start_slurmctld(self) -> None:
        self._spawn("slurmctld", ["slurmctld", "-D", "-i", "-f", str(self.conf)])

        def listening() -> bool:
            try:
                socket.create_connection((self.controller_addr, self.ctld_port), timeout=0.2).close()
                return True
            except OSError:
                return False
        self._wait(f"slurmctld to listen on {self.controller_addr}:{self.ctld_port}", listening)

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
