"""Model servers inside the allocation: the `paddock job server` step (one per node of a server
component: inference, judge, services; slurm/components.py) and what the head does with them.

`run_server(ServerStep)` runs your server command (vLLM, SGLang, any OpenAI-compatible server)
by /bin/sh in its own process group with $PADDOCK_SERVER_PORT and $PADDOCK_SERVER_HOST set,
GETs http://NODE:PORT<health> until it answers 200 (at most `ready_wait_s`; the server's exit
or the deadline is an error naming the log), then publishes its endpoint atomically as
`<run_dir>/servers/<component>/<node>.json` (a server that fails writes `<node>.failed` with the
error, and the head stops waiting at once):

    {"component", "node", "url": "http://ADDR:PORT/v1", "base": "http://ADDR:PORT",
     "reload": "/path" or "", "deployment", "incarnation"}

and serves until the head writes `servers/stop` for this run (`stop_servers`), the step gets
SIGTERM (scancel; the job ends), or the server exits (its status is the step's). The server is
stopped with SIGTERM to its process group, SIGKILL after STOP_GRACE_S. The job's drain signal
(SIGWINCH) is ignored: running rollouts still call the model while the farm drains.

The head (slurm/jobsteps.py) waits for every replica (`wait_servers`), hands the endpoints to
your trainer ($PADDOCK_<COMPONENT>_ENDPOINTS: space-separated `.../v1` URLs; the full records in
`servers.json`) and publishes a policy version served by several replicas as their URLs
separated by spaces; the node gateway spreads rollouts over them
(nodeagent.gateway.session.replica). A weight update reaches every replica through
`reload_replicas` (POST the component's `reload` path on each, in parallel; every replica must
answer 2xx, else ReloadError naming those that did not). The built-in scripted trainer drives
replicas of the scripted policy server this way (`RemotePolicy`: reload `/admin/policies`).

Must not import: zmq, sqlite3, nodeagent.*.
"""
from __future__ import annotations

import json
import logging
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

from controller.ondisk.fileio import atomic_write

log = logging.getLogger("paddock.job")

SERVERS_DIR = "servers"
STOP_FILE = "stop"
SERVERS_FILE = "servers.json"
STOP_GRACE_S = 30.0
HEALTH_TIMEOUT_S = 2.0
EXIT_SERVER_FAILED = 5


class ServerError(RuntimeError):
    """A server did not come up (or a replica is missing); the message says which and where to look."""


class ReloadError(RuntimeError):
    """A weight update did not reach every replica."""


@dataclass(frozen=True)
class ServerStep:
    """Settings of `paddock job server` (the command line's flags, one field each)."""
    component: str
    run_dir: str
    deployment: str
    command: str
    port: int = 8000
    health: str = "/health"
    reload: str = ""
    ready_wait_s: float = 600.0
    poll_s: float = 0.5


def incarnation() -> str:
    return os.environ.get("SLURM_RESTART_COUNT", "0")


def _healthy(url: str) -> bool:
    try:
        with urllib.request.urlopen(url, timeout=HEALTH_TIMEOUT_S) as r:
            return r.status == 200
    except (OSError, urllib.error.HTTPError, ValueError):
        return False


def _stop_requested(run_dir: Path, deployment: str) -> bool:
    try:
        stop = json.loads((run_dir / SERVERS_DIR / STOP_FILE).read_text())
    except (OSError, ValueError):
        return False
    return stop.get("deployment") == deployment and str(stop.get("incarnation")) == incarnation()


