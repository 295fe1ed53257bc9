"""The policy resolver's decisions, with a hand-written fake upstream and fake nft sets.

Addresses in the fake answers are data only: nothing here sends a packet anywhere.
"""

from __future__ import annotations

import ipaddress
import socket
import threading
import time
from collections.abc import Callable, Sequence
from typing import Any

import dns.flags
import dns.message
import dns.opcode
import dns.rcode
import dns.rdatatype
import dns.rrset
import pytest

from linpodx.egress import resolver
from linpodx.egress.denials import DenialRecorder
from linpodx.egress.dnsmsg import Outgoing, Reply, read_reply
from linpodx.egress.policy import Allowlist
from linpodx.egress.resolver import PolicyResolver, ResolverPolicy, UpstreamError


class FakeUpstream:
    """Answers from a table: name -> list of (type, ttl, rdata) or an rcode."""

    def __init__(self, table: dict[str, Any]) -> None:
        self.table = table
        self.asked: list[tuple[str, str]] = []
        self.spelled: list[str] = []  # the names as they came, letter case kept

    def __call__(self, sent: Outgoing, ups: Sequence[tuple[str, int]]) -> Reply:
        # Through the wire both ways, as the real exchange sees it.
        reply = read_reply(sent, self.answer(dns.message.from_wire(sent.wire)).to_wire())
        assert reply is not None
        return reply

    def answer(self, query: dns.message.Message) -> dns.message.Message:
        q = query.question[0]
        self.spelled.append(q.name.to_text(omit_final_dot=True))
        name = q.name.to_text(omit_final_dot=True).lower()  # names are case-insensitive
        self.asked.append((name, dns.rdatatype.to_text(q.rdtype)))
        entry = self.table.get(name)
        if entry == "down":
            raise UpstreamError("timeout")
        resp = dns.message.make_response(query)
        if entry is None:
            resp.set_rcode(dns.rcode.NXDOMAIN)
            return resp
        for owner, rtype, ttl, rdata in entry:
            resp.answer.append(dns.rrset.from_text(owner + ".", ttl, "IN", rtype, rdata))
        return resp


class FakeSets:
    def __init__(self, fail: bool = False) -> None:
        self.added: list[tuple[str, int]] = []
        self.revoked: list[str] = []
        self.fail = fail

    def add(self, entries: list[tuple[Any, int]]) -> None:
        if self.fail:
            raise RuntimeError("nft failed")
        self.added.extend((str(a), t) for a, t in entries)

    def revoke(self, addrs: list[Any]) -> None:
        self.revoked.extend(str(a) for a in addrs)


class Clock:
    def __init__(self) -> None:
        self.t = 1000.0

    def __call__(self) -> float:
        return self.t


TABLE: dict[str, Any] = {
    "crates.io": [("crates.io", "A", 300, "9.9.9.10")],
    "www.example.com": [
        ("www.example.com", "CNAME", 120, "cdn.provider.test."),
        ("cdn.provider.test", "A", 60, "9.9.9.20"),
        ("cdn.provider.test", "A", 60, "9.9.9.21"),
        ("evil.test", "A", 60, "9.9.9.66"),  # stuffed record, not on the chain
    ],
    "v6.example.com": [("v6.example.com", "AAAA", 5, "2606:4700::5")],
    "loop.example.com": [("loop.example.com", "A", 60, "127.0.0.1")],
    "meta.example.com": [("meta.example.com", "A", 60, "169.254.169.254")],
    "long.example.com": [("long.example.com", "A", 86400, "9.9.9.30")],
    "down.example.com": "down",
}


def make(
    allow: Sequence[str] = ("crates.io", "*.example.com"),
    *,
    allow_private: bool = False,
    sets: FakeSets | None = None,
) -> tuple[PolicyResolver, FakeUpstream, FakeSets, list[tuple[str, dict[str, Any]]], Clock]:
    up = FakeUpstream(TABLE)
    sets = sets or FakeSets()
    records: list[tuple[str, dict[str, Any]]] = []
    clock = Clock()
    rec = DenialRecorder("c1", lambda k, d: records.append((k, d)), clock=clock)
    pol = ResolverPolicy(Allowlist.from_entries(allow), (("127.0.0.1", 53),), allow_private)
    r = PolicyResolver(
        pol,
        add_to_sets=sets.add,
        revoke_in_sets=sets.revoke,
        on_denied=rec.deny,
        upstream=up,
        clock=clock,
    )
    return r, up, sets, records, clock


