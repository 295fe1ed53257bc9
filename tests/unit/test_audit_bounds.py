"""Reading a chain is bounded: logs that are not regular files are refused before a byte is
read, a line longer than any record is damage and is never read whole, and only a tail that
looks like a torn append is called a crash (by verify, show, read_records and the writer)."""

from __future__ import annotations

import os
import tracemalloc
from collections.abc import Callable
from pathlib import Path

import pytest

from linpodx.audit import chain as ch
from linpodx.audit import core, walk, writer
from linpodx.audit.chain import HINT_NOT_A_LOG, Chain, NotALog, verify_file
from linpodx.audit.core import MAX_LINE, ZERO_HASH
from linpodx.errors import AuditError

MiB = 1024 * 1024


@pytest.fixture(autouse=True)
def _no_test_here_may_hang(watchdog: None) -> None:
    """Every test of this file runs under the shared `watchdog` (tests/conftest.py)."""


def _good_log(tmp_path: Path, n: int = 3) -> Chain:
    c = Chain(tmp_path / "a.jsonl")
    for i in range(n):
        c.append("a.b", {"i": i, "t": "é€"})
    return c


def _fifo(p: Path) -> str:
    os.mkfifo(p)
    return "a FIFO"


def _directory(p: Path) -> str:
    p.mkdir()
    return "a directory"


def _link_to_dev_zero(p: Path) -> str:
    p.symlink_to("/dev/zero")
    return "a symbolic link (to /dev/zero)"


def _link_to_a_valid_log(p: Path) -> str:
    real = _good_log(p.parent / "elsewhere").path
    p.symlink_to(real)
    return f"a symbolic link (to {real})"


def _dangling_link(p: Path) -> str:
    p.symlink_to(p.parent / "gone.jsonl")
    return "a symbolic link"


NOT_LOGS: list[Callable[[Path], str]] = [
    _fifo,
    _directory,
    _link_to_dev_zero,
    _link_to_a_valid_log,
    _dangling_link,
]


@pytest.mark.parametrize("make", NOT_LOGS, ids=lambda f: f.__name__.strip("_"))
def test_a_log_that_is_not_a_regular_file_is_refused(
    tmp_path: Path, make: Callable[[Path], str]
) -> None:
    p = tmp_path / "log.jsonl"
    kind = make(p)
    r = verify_file(p)
    assert not r.ok and r.events == 0 and r.first_bad_seq == 0 and not r.torn_tail
    assert r.reason is not None and kind in r.reason and "not a regular file" in r.reason
    assert r.hint == HINT_NOT_A_LOG and r.head == ZERO_HASH
    with pytest.raises(NotALog):
        list(ch.iter_lines(p))
    with pytest.raises(AuditError, match="not a regular file") as err:
        ch.read_records(p)
    assert err.value.hint == HINT_NOT_A_LOG
    with pytest.raises(AuditError, match="not a regular file"):
        Chain(p).last()
    assert ch.first_record(p) is None


