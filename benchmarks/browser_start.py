"""Browser sandboxes: start time against a cold host chromium, and many at once with their memory.

Start (`--starts N`, side by side, alternating, after one of each that is reported apart: the
node's first browser sandbox mounts the image): *sandbox* = create a sandbox of the browser image
with its relay socket, start the shop app (uid 1000) and chromium (uid 1001, over the bridge),
attach over DevTools, load the shop's start page and read its accessibility tree; *host* = a
cold `chromium --headless --remote-debugging-pipe` on this host with the same flags and a fresh
profile, driven over its pipe by the same CDP client, loading the same app (served on the host by
the same shop.py) and reading the same tree. p50/p99 of each and their ratio.

Concurrency (`--concurrent 8,16`): K browser sandboxes started at once (threads), held until
every one is ready, then each reads its tree once more; memory per sandbox as the sandbox's
memory cgroup usage (processes, tmpfs, page cache charged to it), the PSS of its processes
(psutil over the cgroup's tasks) and the drop of MemAvailable divided by K.

    PYTHONPATH=. .venv/bin/python benchmarks/browser_start.py --starts 10 --concurrent 8,16
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import psutil

from controller.taskbank.webtasks import LIMITS, SEED_SQL
from layers.builtin import default_store_root, ensure_browser_image
from layers.store import ImageStore
from nodeagent.browser.apps import shop
from nodeagent.browser.cdp import Cdp
from nodeagent.browser.session import CHROMIUM_FLAGS, BrowserSession
from nodeagent.harness.browser_tools import BrowserToolbox
from nodeagent.sandbox.runtime import SandboxRuntime, SandboxSpec

MIB = 1 << 20
HOST_PORT = 18181


def pct(xs: list[float], p: float) -> float:
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(round(p / 100 * (len(xs) - 1))))]


def mem_available() -> int:
    with open("/proc/meminfo") as f:
        return next(int(ln.split()[1]) * 1024 for ln in f if ln.startswith("MemAvailable:"))


def sandbox_start(rt: SandboxRuntime, image: Path) -> tuple[float, object, BrowserSession, dict]:
    t0 = time.monotonic()
    bs = BrowserSession()
    sb = rt.create(SandboxSpec(image=image, limits={"memory_mb": LIMITS.memory_mb, "pids": LIMITS.pids,
                                                    "disk_mb": LIMITS.disk_mb, "nofile": LIMITS.nofile},
                               egress_socket=bs.path))
    created = time.monotonic() - t0
    bs.start(sb, SEED_SQL)
    BrowserToolbox(bs).tree()
    return time.monotonic() - t0, sb, bs, {"create_s": created, **bs.timings}


class HostApp:
    """The same shop.py, served on the host for the host chromium."""

    def __init__(self) -> None:
        self.dir = tempfile.mkdtemp(prefix="paddock-bench-app-")
        cfg = {"db": f"{self.dir}/app.db", "port": HOST_PORT, "key_hex": "00" * 32, "seed_sql": SEED_SQL,
               "seed_digest": shop.seed_digest(SEED_SQL), "ready_file": f"{self.dir}/ready"}
        Path(self.dir, "cfg.json").write_text(json.dumps(cfg))
        self.proc = subprocess.Popen([sys.executable, shop.__file__, "serve", f"{self.dir}/cfg.json"])
        deadline = time.monotonic() + 10
        while not Path(self.dir, "ready").exists():
            assert time.monotonic() < deadline, "the host app did not start"
            time.sleep(0.02)

    def close(self) -> None:
        self.proc.kill()
        self.proc.wait()
        shutil.rmtree(self.dir, ignore_errors=True)


def host_start() -> float:
    """A cold host chromium over its DevTools pipe: start, attach, load the app, read the tree."""
    import socket
    t0 = time.monotonic()
    profile = tempfile.mkdtemp(prefix="paddock-bench-chromium-")
    ours, theirs = socket.socketpair()
    # chromium's fd 3 (commands in) and fd 4 (replies out): both ends of one socketpair half
    fd = theirs.fileno()
    proc = subprocess.Popen(["chromium", *CHROMIUM_FLAGS, f"--user-data-dir={profile}", "about:blank"],
                            pass_fds=(3, 4), stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL,
                            preexec_fn=lambda: (os.dup2(fd, 3), os.dup2(fd, 4)))
    try:
        cdp = Cdp(ours)
        page = next(t for t in cdp.call("Target.getTargets", timeout_s=30)["targetInfos"] if t["type"] == "page")
        sid = cdp.call("Target.attachToTarget", {"targetId": page["targetId"], "flatten": True})["sessionId"]
        cdp.call("Page.enable", session=sid)
        cdp.call("Page.navigate", {"url": f"http://127.0.0.1:{HOST_PORT}/"}, session=sid)
        cdp.wait_event("Page.loadEventFired", 10, sid)
        cdp.call("Accessibility.getFullAXTree", session=sid)
        return time.monotonic() - t0
    finally:
        proc.kill()
        proc.wait()
        ours.close()
        theirs.close()
        shutil.rmtree(profile, ignore_errors=True)


def bench_starts(rt, image, n: int) -> None:
    app = HostApp()
    ours, host, stages = [], [], []
    try:
        t, sb, bs, _ = sandbox_start(rt, image)      # the node's first: mounts the image
        sb.destroy()
        bs.close()
        print(f"first browser sandbox on this node (image mount, cold cache): {t:.2f} s; "
              f"first host chromium: {host_start():.2f} s")
        for i in range(n):
            t, sb, bs, st = sandbox_start(rt, image)
            sb.destroy()
            bs.close()
            ours.append(t)
            stages.append(st)
            host.append(host_start())
            print(f"  start {i + 1}/{n}: sandbox {t:.2f} s   host chromium {host[-1]:.2f} s", flush=True)
    finally:
        app.close()
    print(f"browser sandbox start (create + app + chromium + page + tree): p50 {pct(ours, 50):.2f} s  "
          f"p99 {pct(ours, 99):.2f} s")
    print(f"cold host chromium (start + page + tree):                     p50 {pct(host, 50):.2f} s  "
          f"p99 {pct(host, 99):.2f} s")
    print(f"ratio sandbox/host: p50 {pct(ours, 50) / pct(host, 50):.2f}  p99 {pct(ours, 99) / pct(host, 99):.2f}")
    for key in ("create_s", "app_s", "bridge_s", "ready_s"):
        print(f"  stage {key}: p50 {statistics.median(s[key] for s in stages):.2f} s")


def sandbox_memory(sb) -> tuple[int, int]:
    mdir = sb.cgroup_paths.get("memory")
    usage, pss = 0, 0
    if mdir:
        for name in ("memory.current", "memory.usage_in_bytes"):
            p = Path(mdir, name)
            if p.exists():
                usage = int(p.read_text())
                break
        procs = Path(mdir, "cgroup.procs")
        for pid in (int(x) for x in procs.read_text().split()) if procs.exists() else ():
            try:
                pss += psutil.Process(pid).memory_full_info().pss
            except (psutil.Error, OSError):
                pass
    return usage, pss


def bench_concurrent(rt, image, k: int) -> None:
    before = mem_available()
    held, errors, lat = [], [], []
    lock = threading.Lock()

    def one():
        try:
            t, sb, bs, _ = sandbox_start(rt, image)
            with lock:
                held.append((sb, bs))
                lat.append(t)
        except Exception as exc:  # noqa: BLE001 - reported
            with lock:
                errors.append(repr(exc)[:200])

    t0 = time.monotonic()
    threads = [threading.Thread(target=one) for _ in range(k)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    wall = time.monotonic() - t0
    time.sleep(1.0)
    try:
        drop = before - mem_available()
        mem = [sandbox_memory(sb) for sb, _ in held]
        ok = sum(1 for _, bs in held if "RootWebArea" in BrowserToolbox(bs).tree())
        n = max(len(held), 1)
        print(f"{k} concurrent browser sandboxes: {len(held)} ready ({len(errors)} failed) in {wall:.1f} s; "
              f"start p50 {pct(lat, 50) if lat else 0:.1f} s p99 {pct(lat, 99) if lat else 0:.1f} s; "
              f"{ok} answered a tree")
        print(f"  memory per sandbox: cgroup usage {sum(m[0] for m in mem) / n / MIB:.0f} MiB, "
              f"PSS {sum(m[1] for m in mem) / n / MIB:.0f} MiB, MemAvailable drop {drop / n / MIB:.0f} MiB")
        for e in errors[:3]:
            print("  error:", e)
    finally:
        for sb, bs in held:
            sb.destroy()
            bs.close()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--starts", type=int, default=10)
    ap.add_argument("--concurrent", default="", help="comma-separated counts, e.g. 8,16,32")
    args = ap.parse_args()
    image = ensure_browser_image(ImageStore(default_store_root()))[1]
    print(f"host: {os.cpu_count()} cores, load {os.getloadavg()[0]:.1f}; MemAvailable {mem_available() / MIB:.0f} MiB")
    with SandboxRuntime() as rt:
        if args.starts:
            bench_starts(rt, image, args.starts)
        for k in (int(x) for x in args.concurrent.split(",") if x):
            bench_concurrent(rt, image, k)


if __name__ == "__main__":
    main()