def ask(r: PolicyResolver, name: str, rtype: str = "A") -> dns.message.Message:
    q = dns.message.make_query(name, rtype)
    out = r.handle(q.to_wire())
    assert out is not None
    resp = dns.message.from_wire(out)
    assert resp.id == q.id and resp.flags & dns.flags.QR
    return resp


def addrs(resp: dns.message.Message) -> list[str]:
    return [rd.address for rr in resp.answer if rr.rdtype in (1, 28) for rd in rr]


def test_allowed_name_answered_after_set_update() -> None:
    r, _up, sets, records, _ = make()
    resp = ask(r, "crates.io")
    assert resp.rcode() == dns.rcode.NOERROR
    assert addrs(resp) == ["9.9.9.10"]
    assert sets.added == [("9.9.9.10", 300)]
    assert records == []


def test_denied_name_is_nxdomain_never_asked_upstream_and_recorded() -> None:
    r, up, sets, records, _ = make()
    resp = ask(r, "github.qkg1.top")
    assert resp.rcode() == dns.rcode.NXDOMAIN
    assert up.asked == [] and sets.added == []
    assert records[0][0] == "dns.denied"
    assert records[0][1]["message"] == "dns lookup denied for github.qkg1.top"
    # Exfiltration through query names of a denied zone never leaves the guard either.
    ask(r, "c2VjcmV0.exfil.test")
    assert up.asked == []


def test_wildcard_matches_subdomains_not_apex() -> None:
    r, *_ = make()
    assert ask(r, "example.com").rcode() == dns.rcode.NXDOMAIN
    assert ask(r, "v6.example.com", "AAAA").rcode() == dns.rcode.NOERROR


def test_cname_chain_followed_and_stuffed_records_dropped() -> None:
    r, _up, sets, _, _ = make()
    resp = ask(r, "www.example.com")
    assert addrs(resp) == ["9.9.9.20", "9.9.9.21"]
    names = [rr.name.to_text() for rr in resp.answer]
    assert "evil.test." not in names
    assert sorted(a for a, _ in sets.added) == ["9.9.9.20", "9.9.9.21"]
    # TTL: the smallest on the chain, clamped up to 30 s for the set.
    assert {t for _, t in sets.added} == {60}
    # The CNAME target was allowed for that lookup only.
    assert ask(r, "cdn.provider.test").rcode() == dns.rcode.NXDOMAIN


@pytest.mark.parametrize("rtype", ["TXT", "MX", "ANY", "SRV", "NULL", "HTTPS", "PTR", "CNAME"])
def test_other_record_types_refused_even_for_allowed_names(rtype: str) -> None:
    r, up, _sets, records, _ = make()
    assert ask(r, "crates.io", rtype).rcode() == dns.rcode.REFUSED
    assert up.asked == []
    assert records and records[0][1]["qtype"] == rtype


@pytest.mark.parametrize("name", ["loop.example.com", "meta.example.com"])
def test_private_answer_refused_unless_allowed(name: str) -> None:
    r, _, sets, records, _ = make()
    resp = ask(r, name)
    assert resp.rcode() == dns.rcode.REFUSED and sets.added == []
    assert "answer" in records[0][1]["reason"]
    r2, _, sets2, _, _ = make(allow_private=True)
    assert ask(r2, name).rcode() == dns.rcode.NOERROR and sets2.added


def test_set_update_failure_means_no_answer() -> None:
    r, *_ = make(sets=FakeSets(fail=True))
    resp = ask(r, "crates.io")
    assert resp.rcode() == dns.rcode.SERVFAIL and resp.answer == []


def test_upstream_down_is_servfail() -> None:
    r, *_ = make()
    assert ask(r, "down.example.com").rcode() == dns.rcode.SERVFAIL


def test_the_upstream_sees_an_allowed_name_in_lower_case_only() -> None:
    """The letter case of a name is the client's to choose: passed on, each letter of an
    allowed name would carry a bit to the upstream (a probe sent 640 bytes in 470 lookups)."""
    r, up, *_ = make(("crates.io", "*.example.com", "nodata.example.com"))
    for spelled in ("CRATES.io", "NoData.Example.COM", "nope.EXAMPLE.com"):
        resp = ask(r, spelled, "AAAA")
        assert resp.question[0].name.to_text() == spelled + "."  # the answer echoes it
    assert up.spelled == ["crates.io", "nodata.example.com", "nope.example.com"]


