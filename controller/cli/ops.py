"""The ops view of a running farm: `paddock top`, `paddock agents`, `paddock health`, `paddock drain`.
(`paddock top`'s screen is controller/cli/top.py.)

Every command finds the controller through the run directory: `controller.endpoint` (the bound
ZeroMQ endpoint) and the deployment id from `job.json` (Slurm jobs), `run.json`, or
`local-<run id>` (the local run); `--endpoint`/`--deployment` override. Node states come from
the controller's status (`Client.status()`: live, draining, lost, with the wall time each node
was last seen); `paddock health` reads the JSON-lines stream the agents append to
`<run>/health/<node>.jsonl` and needs no controller.

Must not import: sqlite3, controller.store (it talks to the controller only through
controller.client.api).
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path
from typing import Callable, Iterator, TextIO

from controller.cli import top

TOP_SORTS = tuple(top.SORTS)

COLUMNS = ("node", "state", "last_seen", "slots", "free", "leases", "active", "rate", "cpu",
           "mem_free", "tmpfs", "disk_free", "images", "errors", "version")
NUMERIC = {"slots", "free", "leases", "active", "rate", "cpu", "mem_free", "tmpfs", "disk_free",
           "images", "errors", "last_seen"}


class OpsError(RuntimeError):
    """The ops command cannot find or reach what it needs; the message says what to pass."""


# ----------------------------------------------------------------------------- finding the run
def resolve_run(run: str | None) -> Path:
    if run:
        p = Path(run)
        if not p.is_dir():
            raise OpsError(f"run directory {run} does not exist")
        return p.resolve()
    from controller.analysis.query import newest_run
    try:
        return newest_run("runs")
    except Exception:
        raise OpsError("no run directory given and none under ./runs: pass --run DIR") from None


def controller_address(run_dir: Path, endpoint: str | None = None,
                       deployment: str | None = None) -> tuple[str, str]:
    """(endpoint, deployment) of the run's controller."""
    if endpoint is None:
        f = run_dir / "controller.endpoint"
        if not f.exists():
            raise OpsError(f"{f} does not exist: the controller of this run has not started "
                           "(or pass --endpoint)")
        endpoint = f.read_text().strip()
    if deployment is None:
        for name in ("job.json", "run.json"):
            try:
                deployment = json.loads((run_dir / name).read_text()).get("deployment")
            except (OSError, ValueError):
                continue
            if deployment:
                break
        deployment = deployment or f"local-{run_dir.name}"
    return endpoint, deployment


def fetch_nodes(endpoint: str, deployment: str, timeout_s: float = 3.0,
                key_file: Path | None = None) -> tuple[list[dict], dict]:
    from controller.client.api import Client, ClientError
    try:
        with Client(endpoint, deployment, timeout_s=timeout_s, retries=1, key_file=key_file) as c:
            reply = c.status()
    except ClientError as exc:
        raise OpsError(f"controller at {endpoint} (deployment {deployment}) did not answer: {exc}") from None
    return list(reply.nodes), dict(reply.counts)


# ----------------------------------------------------------------------------- rows
def node_row(n: dict, now_wall: float) -> dict:
    """One table row (COLUMNS) from a status node dict; tolerant of missing fields."""
    h = n.get("health") or {}
    last = n.get("last_seen")
    if isinstance(last, (int, float)) and last > 1e9:         # unix time
        ago = max(now_wall - last, 0.0)
    elif isinstance(n.get("last_seen_s_ago"), (int, float)):
        ago = float(n["last_seen_s_ago"])
    else:
        ago = None
    errors = h.get("errors")
    return {
        "node": n.get("node"), "state": n.get("state"), "last_seen": ago,
        "slots": n.get("slots"), "free": n.get("slots_free", h.get("slots_free")),
        "leases": n.get("leases"), "active": n.get("active"), "rate": h.get("rollouts_per_s"),
        "cpu": h.get("cpu_percent"), "mem_free": h.get("mem_free_mb"), "tmpfs": h.get("tmpfs_used_mb"),
        "disk_free": h.get("disk_free_mb"), "images": h.get("image_mounts"),
        "errors": sum(v for v in errors.values() if isinstance(v, (int, float))) if isinstance(errors, dict) else None,
        "version": n.get("agent_version") or h.get("agent_version"),
    }


