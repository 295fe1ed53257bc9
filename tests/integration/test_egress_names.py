"""Egress bound to names and ports (issue 21), on real podman + nftables + slirp4netns.

One server address (this host's) serves two names, `allowed.test` and `evil.test` (HTTP
virtual hosts, and TLS with SNI and self-signed certificates made here with openssl), a raw
TCP port and a UDP port. Only some of `allowed.test`'s entries are on the allowlist, so each
test shows that an attacker inside the container, holding the shared address, gets nowhere
with another name, another port or another protocol, while the allowed path works.
"""

from __future__ import annotations

import contextlib
import json
import socket
import socketserver
import ssl
import subprocess
import threading
from collections.abc import Iterator
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest

from linpodx.egress import state as egress_state
from linpodx.egress.state import EgressState
from tests.conftest import run_linpodx
from tests.integration.test_egress_live import (
    HOST,
    Servers,
    admin_records,
    bring_up,
    create,
    sh,
    stored,
    wait_for,
)
from tests.integration.test_egress_live import container as container
from tests.integration.test_egress_live import podman_home as podman_home
from tests.integration.test_egress_live import servers as servers

pytestmark = pytest.mark.podman

BIG = 64 << 20
"""Bytes of the large download."""


class _Vhosts(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def do_GET(self) -> None:
        host = (self.headers.get("Host") or "").split(":")[0].lower()
        if self.path == "/big":
            self.send_response(200)
            self.send_header("Content-Length", str(BIG))
            self.end_headers()
            chunk = b"x" * (1 << 20)
            for _ in range(BIG >> 20):
                self.wfile.write(chunk)
            return
        if self.path == "/ws" and self.headers.get("Upgrade", "").lower() == "websocket":
            self.send_response(101)
            self.send_header("Upgrade", "websocket")
            self.send_header("Connection", "Upgrade")
            self.end_headers()
            self.wfile.flush()
            # Echo framed bytes raw (enough to show the switch happened).
            while data := self.connection.recv(4096):
                self.connection.sendall(b"ws:" + data)
            self.close_connection = True
            return
        body = f"content-of-{host}\n".encode()
        self.send_response(200)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args: Any) -> None:
        pass


class _Threaded(ThreadingHTTPServer):
    daemon_threads = True
    request_queue_size = 1024  # the bound test opens 100 at once (the default backlog is 5)


@dataclass
class Names:
    http_port: int
    tls_port: int
    tcp_port: int
    udp_port: int
    ca: Path


def _certs(tmp: Path) -> dict[str, tuple[Path, Path]]:
    out = {}
    for name in ("allowed.test", "evil.test", "a.wild.test"):
        key, crt = tmp / f"{name}.key", tmp / f"{name}.crt"
        subprocess.run(
            [
                "openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "2",
                "-subj", f"/CN={name}", "-addext", f"subjectAltName=DNS:{name}",
                "-keyout", str(key), "-out", str(crt),
            ],
            check=True, capture_output=True,
        )
        out[name] = (crt, key)
    return out


class _TcpBanner(socketserver.BaseRequestHandler):
    def handle(self) -> None:
        with contextlib.suppress(OSError):
            self.request.sendall(b"raw-tcp-banner\n")


class _TcpServer(socketserver.ThreadingTCPServer):
    daemon_threads = True
    allow_reuse_address = True


@pytest.fixture(scope="module")
def names(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Names]:
    tmp = tmp_path_factory.mktemp("certs")
    tmp.chmod(0o755)
    certs = _certs(tmp)
    ca = tmp / "ca.pem"
    ca.write_bytes(b"".join(c.read_bytes() for c, _ in certs.values()))
    ca.chmod(0o644)
    web = _Threaded((HOST, 0), _Vhosts)
    threading.Thread(target=web.serve_forever, daemon=True).start()

    contexts = {}
    for name, (crt, key) in certs.items():
        ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        ctx.load_cert_chain(crt, key)
        contexts[name] = ctx
    default = contexts["allowed.test"]

    def pick(sock: ssl.SSLSocket, name: str | None, _ctx: ssl.SSLContext) -> None:
        if name and name.lower() in contexts:
            sock.context = contexts[name.lower()]

    default.sni_callback = pick
    tls = _Threaded((HOST, 0), _Vhosts)
    tls.socket = default.wrap_socket(tls.socket, server_side=True)
    threading.Thread(target=tls.serve_forever, daemon=True).start()
    raw = _TcpServer((HOST, 0), _TcpBanner)
    threading.Thread(target=raw.serve_forever, daemon=True).start()
    udp = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    udp.bind((HOST, 0))
    yield Names(
        web.server_address[1], tls.server_address[1], raw.server_address[1],
        udp.getsockname()[1], ca,
    )
    for srv in (web, tls, raw):
        srv.shutdown()
    udp.close()


