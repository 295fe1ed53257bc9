"""The connection checker attacked from inside the container (issue 21's name-bound egress):
what an agent could try to get around it without going through it. Real podman, nftables and
the guard; local servers only (the two-name server of test_egress_names)."""

from __future__ import annotations

import pytest

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
