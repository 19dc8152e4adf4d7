"""One rollout's browser: the task's web app and a headless chromium inside its sandbox.

`BrowserSession()` listens on a fresh Unix socket (`path`, mode 0666 in a 0711 directory); the
sandbox is created with it as its relay socket (`SandboxSpec.egress_socket`), so 127.0.0.1:3128
inside the sandbox reaches this process and nothing else: the sandbox keeps no network but
loopback. `start(sandbox, seed_sql)`:

1. as in-sandbox uid `APP_UID` (1000), in a 0700 directory that uid owns: the app
   (`nodeagent/browser/apps/shop.py`) over a database made from the schema and the task's seed,
   served on 127.0.0.1:`port`, with a fresh audit key (32 random bytes) that only the app and
   this process know (its config file is deleted once read);
2. as uid `BROWSER_UID` (1001), in its own 0700 directory: the bridge
   (`nodeagent/browser/bridge.py`), which starts chromium with `--remote-debugging-pipe` and
   connects back through the relay, proving itself with a per-rollout nonce;
3. attaches to the page target (flat sessions) and opens the app's start page.

The agent's root in the sandbox could read any of these uids' files, which is why a web task
offers the browser tools only (no shell): its one way to act is the page. `capture(sandbox)`
reads the database file through the sandbox's file operations (not through the workload) for
grading; the key goes to the grader with it. Any failure to start is `BrowserStartError` (an
infrastructure error: the rollout is retried, never scored 0).
Must not import: zmq, controller.* outside contracts, nodeagent.agent, nodeagent.verifier.
"""
from __future__ import annotations

import json
import os
import secrets
import shutil
import socket
import tempfile
import time
from pathlib import Path
from typing import Callable

from nodeagent.browser.apps import shop
from nodeagent.browser.cdp import Cdp, CdpClosed, CdpError

APP_UID = 1000
BROWSER_UID = 1001
APP_DIR = "/tmp/pdk-web"
BROWSER_DIR = "/tmp/pdk-browser"
DB_PATH = f"{APP_DIR}/app.db"
DEFAULT_PORT = 8080
VIEWPORT = (1024, 768)
START_TIMEOUT_S = 60.0          # app up, bridge back, browser answering (a loaded node is slow)
MAX_DB_BYTES = 16 * 1024 * 1024
CHROMIUM_FLAGS = ("--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                  "--disable-background-networking", "--disable-component-update", "--disable-sync",
                  "--disable-dev-shm-usage", "--no-proxy-server", "--disable-extensions",
                  "--disable-default-apps", "--mute-audio", "--disable-crash-reporter",
                  "--disable-features=Translate,MediaRouter,OptimizationHints",
                  "--remote-debugging-pipe")
_HERE = Path(__file__).parent

# Runs in the sandbox as the target uid: write the files (umask 077, in a fresh 0700 dir),
# start the daemon in its own session with its output to a log, wait for its ready file.
LAUNCHER = r"""
import json, os, subprocess, sys, time
req = json.load(sys.stdin)
os.umask(0o077)
os.makedirs(req["dir"], mode=0o700, exist_ok=True)
for name, text in req["files"].items():
    with open(os.path.join(req["dir"], name), "w") as f:
        f.write(text)
log = open(os.path.join(req["dir"], "daemon.log"), "ab")
env = {"PATH": "/usr/bin:/bin", "HOME": req["dir"], "LANG": "C.UTF-8"}
p = subprocess.Popen(req["argv"], cwd=req["dir"], stdin=subprocess.DEVNULL, stdout=log, stderr=log,
                     start_new_session=True, env=env)
deadline = time.monotonic() + req["timeout_s"]
while req.get("ready") and not os.path.exists(req["ready"]):
    if p.poll() is not None or time.monotonic() > deadline:
        log.flush()
        sys.stderr.write(open(os.path.join(req["dir"], "daemon.log"), errors="replace").read()[-3000:])
        sys.exit(3)
    time.sleep(0.02)
print(p.pid)
"""


