"""The connection checker's pure parts: allowlist entries, the ClientHello reader, the HTTP
request reader, leases and judging; and a parser-differential test against real servers
(Python's ssl module with an SNI callback, http.server): the checker never lets through a
connection that the server would route to a name other than the one the checker judged."""

from __future__ import annotations

import ipaddress
import socket
import ssl
import subprocess
import threading
from http.server import BaseHTTPRequestHandler, HTTPServer
from pathlib import Path
from typing import Any, ClassVar

import pytest

from linpodx.egress.checker import Leases, Refusal, judge
from linpodx.egress.inspect import (
    HttpRequests,
    Refused,
    client_hello,
    host_name,
    retried_hello,
    server_asks_retry,
)
from linpodx.egress.policy import Allowlist
from linpodx.profile.egressentry import Rule, split_entry
from linpodx.profile.loader import normalize_entry

ADDR = ipaddress.IPv4Address("192.0.2.10")


# -- entries -------------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("raw", "canonical"),
    [
        ("Example.com", "example.com"),
        ("example.com:443", "example.com"),
        ("example.com:8443", "example.com:8443"),
        ("example.com:8443/tls", "example.com:8443"),
        ("example.com:80/http", "example.com:80/http"),
        ("*.Example.com:22/tcp", "*.example.com:22/tcp"),
        ("example.com.:80/http", "example.com:80/http"),
    ],
)
def test_entries_parse_to_one_canonical_form(raw: str, canonical: str) -> None:
    assert normalize_entry(raw) == (canonical, None)


@pytest.mark.parametrize(
    ("raw", "problem"),
    [
        ("example.com:0", "out of range"),
        ("example.com:65536", "out of range"),
        ("example.com:http", "not a number"),
        ("example.com/http", "needs a port"),
        ("example.com:80/udp", "unknown kind"),
        ("example.com:\uff18\uff10", "not"),
        ("192.0.2.1:80/http", "IP address"),
        ("[::1]", "IP address"),
    ],
)
def test_bad_entries_are_refused(raw: str, problem: str) -> None:
    norm, why = normalize_entry(raw)
    assert norm is None and why is not None and problem in why


def test_a_bare_name_is_tls_on_443_only() -> None:
    allow = Allowlist.from_entries(["a.test", "a.test:8080/http", "*.w.test:22/tcp"])
    assert allow.kinds("a.test", 443) == {"tls"}
    assert allow.kinds("a.test", 80) == frozenset()
    assert allow.kinds("a.test", 8080) == {"http"}
    assert allow.kinds("x.w.test", 22) == {"tcp"}
    assert allow.kinds("w.test", 22) == frozenset()  # a wildcard is never its apex
    assert allow.allows("a.test") and allow.allows("x.w.test") and not allow.allows("w.test")
    assert allow.ports() == {443, 8080, 22}
    assert split_entry("a.test:8080/http") == ("a.test", 8080, "http")
    assert Rule("a.test", 443, "tls").text() == "a.test"


# -- ClientHello ---------------------------------------------------------------------------
def real_hello(server_name: str | None, **kw: Any) -> bytes:
    """The ClientHello Python's ssl (OpenSSL) sends for `server_name`."""
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    ctx.check_hostname = False
    ctx.verify_mode = ssl.CERT_NONE
    inc, out = ssl.MemoryBIO(), ssl.MemoryBIO()
    obj = ctx.wrap_bio(inc, out, server_hostname=server_name, **kw)
    with pytest.raises(ssl.SSLWantReadError):
        obj.do_handshake()
    return out.read()


def test_a_real_client_hello_gives_its_server_name() -> None:
    data = real_hello("allowed.test")
    hello = client_hello(data)
    assert hello is not None and hello.server_name == "allowed.test"
    assert hello.length == len(data)
    # Incomplete: more bytes needed, never a verdict from a part.
    for cut in (1, 4, 5, 40, len(data) - 1):
        assert client_hello(data[:cut]) is None


def test_no_server_name_is_refused() -> None:
    with pytest.raises(Refused, match="no server name"):
        client_hello(real_hello(None))


def _set_record_len(data: bytes, n: int) -> bytes:
    return data[:3] + n.to_bytes(2, "big") + data[5:]


