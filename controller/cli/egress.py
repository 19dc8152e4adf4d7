"""`paddock egress check --allow HOSTS [--resolve HOST=ADDR ...] URL`: print the egress decision.

Runs the node proxy's own decision (`nodeagent.egress.policy.decide`) for one URL (`http://…`,
`https://…`) or CONNECT target (`host:port`), so an operator can see why a task's request is
allowed or refused. Exit 0 allowed, 1 refused, 2 invalid policy or arguments.
"""
from __future__ import annotations

import argparse
import sys
import urllib.parse
from typing import TextIO

from controller.contracts.network import HostError, PolicyError, parse_policy
from nodeagent.egress.policy import decide, split_authority
from nodeagent.egress.proxy import node_addresses, system_resolver

DEFAULT_PORTS = {"http": 80, "https": 443}


def target(url: str) -> tuple[str, int]:
    """(host, port) of a URL or a host:port CONNECT target; HostError(reason) when refused."""
    if "://" not in url:
        return split_authority(url, None)
    u = urllib.parse.urlsplit(url)
    if u.scheme not in DEFAULT_PORTS:
        raise HostError("bad_request", f"scheme {u.scheme!r} is not proxied (http, https)")
    return split_authority(u.netloc, DEFAULT_PORTS[u.scheme])


def check(allow: str, url: str, resolve: list[str] | None = None, out: TextIO | None = None) -> int:
    out = out or sys.stdout
    try:
        policy = parse_policy(allow or "none")
        mapping = {}
        for item in resolve or []:
            name, sep, addr = item.partition("=")
            if not sep or not name or not addr:
                raise PolicyError(f"--resolve {item!r} must be HOST=ADDR[,ADDR]")
            mapping[name.lower().rstrip(".")] = addr.split(",")
    except PolicyError as exc:
        print(f"paddock egress: error: {exc}", file=sys.stderr)
        return 2
    resolver = (lambda host, port: mapping[host] if host in mapping else system_resolver(host, port))
    try:
        host, port = target(url)
    except HostError as exc:
        print(f"deny {exc.args[0]}: {url} ({exc.args[1]})", file=out)
        return 1
    d = decide(policy, host, port, resolver, own=node_addresses())
    addr = f" -> {d.address}" if d.address else ""
    print(f"{d.verdict} {d.reason}: {d.host}:{d.port}{addr} (policy {policy.describe()})", file=out)
    return 0 if d.allowed else 1


def register(subparsers: argparse._SubParsersAction) -> argparse.ArgumentParser:
    p = subparsers.add_parser("egress", help="egress policy tools")
    sub = p.add_subparsers(dest="egress_cmd", required=True)
    c = sub.add_parser("check", help="print the proxy's decision and reason for a URL under an allowlist",
                       description="Example: paddock egress check --allow 'pypi.org,*.pythonhosted.org:443' "
                                   "https://files.pythonhosted.org/packages/")
    c.add_argument("--allow", default="none",
                   help="comma-separated allowlist: host, host:443, host:80|443, *.domain (default: none)")
    c.add_argument("--resolve", action="append", metavar="HOST=ADDR",
                   help="answer for HOST instead of DNS (repeatable)")
    c.add_argument("url", help="http(s)://host[:port]/path or host:port")
    c.set_defaults(func=lambda a: check(a.allow, a.url, a.resolve))
    return p
