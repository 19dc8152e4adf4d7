"""The body of tests/sandbox/test_abuse_unprivileged.py, run as an ordinary user (`runuser -u
paddock-u1 -- /opt/paddock/venv/bin/python -c <this file's text>`): one sandbox runtime with
default settings (per-user state, caps held in user space), driven by JSON lines on stdin, each
answered by one JSON line on stdout. The test (root) decides the attacks and checks the caps
from outside through /proc; this worker only creates sandboxes, runs commands in them and
reports what the runtime and this user can see. Not a test module itself (no test_ prefix);
imports only Paddock's sandbox package and the standard library.

Requests: {"op": "create", "name", "image", "limits"}, {"op": "exec", "name", "argv",
"timeout_s"}, {"op": "watch", "name"} (the memory monitor's record), {"op": "tree", "name"}
(the sandbox's processes, host PIDs), {"op": "access", "paths"} (this user's listdir/open of
paths), {"op": "destroy", "name"}, {"op": "quit"}. Any failure answers {"error": text}.
"""
from __future__ import annotations

import base64
import json
import os
import sys

from nodeagent.sandbox.runtime import SandboxError, SandboxRuntime, SandboxSpec
from nodeagent.sandbox.usercaps import process_tree


def say(obj) -> None:
    sys.stdout.write(json.dumps(obj) + "\n")
    sys.stdout.flush()


def errno_of(fn) -> str:
    try:
        fn()
        return "ok"
    except OSError as exc:
        return os.strerror(exc.errno) if exc.errno else str(exc)


def _text(b: bytes) -> str:
    return b.decode("utf-8", "replace")


class Worker:
    def __init__(self, rt: SandboxRuntime):
        self.rt = rt
        self.boxes: dict = {}

    def create(self, req: dict) -> dict:
        sb = self.rt.create(SandboxSpec(image=req["image"], limits=req.get("limits") or {}))
        self.boxes[req["name"]] = sb
        return {"sid": sb.id, "init": sb.init_pid_host}

    def exec(self, req: dict) -> dict:
        r = self.boxes[req["name"]].exec(req["argv"], timeout_s=float(req.get("timeout_s", 10)),
                                         stdin=base64.b64decode(req.get("stdin_b64", "")))
        return {"exit": r.exit_code, "stdout": _text(r.stdout), "stderr": _text(r.stderr), "timed_out": r.timed_out}

    def watch(self, req: dict) -> dict:
        w = self.rt.memory_watch(self.boxes[req["name"]].id)
        if w is None:
            return {"watched": False}
        return {"watched": True, "limit_bytes": w.limit_bytes, "kills": w.kills, "peak_bytes": w.peak_bytes,
                "killed_pids": w.killed_pids}

    def tree(self, req: dict) -> dict:
        return {"pids": process_tree(self.boxes[req["name"]].init_pid_host)}

    def access(self, req: dict) -> dict:
        return {p: {"list": errno_of(lambda p=p: os.listdir(p)),
                    "open": errno_of(lambda p=p: open(p, "rb").read(1))} for p in req["paths"]}

    def destroy(self, req: dict) -> dict:
        self.boxes.pop(req["name"]).destroy()
        return {"destroyed": req["name"]}

    def close(self) -> None:
        for sb in self.boxes.values():
            try:
                sb.destroy()
            except SandboxError:
                pass
        self.boxes.clear()


def main() -> None:
    rt = SandboxRuntime().start()
    w = Worker(rt)
    try:
        report = rt.caps_report()
        say({"uid": os.getuid(), "pid": os.getpid(), "run_root": rt.run_root, "state_dir": rt.state_dir,
             "holder": rt.holder_pid, "caps": report["caps"], "degraded": report["degraded"],
             "allowed_cpus": sorted(os.sched_getaffinity(0))})
        for line in sys.stdin:
            req = json.loads(line)
            if req["op"] == "quit":
                break
            try:
                say(getattr(w, req["op"])(req))
            except (SandboxError, KeyError, OSError) as exc:
                say({"error": f"{type(exc).__name__}: {exc}"})
    finally:
        w.close()
        rt.close()
    say({"bye": True})


if __name__ == "__main__":
    main()
