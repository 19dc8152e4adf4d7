"""The network policy: what a task's `network` field means.

`network` is "none" (the default: no network device, no route, no proxy socket) or an allowlist:
a comma-separated string, a list, or {"allow": [...]} of entries `host`, `host:443`,
`host:80|443`, `*.domain` (ports default to 80 and 443). `parse_policy(network)` returns the
`Policy` (its `Rule`s) or raises `PolicyError` naming the bad entry: IP literals, userinfo, a
`*` other than a leading `*.`, and rules over a public suffix are refused. Host names are
normalised by `normalize_host` (lower-case A-label form without a trailing dot, UTS 46 IDNA;
`HostError(reason, message)` otherwise) and a rule matches a host only within the rule's own
registrable domain (`registrable_domain`, the Public Suffix List with its private section),
never by a bare suffix match.

What the node does with a Policy (resolving, vetting addresses, the proxy) is
`nodeagent.egress`. A leaf of the contracts: no sockets (`socket.inet_aton` only parses), no
processes; the Public Suffix List is read once from its package, at the first use. Must not import:
zmq, sqlite3, controller.* outside contracts, nodeagent.
"""
from __future__ import annotations

import functools
import ipaddress
import re
import socket
from dataclasses import dataclass
from typing import Iterable

import idna
from publicsuffixlist import PublicSuffixList

DEFAULT_PORTS = (80, 443)


@functools.cache
def _psl() -> PublicSuffixList:
    """The Public Suffix List, ICANN and private sections (read at the first use: a tenth
    of a second that a controller which never parses a policy need not spend at start)."""
    return PublicSuffixList(only_icann=False)


_LABEL = re.compile(r"^(?!-)[a-z0-9-]{1,63}(?<!-)$")


class PolicyError(ValueError):
    """A network policy is malformed; the message names the bad entry."""


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


def registrable_domain(host: str) -> str | None:
    """The registrable domain (eTLD+1) of a normalised host; None for a public suffix itself."""
    return _psl().privatesuffix(host)


@dataclass(frozen=True)
class Rule:
    host: str                 # normalised; for a wildcard, the part after "*."
    wildcard: bool
    ports: tuple[int, ...]
    registrable: str          # the registrable domain (eTLD+1) the rule lives in

    def matches(self, host: str, registrable: str | None = None) -> bool:
        """`host` is normalised. Never a bare suffix match: the host's own registrable domain
        must equal the rule's (so allowed.example.com.attacker.net never matches)."""
        if (registrable if registrable is not None else registrable_domain(host)) != self.registrable:
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
    ports: tuple[int, ...]
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
    registrable = registrable_domain(name)
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


__all__ = ["DEFAULT_PORTS", "HostError", "Policy", "PolicyError", "Rule", "normalize_host", "parse_policy",
           "registrable_domain"]
