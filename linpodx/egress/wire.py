"""A strict, minimal DNS wire codec for the policy resolver's common case.

Why not dnspython for everything: parsing and building the four messages of one forwarded
lookup with dnspython costs about 0.4 ms of CPU here, more than the whole round trip to a
local upstream, and every lookup of a new name pays it. This module handles only what a stub
resolver sends and what the resolver must read back, and refuses the rest:

- a query is understood only if it is a plain QUERY with one question whose name is made of
  host-name labels (letters, digits, `-`, `_`), uncompressed, and nothing else but at most one
  EDNS OPT record; anything else returns None and the resolver takes its dnspython path;
- an upstream answer is read section by section with bounds checked at every step; only the
  answer section's IN A/AAAA/CNAME records whose names are host names are kept, everything
  else (other types, other sections, names with other bytes) is skipped or refused;
- answers to the container are built from those parsed values, never from upstream bytes.
"""

from __future__ import annotations

import ipaddress
import re
import struct
from collections.abc import Sequence
from dataclasses import dataclass

from linpodx.egress.policy import IPAddress

TYPE_A = 1
TYPE_CNAME = 5
TYPE_AAAA = 28
TYPE_OPT = 41
TYPE_NAMES = {TYPE_A: "A", TYPE_CNAME: "CNAME", TYPE_AAAA: "AAAA"}
CLASS_IN = 1

RCODE_NOERROR = 0
RCODE_SERVFAIL = 2
RCODE_NXDOMAIN = 3
RCODE_REFUSED = 5

FLAG_QR = 0x8000
FLAG_TC = 0x0200
FLAG_RD = 0x0100
FLAG_RA = 0x0080

MAX_NAME = 255
MAX_POINTERS = 32
EDNS_PAYLOAD = 1232
"""What our OPT record advertises (the common safe UDP size, RFC 9715)."""

_HEADER = struct.Struct(">HHHHHH")
_RR = struct.Struct(">HHIH")
_HOST_LABEL = re.compile(rb"[A-Za-z0-9_-]{1,63}")


class WireError(ValueError):
    """The bytes are not a DNS message this codec accepts."""


@dataclass(frozen=True)
class Question:
    """One understood query."""

    qid: int
    rd: bool
    """The client's recursion-desired flag (echoed)."""
    name: str
    """Lower-case, no trailing dot."""
    qtype: int
    qclass: int
    question: bytes
    """The question section as the client sent it (echoed in the answer, case and all)."""
    edns: bool
    """The query carried an OPT record (the answer carries one too)."""


@dataclass(frozen=True)
class Record:
    """One answer record: an address, or the target of a CNAME."""

    owner: str
    rtype: int
    ttl: int
    value: IPAddress | str


def parse_query(wire: bytes) -> Question | None:
    """The query in `wire`, or None unless it is the plain form this codec understands."""
    if len(wire) < 17 or len(wire) > 512:
        return None
    qid, flags, qd, an, ns, ar = _HEADER.unpack_from(wire)
    # QR clear, opcode QUERY, no AA/TC, rcode 0: anything else is for the dnspython path.
    if flags & 0xFE0F or qd != 1 or an or ns or ar > 1:
        return None
    labels: list[bytes] = []
    off = 12
    while True:
        n = wire[off]
        if n == 0:
            off += 1
            break
        label = wire[off + 1 : off + 1 + n]
        if n > 63 or len(label) != n or not _HOST_LABEL.fullmatch(label):
            return None
        labels.append(label)
        off += 1 + n
        if off - 12 > MAX_NAME or off >= len(wire):
            return None
    if off + 4 > len(wire):
        return None
    qtype, qclass = struct.unpack_from(">HH", wire, off)
    qend = off + 4
    if ar == 0:
        if qend != len(wire):
            return None
    elif not _is_opt(wire, qend):
        return None
    return Question(
        qid=qid,
        rd=bool(flags & FLAG_RD),
        name=b".".join(labels).decode("ascii").lower(),
        qtype=qtype,
        qclass=qclass,
        question=wire[12:qend],
        edns=ar == 1,
    )


def _is_opt(wire: bytes, off: int) -> bool:
    """`wire[off:]` is exactly one EDNS(0) OPT record (root owner, version 0, any options)."""
    if off + 11 > len(wire) or wire[off] != 0:
        return False
    rtype: int
    ttl: int
    rdlen: int
    rtype, _payload, ttl, rdlen = _RR.unpack_from(wire, off + 1)
    version = (ttl >> 16) & 0xFF
    return rtype == TYPE_OPT and version == 0 and off + 11 + rdlen == len(wire)


def is_host_name(name: str) -> bool:
    """`name` (dotted text) can be written by `encode_name`."""
    labels = name.split(".") if name else []
    return all(_HOST_LABEL.fullmatch(p.encode("ascii", "replace")) for p in labels)


def encode_name(name: str) -> bytes:
    """Wire form of a host name made of host-name labels (no compression)."""
    if not name:
        return b"\0"
    return b"".join(bytes([len(p)]) + p.encode("ascii") for p in name.split(".")) + b"\0"


