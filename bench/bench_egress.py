"""Benchmark the egress guard against baselines measured in the same run.

1. Name resolution: the same stdlib UDP client asks (a) the test upstream directly from the
   host and (b) the policy resolver from inside a filtered container (which asks that
   upstream). Cases: warm (same name again: the resolver answers from its cache),
   cold/same address (a new name each time whose address is already in the nft set),
   cold/new address (a new name and a new address each time: one nft update per lookup),
   and cold with the upstream answering after 1 ms or 10 ms (what a real resolver's distance
   adds: one on the LAN, the ISP's; the local test upstream answers in well under a
   millisecond, so there the extra hop dominates).
   Two floors put the target in scale: the same client asks, on the host, a relay process
   in front of the same upstream that (a) only copies datagrams, (b) also reads and writes
   each message with the guard's own dnspython code (`linpodx.egress.dnsmsg`), with no policy,
   no cache and no nft sets, and no network-namespace hop.
   Target: median ratio <= 1.3. Direct and resolver queries run in alternating chunks
   (ROUNDS per case), so load from other users of the machine lands on both sides alike;
   the cold cases ask names never asked before, so every one of them really goes upstream.
2. Start-up: `linpodx run --rm` under a profile with an allowlist vs plain `podman run --rm`
   with the same image (alternating). Target: median ratio <= 1.6. `linpodx run --rm` under a
   profile WITHOUT an allowlist is measured too, so the guard's own share is visible.
3. Connections (`--part connect`, root): connection set-up + one HTTP request through the
   connection checker vs the same with the address pinned (no redirect, as before the
   checker), and a floor: the same redirect path through a bare relay in the container's
   netns that accepts, connects onward and splices without reading or judging anything, so
   the checker's added latency splits into the extra hop and the judging. The three
   alternate in chunks of the same run. Then a large download (checker vs pinned) and the
   guard's memory with 256 connections held.

Everything stays on this machine (upstream on 127.0.0.1, answers are this host's address or
198.18.0.0/15 benchmark addresses that no packet is sent to).

    python bench/bench_egress.py [--queries N] [--runs N] [--image IMAGE]
        [--part dns|startup|connect] [--connections N] [--download-mib N]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import textwrap
import time
import uuid
from dataclasses import dataclass
from pathlib import Path

UPSTREAM = textwrap.dedent(
    """
    import socket, sys, threading
    import dns.message, dns.rrset, dns.rcode
    host = sys.argv[1]
    s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    s.bind(("127.0.0.1", 0))
    print(s.getsockname()[1], flush=True)
    while True:
        data, peer = s.recvfrom(4096)
        q = dns.message.from_wire(data)
        r = dns.message.make_response(q)
        name = q.question[0].name.to_text(omit_final_dot=True)
        delay = 0.010 if name.endswith(".slow.test") else 0.001 if name.endswith(".lan.test") else 0
        if delay:
            # A resolver 1 ms (on the LAN) or 10 ms (the ISP's) away; answered from a timer thread.
            r.answer.append(dns.rrset.from_text(name + ".", 300, "IN", "A", host))
            threading.Timer(delay, s.sendto, (r.to_wire(), peer)).start()
            continue
        if q.question[0].rdtype == 1 and name.endswith(".bench.test"):
            r.answer.append(dns.rrset.from_text(name + ".", 300, "IN", "A", host))
        elif q.question[0].rdtype == 1 and name.endswith(".fresh.test"):
            i = int(name.split(".")[0][1:])
            addr = f"198.18.{i >> 8}.{i & 255}"
            r.answer.append(dns.rrset.from_text(name + ".", 300, "IN", "A", addr))
        else:
            r.set_rcode(dns.rcode.NXDOMAIN)
        s.sendto(r.to_wire(), peer)
    """
)

# Stdlib only, so it runs unchanged on the host and in the container image.
CLIENT = textwrap.dedent(
    """
    import json, os, socket, struct, sys, time
    ip, port, names = sys.argv[1], int(sys.argv[2]), sys.argv[3].split(",")
    s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    s.settimeout(5)
    out = []
    for n in names:
        qid = int.from_bytes(os.urandom(2), "big")
        q = struct.pack(">HHHHHH", qid, 0x0100, 1, 0, 0, 0)
        q += b"".join(bytes([len(p)]) + p.encode() for p in n.split(".")) + b"\\0"
        q += struct.pack(">HH", 1, 1)
        t = time.perf_counter()
        s.sendto(q, (ip, port))
        while True:
            data = s.recv(4096)
            if data[:2] == q[:2]:
                break
        out.append(time.perf_counter() - t)
        if data[3] & 0x0F != 0:
            sys.exit(f"lookup of {n} failed: rcode {data[3] & 0x0F}")
    print(json.dumps(out))
    """
)


@dataclass(frozen=True)
class Stored:
    """The fields of a stored profile the guard reads."""

    profile: object
    name: str
    profile_id: str
    revision: int
    audit_hash: str = "0" * 64


def sh(*argv: str, timeout: float = 300) -> str:
    return subprocess.run(argv, capture_output=True, text=True, check=True, timeout=timeout).stdout


def host_ip() -> str:
    for tok in sh("hostname", "-I").split():
        if ":" not in tok and not tok.startswith("127."):
            return tok
    raise SystemExit("no non-loopback IPv4 address on this host")


ROUNDS = 10
"""Each name-resolution case runs in this many alternating chunks per side."""


def median_ms(xs: list[float]) -> float:
    return statistics.median(xs) * 1000


def bench_resolution(image: str, queries: int, up_port: int) -> list[tuple[str, float, float]]:
    from linpodx.egress import guard
    from linpodx.profile.model import Network, Profile

    net = Network(
        egress_dns_allowlist=("*.bench.test", "*.fresh.test", "*.lan.test", "*.slow.test"),
        upstream_dns=(f"127.0.0.1:{up_port}",),
        allow_private_answers=True,
        # Every cold case asks `queries` new names under a wildcard: the largest budget, so
        # none is refused (and each new name's record is part of what a cold lookup costs).
        wildcard_budget=10000,
    )
    st = Stored(Profile(name="bench-egress", network=net), "bench-egress", "prof_BENCH", 1)
    name = f"lpx-bench-{uuid.uuid4().hex[:8]}"
    resolv = guard.prepare(name, st)
    sh(
        "podman",
        "create",
        "--name",
        name,
        "--network",
        "none",
        "--cap-drop",
        "all",
        "--security-opt",
        "no-new-privileges",
        "-v",
        f"{resolv}:/etc/resolv.conf:ro",
        image,
        "sleep",
        "900",
    )
    try:
        sh("podman", "init", name)
        pid = int(sh("podman", "inspect", "--format", "{{.State.Pid}}", name))
        guard.attach(name, pid, st)
        sh("podman", "start", name)
        cases = {
            "warm (cached name)": ["w.bench.test"] * queries,
            "cold, address already allowed": [f"c{i}.bench.test" for i in range(queries)],
            "cold, new address (nft update)": [f"n{i}.fresh.test" for i in range(queries)],
            "cold, upstream 1 ms away": [f"l{i}.lan.test" for i in range(queries)],
            "cold, upstream 10 ms away": [f"s{i}.slow.test" for i in range(queries)],
        }
        rows = []
        for label, names in cases.items():
            direct: list[float] = []
            inside: list[float] = []
            # Alternating chunks (and which side goes first), so a neighbour's load lands on
            # both sides alike. The upstream keeps no cache: the same names serve both paths.
            for i in range(ROUNDS):
                chunk = ",".join(names[i::ROUNDS])
                in_container = ["podman", "exec", name, "python3", "-c", CLIENT]
                sides = [
                    (direct, [sys.executable, "-c", CLIENT, "127.0.0.1", str(up_port), chunk]),
                    (inside, [*in_container, "127.0.0.1", "53", chunk]),
                ]
                for out, argv in sides if i % 2 == 0 else sides[::-1]:
                    out.extend(json.loads(sh(*argv)))
            rows.append((label, median_ms(direct), median_ms(inside)))
        return rows
    finally:
        subprocess.run(["podman", "rm", "-f", "-t", "0", name], capture_output=True)
        guard.detach(name)


FLOOR_RELAY = textwrap.dedent(
    """
    import os, socket, sys
    mode, up = sys.argv[1], int(sys.argv[2])
    if mode == "parse":
        from linpodx.egress import dnsmsg
    s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    s.bind(("127.0.0.1", 0))
    print(s.getsockname()[1], flush=True)
    u = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    u.connect(("127.0.0.1", up))
    while True:
        data, peer = s.recvfrom(65535)
        if mode == "bare":
            u.send(data)
            s.sendto(u.recv(65535), peer)
            continue
        q = dnsmsg.read_query(data)
        sent = dnsmsg.upstream_query(int.from_bytes(os.urandom(2), "big"), q.qname, q.rdtype)
        u.send(sent.wire)
        reply = dnsmsg.read_reply(sent, u.recv(65535))
        chain = dnsmsg.follow_chain(reply, q.name, q.rdtype, 8)
        s.sendto(dnsmsg.answer(q, dnsmsg.NOERROR, chain.records, chain.ttl), peer)
    """
)
"""What a relay costs with nothing of the guard's policy: only the hop, or the hop plus
reading and writing the messages as the guard does (the issue asks for a DNS library)."""


def bench_floors(queries: int, up_port: int) -> list[tuple[str, float, float]]:
    """(label, direct ms, via relay ms) for each floor relay, cold names, host only."""
    rows = []
    for mode, label in (("bare", "floor: bare relay"), ("parse", "floor: relay + dnspython")):
        relay = subprocess.Popen(
            [sys.executable, "-c", FLOOR_RELAY, mode, str(up_port)],
            stdout=subprocess.PIPE,
            text=True,
        )
        try:
            assert relay.stdout is not None
            port = relay.stdout.readline().strip()
            names = [f"f{mode}{i}.bench.test" for i in range(queries)]
            direct: list[float] = []
            via: list[float] = []
            for i in range(ROUNDS):
                chunk = ",".join(names[i::ROUNDS])
                sides = [(direct, str(up_port)), (via, port)]
                for out, p in sides if i % 2 == 0 else sides[::-1]:
                    out.extend(json.loads(sh(sys.executable, "-c", CLIENT, "127.0.0.1", p, chunk)))
            rows.append((label, median_ms(direct), median_ms(via)))
        finally:
            relay.kill()
            relay.wait()
    return rows


def bench_run(image: str, runs: int, up_port: int) -> tuple[float, float, float]:
    tmp = Path(tempfile.mkdtemp(prefix="linpodx-bench-"))
    filtered = tmp / "filtered.yml"
    filtered.write_text(
        "version: 1\nname: bench-filtered\nnetwork:\n"
        "  egress_dns_allowlist: [x.bench.test]\n"
        f"  upstream_dns: ['127.0.0.1:{up_port}']\n"
    )
    plain = tmp / "plain.yml"
    plain.write_text("version: 1\nname: bench-plain\n")
    lp = [sys.executable, "-m", "linpodx"]
    for f in (filtered, plain):
        sh(*lp, "sandbox", "apply", "--profile", str(f))
    argvs = {
        "podman": [
            "podman",
            "run",
            "--rm",
            "--network",
            "none",
            "--cap-drop",
            "all",
            "--security-opt",
            "no-new-privileges",
            image,
            "true",
        ],
        "filtered": [
            *lp,
            "run",
            "--rm",
            "--profile",
            "bench-filtered",
            "--image",
            image,
            "--",
            "true",
        ],
        "unfiltered": [
            *lp,
            "run",
            "--rm",
            "--profile",
            "bench-plain",
            "--image",
            image,
            "--",
            "true",
        ],
    }
    times: dict[str, list[float]] = {k: [] for k in argvs}
    try:
        for argv in argvs.values():  # warm-up
            sh(*argv)
        for _ in range(runs):
            for k, argv in argvs.items():
                t = time.perf_counter()
                sh(*argv)
                times[k].append(time.perf_counter() - t)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return (
        statistics.median(times["podman"]),
        statistics.median(times["filtered"]),
        statistics.median(times["unfiltered"]),
    )


WEB = textwrap.dedent(
    """
    import socket, sys, threading
    from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
    CHUNK = b"x" * (1 << 20)
    class H(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"
        def do_GET(self):
            size = int(self.path.split("/")[-1] or 0)
            self.send_response(200)
            self.send_header("Content-Length", str(size))
            self.end_headers()
            while size:
                n = min(size, len(CHUNK))
                self.wfile.write(CHUNK[:n])
                size -= n
        def log_message(self, *a):
            pass
    class S(ThreadingHTTPServer):
        daemon_threads = True
        request_queue_size = 1024
    srvs = [S((sys.argv[1], 0), H) for _ in range(3)]
    for srv in srvs:
        threading.Thread(target=srv.serve_forever, daemon=True).start()
    print(*(srv.server_address[1] for srv in srvs), flush=True)
    threading.Event().wait()
    """
)
"""A local HTTP server on three ports: one reached through the checker, one pinned as before,
one through the floor's bare relay."""

CONNECT_CLIENT = textwrap.dedent(
    """
    import json, socket, sys, time
    host, port, n = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
    ip = socket.gethostbyname(host)
    req = f"GET /0 HTTP/1.1\\r\\nHost: {host}\\r\\n\\r\\n".encode()
    out = []
    for _ in range(n):
        t = time.perf_counter()
        s = socket.create_connection((ip, port))
        s.sendall(req)
        s.recv(4096)
        out.append(time.perf_counter() - t)
        s.close()
    print(json.dumps(out))
    """
)

CONNECT_FLOOR = textwrap.dedent(
    """
    import fcntl, os, queue, socket, struct, sys, threading
    # The floor: the checker's path (nat redirect, a socket inside the netns, SO_ORIGINAL_DST,
    # an onward socket marked so the filter lets it out, splice both ways), with nothing read
    # or judged: the onward connect starts as soon as the connection is accepted, in the
    # accepting thread, and the two directions go to threads started beforehand.
    port, mark = int(sys.argv[1]), int(sys.argv[2])
    lst = socket.socket()
    lst.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    lst.bind(("127.0.0.1", port))
    lst.listen(1024)
    work = queue.SimpleQueue()
    def pump(src, dst, done):
        r, w = os.pipe()
        try:
            fcntl.fcntl(w, 1031, 1 << 20)
            while True:
                n = os.splice(src.fileno(), w, 1 << 20)
                if not n:
                    break
                while n:
                    n -= os.splice(r, dst.fileno(), n)
        except OSError:
            pass
        finally:
            os.close(r); os.close(w)
            try:
                dst.shutdown(socket.SHUT_WR)
            except OSError:
                pass
            if done.acquire(blocking=False):  # the second of the pair closes both
                src.close(); dst.close()
    def worker():
        while True:
            pump(*work.get())
    for _ in range(64):
        threading.Thread(target=worker, daemon=True).start()
    print("ready", flush=True)
    while True:
        conn, _ = lst.accept()
        raw = conn.getsockopt(socket.SOL_IP, 80, 16)
        dport, addr = struct.unpack("!2xH4s8x", raw)
        out = socket.socket()
        out.setsockopt(socket.SOL_SOCKET, 36, mark)
        out.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        out.connect((socket.inet_ntoa(addr), dport))
        done = threading.Semaphore(1)
        done.acquire()
        work.put((conn, out, done))
        work.put((out, conn, done))
    """
)
"""A bare relay for the floor of `--part connect`, run inside the container's netns."""
CONNECT_FLOOR_PORT = 15002

HOLD_CLIENT = textwrap.dedent(
    """
    import socket, sys, time
    host, port, n = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
    ip = socket.gethostbyname(host)
    req = f"GET /0 HTTP/1.1\\r\\nHost: {host}\\r\\n\\r\\n".encode()
    socks = []
    for _ in range(n):
        s = socket.create_connection((ip, port))
        s.sendall(req)
        s.recv(4096)
        socks.append(s)
        time.sleep(0.012)  # under the 100 new connections per second bound
    print("held", len(socks), flush=True)
    sys.stdin.readline()
    """
)


def bench_connections(image: str, up_port: int, count: int, big: int) -> None:
    """Through the checker vs pinned (the pre-checker path: the address allowed, no redirect)
    in the same container, to the same server, in the same run."""
    from linpodx.egress import guard, ruleset
    from linpodx.egress.state import EgressState
    from linpodx.profile.model import Network, Profile

    web = subprocess.Popen(
        [sys.executable, "-c", WEB, host_ip()], stdout=subprocess.PIPE, text=True
    )
    assert web.stdout is not None
    checked, pinned, floor = (int(x) for x in web.stdout.readline().split())
    net = Network(
        egress_dns_allowlist=(f"w.bench.test:{checked}/http",),
        upstream_dns=(f"127.0.0.1:{up_port}",),
        allow_private_answers=True,
    )
    st = Stored(Profile(name="bench-conn", network=net), "bench-conn", "prof_BENCHC", 1)
    name = f"lpx-bench-{uuid.uuid4().hex[:8]}"
    resolv = guard.prepare(name, st)
    sh("podman", "create", "--name", name, "--network", "none", "--cap-drop", "all",
       "--security-opt", "no-new-privileges", "-v", f"{resolv}:/etc/resolv.conf:ro",
       image, "sleep", "900")  # fmt: skip
    try:
        sh("podman", "init", name)
        pid = int(sh("podman", "inspect", "--format", "{{.State.Pid}}", name))
        guard.attach(name, pid, st)
        sh("podman", "start", name)
        nft = ["nsenter", f"--net=/proc/{pid}/ns/net", shutil.which("nft") or "nft"]
        t = ruleset.TABLE
        # The pinned port: what every allowed address's port got before the checker.
        sh(*nft, "insert", "rule", "inet", t, "nat_output", "tcp", "dport", str(pinned), "return")
        sh(*nft, "insert", "rule", "inet", t, "output", "ip", "daddr", f"@{ruleset.SET4}",
           "tcp", "dport", str(pinned), "accept")  # fmt: skip
        # (and out of the uplink, where only the checker's marked packets leave otherwise)
        sh(*nft, "insert", "rule", "inet", t, "postrouting", "ip", "daddr", f"@{ruleset.SET4}",
           "tcp", "dport", str(pinned), "accept")  # fmt: skip
        # The floor's port: redirected like the checker's, to the bare relay (not the relay's
        # own onward connection, which carries the guard's mark, and which the filter lets
        # out as it lets the checker's).
        sh(*nft, "insert", "rule", "inet", t, "nat_output", "meta", "mark", "!=",
           str(ruleset.GUARD_MARK), "ip", "daddr", f"@{ruleset.SET4}", "tcp", "dport",
           str(floor), "redirect", "to", f":{CONNECT_FLOOR_PORT}")  # fmt: skip
        sh(*nft, "insert", "rule", "inet", t, "output", "ct", "status", "dnat", "ip", "daddr",
           "127.0.0.1", "tcp", "dport", str(CONNECT_FLOOR_PORT), "accept")  # fmt: skip
        relay = subprocess.Popen(
            ["nsenter", f"--net=/proc/{pid}/ns/net", sys.executable, "-c", CONNECT_FLOOR,
             str(CONNECT_FLOOR_PORT), str(ruleset.GUARD_MARK)],
            stdout=subprocess.PIPE, text=True,
        )  # fmt: skip
        assert relay.stdout is not None and relay.stdout.readline().strip() == "ready"
        ex = ["podman", "exec", name, "python3", "-c"]
        lat: dict[str, list[float]] = {"checker": [], "pinned": [], "floor": []}
        rounds: dict[str, list[float]] = {"checker": [], "pinned": [], "floor": []}
        sides = [("checker", checked), ("pinned", pinned), ("floor", floor)]
        chunks = 3 * ROUNDS
        for i in range(chunks):
            # Each side first, middle and last in turn.
            for label, port in sides[i % 3 :] + sides[: i % 3]:
                out = sh(*ex, CONNECT_CLIENT, "w.bench.test", str(port), str(count // chunks))
                got = json.loads(out)
                lat[label].extend(got)
                rounds[label].append(median_ms(got))
        relay.terminate()
        relay.wait()
        c, p, f = (median_ms(lat[k]) for k in ("checker", "pinned", "floor"))

        def paired(a: str, b: str) -> float:
            # Median over rounds of (a's median - b's median) in the same round: load that
            # comes and goes between rounds cancels out of each difference.
            return statistics.median(x - y for x, y in zip(rounds[a], rounds[b], strict=True))

        print(f"connection set-up + one request, {count} each, median ms "
              f"(added: median of {chunks} paired rounds):")  # fmt: skip
        print(f"  pinned address (before)  {p:7.3f}")
        print(f"  floor: bare relay        {f:7.3f}  added {paired('floor', 'pinned'):6.3f} ms"
              "  (the extra hop)")  # fmt: skip
        print(f"  through the checker      {c:7.3f}  added {paired('checker', 'pinned'):6.3f} ms"
              f"  target <= 1 ms; over the floor {paired('checker', 'floor'):6.3f} ms"
              " (judging)")  # fmt: skip
        rates: dict[str, list[float]] = {"checker": [], "pinned": []}
        for i in range(2):
            sides = [("checker", checked), ("pinned", pinned)]
            for label, port in sides if i % 2 == 0 else sides[::-1]:
                url = f"http://w.bench.test:{port}/{big}"
                out = sh("podman", "exec", name, "curl", "-sS", "-o", "/dev/null", "-w",
                         "%{speed_download}", url, timeout=600)  # fmt: skip
                rates[label].append(float(out) / (1 << 20))
        rc, rp = max(rates["checker"]), max(rates["pinned"])
        print(f"download of {big >> 20} MiB, best of 2, MiB/s:")
        print(f"  pinned address (before)  {rp:8.1f}")
        print(f"  through the checker      {rc:8.1f}  ratio {rc / rp:5.2f}  target >= 0.9")
        guard_pid = json.loads(EgressState(name).guard_file.read_text())["guard_pid"]
        base = _rss_kib(guard_pid)
        argv = ["podman", "exec", "-i", name, "python3", "-c", HOLD_CLIENT]
        hold = subprocess.Popen([*argv, "w.bench.test", str(checked), "256"],
                                stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
        assert hold.stdout is not None and hold.stdin is not None
        line = hold.stdout.readline().strip()
        held = _rss_kib(guard_pid)
        threads = len(os.listdir(f"/proc/{guard_pid}/task"))
        hold.stdin.write("\n")
        hold.stdin.close()
        hold.wait(timeout=60)
        print(f"256 connections held ({line}): guard RSS {base} KiB idle -> {held} KiB, "
              f"{threads} threads, {(held - base) / 256:.0f} KiB per connection")  # fmt: skip
    finally:
        subprocess.run(["podman", "rm", "-f", "-t", "0", name], capture_output=True)
        guard.detach(name)
        web.terminate()
        web.wait()


def _rss_kib(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    return 0


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--queries", type=int, default=200)
    ap.add_argument("--runs", type=int, default=7)
    ap.add_argument(
        "--part", choices=("all", "dns", "startup", "connect"), default="all",
        help="what to measure",
    )
    ap.add_argument("--connections", type=int, default=400)
    ap.add_argument("--download-mib", type=int, default=1024)
    ap.add_argument(
        "--image", default=os.environ.get("LINPODX_TEST_IMAGE", "localhost/linpodx-test/debian:12")
    )
    args = ap.parse_args()
    if 4 * args.queries > 10000:
        ap.error("--queries: at most 2500 (4 cold cases of new names must fit the wildcard budget)")
    state = tempfile.mkdtemp(prefix="linpodx-bench-state-")
    os.environ["LINPODX_STATE_DIR"] = state
    up = subprocess.Popen(
        [sys.executable, "-c", UPSTREAM, host_ip()], stdout=subprocess.PIPE, text=True
    )
    try:
        assert up.stdout is not None
        port = int(up.stdout.readline())
        if args.part in ("all", "dns"):
            print(f"name resolution, {args.queries} queries each, median ms:")
            print(f"  {'case':34} {'direct':>8} {'resolver':>9} {'ratio':>6}  target <= 1.3")
            for label, d, r in bench_resolution(args.image, args.queries, port):
                print(f"  {label:34} {d:8.3f} {r:9.3f} {r / d:6.2f}")
            print("  floors: a relay on the host in front of the same upstream, cold names")
            for label, d, r in bench_floors(args.queries, port):
                print(f"  {label:34} {d:8.3f} {r:9.3f} {r / d:6.2f}")
        if args.part in ("all", "connect"):
            bench_connections(args.image, port, args.connections, args.download_mib << 20)
        if args.part in ("dns", "connect"):
            return 0
        p, f, u = bench_run(args.image, args.runs, port)
        print(f"start-up, {args.runs} alternating runs each, median s:")
        print(f"  podman run --rm (--network none)     {p:6.3f}")
        print(f"  linpodx run --rm, filtered egress    {f:6.3f}  ratio {f / p:5.2f}  target <= 1.6")
        print(f"  linpodx run --rm, no network         {u:6.3f}  ratio {u / p:5.2f}")
        print(f"  guard's own share (filtered/no net)          ratio {f / u:5.2f}")
    finally:
        up.terminate()
        up.wait()
        shutil.rmtree(state, ignore_errors=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
