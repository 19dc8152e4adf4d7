"""Ops commands for the in-test Slurm cluster (slurm/testcluster.py)::

    python slurm/clusterctl.py up DIR [--nodes 3] [--prefix pdk] [--accounting]   # background supervisor
    python slurm/clusterctl.py status DIR
    python slurm/clusterctl.py down DIR
    python slurm/clusterctl.py sweep [--prefix pdk]                  # leftovers of killed runs

`up` starts a supervisor process that owns the cluster (its daemons are the supervisor's
children) and reports "ok" or the start error through a pipe; `down` stops the supervisor,
which stops the cluster, and cleans up from the record if the supervisor died.

Must not import: zmq, nodeagent.*, controller.*.
It imports slurm.testcluster and slurm.clusterhost, one way (they never import it).
"""
from __future__ import annotations

import argparse
import json
import os
import select
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

if __package__ in (None, ""):   # run as a script: make `slurm` importable
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from slurm.clusterhost import ClusterError, proc_alive, proc_start_ticks, run_cmd, send_signal, terminate_pids  # noqa: E402
from slurm.testcluster import DEFAULT_PREFIX, REGISTRY_DIR, TestCluster, cleanup_record, sweep, write_record  # noqa: E402


def _read_json(path: Path) -> dict | None:
    try:
        return json.loads(path.read_text())
    except FileNotFoundError:
        return None


def _supervisor_file(workdir: Path) -> Path:
    return workdir / "run" / "supervisor.json"


def _supervisor_alive(workdir: Path) -> dict | None:
    sup = _read_json(_supervisor_file(workdir))
    if sup and proc_alive(sup["pid"], sup["start_ticks"]):
        return sup
    return None


def cmd_up(workdir: Path, nodes: int, prefix: str, timeout_s: float, accounting: bool = False) -> int:
    if _supervisor_alive(workdir):
        print(f"error: a cluster is already up in {workdir} (run: down {workdir})", file=sys.stderr)
        return 1
    for sub in ("log", "run"):
        (workdir / sub).mkdir(parents=True, exist_ok=True)
    r, w = os.pipe()
    with open(workdir / "log" / "supervisor.log", "ab") as log:
        proc = subprocess.Popen(
            [sys.executable, os.path.abspath(__file__), "_supervise", str(workdir),
             "--nodes", str(nodes), "--prefix", prefix, "--ready-fd", str(w)]
            + (["--accounting"] if accounting else []),
            pass_fds=(w,), start_new_session=True, stdin=subprocess.DEVNULL,
            stdout=log, stderr=subprocess.STDOUT)
    os.close(w)
    msg, deadline = b"", time.monotonic() + timeout_s
    with os.fdopen(r, "rb") as rf:
        while (left := deadline - time.monotonic()) > 0 and select.select([rf], [], [], left)[0]:
            chunk = os.read(rf.fileno(), 65536)
            if not chunk:
                break
            msg += chunk
    text = msg.decode(errors="replace").strip()
    if text.startswith("ok"):
        rec = _read_json(workdir / "cluster.json") or {}
        print(f"cluster up: nodes {rec.get('node_addrs')} supervisor pid {proc.pid}")
        print(f"export SLURM_CONF={workdir / 'etc' / 'slurm.conf'}")
        return 0
    if not text:
        text = f"no answer within {timeout_s}s; see {workdir}/log/supervisor.log"
        send_signal(proc.pid, signal.SIGTERM)
    print(f"error: cluster did not come up: {text}", file=sys.stderr)
    return 1


def cmd_supervise(workdir: Path, nodes: int, prefix: str, ready_fd: int, accounting: bool = False) -> int:
    stop = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        signal.signal(sig, lambda *_: stop.set())
    me = os.getpid()
    write_record(_supervisor_file(workdir), {"pid": me, "start_ticks": proc_start_ticks(me)})
    cluster = TestCluster(workdir, nodes=nodes, name_prefix=prefix, accounting=accounting)
    try:
        cluster.start()
    except Exception as e:  # the ops user gets the reason on the terminal, not only in the log
        os.write(ready_fd, f"error: {e}\n".encode())
        os.close(ready_fd)
        _supervisor_file(workdir).unlink(missing_ok=True)
        return 1
    os.write(ready_fd, b"ok\n")
    os.close(ready_fd)
    reported: set[str] = set()
    while not stop.wait(1.0):
        for name, rc in cluster.daemon_exits().items():
            if name not in reported:
                print(f"supervisor: {name} exited with {rc}", flush=True)
                reported.add(name)
    try:
        cluster.stop()
    finally:
        _supervisor_file(workdir).unlink(missing_ok=True)
    return 0


