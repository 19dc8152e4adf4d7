"""`paddock top`'s screen: per node slots busy/free, sandboxes, memory and disk headroom,
heartbeat age, rollouts/s and error rate, lost and draining nodes marked, in a layout that
fits an 80x24 terminal and uses the room of a wide one.

`TopView` turns the controller's status (a list of node dicts and the queue counts) into one
rich renderable; it remembers the previous frame's error counters to give an error rate. The
loop (`run_live`) redraws in the terminal's alternate screen (rich Live, no scrolling, no
flicker), reads keys in cbreak mode and returns on `q` or Ctrl-C with the terminal restored.

Pure apart from `run_live` (terminal I/O); Must not import: zmq, sqlite3,
controller.client (the status comes in through a callable).
"""
from __future__ import annotations

import contextlib
import os
import select
import sys
import time
from dataclasses import dataclass, field
from typing import Callable

from rich import box
from rich.console import Console, Group
from rich.table import Table
from rich.text import Text

LONG_COLS = 100          # from this width on the headings are spelled out
WIDE_COLS = 132          # from this width on the extra columns appear
CHROME_ROWS = 8          # title, table borders and heading, footer: rows that are not nodes
# (short heading, long heading, justify, min width) of the columns every layout has
COLUMNS = (("NODE", "NODE", "left", 8), ("STATE", "STATE", "left", 5),
           ("SLOTS", "BUSY/SLOTS", "right", 5), ("SBX", "SANDBOXES", "right", 3),
           ("MEM", "MEM FREE", "right", 5), ("DISK", "DISK FREE", "right", 5),
           ("HB", "HB AGE", "right", 4), ("R/S", "ROLL/S", "right", 4),
           ("ERR/M", "ERR/MIN", "right", 5))
EXTRA = (("CPU%", "right", 4), ("TMPFS", "right", 5), ("POOL", "right", 6), ("LEASES", "right", 3),
         ("VERSION", "left", 7))
KEY = ("SLOTS busy/all  SBX sandboxes  MEM, DISK free  HB heartbeat age  "
       "R/S rollouts/s  ERR/M errors/min")
# --sort names (the agents' column names too) -> the row key they sort by
SORTS = {"node": "node", "state": "state", "last_seen": "hb_age", "hb_age": "hb_age",
         "slots": "slots", "free": "free", "busy": "busy", "active": "busy",
         "sandboxes": "sandboxes", "rate": "rate", "cpu": "cpu", "mem_free": "mem_free",
         "disk_free": "disk_free", "tmpfs": "tmpfs", "errors": "errors",
         "err_per_min": "err_per_min", "leases": "leases", "version": "version",
         "pool": "pool_hit", "images": "images"}
STATE_MARK = {"live": ("live", ""), "draining": ("DRAIN", "bold yellow"),
              "drained": ("drained", "dim"), "lost": ("LOST", "bold red")}
GONE = ("lost", "drained")      # nodes that hold no slot any more


def mb(v) -> str:
    """Megabytes for reading: 512M, 3.4G, 1.2T."""
    if not isinstance(v, (int, float)):
        return "-"
    if v >= 1024 * 1024:
        return f"{v / 1024 / 1024:.1f}T"
    if v >= 1024:
        return f"{v / 1024:.1f}G"
    return f"{v:.0f}M"


def age(s) -> str:
    if not isinstance(s, (int, float)):
        return "-"
    if s < 10:
        return f"{s:.1f}s"
    if s < 120:
        return f"{s:.0f}s"
    if s < 7200:
        return f"{s / 60:.0f}m"
    return f"{s / 3600:.0f}h"


def rate(v, digits: int = 2) -> str:
    return "-" if not isinstance(v, (int, float)) else f"{v:.{digits}f}"