def _with_sni(name: bytes) -> bytes:
    """A real ClientHello with its server name replaced by `name` (lengths fixed up)."""
    data = real_hello("x" * len(name) if len(name) < 250 else "y.test")
    old = b"x" * len(name)
    if old in data:
        return data.replace(old, name)
    return data


def test_malformed_client_hellos_are_refused() -> None:
    good = real_hello("allowed.test")
    corpus = {
        "not TLS": b"GET / HTTP/1.1\r\n",
        "not a handshake": b"\x17" + good[1:],
        "record too long": _set_record_len(good, 40000),
        "ClientHello over two records": _set_record_len(good[: 5 + 100], 100),
        "second message in the record": _set_record_len(good + b"\x01\x00\x00\x00", len(good) - 1),
        "NUL in the name": _with_sni(b"allowed\x00test"),
        "non-ASCII": _with_sni(b"allow\xc3\xa9.test"),
        "space": _with_sni(b"allowed test"),
        "empty label": _with_sni(b"allowed..test"),
    }
    for why, data in corpus.items():
        with pytest.raises(Refused):
            client_hello(data)
            pytest.fail(why)
    with pytest.raises(Refused):
        host_name(b"a" * 64 + b".test")  # overlong label
    with pytest.raises(Refused):
        host_name(b"a." * 130 + b"test")  # overlong name


def test_server_name_is_normalized() -> None:
    hello = client_hello(_with_sni(b"ALLOWED.TEST."))
    assert hello is not None and hello.server_name == "allowed.test"


def test_duplicate_extension_is_refused() -> None:
    good = bytearray(real_hello("allowed.test"))
    # Append a second server_name extension: fix the extensions, handshake and record lengths.
    ext = b"\x00\x00" + (5 + 6).to_bytes(2, "big") + (3 + 6).to_bytes(2, "big") + b"\x00" + (
        6
    ).to_bytes(2, "big") + b"evil.t"
    data = _append_extension(bytes(good), ext)
    with pytest.raises(Refused, match="repeats an extension"):
        client_hello(data)


def _append_extension(data: bytes, ext: bytes) -> bytes:
    rec = bytearray(data[5:])
    body = rec[4:]
    pos = 2 + 32
    pos += 1 + body[pos]
    pos += 2 + int.from_bytes(body[pos : pos + 2], "big")
    pos += 1 + body[pos]
    ext_len = int.from_bytes(body[pos : pos + 2], "big") + len(ext)
    body = body[:pos] + ext_len.to_bytes(2, "big") + body[pos + 2 :] + ext
    hs = b"\x01" + len(body).to_bytes(3, "big") + body
    return data[:3] + len(hs).to_bytes(2, "big") + hs


def test_ech_grease_passes_on_its_outer_name() -> None:
    # An encrypted_client_hello extension (0xfe0d) with junk, as GREASE sends: the outer
    # server_name is what is judged.
    ext = b"\xfe\x0d" + (8).to_bytes(2, "big") + b"\x00" * 8
    hello = client_hello(_append_extension(real_hello("allowed.test"), ext))
    assert hello is not None and hello.server_name == "allowed.test"


# -- HTTP ------------------------------------------------------------------------------------
# -- HelloRetryRequest: a second ClientHello in the clear -----------------------------------
def _retry_server(tmp: Path, *, p256_only: bool) -> tuple[ssl.SSLContext, list[str | None]]:
    """A real TLS server (OpenSSL) that knows only P-256 when `p256_only` (OpenSSL clients
    offer an X25519 key share first, so it answers with a HelloRetryRequest), and the server
    names its SNI callback saw."""
    key, crt = tmp / "k.pem", tmp / "c.pem"
    if not crt.exists():
        subprocess.run(
            ["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1",
             "-subj", "/CN=allowed.test", "-keyout", str(key), "-out", str(crt)],
            check=True, capture_output=True,
        )  # fmt: skip
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    ctx.load_cert_chain(crt, key)
    if p256_only:
        ctx.set_ecdh_curve("prime256v1")
    seen: list[str | None] = []
    ctx.sni_callback = lambda _s, name, _c: seen.append(name)  # type: ignore[assignment,func-returns-value]
    return ctx, seen