def sort_rows(rows: list[dict], column: str, descending: bool = False) -> list[dict]:
    if column not in COLUMNS:
        raise OpsError(f"cannot sort by {column!r}; columns: {', '.join(COLUMNS)}")
    present = [r for r in rows if r.get(column) is not None]
    missing = [r for r in rows if r.get(column) is None]
    key = (lambda r: float(r[column])) if column in NUMERIC else (lambda r: str(r[column]))
    return sorted(present, key=key, reverse=descending) + missing


def _fmt(col: str, v) -> str:
    if v is None:
        return "-"
    if col == "last_seen":
        return f"{v:.1f}s ago"
    if isinstance(v, float):
        return f"{v:.1f}" if col != "rate" else f"{v:.2f}"
    return str(v)


# ----------------------------------------------------------------------------- commands
def cmd_agents(args) -> int:
    run_dir = resolve_run(args.run)
    nodes, _ = fetch_nodes(*controller_address(run_dir, args.endpoint, args.deployment),
                           key_file=run_dir / "controller.key")
    now = time.time()
    if args.json:
        print(json.dumps([node_row(n, now) for n in nodes], indent=1))
        return 0
    print(f"{'node':16} {'state':9} {'last seen':>12}  slots  active  version")
    for n in nodes:
        r = node_row(n, now)
        seen = "-" if r["last_seen"] is None else f"{r['last_seen']:.1f}s ago"
        last = n.get("last_seen")
        stamp = time.strftime("%H:%M:%S", time.localtime(last)) if isinstance(last, (int, float)) and last > 1e9 else ""
        print(f"{str(r['node']):16} {str(r['state']):9} {seen:>12}  {_fmt('slots', r['slots']):>5}  "
              f"{_fmt('active', r['active']):>6}  {_fmt('version', r['version'])} {stamp}".rstrip())
    return 0


def cmd_top(args) -> int:
    from rich.console import Console
    run_dir = resolve_run(args.run)
    endpoint, deployment = controller_address(run_dir, args.endpoint, args.deployment)
    if args.sort not in top.SORTS:
        raise OpsError(f"cannot sort by {args.sort!r}; columns: {', '.join(top.SORTS)}")
    view = top.TopView(run_dir.name, args.sort, args.desc)
    console = Console(width=args.width) if args.width else Console()
    if args.once:
        nodes, counts = fetch_nodes(endpoint, deployment, key_file=run_dir / "controller.key")
        console.print(view.render(nodes, counts, console.size.width, height=10_000))
        return 0
    return top.run_live(view, lambda: fetch_nodes(endpoint, deployment, key_file=run_dir / "controller.key"), args.interval_s,
                        (OpsError,), console)


def follow_lines(paths: Callable[[], list[Path]], follow: bool, poll_s: float = 0.25,
                 stop: Callable[[], bool] = lambda: False) -> Iterator[str]:
    """Complete lines of every file in paths() (re-listed each pass: new nodes appear), then,
    with follow, the lines appended afterwards, until stop()."""
    offsets: dict[Path, int] = {}
    partial: dict[Path, bytes] = {}
    while True:
        got = False
        for p in sorted(paths()):
            try:
                with open(p, "rb") as f:
                    size = os.fstat(f.fileno()).st_size
                    if size < offsets.get(p, 0):       # rotated: start again
                        offsets[p], partial[p] = 0, b""
                    f.seek(offsets.get(p, 0))
                    data = f.read()
            except FileNotFoundError:
                continue
            offsets[p] = offsets.get(p, 0) + len(data)
            buf = partial.get(p, b"") + data
            *lines, partial[p] = buf.split(b"\n")
            for ln in lines:
                if ln.strip():
                    got = True
                    yield ln.decode(errors="replace")
        if not follow or stop():
            return
        if not got:
            time.sleep(poll_s)


STOPPED_SUFFIX = ".stopped"      # the controller writes <endpoint file>.stopped on a clean stop