class BrowserStartError(Exception):
    """The app or the browser did not come up: an infrastructure failure."""


def chromium_argv(profile: str, viewport: tuple[int, int] = VIEWPORT) -> list[str]:
    return ["chromium", *CHROMIUM_FLAGS, f"--user-data-dir={profile}",
            f"--window-size={viewport[0]},{viewport[1]}", "about:blank"]


def launch(sandbox, uid: int, directory: str, files: dict, argv: list[str], ready: str | None,
           timeout_s: float) -> None:
    """Start a daemon in the sandbox as `uid`: its files in `directory` (0700, made by that uid),
    its own session, output to `directory/daemon.log`; wait for `ready` to exist. Raises
    BrowserStartError with the daemon's log tail."""
    req = {"dir": directory, "files": files, "argv": argv, "ready": ready, "timeout_s": timeout_s}
    r = sandbox.exec(["python3", "-c", LAUNCHER], stdin=json.dumps(req).encode(), timeout_s=timeout_s + 5,
                     cwd="/tmp", uid=uid)
    if r.exit_code != 0:
        raise BrowserStartError(f"starting {argv[1] if len(argv) > 1 else argv[0]} as uid {uid} exited "
                                f"{r.exit_code}: {(r.stderr or r.stdout).decode(errors='replace')[-2000:]}")


def app_files(config: dict) -> dict[str, str]:
    return {"shop.py": (_HERE / "apps" / "shop.py").read_text(), "config.json": json.dumps(config)}


