"""Host side of the in-test Slurm cluster (slurm/testcluster.py): its errors, host commands (argv,
exit code and stderr on failure), processes by PID and start time (a recorded PID is never
mistaken for a reused one), the users it needs, and the namespaced network: host-wide names of
an instance, its bridge, one netns + veth per node, and their removal.

Must not import: zmq, nodeagent.*, controller.*, slurm.testcluster (which imports this module).
It runs only system commands: ip, and what `run_cmd` is given.
"""
from __future__ import annotations

import ipaddress
import os
import pwd
import random
import re
import shutil
import signal
import subprocess
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Iterable

MAX_PREFIX_CHARS = 5          # "<prefix><6 hex>v<k>" must fit IFNAMSIZ-1 = 15 characters
SUBNET_SECOND_OCTETS = range(160, 224)  # 10.160.0.0/11: the /24s we choose from
DEFAULT_SLURM_USER = "slurm"   # Debian's slurm packages make it; root when it is missing
LOG_TAIL_LINES = 15
RUNUSER = shutil.which("runuser") or "/usr/sbin/runuser"
REQUIRED_COMMANDS = ("ip", "nsenter", "unshare", "mungekey", "munged", "slurmctld", "slurmd",
                     "sinfo", "srun")


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


def default_slurm_user() -> str:
    try:
        pwd.getpwnam(DEFAULT_SLURM_USER)
        return DEFAULT_SLURM_USER
    except KeyError:
        return "root"


def reachable_by_others(path: Path) -> bool:
    """Every directory from / down to `path` has o+x (another user can reach what is inside)."""
    return all(p.stat().st_mode & 0o001 for p in (path, *path.parents))


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
