"""Threat 5 for the audit chain: concurrent appenders, kill -9 mid-append, full or unwritable
disks. Real processes, real signals, real files; no mocks."""

from __future__ import annotations

import json
import os
import random
import shutil
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from linpodx.audit.chain import Chain, verify_file
from linpodx.errors import AuditError

APPENDER = textwrap.dedent(
    """
    import sys
    from pathlib import Path
    from linpodx.audit.chain import Chain
    path, who, count, size = Path(sys.argv[1]), sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
    c = Chain(path)
    print("ready", flush=True)
    i = 0
    while count < 0 or i < count:
        c.append("test.event", {"who": who, "i": i, "pad": "x" * size})
        i += 1
    """
)


def spawn(path: Path, who: str, count: int, size: int = 0) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-c", APPENDER, str(path), who, str(count), str(size)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


@pytest.mark.slow
def test_eight_processes_thousand_appends_each(tmp_path: Path) -> None:
    path = tmp_path / "a.jsonl"
    procs = [spawn(path, f"w{k}", 1000) for k in range(8)]
    for p in procs:
        _out, err = p.communicate(timeout=900)
        assert p.returncode == 0, err
    report = verify_file(path)
    assert report.ok and not report.torn_tail, report.reason
    assert report.events == 8000
    records = [json.loads(line) for line in path.read_bytes().splitlines()]
    assert [r["seq"] for r in records] == list(range(8000))
    per_writer: dict[str, list[int]] = {}
    for r in records:
        per_writer.setdefault(r["data"]["who"], []).append(r["data"]["i"])
    # Every writer's 1000 records are there, each once, in that writer's order.
    assert sorted(per_writer) == [f"w{k}" for k in range(8)]
    for seqs in per_writer.values():
        assert seqs == list(range(1000))


@pytest.mark.slow
@pytest.mark.parametrize("size", [0, 600_000])
def test_kill_9_during_append_then_clean_recovery(tmp_path: Path, size: int) -> None:
    """SIGKILL an appender at random moments: at most a torn tail, repaired by the next append.

    With 600 kB records the kill often lands inside write(2), which the kernel then cuts
    short at a page boundary: a real torn line.
    """
    path = tmp_path / "a.jsonl"
    rng = random.Random(1234 + size)  # noqa: S311 - kill timing, not cryptography
    torn_seen = 0
    for _round in range(6):
        p = spawn(path, "victim", -1, size)
        assert p.stdout is not None
        assert p.stdout.readline().strip() == "ready"
        time.sleep(rng.uniform(0.05, 0.4))
        p.send_signal(signal.SIGKILL)
        p.wait(timeout=60)
        assert p.returncode == -signal.SIGKILL
        report = verify_file(path)
        assert report.ok, report.reason  # a crash never looks like a broken chain
        if report.torn_tail:
            torn_seen += 1
            assert "crash during append, not tampering" in (report.reason or "")
        before = report.events
        rec = Chain(path).append("test.after_crash", {"round": _round})
        assert rec.seq == before + (1 if report.torn_tail else 0)
        after = verify_file(path)
        assert after.ok and not after.torn_tail and after.events == rec.seq + 1
    print(f"torn lines seen: {torn_seen} of 6 kills")
    types = [json.loads(line)["type"] for line in path.read_bytes().splitlines()]
    assert types.count("audit.repair") == torn_seen
    assert types.count("test.after_crash") == 6


FSIZE_CHILD = textwrap.dedent(
    """
    import resource, signal, sys
    from pathlib import Path
    from linpodx.audit.chain import Chain
    from linpodx.errors import AuditError
    path, limit = Path(sys.argv[1]), int(sys.argv[2])
    signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # get EFBIG instead of being killed
    soft, hard = resource.getrlimit(resource.RLIMIT_FSIZE)
    resource.setrlimit(resource.RLIMIT_FSIZE, (limit, hard))
    try:
        Chain(path).append("test.big", {"pad": "y" * 5000})
    except AuditError as exc:
        print("AuditError", exc.message, sep="\\t")
    else:
        print("appended")
    """
)


