"""The policy resolver's message codec (`linpodx.egress.dnsmsg`) against dnspython's full
message parser and renderer: the wire-level path must read exactly what `dns.message` reads,
never accept what it refuses, and write what it parses back to the same content."""

from __future__ import annotations

import itertools
import random

import dns.edns
import dns.exception
import dns.flags
import dns.message
import dns.name
import dns.rcode
import dns.rdatatype
import dns.rrset
import pytest

from linpodx.egress import dnsmsg
from linpodx.egress.dnsmsg import Outgoing, Query, Reply

QUERIES = [
    dns.message.make_query("crates.io", "A"),
    dns.message.make_query("CrAtEs.Io", "AAAA"),
    dns.message.make_query("a.b.c.d.example.com", "TXT"),
    dns.message.make_query("x.example.com", "A", use_edns=0),
    dns.message.make_query("x.example.com", "A", use_edns=0, want_dnssec=True),
    dns.message.make_query("x.example.com", "A", use_edns=0, payload=512),
    dns.message.make_query("a\\032b.example.com", "A"),
    dns.message.make_query("under_score.example.com", "ANY"),
]


def _with_flags(msg: dns.message.Message, flags: int) -> dns.message.Message:
    msg.flags |= flags
    return msg


QUERIES += [
    _with_flags(dns.message.make_query("crates.io", "A"), dns.flags.CD | dns.flags.AD),
    _with_flags(dns.message.make_query("crates.io", "A"), dns.flags.AA),
]


def _full(data: bytes) -> Query | bytes | None:
    return dnsmsg._read_any_query(data)


@pytest.mark.parametrize("msg", QUERIES, ids=lambda m: f"{m.question[0].name}-{m.edns}")
def test_usual_queries_are_read_as_dnspythons_parser_reads_them(
    msg: dns.message.Message,
) -> None:
    wire = msg.to_wire()
    lean = dnsmsg._read_usual_query(wire)
    assert lean is not None  # these are the usual shapes: the fast reader takes them
    assert lean == _full(wire)
    assert lean.qid == msg.id and lean.qname == msg.question[0].name
    assert lean.edns == (msg.edns >= 0) and lean.plain == (msg.edns < 0)


@pytest.mark.parametrize(
    "msg",
    [
        dns.message.make_query("x.example.com", "A", use_edns=1),  # EDNS version 1
        dns.message.make_query(
            "x.example.com", "A", use_edns=0, options=[dns.edns.GenericOption(65001, b"hi")]
        ),
        _with_flags(dns.message.make_query("crates.io", "A"), dns.flags.QR),
    ],
)
def test_other_shapes_go_to_the_full_parser(msg: dns.message.Message) -> None:
    assert dnsmsg._read_usual_query(msg.to_wire()) is None


def test_an_edns_query_with_options_is_still_answered_with_edns() -> None:
    msg = dns.message.make_query(
        "x.example.com", "A", use_edns=0, options=[dns.edns.GenericOption(65001, b"hi")]
    )
    q = dnsmsg.read_query(msg.to_wire())
    assert isinstance(q, Query) and q.edns and not q.plain
    reply = dns.message.from_wire(dnsmsg.answer(q, dns.rcode.NXDOMAIN))
    assert reply.edns == 0 and reply.payload == dnsmsg.EDNS_PAYLOAD and reply.options == ()


def _mutations(wire: bytes, rng: random.Random, count: int) -> list[bytes]:
    out = []
    for _ in range(count):
        b = bytearray(wire)
        kind = rng.randrange(4)
        if kind == 0 and b:
            b[rng.randrange(len(b))] = rng.randrange(256)
        elif kind == 1:
            b = b[: rng.randrange(len(b) + 1)]
        elif kind == 2:
            b += bytes(rng.randrange(256) for _ in range(rng.randrange(1, 8)))
        else:
            for _ in range(3):
                if b:
                    b[rng.randrange(len(b))] = rng.choice((0x00, 0x3F, 0x40, 0xC0, 0xFF))
        out.append(bytes(b))
    return out


def test_the_fast_query_reader_never_takes_what_dnspython_refuses() -> None:
    rng = random.Random(20261130)  # noqa: S311 - fuzzing input, not cryptography
    taken = 0
    for msg in QUERIES:
        for data in _mutations(msg.to_wire(), rng, 400):
            result = dnsmsg.read_query(data)  # never raises
            assert result is None or isinstance(result, (bytes, Query))
            try:
                lean = dnsmsg._read_usual_query(data)
            except dns.exception.DNSException:
                lean = None
            if lean is None:
                continue
            taken += 1
            full = dns.message.from_wire(data)  # must not raise: lean took it
            assert full.id == lean.qid and full.flags == lean.flags
            assert full.question[0].name == lean.qname
            assert (full.question[0].rdtype, full.question[0].rdclass) == (
                lean.rdtype,
                lean.rdclass,
            )
            assert (full.edns >= 0) == lean.edns
    assert taken > 100  # the fuzzing did reach the fast reader


