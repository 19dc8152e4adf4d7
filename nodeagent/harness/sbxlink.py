"""The in-sandbox end of a stream link to the harness. Runs INSIDE a sandbox (image python3).

  python3 -c "$(cat sbxlink.py)" < CONFIG_JSON

CONFIG: {nonce, tag, mode, argv, cwd, env (null: the exec's own), unset (names), port, rows,
cols, log, framed}. `framed`: what the harness sends comes in frames (4-byte big-endian length,
then the bytes; 0 ends the input, the program's stdin is closed and its output still flows). The process detaches (its own session, stdio to /dev/null), connects to
127.0.0.1:3128 (the sandbox relay, whose other end is the harness's `SandboxLink` socket for
this sandbox), presents `<nonce> <tag>` on the first line, and then, by `mode`:

- `pty`: runs `argv` on a fresh pseudo-terminal (its controlling terminal, `rows`x`cols`) and
  pumps the terminal to the connection both ways (an interactive shell); where the sandbox has
  no pseudo-terminals (a native sandbox mounts no /dev/pts, a rollout gets none) on pipes,
  its stderr with its stdout;
- `stdio`: runs `argv` with pipes and pumps the connection to its stdin and its stdout back
  (its stderr goes to `log`): an MCP server over stdio;
- `tcp`: runs `argv` (a server listening on 127.0.0.1:`port`), keeps the first connection as
  a control channel, and for each byte the harness sends on it opens one connection to the
  port and one more connection back (`<nonce> <tag>.conn`) and splices them: the harness reaches
  a server bound in the sandbox's network namespace, no port is opened outside it.

When the connection (the control channel) ends, the program is killed and this process exits.
The launching process prints `ok pty` / `ok pipes` / `ok` and exits 0 once the link is connected, or 3 with the reason on stderr.
Standard library only. Must not import: nodeagent, controller.
"""
import json
import os
import select
import signal
import socket
import subprocess
import sys
import threading
import time

RELAY = ("127.0.0.1", 3128)
CONNECT_TIMEOUT_S = 20.0


def _relay(nonce: str, tag: str) -> socket.socket:
    sock = socket.create_connection(RELAY, timeout=10)
    sock.settimeout(None)
    sock.sendall(f"{nonce} {tag}\n".encode())
    return sock


def _env(cfg: dict) -> dict:
    env = dict(os.environ) if cfg.get("env") is None else dict(cfg["env"])
    for name in cfg.get("unset") or ():
        env.pop(name, None)
    return env


class _Frames:
    """The harness-to-program direction of a `framed` link: 4-byte big-endian length, then
    that many bytes; length 0 is the end of input (the sandbox relay cannot carry a half-close:
    once one direction ends it drops the other)."""

    def __init__(self) -> None:
        self.buf, self.ended = b"", False

    def feed(self, data: bytes) -> bytes:
        self.buf += data
        out = []
        while len(self.buf) >= 4:
            n = int.from_bytes(self.buf[:4], "big")
            if n == 0:
                self.ended, self.buf = True, b""
                break
            if len(self.buf) < 4 + n:
                break
            out.append(self.buf[4:4 + n])
            self.buf = self.buf[4 + n:]
        return b"".join(out)


def _pump(sock: socket.socket, read_fd: int, write_fd: int, half_close=None, framed: bool = False) -> None:
    """Bytes from the socket to write_fd and from read_fd to the socket, until read_fd ends (or
    the input ends and there is no `half_close`: else that is called, e.g. to close the
    program's stdin, and its remaining output still flows back)."""
    fds = [sock.fileno(), read_fd]
    frames = _Frames() if framed else None
    while True:
        ready, _, _ = select.select(fds, [], [])
        if sock.fileno() in ready:
            data = sock.recv(65536)
            ended = not data
            if frames is not None and data:
                data = frames.feed(data)
                ended = frames.ended
            view = memoryview(data)
            while view:
                view = view[os.write(write_fd, view):]
            if ended:
                if half_close is None:
                    return
                half_close()
                fds.remove(sock.fileno())
        if read_fd in ready:
            try:
                data = os.read(read_fd, 65536)
            except OSError:          # a pty whose child exited: EIO
                data = b""
            if not data:
                return
            sock.sendall(data)


def _kill(pid: int) -> None:
    for sig in (signal.SIGHUP, signal.SIGKILL):
        try:
            os.killpg(pid, sig)
        except OSError:
            pass


