"""Every DNS message of the policy resolver, read and written with dnspython.

Queries from the container and answers from upstream are untrusted bytes on the security
boundary. dnspython (a maintained library) reads every name and every record's data in them
(`dns.wire.Parser`, `dns.name.from_wire_parser`, `dns.rdata.from_wire_parser`: label and
length checks, compression pointers, each type's rdata format) and writes every name and
record's data we send (`Name.to_wire`, `Rdata.to_wire`). No policy here: `resolver` decides,
this module reads and writes messages for it.

Speed, and why not `dns.message`: a lookup that goes upstream reads two messages and writes
two. Through `dns.message.from_wire` and `dns.renderer.Renderer` that took ~0.3 ms of CPU per
lookup (Message, RRset and compression-table objects, a hashed Name per suffix of every name
written), about what the whole upstream round trip to a resolver on this machine takes. So
the messages are walked with dnspython's wire-level readers and writers directly, the way
`dns.message` itself does, and only the fixed-size fields between names and record data
(the 12-byte header, a question's type and class, a record's type, class, TTL and length)
are packed and unpacked here with `struct`, as dnspython's own renderer does. Names we write
are not compressed. A query in any shape other than the usual (one question, nothing else
but an option-less EDNS0 OPT record) is read by `dns.message.from_wire` as before, and an
answer over 512 bytes is written by `dns.renderer.Renderer` (which compresses names), so an
answer keeps to the classic UDP size whenever dnspython's own writer would have.

Imported on first use: dnspython's import costs about 0.1 s of CPU, which the guard would
otherwise spend while podman is still creating the container; the guard preloads it in the
background soon after it is ready, before the container's command runs.
"""

from __future__ import annotations

import ipaddress
import re
import struct
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import dns.exception
import dns.flags
import dns.ipv4
import dns.ipv6
import dns.message
import dns.name
import dns.opcode
import dns.rcode
import dns.rdata
import dns.rdataclass
import dns.rdatatype
import dns.rdtypes.nsbase
import dns.renderer
import dns.rrset
import dns.wire

from linpodx.egress.policy import IPAddress, normalize_name

A = int(dns.rdatatype.A)
AAAA = int(dns.rdatatype.AAAA)
CNAME = int(dns.rdatatype.CNAME)
OPT = int(dns.rdatatype.OPT)
IN = int(dns.rdataclass.IN)
NOERROR = dns.rcode.NOERROR
FORMERR = dns.rcode.FORMERR
SERVFAIL = dns.rcode.SERVFAIL
NXDOMAIN = dns.rcode.NXDOMAIN
NOTIMP = dns.rcode.NOTIMP
REFUSED = dns.rcode.REFUSED

EDNS_PAYLOAD = 1232
"""What our OPT record advertises (the common safe UDP size, RFC 9715)."""
MAX_MESSAGE = 65535
CLASSIC_UDP = 512
"""Answers larger than this are written by dnspython's compressing renderer."""

_HOST_LABEL = re.compile(rb"[A-Za-z0-9_-]{1,63}")
# Header flags as plain ints: an operation on dnspython's IntFlag members costs microseconds
# (enum pseudo-member lookups), as much as reading a whole name.
_QR = int(dns.flags.QR)
_RD = int(dns.flags.RD)
_RA = int(dns.flags.RA)
_TC = int(dns.flags.TC)
_ECHOED_FLAGS = int(dns.flags.RD | dns.flags.CD)
"""Query flags a response repeats (as `dns.message.make_response` does)."""
_OPCODE_MASK = 0x7800
_RCODE_MASK = 0x000F

_HEADER = struct.Struct("!HHHHHH")
"""id, flags, and the counts of the four sections."""
_QTAIL = struct.Struct("!HH")
"""A question's type and class, after its name."""
_RRHEAD = struct.Struct("!HHIH")
"""A record's type, class, TTL and data length, after its owner name."""
_ROOT = b"\x00"
_OUR_OPT = _ROOT + _RRHEAD.pack(OPT, EDNS_PAYLOAD, 0, 0)
"""EDNS0, our UDP size, extended rcode 0, version 0, no flags, no options."""


@dataclass(frozen=True, slots=True)
class Query:
    """One parsed query with a single question: what an answer to it needs."""

    qid: int
    flags: int
    """The query's header flags (an answer repeats RD and CD)."""
    qname: dns.name.Name
    """As the client wrote it (letter case kept: the answer echoes it)."""
    name: str
    """Lower-case text without the trailing dot (escaped, if not a host name)."""
    is_host_name: bool
    """Every label is a host-name label (letters, digits, `-`, `_`)."""
    rdtype: int
    rdclass: int
    edns: bool
    """The query carried an OPT record: the answer carries ours."""
    plain: bool
    """Nothing but a header and the question (what the bytes cache may key on)."""

    @property
    def type_text(self) -> str:
        return dns.rdatatype.to_text(self.rdtype)  # type: ignore[arg-type]


