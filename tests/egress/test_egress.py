"""The egress policy and the node proxy, against origin servers in network namespaces the tests
create. Names reach those origins only through the proxy's test resolver; the test treats its own
netns addresses as "public" through the injectable address ranges, while the production default
refuses them."""
from __future__ import annotations

import ipaddress
import json
import os
import shlex
import shutil
import socket
import ssl
import tempfile

import pytest

from controller.contracts.network import HostError, PolicyError, normalize_host, parse_policy
from nodeagent.egress.policy import PUBLIC, decide, parse_sni
from nodeagent.egress.proxy import EgressProxy
from tests.egress.netns import origin_netns

NET = 200 + os.getpid() % 50
HOST_ADDR, ORIGIN_ADDR = f"10.231.{NET}.1", f"10.231.{NET}.2"
TEST_RANGE = [ipaddress.ip_network(f"10.231.{NET}.0/24")]
HTTP_PORT, RAW_PORT = 8080, 8443

ORIGIN = r'''
import socket, sys, threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
class H(BaseHTTPRequestHandler):
    def do_GET(self):
        body = ("origin path=%s host=%s" % (self.path, self.headers.get("Host"))).encode()
        self.send_response(200); self.send_header("Content-Length", str(len(body))); self.end_headers()
        self.wfile.write(body)
    def log_message(self, *a): pass
def raw():
    s = socket.socket(); s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    s.bind(("0.0.0.0", RAW_PORT)); s.listen(16)
    while True:
        c, _ = s.accept()
        data = c.recv(65536)
        c.sendall(b"raw origin got %d bytes" % len(data)); c.close()
httpd = ThreadingHTTPServer(("0.0.0.0", HTTP_PORT), H)
threading.Thread(target=raw, daemon=True).start()
print("ready", flush=True)
httpd.serve_forever()
'''.replace("RAW_PORT", str(RAW_PORT)).replace("HTTP_PORT", str(HTTP_PORT))


@pytest.fixture(scope="module")
def origin():
    if os.geteuid() != 0:
        pytest.skip("creating network namespaces needs root")
    with origin_netns(f"pdk-eg-{os.getpid()}", f"pdkeg{os.getpid() % 100000}",
                      HOST_ADDR, ORIGIN_ADDR, ORIGIN) as ns:
        yield ns


NAMES = {"origin.example.com": [ORIGIN_ADDR], "a.origin.example.com": [ORIGIN_ADDR],
         "loop.example.com": ["127.0.0.1"], "metadata.example.com": ["169.254.169.254"],
         "node.example.com": [HOST_ADDR], "private.example.com": ["10.0.0.5"],
         "mixed.example.com": [ORIGIN_ADDR, "127.0.0.1"],
         "allowed.example.com.attacker.net": [ORIGIN_ADDR]}


def resolver(calls=None):
    def resolve(host, port):
        if calls is not None:
            calls.append(host)
        if host not in NAMES:
            raise OSError(f"test resolver: no name {host}")
        return NAMES[host]
    return resolve


@pytest.fixture
def proxy(origin):
    # Not under tmp_path: sandbox monitors run as subordinate uids and must traverse the path.
    sockets = tempfile.mkdtemp(prefix="paddock-egress-test-")
    p = EgressProxy(sockets, resolver=resolver(), allowed_networks=TEST_RANGE)
    yield p
    p.close_all()
    shutil.rmtree(sockets)


def ask(path: str, request: bytes, then: bytes = b"") -> bytes:
    with socket.socket(socket.AF_UNIX) as s:
        s.settimeout(10)
        s.connect(path)
        s.sendall(request)
        out = b""
        if then:
            while b"\r\n\r\n" not in out:
                chunk = s.recv(4096)
                if not chunk:
                    return out
                out += chunk
            s.sendall(then)
        while chunk := s.recv(65536):
            out += chunk
        return out


def get(path: str, url: str, host: str | None = None) -> bytes:
    host = host or url.split("/")[2]
    return ask(path, f"GET {url} HTTP/1.1\r\nHost: {host}\r\nProxy-Connection: keep-alive\r\n\r\n".encode())


