"""What a connection out of the container says it is for: the TLS ClientHello's server name,
and each plain-HTTP request's Host. Pure functions over bytes, no sockets (unit-tested with a
corpus, malformed input included); `linpodx.egress.checker` runs them on live connections.

Both readers are strict on purpose: whatever they accept, a real server must route to the
name they return, so anything a server might read differently (two server names, duplicate
extensions, a ClientHello spread over records, a duplicate Host, obs-fold) is refused.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

TLS_HANDSHAKE = 22
CLIENT_HELLO = 1
EXT_SERVER_NAME = 0
HOST_NAME_TYPE = 0
MAX_RECORD = 16384 + 2048
"""A TLSPlaintext record's fragment is at most 2^14 bytes (RFC 8446 5.1); a little slack for
peers that overshoot, never more than this is buffered."""
MAX_NAME = 253


class Refused(Exception):
    """The bytes are not something the checker lets through (the message says why)."""


@dataclass(frozen=True)
class Hello:
    """A complete ClientHello's outcome: its server name, and how many bytes it took."""

    server_name: str
    length: int


def host_name(raw: bytes) -> str:
    """A server name or Host as the policy compares it: ASCII letters, digits, `-`, `_` and
    dots only (IDNs arrive as A-labels), lower-cased, one trailing dot removed, at most 253
    characters with labels of 1-63. Refused otherwise (NUL, non-ASCII, empty labels…)."""
    if not raw or len(raw) > MAX_NAME + 1:
        raise Refused("server name is empty or too long")
    for b in raw:
        if not (0x30 <= b <= 0x39 or 0x41 <= b <= 0x5A or 0x61 <= b <= 0x7A or b in b"-_."):
            raise Refused("server name holds a byte no host name has")
    name = raw.decode("ascii").lower()
    if name.endswith("."):
        name = name[:-1]
    if not name or len(name) > MAX_NAME:
        raise Refused("server name is empty or too long")
    if any(not label or len(label) > 63 for label in name.split(".")):
        raise Refused("server name has an empty or overlong label")
    return name


def client_hello(data: bytes) -> Hello | None:
    """The server name of the ClientHello at the start of `data`; None while more bytes are
    needed (at most one record's worth); Refused if it is not one plain ClientHello with
    exactly one host name, wholly inside the first TLS record."""
    if len(data) < 5:
        if data and data[0] != TLS_HANDSHAKE:
            raise Refused("not a TLS handshake")
        return None
    if data[0] != TLS_HANDSHAKE or data[1] != 3:
        raise Refused("not a TLS handshake")
    rec_len = int.from_bytes(data[3:5], "big")
    if rec_len < 4 or rec_len > MAX_RECORD:
        raise Refused("TLS record length out of range")
    if len(data) < 5 + rec_len:
        return None
    rec = data[5 : 5 + rec_len]
    if rec[0] != CLIENT_HELLO:
        raise Refused("first handshake message is not a ClientHello")
    hs_len = int.from_bytes(rec[1:4], "big")
    if hs_len + 4 != rec_len:
        # Larger: the ClientHello goes on in the next record (refused: a server would join
        # the records, and the name could come in a later one). Smaller: a second message
        # follows in the same record, which no client sends first.
        raise Refused("ClientHello is not exactly one TLS record")
    body = memoryview(rec)[4:]
    return Hello(_server_name(body), 5 + rec_len)


TLS_CHANGE_CIPHER_SPEC = 20
SERVER_HELLO = 2
HELLO_RETRY_RANDOM = bytes.fromhex(
    "cf21ad74e59a6111be1d8c021e65b891c2a211167abb8c5e079e09e2c8a8339c"
)
"""The ServerHello.random that makes it a HelloRetryRequest (RFC 8446 4.1.3)."""


def server_asks_retry(data: bytes) -> bool | None:
    """Whether the server's first bytes are a HelloRetryRequest (True), anything else (False),
    or None while more bytes are needed. After one the client sends a second ClientHello in
    the clear, and a server (OpenSSL's SNI callback, for one) routes by *its* server name."""
    if data and data[0] != TLS_HANDSHAKE:
        return False
    if len(data) < 5 + 4 + 2 + 32:
        return None
    return data[5] == SERVER_HELLO and data[11:43] == HELLO_RETRY_RANDOM