def _exchange(ctx: ssl.SSLContext) -> tuple[ssl.SSLObject, ssl.MemoryBIO, ssl.MemoryBIO, bytes]:
    """A server object over memory, fed a real ClientHello for allowed.test, and the
    client's second ClientHello after the server's HelloRetryRequest."""
    client_ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    client_ctx.check_hostname = False
    client_ctx.verify_mode = ssl.CERT_NONE
    cin, cout = ssl.MemoryBIO(), ssl.MemoryBIO()
    client = client_ctx.wrap_bio(cin, cout, server_hostname="allowed.test")
    sin, sout = ssl.MemoryBIO(), ssl.MemoryBIO()
    server = ctx.wrap_bio(sin, sout, server_side=True)
    for obj in (client, server):
        if obj is server:
            sin.write(cout.read())
        with pytest.raises(ssl.SSLWantReadError):
            obj.do_handshake()
    answer = sout.read()
    cin.write(answer)
    with pytest.raises(ssl.SSLWantReadError):
        client.do_handshake()
    return server, sin, sout, cout.read()


def test_a_second_client_hello_is_read_and_a_server_would_route_by_it(tmp_path: Path) -> None:
    assert server_asks_retry(b"") is None
    ctx, seen = _retry_server(tmp_path, p256_only=True)
    server, sin, _, second = _exchange(ctx)
    assert seen == ["allowed.test"]
    got = retried_hello(second)
    assert got is not None and got.server_name == "allowed.test" and got.length == len(second)
    assert retried_hello(second[:10]) is None
    # The same second ClientHello naming another server (same length): the checker reads
    # that name, and a real server routes by it (which is why the checker must compare).
    forged = second.replace(b"allowed.test", b"evilxxx.test")
    got = retried_hello(forged)
    assert got is not None and got.server_name == "evilxxx.test"
    sin.write(forged)
    with pytest.raises(ssl.SSLWantReadError):
        server.do_handshake()
    assert seen == ["allowed.test", "evilxxx.test"]
    with pytest.raises(Refused):
        retried_hello(b"\x14\x03\x03\x00\x02\x01\x01" + second)


def test_a_hello_retry_request_is_told_from_a_server_hello(tmp_path: Path) -> None:
    for p256_only in (True, False):
        ctx, _ = _retry_server(tmp_path, p256_only=p256_only)
        client_ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
        client_ctx.check_hostname = False
        client_ctx.verify_mode = ssl.CERT_NONE
        cin, cout = ssl.MemoryBIO(), ssl.MemoryBIO()
        client = client_ctx.wrap_bio(cin, cout, server_hostname="allowed.test")
        with pytest.raises(ssl.SSLWantReadError):
            client.do_handshake()
        sin, sout = ssl.MemoryBIO(), ssl.MemoryBIO()
        server = ctx.wrap_bio(sin, sout, server_side=True)
        sin.write(cout.read())
        with pytest.raises(ssl.SSLWantReadError):
            server.do_handshake()
        answer = sout.read()
        assert server_asks_retry(answer) is p256_only
        assert server_asks_retry(answer[:42]) is None
    assert server_asks_retry(b"\x15\x03\x03\x00\x02\x02\x28") is False  # an alert


def hosts_of(*chunks: bytes) -> list[str]:
    h = HttpRequests()
    out: list[str] = []
    for c in chunks:
        out += h.feed(c)
    return out


def test_http_requests_each_give_their_host() -> None:
    two = b"GET / HTTP/1.1\r\nHost: a.test\r\n\r\nGET / HTTP/1.1\r\nHost: b.test\r\n\r\n"
    assert hosts_of(two) == ["a.test", "b.test"]
    assert hosts_of(b"\r\nGET / HTTP/1.1\r\nHost: A.test.:80\r\n\r\n") == ["a.test"]
    body = b"POST / HTTP/1.1\r\nHost: a.test\r\nContent-Length: 4\r\n\r\nab"
    assert hosts_of(body, b"cdGET / HTTP/1.1\r\nHo", b"st: c.test\r\n\r\n") == [
        "a.test",
        "c.test",
    ]
    chunked = b"POST / HTTP/1.1\r\nHost: a.test\r\nTransfer-Encoding: chunked\r\n\r\n"
    assert hosts_of(chunked + b"3\r\nabc\r\n0\r\n\r\nGET / HTTP/1.1\r\nHost: d.test\r\n\r\n") == [
        "a.test",
        "d.test",
    ]
    assert hosts_of(b"GET http://a.test/x HTTP/1.1\r\nHost: a.test\r\n\r\n") == ["a.test"]


