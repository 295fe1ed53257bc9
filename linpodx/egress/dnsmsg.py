"""Every DNS message of the policy resolver, parsed and built by dnspython.

Queries from the container and answers from upstream are untrusted bytes on the security
boundary: only dnspython (a maintained library) reads them, and only dnspython writes what
the resolver sends, from parsed values. No policy here: `resolver` decides, this module reads
and writes messages for it.

Speed (a cold lookup parses two messages and builds two): messages are written with
`dns.renderer.Renderer` directly rather than through `dns.message.Message.to_wire`, which
would first build a Message object per reply; names are turned into text from their parsed
labels rather than through `to_text()` (escaping) whenever they are host names.

Imported on first use: dnspython's import costs about 0.1 s of CPU, which the guard would
otherwise spend while podman is still creating the container; the guard preloads it in the
background as soon as it is ready, before the container's command runs.
"""

from __future__ import annotations

import ipaddress
import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import dns.exception
import dns.flags
import dns.message
import dns.name
import dns.opcode
import dns.rcode
import dns.rdataclass
import dns.rdatatype
import dns.renderer
import dns.rrset

from linpodx.egress.policy import IPAddress, normalize_name

A = dns.rdatatype.A
AAAA = dns.rdatatype.AAAA
CNAME = dns.rdatatype.CNAME
IN = dns.rdataclass.IN
NOERROR = dns.rcode.NOERROR
FORMERR = dns.rcode.FORMERR
SERVFAIL = dns.rcode.SERVFAIL
NXDOMAIN = dns.rcode.NXDOMAIN
NOTIMP = dns.rcode.NOTIMP
REFUSED = dns.rcode.REFUSED

EDNS_PAYLOAD = 1232
"""What our OPT record advertises (the common safe UDP size, RFC 9715)."""
MAX_MESSAGE = 65535

_HOST_LABEL = re.compile(rb"[A-Za-z0-9_-]{1,63}")
_ECHOED_FLAGS = dns.flags.RD | dns.flags.CD
"""Query flags a response repeats (as `dns.message.make_response` does)."""


@dataclass(frozen=True, slots=True)
class Query:
    """One parsed query with a single question."""

    message: dns.message.Message
    qname: dns.name.Name
    """As the client wrote it (letter case kept: the answer echoes it)."""
    name: str
    """Lower-case text without the trailing dot (escaped, if not a host name)."""
    is_host_name: bool
    """Every label is a host-name label (letters, digits, `-`, `_`)."""
    rdtype: int
    rdclass: int

    @property
    def type_text(self) -> str:
        return dns.rdatatype.to_text(self.rdtype)  # type: ignore[arg-type]

    @property
    def plain(self) -> bool:
        """Nothing but a header and the question (what the bytes cache may key on)."""
        m = self.message
        return m.edns < 0 and not (m.answer or m.authority or m.additional)


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


def read_query(data: bytes) -> Query | bytes | None:
    """The query in `data`, or the error reply to send at once, or None for no reply at all."""
    try:
        msg = dns.message.from_wire(data)
    except dns.message.ShortHeader:
        return None
    except dns.exception.DNSException:
        return _header_only(int.from_bytes(data[:2], "big"), FORMERR)
    if msg.flags & dns.flags.QR:
        return None  # a response is never answered (no reflection loops)
    if msg.opcode() != dns.opcode.QUERY:
        return _render(msg, None, NOTIMP)
    if len(msg.question) != 1:
        return _render(msg, None, FORMERR)
    q = msg.question[0]
    text = host_name(q.name)
    return Query(
        message=msg,
        qname=q.name,
        name=text if text is not None else normalize_name(q.name.to_text(omit_final_dot=True)),
        is_host_name=text is not None,
        rdtype=q.rdtype,
        rdclass=q.rdclass,
    )


def answer(
    q: Query, rcode: dns.rcode.Rcode, rrsets: Sequence[dns.rrset.RRset] = (), ttl: int = 0
) -> bytes:
    """The reply to `q`: its question echoed, `rrsets` with every TTL capped at `ttl`."""
    return _render(q.message, q, rcode, rrsets, ttl)


def _render(
    msg: dns.message.Message,
    q: Query | None,
    rcode: dns.rcode.Rcode,
    rrsets: Sequence[dns.rrset.RRset] = (),
    ttl: int = 0,
) -> bytes:
    flags = dns.flags.QR | dns.flags.RA | (msg.flags & _ECHOED_FLAGS) | rcode
    if q is None:  # an error reply: it names the opcode it refuses (QUERY is 0)
        flags |= dns.opcode.to_flags(msg.opcode())
    out = _renderer(msg.id, flags)
    if q is not None:
        out.add_question(q.qname, q.rdtype, q.rdclass)
    for rrset in rrsets:
        # Shallow: the cached rrset keeps its own TTL.
        capped: dns.rrset.RRset = rrset.copy()  # type: ignore[no-untyped-call]
        capped.ttl = max(0, min(rrset.ttl, ttl))
        out.add_rrset(dns.renderer.ANSWER, capped, want_shuffle=False)
    if msg.edns >= 0:
        out.add_edns(0, 0, EDNS_PAYLOAD)
    out.write_header()
    wire: bytes = out.get_wire()
    return wire


