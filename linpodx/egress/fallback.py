"""The policy resolver's path for every query the strict codec (`wire`) does not take.

dnspython parses these (other opcodes, record types, classes, flags, denied names, odd labels,
garbage: exactly the hostile variety a maintained library is for) and answers errors and
denials itself; an allowed A/AAAA question that merely came in an unusual form is handed
back to the resolver as a `Question`. Imported on first use: dnspython's import costs about
0.1 s of CPU, which the guard would otherwise spend while podman is still creating the
container; the guard preloads it in the background once the container runs.
"""

from __future__ import annotations

import struct
from collections.abc import Callable

import dns.exception
import dns.flags
import dns.message
import dns.opcode
import dns.rcode
import dns.rdataclass
import dns.rdatatype

from linpodx.egress import wire
from linpodx.egress.policy import Allowlist, normalize_name
from linpodx.egress.wire import Question

ADDRESS_TYPES = (dns.rdatatype.A, dns.rdatatype.AAAA)


def judge(
    data: bytes, allowlist: Allowlist, denied: Callable[[str, str, str], None]
) -> bytes | Question | None:
    """The answer to send, None for no answer at all, or the Question to look up."""
    try:
        query = dns.message.from_wire(data)
    except dns.message.ShortHeader:
        return None
    except dns.exception.DNSException:
        return _header_only(data, dns.rcode.FORMERR)
    if query.flags & dns.flags.QR:
        return None  # a response is never answered (no reflection loops)
    if query.opcode() != dns.opcode.QUERY:
        return _reply(query, dns.rcode.NOTIMP)
    if len(query.question) != 1:
        return _reply(query, dns.rcode.FORMERR)
    dq = query.question[0]
    name = normalize_name(dq.name.to_text(omit_final_dot=True))
    tname = dns.rdatatype.to_text(dq.rdtype)
    if dq.rdclass != dns.rdataclass.IN or not allowlist.allows(name):
        denied(name, tname, "name not in the allowlist")
        return _reply(query, dns.rcode.NXDOMAIN)
    if dq.rdtype not in ADDRESS_TYPES:
        # CNAME-only questions are not needed by clients (they ask A/AAAA and get the
        # chain); every other type can carry data: refuse.
        denied(name, tname, f"record type {tname} is not answered")
        return _reply(query, dns.rcode.REFUSED)
    if not wire.is_host_name(name):
        denied(name, tname, "not a host name (letters, digits, '-', '_')")
        return _reply(query, dns.rcode.REFUSED)
    return Question(
        qid=query.id,
        rd=bool(query.flags & dns.flags.RD),
        name=name,
        qtype=int(dq.rdtype),
        qclass=wire.CLASS_IN,
        question=wire.encode_name(name) + struct.pack(">HH", dq.rdtype, wire.CLASS_IN),
        edns=query.edns >= 0,
    )


def _reply(query: dns.message.Message, rcode: dns.rcode.Rcode) -> bytes:
    resp = dns.message.make_response(query)
    resp.flags |= dns.flags.RA
    resp.set_rcode(rcode)
    return resp.to_wire()


def _header_only(data: bytes, rcode: int) -> bytes:
    """A bare header answer for a query dnspython could not parse past its header."""
    flags = 0x8000 | 0x0080 | (rcode & 0xF)  # QR, RA, rcode
    return data[:2] + flags.to_bytes(2, "big") + b"\x00" * 8