@pytest.mark.parametrize(
    "head",
    [
        b"GET / HTTP/1.1\r\nHost: a.test\r\nHost: b.test\r\n\r\n",
        b"GET / HTTP/1.1\r\nHost: a.test\r\nX: y\r\n folded\r\n\r\n",
        b"GET / HTTP/1.1\r\n\r\n",
        b"GET / HTTP/1.0\r\n\r\n",
        b"GET http://evil.test/ HTTP/1.1\r\nHost: a.test\r\n\r\n",
        b"GET evil.test/ HTTP/1.1\r\nHost: a.test\r\n\r\n",
        b"CONNECT evil.test:443 HTTP/1.1\r\nHost: a.test\r\n\r\n",
        b"GET / HTTP/1.1\r\nHost: user@a.test\r\n\r\n",
        b"GET / HTTP/1.1\r\nHost: a\x00.test\r\n\r\n",
        b"\x16\x03\x01 not http\r\n\r\n",
    ],
)
def test_http_heads_that_are_refused(head: bytes) -> None:
    with pytest.raises(Refused):
        hosts_of(head)


@pytest.mark.parametrize(
    "target",
    [
        # RFC 3986 ends the authority at `?` or `#` (the checker read `a.test`), but a server
        # that takes everything up to the first `/` as the authority, and what follows its
        # last `@` as the host, reads `evil.test`; `#` has no place in a request target at all
        # (RFC 9112 3.2: absolute-URI has no fragment).
        b"http://a.test?@evil.test/",
        b"http://a.test#@evil.test/",
        b"http://a.test?x=1#@evil.test",
    ],
)
def test_absolute_form_targets_a_server_could_read_another_authority_from_are_refused(
    target: bytes,
) -> None:
    with pytest.raises(Refused, match="authority"):
        hosts_of(b"GET " + target + b" HTTP/1.1\r\nHost: a.test\r\n\r\n")
    # An `@` in the query, after the path began, names no host: still fine.
    assert hosts_of(b"GET http://a.test/?u=x@evil.test HTTP/1.1\r\nHost: a.test\r\n\r\n") == [
        "a.test"
    ]


# Request smuggling: where a server could frame the body differently from h11, what h11
# reads as body (here a request for evil.test) a server would read as the next request.
SMUGGLED = b"GET / HTTP/1.1\r\nHost: evil.test\r\n\r\n"


@pytest.mark.parametrize(
    "head",
    [
        # Content-Length and Transfer-Encoding both (RFC 9112 6.1: a server may frame by
        # either; h11 takes chunked, a server or a CDN in front taking Content-Length reads
        # the chunk's data as a request).
        b"POST / HTTP/1.1\r\nHost: a.test\r\nContent-Length: 4\r\n"
        b"Transfer-Encoding: chunked\r\n\r\n%x\r\n" % len(SMUGGLED) + SMUGGLED + b"\r\n0\r\n\r\n",
        # Transfer-Encoding in HTTP/1.0 (RFC 9112 6.1: the framing is faulty; a 1.0 server
        # reads no body and takes the chunk's data as the next request).
        b"POST / HTTP/1.0\r\nHost: a.test\r\nTransfer-Encoding: chunked\r\n\r\n%x\r\n"
        % len(SMUGGLED) + SMUGGLED + b"\r\n0\r\n\r\n",
    ],
)
def test_http_bodies_a_server_could_frame_otherwise_are_refused(head: bytes) -> None:
    with pytest.raises(Refused, match="Transfer-Encoding"):
        hosts_of(head)


