"""An origin server inside a network namespace this process creates: one veth pair, the host
end and the namespace end each with an address of a test-only /24, and a Python program run
inside the namespace that prints "ready" once it listens. Everything made is removed on exit.

Used by the egress tests and benchmarks/egress_proxy.py. Needs root.
"""
from __future__ import annotations

import contextlib
import subprocess
import sys
from typing import Iterator


def ip(*args: str) -> None:
    subprocess.run(["ip", *args], check=True, capture_output=True)


@contextlib.contextmanager
def origin_netns(ns: str, veth: str, host_addr: str, origin_addr: str, program: str) -> Iterator[str]:
    """Yield `ns` once `program` (Python source) runs inside it and has printed "ready"."""
    ip("netns", "add", ns)
    proc = None
    try:
        ip("link", "add", veth + "h", "type", "veth", "peer", "name", veth + "o")
        ip("link", "set", veth + "o", "netns", ns)
        ip("addr", "add", f"{host_addr}/24", "dev", veth + "h")
        ip("link", "set", veth + "h", "up")
        ip("-n", ns, "addr", "add", f"{origin_addr}/24", "dev", veth + "o")
        ip("-n", ns, "link", "set", veth + "o", "up")
        ip("-n", ns, "link", "set", "lo", "up")
        proc = subprocess.Popen(["ip", "netns", "exec", ns, sys.executable, "-c", program],
                                stdout=subprocess.PIPE, stdin=subprocess.DEVNULL)
        if proc.stdout.readline() != b"ready\n":
            raise RuntimeError(f"origin in network namespace {ns} did not start")
        yield ns
    finally:
        if proc is not None:
            proc.kill()
            proc.wait()
        subprocess.run(["ip", "link", "del", veth + "h"], capture_output=True)
        subprocess.run(["ip", "netns", "del", ns], capture_output=True)