def client_hello(sni: str) -> bytes:
    incoming, outgoing = ssl.MemoryBIO(), ssl.MemoryBIO()
    tls = ssl.create_default_context().wrap_bio(incoming, outgoing, server_hostname=sni)
    with pytest.raises(ssl.SSLWantReadError):
        tls.do_handshake()
    return outgoing.read()


POLICY = f"origin.example.com:{HTTP_PORT}|{RAW_PORT},*.origin.example.com:{HTTP_PORT},loop.example.com:{HTTP_PORT}," \
         f"metadata.example.com:{HTTP_PORT},node.example.com:{HTTP_PORT},private.example.com:{HTTP_PORT}," \
         f"mixed.example.com:{HTTP_PORT}"


def test_absolute_uri_http_reaches_the_allowed_origin_with_the_decision_logged(proxy):
    path = proxy.open("sb1", parse_policy(POLICY))
    out = get(path, f"http://Origin.Example.COM.:{HTTP_PORT}/pkg?x=1")
    assert out.startswith(b"HTTP/1.0 200")
    assert out.endswith(f"origin path=/pkg?x=1 host=origin.example.com:{HTTP_PORT}".encode())
    (d,) = proxy.decisions("sb1")
    assert (d["sandbox"], d["host"], d["port"], d["address"], d["verdict"], d["reason"]) == \
        ("sb1", "origin.example.com", HTTP_PORT, ORIGIN_ADDR, "allow", "allowed")


@pytest.mark.parametrize("url,reason", [
    (f"http://other.example.com:{HTTP_PORT}/", "host_not_allowed"),
    (f"http://allowed.example.com.attacker.net:{HTTP_PORT}/", "host_not_allowed"),
    (f"http://{ORIGIN_ADDR}:{HTTP_PORT}/", "ip_literal"),
    (f"http://user:pw@origin.example.com:{HTTP_PORT}/", "userinfo"),
    ("http://origin.example.com:9999/", "port_not_allowed"),
    (f"http://loop.example.com:{HTTP_PORT}/", "address_is_node"),
    (f"http://metadata.example.com:{HTTP_PORT}/", "address_not_public"),
    (f"http://node.example.com:{HTTP_PORT}/", "address_is_node"),
    (f"http://private.example.com:{HTTP_PORT}/", "address_not_public"),
    (f"http://mixed.example.com:{HTTP_PORT}/", "address_is_node"),
])
def test_refused_requests_get_403_with_the_reason(proxy, url, reason):
    path = proxy.open("sb1", parse_policy(POLICY))
    out = get(path, url, host="x")
    assert out.startswith(b"HTTP/1.1 403") and f"X-Paddock-Egress: {reason}".encode() in out
    (d,) = proxy.decisions("sb1")
    assert (d["verdict"], d["reason"]) == ("deny", reason)


def test_a_host_header_that_differs_from_the_uri_is_refused(proxy):
    path = proxy.open("sb1", parse_policy(POLICY))
    out = get(path, f"http://origin.example.com:{HTTP_PORT}/", host="evil.example.net")
    assert b"host_header_mismatch" in out and proxy.decisions("sb1")[0]["verdict"] == "deny"


def test_the_vetted_address_is_dialled_and_the_name_is_resolved_once(tmp_path, origin):
    calls = []
    p = EgressProxy(str(tmp_path / "e"), resolver=resolver(calls), allowed_networks=TEST_RANGE)
    try:
        path = p.open("sb", parse_policy(POLICY))
        assert get(path, f"http://a.origin.example.com:{HTTP_PORT}/").startswith(b"HTTP/1.0 200")
        assert calls == ["a.origin.example.com"]
    finally:
        p.close_all()


def test_connect_with_a_matching_sni_tunnels_the_client_hello(proxy):
    path = proxy.open("sb1", parse_policy(POLICY))
    hello = client_hello("origin.example.com")
    out = ask(path, f"CONNECT origin.example.com:{RAW_PORT} HTTP/1.1\r\nHost: x\r\n\r\n".encode(), then=hello)
    assert out == b"HTTP/1.1 200 Connection established\r\n\r\n" + b"raw origin got %d bytes" % len(hello)
    assert [(d["verdict"], d["reason"]) for d in proxy.decisions("sb1")] == [("allow", "allowed")]


