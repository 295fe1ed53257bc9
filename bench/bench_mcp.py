"""MCP bridge benchmark: round trips through `linpodx mcp attach` vs plain `podman exec -i`,
the bridge's own calls/s with durable audit, and its memory under a hostile 64 MiB line.

    python bench/bench_mcp.py                 # 300 calls each way, 5,000 in-process calls
    python bench/bench_mcp.py --calls 1000 --inproc 20000 --image localhost/linpodx-test/debian:12

Printed (one run, baselines measured in the same run; this script never fails on a target):
1. round trip: the official SDK client calls the auto-allowed `echo` tool N times through the
   bridge and N times directly (`podman exec -i` to the same server in the same container),
   alternating call by call; median per-call latency of each and their ratio (target <= 1.15).
   Floors are measured in the same alternation, each a stdlib relay process in front of
   the same `podman exec -i` with no gate (`record` alone parses and records): `bare` copies
   lines, `fsync` appends each request line to a file and fsyncs it before forwarding
   (the least any bridge pays that makes a decision record durable before it acts), `rule`
   follows the durability rule of docs/mcp.md (write, forward, fsync, hold the answer), and
   `record` adds to `rule` what no Python bridge that records every message can skip (strict
   parse, one chain record, re-serialising, each way). Their ratios show how much of the
   target is left for the bridge's own work on this machine.
2. bridge ceiling: the real Bridge with the real session chain (group commit; each decision
   record written and fsync'd before it acts, each outcome record written before the answer
   passes and fsync'd with the next record: the durability rule in docs/mcp.md) and the real
   event stream, fed through OS pipes by threads, against an in-process responder that answers
   at once; calls/s with 1 call in flight and with 64 in flight (target >= 2,000), next to raw
   `write + fsync` on the same disk (a lone caller pays one fsync per call).
3. the bridge's own time per call: the SDK's call and answer handed to the real Bridge and
   chain in one thread (fsync a no-op, no pipes), warm and after 4 ms idle before each call
   (as the round trip's bridge idles while the other paths take their turns).
4. memory: peak RSS (VmHWM) of the bridge process before and after a 64 MiB line (refused).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
SERVER_SRC = HERE.parent / "tests" / "servers" / "mcp_test_server.py"
SERVER_PATH = "/tmp/server.py"
TARGET_RATIO = 1.15
TARGET_ADDED_MS = 0.2
"""Added latency per call (fast server) over the stdlib relay that follows the same rule."""
TARGET_OVER_FLOOR = 0.10
"""Proposed: the round trip's ratio at most this over the `records` floor's (issue 23's 1.15 is
below what a Python bridge that keeps linpodx's records needs, measured in the same run)."""
TARGET_CALLS = 2_000
TARGET_ONE = 0.8
"""1-in-flight calls/s, as a share of the raw write+fsync rate (issue 23)."""

PROFILE = """\
version: 1
name: bench-mcp
mcp_policy:
  - method: tools/call
    tool_name: echo
    decision: auto_allow
"""


def setup(state: Path, image: str) -> str:
    """Apply the bench profile and start a linpodx container running nothing but sleep."""
    from linpodx.profile import store

    prof = state / "bench-mcp.yml"
    prof.write_text(PROFILE)
    store.apply(prof)
    name = f"lpx-bench-{uuid.uuid4().hex[:8]}"
    subprocess.run(
        [
            sys.executable,
            "-m",
            "linpodx",
            "run",
            "-d",
            "--name",
            name,
            "--profile",
            "bench-mcp",
            "--image",
            image,
            "--",
            "sleep",
            "infinity",
        ],
        check=True,
        capture_output=True,
        timeout=300,
    )
    subprocess.run(
        ["podman", "cp", str(SERVER_SRC), f"{name}:{SERVER_PATH}"],
        check=True,
        capture_output=True,
        timeout=60,
    )
    return name


FLOOR_RELAY = """
import os, subprocess, sys, threading
mode, log, argv = sys.argv[1], sys.argv[2], sys.argv[3:]
child = subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE)
fd = os.open(log, os.O_RDWR | os.O_CREAT | os.O_APPEND, 0o600)
cv = threading.Condition()
written = synced = 0
held = mode in ("rule", "record", "records")
recording = mode in ("record", "records")
if recording:
    import fcntl
    from linpodx.approvals.store import request_digest
    from linpodx.audit.core import build_line
    from linpodx.mcp.jsonrpc import parse, serialize
    tail = [0, "0" * 64, ""]
    last = [b""]
    def data_of(msg, side):
        if mode == "record":
            return {"dir": side, "id": getattr(msg, "id", None),
                    "method": getattr(msg, "method", None)}
        # `records`: the fields linpodx's records of an auto-allowed call carry (a decision
        # record, an outcome record), the arguments' digest among them; what the gate decides
        # and what it keeps in flight are constants here.
        if side == "client":
            data = {"dir": "client", "kind": "request", "id": msg.id, "method": msg.method,
                    "tool": msg.tool_name, "decision": "auto_allow", "rule": 0,
                    "reason": f"rule 0 ({msg.method} {msg.tool_name}): auto_allow"}
            if msg.method == "tools/call":
                data["args_sha256"] = request_digest((msg.params or {}).get("arguments", {}))
            return data
        return {"dir": "server", "kind": "response", "id": msg.id, "method": "tools/call",
                "tool": "echo", "status": "ok", "duration_ms": 0}
    def record(line, side):
        # What no Python bridge that records each message can skip: the strict parse, one
        # chain record (canonical encoding, hash, write), re-serialising what it passes on;
        # `records` also takes the log's lock around each append and proves its tail (the
        # file still ends in the line it wrote last), as any writer sharing the log must.
        msg = parse(line.rstrip(b"\\n"))
        data = data_of(msg, side)
        with cv:
            if mode == "records":
                fcntl.flock(fd, fcntl.LOCK_EX)
                size = os.fstat(fd).st_size
                if last[0] and os.pread(fd, len(last[0]), size - len(last[0])) != last[0]:
                    raise SystemExit("the floor's log changed under it")
            typ = "mcp.response" if mode == "records" and side == "server" else "mcp.request"
            h, ts, rec, _ = build_line(tail[0], tail[1], tail[2], typ, data, None)
            tail[:] = [tail[0] + 1, h, ts]
            os.write(fd, rec)
            if mode == "records":
                last[0] = rec
                fcntl.flock(fd, fcntl.LOCK_UN)
        return serialize(msg.raw)
def down():
    for line in child.stdout:
        if recording:
            line = record(line, "server")
        if held:
            with cv:  # nothing reaches the client before the requests' records are durable
                while synced < written:
                    cv.wait()
        os.write(1, line)
threading.Thread(target=down, daemon=True).start()
for line in sys.stdin.buffer:
    if mode == "fsync":
        os.write(fd, line)
        os.fsync(fd)
    elif held:
        if recording:
            line = record(line, "client")
        else:
            os.write(fd, line)
        with cv:
            written += 1
            n = written
    child.stdin.write(line)
    child.stdin.flush()
    if held:
        os.fsync(fd)  # after the forward: it overlaps the server's work
        with cv:
            synced = max(synced, n)
            cv.notify_all()
child.stdin.close()
child.wait()
"""
"""A relay with nothing but the hop: `bare` copies lines; `fsync` also writes and fsyncs each
request line before forwarding it (the old durability rule); `rule` writes each request line
before forwarding it and fsyncs it after, and holds what goes to the client until every
request written so far is fsync'd (the durability rule of docs/mcp.md, with no gate);
`record` is `rule` plus, for each message either way, linpodx's strict parse, one chain record
(`audit.core.build_line`) and re-serialising: the floor of a Python bridge that parses and
records every message, without the gate, its bookkeeping or its threads. `records` is `record`
with the records linpodx writes for an auto-allowed call (their fields, the arguments' digest)
and the log's lock and tail proof around each append: the floor of a Python bridge that keeps
linpodx's audit log, without the gate's decisions and bookkeeping."""

FAST_SERVER = """
import json, sys
out = sys.stdout.buffer
for line in sys.stdin.buffer:
    msg = json.loads(line)
    if "id" in msg and "method" in msg:
        text = msg.get("params", {}).get("arguments", {}).get("text", "")
        answer = {"jsonrpc": "2.0", "id": msg["id"],
                  "result": {"content": [{"type": "text", "text": text}]}}
        out.write(json.dumps(answer).encode() + b"\\n")
        out.flush()
"""
"""A stdlib server that answers a tools/call at once (~0.1 ms): what is left is the path."""

PATHS = ("via", "direct", "bare", "fsync", "rule", "record", "records")
FAST_PATHS = ("via", "direct", "bare", "rule", "record", "records")


def _floor_argv(mode: str, state: Path, exec_argv: list[str]) -> list[str]:
    log = str(state / f"floor-{mode}.log")
    return [sys.executable, "-c", FLOOR_RELAY, mode, log, *exec_argv]


async def round_trips(name: str, calls: int, state: Path) -> dict[str, list[float]]:
    """Per-call seconds on each path, the paths taking turns call by call."""
    from mcp import Client, StdioServerParameters
    from mcp.client.stdio import stdio_client

    exec_argv = ["podman", "exec", "-i", name, "python3", SERVER_PATH]
    attach = ["-m", "linpodx", "mcp", "attach", "--container", name, "--", "python3", SERVER_PATH]
    env = dict(os.environ)
    params = {
        "via": StdioServerParameters(command=sys.executable, args=attach, env=env),
        "direct": StdioServerParameters(command=exec_argv[0], args=exec_argv[1:], env=env),
    }
    for mode in ("bare", "fsync", "rule", "record", "records"):
        argv = _floor_argv(mode, state, exec_argv)
        params[mode] = StdioServerParameters(command=argv[0], args=argv[1:], env=env)
    devnull = open(os.devnull, "w")
    times: dict[str, list[float]] = {p: [] for p in PATHS}
    async with contextlib.AsyncExitStack() as stack:
        clients = {
            p: await stack.enter_async_context(Client(stdio_client(params[p], errlog=devnull)))
            for p in PATHS
        }
        for client in clients.values():  # warm up every path
            for _ in range(5):
                await client.call_tool("echo", {"text": "warm"})
        for i in range(calls):
            k = i % len(PATHS)  # who goes first rotates, so no path always follows another
            for p in PATHS[k:] + PATHS[:k]:
                t = time.perf_counter()
                r = await clients[p].call_tool("echo", {"text": f"call-{i}"})
                times[p].append(time.perf_counter() - t)
                if r.is_error:
                    raise SystemExit(f"echo failed on the {p} path: {r}")
    devnull.close()
    return times


def fast_round_trips(name: str, calls: int, state: Path) -> dict[str, list[float]]:
    """Per-call seconds with a raw client and a server that answers at once (`FAST_SERVER`),
    the paths taking turns call by call: what each path adds is its median minus direct's."""
    server = ["python3", "-c", FAST_SERVER]
    exec_argv = ["podman", "exec", "-i", name, *server]
    argvs = {
        "via": [sys.executable, "-m", "linpodx", "mcp", "attach", "--container", name, "--",
                *server],
        "direct": exec_argv,
        **{m: _floor_argv(m, state, exec_argv) for m in FAST_PATHS[2:]},
    }  # fmt: skip
    procs = {
        p: subprocess.Popen(
            argvs[p], stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL
        )
        for p in FAST_PATHS
    }
    times: dict[str, list[float]] = {p: [] for p in FAST_PATHS}

    def call(p: str, i: int) -> float:
        proc = procs[p]
        assert proc.stdin is not None and proc.stdout is not None
        line = json.dumps(
            {
                "jsonrpc": "2.0",
                "id": i,
                "method": "tools/call",
                "params": {"name": "echo", "arguments": {"text": f"call-{i}"}},
            }
        ).encode()
        t = time.perf_counter()
        proc.stdin.write(line + b"\n")
        proc.stdin.flush()
        answer = proc.stdout.readline()
        took = time.perf_counter() - t
        if f"call-{i}".encode() not in answer or b'"isError"' in answer:
            raise SystemExit(f"echo failed on the {p} path: {answer[:300]!r}")
        return took

    try:
        for i in range(20):  # warm up every path
            for p in FAST_PATHS:
                call(p, i)
        for i in range(calls):
            k = i % len(FAST_PATHS)
            for p in FAST_PATHS[k:] + FAST_PATHS[:k]:
                times[p].append(call(p, 1000 + i))
    finally:
        for proc in procs.values():
            with contextlib.suppress(OSError):
                assert proc.stdin is not None
                proc.stdin.close()
            try:
                proc.wait(30)
            except subprocess.TimeoutExpired:
                proc.kill()
    return times


class Relay:
    """Baseline: the same threads and pipes, forwarding raw lines (no parsing, gate or audit)."""

    def __init__(self, to_client: Any, to_server: Any) -> None:
        self.to_client, self.to_server = to_client, to_server

    def on_client_frame(self, frame: Any, more: bool = False) -> None:
        self.to_server(frame.data + b"\n")

    def on_server_frame(self, frame: Any, more: bool = False) -> None:
        self.to_client(frame.data + b"\n")

    def drain(self) -> None:
        pass


def bridge_ceiling(n: int, window: int, bare: bool = False, fsync: bool = True) -> float:
    """calls/s through the real Bridge + real chain + pipes, with `window` calls in flight
    (`bare`: through the Relay baseline instead; `fsync=False`: the chain's fsync a no-op,
    what the bridge's own work allows)."""
    if not fsync:
        real = os.fsync
        os.fsync = lambda _fd: None  # (this process only; put back below)
        try:
            return bridge_ceiling(n, window, bare)
        finally:
            os.fsync = real
    from linpodx.audit.chain import session_chain
    from linpodx.ids import new_id
    from linpodx.mcp.auditlog import GroupCommitChain
    from linpodx.mcp.bridge import Bridge
    from linpodx.mcp.framing import FrameReader
    from linpodx.profile.model import Decision, McpRule, Profile

    prof = Profile(name="b", mcp_policy=(McpRule("tools/call", Decision.AUTO_ALLOW, "echo"),))
    sid = new_id("sess")
    chain = GroupCommitChain(session_chain(sid, "0" * 64))  # as `mcp attach` uses it
    c_r, c_w = os.pipe()  # client -> bridge
    s_r, s_w = os.pipe()  # bridge -> server
    r_r, r_w = os.pipe()  # server -> bridge
    o_r, o_w = os.pipe()  # bridge -> client

    def write_all(fd: int, data: bytes) -> None:
        view = memoryview(data)
        while view:
            view = view[os.write(fd, view) :]

    bridge: Any = Bridge(
        profile=prof,
        session_id=sid,
        chain=chain,
        to_client=lambda d: write_all(o_w, d),
        to_server=lambda d: write_all(s_w, d),
        pipeline=True,
    )
    if bare:
        bridge = Relay(lambda d: write_all(o_w, d), lambda d: write_all(s_w, d))
    sem = threading.Semaphore(window)

    def client_in() -> None:
        r = FrameReader(c_r, 1 << 20)
        while (f := r.read_frame()) is not None:
            bridge.on_client_frame(f, r.has_more())

    def server() -> None:
        r = FrameReader(s_r, 1 << 20)
        while (f := r.read_frame()) is not None:
            msg = json.loads(f.data)  # type: ignore[union-attr]
            write_all(
                r_w,
                json.dumps(
                    {
                        "jsonrpc": "2.0",
                        "id": msg["id"],
                        "result": {"content": [{"type": "text", "text": "echo"}]},
                    }
                ).encode()
                + b"\n",
            )

    def server_out() -> None:
        r = FrameReader(r_r, 1 << 20)
        while (f := r.read_frame()) is not None:
            bridge.on_server_frame(f, r.has_more())

    done = threading.Event()

    def client_out() -> None:
        r = FrameReader(o_r, 1 << 20)
        got = 0
        while (f := r.read_frame()) is not None:
            if b'"isError"' in f.data or b'"error"' in f.data:  # type: ignore[union-attr]
                raise SystemExit(f"bench call was not allowed: {f.data[:200]!r}")  # type: ignore[union-attr]
            got += 1
            sem.release()
            if got == n:
                done.set()
                return

    for fn in (client_in, server, server_out, client_out):
        threading.Thread(target=fn, daemon=True).start()
    t = time.perf_counter()
    for i in range(n):
        sem.acquire()
        write_all(
            c_w,
            json.dumps(
                {
                    "jsonrpc": "2.0",
                    "id": i,
                    "method": "tools/call",
                    "params": {"name": "echo", "arguments": {"text": "hi"}},
                }
            ).encode()
            + b"\n",
        )
    done.wait()
    rate = n / (time.perf_counter() - t)
    bridge.drain()
    chain.close()
    return rate


META = (
    '"_meta":{"io.modelcontextprotocol/protocolVersion":"2026-07-28",'
    '"io.modelcontextprotocol/clientInfo":{"name":"mcp","version":"0.1.0"},'
    '"io.modelcontextprotocol/clientCapabilities":{}}'
)
SDK_CALL = (
    '{"jsonrpc":"2.0","id":%d,"method":"tools/call",'
    '"params":{"name":"echo","arguments":{"text":"c%d"},' + META + "}}"
)
SDK_ANSWER = (
    '{"jsonrpc":"2.0","id":%d,"result":{"content":[{"text":"echo:c%d","type":"text"}],'
    '"isError":false,"resultType":"complete","structuredContent":{"result":"echo:c%d"},'
    '"_meta":{"io.modelcontextprotocol/serverInfo":{"name":"linpodx-test-server","version":""}}}}'
)
"""A call and its answer as the official SDKs write them (2026-07-28), for `cpu_per_call`."""


def cpu_per_call(n: int, gap: float = 0.0) -> tuple[float, float, float]:
    """The bridge's own time per call in µs, medians: (client side, of it before the forward,
    server side). One thread, the real Bridge and chain, the chain's fsync a no-op, no pipes:
    the SDK's messages handed in as frames. `gap`: seconds idle before each call (what the
    round trip's bridge sees while the other paths take their turns)."""
    from linpodx.audit.chain import session_chain
    from linpodx.ids import new_id
    from linpodx.mcp.auditlog import GroupCommitChain
    from linpodx.mcp.bridge import Bridge
    from linpodx.mcp.framing import Line
    from linpodx.profile.model import Decision, McpRule, Profile

    real = os.fsync
    os.fsync = lambda _fd: None  # (this process only; put back below)
    try:
        prof = Profile(name="b", mcp_policy=(McpRule("tools/call", Decision.AUTO_ALLOW, "echo"),))
        sid = new_id("sess")
        chain = GroupCommitChain(session_chain(sid, "0" * 64))
        forwarded = [0.0]

        def to_server(_data: bytes) -> None:
            forwarded[0] = time.perf_counter()

        bridge = Bridge(
            profile=prof, session_id=sid, chain=chain, to_client=lambda _d: None,
            to_server=to_server, pipeline=True,
        )  # fmt: skip
        client: list[float] = []
        before: list[float] = []
        server: list[float] = []
        for i in range(200 + n):
            call, answer = (SDK_CALL % (i, i)).encode(), (SDK_ANSWER % (i, i, i)).encode()
            if gap and i >= 200:
                time.sleep(gap)
            t0 = time.perf_counter()
            bridge.on_client_frame(Line(call))
            t1 = time.perf_counter()
            bridge.on_server_frame(Line(answer))
            t2 = time.perf_counter()
            if i >= 200:  # (the first 200 warm it up)
                client.append(t1 - t0)
                before.append(forwarded[0] - t0)
                server.append(t2 - t1)
        bridge.drain()
        chain.close()
    finally:
        os.fsync = real
    return tuple(statistics.median(x) * 1e6 for x in (client, before, server))  # type: ignore[return-value]


def raw_fsync_rate(directory: Path, n: int = 500) -> float:
    path = directory / "raw-fsync.bin"
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
    line = b"x" * 330 + b"\n"
    t = time.perf_counter()
    for _ in range(n):
        os.write(fd, line)
        os.fsync(fd)
    dt = time.perf_counter() - t
    os.close(fd)
    path.unlink()
    return n / dt


def hwm_kib(pid: int) -> tuple[int, int]:
    rss = hwm = 0
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            rss = int(line.split()[1])
        elif line.startswith("VmHWM:"):
            hwm = int(line.split()[1])
    return rss, hwm


def hostile_line(name: str) -> tuple[tuple[int, int], tuple[int, int], bool]:
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "linpodx",
            "mcp",
            "attach",
            "--container",
            name,
            "--",
            "python3",
            SERVER_PATH,
        ],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
    )
    assert proc.stdin is not None and proc.stdout is not None
    proc.stdin.write(b'{"jsonrpc":"2.0","id":1,"method":"ping"}\n')
    proc.stdin.flush()
    proc.stdout.readline()
    before = hwm_kib(proc.pid)
    block = b"A" * (1 << 20)
    proc.stdin.write(b'{"jsonrpc":"2.0","id":2,"method":"ping","params":{"x":"')
    for _ in range(64):
        proc.stdin.write(block)
    proc.stdin.write(b'"}}\n{"jsonrpc":"2.0","id":3,"method":"ping"}\n')
    proc.stdin.flush()
    refused = json.loads(proc.stdout.readline())
    alive = json.loads(proc.stdout.readline())
    after = hwm_kib(proc.pid)
    proc.stdin.close()
    proc.wait(60)
    ok = refused.get("id") is None and "error" in refused and alive.get("id") == 3
    return before, after, ok