@pytest.mark.parametrize("proto", [b"h2c", b"websocket, h2c", b"TLS/1.2", b"foo"])
def test_an_upgrade_to_anything_but_websocket_is_refused(proto: bytes) -> None:
    # After `101 Switching Protocols` to h2c every stream names its own :authority, which
    # the checker would no longer read: a server (a CDN) would route them by it.
    with pytest.raises(Refused, match="Upgrade"):
        hosts_of(
            b"GET / HTTP/1.1\r\nHost: a.test\r\nUpgrade: " + proto
            + b"\r\nConnection: Upgrade, HTTP2-Settings\r\nHTTP2-Settings: AAMAAABkAAQAAP__\r\n\r\n"
        )


def test_an_upgrade_request_stops_the_reading() -> None:
    h = HttpRequests()
    up = b"GET /ws HTTP/1.1\r\nHost: a.test\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n\r\n"
    assert h.feed(up) == ["a.test"] and h.upgraded
    with pytest.raises(Refused):
        h.feed(b"GET / HTTP/1.1\r\nHost: evil.test\r\n\r\n")


# -- leases and judging ----------------------------------------------------------------------
def test_judge_binds_names_to_the_addresses_resolved_for_them() -> None:
    now = [100.0]
    leases = Leases(clock=lambda: now[0])
    allow = Allowlist.from_entries(["allowed.test", "other.test", "allowed.test:80/http"])
    with pytest.raises(Refusal, match=r"address not resolved for allowed\.test"):
        judge(allow, leases, ADDR, 443, "allowed.test", "tls")
    leases.grant("allowed.test", [(ADDR, 130.0)])
    judge(allow, leases, ADDR, 443, "allowed.test", "tls")
    judge(allow, leases, ADDR, 80, "allowed.test", "http")
    with pytest.raises(Refusal) as exc:
        judge(allow, leases, ADDR, 443, "evil.test", "tls")
    assert exc.value.reason == (
        "server name not in the allowlist; address resolved for allowed.test"
    )
    with pytest.raises(Refusal, match=r"address not resolved for other\.test"):
        judge(allow, leases, ADDR, 443, "other.test", "tls")
    with pytest.raises(Refusal, match="port 8443 is not allowed"):
        judge(allow, leases, ADDR, 8443, "allowed.test", "tls")
    with pytest.raises(Refusal, match="allowed as http, not tls"):
        judge(allow, leases, ADDR, 80, "allowed.test", "tls")
    # The lease lapses, unless a connection to it is open; a new lookup renews it.
    leases.opened("allowed.test", ADDR)
    now[0] = 200.0
    judge(allow, leases, ADDR, 443, "allowed.test", "tls")
    leases.closed("allowed.test", ADDR)
    with pytest.raises(Refusal):
        judge(allow, leases, ADDR, 443, "allowed.test", "tls")
    leases.grant("allowed.test", [(ADDR, 260.0)])
    judge(allow, leases, ADDR, 443, "allowed.test", "tls")


# -- parser differential ---------------------------------------------------------------------
def _server_sni(data: bytes) -> str | None:
    """The name a real TLS server (OpenSSL via Python's ssl) routes `data` to: what its SNI
    callback sees; None if it fails before."""
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    seen: list[str | None] = []

    def cb(_s: ssl.SSLObject, name: str | None, _c: ssl.SSLContext) -> None:
        seen.append(name)

    ctx.sni_callback = cb  # type: ignore[assignment]
    inc, out = ssl.MemoryBIO(), ssl.MemoryBIO()
    obj = ctx.wrap_bio(inc, out, server_side=True)
    inc.write(data)
    try:
        obj.do_handshake()
    except ssl.SSLError:
        pass
    return seen[0] if seen else None


def _hello_corpus() -> list[bytes]:
    good = real_hello("allowed.test")
    out = [
        good,
        real_hello("evil.test"),
        real_hello("ALLOWED.test"),
        _with_sni(b"allowed.test\x00evil"),
        _append_extension(good, b"\x00\x00\x00\x0e\x00\x0c\x00\x00\x09evil.test"),
        _append_extension(good, b"\xfe\x0d\x00\x04abcd"),
    ]
    # Truncations and byte flips across the whole message.
    for i in range(5, len(good), 7):
        flipped = bytearray(good)
        flipped[i] ^= 0xFF
        out.append(bytes(flipped))
    return out