@pytest.mark.parametrize("then,reason", [
    (lambda: client_hello("evil.example.net"), "sni_mismatch"),
    (lambda: b"GET / HTTP/1.1\r\n\r\n", "not_tls"),
])
def test_connect_refuses_a_wrong_sni_or_plain_bytes_without_dialling(proxy, then, reason):
    path = proxy.open("sb1", parse_policy(POLICY))
    out = ask(path, f"CONNECT origin.example.com:{RAW_PORT} HTTP/1.1\r\n\r\n".encode(), then=then())
    assert out == b"HTTP/1.1 200 Connection established\r\n\r\n"    # closed: nothing from the origin
    assert [(d["verdict"], d["reason"]) for d in proxy.decisions("sb1")] == [("deny", reason)]


def test_each_sandbox_has_its_own_socket_policy_and_log(proxy):
    open_path = proxy.open("open", parse_policy(POLICY))
    closed_path = proxy.open("closed", parse_policy("none"))
    assert get(open_path, f"http://origin.example.com:{HTTP_PORT}/").startswith(b"HTTP/1.0 200")
    assert get(closed_path, f"http://origin.example.com:{HTTP_PORT}/").startswith(b"HTTP/1.1 403")
    assert [d["reason"] for d in proxy.decisions("open")] == ["allowed"]
    assert [d["reason"] for d in proxy.decisions("closed")] == ["network_none"]
    assert [d["reason"] for d in proxy.close("closed")] == ["network_none"] and not os.path.exists(closed_path)


def test_malformed_requests_are_400_not_a_crash(proxy):
    path = proxy.open("sb1", parse_policy(POLICY))
    assert ask(path, b"\x16\x03\x01garbage\r\n\r\n").startswith(b"HTTP/1.1 400")
    assert ask(path, b"GET /relative HTTP/1.1\r\nHost: origin.example.com\r\n\r\n").startswith(b"HTTP/1.1 400")
    assert ask(path, b"GET http://[::1/x HTTP/1.1\r\n\r\n").startswith(b"HTTP/1.1 400")
    assert ask(path, b"CONNECT origin.example.com:99999 HTTP/1.1\r\n\r\n").startswith(b"HTTP/1.1 403")
    assert get(path, f"http://origin.example.com:{HTTP_PORT}/").startswith(b"HTTP/1.0 200")


# --- the pure rules --------------------------------------------------------------------------

def test_hosts_are_normalised_for_case_trailing_dot_and_idna():
    assert normalize_host("PyPI.Org.") == "pypi.org"
    assert normalize_host("Bücher.example.com") == "xn--bcher-kva.example.com"
    for literal in ("127.0.0.1", "2130706433", "0x7f.1", "127.1", "[::1]", "::1"):
        with pytest.raises(HostError) as e:
            normalize_host(literal)
        assert e.value.args[0] == "ip_literal", literal


@pytest.mark.parametrize("entry", ["*.github.io", "*.co.uk", "*.com", "github.io", "com", "10.0.0.1",
                                   "a*.example.com", "example.com:0", "example.com:http"])
def test_bad_allowlist_entries_are_refused_with_a_message_naming_them(entry):
    with pytest.raises(PolicyError, match=entry.replace("*", r"\*").replace(".", r"\.")):
        parse_policy(entry)


def test_matching_is_by_registrable_domain_including_the_private_section():
    p = parse_policy("*.mine.github.io,pypi.org:443")
    ok = lambda h, port=443: decide(p, h, port, lambda *_: ["93.184.216.34"]).reason  # noqa: E731
    assert ok("x.mine.github.io") == "allowed"
    assert ok("theirs.github.io") == "host_not_allowed"
    assert ok("pypi.org") == "allowed" and ok("pypi.org", 80) == "port_not_allowed"
    assert ok("pypi.org.attacker.net") == "host_not_allowed" and ok("evilpypi.org") == "host_not_allowed"


def test_the_production_address_rule_refuses_the_test_netns_addresses():
    p = parse_policy("origin.example.com")
    for addr in (ORIGIN_ADDR, "169.254.169.254", "127.0.0.1", "100.64.0.1", "fe80::1", "::ffff:10.0.0.1"):
        d = decide(p, "origin.example.com", 80, lambda *_: [addr], PUBLIC)
        assert d.reason in ("address_not_public", "address_is_node"), addr
    assert decide(p, "origin.example.com", 80, lambda *_: ["93.184.216.34"], PUBLIC).allowed


