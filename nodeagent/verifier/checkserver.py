"""Isolated host-side check runner, server side: the process that forks, limits and kills checks.

Started by `nodeagent.verifier.checks.CheckRunner` as `python -m nodeagent.verifier.checkserver
--ctl-fd N --preload mod,...` (internal: not a user command). It imports the preload modules
once, freezes the GC (forked children share those pages) and says `ready` on the control
socket. Then one loop (`_Server.serve`):
- keeps `SPARES` pre-forked spares, each handed to the client (request pipe, reply socket);
- takes `start` notices (check id, deadline, output cap, kind) from the client;
- kills a check's whole process group at its deadline, on a crash, or when it writes more than
  its output cap, and answers the client itself then (`timeout`, `crashed`, `output_cap`, and
  every command's result);
- sweeps processes a finished check left behind (the server is a child subreaper).

A spare leads its own session (so its own process group), dies with the server (PDEATHSIG;
a spare whose server died before it set that exits at once: its parent is no longer the server),
sets rlimits (address space, CPU seconds, file size, open files, no core dumps) when it gets
its one request, runs either a Python function (`fn="module:name"`, JSON arguments, JSON
result, sent straight to the client) or a command (`argv`, stdout and stderr to the server),
and exits. A check that hangs, forks, allocates without bound or floods output costs only its
own result. The wire limits (`MAX_REQUEST_BYTES`, `MAX_REPLY_BYTES`, `MAX_OUTPUT_CAP`) are
defined here; the client imports them.

Standard library and nodeagent.sandbox.framing only; Must not import: zmq, controller,
nodeagent.verifier.checkers (the checkers come by `--preload` and by name in each request).
"""
from __future__ import annotations

import argparse
import base64
import ctypes
import fcntl
import gc
import importlib
import itertools
import json
import os
import resource
import select
import selectors
import signal
import socket
import sys
import time
from dataclasses import dataclass, field

from nodeagent.sandbox import framing

DEFAULT_LIMITS = {"memory_mb": 1024, "nofile": 64, "fsize_mb": 16}
SWEEP_INTERVAL_S = 2.0          # a /proc scan: only after checks finished, at most this often
MAX_REQUEST_BYTES = 4 << 20
SPARE_OOM_SCORE_ADJ = 1000        # each check process: the OOM killer's first choice
SPARES = 8                      # pre-forked check processes kept ready
MAX_REPLY_BYTES = 192 * 1024    # one SOCK_SEQPACKET record (below the default socket buffer)
MAX_OUTPUT_CAP = 128 * 1024     # output_cap is clamped to this (base64 of it fits one record)
PR_SET_CHILD_SUBREAPER = 36
PR_SET_PDEATHSIG = 1


@dataclass
class _Active:
    sid: int
    pid: int
    pidfd: int
    out_r: int
    reply: socket.socket        # the spare's end of the client's reply socket (a copy)
    rid: int = 0
    deadline: float = 0.0
    cap: int = 0
    t0: float = 0.0
    kind: str = "fn"
    buf: bytearray = field(default_factory=bytearray)
    over_cap: bool = False
    status: int | None = None
    out_open: bool = True


def _raise_oom_score() -> None:
    """A check is the OOM killer's first choice (1000), never the server or the node agent:
    raising one's own oom_score_adj needs no privilege."""
    try:
        with open("/proc/self/oom_score_adj", "w") as f:
            f.write(str(SPARE_OOM_SCORE_ADJ))
    except OSError:
        pass


def _spare(req_r: int, out_w: int, res: int) -> None:
    """A pre-forked child: own session at once, then wait for one request and run it. Never returns."""
    try:
        os.setsid()
        gc.disable()
        _raise_oom_score()
        devnull = os.open(os.devnull, os.O_RDWR)
        for fd in (0, 1, 2):
            os.dup2(devnull, fd)
        os.close(devnull)
        buf = bytearray()
        while not buf.endswith(b"\n"):
            chunk = os.read(req_r, 1 << 20)
            if not chunk:
                os._exit(0)         # the server retired this spare
            buf += chunk
        os.close(req_r)
        req = json.loads(buf)
    except BaseException:  # noqa: BLE001
        os._exit(126)
    _child(req, out_w, res)