def _up(servers: Servers, container: str, names: Names, allow: tuple[str, ...]) -> None:
    st = stored(servers, allow)
    create(container, st, extra=["-v", f"{names.ca}:/ca.pem:ro"])
    bring_up(container, st)
    assert egress_state.status(container) == "healthy"


def curl(container: str, url: str, *flags: str) -> subprocess.CompletedProcess[str]:
    return sh(container, f"curl -sS -m 8 --cacert /ca.pem {' '.join(flags)} '{url}'")


def denied_events(container: str) -> list[str]:
    ev = run_linpodx("events", "--no-follow")
    return [ln for ln in ev.stdout.splitlines() if container in ln and "egress denied" in ln]


def test_http_host_of_another_name_is_refused_and_recorded(
    servers: Servers, container: str, names: Names
) -> None:
    p = names.http_port
    _up(servers, container, names, (f"allowed.test:{p}/http",))
    ok = curl(container, f"http://allowed.test:{p}/")
    assert ok.returncode == 0 and ok.stdout == "content-of-allowed.test\n", ok
    bad = curl(container, f"http://allowed.test:{p}/", "-H", "'Host: evil.test'")
    assert bad.returncode != 0 and "evil" not in bad.stdout, bad
    assert wait_for(lambda: any(
        f"egress denied: evil.test:{p} to {HOST} (host not in the allowlist; address resolved "
        "for allowed.test)" in ln for ln in denied_events(container)
    ))
    recs = [r for r in admin_records("egress.denied") if r["data"]["container"] == container]
    assert recs and recs[0]["data"]["target"] == f"evil.test:{p}"


def test_second_keep_alive_request_with_another_host_ends_the_connection(
    servers: Servers, container: str, names: Names
) -> None:
    p = names.http_port
    _up(servers, container, names, (f"allowed.test:{p}/http",))
    script = (
        f"exec 3<>/dev/tcp/allowed.test/{p}; "
        "printf 'GET / HTTP/1.1\\r\\nHost: allowed.test\\r\\n\\r\\n' >&3; sleep 0.5; "
        "printf 'GET / HTTP/1.1\\r\\nHost: evil.test\\r\\n\\r\\n' >&3; sleep 0.5; "
        "timeout 3 cat <&3"
    )
    out = sh(container, f"bash -c \"{script}\"")
    assert "content-of-allowed.test" in out.stdout, out
    assert "content-of-evil.test" not in out.stdout, out


def test_tls_server_name_checked(servers: Servers, container: str, names: Names) -> None:
    p = names.tls_port
    _up(servers, container, names, (f"allowed.test:{p}", f"*.wild.test:{p}"))
    ok = curl(container, f"https://allowed.test:{p}/")
    assert ok.returncode == 0 and ok.stdout == "content-of-allowed.test\n", ok
    assert curl(container, f"https://a.wild.test:{p}/").stdout == "content-of-a.wild.test\n"
    # SNI of another name, to the shared address the container already holds.
    bad = curl(container, f"https://evil.test:{p}/", "--resolve", f"evil.test:{p}:{HOST}")
    assert bad.returncode != 0 and "evil" not in bad.stdout, bad
    assert wait_for(lambda: any(
        f"egress denied: evil.test:{p} to {HOST} (server name not in the allowlist" in ln
        for ln in denied_events(container)
    ))
    # Upper case and a trailing dot are the same name (normalized), and pass.
    up = curl(container, f"https://ALLOWED.test.:{p}/", "-k")
    assert up.returncode == 0 and "content-of-allowed.test" in up.stdout, up
    # No SNI at all (an IP literal): refused.
    nosni = curl(container, f"https://{HOST}:{p}/", "-k")
    assert nosni.returncode != 0 and "content" not in nosni.stdout, nosni


