"""Egress filtering on real podman, real nftables, real slirp4netns (root and rootless).

Every server is on this machine: a DNS upstream on 127.0.0.1 (the guard runs on the host side
and asks it directly), an HTTP server on this host's own address, a "rogue" DNS server and a
server on the host's loopback. The container reaches this host only through slirp4netns.

Each escape test checks the escape fails AND the allowed path works. Where one address serves
both (this host has one), the escape is tried first: once an allowed name resolved to the
host's address, that address is (by design) reachable.

Until `linpodx run` with a stored profile is wired up end to end, containers are made here with
the same essentials linpodx uses (`--network none`, all caps dropped, no-new-privileges,
resolv.conf bind-mounted), then `podman init` -> guard.attach -> `podman start`.
"""

from __future__ import annotations

import contextlib
import json
import os
import pwd
import queue
import shutil
import signal
import socketserver
import subprocess
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import dns.message
import dns.query
import dns.rcode
import dns.rdatatype
import dns.rrset
import pytest

from linpodx.egress import guard
from linpodx.egress import state as egress_state
from linpodx.egress.state import EgressState
from linpodx.errors import EngineError
from linpodx.fastpath import plan as runplan
from linpodx.profile.model import Network, Profile
from tests.conftest import DEBIAN_IMAGE, ROOTLESS, linpodx_argv, run_linpodx
from tests.servers.dns_upstream import DnsUpstream

pytestmark = pytest.mark.podman

BODY = b"hello-from-linpodx-test-server"


def host_ipv4() -> str:
    out = subprocess.run(["hostname", "-I"], capture_output=True, text=True, check=True).stdout
    for tok in out.split():
        if ":" not in tok and not tok.startswith("127."):
            return tok
    raise RuntimeError("this host has no non-loopback IPv4 address")


HOST = host_ipv4()


@pytest.fixture(autouse=True)
def podman_home(monkeypatch: pytest.MonkeyPatch) -> None:
    """Rootless podman keeps its image store and config under the real HOME; linpodx's own
    state stays isolated through XDG_STATE_HOME (set by the autouse `isolated_state`)."""
    if ROOTLESS:
        monkeypatch.setenv("HOME", pwd.getpwuid(os.getuid()).pw_dir)
        monkeypatch.delenv("XDG_CONFIG_HOME", raising=False)


# --- servers on this machine ------------------------------------------------------------------
class Upstream(DnsUpstream):
    """A tiny authoritative DNS server for the test names, recording what it was asked."""

    def __init__(self, host: str = "127.0.0.1") -> None:
        self.zone: dict[tuple[str, str], list[tuple[str, str, str]]] = {}
        for n in ("allowed.test", "second.test", "a.wild.test", "target.cdn.test"):
            self.zone[(n, "A")] = [(n, "A", HOST)]
        self.zone[("alias.test", "A")] = [
            ("alias.test", "CNAME", "target.cdn.test."),
            ("target.cdn.test", "A", HOST),
        ]
        self.zone[("loop.test", "A")] = [("loop.test", "A", "127.0.0.1")]
        self.zone[("meta.test", "A")] = [("meta.test", "A", "169.254.169.254")]
        self.zone[("allowed.test", "TXT")] = [("allowed.test", "TXT", '"top-secret"')]
        self.zone[("denied.test", "A")] = [("denied.test", "A", HOST)]
        super().__init__(self._records, host)

    def _records(self, name: str, rtype: str) -> list[tuple[str, str, str]] | None:
        recs = self.zone.get((name, rtype))
        if recs is None and not any(k[0] == name for k in self.zone):
            return None  # NXDOMAIN; a known name without this type is NODATA
        return recs or []


class _Handler(BaseHTTPRequestHandler):
    def do_GET(self) -> None:
        self.send_response(200)
        self.send_header("Content-Length", str(len(BODY)))
        self.end_headers()
        self.wfile.write(BODY)

    def log_message(self, *args: Any) -> None:
        pass


def _http(addr: str) -> ThreadingHTTPServer:
    srv = ThreadingHTTPServer((addr, 0), _Handler)
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    return srv


class _Echo(socketserver.BaseRequestHandler):
    """Sends back what it gets, for as long as the connection lasts (a long-lived flow)."""

    def handle(self) -> None:
        with contextlib.suppress(OSError):
            while data := self.request.recv(4096):
                self.request.sendall(data)


class _EchoServer(socketserver.ThreadingTCPServer):
    daemon_threads = True
    allow_reuse_address = True


@dataclass
class Servers:
    upstream: Upstream
    http_port: int
    loopback_port: int
    rogue_dns_port: int
    echo_port: int


@pytest.fixture(scope="module")
def servers() -> Iterator[Servers]:
    up = Upstream()
    web = _http(HOST)
    loop = _http("127.0.0.1")
    # A second resolver the agent might try: the upstream's zone, on this host's address.
    rogue = Upstream(HOST)
    echo = _EchoServer((HOST, 0), _Echo)
    threading.Thread(target=echo.serve_forever, daemon=True).start()
    yield Servers(
        up, web.server_address[1], loop.server_address[1], rogue.port, echo.server_address[1]
    )
    web.shutdown()
    loop.shutdown()
    echo.shutdown()
    echo.server_close()


# --- containers -------------------------------------------------------------------------------
@dataclass(frozen=True)
class Stored:
    """The fields of a stored profile the guard reads (same shape as store.StoredProfile)."""

    profile: Profile
    name: str
    profile_id: str
    revision: int
    audit_hash: str = "0" * 64


