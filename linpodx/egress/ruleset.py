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
- forward: policy drop (the container must not route for anyone);
- postrouting: nothing leaves by an interface other than `lo` but the checker's own marked
  packets. The output chain cannot be the last word: its `oifname` for a redirected flow is
  the interface routed to *before* the redirect (so it accepts every redirected flow), and
  `ct state established` accepts a flow on whatever interface its packets now take. A socket
  bound to the uplink (SO_BINDTODEVICE, which needs no capability since Linux 5.7) takes its
  route there: a redirected SYN went out to the network helper, which connected to the
  host's own 127.0.0.1:CHECKER_PORT; a UDP flow the agent had answered itself over lo
  (to 127.0.0.1:PORT, or the policy resolver's answer from 127.0.0.1:53) went on out of the
  uplink, and the helper sent its datagrams to the host's 127.0.0.1:PORT (past slirp4netns'
  --disable-host-loopback; a DNS query to a resolver on the host's loopback, past the policy
  resolver). At postrouting the interface is the one the packet really leaves by, and the
  mark is the sending socket's.
Connections are bound to names, not addresses (see `linpodx.egress.checker`): the `nat`
chain redirects each new TCP connection to an address in @allowed4 to the connection
checker's socket inside the netns (CHECKER_PORT on 127.0.0.1), which reads what the
connection carries (TLS server name, HTTP Host), checks it against the allowlist and the
addresses the resolver returned for that name, and only then connects onward itself, from a
socket marked GUARD_MARK. So the filter accepts: loopback, the redirected flows (`ct status
dnat`, which only this table's own redirect creates), replies, and the checker's marked
sockets. Nothing else leaves: no UDP at all but DNS to the policy resolver on loopback (UDP
443, QUIC, is rejected with an ICMP error at once so clients fall back to TCP), no ICMP, no
IPv6. If the checker is not running, a redirected SYN meets a closed port and gets a reset:
nothing leaves unchecked.
"""

from __future__ import annotations

TABLE = "linpodx_egress"
SET4 = "allowed4"
SET6 = "allowed6"
REVOKED4 = "revoked4"
REVOKED6 = "revoked6"
CHECKER_PORT = 15001
"""Where the connection checker listens inside the container's netns (127.0.0.1)."""
GUARD_MARK = 0x6C70
"""SO_MARK of the checker's own onward sockets: the only non-loopback traffic the filter lets
out as new (setting a mark needs CAP_NET_ADMIN over the netns, which the agent lacks)."""


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
	chain nat_output {{
		type nat hook output priority -100; policy accept;
		oifname "lo" return
		meta mark {GUARD_MARK:#x} return
		ip daddr @{SET4} meta l4proto tcp redirect to :{CHECKER_PORT}
	}}
	chain output {{
		type filter hook output priority 0; policy drop;
		oifname "lo" accept
		ct status dnat ip daddr 127.0.0.1 tcp dport {CHECKER_PORT} accept
		ip daddr @{REVOKED4} meta l4proto tcp counter reject with tcp reset
		ip daddr @{REVOKED4} counter reject with icmp type admin-prohibited
		ip6 daddr @{REVOKED6} meta l4proto tcp counter reject with tcp reset
		ip6 daddr @{REVOKED6} counter reject with icmpv6 type admin-prohibited
		ct state established,related accept
		ct state invalid drop
		meta mark {GUARD_MARK:#x} ip daddr @{SET4} meta l4proto tcp accept
		udp dport 443 counter reject with icmp type port-unreachable
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
	chain postrouting {{
		type filter hook postrouting priority 0; policy accept;
		oifname != "lo" meta mark != {GUARD_MARK:#x} counter drop
	}}
}}
"""