def cmd_health(args, out: TextIO = sys.stdout, clock: Callable[[], float] = time.monotonic) -> int:
    """Print the health stream; with --follow, keep printing until the run stops. A run with
    no stream is said at once (and, with --follow, waited for at most --wait-s): never a
    silent hang."""
    run_dir = resolve_run(args.run)
    hdir = run_dir / "health"
    endpoint = run_dir / "controller.endpoint"
    stopped = Path(str(endpoint) + STOPPED_SUFFIX)

    def paths() -> list[Path]:
        if args.node:
            return [hdir / f"{args.node}.jsonl"]
        return list(hdir.glob("*.jsonl")) if hdir.is_dir() else []

    def streams() -> list[Path]:
        return [p for p in paths() if p.exists()]

    wait_s = getattr(args, "wait_s", 30.0)
    running = endpoint.exists() and not stopped.exists()
    what = f"node {args.node}" if args.node else "any node agent"
    if not streams():
        if not args.follow or not running:
            state = "the run is not running" if not running else "run `paddock health --follow` to wait for it"
            raise OpsError(f"no health stream from {what} at {hdir} ({state}); node agents write one "
                           f"when started with $PADDOCK_HEALTH_DIR set, as `paddock run` and the Slurm "
                           f"job do")
        print(f"paddock health: no health stream from {what} at {hdir} yet; waiting up to "
              f"{wait_s:g}s for the first sample (Ctrl-C stops)", file=sys.stderr)
    deadline = clock() + wait_s
    printed = False

    def stop() -> bool:
        return stopped.exists() or (not printed and clock() >= deadline)
    try:
        for line in follow_lines(paths, args.follow, stop=stop):
            printed = True
            out.write(line + "\n")
            out.flush()
    except (KeyboardInterrupt, BrokenPipeError):
        return 0
    if not printed:
        raise OpsError(f"no health sample from {what} at {hdir} within {wait_s:g}s")
    if args.follow and stopped.exists():
        print("paddock health: the run's controller stopped; end of the stream", file=sys.stderr)
    return 0


def cmd_drain(args) -> int:
    from controller.client.api import Client, ClientError
    run_dir = resolve_run(args.run)
    endpoint, deployment = controller_address(run_dir, args.endpoint, args.deployment)
    nodes, _ = fetch_nodes(endpoint, deployment, key_file=run_dir / "controller.key")
    known = {n.get("node") for n in nodes}
    if args.node not in known:
        raise OpsError(f"no node {args.node!r} in this farm; nodes: {', '.join(sorted(map(str, known))) or 'none'}")
    try:
        with Client(endpoint, deployment, timeout_s=5, retries=2,
                    key_file=run_dir / "controller.key") as c:
            c.drain(args.node, deadline_s=args.deadline_s)
    except ClientError as exc:
        raise OpsError(f"drain of {args.node} failed: {exc}") from None
    print(f"{args.node}: draining (no new leases; running rollouts finish"
          + (f", the rest go back to the queue after {args.deadline_s:g}s)" if args.deadline_s else ")"))
    return 0


def _guard(fn):
    def run(args) -> int:
        try:
            return fn(args)
        except OpsError as exc:
            print(f"paddock {args.command}: {exc}", file=sys.stderr)
            return 2
    return run


def register(subparsers: argparse._SubParsersAction) -> None:
    """Add `paddock top`, `paddock agents`, `paddock health`, `paddock drain`."""
    def common(p):
        p.add_argument("--run", metavar="DIR", help="run directory (default: newest under ./runs)")
        p.add_argument("--endpoint", help="controller endpoint (default: RUN/controller.endpoint)")
        p.add_argument("--deployment", help="deployment id (default: from the run directory)")
    top = subparsers.add_parser("top", help="live view of the node agents (q or Ctrl-C quits)")
    common(top)
    top.add_argument("--sort", default="node", metavar="COLUMN",
                     help=f"column to sort by: {', '.join(TOP_SORTS)}")
    top.add_argument("--desc", action="store_true", help="sort descending")
    top.add_argument("--interval-s", type=float, default=1.0)
    top.add_argument("--once", action="store_true", help="print one table and exit")
    top.add_argument("--width", type=int, help="console width (default: the terminal's)")
    top.set_defaults(func=_guard(cmd_top))
    ag = subparsers.add_parser("agents", help="node agents and their states (live/draining/lost, last seen)")
    common(ag)
    ag.add_argument("--json", action="store_true")
    ag.set_defaults(func=_guard(cmd_agents))
    he = subparsers.add_parser("health", help="node-agent health stream (JSON lines)")
    he.add_argument("--run", metavar="DIR")
    he.add_argument("--node", help="only this node")
    he.add_argument("--follow", "-f", action="store_true",
                    help="keep printing new samples until the run's controller stops")
    he.add_argument("--wait-s", type=float, default=30.0,
                    help="with --follow: how long to wait for a first sample (default 30)")
    he.set_defaults(func=_guard(cmd_health))
    dr = subparsers.add_parser("drain", help="drain one node: no new leases, running rollouts finish")
    common(dr)
    dr.add_argument("node")
    dr.add_argument("--deadline-s", type=float, help="after this, its unfinished leases return to the queue")
    dr.set_defaults(func=_guard(cmd_drain))
