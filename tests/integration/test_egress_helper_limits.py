"""The network helper's own limits (issue 25, item 3), on real podman + nftables + slirp4netns
(and pasta): slirp4netns runs outside the container's cgroup and held ~270 kB and one file
descriptor per open connection, with the host's nofile limit; now it gets the profile's
`network.helper_max_files` (RLIMIT_NOFILE) and `network.helper_max_memory_mib` (RLIMIT_AS).

A flood from inside the container against a server on this host that holds every connection
open: the checker's own bound (`max_connections`) is set far above the helper's file limit, so
what stops the helper's descriptors from growing with the flood is the helper's limit alone.
"""

from __future__ import annotations

import dataclasses
import json
import resource
import socketserver
import subprocess
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from linpodx.egress import netns
from linpodx.egress import state as egress_state
from linpodx.egress.state import EgressState
from tests.integration.test_egress_live import (
    HOST,
    Servers,
    bring_up,
    create,
    sh,
    stored,
)
from tests.integration.test_egress_live import container as container
from tests.integration.test_egress_live import podman_home as podman_home
from tests.integration.test_egress_live import servers as servers

pytestmark = pytest.mark.podman

FILES = 64
"""The helper's file limit in the flood test (the profile's minimum)."""
FLOOD = 240
"""Connections the flood opens and holds (paced under the 100 per second bound)."""


class _Hold(socketserver.BaseRequestHandler):
    """Says hello, then holds the connection open until the client closes it."""

    def handle(self) -> None:
        try:
            self.request.sendall(b"held\n")
            while self.request.recv(4096):
                pass
        except OSError:
            pass


class _HoldServer(socketserver.ThreadingTCPServer):
    daemon_threads = True
    allow_reuse_address = True
    request_queue_size = 1024


@pytest.fixture(scope="module")
def holder() -> Iterator[int]:
    srv = _HoldServer((HOST, 0), _Hold)
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    yield srv.server_address[1]
    srv.shutdown()
    srv.server_close()


FLOOD_CLIENT = (
    "import socket, sys, time\n"
    "ip = socket.gethostbyname('allowed.test')\n"
    "port, n = int(sys.argv[1]), int(sys.argv[2])\n"
    "socks, ok = [], 0\n"
    "for _ in range(n):\n"
    "    try:\n"
    "        s = socket.create_connection((ip, port), timeout=5)\n"
    "        s.settimeout(3)\n"
    "        if s.recv(16) == b'held\\n':\n"
    "            ok += 1\n"
    "            socks.append(s)\n"
    "        else:\n"
    "            s.close()\n"
    "    except OSError:\n"
    "        pass\n"
    "    time.sleep(0.012)\n"
    "print('held', ok, flush=True)\n"
    "sys.stdin.readline()\n"
)


def _helper_pid(name: str) -> int:
    info = json.loads(EgressState(name).guard_file.read_text())
    helper = netns.Helper(info["helper"], None, None, int(info["helper_pid"]))
    if helper.kind == "pasta":  # rootful: the keeper's pid; pasta's is in its pid file
        pidfile = EgressState(name).pasta_pidfile
        if pidfile.exists():
            return int(pidfile.read_text().strip())
    return helper.pid


def _limits(pid: int) -> dict[str, str]:
    out = {}
    for line in Path(f"/proc/{pid}/limits").read_text().splitlines()[1:]:
        if line.startswith("Max open files"):
            out["files"] = line.split()[3]
        if line.startswith("Max address space"):
            out["memory"] = line.split()[3]
    return out


def _fds(pid: int) -> int:
    """How many descriptors `pid` has open, or, where its fd dir is closed to us (rootless
    pasta makes itself non-dumpable), the size of its descriptor table (`FDSize`: at least
    its highest descriptor + 1, so never below the count)."""
    try:
        return len(list(Path(f"/proc/{pid}/fd").iterdir()))
    except PermissionError:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("FDSize:"):
                return int(line.split()[1])
        raise


