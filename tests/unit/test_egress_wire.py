"""The strict DNS codec of the resolver's common path, against dnspython and hostile bytes.

dnspython builds the reference messages and reads what the codec builds; the codec must take
the plain forms, refuse everything else (the resolver then takes its dnspython path) and never
loop or read past the end on crafted bytes.
"""

from __future__ import annotations

import ipaddress
import struct

import dns.edns
import dns.flags
import dns.message
import dns.opcode
import dns.rcode
import dns.rrset
import pytest

from linpodx.egress import wire
from linpodx.egress.wire import Record


def test_plain_query_is_understood_and_echoed_as_sent() -> None:
    q = dns.message.make_query("WwW.Example.COM", "AAAA")
    got = wire.parse_query(q.to_wire())
    assert got is not None
    assert (got.qid, got.rd, got.name, got.qtype) == (q.id, True, "www.example.com", 28)
    assert not got.edns
    out = dns.message.from_wire(wire.build_answer(got, wire.RCODE_NXDOMAIN))
    assert out.id == q.id and out.rcode() == dns.rcode.NXDOMAIN
    assert out.flags & dns.flags.QR and out.flags & dns.flags.RD and out.flags & dns.flags.RA
    assert out.question[0].name.to_text() == "WwW.Example.COM."  # the client's case


def test_edns_query_with_options_is_understood_and_answered_with_opt() -> None:
    q = dns.message.make_query(
        "crates.io", "A", use_edns=0, options=[dns.edns.GenericOption(10, b"12345678")]
    )
    got = wire.parse_query(q.to_wire())
    assert got is not None and got.edns
    rec = Record("crates.io", wire.TYPE_A, 300, ipaddress.ip_address("192.0.2.1"))
    out = dns.message.from_wire(wire.build_answer(got, 0, [rec], 60))
    assert out.edns == 0
    assert [(rr.ttl, [rd.address for rd in rr]) for rr in out.answer] == [(60, ["192.0.2.1"])]


def _raw(header: tuple[int, ...], body: bytes) -> bytes:
    return struct.pack(">HHHHHH", *header) + body


Q = b"\x05crates\x02io\x00\x00\x01\x00\x01"


@pytest.mark.parametrize(
    "data",
    [
        _raw((1, 0x8100, 1, 0, 0, 0), Q),  # a response
        _raw((1, 0x2900, 1, 0, 0, 0), Q),  # opcode UPDATE
        _raw((1, 0x0100, 2, 0, 0, 0), Q + Q),  # two questions
        _raw((1, 0x0100, 1, 1, 0, 0), Q),  # an answer section in a query
        _raw((1, 0x0100, 1, 0, 0, 0), Q + b"x"),  # trailing bytes
        _raw((1, 0x0100, 1, 0, 0, 1), Q + b"\x00" + struct.pack(">HHIH", 1, 1, 0, 0)),  # not OPT
        _raw((1, 0x0100, 1, 0, 0, 1), Q + b"\x00" + struct.pack(">HHIH", 41, 4096, 1 << 16, 0)),
        _raw((1, 0x0100, 1, 0, 0, 0), b"\x03a b\x02io\x00\x00\x01\x00\x01"),  # not a host label
        _raw((1, 0x0100, 1, 0, 0, 0), b"\x01a\xc0\x0c\x00\x01\x00\x01"),  # compressed
        _raw((1, 0x0100, 1, 0, 0, 0), b"\x40" + b"a" * 64 + b"\x00\x00\x01\x00\x01"),  # label > 63
        _raw((1, 0x0100, 1, 0, 0, 0), b"\x3fa" + b"a" * 62 * 5 + b"\x00\x00\x01\x00\x01"),
        _raw((1, 0x0100, 1, 0, 0, 0), b"\x05crates\x02io\x00\x00\x01"),  # short question
        b"\x00\x01\x01\x00\x00\x01",
    ],
)
def test_anything_else_is_left_to_the_dnspython_path(data: bytes) -> None:
    assert wire.parse_query(data) is None


def _answer(query: bytes, rrs: list[tuple[str, int, str, str]], rcode: int = 0) -> bytes:
    q = dns.message.from_wire(query)
    r = dns.message.make_response(q)
    r.set_rcode(rcode)
    for owner, ttl, rtype, rdata in rrs:
        r.answer.append(dns.rrset.from_text(owner, ttl, "IN", rtype, rdata))
    return r.to_wire()