@pytest.mark.parametrize(
    ("name", "rtype", "rcode"),
    [
        ("nope.example.com", "A", dns.rcode.NXDOMAIN),  # no such name
        ("crates.io", "AAAA", dns.rcode.NOERROR),  # no record of that type (NODATA)
        ("loop.example.com", "A", dns.rcode.REFUSED),  # an answer the policy refuses
        ("down.example.com", "A", dns.rcode.SERVFAIL),  # no answer from upstream
    ],
)
def test_a_lookup_that_gave_no_address_is_not_asked_upstream_again_for_a_while(
    name: str, rtype: str, rcode: int
) -> None:
    """Repeats of a lookup that gave nothing went upstream every time: a channel as wide as
    the upstream's query rate. They are answered from memory for NEGATIVE_TTL (FAILURE_TTL
    for a failure), the same answer each time; a policy change forgets them."""
    from linpodx.egress import resolver

    r, up, _sets, records, clock = make()
    first = ask(r, name, rtype)
    assert first.rcode() == rcode and addrs(first) == []
    noted: list[tuple[str, str, str]] = []
    r._denied = lambda *a: noted.append(a)  # type: ignore[method-assign]
    for _ in range(5):
        again = ask(r, name, rtype)
        assert again.rcode() == rcode and addrs(again) == []
    assert len(up.asked) == 1
    if rcode == dns.rcode.REFUSED:  # each refusal is a decision, noted as the first was
        assert records and len(noted) == 5 and len(set(noted)) == 1
        assert noted[0][:2] == (name, rtype) and noted[0][2].startswith("answer 127.0.0.1: ")
    else:
        assert noted == []
    life = resolver.FAILURE_TTL if rcode == dns.rcode.SERVFAIL else resolver.NEGATIVE_TTL
    clock.t += life - 1
    ask(r, name, rtype)
    assert len(up.asked) == 1
    clock.t += 2
    ask(r, name, rtype)
    assert len(up.asked) == 2
    r.set_policy(r.policy)  # a re-apply: judged afresh
    ask(r, name, rtype)
    assert len(up.asked) == 3


def test_ttl_bounded_in_answer_and_set_and_cache_served() -> None:
    r, up, sets, _, clock = make()
    resp = ask(r, "long.example.com")
    assert sets.added == [("9.9.9.30", 3600)]
    assert resp.answer[0].ttl == 3600
    clock.t += 100
    again = ask(r, "long.example.com")
    assert addrs(again) == ["9.9.9.30"] and again.answer[0].ttl == 3500
    assert up.asked.count(("long.example.com", "A")) == 1
    clock.t += 3600
    ask(r, "long.example.com")
    assert up.asked.count(("long.example.com", "A")) == 2


def test_short_ttl_raised_to_minimum_for_the_set() -> None:
    r, _, sets, _, _ = make()
    resp = ask(r, "v6.example.com", "AAAA")
    assert sets.added == [("2606:4700::5", 30)]
    assert resp.answer[0].ttl == 5


def test_live_policy_update_removes_only_disallowed_entries() -> None:
    r, up, sets, _, _ = make()
    ask(r, "crates.io")
    ask(r, "www.example.com")
    new = ResolverPolicy(Allowlist.from_entries(["crates.io"]), (("127.0.0.1", 53),), False)
    gone = r.set_policy(new)
    assert sorted(str(a) for a in gone) == ["9.9.9.20", "9.9.9.21"]
    assert sorted(sets.revoked) == ["9.9.9.20", "9.9.9.21"]
    assert ask(r, "www.example.com").rcode() == dns.rcode.NXDOMAIN
    assert ask(r, "crates.io").rcode() == dns.rcode.NOERROR
    widened = ResolverPolicy(
        Allowlist.from_entries(["crates.io", "github.qkg1.top"]), (("127.0.0.1", 53),), False
    )
    r.set_policy(widened)
    assert ask(r, "github.qkg1.top").rcode() == dns.rcode.NXDOMAIN  # upstream has no such name
    assert ("github.qkg1.top", "A") in up.asked