@dataclass(frozen=True, slots=True)
class Record:
    """One IN A, AAAA or CNAME record of an upstream answer, as parsed by dnspython."""

    owner: str | None
    """Lower-case host-name text of the owner, None if it is not a host name."""
    owner_wire: bytes
    rdtype: int
    ttl: int
    data: bytes
    """The record data as dnspython writes it (uncompressed)."""
    address: IPAddress | None
    """A/AAAA: the address."""
    target: str | None
    """CNAME: the target's host-name text, None if it is not a host name."""

    def wire(self, ttl: int) -> bytes:
        return self.owner_wire + _RRHEAD.pack(self.rdtype, IN, ttl, len(self.data)) + self.data


@dataclass(frozen=True, slots=True)
class Reply:
    """An upstream's answer to our query, reduced to what the resolver may use."""

    rcode: int
    truncated: bool
    records: tuple[Record, ...]
    """IN A/AAAA/CNAME records of the answer section (nothing else is ever read)."""


def _wire(item: dns.name.Name | dns.rdata.Rdata) -> bytes:
    """`item.to_wire()`: bytes when no file is given (typed as optional for the file case)."""
    wire = item.to_wire()
    if wire is None:  # pragma: no cover - dnspython returns bytes without a file
        raise dns.exception.FormError("dnspython wrote nothing")  # type: ignore[no-untyped-call]
    return wire


def host_name(name: dns.name.Name) -> str | None:
    """Lower-case dotted text of absolute `name` if all its labels are host-name labels.

    Straight from the parsed labels: no `to_text()` escaping pass, and a label carrying any
    other byte (a space, a dot, NUL …) yields None, so such a name is never asked upstream
    nor handed to the container.
    """
    labels = name.labels[:-1]
    for label in labels:
        if not _HOST_LABEL.fullmatch(label):
            return None
    return b".".join(labels).decode("ascii").lower()


# -- the container's queries ----------------------------------------------------------------
def read_query(data: bytes) -> Query | bytes | None:
    """The query in `data`, or the error reply to send at once, or None for no reply at all."""
    try:
        q = _read_usual_query(data)
    except dns.exception.DNSException:
        q = None
    return q if q is not None else _read_any_query(data)


def _read_usual_query(data: bytes) -> Query | None:
    """The usual query (one question, at most an option-less EDNS0 OPT record), else None.

    Raises dnspython's FormError for malformed bytes; None sends the message to the full
    reader, which judges everything this one does not take.
    """
    p = dns.wire.Parser(data)
    qid, flags, qd, an, ns, ar = p.get_struct(_HEADER.format)
    if flags & (_QR | _OPCODE_MASK) or qd != 1 or an or ns or ar > 1:
        return None
    qname = dns.name.from_wire_parser(p)
    rdtype, rdclass = p.get_struct(_QTAIL.format)
    if ar:
        owner = dns.name.from_wire_parser(p)
        kind, _payload, ext, rdlen = p.get_struct(_RRHEAD.format)
        # OPT at the root, extended rcode 0 and version 0 (the top two bytes of its TTL
        # field), no options: anything else is left to dnspython's own checks.
        if owner != dns.name.root or kind != OPT or ext >> 16 or rdlen:
            return None
    if p.remaining():
        return None
    return _query(qid, flags, qname, rdtype, rdclass, edns=bool(ar), plain=not ar)


def _read_any_query(data: bytes) -> Query | bytes | None:
    try:
        msg = dns.message.from_wire(data)
    except dns.message.ShortHeader:
        return None
    except dns.exception.DNSException:
        return _header_only(int.from_bytes(data[:2], "big"), FORMERR)
    if msg.flags & dns.flags.QR:
        return None  # a response is never answered (no reflection loops)
    if msg.opcode() != dns.opcode.QUERY:
        return _render_error(msg, NOTIMP)
    if len(msg.question) != 1:
        return _render_error(msg, FORMERR)
    q = msg.question[0]
    plain = msg.edns < 0 and not (msg.answer or msg.authority or msg.additional)
    return _query(msg.id, msg.flags, q.name, q.rdtype, q.rdclass, msg.edns >= 0, plain)


