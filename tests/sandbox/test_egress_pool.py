"""The egress hook (a relay from 127.0.0.1:3128 in the sandbox to the node proxy's Unix socket)
and the warm pool (handed out once, refilled in the background, destroyed after use)."""
from __future__ import annotations

import gc
import os
import shutil
import socket
import tempfile
import threading
import time

import pytest

from nodeagent.sandbox.runtime import SandboxSpec

pytestmark = pytest.mark.sandbox


@pytest.fixture
def echo_unix_server():
    """A trivial stand-in for the node egress proxy: echoes each connection, upper-cased."""
    d = tempfile.mkdtemp(prefix="paddock-egress-", dir="/tmp")
    os.chmod(d, 0o755)
    path = os.path.join(d, "proxy.sock")
    srv = socket.socket(socket.AF_UNIX)
    srv.bind(path)
    os.chmod(path, 0o666)   # the contract: connectable by the sandbox's ids
    srv.listen(8)
    seen = []

    def serve():
        while True:
            try:
                conn, _ = srv.accept()
            except OSError:
                return
            with conn:
                data = b""
                while not data.endswith(b"\n"):
                    chunk = conn.recv(4096)
                    if not chunk:
                        break
                    data += chunk
                seen.append(data)
                conn.sendall(data.upper())

    t = threading.Thread(target=serve, daemon=True)
    t.start()
    yield path, seen
    srv.close()
    shutil.rmtree(d, ignore_errors=True)


def test_egress_socket_is_relayed_from_loopback_3128_with_proxy_env(runtime, python_image, echo_unix_server):
    path, seen = echo_unix_server
    with runtime.create(SandboxSpec(image=python_image, egress_socket=path)) as sb:
        code = ("import os, socket\n"
                "print(os.environ['HTTP_PROXY'], os.environ['https_proxy'])\n"
                "s = socket.create_connection(('127.0.0.1', 3128), timeout=5)\n"
                "s.sendall(b'connect example.com:443\\n')\n"
                "print(s.recv(100).decode().strip())\n"
                "print(sorted(n for n in os.listdir('/sys/class/net')) if os.path.exists('/sys/class/net') else 'lo')\n")
        r = sb.exec(["python3", "-c", code], timeout_s=10)
        lines = r.stdout.decode().splitlines()
        assert lines[0] == "http://127.0.0.1:3128 http://127.0.0.1:3128", r.stderr
        assert lines[1] == "CONNECT EXAMPLE.COM:443"
        assert seen == [b"connect example.com:443\n"]
        r = sb.exec(["sh", "-c", "cat /proc/net/dev | tail -n +3 | cut -d: -f1 | tr -d ' '"])
        assert r.stdout.split() == [b"lo"]   # still no network of its own


def test_a_half_closed_connection_through_the_relay_still_gets_its_answer(runtime, python_image, echo_unix_server):
    # a client that ends its request with shutdown(SHUT_WR) (HTTP/1.0 style, MCP's stdio link, `nc -N`)
    # must still read the answer: the relay passes the end on and keeps the other direction open
    path, seen = echo_unix_server
    with runtime.create(SandboxSpec(image=python_image, egress_socket=path)) as sb:
        code = ("import socket\n"
                "s = socket.create_connection(('127.0.0.1', 3128), timeout=5)\n"
                "s.sendall(b'no newline, then the end')\n"
                "s.shutdown(socket.SHUT_WR)\n"
                "got = b''\n"
                "while (chunk := s.recv(100)):\n"
                "    got += chunk\n"
                "print(got.decode())\n")
        r = sb.exec(["python3", "-c", code], timeout_s=10)
        assert r.stdout.decode().strip() == "NO NEWLINE, THEN THE END", r.stderr
        assert seen == [b"no newline, then the end"]


def test_without_egress_socket_nothing_listens_on_3128(runtime, busybox_image):
    with runtime.create(SandboxSpec(image=busybox_image)) as sb:
        r = sb.exec(["sh", "-c", "nc -w 1 127.0.0.1 3128 </dev/null; echo rc=$?; echo $HTTP_PROXY"])
        assert b"rc=0" not in r.stdout and r.stdout.endswith(b"\n\n")


