"""The connection checker attacked from inside the container (issue 21's name-bound egress):
what an agent could try to get around it without going through it. Real podman, nftables and
the guard; local servers only (the two-name server of test_egress_names)."""

from __future__ import annotations

import contextlib
import json
import socket
import ssl
import subprocess
import threading
from collections.abc import Iterator
from dataclasses import dataclass

import pytest

from linpodx.egress.state import EgressState
from tests.integration.test_egress_live import HOST, Servers, sh
from tests.integration.test_egress_live import container as container
from tests.integration.test_egress_live import podman_home as podman_home
from tests.integration.test_egress_live import servers as servers
from tests.integration.test_egress_names import Names, _up, denied_events, wait_for
from tests.integration.test_egress_names import names as names

pytestmark = pytest.mark.podman

AROUND = r'''
import socket, sys
host, port, what = sys.argv[1], int(sys.argv[2]), sys.argv[3]
req = b"GET / HTTP/1.1\r\nHost: evil.test\r\nConnection: close\r\n\r\n"
def fetch(s):
    s.settimeout(5)
    s.sendall(req)
    out = b""
    try:
        while chunk := s.recv(4096):
            out += chunk
    except OSError as e:
        return "error:" + type(e).__name__ + ":" + out.decode(errors="replace")
    return out.decode(errors="replace")
try:
    if what == "mark":
        s = socket.socket()
        s.setsockopt(socket.SOL_SOCKET, 36, 0x6C70)  # SO_MARK, the checker's own mark
        s.connect((host, port))
    elif what == "checker":  # the checker's socket itself, from inside
        s = socket.create_connection((host, 15001), timeout=5)
    print(fetch(s))
except OSError as e:
    print("error:" + type(e).__name__)
'''


def _around(container: str, host: str, port: int, what: str) -> str:
    script = AROUND.replace("'", "'\"'\"'")
    return sh(container, f"python3 -c '{script}' {host} {port} {what}").stdout.strip()


def test_agent_cannot_take_the_checkers_mark_or_reach_its_socket(
    servers: Servers, container: str, names: Names
) -> None:
    p = names.http_port
    _up(servers, container, names, (f"allowed.test:{p}/http",))
    assert sh(container, "getent hosts allowed.test").returncode == 0
    # SO_MARK needs CAP_NET_ADMIN over the netns (its user namespace's, rootless): dropped.
    marked = _around(container, HOST, p, "mark")
    assert marked == "error:PermissionError", marked
    # The checker's own socket, straight from inside (no redirect, so no original
    # destination but itself): refused and recorded, evil never served.
    for addr in ("127.0.0.1", "::1", "127.0.0.2"):
        got = _around(container, addr, p, "checker")
        assert "content-of-evil" not in got and got.startswith("error:"), (addr, got)
    assert wait_for(lambda: any(
        "the checker's own socket" in ln for ln in denied_events(container)
    ))
    # The allowed path still works afterwards.
    ok = sh(container, f"curl -sS -m 8 http://allowed.test:{p}/")
    assert ok.stdout == "content-of-allowed.test\n", ok


@dataclass
class Retry:
    port: int
    seen: list[str | None]
    """The server names the server's SNI callback saw (what it routed by), in order."""


@pytest.fixture(scope="module")
def retry_server(names: Names, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Retry]:
    """A TLS server on this host that knows only P-256: an OpenSSL client's first key share
    is X25519, so every handshake goes through a HelloRetryRequest and a second ClientHello."""
    tmp = tmp_path_factory.mktemp("retry")
    key, crt = tmp / "k.pem", tmp / "c.pem"
    subprocess.run(
        ["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1",
         "-subj", "/CN=allowed.test", "-addext", "subjectAltName=DNS:allowed.test",
         "-keyout", str(key), "-out", str(crt)],
        check=True, capture_output=True,
    )  # fmt: skip
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    ctx.load_cert_chain(crt, key)
    ctx.set_ecdh_curve("prime256v1")
    seen: list[str | None] = []
    ctx.sni_callback = lambda _s, name, _c: seen.append(name)  # type: ignore[assignment,func-returns-value]
    lsock = socket.create_server((HOST, 0))
    stop = threading.Event()

    def serve() -> None:
        lsock.settimeout(0.5)
        while not stop.is_set():
            try:
                raw, _ = lsock.accept()
            except TimeoutError:
                continue
            except OSError:
                return  # closed at the end of the module
            threading.Thread(target=one, args=(raw,), daemon=True).start()

    def one(raw: socket.socket) -> None:
        with contextlib.suppress(OSError), ctx.wrap_socket(raw, server_side=True) as tls:
            tls.settimeout(10)
            tls.recv(100)
            tls.sendall(b"served")

    threading.Thread(target=serve, daemon=True).start()
    yield Retry(lsock.getsockname()[1], seen)
    stop.set()
    lsock.close()