def _child(req: dict, out_w: int, res: int) -> None:
    """Run one check: rlimits, then the function or the command. Never returns."""
    code = 0
    try:
        lim = req.get("limits") or {}
        mb = 1 << 20
        with open("/proc/self/statm") as f:
            vsz = int(f.read().split()[0]) * os.sysconf("SC_PAGE_SIZE")
        cpu = int(req["timeout_s"]) + 2
        lim = {**DEFAULT_LIMITS, **lim}
        for limit, val in ((resource.RLIMIT_AS, vsz + int(lim["memory_mb"]) * mb),
                           (resource.RLIMIT_CPU, cpu),
                           (resource.RLIMIT_FSIZE, int(lim["fsize_mb"]) * mb),
                           (resource.RLIMIT_NOFILE, int(lim["nofile"])),
                           (resource.RLIMIT_CORE, 0)):
            resource.setrlimit(limit, (val, val))
        signal.signal(signal.SIGPIPE, signal.SIG_DFL)
        if req.get("argv"):
            in_r, in_w = os.pipe()
            os.write(in_w, (req.get("stdin") or "").encode("latin-1")[:65536])
            os.close(in_w)
            os.dup2(in_r, 0)
            os.dup2(out_w, 1)
            os.dup2(out_w, 2)
            os.closerange(3, 1 << 16)
            os.execvp(req["argv"][0], req["argv"])
        mod, _, name = req["fn"].partition(":")
        func = getattr(importlib.import_module(mod), name)
        try:
            out = {"id": req["id"], "outcome": "ok", "value": func(*req.get("args", []))}
        except Exception as exc:  # noqa: BLE001 - the check's own error is its result
            out = {"id": req["id"], "outcome": "error", "detail": f"{type(exc).__name__}: {exc}"[:2000]}
        out["wall_s"] = time.monotonic() - req["t0"]
        data = json.dumps(out, default=repr).encode()
        if len(data) > min(int(req["output_cap"]), MAX_REPLY_BYTES - 256):
            data = json.dumps({"id": req["id"], "outcome": "output_cap", "wall_s": out["wall_s"],
                               "detail": f"result of {len(data)} bytes exceeds {req['output_cap']}"}).encode()
        os.write(res, data)            # one record, straight to the client
        os.write(out_w, b"sent\n")     # and tell the server it is done
        os.close(out_w)
    except BaseException as exc:  # noqa: BLE001 - anything here is a crash of this check only
        try:
            os.write(out_w, json.dumps({"ok": False, "error": f"check setup failed: {exc}"}).encode() + b"\n")
        except OSError:
            pass
        code = 127
    os._exit(code)


_LIBC = None       # libc, for prctl (set by main)