# -- answers upstream -----------------------------------------------------------------------
def _response(
    sent: Outgoing, records: list[tuple[str, str, int, str]], **kw: object
) -> dns.message.Message:
    resp = dns.message.make_response(dns.message.from_wire(sent.wire))
    for owner, rtype, ttl, rdata in records:
        resp.answer.append(dns.rrset.from_text(owner, ttl, "IN", rtype, rdata))
    for key, value in kw.items():
        setattr(resp, key, value)
    return resp


def _sent(name: str = "www.example.com", rdtype: int = dnsmsg.A) -> Outgoing:
    return dnsmsg.upstream_query(0x4242, dns.name.from_text(name), rdtype)


def test_our_upstream_query_is_what_dnspython_would_send() -> None:
    sent = _sent("CDN.Example.com", dnsmsg.AAAA)
    msg = dns.message.from_wire(sent.wire)
    assert msg.id == 0x4242 and msg.flags == dns.flags.RD and msg.edns < 0
    assert msg.question[0].name.to_text() == "CDN.Example.com."
    assert msg.question[0].rdtype == dns.rdatatype.AAAA
    assert not (msg.answer or msg.authority or msg.additional)


def test_reply_records_are_read_as_dnspython_reads_them() -> None:
    sent = _sent()
    resp = _response(
        sent,
        [
            ("www.example.com.", "CNAME", 120, "cdn.provider.test."),
            ("cdn.provider.test.", "A", 60, "9.9.9.20"),
            ("cdn.provider.test.", "A", 60, "9.9.9.21"),
            ("cdn.provider.test.", "AAAA", 60, "2606:4700::5"),
            ("cdn.provider.test.", "TXT", 60, '"not for us"'),
            ("cdn.provider.test.", "MX", 60, "10 mail.provider.test."),
        ],
    )
    reply = dnsmsg.read_reply(sent, resp.to_wire())
    assert isinstance(reply, Reply) and reply.rcode == 0 and not reply.truncated
    got = [(r.owner, r.rdtype, r.ttl, r.address, r.target) for r in reply.records]
    assert [g[:3] for g in got] == [
        ("www.example.com", dnsmsg.CNAME, 120),
        ("cdn.provider.test", dnsmsg.A, 60),
        ("cdn.provider.test", dnsmsg.A, 60),
        ("cdn.provider.test", dnsmsg.AAAA, 60),
    ]
    assert [str(g[3]) for g in got[1:]] == ["9.9.9.20", "9.9.9.21", "2606:4700::5"]
    assert got[0][4] == "cdn.provider.test"
    # Each record's data is what dnspython writes for the parsed rdata.
    full = dns.message.from_wire(resp.to_wire())
    by_type = {rr.rdtype: rr for rr in full.answer}
    assert reply.records[0].data == by_type[dns.rdatatype.CNAME][0].to_wire()
    assert reply.records[1].data == by_type[dns.rdatatype.A][0].to_wire()


def test_a_repeated_record_is_kept_once() -> None:
    sent = _sent("crates.io")
    wire = _response(sent, [("crates.io.", "A", 300, "9.9.9.10")]).to_wire()
    # The same record twice, the second with its owner in other letters and no compression.
    record = b"\x06CRATES\x02io\x00" + dnsmsg._RRHEAD.pack(1, 1, 300, 4) + bytes([9, 9, 9, 10])
    wire = wire[:6] + (2).to_bytes(2, "big") + wire[8:] + record
    reply = dnsmsg.read_reply(sent, wire)
    assert reply is not None and len(reply.records) == 1


@pytest.mark.parametrize(
    "change",
    [
        lambda w: bytes([w[0] ^ 1]) + w[1:],  # another id
        lambda w: w[:2] + bytes([w[2] & 0x7F]) + w[3:],  # QR clear: a query, not an answer
        lambda w: w[:2] + bytes([w[2] | 0x28]) + w[3:],  # opcode UPDATE
        lambda w: w[:12] + b"\x03www\x07example\x03org\x00" + w[12 + 17 :],  # other name
        lambda w: w[:29] + b"\x00\x1c" + w[31:],  # other type (AAAA)
    ],
)
def test_a_datagram_that_does_not_answer_our_question_is_skipped(change: object) -> None:
    sent = _sent()
    wire = _response(sent, [("www.example.com.", "A", 60, "9.9.9.9")]).to_wire()
    assert dnsmsg.read_reply(sent, wire) is not None
    assert dnsmsg.read_reply(sent, change(wire)) is None  # type: ignore[operator]


def test_the_question_may_come_back_in_other_letters() -> None:
    sent = _sent()
    wire = _response(sent, [("www.example.com.", "A", 60, "9.9.9.9")]).to_wire()
    upper = wire[:12] + wire[12:29].upper() + wire[29:]
    reply = dnsmsg.read_reply(sent, upper)
    assert reply is not None and [str(r.address) for r in reply.records] == ["9.9.9.9"]