def run_pty(cfg: dict, sock: socket.socket, ready) -> None:
    """On a pseudo-terminal when the sandbox has one (a /dev/pts); a native sandbox has none, as
    a rollout has none: then on pipes, stderr with stdout (`ok pipes`)."""
    import fcntl
    import pty
    import struct
    import termios
    try:
        master, slave = pty.openpty()
    except OSError:
        return run_stdio(cfg, sock, ready, merge=True)
    pid = os.fork()
    if pid == 0:
        os.close(master)
        os.setsid()
        fcntl.ioctl(slave, termios.TIOCSCTTY, 0)
        for fd in (0, 1, 2):
            os.dup2(slave, fd)
        os.chdir(cfg.get("cwd") or "/")
        os.execvpe(cfg["argv"][0], cfg["argv"], _env(cfg))
    os.close(slave)
    fcntl.ioctl(master, termios.TIOCSWINSZ, struct.pack("HHHH", cfg.get("rows") or 24, cfg.get("cols") or 80, 0, 0))
    ready("ok pty")
    try:
        _pump(sock, master, master, framed=bool(cfg.get("framed")))
    finally:
        _kill(pid)


def run_stdio(cfg: dict, sock: socket.socket, ready, merge: bool = False) -> None:
    log = open(cfg.get("log") or os.devnull, "ab")
    proc = subprocess.Popen(cfg["argv"], cwd=cfg.get("cwd") or "/", env=_env(cfg), stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT if merge else log,
                            start_new_session=True)
    ready("ok pipes")
    try:
        _pump(sock, proc.stdout.fileno(), proc.stdin.fileno(), half_close=proc.stdin.close,
              framed=bool(cfg.get("framed")))
    finally:
        if not proc.stdin.closed:
            proc.stdin.close()
        try:
            proc.wait(timeout=2)
        except subprocess.TimeoutExpired:
            pass
        _kill(proc.pid)


def _splice(a: socket.socket, b: socket.socket) -> None:
    def one_way(src: socket.socket, dst: socket.socket) -> None:
        try:
            while True:
                data = src.recv(65536)
                if not data:
                    break
                dst.sendall(data)
            dst.shutdown(socket.SHUT_WR)    # pass the end on; the other direction stays open
        except OSError:                     # a reset or a dead peer: both directions end
            for s in (dst, src):
                try:
                    s.shutdown(socket.SHUT_RDWR)
                except OSError:
                    pass
    threading.Thread(target=one_way, args=(a, b), daemon=True).start()
    threading.Thread(target=one_way, args=(b, a), daemon=True).start()


def _connect_port(port: int, proc: subprocess.Popen) -> socket.socket:
    deadline = time.monotonic() + CONNECT_TIMEOUT_S
    while True:
        try:
            return socket.create_connection(("127.0.0.1", port), timeout=5)
        except OSError:
            if proc.poll() is not None or time.monotonic() > deadline:
                raise
            time.sleep(0.05)


def run_tcp(cfg: dict, ctl: socket.socket, ready) -> None:
    log = open(cfg.get("log") or os.devnull, "ab")
    proc = subprocess.Popen(cfg["argv"], cwd=cfg.get("cwd") or "/", env=_env(cfg), stdin=subprocess.DEVNULL,
                            stdout=log, stderr=log, start_new_session=True)
    try:
        _connect_port(cfg["port"], proc).close()       # listening before the harness is told so
        ready()
        while True:
            data = ctl.recv(64)
            if not data:
                return
            for _ in data:
                try:
                    inner = _connect_port(cfg["port"], proc)
                except OSError:
                    return
                _splice(inner, _relay(cfg["nonce"], cfg["tag"] + ".conn"))
    finally:
        _kill(proc.pid)


def main() -> int:
    cfg = json.load(sys.stdin)
    r, w = os.pipe()
    if os.fork() > 0:                       # the launcher: wait for the daemon's word
        os.close(w)
        with os.fdopen(r, "rb") as f:
            word = f.read().decode(errors="replace")
        if word.startswith("ok"):
            sys.stdout.write(word)
            sys.stdout.flush()
            return 0
        sys.stderr.write(word or "the link process died before connecting\n")
        return 3
    os.close(r)
    os.setsid()
    null = os.open(os.devnull, os.O_RDWR)
    for fd in (0, 1, 2):
        os.dup2(null, fd)
    report = os.fdopen(w, "wb", buffering=0)

    def ready(word: str = "ok") -> None:
        report.write(word.encode() + b"\n")
        report.close()
    try:
        sock = _relay(cfg["nonce"], cfg["tag"])
        {"pty": run_pty, "stdio": run_stdio, "tcp": run_tcp}[cfg["mode"]](cfg, sock, ready)
    except Exception as exc:      # noqa: BLE001 - reported to the launcher, which names it
        if not report.closed:
            report.write(f"{type(exc).__name__}: {exc}\n".encode())
        elif cfg.get("log"):
            import traceback
            with open(cfg["log"], "a") as f:
                traceback.print_exc(file=f)
        return 1
    return 0


if __name__ == "__main__":
    os._exit(main())