class _Server:
    """One loop: spares forked and handed to the client, `start` notices in (deadlines), exits
    and deadlines handled, results the spares could not send themselves sent back."""

    def __init__(self, ctl: socket.socket, spares: int = SPARES) -> None:
        self.ctl = ctl
        self.sel = selectors.DefaultSelector()
        self.n_spares = spares
        self.spares: dict[int, _Active] = {}       # spare id -> idle spare (its request fd is the client's)
        self.active: dict[int, _Active] = {}       # pid -> running check
        self.by_fd: dict[int, tuple[str, _Active]] = {}
        self.sids = itertools.count(1)
        self.next_sweep = time.monotonic() + SWEEP_INTERVAL_S
        self.finished_since_sweep = 0

    def serve(self) -> int:
        self.sel.register(self.ctl, selectors.EVENT_READ, "ctl")
        while True:
            self.refill()
            now = time.monotonic()
            wait = min([a.deadline for a in self.active.values()] + [self.next_sweep]) - now
            for key, _ in self.sel.select(timeout=max(wait, 0.0)):
                if key.data == "ctl":
                    if not self.read_ctl():
                        return 0
                else:
                    self.on_fd(key.fd)
            now = time.monotonic()
            for a in [a for a in self.active.values() if a.deadline <= now]:
                self.finish(a, timed_out=True)
            if now >= self.next_sweep:
                if self.finished_since_sweep:
                    self.sweep()
                    self.finished_since_sweep = 0
                self.next_sweep = now + SWEEP_INTERVAL_S

    def read_ctl(self) -> bool:
        try:
            msg = framing.recv_msg(self.ctl, max_bytes=MAX_REQUEST_BYTES)
        except framing.FramingError:
            return False
        self.start(msg)
        return True

    def fork_spare(self) -> None:
        req_r, req_w = os.pipe()
        out_r, out_w = os.pipe()
        reply, client_end = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        server = os.getpid()
        pid = os.fork()
        if pid == 0:
            # Keep only this spare's pipe ends and its reply socket, as fds 3, 4, 5 (copied high
            # first: any of them may already sit on 3..5).
            high = [fcntl.fcntl(fd, fcntl.F_DUPFD, 64) for fd in (req_r, out_w, reply.fileno())]
            for target, fd in zip((3, 4, 5), high):
                os.dup2(fd, target)
            os.closerange(6, 1 << 16)
            if _LIBC is not None:       # a check never outlives the server
                _LIBC.prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
            if os.getppid() != server:  # it died before the prctl: no signal will come
                os._exit(0)
            _spare(3, 4, 5)
        os.close(req_r)
        os.close(out_w)
        os.set_blocking(out_r, False)
        a = _Active(next(self.sids), pid, os.pidfd_open(pid), out_r, reply)
        self.spares[a.sid] = a
        self.by_fd[a.out_r] = ("out", a)
        self.by_fd[a.pidfd] = ("pid", a)
        self.sel.register(a.out_r, selectors.EVENT_READ, "out")
        self.sel.register(a.pidfd, selectors.EVENT_READ, "pid")
        try:
            framing.send_msg(self.ctl, {"spare": a.sid}, [req_w, client_end.fileno()])
        except OSError:
            os._exit(0)         # the client is gone
        finally:
            os.close(req_w)
            client_end.close()

    def refill(self) -> None:
        while len(self.spares) < self.n_spares:
            self.fork_spare()

    def start(self, msg: dict) -> None:
        a = self.spares.pop(int(msg["start"]), None)
        if a is None:       # it died idle; the client saw EPIPE and moved on
            return
        a.rid, a.t0, a.cap, a.kind = msg["id"], float(msg["t0"]), int(msg["output_cap"]), msg["kind"]
        a.deadline = a.t0 + float(msg["timeout_s"])
        self.active[a.pid] = a

    def drain_ctl(self) -> None:
        """Apply `start` notices already sent: a fast check can exit before we read its notice."""
        while select.select([self.ctl], [], [], 0)[0]:
            if not self.read_ctl():
                os._exit(0)

    def on_fd(self, fd: int) -> None:
        if fd not in self.by_fd:
            return      # finished earlier in this same batch of events
        what, a = self.by_fd[fd]
        if a.pid not in self.active:
            self.drain_ctl()
        if a.pid not in self.active:
            if what == "pid":           # a spare died idle
                self.spares.pop(a.sid, None)
                if a.status is None:
                    self.reap()
                self.release(a)
            else:
                self.drain(a)
            return
        if what == "out":
            self.drain(a)
            if a.kind == "fn" and a.buf.endswith(b"sent\n"):
                self.finish(a, replied=True)     # the child answered the client itself
        else:
            if a.status is None:
                self.reap()
            if a.status is not None:
                self.drain(a)
                self.finish(a)

    def drain(self, a: _Active) -> None:
        while a.out_open and a.out_r in self.by_fd:
            try:
                chunk = os.read(a.out_r, 65536)
            except BlockingIOError:
                return
            if not chunk:
                a.out_open = False
                self.sel.unregister(a.out_r)
                del self.by_fd[a.out_r]
                return
            room = a.cap - len(a.buf)
            a.buf += chunk[:max(room, 0)]
            if len(chunk) > room and a.pid in self.active:
                a.over_cap = True
                self.finish(a)
                return

    def reap(self) -> None:
        while True:
            try:
                pid, status = os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:
                return
            if pid == 0:
                return
            a = self.active.get(pid) or next((x for x in self.spares.values() if x.pid == pid), None)
            if a is not None:
                a.status = status       # kept: its `start` notice may not have been read yet

    def release(self, a: _Active) -> None:
        for fd in (a.out_r, a.pidfd):
            if self.by_fd.pop(fd, None) is not None:
                self.sel.unregister(fd)
            os.close(fd)
        a.reply.close()

    def finish(self, a: _Active, timed_out: bool = False, replied: bool = False) -> None:
        if a.pid not in self.active:
            return
        try:
            os.killpg(a.pid, signal.SIGKILL)    # the check and everything left in its group
        except ProcessLookupError:
            pass
        del self.active[a.pid]
        self.finished_since_sweep += 1
        self.reap()                             # zombies of finished checks; the rest at the sweep
        if replied:
            self.release(a)
            return
        reply = _verdict(a, timed_out)
        reply["id"], reply["wall_s"] = a.rid, time.monotonic() - a.t0
        if "stdout" in reply:
            reply["stdout"] = base64.b64encode(reply["stdout"]).decode()
        data = json.dumps(reply).encode()
        if len(data) > MAX_REPLY_BYTES:
            data = json.dumps({"id": a.rid, "outcome": "output_cap", "wall_s": reply["wall_s"],
                               "detail": f"reply of {len(data)} bytes exceeds {MAX_REPLY_BYTES}"}).encode()
        try:
            a.reply.send(data)
        except OSError:
            pass                # the caller gave up on this check
        self.release(a)

    def sweep(self) -> None:
        """Kill processes a finished check left behind (re-parented to us, the subreaper)."""
        keep = set(self.active) | {s.pid for s in self.spares.values()}
        for pid in _children() - keep:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        self.reap()