def _query(
    qid: int, flags: int, qname: dns.name.Name, rdtype: int, rdclass: int, edns: bool, plain: bool
) -> Query:
    text = host_name(qname)
    return Query(
        qid=qid,
        flags=flags,
        qname=qname,
        name=text if text is not None else normalize_name(qname.to_text(omit_final_dot=True)),
        is_host_name=text is not None,
        rdtype=int(rdtype),
        rdclass=int(rdclass),
        edns=edns,
        plain=plain,
    )


# -- our answers to them --------------------------------------------------------------------
def answer(q: Query, rcode: int, records: Sequence[Record] = (), ttl: int = 0) -> bytes:
    """The reply to `q`: its question echoed, `records` with every TTL capped at `ttl`."""
    flags = _QR | _RA | (q.flags & _ECHOED_FLAGS) | int(rcode)
    parts = [
        _HEADER.pack(q.qid, flags, 1, len(records), 0, 1 if q.edns else 0),
        _wire(q.qname),
        _QTAIL.pack(q.rdtype, q.rdclass),
    ]
    parts.extend(r.wire(max(0, min(r.ttl, ttl))) for r in records)
    if q.edns:
        parts.append(_OUR_OPT)
    wire = b"".join(parts)
    if len(wire) > CLASSIC_UDP:
        return _render_compressed(q, flags, records, ttl)
    return wire


def _render_compressed(q: Query, flags: int, records: Sequence[Record], ttl: int) -> bytes:
    """The same answer through dnspython's renderer, which compresses repeated names."""
    out = _renderer(q.qid, flags)
    out.add_question(q.qname, q.rdtype, q.rdclass)
    for r in records:
        rrset = dns.rrset.from_rdata(
            dns.name.from_wire(r.owner_wire, 0)[0],
            max(0, min(r.ttl, ttl)),
            dns.rdata.from_wire(
                dns.rdataclass.RdataClass.make(IN),
                dns.rdatatype.RdataType.make(r.rdtype),
                r.data,
                0,
                len(r.data),
            ),
        )
        out.add_rrset(dns.renderer.ANSWER, rrset, want_shuffle=False)
    if q.edns:
        out.add_edns(0, 0, EDNS_PAYLOAD)
    out.write_header()
    wire: bytes = out.get_wire()
    return wire


def _render_error(msg: dns.message.Message, rcode: int) -> bytes:
    """An error reply without a question; it names the opcode it refuses (QUERY is 0)."""
    flags = dns.flags.QR | dns.flags.RA | (msg.flags & _ECHOED_FLAGS) | rcode
    out = _renderer(msg.id, flags | dns.opcode.to_flags(msg.opcode()))
    if msg.edns >= 0:
        out.add_edns(0, 0, EDNS_PAYLOAD)
    out.write_header()
    wire: bytes = out.get_wire()
    return wire


def _renderer(qid: int, flags: int) -> Any:
    """dnspython's message writer (`dns.renderer` has no type annotations, hence Any)."""
    return dns.renderer.Renderer(qid, flags, MAX_MESSAGE)  # type: ignore[no-untyped-call]


def _header_only(qid: int, rcode: int) -> bytes:
    """A bare header reply for a query dnspython could not parse past its header."""
    out = _renderer(qid, dns.flags.QR | dns.flags.RA | rcode)
    out.write_header()
    wire: bytes = out.get_wire()
    return wire


# -- our queries upstream and their answers -------------------------------------------------
@dataclass(frozen=True, slots=True)
class Outgoing:
    """Our fresh query to an upstream: its wire form and what its answer must repeat."""

    wire: bytes
    qid: int
    qname: dns.name.Name
    rdtype: int

    @property
    def question(self) -> bytes:
        """Our question section: name as written, type, class."""
        return self.wire[_HEADER.size :]


def upstream_query(qid: int, qname: dns.name.Name, rdtype: int) -> Outgoing:
    """A new recursive query for `qname` (no EDNS: answers stay small; TC means ask by TCP)."""
    wire = _HEADER.pack(qid, _RD, 1, 0, 0, 0) + _wire(qname) + _QTAIL.pack(rdtype, IN)
    return Outgoing(wire, qid, qname, rdtype)


def read_reply(sent: Outgoing, data: bytes) -> Reply | None:
    """The upstream's answer in `data` if it answers `sent`, else None (skip it, keep waiting).

    It must carry our random id, QR, opcode QUERY and our question (any letter case); an
    error answer without a question section is accepted as the error it is. Of the answer
    section only IN A, AAAA and CNAME records are kept; the authority and additional
    sections are never read (nothing in them is used or passed on).
    """
    try:
        return _read_reply(sent, data)
    except dns.exception.DNSException:
        return None


