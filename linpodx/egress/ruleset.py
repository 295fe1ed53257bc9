"""Pure nftables text builders for the filter loaded into a container's network namespace.

Design (see docs/notes/egress.md):
- one `inet` table, so IPv4 and IPv6 share the chains and nothing family-specific is forgotten;
- output: policy drop; loopback inside the container's own netns is allowed (it only reaches
  sockets in that netns: the policy resolver and the agent's own local servers); replies of
  established flows; destinations in @allowed4/@allowed6 (filled by the policy resolver with
  a per-element timeout); everything else is counted and REJECTED (tcp reset / icmp
  admin-prohibited) so clients fail at once instead of hanging; the reject is generated
  locally, inside the container's netns: no packet ever reaches the network helper;
- input: policy drop except loopback and established/related, so nothing reaches the container
  from the helper's side;
- forward: policy drop (the container must not route for anyone).
ICMP to allowed addresses is not special-cased: a set member is allowed for any protocol,
which includes ping; ICMP anywhere else is rejected like any other packet.
"""

from __future__ import annotations

import ipaddress
from collections.abc import Iterable

from linpodx.egress.policy import IPAddress

TABLE = "linpodx_egress"
SET4 = "allowed4"
SET6 = "allowed6"


def build_ruleset(table: str = TABLE) -> str:
    """The complete ruleset text for `nft -f -` (idempotent: it recreates the table)."""
    return f"""\
table inet {table}
delete table inet {table}
table inet {table} {{
	set {SET4} {{
		type ipv4_addr
		flags timeout
	}}
	set {SET6} {{
		type ipv6_addr
		flags timeout
	}}
	chain output {{
		type filter hook output priority 0; policy drop;
		oifname "lo" accept
		ct state established,related accept
		ct state invalid drop
		ip daddr @{SET4} accept
		ip6 daddr @{SET6} accept
		meta l4proto tcp counter reject with tcp reset
		meta nfproto ipv4 counter reject with icmp type admin-prohibited
		meta nfproto ipv6 counter reject with icmpv6 type admin-prohibited
	}}
	chain input {{
		type filter hook input priority 0; policy drop;
		iifname "lo" accept
		ct state established,related accept
	}}
	chain forward {{
		type filter hook forward priority 0; policy drop;
	}}
}}
"""


def _family_set(addr: IPAddress) -> str:
    return SET4 if isinstance(addr, ipaddress.IPv4Address) else SET6


def build_add_elements(entries: Iterable[tuple[IPAddress, int]], table: str = TABLE) -> str:
    """One nft transaction that adds each address with a fresh timeout (seconds).

    `add element` leaves an existing element's timeout alone, so each address is added (so it
    surely exists), deleted and added again with the new timeout, all in one atomic batch:
    packets never see it missing.
    """
    lines: list[str] = []
    seen: set[IPAddress] = set()
    for addr, timeout in entries:
        if addr in seen:
            continue
        seen.add(addr)
        s = _family_set(addr)
        lines.append(f"add element inet {table} {s} {{ {addr} timeout {int(timeout)}s }}")
        lines.append(f"delete element inet {table} {s} {{ {addr} }}")
        lines.append(f"add element inet {table} {s} {{ {addr} timeout {int(timeout)}s }}")
    return "".join(line + "\n" for line in lines)


def build_delete_elements(addrs: Iterable[IPAddress], table: str = TABLE) -> str:
    """One nft transaction removing each address (added first, so a lapsed one cannot fail)."""
    lines: list[str] = []
    for addr in sorted(set(addrs), key=lambda a: (a.version, int(a))):
        s = _family_set(addr)
        lines.append(f"add element inet {table} {s} {{ {addr} timeout 1s }}")
        lines.append(f"delete element inet {table} {s} {{ {addr} }}")
    return "".join(line + "\n" for line in lines)


def build_flush_sets(table: str = TABLE) -> str:
    """Empty both allowed sets."""
    return f"flush set inet {table} {SET4}\nflush set inet {table} {SET6}\n"
