"""Pure egress policy: which names are allowed, which answers are acceptable, how long for.

Nothing here touches the network or the kernel, so every rule is unit-tested directly.
"""

from __future__ import annotations

import ipaddress
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from linpodx.profile.egressentry import Rule, split_entry

IPAddress = ipaddress.IPv4Address | ipaddress.IPv6Address

MIN_TTL = 30
"""Shortest time an address stays in the allowed set (and in our answer cache)."""
MAX_TTL = 3600
"""Longest time an address stays in the allowed set without a fresh lookup."""

DEFAULT_DNS_PORT = 53

# Addresses the network helper itself answers on inside the container's network (slirp4netns'
# gateway = the host's loopback when not disabled, and its DNS forwarder; pasta maps the gateway
# to the host). An answer naming one of them would hand the agent a path around the resolver,
# so they are refused even when `allow_private_answers` is true.
HELPER_NETWORKS: tuple[ipaddress.IPv4Network | ipaddress.IPv6Network, ...] = (
    ipaddress.ip_network("10.0.2.0/24"),
    ipaddress.ip_network("fd00::/64"),
)

BROADCAST = ipaddress.IPv4Address("255.255.255.255")


def normalize_name(name: str) -> str:
    """Lower-case, without the trailing dot."""
    return name.strip().rstrip(".").lower()


@dataclass(frozen=True)
class Allowlist:
    """Exact names and `*.suffix` wildcards (a wildcard matches subdomains, never the apex),
    each on the ports and of the kinds its entries say."""

    exact: frozenset[str]
    """Names allowed as they are (to resolve; connections are judged by `rules`)."""
    suffixes: tuple[str, ...]
    """For `*.example.com`: `.example.com` (leading dot, so `badexample.com` never matches)."""
    rules: tuple[Rule, ...] = ()
    """Every entry, parsed: which name may be reached on which port, and how it is checked."""

    @classmethod
    def from_entries(cls, entries: Iterable[str]) -> Allowlist:
        """Build from profile entries (already validated by the profile loader; an entry that
        does not parse here is left out, which only ever allows less)."""
        exact: set[str] = set()
        suffixes: list[str] = []
        rules: list[Rule] = []
        for raw in entries:
            try:
                written, port, kind = split_entry(raw)
            except ValueError:
                continue
            entry = normalize_name(written)
            if entry.startswith("*."):
                suffixes.append(entry[1:])
            elif entry:
                exact.add(entry)
            else:
                continue
            rule = Rule(entry, port, kind)
            if rule not in rules:
                rules.append(rule)
        return cls(frozenset(exact), tuple(sorted(set(suffixes))), tuple(rules))

    def allows(self, name: str) -> bool:
        """True when `name` is listed exactly or is a strict subdomain of a wildcard entry."""
        n = normalize_name(name)
        if not n:
            return False
        if n in self.exact:
            return True
        return any(n.endswith(s) and len(n) > len(s) for s in self.suffixes)

    def wildcard_for(self, name: str) -> str | None:
        """The wildcard entry (`*.example.com`) that alone allows `name`, the most specific
        if several do; None if `name` is listed exactly or not allowed at all. (What the
        wildcard budget counts: an exact name's labels are the profile's, not the agent's.)"""
        n = normalize_name(name)
        if not n or n in self.exact:
            return None
        matches = [s for s in self.suffixes if n.endswith(s) and len(n) > len(s)]
        return "*" + max(matches, key=len) if matches else None

    def kinds(self, name: str, port: int) -> frozenset[str]:
        """The kinds of connection `name` (normalized) may make to `port`."""
        return frozenset(r.kind for r in self.rules if r.port == port and r.matches(name))

    def ports(self) -> frozenset[int]:
        """Every port some entry names."""
        return frozenset(r.port for r in self.rules)

    def __bool__(self) -> bool:
        return bool(self.exact or self.suffixes)


def clamp_ttl(ttl: int) -> int:
    """TTL bounded to [MIN_TTL, MAX_TTL] seconds."""
    return max(MIN_TTL, min(MAX_TTL, int(ttl)))


def answer_refusal(
    addr: IPAddress, *, allow_private: bool, host_addrs: frozenset[IPAddress] = frozenset()
) -> str | None:
    """Why an answer address must not be handed to the container, or None if it is fine."""
    if addr.is_unspecified:
        return "unspecified address"
    if addr.is_multicast:
        return "multicast address"
    if addr == BROADCAST:
        return "broadcast address"
    if isinstance(addr, ipaddress.IPv6Address) and addr.ipv4_mapped is not None:
        # ::ffff:a.b.c.d would let a v6 set entry stand for a v4 destination; judge it as v4
        # and refuse it outright (no client needs mapped answers).
        return "IPv4-mapped IPv6 address"
    if any(addr in net for net in HELPER_NETWORKS if net.version == addr.version):
        return "network helper address"
    if allow_private:
        return None
    if addr.is_loopback:
        return "loopback address"
    if addr.is_link_local:
        return "link-local address"
    if addr in host_addrs:
        return "this host's own address"
    if addr.is_private or addr.is_reserved or not addr.is_global:
        return "private or reserved address"
    return None


def parse_upstream(entry: str) -> tuple[str, int]:
    """`IP`, `IP:PORT`, `[IPv6]:PORT` or a bare IPv6 address -> (ip, port)."""
    text = entry.strip()
    if text.startswith("["):
        host, _, rest = text[1:].partition("]")
        port = int(rest[1:]) if rest.startswith(":") else DEFAULT_DNS_PORT
    elif text.count(":") == 1:
        host, _, p = text.partition(":")
        port = int(p)
    else:
        host, port = text, DEFAULT_DNS_PORT
    ip = ipaddress.ip_address(host)
    if not 0 < port < 65536:
        raise ValueError(f"port out of range: {port}")
    return str(ip), port


def host_resolvers(resolv_conf_text: str) -> list[tuple[str, int]]:
    """The `nameserver` lines of a resolv.conf, as (ip, 53); unparsable lines are skipped."""
    out: list[tuple[str, int]] = []
    for line in resolv_conf_text.splitlines():
        parts = line.split()
        if len(parts) >= 2 and parts[0] == "nameserver":
            addr = parts[1].split("%", 1)[0]
            try:
                out.append((str(ipaddress.ip_address(addr)), DEFAULT_DNS_PORT))
            except ValueError:
                continue
    return out


def upstreams(configured: Sequence[str], resolv_conf_text: str) -> list[tuple[str, int]]:
    """The profile's `upstream_dns` if given, else the host's resolvers."""
    if configured:
        return [parse_upstream(e) for e in configured]
    return host_resolvers(resolv_conf_text)