def stored(
    servers: Servers,
    allow: tuple[str, ...],
    *,
    private: bool = True,
    rev: int = 1,
    name: str = "egress-test",
) -> Stored:
    # Connections are bound to names and ports: each name is allowed on the test's HTTP
    # server (plain HTTP) and its echo server (raw TCP), the ports these tests use.
    entries = tuple(
        e
        for n in allow
        for e in (n, f"{n}:{servers.http_port}/http", f"{n}:{servers.echo_port}/tcp")
    )
    net = Network(
        egress_dns_allowlist=entries,
        upstream_dns=(f"127.0.0.1:{servers.upstream.port}",),
        allow_private_answers=private,
    )
    return Stored(Profile(name=name, network=net), name, f"prof_TEST{name}", rev)


def podman(*args: str, check: bool = True, timeout: float = 60) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        ["podman", *args], capture_output=True, text=True, check=check, timeout=timeout
    )


def pid_of(name: str) -> int:
    return int(podman("inspect", "--format", "{{.State.Pid}}", name).stdout.strip())


NFT_IN_CONTAINER = "/opt/nft/ld.so --library-path /opt/nft /opt/nft/nft"
"""The host's nft inside the container, run by the host's own dynamic loader with the host's
libraries (libc included): it then runs in an image whose libc is older than the host's (the
Debian 12 image on a Debian 13 host, as in the podman5 phase)."""


def nft_mounts() -> list[str]:
    """Host nft + its loader and every library it links, so the test can try `nft` inside."""
    out = []
    nft = shutil.which("nft") or "/usr/sbin/nft"
    out += ["-v", f"{os.path.realpath(nft)}:/opt/nft/nft:ro"]
    ldd = subprocess.run(["ldd", nft], capture_output=True, text=True, check=True).stdout
    for line in ldd.splitlines():
        parts = line.split()
        if len(parts) >= 3 and parts[1] == "=>" and parts[2].startswith("/"):
            out += ["-v", f"{os.path.realpath(parts[2])}:/opt/nft/{parts[0]}:ro"]
        elif parts and parts[0].startswith("/") and "ld-linux" in parts[0]:
            out += ["-v", f"{os.path.realpath(parts[0])}:/opt/nft/ld.so:ro"]
    assert any(m.endswith(":/opt/nft/ld.so:ro") for m in out), ldd
    return out


def create(name: str, st: Stored, *, extra: list[str] | None = None) -> None:
    resolv = guard.prepare(name, st)
    podman(
        "create",
        "--name",
        name,
        "--network",
        "none",
        "--cap-drop",
        "all",
        "--security-opt",
        "no-new-privileges",
        "--pids-limit",
        "256",
        "-v",
        f"{resolv}:/etc/resolv.conf:ro",
        *(extra or []),
        DEBIAN_IMAGE,
        "sleep",
        "600",
    )


def init(name: str) -> int:
    """`podman init` and the container's PID.

    podman 4.3 race: right after a `podman stop`, the exit cleanup of the previous run can
    land after a new `podman init` and tear the fresh init process down (state back to
    `created`). Seen here about one time in six; `init` again then works.
    """
    for _ in range(5):
        podman("init", name)
        pid = pid_of(name)
        time.sleep(0.3)
        state = podman("inspect", "--format", "{{.State.Status}}", name).stdout.strip()
        if pid and state == "initialized" and Path(f"/proc/{pid}").exists():
            return pid
    raise AssertionError(f"podman init of {name} did not stick")


def bring_up(name: str, st: Stored) -> int:
    pid = init(name)
    guard.attach(name, pid, st)
    podman("start", name)
    return pid


@pytest.fixture
def container(unique_name: str) -> Iterator[str]:
    yield unique_name
    podman("rm", "-f", "-t", "0", unique_name, check=False)
    guard.detach(unique_name)


def sh(name: str, script: str, timeout: float = 60) -> subprocess.CompletedProcess[str]:
    return podman("exec", name, "sh", "-c", script, check=False, timeout=timeout)


def resolves(name: str, host: str) -> subprocess.CompletedProcess[str]:
    return sh(name, f"getent ahostsv4 {host}")


def curl(name: str, url: str, *flags: str) -> subprocess.CompletedProcess[str]:
    return sh(name, f"curl -sS -m 5 {' '.join(flags)} {url}")


def links(name: str) -> list[str]:
    """Interface names in the container (lo, plus the helper's tap0/eth0 when attached)."""
    out = sh(name, "ip -o link show").stdout
    return [line.split(":")[1].strip().split("@")[0] for line in out.splitlines() if ":" in line]


def uplink(name: str) -> str:
    others = [i for i in links(name) if i != "lo"]
    assert len(others) == 1, others
    return others[0]


def nft_list(pid: int) -> str:
    """The ruleset in the container's netns, read from outside (as the guard would)."""
    nsenter = ["nsenter", f"--net=/proc/{pid}/ns/net", shutil.which("nft") or "/usr/sbin/nft"]
    argv = ["podman", "unshare", *nsenter] if ROOTLESS else nsenter
    res = subprocess.run([*argv, "list", "ruleset"], capture_output=True, text=True, check=True)
    return res.stdout


def reject_count(pid: int) -> int:
    total = 0
    for line in nft_list(pid).splitlines():
        if "reject" in line and "counter packets" in line:
            total += int(line.split("counter packets", 1)[1].split()[0])
    return total


def admin_records(kind: str) -> list[dict[str, Any]]:
    from linpodx.paths import audit_dir

    out = []
    for p in audit_dir().glob("*.jsonl"):
        for line in p.read_text().splitlines():
            rec = json.loads(line)
            if rec.get("type") == kind:
                out.append(rec)
    return out


def wait_for(pred: Any, timeout: float = 10.0) -> bool:
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        if pred():
            return True
        time.sleep(0.1)
    return bool(pred())