def test_file_size_limit_leaves_no_partial_line(tmp_path: Path) -> None:
    """EFBIG halfway through the line (RLIMIT_FSIZE): the append fails and the file is exactly
    as it was, so the next append works and the chain verifies."""
    path = tmp_path / "a.jsonl"
    c = Chain(path)
    c.append("test.event", {"i": 0})
    c.append("test.event", {"i": 1})
    before = path.read_bytes()
    limit = len(before) + 1000  # room for part of the 5 kB record, not all of it
    out = subprocess.run(
        [sys.executable, "-c", FSIZE_CHILD, str(path), str(limit)],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert out.returncode == 0, out.stderr
    assert out.stdout.startswith("AuditError\tcould not record to the audit log"), out.stdout
    assert "File too large" in out.stdout
    assert path.read_bytes() == before
    assert c.append("test.event", {"i": 2}).seq == 2
    assert verify_file(path).ok


def test_unwritable_location_raises_audit_error(tmp_path: Path) -> None:
    blocker = tmp_path / "not-a-dir"
    blocker.write_text("x")
    with pytest.raises(AuditError, match="could not record to the audit log") as exc:
        Chain(blocker / "a.jsonl").append("test.event", {})
    assert exc.value.hint and "nothing was done" in exc.value.hint


READONLY_CHILD = textwrap.dedent(
    """
    import subprocess, sys
    from pathlib import Path
    from linpodx.audit.chain import Chain
    from linpodx.errors import AuditError
    d = Path(sys.argv[1])
    subprocess.run(["mount", "--make-rprivate", "/"], check=True)
    subprocess.run(["mount", "--bind", str(d), str(d)], check=True)
    subprocess.run(["mount", "-o", "remount,ro,bind", str(d)], check=True)
    try:
        Chain(d / "a.jsonl").append("test.event", {})
        print("appended")
    except AuditError as exc:
        print("refused", exc.message, sep="\t")
    """
)


def test_read_only_file_raises_audit_error(tmp_path: Path) -> None:
    """A log that cannot be written refuses the append and stays as it was. Root ignores file
    modes, so as root the log's directory is made read-only by a bind mount instead (in a
    private mount namespace)."""
    logs = tmp_path / "logs"
    path = logs / "a.jsonl"
    Chain(path).append("test.event", {})
    before = path.read_bytes()
    if os.geteuid() == 0:
        out = subprocess.run(
            ["unshare", "--mount", sys.executable, "-c", READONLY_CHILD, str(logs)],
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert out.returncode == 0, out.stderr
        assert out.stdout.startswith("refused\tcould not record to the audit log")
        assert "Read-only file system" in out.stdout
    else:
        path.chmod(0o400)
        try:
            with pytest.raises(AuditError, match="Permission denied"):
                Chain(path).append("test.event", {})
        finally:
            path.chmod(0o600)
    assert path.read_bytes() == before


TMPFS_CHILD = textwrap.dedent(
    """
    import subprocess, sys
    from pathlib import Path
    from linpodx.audit.chain import Chain, verify_file
    from linpodx.errors import AuditError
    mnt = Path(sys.argv[1])
    subprocess.run(["mount", "--make-rprivate", "/"], check=True)
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=64k", "tmpfs", str(mnt)], check=True)
    c = Chain(mnt / "a.jsonl")
    n = 0
    try:
        while True:
            c.append("test.event", {"i": n, "pad": "z" * 3000})
            n += 1
    except AuditError as exc:
        print("stopped", n, exc.message, sep="\\t")
    before = (mnt / "a.jsonl").read_bytes()
    try:
        c.append("test.event", {"pad": "z" * 3000})
        print("unexpected append")
    except AuditError:
        pass
    r = verify_file(mnt / "a.jsonl")
    same = (mnt / "a.jsonl").read_bytes() == before
    print("verify", r.ok, r.events, r.torn_tail, same, sep="\\t")
    """
)


@pytest.mark.skipif(
    os.geteuid() != 0 or shutil.which("unshare") is None,
    reason="a private tmpfs needs root (rootless runs cover the read-only file instead)",
)
def test_full_disk_enospc(tmp_path: Path) -> None:
    """A really full filesystem (64 kB tmpfs in a private mount namespace): appends stop with
    AuditError, nothing partial is left, the chain still verifies."""
    mnt = tmp_path / "mnt"
    mnt.mkdir()
    out = subprocess.run(
        ["unshare", "--mount", sys.executable, "-c", TMPFS_CHILD, str(mnt)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert out.returncode == 0, out.stderr
    lines = out.stdout.splitlines()
    stopped = lines[0].split("\t")
    assert stopped[0] == "stopped" and int(stopped[1]) > 5
    assert "No space left on device" in stopped[2]
    assert lines[-1].split("\t") == ["verify", "True", stopped[1], "False", "True"]


HALF_WRITE_CHILD = textwrap.dedent(
    """
    import os, signal, sys
    from pathlib import Path
    from linpodx.audit import chain, writer
    path = Path(sys.argv[1])
    real_write = writer.write_all

    def half_then_die(fd, data):
        # What a kill -9 inside write(2) leaves: the first part of the line, then nothing.
        real_write(fd, data[: len(data) // 2])
        os.kill(os.getpid(), signal.SIGKILL)

    writer.write_all = half_then_die
    chain.Chain(path).append("test.event", {"i": "dies mid-write", "pad": "q" * 500})
    """
)


def test_kill_9_inside_write_leaves_a_torn_line_that_is_repaired(tmp_path: Path) -> None:
    """Deterministic version of the random-kill test: the appender is SIGKILLed after writing
    half its line (the state a kill inside write(2) or a power cut leaves)."""
    path = tmp_path / "a.jsonl"
    c = Chain(path)
    for i in range(3):
        c.append("test.event", {"i": i})
    size = path.stat().st_size
    p = subprocess.run([sys.executable, "-c", HALF_WRITE_CHILD, str(path)], timeout=60)
    assert p.returncode == -signal.SIGKILL
    assert path.stat().st_size > size
    report = verify_file(path)
    assert report.ok and report.torn_tail and report.events == 3
    assert report.torn_offset == size
    assert f"torn last line at byte {size}" in (report.reason or "")
    rec = c.append("test.event", {"i": 3})
    assert rec.seq == 4
    final = verify_file(path)
    assert final.ok and not final.torn_tail and final.events == 5
    repair = json.loads(path.read_bytes().splitlines()[3])
    assert repair["type"] == "audit.repair"
    assert repair["data"]["removed_bytes"] == report.torn_bytes


def _torn_log(tmp_path: Path, n: int = 6) -> tuple[Path, Chain, int]:
    """A log of `n` records whose last line is torn (a crash mid-append); its size before."""
    path = tmp_path / "t.jsonl"
    c = Chain(path)
    for i in range(n):
        c.append("test.event", {"i": i, "pad": "p" * 100})
    size = path.stat().st_size
    with open(path, "ab") as f:
        f.write(path.read_bytes().splitlines()[1][:90])
    return path, c, size


@pytest.mark.parametrize("parallel", [False, True])
def test_repair_during_verify_is_not_tampering(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, parallel: bool
) -> None:
    """A crash left a torn tail; verify reads up to it, then an append repairs it (cuts the
    torn bytes, writes audit.repair and its record at that offset) before verify reads on.
    The lock-free pass then sees half a line of before and half of after: verify must look
    again under the lock and report the intact log, not a hash mismatch. The interleaving is
    injected, not raced."""
    from linpodx.audit import walk

    if parallel:
        monkeypatch.setattr(walk, "_PARALLEL_MIN_BYTES", 0)
        monkeypatch.setattr(walk, "_workers", lambda: 3)
    path, c, _size = _torn_log(tmp_path)
    torn_size = path.stat().st_size
    real = os.pread
    fired: list[int] = []

    def pread(fd: int, n: int, off: int) -> bytes:
        data = real(fd, n, off)
        if not fired and data and off + len(data) == torn_size and os.getpid() == me:
            fired.append(1)
            c.append("test.event", {"after": "repair", "pad": "r" * 300})  # repairs
        return data

    me = os.getpid()
    monkeypatch.setattr(walk.os, "pread", pread)
    report = verify_file(path)
    monkeypatch.undo()
    assert fired
    assert report.ok, report.reason
    assert not report.torn_tail
    # 6, audit.repair and the new record; or (parallel: the workers read before the repair,
    # the hook fires in the parent's look at the tail) the 6 before it, the line having been
    # in flight.
    assert report.events == (6 if parallel else 8)
    assert verify_file(path).events == 8


def test_verify_does_not_hang_on_a_held_lock_and_torn_tail(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A writer stopped mid-append (kill -STOP on `mcp attach`) holds the lock and left a torn
    line: verify waits LOCK_WAIT at most, then reports the torn tail and says a writer holds
    the lock."""
    import fcntl

    from linpodx.audit import walk

    monkeypatch.setattr(walk, "LOCK_WAIT", 0.3)
    path, _c, size = _torn_log(tmp_path)
    holder = os.open(path, os.O_RDONLY)
    try:
        fcntl.flock(holder, fcntl.LOCK_EX)
        t = time.monotonic()
        report = verify_file(path)
        took = time.monotonic() - t
    finally:
        os.close(holder)
    assert took < 30  # bounded (LOCK_WAIT is 0.3 s here); it hung forever before
    assert report.ok and report.torn_tail and report.events == 6
    assert report.torn_offset == size
    assert "another process has held the log's lock" in (report.reason or "")


def test_damage_while_a_writer_holds_the_lock_is_still_damage(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The second look cannot take the lock: two lock-free reads that agree stand."""
    import fcntl

    from linpodx.audit import walk

    monkeypatch.setattr(walk, "LOCK_WAIT", 0.2)
    path = tmp_path / "d.jsonl"
    c = Chain(path)
    for i in range(4):
        c.append("test.event", {"i": i})
    lines = path.read_bytes().splitlines(keepends=True)
    lines[2] = lines[2].replace(b'"i":2', b'"i":9')
    path.write_bytes(b"".join(lines))
    holder = os.open(path, os.O_RDONLY)
    try:
        fcntl.flock(holder, fcntl.LOCK_EX)
        report = verify_file(path)
    finally:
        os.close(holder)
    assert not report.ok and report.first_bad_seq == 2
    assert "hash mismatch" in (report.reason or "")


def test_log_changing_under_a_held_lock_is_not_vouched_for(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Damage seen, the lock held past LOCK_WAIT, and a second read that disagrees: nothing
    can be vouched for, and nothing is called tampering either (AuditError, exit 6)."""
    import fcntl

    from linpodx.audit import walk

    monkeypatch.setattr(walk, "LOCK_WAIT", 0.2)
    path = tmp_path / "d.jsonl"
    c = Chain(path)
    for i in range(4):
        c.append("test.event", {"i": i})
    good = path.read_bytes()
    lines = good.splitlines(keepends=True)
    lines[2] = lines[2].replace(b'"i":2', b'"i":9')
    path.write_bytes(b"".join(lines))
    real_verify = walk._verify_fd
    calls: list[int] = []

    def verify(*a: object, **k: object) -> object:
        calls.append(1)
        if len(calls) == 2:  # between the two lock-free reads, the file changes back
            path.write_bytes(good)
        return real_verify(*a, **k)  # type: ignore[arg-type]

    monkeypatch.setattr(walk, "_verify_fd", verify)
    holder = os.open(path, os.O_RDONLY)
    try:
        fcntl.flock(holder, fcntl.LOCK_EX)
        with pytest.raises(AuditError, match="changed while it was read"):
            verify_file(path)
    finally:
        os.close(holder)