class BrowserSession:
    def __init__(self, port: int = DEFAULT_PORT, socket_dir: str | None = None,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.port, self.clock = port, clock
        self.origin = f"http://127.0.0.1:{port}"
        self._dir = tempfile.mkdtemp(prefix="paddock-cdp-", dir=socket_dir)
        os.chmod(self._dir, 0o711)
        self.path = os.path.join(self._dir, "cdp.sock")
        self._listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self._listener.bind(self.path)
        os.chmod(self.path, 0o666)        # the sandbox's relay runs as a subordinate uid
        self._listener.listen(4)
        self.key = secrets.token_bytes(32)
        self.seed_digest = ""
        self.cdp: Cdp | None = None
        self.page_session: str | None = None
        self.timings: dict[str, float] = {}

    # -- start ---------------------------------------------------------------------------
    def start(self, sandbox, seed_sql: str, start_path: str = "/") -> "BrowserSession":
        t0 = self.clock()
        self.seed_digest = shop.seed_digest(seed_sql)
        config = {"db": DB_PATH, "port": self.port, "key_hex": self.key.hex(), "seed_sql": seed_sql,
                  "seed_digest": self.seed_digest, "ready_file": f"{APP_DIR}/ready"}
        launch(sandbox, APP_UID, APP_DIR, app_files(config), ["python3", f"{APP_DIR}/shop.py", "serve", f"{APP_DIR}/config.json"],
               f"{APP_DIR}/ready", START_TIMEOUT_S)
        self.timings["app_s"] = self.clock() - t0
        nonce = secrets.token_hex(16)
        bridge_cfg = {"nonce": nonce, "argv": chromium_argv(f"{BROWSER_DIR}/profile"),
                      "log": f"{BROWSER_DIR}/chromium.log"}
        launch(sandbox, BROWSER_UID, BROWSER_DIR,
               {"bridge.py": (_HERE / "bridge.py").read_text(), "bridge.json": json.dumps(bridge_cfg)},
               ["python3", f"{BROWSER_DIR}/bridge.py", f"{BROWSER_DIR}/bridge.json"], None, START_TIMEOUT_S)
        self.cdp = Cdp(self._accept(nonce, t0 + START_TIMEOUT_S), self.clock)
        self.timings["bridge_s"] = self.clock() - t0
        try:
            self._attach(t0 + START_TIMEOUT_S)
            self.navigate(self.origin + start_path)
        except (CdpError, CdpClosed) as exc:
            raise BrowserStartError(f"driving the browser: {exc}") from None
        self.timings["ready_s"] = self.clock() - t0
        return self

    def _accept(self, nonce: str, deadline: float) -> socket.socket:
        """The bridge's connection: the first one that presents the nonce. Others are closed."""
        while True:
            left = deadline - self.clock()
            if left <= 0:
                raise BrowserStartError("the browser bridge did not connect back in time")
            self._listener.settimeout(left)
            try:
                conn, _ = self._listener.accept()
            except socket.timeout:
                raise BrowserStartError("the browser bridge did not connect back in time") from None
            conn.settimeout(max(deadline - self.clock(), 0.1))
            line = b""
            try:
                while not line.endswith(b"\n") and len(line) < 64:
                    chunk = conn.recv(1)
                    if not chunk:
                        break
                    line += chunk
            except OSError:
                pass
            if line.strip() == nonce.encode():
                self._listener.close()    # one channel per rollout: no one else can connect
                return conn
            conn.close()

    def _attach(self, deadline: float) -> None:
        # the first reply comes once chromium is up: it may take the rest of the start budget
        targets = self.cdp.call("Target.getTargets", timeout_s=max(deadline - self.clock(), 1.0))["targetInfos"]
        page = next((t for t in targets if t["type"] == "page"), None)
        target = page["targetId"] if page else self.cdp.call("Target.createTarget", {"url": "about:blank"})["targetId"]
        self.page_session = self.cdp.call("Target.attachToTarget", {"targetId": target, "flatten": True})["sessionId"]
        for method in ("Page.enable", "DOM.enable", "Accessibility.enable"):
            self.page(method)
        self.page("Page.setLifecycleEventsEnabled", {"enabled": True})
        self.page("Emulation.setDeviceMetricsOverride", {"width": VIEWPORT[0], "height": VIEWPORT[1],
                                                         "deviceScaleFactor": 1, "mobile": False})

    # -- driving -------------------------------------------------------------------------
    def page(self, method: str, params: dict | None = None, timeout_s: float = 10.0) -> dict:
        return self.cdp.call(method, params, session=self.page_session, timeout_s=timeout_s)

    def wait_loaded(self, started_timeout_s: float = 0.3, load_timeout_s: float = 10.0) -> bool:
        """After an action: if a navigation started, wait for its load event. True if one happened."""
        if self.cdp.wait_event("Page.frameStartedLoading", started_timeout_s, self.page_session) is None:
            return False
        self.cdp.wait_event("Page.loadEventFired", load_timeout_s, self.page_session)
        return True

    def navigate(self, url: str, timeout_s: float = 10.0) -> dict:
        self.cdp.events.clear()
        r = self.page("Page.navigate", {"url": url}, timeout_s)
        self.cdp.wait_event("Page.loadEventFired", timeout_s, self.page_session)
        self.cdp.events.clear()       # this navigation's events: an action's wait must not see them
        return r

    def current_url(self) -> str:
        hist = self.page("Page.getNavigationHistory")
        return hist["entries"][hist["currentIndex"]]["url"]

    # -- state ---------------------------------------------------------------------------
    def capture(self, sandbox) -> dict:
        """The state the grader needs: the database bytes (read by the sandbox's file operation,
        not by the workload), the audit key and the seed digest."""
        db = sandbox.read_file(DB_PATH, max_bytes=MAX_DB_BYTES)
        return {"db": db, "key_hex": self.key.hex(), "seed_digest": self.seed_digest}

    def close(self) -> None:
        if self.cdp is not None:
            self.cdp.close()
        try:
            self._listener.close()
        except OSError:
            pass
        shutil.rmtree(self._dir, ignore_errors=True)


__all__ = ["APP_UID", "BROWSER_UID", "BrowserSession", "BrowserStartError", "CHROMIUM_FLAGS", "DB_PATH",
           "app_files", "chromium_argv", "launch"]