SECOND_HELLO = r'''
import socket, ssl, sys
port, forge = int(sys.argv[1]), sys.argv[2] == "forge"
ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
ctx.check_hostname = False
ctx.verify_mode = ssl.CERT_NONE
inc, out = ssl.MemoryBIO(), ssl.MemoryBIO()
obj = ctx.wrap_bio(inc, out, server_hostname="allowed.test")
s = socket.create_connection(("allowed.test", port), timeout=5)
def step():
    try:
        obj.do_handshake()
        return True
    except ssl.SSLWantReadError:
        return False
try:
    step()
    s.sendall(out.read())
    while True:
        data = s.recv(65536)
        if not data:
            print("closed"); break
        inc.write(data)
        done = step()
        sent = out.read()
        if forge and b"allowed.test" in sent:  # the second ClientHello, another name
            sent = sent.replace(b"allowed.test", b"evilxxx.test")
        s.sendall(sent)
        if done:
            obj.write(b"hi"); s.sendall(out.read())
            while True:  # session tickets may come first
                inc.write(s.recv(65536))
                try:
                    print(obj.read(100).decode()); break
                except ssl.SSLWantReadError:
                    continue
            break
except (OSError, ssl.SSLError) as e:
    print("error:" + type(e).__name__)
'''


@pytest.mark.parametrize("helper", ["slirp4netns", "pasta"])
def test_a_second_client_hello_naming_another_server_is_refused(
    servers: Servers,
    container: str,
    names: Names,
    retry_server: Retry,
    helper: str,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("LINPODX_EGRESS_HELPER", helper)
    p = retry_server.port
    _up(servers, container, names, (f"allowed.test:{p}",))
    info = json.loads(EgressState(container).guard_file.read_text())
    assert info["helper"] == helper
    script = SECOND_HELLO.replace("'", "'\"'\"'")
    # The allowed path through a HelloRetryRequest works (its second ClientHello is checked
    # and passes).
    ok = sh(container, f"python3 -c '{script}' {p} honest").stdout.strip()
    assert ok == "served", ok
    assert retry_server.seen[-2:] == ["allowed.test", "allowed.test"]
    retry_server.seen.clear()
    # The first ClientHello names allowed.test (what the checker judged), the second one, in
    # the clear after the server's HelloRetryRequest, names another server: OpenSSL's SNI
    # callback routes by the second one. Refused before the server sees it.
    forged = sh(container, f"python3 -c '{script}' {p} forge").stdout.strip()
    assert forged.startswith(("error:", "closed")), forged
    assert "evilxxx.test" not in retry_server.seen, retry_server.seen
    assert wait_for(lambda: any(
        f"egress denied: evilxxx.test:{p} to {HOST} (second ClientHello" in ln
        for ln in denied_events(container)
    ))


UNENDED = r'''
import socket, sys, time
port, how = int(sys.argv[1]), sys.argv[2]
s = socket.create_connection(("allowed.test", port), timeout=5)
first = b"GET / HTTP/1.1\r\nHost: allowed.test\r\n\r\n"
evil = b"GET / HTTP/1.1\r\nHost: evil.test\r\n"  # no empty line: the head never ends
if how == "later":
    s.sendall(first)
    time.sleep(0.5)
    s.sendall(evil)
else:  # with the first request, in the same bytes
    s.sendall(first + evil)
time.sleep(0.3)
s.shutdown(socket.SHUT_WR)
out = b""
try:
    while chunk := s.recv(4096):
        out += chunk
except OSError as e:
    out += ("error:" + type(e).__name__).encode()
print(out.decode(errors="replace"))
'''


@pytest.mark.parametrize("how", ["later", "together"])
def test_a_request_head_never_ended_goes_nowhere_before_its_host_is_judged(
    servers: Servers, container: str, names: Names, how: str
) -> None:
    """The bytes of a head not yet complete went on at once (its Host not judged yet); the
    client then half-closed, and a server that takes end of input as the end of the head
    (Python's http.server does) served the request for evil.test."""
    p = names.http_port
    _up(servers, container, names, (f"allowed.test:{p}/http",))
    script = UNENDED.replace("'", "'\"'\"'")
    out = sh(container, f"python3 -c '{script}' {p} {how}").stdout
    assert "content-of-allowed.test" in out, out
    assert "content-of-evil.test" not in out, out


BOUND = r'''
import os, socket, sys
host, port = sys.argv[1], int(sys.argv[2])
uplink = next(i for i in os.listdir("/sys/class/net") if i != "lo")  # tap0 (slirp4netns), pasta's
s = socket.socket()
s.setsockopt(socket.SOL_SOCKET, socket.SO_BINDTODEVICE, uplink.encode())  # needs no capability
s.settimeout(1.5)
try:
    s.connect((host, port))
    print("connected")
except OSError as e:
    print("error:" + type(e).__name__)
'''


def test_a_socket_bound_to_the_uplink_does_not_take_the_redirect_out(
    servers: Servers, container: str, names: Names
) -> None:
    """A socket bound to the uplink (SO_BINDTODEVICE needs no capability since Linux 5.7)
    keeps its redirected SYN on the uplink: it went out to 127.0.0.1:15001 (the filter let
    every redirected packet out, on any interface), and the network helper connected to the
    *host's* loopback on that port, past --disable-host-loopback (pasta did the same: the
    fix is in the filter, whatever the helper). Now dropped at postrouting; the client times
    out, the host's port sees nothing."""
    try:
        lsock = socket.create_server(("127.0.0.1", 15001))  # the host's loopback
    except OSError as exc:
        pytest.fail(f"this test needs the host's 127.0.0.1:15001 free: {exc}")
    lsock.settimeout(0.2)
    reached: list[object] = []
    stop = threading.Event()

    def watch() -> None:
        while not stop.is_set():
            with contextlib.suppress(TimeoutError):
                conn, peer = lsock.accept()
                reached.append(peer)
                conn.close()

    watcher = threading.Thread(target=watch, daemon=True)
    watcher.start()
    try:
        p = names.http_port
        _up(servers, container, names, (f"allowed.test:{p}/http",))
        assert sh(container, "getent hosts allowed.test").returncode == 0
        script = BOUND.replace("'", "'\"'\"'")
        got = sh(container, f"python3 -c '{script}' {HOST} {p}").stdout.strip()
        assert got.startswith("error:"), got
        ok = sh(container, f"curl -sS -m 8 http://allowed.test:{p}/")
        assert ok.stdout == "content-of-allowed.test\n", ok
    finally:
        stop.set()
        watcher.join()
        lsock.close()
    assert reached == [], f"the host's 127.0.0.1:15001 was reached from the container: {reached}"


REBOUND = r'''
import os, socket, sys
port = int(sys.argv[1])
uplink = next(i for i in os.listdir("/sys/class/net") if i != "lo")
me = os.popen("ip -o -4 addr show dev " + uplink).read().split()[3].split("/")[0]
# A flow to the agent's own listener on 127.0.0.1:PORT, from the uplink's address, over lo;
# its answer makes it an established flow.
own = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
own.bind(("127.0.0.1", port))
own.settimeout(3)
c = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
c.bind((me, 0))
c.connect(("127.0.0.1", port))
c.send(b"local")
_, peer = own.recvfrom(100)
own.sendto(b"answer", peer)
c.settimeout(3)
assert c.recv(100) == b"answer"
# The same flow, its socket now bound to the uplink: the route for 127.0.0.1 is then the
# default one, out to the network helper.
c.setsockopt(socket.SOL_SOCKET, socket.SO_BINDTODEVICE, uplink.encode())
for i in range(3):
    try:
        c.send(b"exfil-%d" % i)
    except OSError as e:
        print("error:" + type(e).__name__)
print("sent")
'''


def test_a_flow_established_over_lo_does_not_leave_by_the_uplink(
    servers: Servers, container: str, names: Names
) -> None:
    """An established flow was accepted on any interface: the agent answered its own UDP flow
    to 127.0.0.1:PORT over lo, bound the socket to the uplink, and its next datagrams went out
    to the network helper, which sent them to the *host's* 127.0.0.1:PORT (any port the agent
    can listen on; through the policy resolver's answer, 127.0.0.1:53: a DNS query to a
    resolver on the host's loopback, past the policy resolver)."""
    host = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    host.bind(("127.0.0.1", 0))  # the host's loopback; the container listens on the same port
    port = host.getsockname()[1]
    try:
        _up(servers, container, names, (f"allowed.test:{names.http_port}/http",))
        script = REBOUND.replace("'", "'\"'\"'")
        out = sh(container, f"python3 -c '{script}' {port}")
        assert out.stdout.strip().endswith("sent"), out
        host.settimeout(1.0)
        got = []
        with contextlib.suppress(TimeoutError):
            while True:
                got.append(host.recv(100))
    finally:
        host.close()
    assert got == [], f"the host's 127.0.0.1:{port} got datagrams from the container: {got}"
    ok = sh(container, f"curl -sS -m 8 http://allowed.test:{names.http_port}/")
    assert ok.stdout == "content-of-allowed.test\n", ok
