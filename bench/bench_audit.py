"""Audit chain throughput: durable appends and verification, against raw limits measured in
the same run on the same machine.

    python bench/bench_audit.py                      # 1,000,000-record verify, 5,000 appends
    python bench/bench_audit.py --records 100000 --appends 2000

Printed:
- append: records/s of `Chain.append` (one writer, flock + fsync per record), next to raw
  `write(200-byte line) + fsync` per line in the same directory. Ratio = our cost vs the disk's.
  Floor: what a lone append must do at least, since it runs in its own process and the file
  is not kept open between records: open + flock + write + fsync + close, per line.
- verify: records/s of `verify_file` over a log of --records records, next to the raw
  "sha256 + json.loads" of the same lines in memory (no I/O, no checks), single process.
  Floor: the same plus re-encoding each parsed line (what proves it canonical, the check the
  format needs beyond parsing), single process; the verifier may use every CPU.
Targets (from the issue): append >= 5,000/s, verify >= 300,000/s. They are printed with the
figures; this script does not fail on them (never timed assertions).
"""

from __future__ import annotations

import argparse
import fcntl
import hashlib
import json
import os
import sys
import tempfile
import time
from pathlib import Path

from linpodx.audit import walk
from linpodx.audit.chain import Chain, verify_file
from linpodx.audit.core import DOMAIN, encode_data, encode_record, encode_sorted
from linpodx.ids import new_id

TARGET_APPEND = 5_000
TARGET_VERIFY = 300_000


def sample_data(i: int) -> dict[str, object]:
    """A record shaped like an MCP gate decision (about 330 bytes on disk)."""
    return {
        "method": "tools/call",
        "tool": "read_file",
        "decision": "auto_allow",
        "rule": 2,
        "request_id": i,
        "args_sha256": hashlib.sha256(str(i).encode()).hexdigest(),
    }


ROUNDS = 10
"""The appends are timed in this many interleaved rounds (raw, floor, ours, raw, …): on a shared
machine the disk's fsync cost drifts by several times within a run, and measuring each kind in
one block would compare different disks."""


def bench_append(workdir: Path, n: int) -> tuple[float, float, float]:
    """(our appends/s, raw write+fsync lines/s, floor open+flock+write+fsync+close lines/s)."""
    line = b"x" * 199 + b"\n"
    raw_fd = os.open(workdir / "raw.log", os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
    floor_path = workdir / "floor.log"
    os.close(os.open(floor_path, os.O_WRONLY | os.O_CREAT, 0o600))
    chain = Chain(workdir / "append.jsonl")
    chain.append("mcp.decision", sample_data(0))  # the file exists, as for every later append
    spent = {"raw": 0.0, "floor": 0.0, "ours": 0.0}
    per = max(1, n // ROUNDS)
    for r in range(ROUNDS):
        t0 = time.perf_counter()
        for _ in range(per):
            os.write(raw_fd, line)
            os.fsync(raw_fd)
        t1 = time.perf_counter()
        for _ in range(per):
            fd = os.open(floor_path, os.O_RDWR | os.O_APPEND | os.O_CLOEXEC)
            fcntl.flock(fd, fcntl.LOCK_EX)
            os.write(fd, line)
            os.fsync(fd)
            os.close(fd)
        t2 = time.perf_counter()
        for i in range(per):
            chain.append("mcp.decision", sample_data(r * per + i))
        t3 = time.perf_counter()
        spent["raw"] += t1 - t0
        spent["floor"] += t2 - t1
        spent["ours"] += t3 - t2
    os.close(raw_fd)
    done = per * ROUNDS
    return done / spent["ours"], done / spent["raw"], done / spent["floor"]


def build_log(path: Path, n: int) -> None:
    """Write an n-record valid chain fast (same encoder as Chain.append, no fsync per line)."""
    prev = "0" * 64
    ts = "2026-01-01T00:00:00.000000Z"
    with open(path, "wb", buffering=1 << 20) as f:
        for i in range(n):
            head, after = encode_record(
                i,
                ts,
                "mcp.decision",
                prev,
                encode_data(sample_data(i))[0],
                new_id("log") if i == 0 else None,
            )
            h = hashlib.sha256(DOMAIN + head + after).hexdigest()
            f.write(head + b',"hash":"' + h.encode() + b'"' + after + b"\n")
            prev = h


def bench_verify(path: Path, n: int) -> tuple[float, float, float, float, float]:
    """(verify records/s, one-process verify records/s, raw sha256+json records/s, floor
    sha256+json+re-encode records/s, MB)."""
    data = path.read_bytes()
    lines = data.splitlines()
    t0 = time.perf_counter()
    for line in lines:
        json.loads(line)
        hashlib.sha256(DOMAIN + line).digest()
    raw = len(lines) / (time.perf_counter() - t0)
    t0 = time.perf_counter()
    for line in lines:
        text = line.decode()
        _ = encode_sorted(json.loads(text)) == text
        hashlib.sha256(DOMAIN + line).digest()
    floor = len(lines) / (time.perf_counter() - t0)
    del lines, data

    t0 = time.perf_counter()
    report = verify_file(path)
    ours = n / (time.perf_counter() - t0)
    if not (report.ok and report.events == n):
        sys.exit(f"bench: verify failed: {report}")
    t0 = time.perf_counter()
    single = walk._verify(path, "0" * 64, True)  # the one-process reference verifier
    one = n / (time.perf_counter() - t0)
    if single != report:
        sys.exit("bench: parallel and one-process verifiers disagree")
    return ours, one, raw, floor, path.stat().st_size / 1e6


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--records", type=int, default=1_000_000, help="records in the verified log")
    ap.add_argument("--appends", type=int, default=5_000, help="durable appends to time")
    ap.add_argument("--dir", type=Path, default=None, help="work dir (default: a temp dir)")
    args = ap.parse_args()

    with tempfile.TemporaryDirectory(dir=args.dir, prefix="linpodx-bench-") as tmp:
        work = Path(tmp)
        print(f"cpus:    {os.cpu_count()}")
        ours, raw, floor = bench_append(work, args.appends)
        print(
            f"append:  {ours:12,.0f} records/s (fsync each)   raw write+fsync {raw:12,.0f} lines/s"
            f"   ratio {ours / raw:5.2f}   target {TARGET_APPEND:,}"
            f" {'met' if ours >= TARGET_APPEND else 'NOT met'}"
        )
        print(
            f"floor:   open+flock+write+fsync+close {floor:12,.0f} lines/s   ratio to raw "
            f"{floor / raw:5.2f}   append ratio to floor {ours / floor:5.2f}"
        )
        log = work / "verify.jsonl"
        t0 = time.perf_counter()
        build_log(log, args.records)
        print(f"built:   {args.records:,} records in {time.perf_counter() - t0:.1f} s")
        ours, one, raw, floor, mb = bench_verify(log, args.records)
        print(
            f"verify:  {ours:12,.0f} records/s ({mb:.0f} MB)   raw sha256+json {raw:12,.0f} rec/s"
            f"   ratio {ours / raw:5.2f}   target {TARGET_VERIFY:,}"
            f" {'met' if ours >= TARGET_VERIFY else 'NOT met'}"
        )
        print(f"verify1: {one:12,.0f} records/s (one process)   ratio to raw {one / raw:5.2f}")
        print(
            f"floor:   sha256+json+re-encode {floor:12,.0f} rec/s (one process)   ratio to raw "
            f"{floor / raw:5.2f}   verify1 ratio to floor {one / floor:5.2f}"
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