def test_unlisted_port_and_raw_tcp(servers: Servers, container: str, names: Names) -> None:
    _up(servers, container, names, (f"allowed.test:{names.tls_port}",))
    assert sh(container, "getent hosts allowed.test").returncode == 0
    other = sh(container, f"timeout 5 bash -c 'cat </dev/tcp/allowed.test/{names.tcp_port}'")
    assert "raw-tcp-banner" not in other.stdout, other
    assert wait_for(lambda: any(
        f"port {names.tcp_port} is not in the allowlist" in ln for ln in denied_events(container)
    ))


def test_tcp_entry_is_address_bound(servers: Servers, container: str, names: Names) -> None:
    _up(servers, container, names, (f"allowed.test:{names.tcp_port}/tcp",))
    # Before a lookup, the address is not held: refused by the filter.
    cold = sh(container, f"timeout 5 bash -c 'cat </dev/tcp/{HOST}/{names.tcp_port}'")
    assert "raw-tcp-banner" not in cold.stdout
    out = sh(container, f"timeout 5 bash -c 'cat </dev/tcp/allowed.test/{names.tcp_port}'")
    assert "raw-tcp-banner" in out.stdout, out


def test_udp_only_dns_to_the_policy_resolver(
    servers: Servers, container: str, names: Names
) -> None:
    _up(servers, container, names, (f"allowed.test:{names.tls_port}",))
    assert sh(container, "getent hosts allowed.test").returncode == 0
    # QUIC: refused at once (the reject is generated inside the netns: the send itself
    # fails, EPERM, and an ICMP error is queued), never a silent drop that makes a client wait.
    for port in (443, names.udp_port):
        script = (
            "import socket,time\n"
            "s=socket.socket(socket.AF_INET,socket.SOCK_DGRAM); s.settimeout(3)\n"
            f"s.connect(('{HOST}',{port}))\n"
            "try:\n s.send(b'q'); s.recv(10); print('answer')\n"
            "except (PermissionError, ConnectionRefusedError): print('refused')\n"
            "except TimeoutError: print('timeout')\n"
        )
        out = sh(container, f"python3 -c \"{script}\"")
        assert out.stdout.strip() == "refused", out
    # DNS to a resolver on the allowed address: refused.
    rogue = sh(container, f"timeout 5 python3 -c \"import socket;s=socket.socket(2,2);"
               f"s.settimeout(2);s.sendto(b'x'*20,('{HOST}',{servers.rogue_dns_port}));"
               "print(s.recv(100))\"")
    assert rogue.returncode != 0, rogue


PROBE = r'''
import socket, ssl, sys, time
mode, host, port = sys.argv[1], sys.argv[2], int(sys.argv[3])

def hello(name):
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    ctx.check_hostname = False
    ctx.verify_mode = ssl.CERT_NONE
    inc, out = ssl.MemoryBIO(), ssl.MemoryBIO()
    obj = ctx.wrap_bio(inc, out, server_hostname=name)
    try:
        obj.do_handshake()
    except ssl.SSLWantReadError:
        pass
    return out.read()

def answer(s):
    s.settimeout(6)
    try:
        data = s.recv(5)
    except (ConnectionResetError, TimeoutError) as e:
        return type(e).__name__
    return "server-hello" if data[:1] == b"\x16" else "closed:" + repr(data)

good = hello("allowed.test")
s = socket.create_connection((host, port), timeout=5)
if mode == "whole":
    s.sendall(good)
elif mode == "late":  # the rest after the checker's bound
    s.sendall(good[:40]); time.sleep(4)
    try:
        s.sendall(good[40:])
    except OSError as e:
        print(type(e).__name__); sys.exit()
elif mode == "records":  # one ClientHello over two TLS records
    body = good[5:]
    a, b = body[:60], body[60:]
    s.sendall(good[:3] + len(a).to_bytes(2, "big") + a + good[:3] + len(b).to_bytes(2, "big") + b)
elif mode in ("nul", "long"):
    name = "allowed.tes\x00" if mode == "nul" else "a" * 70 + ".allowed"
    # A name ssl will send, of the same length (labels of at most 40).
    stand_in = ".".join("x" * len(part) for part in ("x" * 40 + "." + "x" * 37).split("."))
    stand_in = stand_in if len(name) > 40 else "x" * len(name)
    fake = hello(stand_in)
    s.sendall(fake.replace(stand_in.encode(), name.encode()))
print(answer(s))
'''