# --- the tests -----------------------------------------------------------------------------------
def test_allowed_name_works_other_name_denied_at_once_and_recorded(
    servers: Servers, container: str
) -> None:
    st = stored(servers, ("allowed.test", "*.wild.test", "alias.test"))
    create(container, st)
    bring_up(container, st)
    assert egress_state.status(container) == "healthy"

    ok = resolves(container, "allowed.test")
    assert ok.returncode == 0 and HOST in ok.stdout
    web = curl(container, f"http://allowed.test:{servers.http_port}/")
    assert web.returncode == 0 and web.stdout == BODY.decode()
    assert resolves(container, "a.wild.test").returncode == 0
    # CNAME chain of an allowed name followed; its target alone is not allowed.
    assert HOST in resolves(container, "alias.test").stdout
    assert resolves(container, "target.cdn.test").returncode != 0
    # wildcard: not the apex
    assert resolves(container, "wild.test").returncode != 0

    denied = sh(container, "getent hosts denied.test; echo rc=$?", timeout=20)
    assert "rc=2" in denied.stdout  # NXDOMAIN: "not found" at once, no timeout/retry
    assert ("denied.test", "A") not in servers.upstream.asked

    ev = run_linpodx("events", "--no-follow")
    assert ev.returncode == 0, ev.stderr
    assert "dns lookup denied for denied.test" in ev.stdout
    recs = [r for r in admin_records("dns.denied") if r["data"].get("name") == "denied.test"]
    assert recs and recs[0]["data"]["container"] == container


def test_ip_literal_blocked_even_once_an_allowed_name_resolves_to_it(
    servers: Servers, container: str
) -> None:
    st = stored(servers, ("allowed.test",))
    create(container, st)
    pid = bring_up(container, st)
    before = reject_count(pid)
    blocked = curl(container, f"http://{HOST}:{servers.http_port}/")
    assert blocked.returncode != 0 and BODY.decode() not in blocked.stdout
    assert reject_count(pid) > before  # rejected inside the container's netns
    assert resolves(container, "allowed.test").returncode == 0
    # The address is held now, but a connection must still say which name it is for: an IP
    # literal as Host is no allowed name (the checker refuses it), the name works.
    assert curl(container, f"http://{HOST}:{servers.http_port}/").returncode != 0
    assert curl(container, f"http://allowed.test:{servers.http_port}/").stdout == BODY.decode()


def test_other_resolvers_are_unreachable(servers: Servers, container: str) -> None:
    # The rogue resolver answers from the host itself:
    q = dns.message.make_query("denied.test", "A")
    assert dns.query.udp(q, HOST, port=servers.rogue_dns_port, timeout=3).answer
    st = stored(servers, ("allowed.test",))
    create(container, st)
    bring_up(container, st)
    for target in (
        f"@{HOST} -p {servers.rogue_dns_port}",
        f"@{HOST} -p {servers.rogue_dns_port} +tcp",
        "@10.0.2.3",  # slirp4netns' own forwarder (disabled and filtered)
        "@10.0.2.3 +tcp",
        f"@{HOST}",
        f"@{HOST} -p 853 +tcp",  # DoT port
    ):
        res = sh(container, f"dig +tries=1 +time=2 {target} denied.test A", timeout=30)
        assert "ANSWER SECTION" not in res.stdout, target
        assert "status: NOERROR" not in res.stdout, target
    dot = sh(container, f"nc -z -w 3 {HOST} 853; echo rc=$?")
    assert "rc=0" not in dot.stdout
    # Our resolver (the container's only one) still answers allowed names.
    ok = sh(container, "dig +short allowed.test A")
    assert ok.stdout.strip() == HOST


def test_ipv6_and_icmp_blocked(servers: Servers, container: str) -> None:
    st = stored(servers, ("allowed.test",))
    create(container, st)
    pid = bring_up(container, st)
    v6 = sh(
        container,
        f"curl -sS -m 3 -g 'http://[::ffff:{HOST}]:{servers.http_port}/'; "
        f"curl -sS -m 3 -6 -g 'http://[fd00::2]:{servers.http_port}/'",
    )
    assert BODY.decode() not in v6.stdout
    icmp = sh(
        container,
        "python3 - <<'EOF'\n"
        "import socket\n"
        "try:\n"
        "    s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM, socket.IPPROTO_ICMP)\n"
        "    s.settimeout(2)\n"
        f"    s.sendto(b'\\x08\\x00\\x00\\x00\\x00\\x01\\x00\\x01', ('{HOST}', 0))\n"
        "    print('reply', s.recv(64))\n"
        "except OSError as e:\n"
        "    print('blocked', e)\n"
        "EOF",
    )
    assert "blocked" in icmp.stdout and "reply" not in icmp.stdout
    # The allowed path works, over IPv4.
    assert resolves(container, "allowed.test").returncode == 0
    assert curl(container, f"http://allowed.test:{servers.http_port}/").stdout == BODY.decode()
    # No IPv6 path at all: only IPv4 connections are redirected to the connection checker.
    rules = nft_list(pid)
    assert "ip6 daddr @allowed6 accept" not in rules and "redirect to :15001" in rules


def test_host_loopback_via_gateway_and_metadata_blocked(servers: Servers, container: str) -> None:
    st = stored(servers, ("allowed.test",))
    create(container, st)
    pid = bring_up(container, st)
    before = reject_count(pid)
    gw = curl(container, f"http://10.0.2.2:{servers.loopback_port}/")
    meta = curl(container, "http://169.254.169.254/latest/meta-data/")
    assert gw.returncode != 0 and BODY.decode() not in gw.stdout
    assert meta.returncode != 0
    # Both were rejected by the filter in the container's netns: no packet reached slirp4netns.
    assert reject_count(pid) >= before + 2
    assert resolves(container, "allowed.test").returncode == 0
    assert curl(container, f"http://allowed.test:{servers.http_port}/").stdout == BODY.decode()