def test_error_and_truncated_answers_carry_no_records() -> None:
    sent = _sent()
    nx = _response(sent, [])
    nx.set_rcode(dns.rcode.NXDOMAIN)
    reply = dnsmsg.read_reply(sent, nx.to_wire())
    assert reply == Reply(dns.rcode.NXDOMAIN, False, ())
    tc = _response(sent, [("www.example.com.", "A", 60, "9.9.9.9")])
    tc.flags |= dns.flags.TC
    assert dnsmsg.read_reply(sent, tc.to_wire()) == Reply(0, True, ())
    # An error without a question section counts; a NOERROR or NXDOMAIN without one does not.
    bare = sent.wire[:2] + b"\x81\x82" + b"\x00" * 8  # SERVFAIL, no sections
    assert dnsmsg.read_reply(sent, bare) == Reply(dns.rcode.SERVFAIL, False, ())
    assert dnsmsg.read_reply(sent, sent.wire[:2] + b"\x81\x80" + b"\x00" * 8) is None


def test_an_address_record_of_the_wrong_length_spoils_the_answer() -> None:
    sent = _sent("crates.io")
    wire = _response(sent, [("crates.io.", "A", 300, "9.9.9.10")]).to_wire()
    bad = wire[:-6] + b"\x00\x05" + wire[-4:] + b"\x00"  # rdlength 5 for an A record
    assert dnsmsg.read_reply(sent, bad) is None


def test_the_reply_reader_never_raises_and_agrees_with_dnspython() -> None:
    rng = random.Random(4242)  # noqa: S311 - fuzzing input, not cryptography
    sent = _sent()
    good = _response(
        sent,
        [
            ("www.example.com.", "CNAME", 120, "cdn.provider.test."),
            ("cdn.provider.test.", "A", 60, "9.9.9.20"),
            ("cdn.provider.test.", "AAAA", 60, "2606:4700::5"),
        ],
    ).to_wire()
    compared = 0
    for data in _mutations(good, rng, 3000):
        reply = dnsmsg.read_reply(sent, data)  # never raises
        if reply is None or not reply.records:
            continue
        try:
            full = dns.message.from_wire(data)
        except dns.exception.DNSException:
            continue  # e.g. junk after the answer section, which is never read
        compared += 1
        want = {
            (rr.name.to_text().lower(), rr.rdtype, rd.to_wire())
            for rr in full.answer
            if rr.rdclass == 1 and rr.rdtype in (1, 5, 28)
            for rd in rr
        }
        got = {
            (dns.name.from_wire(r.owner_wire, 0)[0].to_text().lower(), r.rdtype, r.data)
            for r in reply.records
        }
        assert got == want
    assert compared > 100


# -- our answers ----------------------------------------------------------------------------
def _chain_reply(sent: Outgoing, steps: int) -> Reply:
    names = [f"step{i}-{'x' * 16}.provider.test." for i in range(steps)]
    records = [("www.example.com.", "CNAME", 300, names[0])]
    records += [(a, "CNAME", 300, b) for a, b in itertools.pairwise(names)]
    records += [(names[-1], "A", 300, f"9.9.9.{i}") for i in range(1, 4)]
    reply = dnsmsg.read_reply(sent, _response(sent, records).to_wire())
    assert reply is not None
    return reply


@pytest.mark.parametrize("steps", [1, 8], ids=["small", "over-512-bytes"])
@pytest.mark.parametrize("edns", [False, True])
def test_answers_parse_back_to_the_chain_with_capped_ttls(steps: int, edns: bool) -> None:
    q = dnsmsg.read_query(dns.message.make_query("WWW.example.com", "A", use_edns=edns).to_wire())
    assert isinstance(q, Query)
    sent = _sent()
    chain = dnsmsg.follow_chain(_chain_reply(sent, steps), q.name, q.rdtype, 8)
    wire = dnsmsg.answer(q, dns.rcode.NOERROR, chain.records, ttl=42)
    resp = dns.message.from_wire(wire)
    assert resp.id == q.qid and resp.question[0].name.to_text() == "WWW.example.com."
    assert resp.flags & dns.flags.QR and resp.flags & dns.flags.RD and resp.flags & dns.flags.RA
    assert (resp.edns == 0) == edns
    assert all(rr.ttl == 42 for rr in resp.answer)
    cnames = [rr for rr in resp.answer if rr.rdtype == dns.rdatatype.CNAME]
    a = [rd.address for rr in resp.answer if rr.rdtype == dns.rdatatype.A for rd in rr]
    assert len(cnames) == steps and sorted(a) == ["9.9.9.1", "9.9.9.2", "9.9.9.3"]
    if steps == 8:
        # Names repeat along a long chain: dnspython's renderer compresses them and keeps
        # the answer within the classic UDP size that the uncompressed form would exceed.
        assert len(wire) <= dnsmsg.CLASSIC_UDP
        assert sum(len(r.owner_wire) + 10 + len(r.data) for r in chain.records) > 512