def test_sni_parser_reads_the_host_name_of_a_real_client_hello():
    assert parse_sni(client_hello("a.example.com")) == "a.example.com"


def test_cli_check_prints_the_decision_and_reason(capsys):
    from controller.cli.main import main
    assert main(["egress", "check", "--allow", "pypi.org,*.pythonhosted.org:443", "--resolve",
                 "files.pythonhosted.org=151.101.0.223", "https://Files.PythonHosted.org./p"]) == 0
    assert capsys.readouterr().out.startswith("allow allowed: files.pythonhosted.org:443 -> 151.101.0.223")
    assert main(["egress", "check", "--allow", "pypi.org", "https://pypi.org.attacker.net/"]) == 1
    assert capsys.readouterr().out.startswith("deny host_not_allowed: pypi.org.attacker.net:443")
    assert main(["egress", "check", "--allow", "pypi.org", "--resolve", "pypi.org=169.254.169.254",
                 "http://pypi.org/"]) == 1
    assert "deny address_not_public" in capsys.readouterr().out
    assert main(["egress", "check", "--allow", "*.github.io", "http://a.github.io/"]) == 2
    assert "wildcard over the public suffix" in capsys.readouterr().err


# --- end to end: a sandbox reaches an origin only through its own proxy socket -------------

FETCH = ("import sys, urllib.request\n"
         "try:\n    print(urllib.request.urlopen(sys.argv[1], timeout=10).read().decode())\n"
         "except Exception as e:\n    print('failed:', e)\n")


@pytest.mark.sandbox
def test_a_sandbox_reaches_an_allowed_origin_through_the_proxy_and_nothing_else(proxy, runtime, python_image):
    from nodeagent.sandbox.runtime import SandboxSpec
    path = proxy.open("e2e", parse_policy(POLICY))
    box = runtime.create(SandboxSpec(image=python_image, egress_socket=path))
    try:
        def fetch(url):
            return box.exec(["python3", "-c", FETCH, url], timeout_s=20).stdout.decode()
        assert fetch(f"http://origin.example.com:{HTTP_PORT}/hi").startswith("origin path=/hi")
        assert "403" in fetch(f"http://other.example.com:{HTTP_PORT}/")
        direct = box.exec(["python3", "-c", "import socket; socket.create_connection((%r, %d), timeout=3)"
                           % (ORIGIN_ADDR, HTTP_PORT)], timeout_s=20)
        assert direct.exit_code != 0     # no route except through the proxy
    finally:
        box.destroy()
    assert [(d["host"], d["reason"]) for d in proxy.decisions("e2e")] == [
        ("origin.example.com", "allowed"), ("other.example.com", "host_not_allowed")]


@pytest.mark.sandbox
def test_a_rollout_with_an_allowlist_records_its_egress_decisions_in_the_trajectory(proxy, runtime, python_image,
                                                                                   tmp_path):
    import duckdb

    from controller.taskbank.builtin import builtin_taskset
    from nodeagent.agent.attempt import Attempt, run_attempt
    from nodeagent.egress import proxy as egress
    from tests.harness.test_harness import FakeModel, reply
    t = next(t for t in builtin_taskset().tasks if t.family == "python")
    task = {**t.canonical(), "task_id": t.task_id, "network": POLICY}
    url = f"http://origin.example.com:{HTTP_PORT}/simple"
    model = FakeModel([reply(calls=[("shell", json.dumps({"command": f"python3 -c {shlex.quote(FETCH)} {url}"}))]),
                       reply("done")])
    previous = egress.set_node_proxy(proxy)
    try:
        res = run_attempt(runtime, python_image, "n1", Attempt("run", str(tmp_path), "r1", 1, 1, "b", 0, task, 0,
                                                               model.url, "m"))
    finally:
        egress.set_node_proxy(previous)
        model.close()
    assert res.infra_reason is None, res.infra_reason
    steps = duckdb.sql(f"SELECT observation FROM '{tmp_path / res.shards['steps']}' ORDER BY step").fetchall()
    assert steps[0][0].startswith("origin path=/simple"), steps
    rows = duckdb.sql(f"SELECT sandbox, host, port, address, verdict, reason "
                      f"FROM '{tmp_path / res.shards['egress']}'").fetchall()
    assert rows == [("r1.1", "origin.example.com", HTTP_PORT, ORIGIN_ADDR, "allow", "allowed")]
    assert proxy.decisions("r1.1") == []   # the socket is closed with the sandbox
    spans = duckdb.sql(f"SELECT kind, start_s, duration_s FROM '{tmp_path / res.shards['spans']}'").fetchall()
    assert [k for k, _, _ in spans] == ["sandbox_start", "model_call", "tool_call", "model_call", "verification"]
    assert all(a[1] + a[2] <= b[1] + 1e-6 for a, b in zip(spans, spans[1:])), spans   # one clock, no overlap