def main() -> int:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--calls", type=int, default=300)
    ap.add_argument("--inproc", type=int, default=5000)
    ap.add_argument(
        "--image", default=os.environ.get("LINPODX_TEST_IMAGE", "localhost/linpodx-test/debian:12")
    )
    ap.add_argument(
        "--keep-state", action="store_true", help="keep the state dir (to `audit verify` it)"
    )
    args = ap.parse_args()
    state = Path(tempfile.mkdtemp(prefix="linpodx-bench-mcp-", dir=os.environ.get("BENCH_DIR")))
    os.environ["LINPODX_STATE_DIR"] = str(state)
    print(f"state dir: {state} (load average {os.getloadavg()[0]:.2f} on {os.cpu_count()} CPUs)")
    name = setup(state, args.image)
    try:
        times = asyncio.run(round_trips(name, args.calls, state))
        med = {p: statistics.median(times[p]) for p in PATHS}
        mv, mr = med["via"], med["direct"]
        ratio = mv / mr
        print(f"round trip ({args.calls} SDK calls each, taking turns):")
        print(f"  via linpodx mcp attach: median {mv * 1000:.2f} ms")
        print(f"  direct podman exec -i:  median {mr * 1000:.2f} ms")
        print(
            f"  ratio: {ratio:.2f} (target <= {TARGET_RATIO}) "
            f"{'OK' if ratio <= TARGET_RATIO else 'MISSED'}"
        )
        print("  floors (stdlib relay in front of the same podman exec -i, no gate at all):")
        print(
            f"    bare relay:              median {med['bare'] * 1000:.2f} ms, "
            f"ratio {med['bare'] / mr:.2f}"
        )
        print(
            f"    relay + fsync before forwarding (the old rule): median "
            f"{med['fsync'] * 1000:.2f} ms, ratio {med['fsync'] / mr:.2f}"
        )
        print(
            f"    relay + the durability rule (write, forward, fsync, hold the answer): median "
            f"{med['rule'] * 1000:.2f} ms, ratio {med['rule'] / mr:.2f}"
        )
        print(
            f"    the rule + strict parse, a chain record and re-serialising per message (the "
            f"floor of a Python bridge): median {med['record'] * 1000:.2f} ms, ratio "
            f"{med['record'] / mr:.2f}"
        )
        print(
            f"    the same with linpodx's records (their fields, the arguments' digest, the "
            f"log's lock and tail proof): median {med['records'] * 1000:.2f} ms, ratio "
            f"{med['records'] / mr:.2f}"
        )
        gap = ratio - med["records"] / mr
        print(
            f"  via over the `records` floor: +{gap:.2f} (proposed target <= "
            f"+{TARGET_OVER_FLOOR:.2f}) {'OK' if gap <= TARGET_OVER_FLOOR else 'MISSED'}; over "
            f"the `record` floor: +{ratio - med['record'] / mr:.2f}"
        )
        fast = fast_round_trips(name, args.calls, state)
        fmed = {p: statistics.median(fast[p]) for p in FAST_PATHS}
        added = {p: (fmed[p] - fmed["direct"]) * 1000 for p in FAST_PATHS}
        print(f"added latency per call, raw client, a server answering at once ({args.calls}):")
        print(f"  direct podman exec -i: median {fmed['direct'] * 1000:.2f} ms")
        labels = (
            ("bare", "bare relay"),
            ("rule", "relay + the rule"),
            ("record", "+ parse and records"),
            ("records", "+ linpodx's records"),
            ("via", "linpodx"),
        )
        for p, label in labels:
            print(f"  {label + ':':22s} median {fmed[p] * 1000:.2f} ms, +{added[p]:.2f} ms")
        over = added["via"] - added["rule"]
        print(
            f"  linpodx over the rule's relay: +{over:.2f} ms (target <= +{TARGET_ADDED_MS}) "
            f"{'OK' if over <= TARGET_ADDED_MS else 'MISSED'}"
        )
        print(
            f"  linpodx over the parse-and-record relay (the gate, its bookkeeping, its "
            f"threads): +{added['via'] - added['record']:.2f} ms"
        )
        # One call in flight against the disk and against the bridge's own work, taking turns
        # (the disk's fsync rate moves by 3x within a minute on a shared machine): medians.
        m = max(500, args.inproc // 5)
        turns = [(raw_fsync_rate(state), bridge_ceiling(m, 1), bridge_ceiling(m, 1, fsync=False))
                 for _ in range(3)]  # fmt: skip
        fs, seq, nosync = (statistics.median(t[i] for t in turns) for i in range(3))
        floor = 1 / (1 / fs + 1 / nosync)  # one fsync per call plus the bridge's work, no waits
        par = bridge_ceiling(args.inproc, 64)
        bare_seq = bridge_ceiling(max(500, args.inproc // 5), 1, bare=True)
        bare_par = bridge_ceiling(args.inproc, 64, bare=True)
        print(
            "bridge ceiling (real Bridge, real chain with group commit, 2 records per call, pipes):"
        )
        print(
            f"  raw write+fsync on this disk: {fs:.0f}/s "
            f"(=> at most {fs:.0f} calls/s with 1 in flight: one fsync per call)"
        )
        print(
            f"  bare relay, same threads and pipes: {bare_seq:.0f} calls/s (1 in flight), "
            f"{bare_par:.0f} calls/s (64 in flight)"
        )
        print(
            f"  1 call in flight:   {seq:.0f} calls/s ({seq / bare_seq:.2f} of the bare relay; "
            f"{seq / fs:.2f} of raw write+fsync, target >= {TARGET_ONE}) "
            f"{'OK' if seq >= TARGET_ONE * fs else 'MISSED'}"
        )
        print(
            f"  1 call in flight, fsync a no-op (the bridge's work alone): {nosync:.0f} calls/s"
        )
        print(
            f"  floor, one fsync plus the bridge's work per call (1/(1/{fs:.0f} + 1/{nosync:.0f})):"
            f" {floor:.0f} calls/s; 1 in flight is {seq / floor:.2f} of it (target >= "
            f"{TARGET_ONE}) {'OK' if seq >= TARGET_ONE * floor else 'MISSED'}"
        )
        print("  turns (raw fsync/s, 1 in flight, fsync a no-op): " + ", ".join(
            f"{a:.0f}/{b:.0f}/{c:.0f}" for a, b, c in turns))
        print(
            f"  64 calls in flight: {par:.0f} calls/s ({par / bare_par:.2f} of the bare relay; "
            f"target >= {TARGET_CALLS}) "
            f"{'OK' if par >= TARGET_CALLS else 'MISSED'}"
        )
        work = (1 / nosync - 1 / bare_seq) * 1000
        print(
            f"added latency floor: the bridge's own work per call (fsync a no-op, over the bare "
            f"relay, in-process): {work:.2f} ms; linpodx over the rule's relay: +{over:.2f} ms "
            f"(proposed target <= that work + {TARGET_ADDED_MS} ms) "
            f"{'OK' if over <= work + TARGET_ADDED_MS else 'MISSED'}"
        )
        print(
            "the bridge's own time per call (in-process, one thread, the SDK's messages, fsync a "
            "no-op; medians):"
        )
        for gap, label in ((0.0, "warm"), (0.004, "after 4 ms idle before each call")):
            c, f, sv = cpu_per_call(2000 if not gap else 300, gap)
            print(
                f"  {label}: {c:.1f} us client side ({f:.1f} before the forward), "
                f"{sv:.1f} us server side, {c + sv:.1f} us a call"
            )
        before, after, ok = hostile_line(name)
        print("memory under a hostile 64 MiB line (profile bound 4 MiB):")
        print(f"  bridge RSS before: {before[0] / 1024:.1f} MiB (peak {before[1] / 1024:.1f} MiB)")
        print(
            f"  bridge RSS after:  {after[0] / 1024:.1f} MiB (peak {after[1] / 1024:.1f} MiB); "
            f"line refused and bridge still answering: {ok}"
        )
    finally:
        subprocess.run(["podman", "rm", "-f", "-t", "0", name], capture_output=True, timeout=120)
        if args.keep_state:
            print(f"state kept (audit chains of the sessions): {state}")
        else:
            shutil.rmtree(state, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