def _children() -> set[int]:
    """PIDs of this process's children (/proc/self/task/*/children; a /proc scan without it)."""
    me = os.getpid()
    out: set[int] = set()
    try:
        for tid in os.listdir("/proc/self/task"):
            with open(f"/proc/self/task/{tid}/children") as f:
                out.update(int(p) for p in f.read().split())
        return out
    except OSError:
        pass
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            with open(f"/proc/{pid}/stat") as f:
                if int(f.read().rsplit(")", 1)[1].split()[1]) == me:
                    out.add(int(pid))
        except (OSError, ValueError, IndexError):
            continue
    return out


def _verdict(a: _Active, timed_out: bool) -> dict:
    if timed_out:
        return {"outcome": "timeout", "detail": f"killed at the deadline of {a.deadline - a.t0:.3g}s"}
    if a.over_cap:
        return {"outcome": "output_cap", "detail": f"output exceeded {a.cap} bytes"}
    code = os.waitstatus_to_exitcode(a.status) if a.status is not None else None
    if a.kind == "argv":
        if code == 127 and a.buf.startswith(b'{"ok": false'):
            return {"outcome": "error", "detail": json.loads(a.buf)["error"], "exit_code": code}
        return {"outcome": "ok", "exit_code": code, "stdout": bytes(a.buf)}
    try:
        out = json.loads(a.buf)
    except ValueError:
        return {"outcome": "crashed", "detail": f"exited with {code} and no result", "exit_code": code}
    if out.get("ok"):
        return {"outcome": "ok", "value": out.get("value")}
    return {"outcome": "error", "detail": out.get("error", "")}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description="check server (started by CheckRunner)")
    ap.add_argument("--ctl-fd", type=int, required=True)
    ap.add_argument("--preload", default="")
    args = ap.parse_args(argv)
    global _LIBC
    _LIBC = libc = ctypes.CDLL(None, use_errno=True)
    libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
    libc.prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0)
    ctl = socket.socket(fileno=args.ctl_fd)
    try:
        for mod in filter(None, args.preload.split(",")):
            importlib.import_module(mod)
    except Exception as exc:  # noqa: BLE001 - reported to the client
        framing.send_msg(ctl, {"ready": False, "error": f"preload failed: {exc}"})
        return 1
    gc.collect()
    gc.freeze()         # forked children share these pages instead of copying them on first GC
    framing.send_msg(ctl, {"ready": True, "pid": os.getpid()})
    return _Server(ctl).serve()


if __name__ == "__main__":
    sys.exit(main())