def test_upstream_answer_parsed_with_compression() -> None:
    query = wire.build_query(77, "www.example.com", wire.TYPE_A)
    resp = _answer(
        query,
        [
            ("www.example.com.", 120, "CNAME", "cdn.provider.test."),
            ("cdn.provider.test.", 60, "A", "192.0.2.20"),
            ("cdn.provider.test.", 60, "AAAA", "2001:db8::20"),
            ("cdn.provider.test.", 60, "TXT", '"skipped"'),
        ],
    )
    assert wire.matches(query, resp)
    rcode, recs = wire.parse_answer(resp)
    assert rcode == 0
    assert recs == [
        Record("www.example.com", wire.TYPE_CNAME, 120, "cdn.provider.test"),
        Record("cdn.provider.test", wire.TYPE_A, 60, ipaddress.ip_address("192.0.2.20")),
        Record("cdn.provider.test", wire.TYPE_AAAA, 60, ipaddress.ip_address("2001:db8::20")),
    ]


def test_answers_to_something_else_do_not_match() -> None:
    query = wire.build_query(77, "crates.io", wire.TYPE_A)
    good = _answer(query, [("crates.io.", 60, "A", "192.0.2.1")])
    assert wire.matches(query, good)
    assert wire.matches(query, good.replace(b"crates", b"CRATES"))  # letter case is free
    assert not wire.matches(query, b"\x00\x4e" + good[2:])  # other id
    assert not wire.matches(query, good[:2] + bytes([good[2] & 0x7F]) + good[3:])  # not QR
    other = _answer(wire.build_query(77, "crates.ix", wire.TYPE_A), [])
    assert not wire.matches(query, other)
    bare_fail = query[:2] + b"\x81\x82" + b"\x00" * 8  # SERVFAIL without a question
    assert wire.matches(query, bare_fail)
    assert not wire.matches(query, query[:2] + b"\x81\x80" + b"\x00" * 8)


HDR = struct.pack(">HHHHHH", 9, 0x8180, 0, 1, 0, 0)


@pytest.mark.parametrize(
    "resp",
    [
        HDR + b"\xc0\x0c" + struct.pack(">HHIH", 1, 1, 60, 4) + b"\x01\x02\x03\x04",  # self loop
        HDR + b"\x01a\xc0\x0c" + struct.pack(">HHIH", 1, 1, 60, 4) + b"\x01\x02\x03\x04",
        HDR + b"\xc0\xff" + struct.pack(">HHIH", 1, 1, 60, 4) + b"\x01\x02\x03\x04",  # past end
        HDR + b"\x01a\x00" + struct.pack(">HHIH", 1, 1, 60, 5) + b"\x01\x02\x03\x04\x05",
        HDR + b"\x01a\x00" + struct.pack(">HHIH", 28, 1, 60, 4) + b"\x01\x02\x03\x04",
        HDR + b"\x01a\x00" + struct.pack(">HHIH", 1, 1, 60, 4) + b"\x01\x02",  # short data
        HDR + b"\x01a\x00" + struct.pack(">HHI", 1, 1, 60),  # short record header
        HDR + b"\x01a\x00" + struct.pack(">HHIH", 5, 1, 60, 4) + b"\x01b\x00\x00",  # bad size
        HDR + b"\x80a\x00",  # reserved label type
        struct.pack(">HHHHHH", 9, 0x8380, 0, 0, 0, 0),  # truncated: ask by TCP
        b"\x00\x09\x81",
    ],
)
def test_malformed_answers_are_errors_not_hangs(resp: bytes) -> None:
    with pytest.raises(wire.WireError):
        wire.parse_answer(resp)


def test_odd_names_and_classes_are_left_out() -> None:
    odd = (
        HDR[:6]
        + b"\x00\x02\x00\x00\x00\x00"
        + b"\x03a b\x00"
        + struct.pack(">HHIH", 1, 1, 60, 4)
        + b"\x01\x02\x03\x04"
        + b"\x01a\x00"
        + struct.pack(">HHIH", 1, 3, 60, 4)  # class CH
        + b"\x01\x02\x03\x04"
    )
    assert wire.parse_answer(odd) == (0, [])


def test_only_host_names_can_be_encoded() -> None:
    assert wire.is_host_name("a-b.c_d.example")
    assert not wire.is_host_name("a\\032b.example")
    assert not wire.is_host_name("ä.example")
    assert not wire.is_host_name("a..b")