def test_private_or_host_answers_refused_unless_profile_allows(
    servers: Servers, unique_name: str
) -> None:
    names = []
    try:
        strict = f"{unique_name}-s"
        names.append(strict)
        st = stored(servers, ("allowed.test", "loop.test", "meta.test"), private=False)
        create(strict, st)
        bring_up(strict, st)
        for n in ("loop.test", "meta.test", "allowed.test"):  # allowed.test = this host
            assert resolves(strict, n).returncode != 0, n
        reasons = [r["data"].get("reason", "") for r in admin_records("dns.denied")]
        assert any("loopback" in r for r in reasons)
        assert any("link-local" in r for r in reasons)
        assert any("own address" in r or "private" in r for r in reasons)

        loose = f"{unique_name}-l"
        names.append(loose)
        st2 = stored(servers, ("allowed.test", "loop.test"), private=True)
        create(loose, st2)
        bring_up(loose, st2)
        assert resolves(loose, "loop.test").returncode == 0
        assert curl(loose, f"http://allowed.test:{servers.http_port}/").stdout == BODY.decode()
    finally:
        for n in names:
            podman("rm", "-f", "-t", "0", n, check=False)
            guard.detach(n)


def test_txt_and_other_types_refused(servers: Servers, container: str) -> None:
    st = stored(servers, ("allowed.test",))
    create(container, st)
    bring_up(container, st)
    for rtype in ("TXT", "MX", "ANY", "SRV"):
        res = sh(container, f"dig +tries=1 allowed.test {rtype}")
        assert "status: REFUSED" in res.stdout, rtype
        assert "top-secret" not in res.stdout
    assert ("allowed.test", "TXT") not in servers.upstream.asked
    assert sh(container, "dig +short allowed.test A").stdout.strip() == HOST


def test_name_case_and_repeats_carry_nothing_upstream(servers: Servers, container: str) -> None:
    """The letter case of an allowed name, and how often a lookup that gives no address is
    repeated, were both passed on to the upstream: a way out for data (a probe sent 640 bytes
    in 470 lookups of `allowed.test` spelled in different cases)."""
    st = stored(servers, ("allowed.test",))
    create(container, st)
    bring_up(container, st)
    before = len(servers.upstream.asked)
    assert sh(container, "dig +short AlLoWeD.TeSt A").stdout.strip() == HOST
    spellings = "aLLOWED.test ALLOWED.TEST AlLoWeD.TeSt allowed.test"
    script = f"for n in {spellings}; do dig +short $n AAAA; done"
    assert sh(container, script).stdout.strip() == ""  # no AAAA: NODATA each time
    asked = servers.upstream.asked[before:]
    assert asked == [("allowed.test", "A"), ("allowed.test", "AAAA")]


def test_container_cannot_change_rules_or_routes(servers: Servers, container: str) -> None:
    st = stored(servers, ("allowed.test",))
    create(container, st, extra=nft_mounts())
    pid = bring_up(container, st)
    rules_before = nft_list(pid)
    nft = NFT_IN_CONTAINER
    dev = uplink(container)
    attempts = {
        "nft flush": f"{nft} flush ruleset",
        "nft add": f"{nft} add element inet linpodx_egress allowed4 {{ 10.0.2.2 }}",
        "route": f"ip route add 10.0.2.3/32 dev {dev}",
        "link": f"ip link set {dev} down",
        "addr": f"ip addr add 10.0.2.200/24 dev {dev}",
        "unshare": "unshare -rn true",
    }
    # nft itself runs in there (so a failure below is a refusal, not a missing binary).
    assert sh(container, f"{nft} --version").returncode == 0
    for what, cmd in attempts.items():
        res = sh(container, cmd)
        assert res.returncode != 0, f"{what} succeeded inside the container: {res.stdout}"
    assert "CapEff:\t0000000000000000" in sh(container, "cat /proc/self/status").stdout
    after = nft_list(pid)
    assert after.replace(" ", "").count("reject") == rules_before.replace(" ", "").count("reject")
    assert "policy drop" in after
    assert resolves(container, "allowed.test").returncode == 0
    assert curl(container, f"http://allowed.test:{servers.http_port}/").stdout == BODY.decode()


def test_guard_lives_exactly_as_long_as_the_container_and_plain_start_has_no_network(
    servers: Servers, container: str
) -> None:
    st = stored(servers, ("allowed.test",))
    create(container, st)
    bring_up(container, st)
    info = json.loads(EgressState(container).guard_file.read_text())
    gpid, hpid = info["guard_pid"], info["helper_pid"]
    assert Path(f"/proc/{gpid}").exists() and Path(f"/proc/{hpid}").exists()
    podman("stop", "-t", "0", container)
    assert wait_for(lambda: not Path(f"/proc/{gpid}").exists())
    assert wait_for(lambda: not Path(f"/proc/{hpid}").exists())
    assert egress_state.status(container) == "down"

    # A plain `podman start` outside linpodx: only lo, no egress at all.
    podman("start", container)
    assert links(container) == ["lo"]
    assert resolves(container, "allowed.test").returncode != 0
    assert curl(container, f"http://{HOST}:{servers.http_port}/").returncode != 0
    podman("restart", "-t", "0", container)
    assert links(container) == ["lo"]

    # Re-attaching (what `linpodx start` does) restores filtered egress.
    podman("stop", "-t", "0", container)
    bring_up(container, st)
    assert egress_state.status(container) == "healthy"
    assert curl(container, f"http://allowed.test:{servers.http_port}/").stdout == BODY.decode()
    assert resolves(container, "denied.test").returncode != 0