def build_query(qid: int, name: str, qtype: int) -> bytes:
    """A fresh recursive query for `name` (no EDNS: answers stay small; TC means ask by TCP)."""
    return _HEADER.pack(qid, FLAG_RD, 1, 0, 0, 0) + encode_name(name) + struct.pack(">HH", qtype, 1)


def matches(query: bytes, resp: bytes) -> bool:
    """`resp` answers `query` (one of ours): same id, QR set, same question (any letter case).

    Error answers without a question section are accepted too (servers send those).
    """
    if len(resp) < 12 or resp[:2] != query[:2] or not resp[2] & 0x80:
        return False
    qd = int.from_bytes(resp[4:6], "big")
    if qd == 0:
        return resp[3] & 0x0F not in (RCODE_NOERROR, RCODE_NXDOMAIN)
    qlen = len(query) - 12
    return qd == 1 and resp[12 : 12 + qlen].lower() == query[12:].lower()


def parse_answer(resp: bytes) -> tuple[int, list[Record]]:
    """(rcode, the IN A/AAAA/CNAME records of the answer section); WireError if malformed.

    Records whose owner or CNAME target is not a host name are left out (the resolver then
    simply finds no chain through them).
    """
    if len(resp) < 12:
        raise WireError("short header")
    _qid, flags, qd, an, _ns, _ar = _HEADER.unpack_from(resp)
    if flags & FLAG_TC:
        raise WireError("truncated")
    off = 12
    for _ in range(qd):
        _name, off = read_name(resp, off)
        off += 4
    records: list[Record] = []
    for _ in range(an):
        owner, off = read_name(resp, off)
        if off + 10 > len(resp):
            raise WireError("record header past the end")
        rtype, rclass, ttl, rdlen = _RR.unpack_from(resp, off)
        off += 10
        end = off + rdlen
        if end > len(resp):
            raise WireError("record data past the end")
        rec = _record(resp, owner, rtype, rclass, ttl & 0x7FFFFFFF, off, end)
        if rec is not None:
            records.append(rec)
        off = end
    return flags & 0x0F, records


def _record(
    resp: bytes, owner: str | None, rtype: int, rclass: int, ttl: int, off: int, end: int
) -> Record | None:
    if rclass != CLASS_IN or owner is None:
        return None
    if rtype == TYPE_A:
        if end - off != 4:
            raise WireError("A record of the wrong size")
        return Record(owner, rtype, ttl, ipaddress.IPv4Address(resp[off:end]))
    if rtype == TYPE_AAAA:
        if end - off != 16:
            raise WireError("AAAA record of the wrong size")
        return Record(owner, rtype, ttl, ipaddress.IPv6Address(resp[off:end]))
    if rtype == TYPE_CNAME:
        target, after = read_name(resp, off)
        if after != end:
            raise WireError("CNAME data of the wrong size")
        return None if target is None else Record(owner, rtype, ttl, target)
    return None


def read_name(msg: bytes, off: int) -> tuple[str | None, int]:
    """(lower-case name, or None if a label is not a host-name label; offset after the name).

    Compression pointers are followed at most MAX_POINTERS times and the name may not exceed
    MAX_NAME bytes, so a pointer loop ends in WireError, not in a hang.
    """
    labels: list[bytes] = []
    end = -1
    size = 0
    for _ in range(MAX_NAME + MAX_POINTERS):
        if off >= len(msg):
            raise WireError("name past the end")
        n = msg[off]
        if n == 0:
            if end < 0:
                end = off + 1
            break
        if n & 0xC0 == 0xC0:
            if off + 1 >= len(msg):
                raise WireError("pointer past the end")
            if end < 0:
                end = off + 2
            off = ((n & 0x3F) << 8) | msg[off + 1]
            continue
        if n & 0xC0:
            raise WireError("unknown label type")
        size += n + 1
        if size > MAX_NAME or off + 1 + n > len(msg):
            raise WireError("name too long or past the end")
        labels.append(msg[off + 1 : off + 1 + n])
        off += 1 + n
    else:
        raise WireError("name loops")
    if all(_HOST_LABEL.fullmatch(label) for label in labels):
        return b".".join(labels).decode("ascii").lower(), end
    return None, end


def build_answer(q: Question, rcode: int, records: Sequence[Record] = (), ttl: int = 0) -> bytes:
    """The answer to `q`: its question echoed, `records` with TTLs capped at `ttl`."""
    flags = FLAG_QR | FLAG_RA | (FLAG_RD if q.rd else 0) | rcode
    parts = [_HEADER.pack(q.qid, flags, 1, len(records), 0, 1 if q.edns else 0), q.question]
    for r in records:
        # The owner is the question's name: point at it (offset 12), so it keeps the letter
        # case the client used.
        owner = b"\xc0\x0c" if r.owner == q.name else encode_name(r.owner)
        if isinstance(r.value, str):
            rdata = encode_name(r.value)
        else:
            rdata = r.value.packed
        parts.append(owner + _RR.pack(r.rtype, CLASS_IN, max(0, min(r.ttl, ttl)), len(rdata)))
        parts.append(rdata)
    if q.edns:
        parts.append(b"\0" + _RR.pack(TYPE_OPT, EDNS_PAYLOAD, 0, 0))
    return b"".join(parts)
