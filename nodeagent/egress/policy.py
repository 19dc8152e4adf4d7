"""The egress policy, as pure functions: hosts, allowlists, the decision, the TLS ClientHello's SNI.

`parse_policy(task["network"])` → `Policy`; `normalize_host`; `decide(policy, host, port,
resolver, allowed_networks, own)` → `Decision` (allow/deny, reason, the vetted address);
`split_authority` for request targets; `client_hello_length` / `parse_sni` for CONNECT. No
sockets here (the resolver is passed in): `nodeagent.egress.proxy` is the proxy that does the I/O.
See docs/egress.md. Must not import zmq or the controller.
"""
from __future__ import annotations

import ipaddress
import logging
import re
import socket
import struct
from dataclasses import dataclass
from typing import Callable, Iterable, Sequence

import idna
from publicsuffixlist import PublicSuffixList

log = logging.getLogger(__name__)

DEFAULT_PORTS = (80, 443)

Address = ipaddress.IPv4Address | ipaddress.IPv6Address
Network = ipaddress.IPv4Network | ipaddress.IPv6Network
Resolver = Callable[[str, int], Sequence[str]]

_PSL = PublicSuffixList(only_icann=False)   # ICANN and private sections
_LABEL = re.compile(r"^(?!-)[a-z0-9-]{1,63}(?<!-)$")


class PolicyError(ValueError):
    """A network policy is malformed; the message names the bad entry."""


# ---------------------------------------------------------------------------------------------
# Hosts and the policy.

class HostError(ValueError):
    """A host that cannot be allowed: the first arg is the reason code."""


def _is_ip_literal(host: str) -> bool:
    h = host.strip("[]")
    try:
        ipaddress.ip_address(h)
        return True
    except ValueError:
        pass
    try:   # the legacy forms inet_aton accepts: 2130706433, 0x7f.1, 127.1, 017700000001
        socket.inet_aton(h)
        return True
    except OSError:
        return False


def normalize_host(host: str) -> str:
    """Lower-case A-label form without a trailing dot; HostError(reason) if it is not a DNS name."""
    if not isinstance(host, str) or not host:
        raise HostError("invalid_host", "empty host")
    if "@" in host:
        raise HostError("userinfo", f"host {host!r} carries userinfo")
    if _is_ip_literal(host):
        raise HostError("ip_literal", f"{host!r} is an IP literal; only names may be allowed")
    h = host[:-1] if host.endswith(".") else host
    if h.isascii() and "xn--" not in h.lower():
        h = h.lower()          # UTS 46 maps plain ASCII LDH names to lower case only
    else:
        try:
            h = idna.encode(h, uts46=True).decode("ascii")
        except (idna.IDNAError, UnicodeError) as exc:
            raise HostError("invalid_host", f"host {host!r} is not a valid IDNA name: {exc}") from None
    labels = h.split(".")
    if len(h) > 253 or len(labels) < 2 or not all(_LABEL.match(x) for x in labels):
        raise HostError("invalid_host", f"host {host!r} is not a valid DNS name")
    if labels[-1].isdigit() or _is_ip_literal(h):
        raise HostError("ip_literal", f"{host!r} reads as an IP address")
    return h


@dataclass(frozen=True)
class Rule:
    host: str                 # normalised; for a wildcard, the part after "*."
    wildcard: bool
    ports: tuple[int, ...]
    registrable: str          # the registrable domain (eTLD+1) the rule lives in

    def matches(self, host: str, registrable: str | None = None) -> bool:
        """`host` is normalised. Never a bare suffix match: the host's own registrable domain
        must equal the rule's (so allowed.example.com.attacker.net never matches)."""
        if (registrable if registrable is not None else _PSL.privatesuffix(host)) != self.registrable:
            return False
        return host.endswith("." + self.host) if self.wildcard else host == self.host


@dataclass(frozen=True)
class Policy:
    rules: tuple[Rule, ...] = ()

    @property
    def none(self) -> bool:
        return not self.rules

    def describe(self) -> str:
        return ",".join(f"{'*.' if r.wildcard else ''}{r.host}:{'|'.join(map(str, r.ports))}"
                        for r in self.rules) or "none"


def _parse_entry(entry: str) -> Rule:
    if not isinstance(entry, str) or not entry.strip():
        raise PolicyError(f"network allowlist entry {entry!r} must be a non-empty string 'host[:port|port]'")
    text = entry.strip()
    host, ports = text, DEFAULT_PORTS
    if text.count(":") == 1:
        host, port_text = text.split(":")
        try:
            ports = tuple(sorted({int(p) for p in port_text.split("|")}))
        except ValueError:
            raise PolicyError(f"network allowlist entry {entry!r}: ports must be integers joined by '|'") from None
        if not all(0 < p < 65536 for p in ports):
            raise PolicyError(f"network allowlist entry {entry!r}: ports must be in 1..65535")
    elif ":" in text:
        raise PolicyError(f"network allowlist entry {entry!r}: IP literals are not allowed")
    wildcard = host.startswith("*.")
    if "*" in (host[2:] if wildcard else host):
        raise PolicyError(f"network allowlist entry {entry!r}: '*' is allowed only as a leading '*.'")
    if wildcard and "." not in host[2:].strip("."):
        raise PolicyError(f"network allowlist entry {entry!r} is a wildcard over the public suffix {host[2:]!r}")
    try:
        name = normalize_host(host[2:] if wildcard else host)
    except HostError as exc:
        raise PolicyError(f"network allowlist entry {entry!r}: {exc.args[1]}") from None
    registrable = _PSL.privatesuffix(name)
    if registrable is None:
        kind = "a wildcard over the public suffix" if wildcard else "the public suffix"
        raise PolicyError(f"network allowlist entry {entry!r} is {kind} {name!r}: name a registrable domain")
    return Rule(name, wildcard, ports, registrable)


def parse_policy(network: object) -> Policy:
    """A task's `network` field: "none" (default), or an allowlist — a comma-separated string or a
    list of entries `host`, `host:443`, `host:80|443`, `*.domain` (ports default to 80 and 443)."""
    if network is None or network == "none":
        return Policy()
    if isinstance(network, str):
        entries: Iterable = [e for e in network.split(",") if e.strip()]
    elif isinstance(network, dict) and set(network) == {"allow"} and isinstance(network["allow"], list):
        entries = network["allow"]
    elif isinstance(network, (list, tuple)):
        entries = network
    else:
        raise PolicyError(f"network policy must be 'none', a list of hosts or {{'allow': [...]}}, got {network!r}")
    rules = tuple(_parse_entry(e) for e in entries)
    if not rules:
        raise PolicyError("network allowlist is empty: use 'none'")
    return Policy(rules)


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
    registrable = _PSL.privatesuffix(host) or ""
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


__all__ = ["DEFAULT_PORTS", "PUBLIC", "ClientHelloError", "Decision", "HostError", "Policy", "PolicyError", "Resolver",
           "Rule", "address_allowed", "client_hello_length", "decide", "normalize_host", "parse_policy", "parse_sni",
           "split_authority"]