@pytest.fixture(scope="module")
def probe(tmp_path_factory: pytest.TempPathFactory) -> Path:
    d = tmp_path_factory.mktemp("probe")
    d.chmod(0o755)
    p = d / "probe.py"
    p.write_text(PROBE)
    p.chmod(0o644)
    return p


def test_client_hellos_the_checker_refuses(
    servers: Servers, container: str, names: Names, probe: Path
) -> None:
    p = names.tls_port
    st = stored(servers, (f"allowed.test:{p}",))
    create(container, st, extra=["-v", f"{probe}:/probe.py:ro"])
    bring_up(container, st)
    assert sh(container, "getent hosts allowed.test").returncode == 0

    def run(mode: str) -> str:
        return sh(container, f"python3 /probe.py {mode} allowed.test {p}").stdout.strip()

    assert run("whole") == "server-hello"  # the allowed path, same bytes in one piece
    for mode in ("late", "records", "nul", "long"):
        got = run(mode)
        assert got != "server-hello" and got.startswith(("ConnectionResetError", "closed")), (
            mode,
            got,
        )
    events = "\n".join(denied_events(container))
    assert "no complete ClientHello" in events
    assert "not exactly one TLS record" in events
    assert "byte no host name has" in events


def test_large_download_websocket_and_idle_reuse(
    servers: Servers, container: str, names: Names
) -> None:
    hp, tp = names.http_port, names.tls_port
    _up(servers, container, names, (f"allowed.test:{hp}/http", f"allowed.test:{tp}"))
    for url in (f"http://allowed.test:{hp}/big", f"https://allowed.test:{tp}/big"):
        got = curl(container, url, "-o", "/dev/null", "-w", "'%{size_download}'")
        assert got.returncode == 0 and got.stdout == str(BIG), (url, got)
    ws = (
        f"exec 3<>/dev/tcp/allowed.test/{hp}; "
        "printf 'GET /ws HTTP/1.1\\r\\nHost: allowed.test\\r\\nUpgrade: websocket\\r\\n"
        "Connection: Upgrade\\r\\n\\r\\n' >&3; sleep 0.5; printf 'frame-bytes' >&3; "
        "timeout 2 cat <&3"
    )
    out = sh(container, f'bash -c "{ws}"')
    assert " 101 " in out.stdout and "ws:frame-bytes" in out.stdout, out


def test_connection_idle_past_the_ttl_is_reused(
    servers: Servers, container: str, names: Names
) -> None:
    hp = names.http_port
    _up(servers, container, names, (f"allowed.test:{hp}/http",))
    script = (
        "import http.client,time\n"
        f"c=http.client.HTTPConnection('allowed.test',{hp},timeout=10)\n"
        "c.request('GET','/'); print(c.getresponse().read().decode().strip())\n"
        "time.sleep(35)\n"  # past the lease (MIN_TTL 30 s): the open connection keeps it
        "c.request('GET','/'); print(c.getresponse().read().decode().strip())\n"
    )
    out = sh(container, f'python3 -c "{script}"', timeout=90)
    assert out.stdout.split() == ["content-of-allowed.test"] * 2, out