def retried_hello(data: bytes) -> Hello | None:
    """The second ClientHello (after a HelloRetryRequest) at the start of `data`, behind the
    ChangeCipherSpec records a client may send first (RFC 8446 D.4); None while more bytes
    are needed; `length` counts from the start of `data`. Refused like the first one."""
    skipped = 0
    while data[skipped : skipped + 1] == bytes([TLS_CHANGE_CIPHER_SPEC]):
        if len(data) < skipped + 6:
            return None
        if data[skipped + 1] != 3 or data[skipped + 3 : skipped + 6] != b"\x00\x01\x01":
            raise Refused("malformed ChangeCipherSpec before the second ClientHello")
        skipped += 6
    hello = client_hello(data[skipped:])
    return None if hello is None else Hello(hello.server_name, skipped + hello.length)


class _Reader:
    def __init__(self, buf: memoryview) -> None:
        self.buf = buf
        self.pos = 0

    def take(self, n: int) -> memoryview:
        if self.pos + n > len(self.buf):
            raise Refused("ClientHello is truncated")
        out = self.buf[self.pos : self.pos + n]
        self.pos += n
        return out

    def num(self, n: int) -> int:
        return int.from_bytes(self.take(n), "big")

    def vec(self, n: int) -> memoryview:
        return self.take(self.num(n))

    def done(self) -> bool:
        return self.pos == len(self.buf)


def _server_name(body: memoryview) -> str:
    r = _Reader(body)
    r.take(2 + 32)  # legacy_version, random
    if len(r.vec(1)) > 32:
        raise Refused("ClientHello session id longer than 32 bytes")
    suites = r.vec(2)
    if not suites or len(suites) % 2:
        raise Refused("ClientHello cipher suites malformed")
    if not r.vec(1):
        raise Refused("ClientHello has no compression methods")
    if r.done():
        raise Refused("ClientHello has no extensions (no server name)")
    exts = _Reader(r.vec(2))
    if not r.done():
        raise Refused("bytes after the ClientHello's extensions")
    seen: set[int] = set()
    name: str | None = None
    while not exts.done():
        kind = exts.num(2)
        data = exts.vec(2)
        if kind in seen:
            raise Refused("ClientHello repeats an extension")
        seen.add(kind)
        if kind == EXT_SERVER_NAME:
            name = _one_host_name(data)
    # The encrypted_client_hello extension needs nothing here: the name judged is the outer
    # one, in server_name, which is what the network sees and what a server without the
    # ECH keys routes by.
    if name is None:
        raise Refused("ClientHello carries no server name")
    return name


def _one_host_name(data: memoryview) -> str:
    r = _Reader(data)
    names = _Reader(r.vec(2))
    if not r.done():
        raise Refused("bytes after the server name list")
    found: str | None = None
    while not names.done():
        kind = names.num(1)
        value = bytes(names.vec(2))
        if kind != HOST_NAME_TYPE or found is not None:
            raise Refused("server name list holds more than one host name")
        found = host_name(value)
    if found is None:
        raise Refused("server name list is empty")
    return found


# -- plain HTTP --------------------------------------------------------------------------------
MAX_HEAD = 16384
"""Bytes of one request's head (request line and fields) read before it must be complete."""


def _has_obs_fold(head: bytes) -> bool:
    lines = head.split(b"\n")
    return any(line[:1] in (b" ", b"\t") for line in lines[1:])


def _authority_host(authority: bytes) -> bytes:
    """The host part of `host[:port]` (a bracketed IPv6 literal stays bracketed and fails)."""
    if b"@" in authority:
        raise Refused("userinfo in a request's authority")
    host, sep, port = authority.rpartition(b":")
    if sep and port.isdigit() and b"]" not in port:
        return host
    if sep and not port:
        return host
    return authority