@dataclass
class TopView:
    """Frames of `paddock top`; `errors_seen` holds (time, error total) per node from the
    previous frame, for the error rate."""
    run_name: str
    sort: str = "node"
    desc: bool = False
    errors_seen: dict[str, tuple[float, float]] = field(default_factory=dict)

    def rows(self, nodes: list[dict], now_wall: float, now_mono: float) -> list[dict]:
        out = []
        for n in nodes:
            h = n.get("health") or {}
            slots = n.get("slots", h.get("slots"))
            free = n.get("slots_free", h.get("slots_free"))
            errs = h.get("errors")
            total = (sum(v for v in errs.values() if isinstance(v, (int, float)))
                     if isinstance(errs, dict) else None)
            last = n.get("last_seen")
            out.append({
                "node": str(n.get("node")), "state": n.get("state") or "?",
                "busy": (0 if n.get("state") in GONE else (slots - free)
                         if isinstance(slots, int) and isinstance(free, int) else None),
                "images": h.get("image_mounts"),
                "slots": slots, "free": free, "sandboxes": h.get("sandboxes_active"),
                "mem_free": h.get("mem_free_mb"), "mem_percent": h.get("mem_percent"),
                "disk_free": h.get("disk_free_mb"), "tmpfs": h.get("tmpfs_used_mb"),
                "hb_age": max(now_wall - last, 0.0) if isinstance(last, (int, float)) else None,
                "rate": h.get("rollouts_per_s"), "errors": total,
                "err_per_min": self._error_rate(str(n.get("node")), total, now_mono),
                "cpu": h.get("cpu_percent"), "leases": n.get("leases"),
                "pool": h.get("warm_pool"), "pool_hit": _hit_rate(h),
                "version": n.get("agent_version") or h.get("agent_version")})
        col = SORTS.get(self.sort, self.sort)
        known = sorted((r for r in out if r.get(col) is not None),
                       key=lambda r: (r[col], r["node"]), reverse=self.desc)
        return known + [r for r in out if r.get(col) is None]      # unknown values last

    def _error_rate(self, node: str, total, now: float):
        if total is None:
            return None
        prev = self.errors_seen.get(node)
        self.errors_seen[node] = (now, total)
        if prev is None or now <= prev[0]:
            return None
        return max(total - prev[1], 0) / (now - prev[0]) * 60.0

    def render(self, nodes: list[dict], counts: dict, width: int, height: int,
               now_wall: float | None = None, now_mono: float | None = None,
               problem: str | None = None):
        """One frame for a `width` x `height` terminal."""
        rows = self.rows(nodes, time.time() if now_wall is None else now_wall,
                         time.monotonic() if now_mono is None else now_mono)
        wide, long = width >= WIDE_COLS, width >= LONG_COLS
        room = max(height - CHROME_ROWS, 1)
        shown = rows if len(rows) <= room else rows[:room - 1]
        table = Table(box=box.SQUARE, padding=(0, 1), expand=False, show_edge=True,
                      header_style="bold")
        cols = [(lng if long else short, j, w) for short, lng, j, w in COLUMNS]
        for name, justify, min_w in cols + (list(EXTRA) if wide else []):
            table.add_column(name, justify=justify, min_width=min_w, no_wrap=True,
                             overflow="ellipsis")
        for r in shown:
            label, style = STATE_MARK.get(r["state"], (r["state"], ""))
            cells = [r["node"], label, f"{_n(r['busy'])}/{_n(r['slots'])}", _n(r["sandboxes"]),
                     mb(r["mem_free"]), mb(r["disk_free"]), age(r["hb_age"]), rate(r["rate"]),
                     rate(r["err_per_min"], 1)]
            if wide:
                cells += [rate(r["cpu"], 0), mb(r["tmpfs"]), _pool(r), _n(r["leases"]), str(r["version"] or "-")]
            table.add_row(*cells, style=style)
        return Group(self._title(rows, counts, width), table,
                     self._footer(rows, shown, counts, width, problem, key=not long))

    def _title(self, rows: list[dict], counts: dict, width: int) -> Text:
        states = {s: sum(r["state"] == s for r in rows) for s in ("live", "draining", "drained", "lost")}
        busy = sum(r["busy"] or 0 for r in rows if r["state"] not in GONE)
        slots = sum(r["slots"] or 0 for r in rows if r["state"] not in GONE)
        total_rate = sum(r["rate"] or 0 for r in rows)
        t = Text(f"paddock top {self.run_name}  nodes {len(rows)}: live {states['live']}", style="bold")
        if states["draining"]:
            t.append(f", draining {states['draining']}", style="bold yellow")
        if states["drained"]:
            t.append(f", drained {states['drained']}", style="dim")
        if states["lost"]:
            t.append(f", lost {states['lost']}", style="bold red")
        t.append(f"  slots {busy}/{slots} busy  {total_rate:.2f} roll/s")
        t.truncate(width, overflow="ellipsis")
        return t

    def _footer(self, rows, shown, counts: dict, width: int, problem: str | None,
                key: bool) -> Text:
        t = Text()
        if key:
            t.append(KEY[:width] + "\n", style="dim")
        if len(shown) < len(rows):
            hidden = rows[len(shown):]
            t.append(f"... {len(hidden)} more nodes (lost {sum(r['state'] == 'lost' for r in hidden)}, "
                     f"draining {sum(r['state'] == 'draining' for r in hidden)}); widen or --sort\n",
                     style="italic")
        queue = " ".join(f"{k}={v}" for k, v in sorted(counts.items()))
        line = Text(f"queue {queue or '-'}", style="dim")
        line.truncate(width, overflow="ellipsis")
        t.append_text(line)
        t.append("\n")
        if problem:
            t.append(problem[: max(width - 1, 10)], style="bold red")
            t.append("\n")
        t.append(f"q quit  sorted by {self.sort}{' (desc)' if self.desc else ''}", style="dim")
        return t