def _read_reply(sent: Outgoing, data: bytes) -> Reply | None:
    p = dns.wire.Parser(data)
    qid, flags, qd, an, _ns, _ar = p.get_struct(_HEADER.format)
    if qid != sent.qid or not flags & _QR or flags & _OPCODE_MASK:
        return None
    rcode = flags & _RCODE_MASK
    truncated = bool(flags & _TC)
    if qd == 0:
        return Reply(rcode, truncated, ()) if rcode not in (NOERROR, NXDOMAIN) else None
    # Our question repeated: the very bytes we sent, but for letter case (RFC 1035 7.3; the
    # first name in a message cannot be compressed, it has nothing before it to point to).
    # A compare, not a parse: anything else is not an answer to us.
    question = sent.question
    if qd != 1 or p.get_bytes(len(question)).lower() != question.lower():
        return None
    if rcode != NOERROR or truncated:
        return Reply(rcode, truncated, ())
    records: list[Record] = []
    seen: set[tuple[bytes, int, bytes]] = set()
    for _ in range(an):
        owner = dns.name.from_wire_parser(p)
        kind, klass, ttl, rdlen = p.get_struct(_RRHEAD.format)
        if klass != IN or kind not in (A, AAAA, CNAME):
            p.seek(p.current + rdlen)  # FormError past the end
            continue
        address: IPAddress | None = None
        target: str | None = None
        if kind == CNAME:
            with p.restrict_to(rdlen):
                rd = dns.rdata.from_wire_parser(klass, kind, p)
            if not isinstance(rd, dns.rdtypes.nsbase.NSBase):  # pragma: no cover - CNAME is
                raise dns.exception.FormError("not a CNAME")  # type: ignore[no-untyped-call]
            data_wire = _wire(rd)
            target = host_name(rd.target)
        else:
            # An address record's data is the address itself, 4 or 16 bytes: read by
            # dnspython's own converters (what its A/AAAA classes call), without building
            # an rdata object per record (~15 us each).
            if rdlen != (4 if kind == A else 16):
                raise dns.exception.FormError
            raw = p.get_bytes(rdlen)
            text = dns.ipv4.inet_ntoa(raw) if kind == A else dns.ipv6.inet_ntoa(raw)
            address = ipaddress.ip_address(text)
            data_wire = address.packed
        owner_wire = _wire(owner)
        # An rrset is a set: a record repeated (owner in any letter case) is kept once.
        # bytes.lower() changes only A-Z, never a label's length byte (at most 63).
        key = (owner_wire.lower(), kind, data_wire.lower() if kind == CNAME else data_wire)
        if key in seen:
            continue
        seen.add(key)
        records.append(
            Record(host_name(owner), owner_wire, kind, ttl, data_wire, address, target)
        )
    return Reply(rcode, False, tuple(records))


@dataclass(frozen=True, slots=True)
class Chain:
    """What an upstream answer says about one name, reduced to what may be passed on."""

    records: list[Record]
    """The CNAME steps from the asked name, then the final address records."""
    addrs: list[IPAddress]
    ttl: int
    """The smallest TTL on the chain (0 when there is nothing to answer)."""
    names: frozenset[str]
    """The asked name and every CNAME target reached from it."""


def follow_chain(
    reply: Reply, name: str, rdtype: int, max_steps: int, max_addrs: int = 1 << 16
) -> Chain:
    """Keep only the CNAME chain from `name` and the final `rdtype` address records.

    Records for other owners (an upstream stuffing extra names into the answer) or whose
    owner or target is not a host name are dropped: a CNAME target is allowed for this lookup
    only, because it was reached from `name`. Only the first CNAME record of an owner (a
    malformed answer may carry several) is followed and passed on, so the answer never names
    a target the chain did not follow. At most `max_addrs` address records are kept (the
    first ones).
    """
    owned: dict[str, list[Record]] = {}
    for r in reply.records:
        if r.owner is not None:
            owned.setdefault(r.owner, []).append(r)
    current = name
    names = {current}
    kept: list[Record] = []
    for _ in range(max_steps + 1):
        mine = owned.get(current, ())
        step = next((r for r in mine if r.rdtype == CNAME), None)
        if step is None:
            kept.extend([r for r in mine if r.rdtype == rdtype][:max_addrs])
            break
        if step.target is None or step.target in names:
            break  # not a host name, or a loop: no address at the end of it
        kept.append(step)
        current = step.target
        names.add(current)
    addrs = [r.address for r in kept if r.address is not None]
    ttl = min((r.ttl for r in kept), default=0)
    return Chain(kept, addrs, ttl, frozenset(names))
