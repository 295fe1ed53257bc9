"""The nft text the guard loads, compared with fixed expected text."""

from __future__ import annotations

import shutil
import subprocess

import pytest

from linpodx.egress.ruleset import build_ruleset

EXPECTED = """\
table inet linpodx_egress
delete table inet linpodx_egress
table inet linpodx_egress {
	set allowed4 {
		type ipv4_addr
		flags timeout
	}
	set allowed6 {
		type ipv6_addr
		flags timeout
	}
	set revoked4 {
		type ipv4_addr
	}
	set revoked6 {
		type ipv6_addr
	}
	chain nat_output {
		type nat hook output priority -100; policy accept;
		oifname "lo" return
		meta mark 0x6c70 return
		ip daddr @allowed4 meta l4proto tcp redirect to :15001
	}
	chain output {
		type filter hook output priority 0; policy drop;
		oifname "lo" accept
		ct status dnat ip daddr 127.0.0.1 tcp dport 15001 accept
		ip daddr @revoked4 meta l4proto tcp counter reject with tcp reset
		ip daddr @revoked4 counter reject with icmp type admin-prohibited
		ip6 daddr @revoked6 meta l4proto tcp counter reject with tcp reset
		ip6 daddr @revoked6 counter reject with icmpv6 type admin-prohibited
		ct state established,related accept
		ct state invalid drop
		meta mark 0x6c70 ip daddr @allowed4 meta l4proto tcp accept
		udp dport 443 counter reject with icmp type port-unreachable
		meta l4proto tcp counter reject with tcp reset
		meta nfproto ipv4 counter reject with icmp type admin-prohibited
		meta nfproto ipv6 counter reject with icmpv6 type admin-prohibited
	}
	chain input {
		type filter hook input priority 0; policy drop;
		iifname "lo" accept
		ct state established,related accept
	}
	chain forward {
		type filter hook forward priority 0; policy drop;
	}
	chain postrouting {
		type filter hook postrouting priority 0; policy accept;
		oifname != "lo" meta mark != 0x6c70 counter drop
	}
}
"""


def test_ruleset_is_exactly_the_expected_text() -> None:
    assert build_ruleset() == EXPECTED


def test_revoked_addresses_are_refused_before_established_flows_are_accepted() -> None:
    """A connection opened while its address was allowed must not outlive the revocation."""
    lines = [line.strip() for line in build_ruleset().splitlines()]
    established = lines.index("ct state established,related accept")
    revoked = [i for i, line in enumerate(lines) if "@revoked" in line]
    assert len(revoked) == 4 and max(revoked) < established
    assert lines.index('oifname "lo" accept') < min(revoked)


@pytest.mark.skipif(shutil.which("unshare") is None, reason="needs util-linux unshare")
def test_ruleset_and_updates_are_accepted_by_nft_check_mode() -> None:
    """nft itself parses the text (check mode, in a throwaway netns when we may make one)."""
    nft = shutil.which("nft") or "/usr/sbin/nft"
    probe = subprocess.run(["unshare", "-rn", "true"], capture_output=True, timeout=10)
    if probe.returncode != 0:
        pytest.skip("cannot create a user+net namespace here")
    text = build_ruleset()
    res = subprocess.run(
        ["unshare", "-rn", nft, "-c", "-f", "-"],
        input=text,
        capture_output=True,
        text=True,
        timeout=20,
    )
    assert res.returncode == 0, res.stderr