def _renderer(qid: int, flags: int) -> Any:
    """dnspython's message writer (`dns.renderer` has no type annotations, hence Any)."""
    return dns.renderer.Renderer(qid, flags, MAX_MESSAGE)  # type: ignore[no-untyped-call]


def _header_only(qid: int, rcode: dns.rcode.Rcode) -> bytes:
    """A bare header reply for a query dnspython could not parse past its header."""
    out = _renderer(qid, dns.flags.QR | dns.flags.RA | rcode)
    out.write_header()
    wire: bytes = out.get_wire()
    return wire


@dataclass(frozen=True, slots=True)
class Outgoing:
    """Our fresh query to an upstream: its wire form and what its answer must repeat."""

    wire: bytes
    qid: int
    qname: dns.name.Name
    rdtype: int


def upstream_query(qid: int, qname: dns.name.Name, rdtype: int) -> Outgoing:
    """A new recursive query for `qname` (no EDNS: answers stay small; TC means ask by TCP)."""
    out = _renderer(qid, dns.flags.RD)
    out.add_question(qname, rdtype, IN)
    out.write_header()
    return Outgoing(out.get_wire(), qid, qname, rdtype)


def read_reply(sent: Outgoing, data: bytes) -> dns.message.Message | None:
    """The upstream's answer in `data` if it answers `sent`, else None (skip it, keep waiting).

    It must carry our random id, QR, and our question (any letter case); an error answer
    without a question section is accepted as the error it is.
    """
    try:
        resp = dns.message.from_wire(data)
    except dns.exception.DNSException:
        return None
    if resp.id != sent.qid or not resp.flags & dns.flags.QR or resp.opcode() != dns.opcode.QUERY:
        return None
    if not resp.question:
        return resp if resp.rcode() not in (NOERROR, NXDOMAIN) else None
    if len(resp.question) != 1:
        return None
    q = resp.question[0]
    ours = q.name == sent.qname and q.rdtype == sent.rdtype and q.rdclass == IN
    return resp if ours else None


def truncated(resp: dns.message.Message) -> bool:
    return bool(resp.flags & dns.flags.TC)


@dataclass(frozen=True, slots=True)
class Chain:
    """What an upstream answer says about one name, reduced to what may be passed on."""

    rrsets: list[dns.rrset.RRset]
    """The CNAME steps from the asked name, then the final address records."""
    addrs: list[IPAddress]
    ttl: int
    """The smallest TTL on the chain (0 when there is nothing to answer)."""
    names: frozenset[str]
    """The asked name and every CNAME target reached from it."""


def follow_chain(resp: dns.message.Message, name: str, rdtype: int, max_steps: int) -> Chain:
    """Keep only the CNAME chain from `name` and the final `rdtype` address records.

    Records for other owners (an upstream stuffing extra names into the answer), of other
    classes, or whose owner or target is not a host name are dropped: a CNAME target is
    allowed for this lookup only, because it was reached from `name`.
    """
    owned: dict[str, list[dns.rrset.RRset]] = {}
    for rrset in resp.answer:
        owner = host_name(rrset.name) if rrset.rdclass == IN else None
        if owner is not None:
            owned.setdefault(owner, []).append(rrset)
    current = name
    names = {current}
    kept: list[dns.rrset.RRset] = []
    addrs: list[IPAddress] = []
    ttl = 2**31
    for _ in range(max_steps + 1):
        step = _cname_step(owned.get(current, ()))
        if step is None:
            for rrset in owned.get(current, ()):
                if rrset.rdtype == rdtype:
                    kept.append(rrset)
                    ttl = min(ttl, rrset.ttl)
                    addrs.extend(ipaddress.ip_address(rd.address) for rd in rrset)
            break
        rrset, target = step
        kept.append(rrset)
        ttl = min(ttl, rrset.ttl)
        current = target
        names.add(current)
    return Chain(kept, addrs, ttl if kept else 0, frozenset(names))


def _cname_step(rrsets: Sequence[dns.rrset.RRset]) -> tuple[dns.rrset.RRset, str] | None:
    """The CNAME among an owner's rrsets, as a one-record rrset and its target's text.

    Only the first record of a (malformed) multi-record CNAME rrset is followed and passed on,
    so the answer never names a target the chain did not follow.
    """
    for rrset in rrsets:
        if rrset.rdtype == CNAME:
            rd = rrset[0]
            target = host_name(rd.target)
            if target is None:
                return None
            return dns.rrset.from_rdata(rrset.name, rrset.ttl, rd), target
    return None