def cmd_down(workdir: Path, timeout_s: float) -> int:
    sup = _supervisor_alive(workdir)
    if sup:
        stuck = terminate_pids({sup["pid"]: sup["start_ticks"]}, timeout_s=timeout_s,
                               clock=time.monotonic, sleep=time.sleep, poll_interval_s=0.05)
        if stuck:
            print(f"error: supervisor {stuck} did not exit", file=sys.stderr)
            return 1
    rec = _read_json(workdir / "cluster.json")
    if rec and rec.get("state") != "stopped":  # supervisor died without stopping: clean up
        stuck = cleanup_record(rec)
        Path(REGISTRY_DIR, f"{rec['prefix']}-{rec['id']}.json").unlink(missing_ok=True)
        rec["state"] = "stopped"
        write_record(workdir / "cluster.json", rec)
        if stuck:
            print(f"error: processes still alive: {stuck}", file=sys.stderr)
            return 1
    _supervisor_file(workdir).unlink(missing_ok=True)
    print(f"cluster down (logs kept in {workdir}/log)")
    return 0


def cmd_status(workdir: Path) -> int:
    rec = _read_json(workdir / "cluster.json")
    if rec is None:
        print(f"no cluster in {workdir}")
        return 1
    sup = _supervisor_alive(workdir)
    print(f"state {rec['state']}; supervisor {'pid ' + str(sup['pid']) if sup else 'not running'}")
    ok = bool(sup) and rec["state"] == "up"
    for name, pid in rec.get("daemons", {}).items():
        alive = proc_alive(pid, rec["pids"].get(str(pid)))
        ok = ok and alive
        print(f"  {name:16} pid {pid:<8} {'running' if alive else 'dead'}")
    if ok:
        env = dict(os.environ, SLURM_CONF=rec["conf"])
        print(run_cmd(["sinfo", "-N"], env=env, check=False).stdout, end="")
    return 0 if ok else 1


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = p.add_subparsers(dest="cmd", required=True)
    up = sub.add_parser("up", help="start a cluster in DIR under a background supervisor")
    up.add_argument("dir")
    up.add_argument("--nodes", type=int, default=3)
    up.add_argument("--prefix", default=DEFAULT_PREFIX)
    up.add_argument("--timeout-s", type=float, default=60.0)
    up.add_argument("--accounting", action="store_true", help="also MariaDB + slurmdbd (sacct works)")
    down = sub.add_parser("down", help="stop the cluster in DIR (logs are kept)")
    down.add_argument("dir")
    down.add_argument("--timeout-s", type=float, default=30.0)
    st = sub.add_parser("status", help="show daemons and sinfo; exit 0 if up")
    st.add_argument("dir")
    sw = sub.add_parser("sweep", help="remove leftovers of killed runs with this prefix")
    sw.add_argument("--prefix", default=DEFAULT_PREFIX)
    sv = sub.add_parser("_supervise")
    sv.add_argument("dir")
    sv.add_argument("--nodes", type=int, default=3)
    sv.add_argument("--prefix", default=DEFAULT_PREFIX)
    sv.add_argument("--ready-fd", type=int, required=True)
    sv.add_argument("--accounting", action="store_true")
    a = p.parse_args(argv)
    if a.cmd == "sweep":
        print("\n".join(sweep(a.prefix)) or "nothing to sweep")
        return 0
    workdir = Path(a.dir).resolve()
    try:
        if a.cmd == "up":
            return cmd_up(workdir, a.nodes, a.prefix, a.timeout_s, a.accounting)
        if a.cmd == "_supervise":
            return cmd_supervise(workdir, a.nodes, a.prefix, a.ready_fd, a.accounting)
        if a.cmd == "down":
            return cmd_down(workdir, a.timeout_s)
        return cmd_status(workdir)
    except ClusterError as e:
        print(f"error: {e}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