def _rss_kib(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    raise AssertionError(f"no VmRSS for {pid}")


def _up(servers: Servers, name: str, port: int, **network: int) -> int:
    st = stored(servers, ("allowed.test",))
    net = st.profile.network
    net = dataclasses.replace(
        net, egress_dns_allowlist=(*net.egress_dns_allowlist, f"allowed.test:{port}/tcp"),
        **network,
    )
    st = dataclasses.replace(st, profile=dataclasses.replace(st.profile, network=net))
    create(name, st)
    bring_up(name, st)
    assert egress_state.status(name) == "healthy"
    return _helper_pid(name)


def _flood(name: str, port: int, pid: int) -> tuple[int, int, int]:
    """(connections that got through and were held, most helper fds seen, helper RSS KiB)."""
    argv = ["podman", "exec", "-i", name, "python3", "-c", FLOOD_CLIENT, str(port), str(FLOOD)]
    p = subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    assert p.stdin is not None and p.stdout is not None
    most = 0
    done = threading.Event()

    def sample() -> None:
        nonlocal most
        while not done.is_set():
            try:
                most = max(most, _fds(pid))
            except OSError:
                pass
            time.sleep(0.05)

    t = threading.Thread(target=sample, daemon=True)
    t.start()
    try:
        line = p.stdout.readline().strip()
        most = max(most, _fds(pid))
        rss = _rss_kib(pid)
    finally:
        done.set()
        t.join()
        p.stdin.write("\n")
        p.stdin.close()
        p.wait(timeout=60)
    assert line.startswith("held "), line
    return int(line.split()[1]), most, rss


def _check_flood(servers: Servers, container: str, holder: int) -> None:
    pid = _up(servers, container, holder, helper_max_files=FILES, helper_max_memory_mib=512)
    assert _limits(pid) == {"files": str(FILES), "memory": str(512 << 20)}
    held, most, rss = _flood(container, holder, pid)
    # Bounded by the helper's limit (the checker allows 512 at once): its descriptors never
    # pass it, connections beyond it fail, those within it work, and the helper lives on.
    assert most <= FILES, (most, held)
    assert 20 <= held < FILES, (held, most)
    assert rss < 512 << 10, rss
    assert egress_state.status(container) == "healthy"
    # Once the flood let go, connections work again.
    again = sh(container, "python3 -c \"import socket; s=socket.create_connection(("
               f"socket.gethostbyname('allowed.test'), {holder}), timeout=5); "
               "print(s.recv(16))\"")  # fmt: skip
    assert "held" in again.stdout, again


def test_a_connection_flood_is_bounded_by_the_helper_s_own_limits(
    servers: Servers, container: str, holder: int
) -> None:
    _check_flood(servers, container, holder)


def test_pasta_is_bounded_too(
    servers: Servers, container: str, holder: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("LINPODX_EGRESS_HELPER", "pasta")
    _check_flood(servers, container, holder)


def test_the_defaults_are_applied(servers: Servers, container: str, holder: int) -> None:
    """A profile that says nothing gets the defaults, generous enough for a package install
    (the walk-through and the other egress tests run under them)."""
    pid = _up(servers, container, holder)
    want = {"files": str(netns.HELPER_MAX_FILES_DEFAULT),
            "memory": str(netns.HELPER_MAX_MEMORY_MIB_DEFAULT << 20)}  # fmt: skip
    assert _limits(pid) == want
    again = sh(container, "python3 -c \"import socket; s=socket.create_connection(("
               f"socket.gethostbyname('allowed.test'), {holder}), timeout=5); "
               "print(s.recv(16))\"")  # fmt: skip
    assert "held" in again.stdout, again


HELD = 480
"""Connections held in the checker's bound test (under its 512)."""


def test_the_checker_holds_its_own_bound_of_connections_and_dns_goes_on(
    servers: Servers, container: str, holder: int
) -> None:
    """The checker's bound (`max_connections`, 512) is what limits connections held open, not
    the guard's file descriptors: each held connection costs the guard six (both legs, a
    splice pipe each way), and a guard started from a login's shell had its soft nofile (1024),
    so past ~170 held connections the next one was closed without a record while `linpodx
    ps` said healthy (rootless, `podman unshare` raises the limit; rootful, nothing did).
    Held under the bound, they all work, and so does DNS. The guard starts under a login's
    usual soft limit (1024; this test runner's is higher)."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (min(soft, 1024), hard))
    try:
        _up(servers, container, holder)
    finally:
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))
    argv = ["podman", "exec", "-i", container, "python3", "-c", FLOOD_CLIENT, str(holder),
            str(HELD)]  # fmt: skip
    p = subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    assert p.stdin is not None and p.stdout is not None
    try:
        line = p.stdout.readline().strip()
        fresh = sh(container, "getent hosts other-name.allowed.test allowed.test")
        again = sh(container, "python3 -c \"import socket; s=socket.create_connection(("
                   f"socket.gethostbyname('allowed.test'), {holder}), timeout=5); "
                   "print(s.recv(16))\"")  # fmt: skip
        status = egress_state.status(container)
    finally:
        p.stdin.write("\n")
        p.stdin.close()
        p.wait(timeout=60)
    assert line == f"held {HELD}", line
    assert "allowed.test" in fresh.stdout, fresh
    assert "held" in again.stdout, again
    assert status == "healthy"