def test_reapply_changes_the_allowlist_live_and_is_audited(
    servers: Servers, container: str
) -> None:
    st = stored(servers, ("allowed.test",), rev=1)
    create(container, st)
    bring_up(container, st)
    assert curl(container, f"http://allowed.test:{servers.http_port}/").stdout == BODY.decode()
    assert resolves(container, "second.test").returncode != 0

    st2 = stored(servers, ("second.test",), rev=2)
    assert guard.update_profile(st2) == [container]
    # allowed.test is gone: denied, and the address it justified is no longer reachable.
    assert resolves(container, "allowed.test").returncode != 0
    assert curl(container, f"http://{HOST}:{servers.http_port}/").returncode != 0
    assert resolves(container, "second.test").returncode == 0
    assert curl(container, f"http://second.test:{servers.http_port}/").stdout == BODY.decode()
    recs = [r for r in admin_records("egress.update") if r["data"]["container"] == container]
    assert recs and recs[-1]["data"]["revision"] == 2
    assert recs[-1]["data"]["allowlist"][0] == "second.test"
    assert all(e.startswith("second.test") for e in recs[-1]["data"]["allowlist"])


def _guard_pid_of(container: str) -> int | None:
    """The pid of `container`'s guard process, by its command line (before it reports one)."""
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            argv = Path(f"/proc/{entry}/cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        if b"--container" in argv and container.encode() in argv and any(
            b"guardproc" in a or b"_egress-guard" in a for a in argv
        ):
            return int(entry)
    return None


def test_a_policy_replaced_while_the_guard_starts_is_enforced_once_it_is_ready(
    servers: Servers, container: str
) -> None:
    """A re-apply can replace the policy file after the starting guard read it and before it
    reported `ready` (no SIGHUP then: the guard is not running yet). The guard must notice and
    load it, instead of enforcing the old one until the next re-apply. The guard is stopped
    (SIGSTOP) right after it read the policy, so the window is certain."""
    st = stored(servers, ("allowed.test", "second.test"), rev=1)
    create(container, st)
    pid = init(container)
    log = EgressState(container).guard_log
    paused: list[int] = []

    def pause_after_reading_the_policy() -> None:
        end = time.monotonic() + 30
        while time.monotonic() < end:
            gpid = _guard_pid_of(container)
            try:
                text = log.read_bytes()
            except OSError:
                text = b""
            if gpid is not None and b"loading the nft filter" in text:
                os.kill(gpid, signal.SIGSTOP)
                paused.append(gpid)
                st2 = stored(servers, ("allowed.test",), rev=2)
                guard._write_policy(EgressState(container), st2, force=True)  # what a push does
                os.kill(gpid, signal.SIGCONT)
                return
            time.sleep(0.002)

    t = threading.Thread(target=pause_after_reading_the_policy, daemon=True)
    t.start()
    guard.attach(container, pid, st)
    t.join(30)
    assert paused, "the guard was never seen between reading its policy and being ready"
    podman("start", container)
    guard_file = EgressState(container).guard_file
    assert wait_for(lambda: json.loads(guard_file.read_text()).get("policy_revision") == 2)
    assert resolves(container, "second.test").returncode != 0  # gone with revision 2
    assert curl(container, f"http://allowed.test:{servers.http_port}/").stdout == BODY.decode()


def test_sighups_while_the_guard_starts_never_end_it(servers: Servers, container: str) -> None:
    """A re-apply nudges a guard with SIGHUP as soon as it is `ready`, which may be before the
    guard reached its serve loop. SIGHUPs sent all through its start-up (from its first log
    line to `ready`) must not end it: before, the default action could, and the container was
    left without a network."""
    st = stored(servers, ("allowed.test",))
    create(container, st)
    pid = init(container)
    log = EgressState(container).guard_log
    sent: list[int] = []
    done = threading.Event()

    def nudge() -> None:
        end = time.monotonic() + 30
        while not done.is_set() and time.monotonic() < end:
            gpid = _guard_pid_of(container)
            try:
                started = b"egress guard starting" in log.read_bytes()
            except OSError:
                started = False
            if gpid is not None and started:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(gpid, signal.SIGHUP)
                    sent.append(gpid)
            time.sleep(0.001)

    t = threading.Thread(target=nudge, daemon=True)
    t.start()
    try:
        guard.attach(container, pid, st)
    finally:
        done.set()
        t.join(10)
    assert sent, "no SIGHUP was sent during the start-up"
    podman("start", container)
    assert egress_state.status(container) == "healthy"
    assert curl(container, f"http://allowed.test:{servers.http_port}/").stdout == BODY.decode()


def test_reapply_that_stops_allowing_private_answers_cuts_them_off_live(
    servers: Servers, container: str
) -> None:
    """Same names, but `allow_private_answers` turned off: the host address the running
    container already reached (allowed.test answers with it) leaves the filter at once, and
    the resolver's cache no longer hands it out."""
    st = stored(servers, ("allowed.test",), rev=1, private=True)
    create(container, st)
    bring_up(container, st)
    assert curl(container, f"http://allowed.test:{servers.http_port}/").stdout == BODY.decode()

    assert guard.update_profile(stored(servers, ("allowed.test",), rev=2, private=False)) == [
        container
    ]
    assert curl(container, f"http://{HOST}:{servers.http_port}/").returncode != 0
    assert resolves(container, "allowed.test").returncode != 0
    reasons = [r["data"].get("reason", "") for r in admin_records("dns.denied")]
    assert any("own address" in r or "private" in r for r in reasons)


# Run in the container: one connection to the echo server at argv[1]:argv[2], a ping every
# 0.1 s for argv[3] seconds; one line per answer, then "alive", or "cut <error>" at once.
CONNECTION_SCRIPT = """\
import socket, sys, time
s = socket.create_connection((sys.argv[1], int(sys.argv[2])), timeout=5)
end = time.monotonic() + float(sys.argv[3])
i = 0
while time.monotonic() < end:
    try:
        s.sendall(b"ping%d\\n" % i)
        got = b""
        while not got.endswith(b"\\n"):
            chunk = s.recv(100)
            if not chunk:
                raise EOFError("closed by the peer")
            got += chunk
    except Exception as e:
        print("cut", type(e).__name__, e, flush=True)
        sys.exit(0)
    print("echo", got.decode().strip(), flush=True)
    i += 1
    time.sleep(0.1)
print("alive", i, flush=True)
"""