class HttpRequests:
    """Reads the client's side of one plain-HTTP connection with h11 and says, for each
    request, which host it is for. `feed` returns the hosts of the request heads completed by
    the bytes given (the caller checks each before forwarding those bytes)."""

    def __init__(self) -> None:
        import h11

        self._h11 = h11
        self._conn = h11.Connection(h11.SERVER, max_incomplete_event_size=MAX_HEAD)
        self._pending = b""  # bytes of a head not complete yet, checked for obs-fold first
        self._in_head = True
        self.upgraded = False
        """A request asked to switch protocols (WebSocket): what follows is not HTTP."""
        self.requests = 0

    @property
    def unjudged(self) -> int:
        """How many of the last bytes fed belong to a request head not complete yet (its Host
        not known): they must not go on until it is. A server may take the end of input as
        the end of a head (Python's http.server does), so bytes passed on early are a
        request the client can complete by half-closing."""
        return len(self._pending) if self._in_head else 0

    def feed(self, data: bytes) -> list[str]:
        h11 = self._h11
        hosts: list[str] = []
        if self.upgraded:
            raise Refused("data after a protocol switch request before the server's answer")
        if self._in_head:
            self._pending += data
            data = b""
            # RFC 9112 2.2: a server SHOULD ignore at least one empty line before a request
            # line (h11 does not); empty lines only, never a lone CR.
            while self._pending.startswith((b"\r\n", b"\n")):
                self._pending = self._pending[2 if self._pending[0] == 13 else 1 :]
            stripped = self._pending
            end = stripped.find(b"\n\r\n")
            end2 = stripped.find(b"\n\n")
            ends = [e for e in (end, end2) if e >= 0]
            if not ends:
                if len(self._pending) > MAX_HEAD:
                    raise Refused("request head longer than 16 KiB")
                return hosts
            if _has_obs_fold(stripped[: min(ends) + 1]):
                raise Refused("obsolete line folding in a request head")
            data, self._pending = self._pending, b""
        try:
            self._conn.receive_data(data)
            while True:
                ev = self._conn.next_event()
                if ev is h11.NEED_DATA:
                    break
                if ev is h11.PAUSED:
                    if self._conn.their_state is h11.MIGHT_SWITCH_PROTOCOL:
                        self.upgraded = True
                        rest, _closed = self._conn.trailing_data
                        if rest:
                            raise Refused("data after a protocol switch request")
                        break
                    # One request done: the next one starts a fresh parse (its head is read
                    # whole first, for the obs-fold check), whatever the response does.
                    rest, _closed = self._conn.trailing_data
                    self._conn = h11.Connection(h11.SERVER, max_incomplete_event_size=MAX_HEAD)
                    self._in_head = True
                    if rest:
                        hosts.extend(self.feed(rest))
                    break
                if isinstance(ev, h11.Request):
                    hosts.append(self._host(ev))
                    self._in_head = False
                    self.requests += 1
                elif isinstance(ev, h11.ConnectionClosed):
                    break
        except h11.RemoteProtocolError as exc:
            raise Refused(f"not a valid HTTP/1.1 request ({exc})") from None
        return hosts

    def _host(self, ev: Any) -> str:
        if ev.method == b"CONNECT":
            raise Refused("CONNECT is not allowed")
        hosts = [v for k, v in ev.headers if k == b"host"]
        if len(hosts) != 1:
            raise Refused("a request needs exactly one Host")
        names = {k for k, _ in ev.headers}
        # Request smuggling: h11 frames a body by Transfer-Encoding over Content-Length, and
        # reads chunked in HTTP/1.0; a server (or a CDN in front) that frames it otherwise
        # reads what h11 took for body as the next request, whose Host was never checked.
        # RFC 9112 6.1 lets a server refuse both cases; so does the checker.
        if b"transfer-encoding" in names:
            if b"content-length" in names:
                raise Refused("a request with both Content-Length and Transfer-Encoding")
            if ev.http_version != b"1.1":
                raise Refused("Transfer-Encoding in an HTTP/1.0 request")
        # After a switch to h2c each stream names its own :authority, which the checker does
        # not read (a server routes by it); WebSocket is the one switch let through.
        upgrades = [v.strip().lower() for k, v in ev.headers if k == b"upgrade"]
        if upgrades and upgrades != [b"websocket"]:
            raise Refused("Upgrade to anything but websocket")
        host = host_name(_authority_host(hosts[0]))
        target = ev.target
        if target.startswith(b"/") or target == b"*":
            return host
        scheme, sep, rest = target.partition(b"://")
        if not sep or scheme.lower() not in (b"http", b"https"):
            raise Refused("request target is neither a path nor an absolute URI")
        # The authority ends at the first `/`, `?` or `#` (RFC 3986 3.2); a server that ends
        # it at `/` only and takes the host after the last `@` would read `evil.test` from
        # `http://allowed.test?@evil.test/`. So nothing that ends it early before a `/`, and
        # no `#` at all (absolute-URI has no fragment, RFC 9112 3.2).
        authority = rest.split(b"/", 1)[0]
        if b"#" in target or b"?" in authority:
            raise Refused("request target's authority could be read two ways ('?' or '#')")
        # RFC 9112 3.2.2: a server uses the absolute-form's authority and ignores Host, so
        # that is the name; Host must agree anyway (a proxy in front might read Host).
        if host_name(_authority_host(authority)) != host:
            raise Refused("absolute-form target names another host than Host")
        return host