def test_parallel_verifier_refuses_them_too(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(walk, "_PARALLEL_MIN_BYTES", 0)
    for make in NOT_LOGS:
        p = tmp_path / make.__name__ / "log.jsonl"
        p.parent.mkdir()
        make(p)
        with pytest.raises(NotALog):
            walk._verify_parallel(p, ZERO_HASH, True, None)
        assert verify_file(p).hint == HINT_NOT_A_LOG


def test_a_symlinked_log_is_refused_even_when_its_target_verifies(tmp_path: Path) -> None:
    """The writer never appends through a link (O_NOFOLLOW); verify does not vouch for one."""
    p = tmp_path / "log.jsonl"
    _link_to_a_valid_log(p)
    assert verify_file(p.resolve()).ok
    assert not verify_file(p).ok


def _sparse_garbage_log(tmp_path: Path, size: int) -> tuple[Path, int]:
    """A valid 3-record log followed by zeros up to `size` bytes (sparse: costs no disk)."""
    c = _good_log(tmp_path)
    good = c.path.stat().st_size
    os.truncate(c.path, size)
    return c.path, good


def test_sparse_garbage_is_damage_read_in_bounded_memory(tmp_path: Path) -> None:
    path, good = _sparse_garbage_log(tmp_path, 64 * MiB)
    tracemalloc.start()
    try:
        r = verify_file(path)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert not r.ok and not r.torn_tail and r.events == 3 and r.first_bad_seq == 3
    assert r.reason == (
        f"line longer than {MAX_LINE} bytes, longer than any record linpodx writes "
        f"(line at byte {good})"
    )
    # One read chunk plus at most MAX_LINE of a line, and copies of them: far below the 64 MiB
    # a whole-line read takes.
    assert peak < 8 * MiB, peak


def test_an_overlong_complete_line_is_damage_at_its_offset(tmp_path: Path) -> None:
    c = _good_log(tmp_path)
    good = c.path.read_bytes()
    offsets = [0]
    for line in good.splitlines(keepends=True)[:-1]:
        offsets.append(offsets[-1] + len(line))
    with open(c.path, "ab") as f:
        f.write(b'{"data":{"x":"' + b"a" * MAX_LINE + b'"}}\n')
    c2 = Chain(tmp_path / "b.jsonl")
    c2.append("a.b", {})
    with open(c.path, "ab") as f:
        f.write(c2.path.read_bytes())
    lines = ch.iter_lines(c.path)
    assert [next(lines)[0] for _ in range(3)] == offsets
    with pytest.raises(ch.OverlongLine) as exc:
        next(lines)
    assert exc.value.offset == len(good)
    r = verify_file(c.path)
    assert not r.ok and r.first_bad_seq == 3
    assert r.reason == (
        f"line longer than {MAX_LINE} bytes, longer than any record linpodx writes "
        f"(line at byte {len(good)})"
    )


def _record_prefixes() -> list[bytes]:
    c_line = core.build_line(0, ZERO_HASH, "", "a.b", {"t": "é€ x\u2028"}, "log_" + "0" * 26)[2]
    line = c_line[:-1]
    return [line[:n] for n in range(1, len(line) + 1)]


def test_looks_torn_accepts_every_prefix_of_a_record() -> None:
    # Prefixes cut inside the multi-byte characters included.
    assert all(core.looks_torn(p) for p in _record_prefixes())


@pytest.mark.parametrize(
    "tail",
    [
        b"\0" * 100,
        b'{"torn',
        b'{"data":{"x":"\x01',
        b'{"data":{"x":"\xff',
        b'{"data":{"x":"\xed\xa0\x80',  # an encoded surrogate
        b'{"data":{"x":"' + b"a" * MAX_LINE,
        b"",
    ],
    ids=["zeros", "foreign", "control", "bad-utf8", "surrogate", "oversize", "empty"],
)
def test_looks_torn_refuses_what_no_append_leaves(tail: bytes) -> None:
    assert not core.looks_torn(tail)


def test_a_garbage_tail_is_damage_not_a_crash(tmp_path: Path) -> None:
    c = _good_log(tmp_path)
    size = c.path.stat().st_size
    with open(c.path, "ab") as f:
        f.write(b"\0" * 100)
    r = verify_file(c.path)
    assert not r.ok and not r.torn_tail and r.first_bad_seq == 3 and r.events == 3
    assert r.reason == (
        f"unterminated last line at byte {size} (100 bytes) is not the start of a record: "
        "not a crash during append, the log was damaged or changed"
    )


@pytest.mark.parametrize(
    "tail", [b"\0" * 100, b'{"data":{"x":"' + b"a" * (MAX_LINE + 10)], ids=["zeros", "oversize"]
)
def test_the_writer_refuses_to_cut_off_a_garbage_tail(tmp_path: Path, tail: bytes) -> None:
    """Cutting it off as a "torn line removed (crash …)" would call damage a crash; the action
    is refused instead (fail closed), and the file is left as evidence."""
    c = _good_log(tmp_path)
    with open(c.path, "ab") as f:
        f.write(tail)
    before = c.path.read_bytes()
    with pytest.raises(AuditError, match="refusing to cut it off") as err:
        c.append("a.b", {"i": 9})
    assert err.value.hint is not None
    assert c.path.read_bytes() == before
    assert not writer.append_simple(str(c.path), "a.b", {"i": 9})
    assert c.path.read_bytes() == before


def test_a_real_torn_tail_is_still_repaired(tmp_path: Path) -> None:
    c = _good_log(tmp_path)
    last = c.last()
    assert last is not None
    line = core.build_line(3, last.hash, last.ts, "a.b", {"i": 3}, None)[2]
    with open(c.path, "ab") as f:
        f.write(line[: len(line) // 2])
    r = verify_file(c.path)
    assert r.ok and r.torn_tail
    c.append("a.b", {"i": 4})
    after = verify_file(c.path)
    assert after.ok and not after.torn_tail and after.events == 5


@pytest.mark.parametrize("workers", [2, 3])
def test_parallel_verifier_has_the_same_bounds(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, workers: int
) -> None:
    monkeypatch.setattr(walk, "_PARALLEL_MIN_BYTES", 0)
    monkeypatch.setattr(walk, "_workers", lambda: workers)
    c = _good_log(tmp_path, 40)
    intact = c.path.read_bytes()
    # Zeros past the split points: no newline within MAX_LINE of them, so no split at all.
    os.truncate(c.path, len(intact) + 8 * MiB)
    fd = ch.open_log(c.path)
    try:
        assert walk._split(fd, os.fstat(fd).st_size, workers) == [0]
    finally:
        os.close(fd)
    assert walk._verify_parallel(c.path, ZERO_HASH, True, None) is None
    r = verify_file(c.path)
    assert r == walk._verify(c.path, ZERO_HASH, True)
    assert not r.ok and r.first_bad_seq == 40 and "longer than any record" in (r.reason or "")
    # A short garbage tail in the last range: the worker defers to the reference verifier.
    c.path.write_bytes(intact + b"\0" * 50)
    assert walk._verify_parallel(c.path, ZERO_HASH, True, None) is None
    r = verify_file(c.path)
    assert not r.ok and not r.torn_tail and "not the start of a record" in (r.reason or "")
    # An overlong line inside a worker's range, followed by good-looking lines.
    c.path.write_bytes(intact[:200] + b"x" * (MAX_LINE + 1) + b"\n" + intact[200:])
    fd = ch.open_log(c.path)
    try:
        size = os.fstat(fd).st_size
        assert walk._check_range(fd, 0, size, ZERO_HASH, True, None) == {"ok": False}
    finally:
        os.close(fd)