def test_warm_pool_hands_out_each_sandbox_once_and_refills(runtime, busybox_image):
    spec = SandboxSpec(image=busybox_image)
    pool = runtime.pool(spec, target=3)
    try:
        assert pool.wait_ready(3, timeout_s=30)
        taken, handout_s = [], []
        for _ in range(3):
            t = time.perf_counter()
            sb = runtime.acquire(spec)
            handout_s.append(time.perf_counter() - t)
            taken.append(sb)
        assert len({sb.id for sb in taken}) == 3 and max(handout_s) < 0.05
        assert pool.handed_out == 3
        assert pool.wait_ready(3, timeout_s=30)             # refilled in the background
        assert not {sb.id for sb in taken} & {sb.id for sb in pool._ready}
        for sb in taken:
            assert sb.exec(["true"]).exit_code == 0
            sb.destroy()
        with_files = runtime.acquire(SandboxSpec(image=busybox_image, files={"t.txt": b"task"}))
        assert with_files.read_file("/work/t.txt") == b"task"
        with_files.destroy()
    finally:
        pool.stop()
        runtime._pools.clear()
    assert len(pool) == 0


def test_a_handout_never_waits_on_the_refill_threads_lock(runtime, busybox_image):
    spec = SandboxSpec(image=busybox_image, hostname="handout")
    pool = runtime.pool(spec, target=1)
    held, release, got = threading.Event(), threading.Event(), []

    def hold_the_lock() -> None:   # as the refill thread does while it appends
        with pool._wake:
            held.set()
            release.wait(30)
    holder = threading.Thread(target=hold_the_lock)
    try:
        assert pool.wait_ready(1, timeout_s=30)
        holder.start()
        assert held.wait(30)
        taker = threading.Thread(target=lambda: got.append(runtime.acquire(spec)))
        taker.start()
        taker.join(timeout=10)
        assert not taker.is_alive() and got and got[0].exec(["hostname"]).stdout == b"handout\n"
    finally:
        release.set()
        holder.join(timeout=30)
        for sb in got:
            sb.destroy()
        pool.stop()
        runtime._pools.clear()


def test_a_handout_allocates_nothing_the_garbage_collector_tracks(runtime, busybox_image):
    """So a handout can never start a collection (a gen-2 one takes milliseconds). gc callbacks
    and the threshold are process-wide, and a collection runs in the thread whose allocation
    started it: only collections started by this thread (the handout's) count, not those of
    the pool's refill thread or a thread an earlier test left. Three handouts are measured and
    one clean one suffices; a handout that allocates starts a collection every time."""
    spec = SandboxSpec(image=busybox_image, hostname="no-gc")
    pool = runtime.pool(spec, target=3)
    taken, clean = [], []
    try:
        assert pool.wait_ready(3, timeout_s=30)
        me = threading.get_ident()
        for _ in range(3):
            collections = []

            def seen(phase, info):
                if threading.get_ident() == me:
                    collections.append(phase)
            threshold = gc.get_threshold()
            gc.collect()
            gc.callbacks.append(seen)
            gc.set_threshold(1)   # any tracked allocation now starts a collection
            try:
                taken.append(runtime.acquire(spec))
            finally:
                gc.set_threshold(*threshold)
                gc.callbacks.remove(seen)
            assert taken[-1] is not None
            clean.append(collections == [])
        assert any(clean), clean
    finally:
        for sb in taken:
            sb.destroy()
        pool.stop()
        runtime._pools.clear()


def test_concurrent_acquire_exec_diff_destroy_from_several_threads(runtime, busybox_image):
    spec = SandboxSpec(image=busybox_image)
    pool = runtime.pool(spec, target=2)
    errors = []

    def work(i: int) -> None:
        for _ in range(3):
            try:
                sb = runtime.acquire(SandboxSpec(image=busybox_image, files={"x": str(i).encode()}))
                assert sb.exec(["cat", "/work/x"]).stdout == str(i).encode()
                sb.write_files({"/work/y": b"1"})
                assert [c.path for c in sb.diff("/work") if c.path == "/work/y"] == ["/work/y"]
                sb.destroy()
            except Exception as exc:  # noqa: BLE001 - collected and asserted below
                errors.append(repr(exc))

    threads = [threading.Thread(target=work, args=(i,)) for i in range(4)]
    try:
        for t in threads:
            t.start()
        for t in threads:
            t.join(timeout=120)
        assert errors == [] and pool.failures == 0
        assert runtime.mounted_images()   # the holder survived it all
    finally:
        pool.stop()
        runtime._pools.clear()