def test_checker_never_passes_a_client_hello_a_server_routes_elsewhere() -> None:
    checked = 0
    for data in _hello_corpus():
        try:
            hello = client_hello(data)
        except Refused:
            continue
        if hello is None:
            continue
        routed = _server_sni(data)
        if routed is not None:
            checked += 1
            assert routed.rstrip(".").lower() == hello.server_name, data.hex()
    assert checked >= 3


class _Recorder(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    routed: ClassVar[list[str]] = []

    def do_GET(self) -> None:
        host = self.headers.get("Host") or ""
        target = self.path
        if "://" in target:  # what an RFC 9112 server does with an absolute-form target
            host = target.split("://", 1)[1].split("/", 1)[0]
        self.routed.append(host.split(":")[0].rstrip(".").lower())
        length = int(self.headers.get("Content-Length") or 0)
        if length and "chunked" not in (self.headers.get("Transfer-Encoding") or ""):
            self.rfile.read(length)
        self.send_response(200)
        self.send_header("Content-Length", "0")
        self.end_headers()

    do_POST = do_GET

    def log_message(self, *args: Any) -> None:
        pass


HEAD_CORPUS = [
    b"GET / HTTP/1.1\r\nHost: allowed.test\r\n\r\n",
    b"GET / HTTP/1.1\r\nHost: allowed.test\r\n\r\nGET / HTTP/1.1\r\nHost: evil.test\r\n\r\n",
    b"GET / HTTP/1.1\r\nHost: allowed.test\r\nHost: evil.test\r\n\r\n",
    b"GET / HTTP/1.1\r\nHost: evil.test\r\n\r\n",
    b"GET http://evil.test/ HTTP/1.1\r\nHost: allowed.test\r\n\r\n",
    b"GET / HTTP/1.1\r\nX: a\r\n Host: evil.test\r\nHost: allowed.test\r\n\r\n",
    b"GET / HTTP/1.1\r\nHost : evil.test\r\nHost: allowed.test\r\n\r\n",
    b"GET / HTTP/1.1\r\nhOsT: allowed.test\r\n\r\n",
    b"\r\nGET / HTTP/1.1\r\nHost: allowed.test\r\n\r\n",
    b"POST / HTTP/1.1\r\nHost: allowed.test\r\nContent-Length: 38\r\n\r\n"
    b"GET / HTTP/1.1\r\nHost: evil.test\r\n\r\n\r\n",
    b"POST / HTTP/1.1\r\nHost: allowed.test\r\nTransfer-Encoding: chunked\r\n"
    b"Content-Length: 4\r\n\r\n0\r\n\r\nGET / HTTP/1.1\r\nHost: evil.test\r\n\r\n",
    b"GET / HTTP/1.1\nHost: allowed.test\n\nGET / HTTP/1.1\nHost: evil.test\n\n",
]


def test_checker_never_passes_an_http_request_a_server_routes_elsewhere() -> None:
    srv = HTTPServer(("127.0.0.1", 0), _Recorder)
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    try:
        for head in HEAD_CORPUS:
            try:
                hosts = hosts_of(head)
            except Refused:
                continue
            _Recorder.routed = []
            with socket.create_connection(srv.server_address, timeout=5) as s:
                s.sendall(head)
                s.shutdown(socket.SHUT_WR)
                while s.recv(4096):
                    pass
            assert set(_Recorder.routed) <= set(hosts), (head, hosts, _Recorder.routed)
    finally:
        srv.shutdown()
        srv.server_close()


def test_the_bytes_of_a_head_not_complete_are_counted_as_unjudged() -> None:
    """The checker holds them back until the head is complete (its Host judged)."""
    from linpodx.egress.inspect import HttpRequests

    http = HttpRequests()
    first = b"GET / HTTP/1.1\r\nHost: allowed.test\r\n\r\n"
    begun = b"GET / HTTP/1.1\r\nHost: evil.test\r\n"
    assert http.feed(first + begun) == ["allowed.test"]
    assert http.unjudged == len(begun)
    assert http.feed(b"X-A: 1\r\n") == [] and http.unjudged == len(begun) + 8
    assert http.feed(b"\r\n") == ["evil.test"] and http.unjudged == 0