def revoked_resets(pid: int) -> int:
    """Packets the tcp reset rule for revoked IPv4 addresses has rejected."""
    for line in nft_list(pid).splitlines():
        if "@revoked4 meta l4proto tcp counter packets" in line:
            return int(line.split("counter packets", 1)[1].split()[0])
    raise AssertionError("no tcp reset rule for @revoked4 in the ruleset")


def test_reapply_cuts_established_connections_to_the_addresses_it_takes_away(
    servers: Servers, container: str
) -> None:
    """An open connection to an address only a name the re-apply drops justified stops at
    once (tcp reset), not only new ones; allowing the name again and looking it up lets
    connections through again."""
    st = stored(servers, ("allowed.test",), rev=1)
    create(container, st)
    pid = bring_up(container, st)
    argv = ["podman", "exec", container, "python3", "-c", CONNECTION_SCRIPT]
    port = str(servers.echo_port)
    conn = subprocess.Popen([*argv, "allowed.test", port, "30"], stdout=subprocess.PIPE, text=True)
    lines: queue.Queue[str] = queue.Queue()
    threading.Thread(target=lambda: [lines.put(x) for x in conn.stdout or ()], daemon=True).start()
    try:
        # The allowed path: connected, and the established flow carries data both ways.
        for i in range(3):
            assert lines.get(timeout=20).split() == ["echo", f"ping{i}"]

        assert guard.update_profile(stored(servers, ("second.test",), rev=2)) == [container]
        revoked = time.monotonic()
        line = ""
        while not line.startswith(("cut", "alive")) and time.monotonic() < revoked + 5:
            with contextlib.suppress(queue.Empty):
                line = lines.get(timeout=0.2)
        assert line.startswith("cut"), f"the open connection outlived the re-apply: {line}"
        assert time.monotonic() - revoked < 3, "cut, but not at once"
        assert line.split()[1] == "ConnectionResetError", line  # a reset: it failed at once
        assert conn.wait(timeout=10) == 0
    finally:
        if conn.poll() is None:
            conn.kill()
            conn.wait()
    assert revoked_resets(pid) > 0  # cut by the filter, not by anything else
    assert curl(container, f"http://{HOST}:{servers.http_port}/").returncode != 0
    again = podman(*argv[1:], HOST, port, "0.3", check=False)  # not by name: that is denied
    assert again.returncode != 0 and "ConnectionRefusedError" in again.stderr, again.stderr

    # Allowed again: a new lookup grants the address afresh, new and established flows alike.
    assert guard.update_profile(stored(servers, ("allowed.test",), rev=3)) == [container]
    assert resolves(container, "allowed.test").returncode == 0
    back = podman(*argv[1:], "allowed.test", port, "0.5", check=False)
    assert back.stdout.splitlines()[0] == "echo ping0" and "alive" in back.stdout, back.stdout
    assert "cut" not in back.stdout
    assert curl(container, f"http://allowed.test:{servers.http_port}/").stdout == BODY.decode()


