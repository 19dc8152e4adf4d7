"""The body of tests/sandbox/test_users.py, run as an ordinary user (`runuser -u paddock-u1 --
/opt/paddock/venv/bin/python -c <this file's text> IMAGE`): one sandbox runtime with default
settings (per-user state, caps held in user space), driven by JSON lines on stdin, each answered
by one JSON line on stdout. Not a test module itself (no test_ prefix); imports only Paddock's
sandbox package and the standard library.
"""
from __future__ import annotations

import json
import os
import sys

from nodeagent.sandbox.runtime import SandboxError, SandboxRuntime, SandboxSpec

LIMITS = {"memory_mb": 96, "pids": 32, "cpu": 0.5, "disk_mb": 16, "nofile": 128}


def say(obj) -> None:
    sys.stdout.write(json.dumps(obj) + "\n")
    sys.stdout.flush()


def errno_of(fn) -> str:
    try:
        fn()
        return "ok"
    except OSError as exc:
        return os.strerror(exc.errno) if exc.errno else str(exc)


def probe(rt, box, pids, paths) -> dict:
    """What this user can do to the other user's processes and paths, from here and from a sandbox."""
    host = {str(p): {"kill": errno_of(lambda p=p: os.kill(p, 0)),
                     "root": errno_of(lambda p=p: os.listdir(f"/proc/{p}/root")),
                     "environ": errno_of(lambda p=p: open(f"/proc/{p}/environ", "rb").read())} for p in pids}
    files = {p: {"list": errno_of(lambda p=p: os.listdir(p)),
                 "create": errno_of(lambda p=p: os.close(os.open(os.path.join(p, "intruder"), os.O_CREAT | os.O_WRONLY, 0o600)))}
             for p in paths}
    kills = " ; ".join(f"kill -0 {p} 2>/dev/null && echo {p}=alive || echo {p}=no" for p in pids)
    r = box.exec(["sh", "-c", f"{kills}; ls /proc | grep -c '^[0-9]'"])
    return {"host": host, "files": files, "in_sandbox": r.stdout.decode().split(), "holder_alive": rt.holder_pid}


def bombs(rt, img, box) -> dict:
    """A memory bomb (four processes, each under RLIMIT_AS, together over the cap) and a fork bomb,
    each in a sandbox of its own; then whether `box` and the runtime still work."""
    out = {}
    with rt.create(SandboxSpec(image=img, limits=LIMITS)) as mem:
        r = mem.exec(["sh", "-c", "for i in 1 2 3 4; do (x=$(head -c 40000000 /dev/zero | tr '\\0' a); sleep 60) & "
                                  "done; wait; echo survived"], timeout_s=30)
        w = rt.memory_watch(mem.id)
        out["memory"] = {"exit": r.exit_code, "stdout": r.stdout.decode(), "timed_out": r.timed_out,
                         "kills": w.kills if w else None, "after": mem.exec(["echo", "ok"]).stdout.decode()}
    with rt.create(SandboxSpec(image=img, limits=LIMITS)) as fork:
        r = fork.exec(["sh", "-c", "bomb() { bomb | bomb & }; bomb; wait"], timeout_s=2)
        out["fork"] = {"stderr_cant_fork": b"can't fork" in r.stderr, "after": fork.exec(["echo", "ok"]).stdout.decode()}
    out["other_sandbox"] = box.exec(["echo", "ok"]).stdout.decode()
    with rt.create(SandboxSpec(image=img)) as fresh:
        out["new_sandbox"] = fresh.exec(["echo", "ok"]).stdout.decode()
    return out


def main(img: str) -> None:
    rt = SandboxRuntime().start()
    try:
        box = rt.create(SandboxSpec(image=img, limits=LIMITS))
        sleeper = int(box.exec(["sh", "-c", "sleep 1000 >/dev/null 2>&1 & echo $!"]).stdout)
        sched = box.exec(["sh", "-c", "cut -d' ' -f19,41 /proc/self/stat; grep Cpus_allowed_list /proc/self/status"])
        say({"uid": os.getuid(), "run_root": rt.run_root, "state_dir": rt.state_dir, "holder": rt.holder_pid,
             "init": box.init_pid_host, "sleeper_node_pid": sleeper, "caps": rt.caps_report()["caps"],
             "degraded": rt.caps_report()["degraded"], "sched": sched.stdout.decode()})
        for line in sys.stdin:
            req = json.loads(line)
            if req["op"] == "probe":
                say(probe(rt, box, req["pids"], req["paths"]))
            elif req["op"] == "bombs":
                say(bombs(rt, img, box))
            elif req["op"] == "quit":
                break
        box.destroy()
    except SandboxError as exc:
        say({"error": str(exc)})
    finally:
        rt.close()
    say({"bye": True})


if __name__ == "__main__":
    main(sys.argv[1])