def _group_alive(pgid: int) -> bool:
    """A process of group `pgid` is still running (zombies, which an init may reap late, are not)."""
    for d in Path("/proc").iterdir():
        if not d.name.isdigit():
            continue
        try:
            fields = (d / "stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(fields[2]) == pgid and fields[0] != "Z":
            return True
    return False


def _stop(proc: subprocess.Popen, clock: Callable[[], float] = time.monotonic) -> int:
    """SIGTERM to the server's process group, SIGKILL after STOP_GRACE_S; returns once every
    process of the group is gone (the shell may exit before the server it started)."""
    for sig, wait_s in ((signal.SIGTERM, STOP_GRACE_S), (signal.SIGKILL, 10.0)):
        try:
            os.killpg(proc.pid, sig)
        except ProcessLookupError:
            break
        deadline = clock() + wait_s
        while clock() < deadline:
            proc.poll()
            if not _group_alive(proc.pid):
                return proc.wait()
            time.sleep(0.05)
    return proc.wait()


def run_server(args: ServerStep, addr: str, clock: Callable[[], float] = time.monotonic,
               stopping: dict | None = None) -> int:
    """The server step on this node; returns its exit status (0 once stopped by the head).
    It installs its SIGTERM handler, unless `stopping` is given: a {"signal": None} the caller
    sets to stop it (a test running it in a thread)."""
    run_dir = Path(args.run_dir)
    node = socket.gethostname()
    if stopping is None:
        stopping = {"signal": None}

        def on_term(signum, _frame):
            stopping["signal"] = signal.Signals(signum).name
        signal.signal(signal.SIGTERM, on_term)
        signal.signal(signal.SIGWINCH, signal.SIG_IGN)     # the drain: rollouts still call the model
    env = dict(os.environ, PADDOCK_SERVER_PORT=str(args.port), PADDOCK_SERVER_HOST=addr,
               PADDOCK_COMPONENT=args.component, PADDOCK_RUN_DIR=str(run_dir))
    print(f"paddock {args.component} on {node}: starting: {args.command}", flush=True)
    proc = subprocess.Popen(["/bin/sh", "-c", args.command], env=env, stdin=subprocess.DEVNULL,
                            start_new_session=True)
    base = f"http://{addr}:{args.port}"
    started = clock()
    try:
        while not _healthy(base + args.health):
            if proc.poll() is not None:
                raise ServerError(f"{args.component} server on {node} exited with {proc.returncode} before "
                                  f"{base}{args.health} answered; see {run_dir}/logs/{args.component}.log")
            if stopping["signal"]:
                print(f"paddock {args.component} on {node}: {stopping['signal']} before it was up", flush=True)
                return 0
            if clock() - started > args.ready_wait_s:
                raise ServerError(f"{args.component} server on {node}: {base}{args.health} did not answer 200 "
                                  f"within {args.ready_wait_s:.0f}s; see {run_dir}/logs/{args.component}.log")
            time.sleep(args.poll_s)
        ready_s = clock() - started
        record = {"component": args.component, "node": node, "url": base + "/v1", "base": base,
                  "reload": args.reload, "deployment": args.deployment, "incarnation": incarnation(),
                  "ready_s": round(ready_s, 3)}
        out = run_dir / SERVERS_DIR / args.component
        out.mkdir(parents=True, exist_ok=True)
        atomic_write(out / f"{node}.json", json.dumps(record))
        print(f"paddock {args.component} on {node}: healthy at {base} after {ready_s:.1f}s; published", flush=True)
        while proc.poll() is None and not stopping["signal"] and not _stop_requested(run_dir, args.deployment):
            time.sleep(args.poll_s)
        if proc.poll() is not None:
            print(f"paddock {args.component} on {node}: the server exited with {proc.returncode}",
                  file=sys.stderr, flush=True)
            return proc.returncode or EXIT_SERVER_FAILED
        print(f"paddock {args.component} on {node}: stopping the server", flush=True)
        _stop(proc)
        return 0
    except ServerError as exc:
        print(f"paddock {args.component}: {exc}", file=sys.stderr, flush=True)
        _stop(proc)
        out = run_dir / SERVERS_DIR / args.component       # the head stops waiting at once
        out.mkdir(parents=True, exist_ok=True)
        atomic_write(out / f"{node}.failed", json.dumps({"deployment": args.deployment, "incarnation": incarnation(),
                                                         "node": node, "error": str(exc)}))
        return EXIT_SERVER_FAILED
    finally:
        if proc.poll() is None:
            _stop(proc)


# ----------------------------------------------------------------------------- the head's side
def parse_servers(text: str) -> dict[str, int]:
    """"inference=2,judge=1" (the head's --servers) -> {"inference": 2, "judge": 1}."""
    out = {}
    for item in filter(None, text.split(",")):
        name, _, n = item.partition("=")
        try:
            out[name] = int(n)
        except ValueError:
            raise ServerError(f"--servers: {item!r} is not COMPONENT=COUNT") from None
    return out


def published(run_dir: Path, component: str, deployment: str, suffix: str = ".json") -> list[dict]:
    """The endpoints of this run's replicas of `component` (stale runs' files are skipped);
    with suffix ".failed", the replicas that failed to come up."""
    out = []
    for f in sorted((run_dir / SERVERS_DIR / component).glob("*" + suffix)):
        try:
            rec = json.loads(f.read_text())
        except (OSError, ValueError):
            continue
        if rec.get("deployment") == deployment and str(rec.get("incarnation")) == incarnation():
            out.append(rec)
    return out


def wait_servers(run_dir: Path, want: dict[str, int], deployment: str, timeout_s: float,
                 clock: Callable[[], float] = time.monotonic, poll_s: float = 0.2) -> dict[str, list[dict]]:
    """{component: [endpoint record, ...]} once every replica of every component is published;
    ServerError naming the components short of replicas after timeout_s."""
    deadline = clock() + timeout_s
    while True:
        got = {c: published(run_dir, c, deployment) for c in want}
        short = {c: (len(got[c]), n) for c, n in want.items() if len(got[c]) < n}
        failed = [r for c in short for r in published(run_dir, c, deployment, ".failed")]
        if failed:
            raise ServerError("; ".join(f"{r['error']}" for r in failed))
        if not short:
            atomic_write(run_dir / SERVERS_FILE, json.dumps(got, indent=1))
            return got
        if clock() >= deadline:
            raise ServerError("model servers not up after %.0fs: %s; see %s" % (
                timeout_s, ", ".join(f"{c} {h} of {n}" for c, (h, n) in short.items()),
                ", ".join(f"logs/{c}.log" for c in short)))
        time.sleep(poll_s)


def stop_servers(run_dir: Path, deployment: str) -> None:
    """Tell this run's server steps to stop their servers and exit."""
    d = run_dir / SERVERS_DIR
    d.mkdir(parents=True, exist_ok=True)
    atomic_write(d / STOP_FILE, json.dumps({"deployment": deployment, "incarnation": incarnation()}))


def endpoints_env(servers: dict[str, list[dict]]) -> dict[str, str]:
    """$PADDOCK_<COMPONENT>_ENDPOINTS for your trainer: space-separated `.../v1` URLs."""
    return {f"PADDOCK_{c.upper()}_ENDPOINTS": " ".join(r["url"] for r in recs) for c, recs in servers.items()}


def reload_replicas(records: list[dict], body: Any, timeout_s: float = 600.0, path: str | None = None) -> list[int]:
    """A weight update on every replica: POST `body` (JSON) to each one's `reload` path (or
    `path`, e.g. vLLM's "/sleep?level=2" then "/wake_up" around your own weight transfer), in
    parallel. Returns the HTTP statuses; ReloadError names the replicas that did not answer 2xx."""
    def post(rec: dict) -> tuple[dict, int | str]:
        where = path or rec.get("reload")
        if not where:
            return rec, "no reload path"
        req = urllib.request.Request(rec["base"] + where, data=json.dumps(body).encode(),
                                     headers={"Content-Type": "application/json"}, method="POST")
        try:
            with urllib.request.urlopen(req, timeout=timeout_s) as r:
                return rec, r.status
        except urllib.error.HTTPError as exc:
            return rec, exc.code
        except OSError as exc:
            return rec, str(exc)
    with ThreadPoolExecutor(max_workers=max(len(records), 1)) as pool:
        results = list(pool.map(post, records))
    bad = [f"{rec['node']} ({rec.get('base')}{path or rec.get('reload')}): {st}" for rec, st in results
           if not (isinstance(st, int) and 200 <= st < 300)]
    if bad or not records:
        raise ReloadError("weight update did not reach every replica: " + ("; ".join(bad) or "no replicas"))
    return [st for _, st in results]


class RemotePolicy:
    """The built-in trainer's policy when the scripted policy server runs as the job's
    inference component: `set_policy` reaches every replica (POST /admin/policies), `url` is
    their URLs (the gateway spreads rollouts over them)."""

    def __init__(self, records: list[dict]) -> None:
        self.records = [dict(r, reload=r.get("reload") or "/admin/policies") for r in records]
        self.url = " ".join(r["url"] for r in records)

    def set_policy(self, version: int, params: Any) -> bool:
        reload_replicas(self.records, {"version": version, "params": params})
        return True
