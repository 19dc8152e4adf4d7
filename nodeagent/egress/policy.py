"""The egress decision, as pure functions: may this request go out, and to which address.

`decide(policy, host, port, resolver, allowed_networks, own)` → `Decision` (allow/deny, a reason
code, the vetted address): the host is normalised and matched against the task's `Policy`
(`controller.contracts.network`, which also parses the task's `network` field), resolved through
the resolver passed in, and every answer must be a dialable public address (`address_allowed`:
not loopback, link-local, multicast, unspecified, the node's own, nor outside
`allowed_networks`). `split_authority` parses request targets; `client_hello_length` /
`parse_sni` read a TLS ClientHello's SNI for CONNECT. No sockets here (the resolver is passed
in): `nodeagent.egress.proxy` is the proxy that does the I/O. See docs/egress.md.
Must not import zmq, controller.* outside contracts, nodeagent.agent.
"""
from __future__ import annotations

import ipaddress
import logging
import struct
from dataclasses import dataclass
from typing import Callable, Sequence

from controller.contracts.network import HostError, Policy, normalize_host, registrable_domain

log = logging.getLogger(__name__)

Address = ipaddress.IPv4Address | ipaddress.IPv6Address
Network = ipaddress.IPv4Network | ipaddress.IPv6Network
Resolver = Callable[[str, int], Sequence[str]]


# ---------------------------------------------------------------------------------------------
# The decision (pure).

PUBLIC = "public"   # the production address rule: ipaddress's is_global, minus the node's own


@dataclass(frozen=True)
class Decision:
    verdict: str               # allow | deny
    reason: str
    host: str
    port: int
    address: str | None = None

    @property
    def allowed(self) -> bool:
        return self.verdict == "allow"


def address_allowed(addr: str, allowed_networks: Sequence[Network] | str, own: frozenset[str]) -> str | None:
    """None if `addr` may be dialled, else the reason it may not."""
    try:
        ip = ipaddress.ip_address(addr)
    except ValueError:
        return "address_invalid"
    if isinstance(ip, ipaddress.IPv6Address) and ip.ipv4_mapped is not None:
        ip = ip.ipv4_mapped
    if str(ip) in own:
        return "address_is_node"
    if ip.is_loopback or ip.is_link_local or ip.is_multicast or ip.is_unspecified:
        return "address_not_public"
    if allowed_networks == PUBLIC:
        return None if ip.is_global else "address_not_public"
    return None if any(ip in n for n in allowed_networks) else "address_not_public"


def decide(policy: Policy, host: str, port: int, resolver: Resolver,
           allowed_networks: Sequence[Network] | str = PUBLIC, own: frozenset[str] = frozenset()) -> Decision:
    """Whether a request for host:port may go out, and to which address."""
    raw = host
    if policy.none:
        return Decision("deny", "network_none", raw, port)
    try:
        host = normalize_host(host)
    except HostError as exc:
        return Decision("deny", exc.args[0], raw, port)
    registrable = registrable_domain(host) or ""
    rules = [r for r in policy.rules if r.matches(host, registrable)]
    if not rules:
        return Decision("deny", "host_not_allowed", host, port)
    if not any(port in r.ports for r in rules):
        return Decision("deny", "port_not_allowed", host, port)
    try:
        addrs = list(dict.fromkeys(resolver(host, port)))
    except (OSError, ValueError) as exc:
        log.info("egress resolve failed host=%s: %s", host, exc)
        return Decision("deny", "resolve_failed", host, port)
    if not addrs:
        return Decision("deny", "resolve_failed", host, port)
    for a in addrs:   # every answer must pass: a mixed answer is a rebinding attempt
        why = address_allowed(a, allowed_networks, own)
        if why:
            return Decision("deny", why, host, port, a)
    return Decision("allow", "allowed", host, port, addrs[0])


def split_authority(authority: str, default_port: int | None) -> tuple[str, int]:
    """(host, port) of a request target's authority; HostError(reason) for userinfo, an IPv6
    literal, a missing (CONNECT) or malformed port."""
    if "@" in authority:
        raise HostError("userinfo", "userinfo in the request target")
    if authority.startswith("["):
        host, _, tail = authority[1:].partition("]")
        port_text = tail[1:] if tail.startswith(":") else ""
    elif authority.count(":") == 1:
        host, port_text = authority.split(":")
    elif ":" in authority:
        raise HostError("ip_literal", "an IPv6 literal")
    else:
        host, port_text = authority, ""
    if not port_text:
        if default_port is None:
            raise HostError("bad_request", "CONNECT target has no port")
        return host, default_port
    if not port_text.isdigit() or not 0 < int(port_text) < 65536:
        raise HostError("bad_request", f"bad port {port_text!r}")
    return host, int(port_text)


# ---------------------------------------------------------------------------------------------
# TLS ClientHello: the SNI host name.

class ClientHelloError(ValueError):
    pass


def client_hello_length(buf: bytes) -> int | None:
    """Bytes of TLS records needed to hold the whole ClientHello, or None if not known yet."""
    if len(buf) < 9:
        return None
    if buf[0] != 0x16:
        raise ClientHelloError("not a TLS handshake record")
    if buf[5] != 0x01:
        raise ClientHelloError("first handshake message is not a ClientHello")
    need = 4 + int.from_bytes(buf[6:9], "big")   # handshake header + body
    total, have, pos = 0, 0, 0
    while have < need:
        if len(buf) < pos + 5:
            return None
        if buf[pos] != 0x16:
            raise ClientHelloError("ClientHello interleaved with a non-handshake record")
        rec_len = int.from_bytes(buf[pos + 3:pos + 5], "big")
        pos += 5 + rec_len
        have += rec_len
        total = pos
    return total


def parse_sni(buf: bytes) -> str | None:
    """The server_name (host_name) of a complete ClientHello in `buf` (TLS records), or None."""
    hs, pos = b"", 0
    while pos + 5 <= len(buf):
        rec_len = int.from_bytes(buf[pos + 3:pos + 5], "big")
        hs += buf[pos + 5:pos + 5 + rec_len]
        pos += 5 + rec_len
    try:
        body = hs[4:4 + int.from_bytes(hs[1:4], "big")]
        p = 2 + 32                                        # client_version, random
        p += 1 + body[p]                                  # session_id
        p += 2 + int.from_bytes(body[p:p + 2], "big")     # cipher_suites
        p += 1 + body[p]                                  # compression_methods
        if p >= len(body):
            return None
        end = p + 2 + int.from_bytes(body[p:p + 2], "big")
        p += 2
        while p + 4 <= end:
            etype, elen = struct.unpack("!HH", body[p:p + 4])
            data = body[p + 4:p + 4 + elen]
            p += 4 + elen
            if etype != 0:
                continue
            q = 2
            while q + 3 <= len(data):
                ntype, nlen = data[q], int.from_bytes(data[q + 1:q + 3], "big")
                name = data[q + 3:q + 3 + nlen]
                if ntype == 0:
                    return name.decode("ascii")
                q += 3 + nlen
            return None
    except (IndexError, UnicodeDecodeError) as exc:
        raise ClientHelloError(f"malformed ClientHello: {exc}") from None
    return None


__all__ = ["PUBLIC", "Address", "ClientHelloError", "Decision", "Network", "Resolver", "address_allowed",
           "client_hello_length", "decide", "parse_sni", "split_authority"]