def _n(v) -> str:
    return "-" if v is None else str(v)


def _hit_rate(h: dict) -> float | None:
    """The share of sandbox acquires a warm pool served ready (None before the first)."""
    hits, misses = h.get("pool_hits"), h.get("pool_misses")
    if not isinstance(hits, int) or not isinstance(misses, int) or hits + misses == 0:
        return None
    return hits / (hits + misses)


def _pool(r: dict) -> str:
    """POOL: ready sandboxes and the hit rate, e.g. `2 93%`."""
    if r["pool"] is None:
        return "-"
    return f"{r['pool']} {r['pool_hit'] * 100:.0f}%" if r["pool_hit"] is not None else str(r["pool"])


@contextlib.contextmanager
def cbreak(stream):
    """Keys arrive one at a time without echo while inside; the terminal is restored after
    (also on an exception). A stream that is not a terminal is left alone."""
    try:
        import termios
        import tty
        fd = stream.fileno()
        old = termios.tcgetattr(fd)
    except (ImportError, OSError, ValueError, AttributeError):
        yield None
        return
    try:
        tty.setcbreak(fd, termios.TCSANOW)     # keys typed before the first frame still count
        yield fd
    finally:
        termios.tcsetattr(fd, termios.TCSADRAIN, old)


def wait_key(fd: int | None, timeout_s: float) -> str | None:
    """A key pressed within `timeout_s` (None: none, or no terminal to read)."""
    if fd is None:
        time.sleep(timeout_s)
        return None
    ready, _, _ = select.select([fd], [], [], timeout_s)
    if not ready:
        return None
    data = os.read(fd, 32)
    return data.decode(errors="replace") if data else "q"      # EOF: the terminal went away


def run_live(view: TopView, fetch: Callable[[], tuple[list[dict], dict]], interval_s: float,
             errors: tuple[type[Exception], ...], console: Console | None = None,
             keys=sys.stdin) -> int:
    """Redraw every `interval_s` until `q` (or Ctrl-C). When `fetch` raises one of `errors`
    (the controller does not answer), the message is shown under the last good frame and
    the next frame tries again."""
    from rich.live import Live
    console = console or Console()
    nodes, counts, problem = [], {}, None

    def frame():
        nonlocal nodes, counts, problem
        try:
            nodes, counts = fetch()
            problem = None
        except errors as exc:
            problem = str(exc)
        return view.render(nodes, counts, console.size.width, console.size.height, problem=problem)
    try:
        with cbreak(keys) as fd, Live(frame(), console=console, screen=True, auto_refresh=False,
                                      transient=True) as live:
            while True:
                key = wait_key(fd, interval_s)
                if key and key.lower().startswith("q"):
                    return 0
                live.update(frame(), refresh=True)
    except KeyboardInterrupt:
        return 0
