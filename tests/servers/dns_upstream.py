"""A tiny DNS server for tests (UDP, dnspython), on an address of this machine.

It answers from a function of (name, type) and records every question as it came (letter case
kept), so a test can assert what the egress guard asked its upstream, and what it never asked.
"""

from __future__ import annotations

import socket
import threading
from collections.abc import Callable

import dns.message
import dns.rcode
import dns.rdatatype
import dns.rrset

Records = list[tuple[str, str, str]]
"""(owner, type, value) records of an answer."""
Answer = Callable[[str, str], "Records | None"]
"""(name as asked, type) -> the records to answer with; None for NXDOMAIN."""


class DnsUpstream:
    """Serves on `host`, a free port (`port`), until the process ends or `close()`."""

    def __init__(self, answer: Answer, host: str = "127.0.0.1", ttl: int = 60) -> None:
        self.answer = answer
        self.ttl = ttl
        self.asked: list[tuple[str, str]] = []
        self.sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        self.sock.bind((host, 0))
        self.port = self.sock.getsockname()[1]
        threading.Thread(target=self._loop, daemon=True).start()

    def close(self) -> None:
        self.sock.close()

    def _loop(self) -> None:
        while True:
            try:
                data, peer = self.sock.recvfrom(4096)
            except OSError:
                return
            q = dns.message.from_wire(data)
            r = dns.message.make_response(q)
            name = q.question[0].name.to_text(omit_final_dot=True)
            rtype = dns.rdatatype.to_text(q.question[0].rdtype)
            self.asked.append((name, rtype))
            records = self.answer(name, rtype)
            if records is None:
                r.set_rcode(dns.rcode.NXDOMAIN)
            for owner, t, value in records or []:
                r.answer.append(dns.rrset.from_text(owner + ".", self.ttl, "IN", t, value))
            self.sock.sendto(r.to_wire(), peer)
