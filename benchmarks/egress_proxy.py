"""Egress proxy latency: Paddock's proxy vs tinyproxy vs a direct connection, one run.

An origin (HTTP on :8080, raw TCP on :8443) runs in a network namespace this script creates
(veth, 10.231.250.0/24). Per request, sequentially, interleaved round by round:
- direct: TCP connect to the origin + GET (the floor);
- tinyproxy: absolute-URI GET through tinyproxy on 127.0.0.1 (IP-literal URL: tinyproxy
  resolves with the system resolver and vets nothing — less work than Paddock does);
- paddock: absolute-URI GET through the sandbox's Unix socket (name normalised, allowlist by
  registrable domain, resolved by the proxy's resolver, address vetted, vetted address dialled,
  decision recorded);
- CONNECT variants: tunnel + a real TLS ClientHello (SNI checked by Paddock) + the origin's reply.
Prints p50 and p99 (ms) of each and the ratios to tinyproxy's p50. Needs root and tinyproxy
(scripts/setup.sh installs tinyproxy-bin).

    .venv/bin/python benchmarks/egress_proxy.py [--n 300]
"""
from __future__ import annotations

import argparse
import contextlib
import ipaddress
import os
import socket
import ssl
import subprocess
import sys
import tempfile
import time

from controller.contracts.network import parse_policy
from nodeagent.egress.proxy import EgressProxy

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
from tests.egress.netns import origin_netns  # noqa: E402

NS, VETH = "pdk-egbench", "pdkegb"
HOST_ADDR, ORIGIN_ADDR = "10.231.250.1", "10.231.250.2"
NAME = "origin.bench.example.com"
ORIGIN = r'''
import socket, threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
class H(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.0"
    def do_GET(self):
        body = b"x" * 1024
        self.send_response(200); self.send_header("Content-Length", str(len(body))); self.end_headers()
        self.wfile.write(body)
    def log_message(self, *a): pass
def raw():
    s = socket.socket(); s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    s.bind(("0.0.0.0", 8443)); s.listen(64)
    while True:
        c, _ = s.accept()
        def serve(c):
            data = c.recv(65536); c.sendall(b"got %d" % len(data)); c.close()
        threading.Thread(target=serve, args=(c,), daemon=True).start()
threading.Thread(target=raw, daemon=True).start()
httpd = ThreadingHTTPServer(("0.0.0.0", 8080), H)
httpd.request_queue_size = 128
print("ready", flush=True)
httpd.serve_forever()
'''


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start_tinyproxy(workdir):
    port = free_port()
    conf = os.path.join(workdir, "tinyproxy.conf")
    with open(conf, "w") as f:
        f.write(f"User nobody\nGroup nogroup\nPort {port}\nListen 127.0.0.1\nTimeout 60\nMaxClients 200\n"
                "Allow 127.0.0.1\nConnectPort 8443\nLogLevel Critical\nDisableViaHeader Yes\n")
    proc = subprocess.Popen(["tinyproxy", "-d", "-c", conf], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        try:
            socket.create_connection(("127.0.0.1", port), timeout=1).close()
            return proc, port
        except OSError:
            time.sleep(0.02)
    proc.kill()
    raise RuntimeError("tinyproxy did not start")


def exchange(sock, request, then=b""):
    with sock:
        sock.sendall(request)
        out = b""
        if then:
            while b"\r\n\r\n" not in out:
                chunk = sock.recv(4096)
                if not chunk:
                    raise RuntimeError(f"proxy closed early: {out!r}")
                out += chunk
            sock.sendall(then)
        while chunk := sock.recv(65536):
            out += chunk
    return out


def unix(path):
    s = socket.socket(socket.AF_UNIX)
    s.connect(path)
    return s


def client_hello(sni):
    incoming, outgoing = ssl.MemoryBIO(), ssl.MemoryBIO()
    tls = ssl.create_default_context().wrap_bio(incoming, outgoing, server_hostname=sni)
    try:
        tls.do_handshake()
    except ssl.SSLWantReadError:
        pass
    return outgoing.read()


def pct(xs, q):
    xs = sorted(xs)
    return xs[min(int(q * len(xs)), len(xs) - 1)]


def main(argv=None):
    ap = argparse.ArgumentParser()
    ap.add_argument("--n", type=int, default=300)
    n = ap.parse_args(argv).n
    if os.geteuid() != 0:
        sys.exit("egress benchmark: needs root (network namespace)")
    workdir = tempfile.mkdtemp(prefix="paddock-egbench-")
    netns = contextlib.ExitStack()
    netns.enter_context(origin_netns(NS, VETH, HOST_ADDR, ORIGIN_ADDR, ORIGIN))
    tiny, tiny_port = start_tinyproxy(workdir)
    proxy = EgressProxy(os.path.join(workdir, "sockets"), resolver=lambda h, p: [ORIGIN_ADDR],
                        allowed_networks=[ipaddress.ip_network("10.231.250.0/24")])
    try:
        path = proxy.open("bench", parse_policy(f"{NAME}:8080|8443"))
        hello = client_hello(NAME)
        get_ip = f"GET http://{ORIGIN_ADDR}:8080/p HTTP/1.1\r\nHost: {ORIGIN_ADDR}:8080\r\n\r\n".encode()
        get_name = f"GET http://{NAME}:8080/p HTTP/1.1\r\nHost: {NAME}:8080\r\n\r\n".encode()
        cases = {
            "direct GET": lambda: exchange(socket.create_connection((ORIGIN_ADDR, 8080)),
                                           b"GET /p HTTP/1.1\r\nHost: x\r\n\r\n"),
            "tinyproxy GET": lambda: exchange(socket.create_connection(("127.0.0.1", tiny_port)), get_ip),
            "paddock GET": lambda: exchange(unix(path), get_name),
            "tinyproxy CONNECT+hello": lambda: exchange(
                socket.create_connection(("127.0.0.1", tiny_port)),
                f"CONNECT {ORIGIN_ADDR}:8443 HTTP/1.1\r\n\r\n".encode(), hello),
            "paddock CONNECT+hello": lambda: exchange(unix(path), f"CONNECT {NAME}:8443 HTTP/1.1\r\n\r\n".encode(),
                                                      hello),
        }
        for fn in cases.values():   # warm up, and check every path really works
            out = fn()
            assert b" 200 " in out or out.startswith(b"HTTP/1.0 200") or b"got" in out, out[:200]
        times = {k: [] for k in cases}
        for _ in range(n):
            for k, fn in cases.items():
                t = time.perf_counter()
                fn()
                times[k].append((time.perf_counter() - t) * 1000)
        decisions = proxy.decisions("bench")
    finally:
        proxy.close_all()
        tiny.kill()
        tiny.wait()
        netns.close()
    print(f"egress proxy latency, {n} sequential requests per case (ms)")
    base = {"GET": statistics_p50(times["tinyproxy GET"]),
            "CONNECT": statistics_p50(times["tinyproxy CONNECT+hello"])}
    for k, xs in times.items():
        ref = base["CONNECT" if "CONNECT" in k else "GET"]
        print(f"  {k:26s} p50 {pct(xs, 0.5):7.3f}  p99 {pct(xs, 0.99):7.3f}  "
              f"p50/tinyproxy {pct(xs, 0.5) / ref:5.2f}x")
    allowed = sum(d["verdict"] == "allow" for d in decisions)
    print(f"  paddock recorded {len(decisions)} decisions ({allowed} allow)")


def statistics_p50(xs):
    return pct(xs, 0.5)


if __name__ == "__main__":
    main()