def test_connections_beyond_the_per_sandbox_cap_are_refused_and_logged(proxy, monkeypatch):
    from nodeagent.egress import proxy as egress
    monkeypatch.setattr(egress, "MAX_CONNECTIONS_PER_SANDBOX", 1)
    path = proxy.open("sb1", parse_policy(POLICY))
    with socket.socket(socket.AF_UNIX) as held:
        held.connect(path)
        held.sendall(b"GET http://origin.example.com")      # an unfinished head keeps it open
        with socket.socket(socket.AF_UNIX) as extra:
            extra.settimeout(10)
            extra.connect(path)
            assert extra.recv(4096).startswith(b"HTTP/1.1 403")
    assert [d["reason"] for d in proxy.decisions("sb1")][:1] == ["too_many_connections"]


def test_hostile_request_heads_never_kill_a_proxy_thread(proxy, monkeypatch):
    import random
    import threading
    crashes = []
    monkeypatch.setattr(threading, "excepthook", lambda args: crashes.append(args.exc_value))
    path = proxy.open("fuzz", parse_policy(POLICY))
    rng = random.Random(8)
    pieces = ["GET", "CONNECT", "POST", "http://", "https://", "[", "]", "::1", "@", ":", "%00", "origin.example.com",
              "xn--", "ü", "..", "/", " ", "HTTP/1.1", "\r\n", "Host: ", "*", "99999", "-1", "\x00", "\xff"]
    for _ in range(150):
        head = "".join(rng.choice(pieces) for _ in range(rng.randint(1, 12)))
        out = ask(path, head.encode("utf-8", "surrogateescape") + b"\r\n\r\n")
        assert out == b"" or out.startswith(b"HTTP/1.1 "), (head, out[:80])
    assert crashes == []
    assert get(path, f"http://origin.example.com:{HTTP_PORT}/").startswith(b"HTTP/1.0 200")


def test_a_socket_that_cannot_be_made_is_an_infrastructure_error(tmp_path):
    from nodeagent.egress.proxy import EgressError
    from nodeagent.sandbox.runtime import SandboxError
    p = EgressProxy(str(tmp_path / "e"), resolver=resolver())
    with pytest.raises(EgressError, match="x" * 200) as e:
        p.open("x" * 200, parse_policy(POLICY))      # AF_UNIX paths are limited to 108 bytes
    assert isinstance(e.value, SandboxError)


def test_socket_dirs_of_a_killed_node_agent_are_swept_and_live_ones_kept(tmp_path):
    import signal
    import subprocess
    import sys

    from nodeagent.egress import proxy as egress
    child = ("import sys\nfrom nodeagent.egress import proxy as egress\n"
             f"d, _ = egress._own_socket_dir({str(tmp_path)!r})\n"
             "print(d, flush=True)\nsys.stdin.read()\n")
    procs = [subprocess.Popen([sys.executable, "-c", child], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                              text=True, cwd=os.getcwd()) for _ in range(2)]
    try:
        dead_dir, live_dir = (p.stdout.readline().strip() for p in procs)
        procs[0].send_signal(signal.SIGKILL)
        procs[0].wait()
        foreign = tmp_path / "paddock-egress-not-ours"          # no owner lock: not ours to remove
        foreign.mkdir()
        assert egress.sweep_socket_dirs(str(tmp_path)) == [dead_dir]
        assert not os.path.exists(dead_dir) and os.path.isdir(live_dir) and foreign.is_dir()
    finally:
        for p in procs:
            if p.poll() is None:
                p.stdin.close()
                p.wait()
