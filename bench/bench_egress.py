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

Everything stays on this machine (upstream on 127.0.0.1, answers are this host's address or
198.18.0.0/15 benchmark addresses that no packet is sent to).

    python bench/bench_egress.py [--queries N] [--runs N] [--image IMAGE] [--part dns|startup]
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


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--queries", type=int, default=200)
    ap.add_argument("--runs", type=int, default=7)
    ap.add_argument(
        "--part", choices=("all", "dns", "startup"), default="all", help="what to measure"
    )
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
        if args.part == "dns":
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
