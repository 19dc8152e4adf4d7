"""The in-sandbox end of the browser's DevTools channel. Runs INSIDE a sandbox (image python3).

  python3 bridge.py CONFIG     CONFIG: JSON {nonce, argv (chromium's), log}; read, then deleted.

Starts chromium with `--remote-debugging-pipe` (it reads DevTools messages from fd 3 and writes
them to fd 4, each ended by a NUL byte), connects to 127.0.0.1:3128 (the sandbox relay, whose
other end is the harness's Unix socket for this rollout: no network), sends the nonce line,
then pumps bytes both ways until either side ends; then it kills chromium and exits. The
browser opens no debugging port: the only way to drive it is this one connection.
Standard library only.
"""
import fcntl
import json
import os
import select
import signal
import socket
import subprocess
import sys

RELAY = ("127.0.0.1", 3128)


def main(config_path: str) -> int:
    with open(config_path) as f:
        cfg = json.load(f)
    os.unlink(config_path)
    log = open(cfg["log"], "ab")
    # chromium reads commands from its fd 3 and writes replies to its fd 4: place the pipe ends
    # there in this process (after moving every pipe end above 10), pass exactly those two.
    ends = [fcntl.fcntl(fd, fcntl.F_DUPFD_CLOEXEC, 10) for pair in (os.pipe(), os.pipe()) for fd in pair]
    for fd in range(3, 10):
        if fd != log.fileno():
            try:
                os.close(fd)
            except OSError:
                pass
    to_browser_r, to_browser_w, from_browser_r, from_browser_w = ends
    if log.fileno() in (3, 4):
        log = os.fdopen(fcntl.fcntl(log.fileno(), fcntl.F_DUPFD_CLOEXEC, 10), "ab")
    os.dup2(to_browser_r, 3)
    os.dup2(from_browser_w, 4)
    proc = subprocess.Popen(cfg["argv"], stdin=subprocess.DEVNULL, stdout=log, stderr=log, pass_fds=(3, 4),
                            env=dict(os.environ, DBUS_SESSION_BUS_ADDRESS="disabled:"))
    for fd in (3, 4, to_browser_r, from_browser_w):
        os.close(fd)
    sock = socket.create_connection(RELAY, timeout=10)
    sock.settimeout(None)
    sock.sendall(cfg["nonce"].encode() + b"\n")
    fds = {sock.fileno(): "sock", from_browser_r: "browser"}
    try:
        while True:
            ready, _, _ = select.select(list(fds), [], [])
            for fd in ready:
                if fds[fd] == "sock":
                    data = sock.recv(65536)
                    if not data:
                        return 0
                    view = memoryview(data)
                    while view:
                        view = view[os.write(to_browser_w, view):]
                else:
                    data = os.read(from_browser_r, 65536)
                    if not data:
                        return 0
                    sock.sendall(data)
    except OSError:
        return 1
    finally:
        try:
            proc.send_signal(signal.SIGKILL)
        except OSError:
            pass
        sock.close()


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))