def test_removed_address_is_revoked_and_granted_again_by_a_new_lookup() -> None:
    r, _up, sets, _, clock = make()
    ask(r, "crates.io")

    def allowing(*names: str) -> ResolverPolicy:
        return ResolverPolicy(Allowlist.from_entries(names), r.policy.upstreams, False)

    assert [str(a) for a in r.set_policy(allowing("*.example.com"))] == ["9.9.9.10"]
    assert sets.revoked == ["9.9.9.10"]
    # Allowed again: the next lookup adds the address afresh (that add ends the revocation),
    # although its earlier set entry would not have lapsed yet.
    r.set_policy(allowing("crates.io"))
    clock.t += 10
    assert addrs(ask(r, "crates.io")) == ["9.9.9.10"]
    assert sets.added == [("9.9.9.10", 300), ("9.9.9.10", 300)]
    assert sets.revoked == ["9.9.9.10"]


def test_a_lapsed_set_entry_is_not_revoked() -> None:
    """Only a policy change revokes: an entry whose TTL ran out keeps its open flows, and a new
    lookup simply adds the address again."""
    r, _up, sets, _, clock = make()
    ask(r, "crates.io")
    clock.t += 1000  # long past the 300 s TTL
    assert addrs(ask(r, "crates.io")) == ["9.9.9.10"]
    assert r.set_policy(r.policy) == []  # the same names: nothing to take away
    assert sets.revoked == []
    assert sets.added == [("9.9.9.10", 300), ("9.9.9.10", 300)]


@pytest.mark.parametrize(
    "wire",
    [b"", b"\x12", b"\x12\x34\x01\x00\x00\x01\x00\x00\x00\x00\x00\x00\xff\xff"],
)
def test_garbage_gets_no_answer_or_formerr(wire: bytes) -> None:
    r, up, *_ = make()
    out = r.handle(wire)
    if out is not None:
        assert dns.rcode.from_flags(int.from_bytes(out[2:4], "big"), 0) == dns.rcode.FORMERR
        assert out[:2] == wire[:2]
    assert up.asked == []


def test_response_packets_and_other_opcodes_are_not_answered_as_queries() -> None:
    r, up, *_ = make()
    q = dns.message.make_query("crates.io", "A")
    q.flags |= dns.flags.QR
    assert r.handle(q.to_wire()) is None
    q2 = dns.message.make_query("crates.io", "A")
    q2.set_opcode(dns.opcode.UPDATE)
    out = r.handle(q2.to_wire())
    assert out is not None
    assert dns.message.from_wire(out).rcode() in (dns.rcode.NOTIMP, dns.rcode.FORMERR)
    q3 = dns.message.make_query("crates.io", "A")
    q3.set_opcode(dns.opcode.NOTIFY)
    out = r.handle(q3.to_wire())
    assert out is not None
    reply = dns.message.from_wire(out)
    assert reply.rcode() == dns.rcode.NOTIMP and reply.opcode() == dns.opcode.NOTIFY
    assert up.asked == []


def test_ipv4_and_ipv6_answers_go_to_their_sets() -> None:
    r, _, sets, _, _ = make()
    ask(r, "v6.example.com", "AAAA")
    assert ipaddress.ip_address(sets.added[0][0]).version == 6


def test_address_already_granted_needs_no_second_set_update() -> None:
    table = dict(TABLE)
    table["a.example.com"] = [("a.example.com", "A", 300, "9.9.9.40")]
    table["b.example.com"] = [("b.example.com", "A", 300, "9.9.9.40")]
    table["c.example.com"] = [("c.example.com", "A", 300, "9.9.9.40")]
    table["d.example.com"] = [
        ("d.example.com", "A", 60, "9.9.9.40"),
        ("d.example.com", "A", 60, "9.9.9.41"),
    ]
    r, up, sets, _, clock = make()
    up.table = table
    ask(r, "a.example.com")
    clock.t += 10
    resp = ask(r, "b.example.com")
    assert sets.added == [("9.9.9.40", 300)]  # one nft call for both names
    assert resp.answer[0].ttl == 290  # never longer than the set entry lives
    clock.t += 200  # 90 s left < 150: refreshed
    ask(r, "c.example.com")
    assert sets.added[-1] == ("9.9.9.40", 300)
    # .41 is new, so both are re-added; .40's longer remaining time is kept, not cut to 60.
    ask(r, "d.example.com")
    assert sorted(sets.added[-2:]) == [("9.9.9.40", 301), ("9.9.9.41", 60)]


