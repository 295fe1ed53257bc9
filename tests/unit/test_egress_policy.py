"""Name matching, answer filtering, TTL bounds and upstream parsing."""

from __future__ import annotations

import ipaddress

import pytest

from linpodx.egress.policy import (
    MAX_TTL,
    MIN_TTL,
    Allowlist,
    answer_refusal,
    clamp_ttl,
    host_resolvers,
    parse_upstream,
    upstreams,
)


@pytest.fixture
def allow() -> Allowlist:
    return Allowlist.from_entries(["crates.io", "*.example.com", "Registry.NPMJS.org."])


@pytest.mark.parametrize(
    "name",
    ["crates.io", "CRATES.IO.", "a.example.com", "a.b.example.com", "registry.example.com"],
)
def test_allowed_names(allow: Allowlist, name: str) -> None:
    assert allow.allows(name)


@pytest.mark.parametrize(
    "name",
    [
        "example.com",  # a wildcard never matches its apex
        "badexample.com",  # nor a name that merely ends with the same letters
        "x.crates.io",  # an exact entry does not cover subdomains
        "crates.io.evil.test",
        "github.qkg1.top",
        "",
        ".",
    ],
)
def test_denied_names(allow: Allowlist, name: str) -> None:
    assert not allow.allows(name)


def test_apex_allowed_when_listed_too() -> None:
    a = Allowlist.from_entries(["*.example.com", "example.com"])
    assert a.allows("example.com") and a.allows("www.example.com")
    assert not Allowlist.from_entries([])


def test_ttl_is_clamped() -> None:
    assert clamp_ttl(0) == MIN_TTL == 30
    assert clamp_ttl(300) == 300
    assert clamp_ttl(10**9) == MAX_TTL == 3600


@pytest.mark.parametrize(
    ("addr", "why"),
    [
        ("127.0.0.1", "loopback address"),
        ("::1", "loopback address"),
        ("169.254.169.254", "link-local address"),
        ("fe80::1", "link-local address"),
        ("10.1.2.3", "private or reserved address"),
        ("192.168.1.1", "private or reserved address"),
        ("172.16.0.1", "private or reserved address"),
        ("100.64.0.1", "private or reserved address"),
        ("fc00::1", "private or reserved address"),
        ("198.51.100.9", "this host's own address"),
    ],
)
def test_private_answers_refused_by_default(addr: str, why: str) -> None:
    host = frozenset({ipaddress.ip_address("198.51.100.9")})
    ip = ipaddress.ip_address(addr)
    assert answer_refusal(ip, allow_private=False, host_addrs=host) == why
    assert answer_refusal(ip, allow_private=True, host_addrs=host) is None


@pytest.mark.parametrize(
    ("addr", "why"),
    [
        ("0.0.0.0", "unspecified address"),  # noqa: S104 - an answer value, nothing binds
        ("::", "unspecified address"),
        ("224.0.0.1", "multicast address"),
        ("ff02::1", "multicast address"),
        ("255.255.255.255", "broadcast address"),
        ("::ffff:1.2.3.4", "IPv4-mapped IPv6 address"),
        ("10.0.2.2", "network helper address"),
        ("10.0.2.3", "network helper address"),
    ],
)
def test_some_answers_refused_even_when_private_allowed(addr: str, why: str) -> None:
    assert answer_refusal(ipaddress.ip_address(addr), allow_private=True) == why


def test_public_answer_accepted() -> None:
    assert answer_refusal(ipaddress.ip_address("8.8.4.4"), allow_private=False) is None
    assert answer_refusal(ipaddress.ip_address("2a00:1450::1"), allow_private=False) is None


def test_upstream_forms() -> None:
    assert parse_upstream("127.0.0.1") == ("127.0.0.1", 53)
    assert parse_upstream("127.0.0.1:5353") == ("127.0.0.1", 5353)
    assert parse_upstream("[::1]:5353") == ("::1", 5353)
    assert parse_upstream("::1") == ("::1", 53)
    with pytest.raises(ValueError):
        parse_upstream("resolver.example:53")
    with pytest.raises(ValueError):
        parse_upstream("127.0.0.1:0")


def test_host_resolvers_and_override() -> None:
    conf = "# c\nnameserver 192.0.2.53\nnameserver fe80::1%eth0\nnameserver bogus\nsearch x\n"
    assert host_resolvers(conf) == [("192.0.2.53", 53), ("fe80::1", 53)]
    assert upstreams([], conf) == [("192.0.2.53", 53), ("fe80::1", 53)]
    assert upstreams(["127.0.0.1:5300"], conf) == [("127.0.0.1", 5300)]