def test_pasta_helper_checks_names_too(
    servers: Servers, container: str, names: Names, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The same checks with pasta instead of slirp4netns (root and rootless)."""
    monkeypatch.setenv("LINPODX_EGRESS_HELPER", "pasta")
    hp, tp = names.http_port, names.tls_port
    _up(servers, container, names, (f"allowed.test:{hp}/http", f"allowed.test:{tp}"))
    info = json.loads(EgressState(container).guard_file.read_text())
    assert info["helper"] == "pasta"
    assert curl(container, f"http://allowed.test:{hp}/").stdout == "content-of-allowed.test\n"
    assert curl(container, f"https://allowed.test:{tp}/").stdout == "content-of-allowed.test\n"
    bad = curl(container, f"http://allowed.test:{hp}/", "-H", "'Host: evil.test'")
    assert bad.returncode != 0 and "evil" not in bad.stdout, bad
    sni = curl(container, f"https://evil.test:{tp}/", "--resolve", f"evil.test:{tp}:{HOST}")
    assert sni.returncode != 0 and "evil" not in sni.stdout, sni
    got = curl(container, f"http://allowed.test:{hp}/big", "-o", "/dev/null", "-w",
               "'%{size_download}'")  # fmt: skip
    assert got.stdout == str(BIG), got


def test_new_connections_per_second_are_bounded_and_recorded(
    servers: Servers, container: str, names: Names
) -> None:
    hp = names.http_port
    _up(servers, container, names, (f"allowed.test:{hp}/http",))
    script = (
        "import socket\n"
        "ip=socket.gethostbyname('allowed.test')\n"
        "req=b'GET / HTTP/1.1\\\\r\\\\nHost: allowed.test\\\\r\\\\n\\\\r\\\\n'\n"
        "ok=0\n"
        "socks=[]\n"
        "for _ in range(300):\n"  # a burst: connected and sent at once, read afterwards
        " try:\n"
        f"  s=socket.create_connection((ip,{hp}),timeout=5); socks.append(s); s.sendall(req)\n"
        " except OSError: pass\n"
        "for s in socks:\n"
        " got=b''\n"
        " try:\n"  # the answer may come in pieces (headers, then the body) on a busy host
        "  while b'content-of' not in got:\n"
        "   piece=s.recv(4096)\n"
        "   if not piece: break\n"
        "   got+=piece\n"
        " except OSError: pass\n"
        " ok+=b'content-of' in got\n"
        "print(ok)\n"
    )
    out = sh(container, f'python3 -c "{script}"', timeout=150)
    served = int(out.stdout.strip() or -1)
    assert 100 <= served < 300, out  # a burst of 100, then 100 per second
    assert wait_for(lambda: any(
        "more than 100 new connections per second" in ln for ln in denied_events(container)
    )), (out.stdout, denied_events(container), EgressState(container).guard_log.read_text()[-2000:])


def test_the_profile_s_connection_bound_is_the_one_enforced(
    servers: Servers, container: str, names: Names
) -> None:
    """`network.max_connections` from the profile reaches the checker (not only its default)."""
    import dataclasses

    hp = names.http_port
    st = stored(servers, (f"allowed.test:{hp}/http",))
    net = dataclasses.replace(st.profile.network, max_connections=5)
    st = dataclasses.replace(st, profile=dataclasses.replace(st.profile, network=net))
    create(container, st, extra=["-v", f"{names.ca}:/ca.pem:ro"])
    bring_up(container, st)
    script = (
        "import socket\n"
        "ip=socket.gethostbyname('allowed.test')\n"
        "req=b'GET /big HTTP/1.1\\\\r\\\\nHost: allowed.test\\\\r\\\\n\\\\r\\\\n'\n"
        "held=[]\n"
        # Each download is left unread after its first bytes, so the server blocks and the
        # connection stays open through the checker; one after another.
        "for _ in range(8):\n"
        " try:\n"
        f"  s=socket.create_connection((ip,{hp}),timeout=5); s.sendall(req)\n"
        "  if s.recv(4096).startswith(b'HTTP/1'): held.append(s)\n"
        " except OSError: pass\n"
        "print(len(held))\n"
    )
    out = sh(container, f'python3 -c "{script}"', timeout=120)
    assert out.stdout.strip() == "5", out
    assert wait_for(lambda: any(
        "more than 5 connections open" in ln for ln in denied_events(container)
    )), denied_events(container)