def test_repeated_query_answered_from_bytes_with_exact_ttl_and_new_id() -> None:
    r, up, _, _, clock = make()
    ask(r, "crates.io")  # fills the answer cache
    clock.t += 0.25
    first = ask(r, "crates.io")  # cache hit: fills the bytes cache
    assert first.answer[0].ttl == 299
    assert len(r._fast) == 1  # the bytes of that answer are kept
    clock.t += 0.5
    again = ask(r, "crates.io")  # served from bytes: a fresh id (checked in ask), same TTL
    assert again.answer[0].ttl == 299 and addrs(again) == ["9.9.9.10"]
    clock.t += 0.5  # 298.75 s left now: the bytes (TTL 299) would overstate it
    assert ask(r, "crates.io").answer[0].ttl == 298
    assert up.asked.count(("crates.io", "A")) == 1


def test_policy_change_empties_the_bytes_cache() -> None:
    r, *_ = make()
    ask(r, "crates.io")
    ask(r, "crates.io")
    assert ask(r, "crates.io").rcode() == dns.rcode.NOERROR
    assert r._fast
    r.set_policy(
        ResolverPolicy(Allowlist.from_entries(["*.example.com"]), (("127.0.0.1", 53),), False)
    )
    assert ask(r, "crates.io").rcode() == dns.rcode.NXDOMAIN


def test_edns_query_is_answered_with_edns() -> None:
    r, _up, sets, _, _ = make()
    q = dns.message.make_query("crates.io", "A", use_edns=0)
    out = r.handle(q.to_wire())
    assert out is not None
    resp = dns.message.from_wire(out)
    assert resp.edns == 0 and addrs(resp) == ["9.9.9.10"] and sets.added


def test_allowed_wildcard_name_with_odd_bytes_is_refused_and_recorded() -> None:
    r, up, _, records, _ = make()
    resp = ask(r, "a\\032b.example.com")
    assert resp.rcode() == dns.rcode.REFUSED and up.asked == []
    assert "host name" in records[0][1]["reason"]


def test_query_with_unusual_flags_is_answered() -> None:
    r, *_ = make()
    q = dns.message.make_query("crates.io", "A")
    q.flags |= dns.flags.AA  # no stub sets it in a query; still a query
    out = r.handle(q.to_wire())
    assert out is not None
    resp = dns.message.from_wire(out)
    assert resp.id == q.id and resp.rcode() == dns.rcode.NOERROR
    assert addrs(resp) == ["9.9.9.10"]


class ScriptedUpstream:
    """A UDP server on 127.0.0.1 that answers each query with `script(query_bytes)` datagrams."""

    def __init__(self, script: Callable[[bytes], list[bytes]]) -> None:
        self.sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        self.sock.bind(("127.0.0.1", 0))
        self.addr = ("127.0.0.1", self.sock.getsockname()[1])
        self.script = script
        threading.Thread(target=self._serve, daemon=True).start()

    def _serve(self) -> None:
        while True:
            try:
                data, peer = self.sock.recvfrom(4096)
            except OSError:
                return
            for out in self.script(data):
                self.sock.sendto(out, peer)

    def close(self) -> None:
        self.sock.close()


def _real_answer(data: bytes) -> bytes:
    return FakeUpstream(TABLE).answer(dns.message.from_wire(data)).to_wire()


def test_upstream_exchange_skips_garbled_and_foreign_datagrams() -> None:
    def script(data: bytes) -> list[bytes]:
        good = _real_answer(data)
        other_id = bytes([data[0] ^ 0xFF]) + good[1:]
        return [data[:2] + b"\x81\x80\x00\x01\x00\x05", other_id, good]

    up = ScriptedUpstream(script)
    try:
        r, _up, sets, _, _ = make()
        r._upstream = resolver.query_upstream  # type: ignore[method-assign]
        r._policy = ResolverPolicy(r.policy.allowlist, (up.addr,), False)
        assert addrs(ask(r, "crates.io")) == ["9.9.9.10"] and sets.added
    finally:
        up.close()