def test_attach_fails_closed_and_leaves_nothing_running(
    servers: Servers, container: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    st = stored(servers, ("allowed.test",))
    create(container, st)
    pid = init(container)
    monkeypatch.setenv("LINPODX_EGRESS_HELPER", "no-such-helper-" + uuid.uuid4().hex[:6])
    with pytest.raises(EngineError) as err:
        guard.attach(container, pid, st)
    assert "could not be set up" in err.value.message
    info = json.loads(EgressState(container).guard_file.read_text())
    assert info["state"] == "failed"
    assert wait_for(lambda: not Path(f"/proc/{info['guard_pid']}").exists())
    assert egress_state.status(container) == "down"
    # Started anyway by hand: no network (the caller would have removed it).
    podman("start", container)
    assert links(container) == ["lo"]


def test_pasta_helper(servers: Servers, container: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """pasta (podman >= 5's helper, from Debian's passt) instead of slirp4netns, rootful and
    rootless: the same filtering, and pasta ends with the container."""
    monkeypatch.setenv("LINPODX_EGRESS_HELPER", "pasta")
    st = stored(servers, ("allowed.test",))
    create(container, st)
    pid = bring_up(container, st)
    info = json.loads(EgressState(container).guard_file.read_text())
    assert info["helper"] == "pasta" and egress_state.status(container) == "healthy"
    before = reject_count(pid)
    assert curl(container, f"http://{HOST}:{servers.http_port}/").returncode != 0
    assert curl(container, f"http://10.0.2.2:{servers.loopback_port}/").returncode != 0
    assert reject_count(pid) >= before + 2
    assert resolves(container, "denied.test").returncode != 0
    assert resolves(container, "allowed.test").returncode == 0
    assert curl(container, f"http://allowed.test:{servers.http_port}/").stdout == BODY.decode()
    pasta_pid = int(EgressState(container).pasta_pidfile.read_text())  # the keeper's child
    assert Path(f"/proc/{pasta_pid}").exists()
    podman("stop", "-t", "0", container)
    assert wait_for(lambda: not Path(f"/proc/{info['helper_pid']}").exists())
    assert wait_for(lambda: not Path(f"/proc/{pasta_pid}").exists())
    assert wait_for(lambda: not Path(f"/proc/{info['guard_pid']}").exists())


def test_cli_run_ps_events_stop_start_rm(
    servers: Servers, unique_name: str, tmp_path: Path
) -> None:
    """The walk-through through the real CLI: apply, run, ps, a denied lookup in `linpodx
    events`, stop, a plain `podman start` (no network), `linpodx start` (filtered again), rm."""
    prof = tmp_path / "egress-cli.yml"
    prof.write_text(
        "version: 1\nname: egress-cli\nnetwork:\n"
        f"  egress_dns_allowlist: [allowed.test, 'allowed.test:{servers.http_port}/http']\n"
        f"  upstream_dns: ['127.0.0.1:{servers.upstream.port}']\n"
        "  allow_private_answers: true\n"
    )
    applied = run_linpodx("sandbox", "apply", "--profile", str(prof))
    assert applied.returncode == 0, applied.stderr
    name = unique_name
    run = run_linpodx(
        "run",
        "-d",
        "--profile",
        "egress-cli",
        "--image",
        DEBIAN_IMAGE,
        "--name",
        name,
        "--",
        "sleep",
        "600",
    )
    assert run.returncode == 0, run.stderr
    try:
        ps = run_linpodx("ps")
        row = [line for line in ps.stdout.splitlines() if line.startswith(name)]
        assert row and row[0].split()[-1] == "healthy", ps.stdout
        assert curl(name, f"http://allowed.test:{servers.http_port}/").stdout == BODY.decode()
        assert resolves(name, "github.qkg1.top").returncode != 0
        ev = run_linpodx("events", "--no-follow", "--filter", "dns")
        assert "dns lookup denied for github.qkg1.top" in ev.stdout

        # The troubleshooting step: add the host to the profile, re-apply, it gets through
        # without a restart (and `sandbox apply` says which containers took it).
        assert resolves(name, "second.test").returncode != 0
        added = f"[allowed.test, second.test, 'second.test:{servers.http_port}/http', "
        prof.write_text(prof.read_text().replace("[allowed.test, ", added))
        reapplied = run_linpodx("sandbox", "apply", "--profile", str(prof))
        assert reapplied.returncode == 0, reapplied.stderr
        assert "revision: 2" in reapplied.stdout
        assert f"egress_updated: {name}" in reapplied.stdout
        assert resolves(name, "second.test").returncode == 0
        assert curl(name, f"http://second.test:{servers.http_port}/").stdout == BODY.decode()

        assert run_linpodx("stop", name).returncode == 0
        ps = run_linpodx("ps", "--all")
        row = [line for line in ps.stdout.splitlines() if line.startswith(name)]
        assert row and row[0].split()[-1] == "down", ps.stdout
        podman("start", name)
        assert links(name) == ["lo"]
        assert curl(name, f"http://{HOST}:{servers.http_port}/").returncode != 0
        podman("stop", "-t", "0", name)
        # podman 4.3: the previous run's exit cleanup can land after a quick re-init (see
        # `init` above); give it a moment, as a person typing the next command would.
        time.sleep(1.5)

        started = run_linpodx("start", name)
        assert started.returncode == 0, started.stderr
        assert egress_state.status(name) == "healthy"
        assert curl(name, f"http://allowed.test:{servers.http_port}/").stdout == BODY.decode()
        gpid = json.loads(EgressState(name).guard_file.read_text())["guard_pid"]
    finally:
        removed = run_linpodx("rm", "-f", name)
    assert removed.returncode == 0, removed.stderr
    assert wait_for(lambda: not Path(f"/proc/{gpid}").exists())
    assert egress_state.status(name) == "none"


@pytest.mark.parametrize("helper", ["slirp4netns", "pasta"])
def test_killed_guard_takes_the_network_with_it(
    servers: Servers, container: str, helper: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """kill -9 of the guard: the helper ends too (slirp4netns through its exit fd, pasta
    through its keeper), so the container is left without network, never unfiltered."""
    monkeypatch.setenv("LINPODX_EGRESS_HELPER", helper)
    st = stored(servers, ("allowed.test",))
    create(container, st)
    bring_up(container, st)
    assert curl(container, f"http://allowed.test:{servers.http_port}/").stdout == BODY.decode()
    info = json.loads(EgressState(container).guard_file.read_text())
    helpers = [info["helper_pid"]]
    if helper == "pasta":
        helpers.append(int(EgressState(container).pasta_pidfile.read_text()))
    os.kill(info["guard_pid"], 9)
    assert wait_for(lambda: not any(Path(f"/proc/{p}").exists() for p in helpers))
    assert egress_state.status(container) == "down"
    assert wait_for(lambda: links(container) == ["lo"])
    assert curl(container, f"http://{HOST}:{servers.http_port}/").returncode != 0


def _apply_cli_profile(servers: Servers, tmp_path: Path, name: str) -> str:
    """Apply an allowlist profile with the CLI, with a read-only project mount (so podman gets
    both the egress hook and the mount-check hook); returns its profile id."""
    project = tmp_path / f"{name}-project"
    project.mkdir(exist_ok=True)
    (project / "hello").write_text("from-the-project\n")
    prof = tmp_path / f"{name}.yml"
    prof.write_text(
        f"version: 1\nname: {name}\n"
        f"mounts:\n  - source: {project}\n    target: /workspace\n"
        "network:\n"
        f"  egress_dns_allowlist: [allowed.test, 'allowed.test:{servers.http_port}/http']\n"
        f"  upstream_dns: ['127.0.0.1:{servers.upstream.port}']\n"
        "  allow_private_answers: true\n"
    )
    applied = run_linpodx("sandbox", "apply", "--profile", str(prof), "--json")
    assert applied.returncode == 0, applied.stderr
    return str(json.loads(applied.stdout)["result"]["profile_id"])


def _take_path(path: str, profile_id: str) -> Callable[[], None]:
    """Send the next run of the profile down the full or the fast path (linpodx/fastpath/run.py);
    returns a check that it went there. The full path ends by writing the revision's run plan
    afresh; the fast one only reads it (same inode)."""
    plan = runplan.plan_file(profile_id)
    if path == "full":
        os.unlink(plan)
        return lambda: None if os.path.exists(plan) else pytest.fail("no full run wrote a plan")
    inode = os.stat(plan).st_ino

    def check() -> None:
        assert os.stat(plan).st_ino == inode, "the full path ran instead of the fast one"

    return check


def _guard_processes(name: str) -> list[str]:
    out = subprocess.run(["ps", "-eo", "args"], capture_output=True, text=True).stdout
    return [line for line in out.splitlines() if "egress" in line and name in line]


@pytest.mark.parametrize("path", ["full", "fast"])
def test_one_call_rm_run_is_filtered_from_its_first_instruction(
    servers: Servers, unique_name: str, tmp_path: Path, path: str
) -> None:
    """`run --rm` without a TTY is one `podman run` whose createRuntime hook holds the command
    back until the guard is ready: the very first thing the command does is already filtered."""
    went = _take_path(path, _apply_cli_profile(servers, tmp_path, "egress-once"))
    script = (
        f"curl -s -m 3 http://{HOST}:{servers.http_port}/ >/dev/null; echo direct=$?; "
        f"curl -s -m 5 http://allowed.test:{servers.http_port}/; echo; "
        "getent hosts denied.test >/dev/null; echo denied=$?; cat /workspace/hello"
    )
    res = run_linpodx(
        "run", "--rm", "--profile", "egress-once", "--image", DEBIAN_IMAGE,
        "--name", unique_name, "--", "sh", "-c", script, timeout=120,
    )  # fmt: skip
    assert res.returncode == 0, res.stderr
    status = [x for x in res.stderr.splitlines() if not x.startswith("note: ")]
    assert status[0].startswith("container_id: ") and status[2].split() == ["state:", "running"]
    lines = res.stdout.splitlines()  # only the container's own output
    # Before any allowed name resolved to it, the host's address is refused (curl: not 0).
    assert lines[0].startswith("direct=") and lines[0] != "direct=0"
    assert lines[1] == BODY.decode()
    assert lines[2] == "denied=2"
    assert lines[3:] == ["from-the-project"]  # the pinned mount passed runc's mount check
    assert ("denied.test", "A") not in servers.upstream.asked
    # Gone with the container: the guard, its files, the run spec.
    assert wait_for(lambda: not _guard_processes(unique_name))
    assert not EgressState(unique_name).dir.parent.exists()
    went()


@pytest.mark.parametrize("path", ["full", "fast"])
def test_one_call_rm_run_fails_closed_when_the_guard_fails(
    servers: Servers, unique_name: str, tmp_path: Path, path: str
) -> None:
    went = _take_path(path, _apply_cli_profile(servers, tmp_path, "egress-once-fail"))
    env = {**os.environ, "LINPODX_EGRESS_HELPER": "no-such-helper-" + uuid.uuid4().hex[:6]}
    res = run_linpodx(
        "run", "--rm", "--profile", "egress-once-fail", "--image", DEBIAN_IMAGE,
        "--name", unique_name, "--", "sh", "-c", "echo SHOULD-NOT-RUN",
        timeout=120, env=env,
    )  # fmt: skip
    assert res.returncode != 0
    assert "SHOULD-NOT-RUN" not in res.stdout
    assert "container_id" not in res.stdout + res.stderr  # never announced: it never ran
    assert "egress filter" in res.stderr and "hint:" in res.stderr
    assert "Traceback" not in res.stderr
    assert subprocess.run(["podman", "container", "exists", unique_name]).returncode == 1
    assert wait_for(lambda: not _guard_processes(unique_name))
    assert not EgressState(unique_name).dir.parent.exists()
    if path == "fast":
        went()  # (a failed full run writes no plan)


def test_two_runs_of_one_name_at_once_leave_the_winners_guard_files_alone(
    servers: Servers, unique_name: str, tmp_path: Path
) -> None:
    """Two `linpodx run -d --name X` at once under a profile with an allowlist: podman gives the
    name to one; the other says so and leaves the winner's files as they are (its guard's log
    above all, which the loser's clean-up used to delete). Three rounds: how the two overlap
    is up to the scheduler."""
    prof = tmp_path / "egress-race.yml"
    prof.write_text(
        "version: 1\nname: egress-race\nnetwork:\n"
        f"  egress_dns_allowlist: [allowed.test, 'allowed.test:{servers.http_port}/http']\n"
        f"  upstream_dns: ['127.0.0.1:{servers.upstream.port}']\n"
        "  allow_private_answers: true\n"
    )
    assert run_linpodx("sandbox", "apply", "--profile", str(prof)).returncode == 0
    for round_ in range(3):
        name = f"{unique_name}-{round_}"
        argv = [
            *linpodx_argv(), "run", "-d", "--profile", "egress-race", "--image", DEBIAN_IMAGE,
            "--name", name, "--", "sleep", "600",
        ]  # fmt: skip
        try:
            runs = [
                subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
                for _ in range(2)
            ]
            said = [p.communicate(timeout=120) for p in runs]
            done = [(p.returncode, out, err) for p, (out, err) in zip(runs, said, strict=True)]
            assert sorted(rc for rc, _, _ in done) == [0, 9], done
            err = next(e for rc, _, e in done if rc == 9)
            assert "already in use" in err and "hint:" in err and "Traceback" not in err
            st = EgressState(name)
            assert "egress guard ready" in st.guard_log.read_text()
            assert st.policy_file.exists() and st.guard_file.exists()
            assert egress_state.status(name) == "healthy"
            allowed = curl(name, f"http://allowed.test:{servers.http_port}/")
            assert allowed.stdout == BODY.decode()
        finally:
            removed = run_linpodx("rm", "-f", name)
        assert removed.returncode == 0, removed.stderr
