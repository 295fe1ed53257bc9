"""The nftables ruleset text for the filter loaded into a container's network namespace.

Design (see docs/egress.md):
- one `inet` table, so IPv4 and IPv6 share the chains and nothing family-specific is forgotten;
- output: policy drop; loopback inside the container's own netns is allowed (it only reaches
  sockets in that netns: the policy resolver and the agent's own local servers); then every
  packet to an address in @revoked4/@revoked6 is counted and rejected, established flow or
  not (see below); replies of established flows; destinations in @allowed4/@allowed6 (filled
  by the policy resolver with a per-element timeout, over netlink: see `nfsets`); everything
  else is counted and REJECTED (tcp reset / icmp admin-prohibited) so clients fail at once
  instead of hanging; the reject is generated locally, inside the container's netns: no
  packet ever reaches the network helper;
- @revoked4/@revoked6 (no timeout) hold the addresses a policy change took away (no allowed
  name justifies them any more, or the new policy refuses them): without them the
  `ct state established` rule would keep an already open connection to such an address
  going for as long as it lasts. An address whose allowed element merely lapsed (its DNS
  TTL ran out) is NOT revoked: its open flows go on (a long download must not break because
  a TTL ran out), only new ones need a fresh lookup. A lookup that grants a revoked address
  again takes it out of these sets in the same netlink batch that allows it;
- input: policy drop except loopback and established/related, so nothing reaches the container
  from the helper's side;
- forward: policy drop (the container must not route for anyone).
ICMP to allowed addresses is not special-cased: a set member is allowed for any protocol,
which includes ping; ICMP anywhere else is rejected like any other packet.
"""

from __future__ import annotations

TABLE = "linpodx_egress"
SET4 = "allowed4"
SET6 = "allowed6"
REVOKED4 = "revoked4"
REVOKED6 = "revoked6"


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
	set {REVOKED4} {{
		type ipv4_addr
	}}
	set {REVOKED6} {{
		type ipv6_addr
	}}
	chain output {{
		type filter hook output priority 0; policy drop;
		oifname "lo" accept
		ip daddr @{REVOKED4} meta l4proto tcp counter reject with tcp reset
		ip daddr @{REVOKED4} counter reject with icmp type admin-prohibited
		ip6 daddr @{REVOKED6} meta l4proto tcp counter reject with tcp reset
		ip6 daddr @{REVOKED6} counter reject with icmpv6 type admin-prohibited
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