def test_garbled_upstream_answer_is_servfail(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(resolver, "UPSTREAM_TIMEOUT", 0.3)
    up = ScriptedUpstream(lambda data: [data[:2] + b"\x81\x80\x00\x01\x00\x05"])
    try:
        r, _up, sets, _, _ = make()
        r._upstream = resolver.query_upstream  # type: ignore[method-assign]
        r._policy = ResolverPolicy(r.policy.allowlist, (up.addr,), False)
        assert ask(r, "crates.io").rcode() == dns.rcode.SERVFAIL and sets.added == []
    finally:
        up.close()


def test_chain_through_a_name_no_host_has_is_not_followed() -> None:
    table = dict(TABLE)
    table["odd.example.com"] = [
        ("odd.example.com", "CNAME", 60, "a\\032b.provider.test."),
        ("a\\032b.provider.test", "A", 60, "9.9.9.50"),
    ]
    r, up, sets, _, _ = make()
    up.table = table
    resp = ask(r, "odd.example.com")
    assert resp.rcode() == dns.rcode.NOERROR and resp.answer == [] and sets.added == []


def test_only_the_followed_cname_target_is_passed_on() -> None:
    table = dict(TABLE)
    table["two.example.com"] = [
        ("two.example.com", "CNAME", 60, "cdn.provider.test."),
        ("two.example.com", "CNAME", 60, "evil.test."),
        ("cdn.provider.test", "A", 60, "9.9.9.20"),
        ("evil.test", "A", 60, "9.9.9.66"),
    ]
    r, up, sets, _, _ = make()
    up.table = table
    resp = ask(r, "two.example.com")
    # Which of the two (invalid) CNAME records comes first is up to the upstream's order.
    targets = [rd.target.to_text() for rr in resp.answer if rr.rdtype == 5 for rd in rr]
    assert len(targets) == 1
    reached = {"cdn.provider.test.": "9.9.9.20", "evil.test.": "9.9.9.66"}[targets[0]]
    assert addrs(resp) == [reached] and [a for a, _ in sets.added] == [reached]


def test_answer_echoes_the_question_as_asked() -> None:
    r, *_ = make()
    resp = ask(r, "CrAtEs.Io")
    assert resp.question[0].name.to_text() == "CrAtEs.Io." and addrs(resp) == ["9.9.9.10"]


def test_a_silent_upstream_is_servfail_once_the_timeout_runs_out(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(resolver, "UPSTREAM_TIMEOUT", 0.3)
    up = ScriptedUpstream(lambda data: [])
    try:
        r, _up, sets, _, _ = make()
        r._upstream = resolver.query_upstream  # type: ignore[method-assign]
        r._policy = ResolverPolicy(r.policy.allowlist, (up.addr,), False)
        started = time.monotonic()
        assert ask(r, "crates.io").rcode() == dns.rcode.SERVFAIL and sets.added == []
        assert 0.25 <= time.monotonic() - started < 2.0
    finally:
        up.close()


def test_an_answer_refused_before_is_judged_again_under_a_new_policy() -> None:
    r, _up, sets, _, _ = make()
    assert ask(r, "loop.example.com").rcode() == dns.rcode.REFUSED
    r.set_policy(ResolverPolicy(r.policy.allowlist, r.policy.upstreams, allow_private=True))
    assert addrs(ask(r, "loop.example.com")) == ["127.0.0.1"] and sets.added
    # Turned off again (a live re-apply): the address leaves the sets at once, and the
    # cached answer is not served any more.
    gone = r.set_policy(ResolverPolicy(r.policy.allowlist, r.policy.upstreams, allow_private=False))
    assert [str(a) for a in gone] == ["127.0.0.1"] and sets.revoked == ["127.0.0.1"]
    assert ask(r, "loop.example.com").rcode() == dns.rcode.REFUSED


def test_an_answer_in_flight_during_a_policy_swap_is_judged_under_the_new_policy() -> None:
    """`allow_private_answers` is turned off while a lookup waits for its upstream: the private
    address it brings back is refused (and recorded), never put in the sets or the cache."""
    r, up, sets, records, _ = make(allow_private=True)
    private = ResolverPolicy(r.policy.allowlist, r.policy.upstreams, allow_private=False)

    def swapping(sent: Outgoing, ups: Sequence[tuple[str, int]]) -> Reply:
        r.set_policy(private)  # what a re-apply does while the upstream is being asked
        return up(sent, ups)

    r._upstream = swapping  # type: ignore[method-assign]
    resp = ask(r, "loop.example.com")
    assert resp.rcode() == dns.rcode.REFUSED and resp.answer == []
    assert sets.added == []
    assert records[-1][1]["message"] == "dns lookup denied for loop.example.com"
    r._upstream = up  # type: ignore[method-assign]
    assert ask(r, "loop.example.com").rcode() == dns.rcode.REFUSED  # nothing was cached
    # The allowed path under the new policy still works.
    assert addrs(ask(r, "crates.io")) == ["9.9.9.10"]


@pytest.mark.parametrize(
    "entry",
    [
        [("self.example.com", "CNAME", 60, "self.example.com.")],
        [
            ("self.example.com", "CNAME", 60, "b.provider.test."),
            ("b.provider.test", "CNAME", 60, "self.example.com."),
        ],
    ],
)
def test_a_cname_loop_is_followed_once_and_answers_no_address(entry: list[Any]) -> None:
    r, up, sets, _, _ = make()
    up.table = {**TABLE, "self.example.com": entry}
    resp = ask(r, "self.example.com")
    assert resp.rcode() == dns.rcode.NOERROR and addrs(resp) == [] and sets.added == []
    steps = [(rr.name.to_text(), rd.target.to_text()) for rr in resp.answer for rd in rr]
    assert len(steps) == len(set(steps)) == len(entry) - 1


def test_granted_addresses_are_bounded_and_expired_ones_make_room(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """An allowed wildcard whose upstream hands out a new address per name cannot grow the
    guard's memory and the nft sets without bound: past the cap a new address is refused
    (SERVFAIL, recorded) until granted ones expire."""
    monkeypatch.setattr(resolver, "GRANTED_MAX", 3)
    r, up, sets, records, clock = make()
    up.table = {
        f"n{i}.example.com": [(f"n{i}.example.com", "A", 60, f"9.9.8.{i}")] for i in range(5)
    }
    for i in range(3):
        assert addrs(ask(r, f"n{i}.example.com")) == [f"9.9.8.{i}"]
    assert ask(r, "n0.example.com").rcode() == dns.rcode.NOERROR  # known address: fine
    refused = ask(r, "n3.example.com")
    assert refused.rcode() == dns.rcode.SERVFAIL and "9.9.8.3" not in [a for a, _ in sets.added]
    assert "more than 3 addresses granted" in records[-1][1]["reason"]
    clock.t += 61  # the first three expired
    assert addrs(ask(r, "n4.example.com")) == ["9.9.8.4"]


def test_names_remembered_per_address_are_bounded(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(resolver, "NAMES_PER_ADDRESS_MAX", 2)
    r, up, *_ = make()
    up.table = {f"n{i}.example.com": [(f"n{i}.example.com", "A", 60, "9.9.8.1")] for i in range(4)}
    for i in range(4):
        assert addrs(ask(r, f"n{i}.example.com")) == ["9.9.8.1"]
    (granted,) = r._granted.values()
    assert len(granted.names) == 2


def test_a_swap_between_the_name_check_and_the_lookup_is_judged_under_the_new_policy() -> None:
    """A re-apply that lands after the name was checked but before the lookup went upstream:
    the name the new policy forbids must not be granted (the lookup's policy is the one it
    checked the name under, and the grant compares it with the one in force)."""
    r, _up, sets, _, _ = make(allow=("crates.io", "*.example.com"))
    narrowed = ResolverPolicy(Allowlist.from_entries(["crates.io"]), r.policy.upstreams, False)
    real = r._answer

    def racing(q: Any, key: Any, policy: Any) -> bytes:
        r.set_policy(narrowed)
        return real(q, key, policy)

    r._answer = racing  # type: ignore[method-assign]
    resp = ask(r, "long.example.com")
    assert resp.rcode() == dns.rcode.NXDOMAIN and addrs(resp) == []
    assert sets.added == []


def test_a_revoked_address_is_not_served_from_the_cache_of_a_name_still_allowed(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """With more names per address than remembered, a re-apply can revoke an address that a
    still allowed name also resolves to: that name's cache line goes too, so its next lookup
    asks upstream and grants the address again."""
    monkeypatch.setattr(resolver, "NAMES_PER_ADDRESS_MAX", 2)
    r, up, sets, _, clock = make(allow=("*.example.com", "keep.other.test"))
    up.table = {f"n{i}.example.com": [(f"n{i}.example.com", "A", 300, "9.9.8.1")] for i in range(2)}
    up.table["keep.other.test"] = [("keep.other.test", "A", 300, "9.9.8.1")]
    for name in ("n0.example.com", "n1.example.com", "keep.other.test"):
        assert addrs(ask(r, name)) == ["9.9.8.1"]
    keep = ResolverPolicy(Allowlist.from_entries(["keep.other.test"]), r.policy.upstreams, False)
    assert [str(a) for a in r.set_policy(keep)] == ["9.9.8.1"]
    granted_before = len(sets.added)
    clock.t += 10
    assert addrs(ask(r, "keep.other.test")) == ["9.9.8.1"]
    assert [a for a, _ in sets.added[granted_before:]] == ["9.9.8.1"]  # granted again
    assert up.asked[-1] == ("keep.other.test", "A")


def test_a_revocation_that_fails_is_tried_again_by_the_next_policy_load() -> None:
    r, _up, sets, _, _ = make()
    assert addrs(ask(r, "crates.io")) == ["9.9.9.10"]

    def failing(addrs_: list[Any]) -> None:
        raise OSError("nf_tables refused the set update")

    r._revoke = failing
    gone = ResolverPolicy(Allowlist.from_entries(["*.example.com"]), r.policy.upstreams, False)
    with pytest.raises(OSError):
        r.set_policy(gone)
    r._revoke = sets.revoke
    assert [str(a) for a in r.set_policy(gone)] == ["9.9.9.10"]
    assert sets.revoked == ["9.9.9.10"]


def test_the_memory_of_a_failure_starts_when_the_upstreams_gave_up() -> None:
    """Two upstreams that time out one after the other take longer than FAILURE_TTL: timed
    from the start of the lookup, the remembered failure had expired when it was stored, and
    every repeat went upstream again."""
    from linpodx.egress import resolver

    r, up, _sets, _records, clock = make()

    def slow_failure(sent: Outgoing, ups: Sequence[tuple[str, int]]) -> Reply:
        up.asked.append(("slow", "A"))
        clock.t += 2 * resolver.UPSTREAM_TIMEOUT  # two upstreams, one timeout each
        raise UpstreamError("timeout")

    r._upstream = slow_failure  # type: ignore[assignment]
    for _ in range(4):
        assert ask(r, "slow.example.com").rcode() == dns.rcode.SERVFAIL
    assert len(up.asked) == 1


def test_the_same_lookups_at_once_go_upstream_once() -> None:
    """Eight threads asking the same new name together: one upstream query, eight answers."""
    import threading
    import time

    r, up, *_ = make()
    inner = r._upstream

    def slow(sent: Outgoing, ups: Sequence[tuple[str, int]]) -> Reply:
        time.sleep(0.3)
        return inner(sent, ups)

    r._upstream = slow  # type: ignore[assignment]
    answers: list[list[str]] = []
    threads = [
        threading.Thread(target=lambda: answers.append(addrs(ask(r, "crates.io"))))
        for _ in range(8)
    ]
    for t in threads:
        t.start()
    for t in threads:
        t.join(10)
    assert answers == [["9.9.9.10"]] * 8
    assert up.asked == [("crates.io", "A")]


def test_a_lookup_still_with_the_upstream_after_the_wait_is_not_asked_again_beside_it() -> None:
    """An upstream slower than the wait (a truncated answer's TCP retry can be): the lookups
    that waited for it fail instead of each sending a query of their own, whose number the
    agent would choose."""
    import threading

    r, up, *_ = make()
    inner = r._upstream
    release = threading.Event()
    entered = threading.Event()

    def stuck(sent: Outgoing, ups: Sequence[tuple[str, int]]) -> Reply:
        if not entered.is_set():  # the first query hangs; any other would answer at once
            entered.set()
            assert release.wait(30)
        return inner(sent, ups)

    r._upstream = stuck  # type: ignore[assignment]
    first: list[int] = []
    t = threading.Thread(target=lambda: first.append(ask(r, "crates.io").rcode()))
    t.start()
    assert entered.wait(10)
    try:
        others = [ask(r, "crates.io").rcode() for _ in range(2)]  # each waits ~4 s
    finally:
        release.set()
        t.join(10)
    assert others == [dns.rcode.SERVFAIL] * 2
    assert first == [dns.rcode.NOERROR]
    assert up.asked == [("crates.io", "A")]
