"""Append-only, hash-chained audit logs (JSONL).

Each line of a chain file is the canonical JSON (RFC 8785 subset, see `linpodx.canonical`) of
one record::

    {"data": {...}, "hash": H, ["log": LOG_ID,] "prev": P, "seq": N, "ts": T, "type": TYPE}

`hash` is sha256(DOMAIN + canonical_bytes(record without "hash")), `prev` is the hash of the
record before it (for seq 0: the chain's genesis, 64 zeros for the admin chain, the profile
revision's audit_hash for a session chain), and `log` is a random id carried by the first record
only, so records spliced in from another log are told apart.

Appends take an exclusive flock, read only the tail of the file, write the whole line in one
write and fsync before returning: when `append` returns, the record is on disk; when it raises
`AuditError`, the file is as it was and the caller must not perform the action.

A crash (kill -9, power loss) can leave a last line without its newline. That is reported as a
crash, not tampering, and the next append cuts it off and first records an `audit.repair` record
saying what it removed.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import hashlib
import json
import os
import re
import stat
import time
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from linpodx.audit import core
from linpodx.audit.core import DOMAIN, HINT_VERIFY, HINT_WRITE, MAX_LINE, ZERO_HASH
from linpodx.canonical import canonical_bytes
from linpodx.errors import AuditError
from linpodx.output import safe_text
from linpodx.paths import admin_log, sessions_audit_dir

_HEX64 = re.compile(r"^[0-9a-f]{64}\Z")
_SESSION_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,127}\Z")


@dataclass(frozen=True)
class Record:
    """One audit record as stored."""

    seq: int
    """Position in the chain, from 0, without gaps."""
    ts: str
    """UTC time of the append, `YYYY-MM-DDTHH:MM:SS.ffffffZ`; never decreases along a chain."""
    type: str
    """Dotted event type, e.g. `profile.apply`, `session.close`, `audit.repair`."""
    prev: str
    """Hash of the previous record (the genesis for seq 0)."""
    hash: str
    """sha256 hex over the domain prefix and the canonical record without `hash`."""
    data: Mapping[str, Any]
    """What happened (canonical-JSON values only: no floats)."""
    log_id: str | None = None
    """The log's random id; set on the first record only."""

    def to_dict(self) -> dict[str, Any]:
        """The record as it is stored (with `hash`; `log` only on the first record)."""
        d: dict[str, Any] = {
            "seq": self.seq,
            "ts": self.ts,
            "type": self.type,
            "prev": self.prev,
            "hash": self.hash,
            "data": dict(self.data),
        }
        if self.log_id is not None:
            d["log"] = self.log_id
        return d


@dataclass(frozen=True)
class VerifyReport:
    """What `verify_file` found."""

    ok: bool
    """True if every complete record checks out (a torn last line alone does not clear this)."""
    events: int
    """Number of valid records before the first bad one (all of them when ok)."""
    head: str
    """The hash the chain starts from (prev of seq 0; the genesis when the file is empty)."""
    tail: str
    """Hash of the last valid record (the head when there is none)."""
    first_bad_seq: int | None
    """Seq (position) of the first record that fails, None when ok."""
    reason: str | None
    """Why it failed (or, when ok, the torn-tail warning), None when clean."""
    torn_tail: bool
    """A last line without newline was found: a crash during an append, not tampering."""
    log_id: str | None
    """The log id from the first record."""
    torn_offset: int | None = None
    """Byte offset where the torn last line starts."""
    torn_bytes: int = 0
    """Length of the torn last line."""
    path: str = ""
    """The file verified."""
    hint: str | None = None
    """What to do about this particular failure, when the generic tampering hint does not fit."""

    def to_dict(self) -> dict[str, Any]:
        """Plain data for `--json`."""
        return {
            "path": self.path,
            "ok": self.ok,
            "events": self.events,
            "head": self.head,
            "tail": self.tail,
            "first_bad_seq": self.first_bad_seq,
            "reason": self.reason,
            "torn_tail": self.torn_tail,
            "torn_offset": self.torn_offset,
            "torn_bytes": self.torn_bytes,
            "log_id": self.log_id,
        }


BadRecord = core.BadRecord


def record_hash(body: Mapping[str, Any]) -> str:
    """sha256 hex of DOMAIN + canonical bytes of a record without its `hash`."""
    return hashlib.sha256(DOMAIN + canonical_bytes(body)).hexdigest()


def torn_reason(offset: int, length: int) -> str:
    """The words used everywhere for a torn last line."""
    return (
        f"torn last line at byte {offset} ({length} bytes without newline): "
        "crash during append, not tampering; the next append repairs it"
    )


def parse_line(line: bytes) -> Record:
    """Parse and check one stored line (without its newline) on its own with the strict
    reference parser (`core.parse_strict`); BadRecord with the reason."""
    return Record(*core.parse_strict(line))


def _fast_record(line: bytes) -> Record | None:
    """The Record `parse_line` would return, computed at C speed, or None if unsure (then the
    strict parser decides). See `core.fast_fields` for why the two agree."""
    fields = core.fast_fields(line)
    return None if fields is None else Record(*fields)


def check_line(line: bytes) -> Record:
    """parse_line, with the fast stage first (same result: `core.parse`)."""
    return Record(*core.parse(line))


class OverlongLine(BadRecord):
    """A line longer than any record the writer produces (MAX_LINE): damage, never read whole."""

    def __init__(self, offset: int):
        super().__init__(
            f"line longer than {MAX_LINE} bytes, longer than any record linpodx writes"
        )
        self.offset = offset


HINT_NOT_A_LOG = (
    "linpodx writes each log as a regular file and never through a link; move this aside "
    "(keep it as evidence), and if you moved the real log yourself, put the file back in its place"
)


class NotALog(Exception):
    """The log path holds something other than a regular file (directory, FIFO, device,
    socket, symbolic link): refused before reading a byte."""

    def __init__(self, path: Path, kind: str):
        super().__init__(f"{path} is {kind}, not a regular file")
        self.path = path
        self.kind = kind

    @property
    def reason(self) -> str:
        """The sentence verification reports."""
        return f"{self.path} is {self.kind}, not a regular file: it is not a log linpodx wrote"


def _kind(path: Path, st: os.stat_result) -> str:
    mode = st.st_mode
    if stat.S_ISLNK(mode):
        try:
            # The target is anyone's text (newlines, escapes): shown escaped, never raw.
            return f"a symbolic link (to {safe_text(os.readlink(path), 200)})"
        except OSError:
            return "a symbolic link"
    for test, name in (
        (stat.S_ISDIR, "a directory"),
        (stat.S_ISFIFO, "a FIFO (named pipe)"),
        (stat.S_ISCHR, "a character device"),
        (stat.S_ISBLK, "a block device"),
        (stat.S_ISSOCK, "a socket"),
    ):
        if test(mode):
            return name
    return "not a regular file"


def check_regular(path: Path) -> None:
    """Raise NotALog unless `path` itself (not what a link points to) is a regular file.
    FileNotFoundError if nothing is there."""
    st = os.lstat(path)
    if not stat.S_ISREG(st.st_mode):
        raise NotALog(path, _kind(path, st))


def open_log(path: Path) -> int:
    """Open a chain file for reading without ever blocking; NotALog unless it is a regular file.

    Symbolic links are refused, not followed. linpodx never creates one in a log's place and its
    writer refuses to append through one (O_NOFOLLOW), so a link there was put by someone else
    (threat 4). Following it would let that someone point verification at /dev/zero, a FIFO
    (which would hang it), or a file outside the state dir that others can change (under /tmp,
    say), and `verify` would then vouch for a log the writer itself refuses to use. Someone with
    the user's rights can of course write a regular file instead, but then every chain check
    applies to what they wrote; a link gains nothing we need to accept. Only the last component
    is checked: the state dir itself may be reached through links.

    The lstat refuses FIFOs, devices and directories before any open; O_NONBLOCK and the fstat
    after the open close the race with a swap in between (O_NONBLOCK has no effect on the
    regular file we then read). The caller closes the returned fd.
    """
    check_regular(path)
    try:
        fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC | os.O_NOFOLLOW | os.O_NONBLOCK)
    except OSError as exc:
        if exc.errno in (errno.ELOOP, errno.ENXIO):  # swapped for a link or socket meanwhile
            raise NotALog(path, "not a regular file") from None
        raise
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise NotALog(path, _kind(path, st))
    except BaseException:
        os.close(fd)
        raise
    return fd


READ_CHUNK = 1024 * 1024
"""Bytes read at a time: a reader holds at most this plus MAX_LINE of one unfinished line."""


def fd_lines(fd: int, start: int = 0, end: int | None = None) -> Iterator[tuple[int, bytes, bool]]:
    """(offset, line without newline, complete) for the lines starting in [start, end) of an
    open file (to its end when `end` is None), read with pread in bounded chunks.

    Raises OverlongLine as soon as a line (complete or not) exceeds MAX_LINE, without reading
    the rest of it: no record is that long, and the rest could be endless (/dev/zero, a huge
    sparse file).
    """
    pos = start
    rest = b""
    while end is None or pos < end:
        want = READ_CHUNK if end is None else min(READ_CHUNK, end - pos)
        chunk = os.pread(fd, want, pos)
        if not chunk:
            break
        pos += len(chunk)
        buf = rest + chunk if rest else chunk
        lines = buf.split(b"\n")
        rest = lines.pop()
        offset = pos - len(buf)
        for line in lines:
            if len(line) > MAX_LINE:
                raise OverlongLine(offset)
            yield offset, line, True
            offset += len(line) + 1
        if len(rest) > MAX_LINE:
            raise OverlongLine(offset)
    if rest:
        yield pos - len(rest), rest, False


def iter_lines(path: Path) -> Iterator[tuple[int, bytes, bool]]:
    """Yield (offset, line without newline, complete) for each line of a chain file.

    Bounded: NotALog for anything but a regular file (see open_log), OverlongLine for a line
    longer than any record. An incomplete last line is yielded as it is; `torn_problem` says
    whether it may be called a crash.
    """
    fd = open_log(path)
    try:
        yield from fd_lines(fd)
    finally:
        os.close(fd)


torn_problem = core.torn_problem


def first_record(path: Path) -> Record | None:
    """The first record of a chain file when it is complete and valid, else None. Reads at most
    one line's worth, refuses what open_log refuses (returns None)."""
    try:
        fd = open_log(path)
    except (NotALog, OSError):
        return None
    try:
        head = os.pread(fd, MAX_LINE + 1, 0)
    except OSError:
        return None
    finally:
        os.close(fd)
    end = head.find(b"\n")
    if end < 0:
        return None
    try:
        return check_line(head[:end])
    except BadRecord:
        return None


def verify_file(
    path: Path,
    genesis: str | None = None,
    *,
    check_genesis: bool = True,
    anchors: Mapping[int, str] | None = None,
    collect: Callable[[Record], None] | None = None,
) -> VerifyReport:
    """Check a whole chain file: every hash, seq continuity from 0, prev linkage, the genesis,
    a log id on the first record only, non-decreasing timestamps.

    A missing file raises AuditError (the caller decides whether "no log yet" is fine). With
    `check_genesis=False` the first record's prev is taken as the head whatever it is (used when
    the genesis is established afterwards, e.g. from a session's profile anchor). `anchors`
    maps seq -> the hash that record must have (sealed checkpoints, admin-chain cross-anchors);
    `collect` is called with each valid record in order (from seq 0 again if the file is read
    a second time).

    Reading takes no lock, so a writer is never held up by verification. Only when that pass
    finds damage (or sees the file shrink, as a repair does) is the file read once more holding
    the shared lock (waiting at most LOCK_WAIT for a writer), and that verdict is reported: an
    intact log caught mid-repair is never called tampered.
    """
    expected_genesis = genesis if genesis is not None else ZERO_HASH
    try:
        # lstat, not stat: a link is refused (open_log), and a FIFO is never opened.
        if collect is None and _PARALLEL_MIN_BYTES <= os.lstat(path).st_size:
            fast = _verify_parallel(path, expected_genesis, check_genesis, anchors)
            if fast is not None:
                return fast
        fd = open_log(path)
        try:
            report, shrank = _verify_fd(fd, path, expected_genesis, check_genesis, anchors, collect)
            if report.ok and not shrank:
                return report
            # Damage, or a file that shrank while it was read (a repair cut a torn tail and
            # rewrote it): what was read without the lock may be a mix of before and after.
            # Only a second look that no writer can change may call it damage.
            return _recheck(fd, path, report, expected_genesis, check_genesis, anchors, collect)
        finally:
            os.close(fd)
    except NotALog as exc:
        return VerifyReport(
            ok=False,
            events=0,
            head=expected_genesis,
            tail=expected_genesis,
            first_bad_seq=0,
            reason=exc.reason,
            torn_tail=False,
            log_id=None,
            path=str(path),
            hint=HINT_NOT_A_LOG,
        )
    except FileNotFoundError:
        raise AuditError(f"no audit log at {path}", "nothing has been recorded there yet") from None
    except OSError as exc:
        raise AuditError(
            f"could not read the audit log {path}: {exc.strerror or exc}",
            "check the file's permissions",
        ) from None


LOCK_WAIT = 5.0
"""Seconds verification waits for a writer to release a log's lock. A writer holds it for one
write and fsync; one that holds it longer is stopped or hung (`kill -STOP` on `mcp attach`),
and verification must not hang with it."""
_LOCK_POLL = 0.02


def _lock_shared(fd: int, wait: float | None = None) -> bool:
    """Take a shared flock on `fd`, waiting at most `wait` seconds (LOCK_WAIT); False if a
    writer held it all that time."""
    deadline = time.monotonic() + (LOCK_WAIT if wait is None else wait)
    while True:
        try:
            fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
            return True
        except BlockingIOError:
            if time.monotonic() >= deadline:
                return False
            time.sleep(_LOCK_POLL)


_LOCK_HELD = (
    "; another process has held the log's lock for over {wait:g} s (a writer stopped or hung "
    "mid-append?), so this line may still be completed"
)


def _in_flight(fd: int, offset: int) -> bool | None:
    """Was the unterminated line at `offset` an append still being written, not a crash?

    Verification reads without the lock, so it can catch an append mid-write. Waiting for a
    shared lock lets any writer finish (or a repair run); if the line at `offset` now ends
    with a newline, it was in flight, and is simply not part of what was verified. None when
    a writer kept the lock longer than LOCK_WAIT (then nobody can tell yet).
    """
    try:
        if not _lock_shared(fd):
            return None
        return b"\n" in os.pread(fd, MAX_LINE + 1, offset)
    except OSError:
        return False
    finally:
        with contextlib.suppress(OSError):
            fcntl.flock(fd, fcntl.LOCK_UN)


def _recheck(
    fd: int,
    path: Path,
    first: VerifyReport,
    genesis: str,
    check_genesis: bool,
    anchors: Mapping[int, str] | None,
    collect: Callable[[Record], None] | None,
) -> VerifyReport:
    """Verify `fd` once more, holding the shared lock so no writer (nor a repair) changes it
    meanwhile, after a lock-free pass found damage or saw the file shrink. `collect` sees the
    records again from seq 0.

    If a writer keeps the lock longer than LOCK_WAIT, the file is read once more without it:
    the same verdict twice stands (a writer that holds the lock cannot be changing what is
    before its append); a different one means nothing can be vouched for yet (AuditError,
    not a claim of tampering).
    """
    if _lock_shared(fd):
        try:
            report, _ = _verify_fd(fd, path, genesis, check_genesis, anchors, collect, locked=True)
            return report
        finally:
            with contextlib.suppress(OSError):
                fcntl.flock(fd, fcntl.LOCK_UN)
    again, shrank = _verify_fd(fd, path, genesis, check_genesis, anchors, collect)
    if not shrank and (again.ok, again.first_bad_seq, again.reason) == (
        first.ok,
        first.first_bad_seq,
        first.reason,
    ):
        return again
    raise AuditError(
        f"could not verify the audit log {path}: it changed while it was read, and another "
        f"process has held its lock for over {LOCK_WAIT:g} s",
        "a writer (`linpodx mcp attach`, `sandbox apply`, …) is stopped or hung mid-append; "
        "verify again once it has finished (or been ended)",
    )


class _Walk:
    """Sequential linkage checks over records, shared by the one-process and parallel verifiers."""

    def __init__(
        self,
        genesis: str,
        check_genesis: bool,
        anchors: Mapping[int, str] | None = None,
        start_seq: int = 0,
    ):
        self.anchors = anchors or {}
        self.genesis = genesis
        self.check_genesis = check_genesis
        self.head = genesis
        self.tail = genesis
        self.log_id: str | None = None
        self.last_ts = ""
        self.n = start_seq

    def missing_anchor(self) -> str | None:
        """After the last record: the reason if an anchor names a seq the log does not reach."""
        beyond = [seq for seq in self.anchors if seq >= self.n]
        if not beyond:
            return None
        last = f"seq {self.n - 1}" if self.n else "no record"
        return (
            f"the log ends at {last} but an anchor names seq {min(beyond)}: "
            "records were removed from the end (truncated) or the log was replaced"
        )

    def step(self, rec: Record) -> str | None:
        """Check `rec` as the next record; return the reason it is bad, or None."""
        n = self.n
        if rec.seq != n:
            return f"seq {rec.seq} where {n} was expected: a record was removed, inserted or moved"
        if n == 0:
            if rec.log_id is None:
                return "the first record carries no log id"
            if self.check_genesis and rec.prev != self.genesis:
                return (
                    f"the first record starts from {rec.prev[:12]}…, expected genesis "
                    f"{self.genesis[:12]}…: the log was replaced or belongs elsewhere"
                )
            self.log_id = rec.log_id
            self.head = rec.prev
            self.tail = rec.prev
        else:
            if rec.log_id is not None:
                return (
                    f"log id {rec.log_id} on a record other than the first: "
                    "records spliced in from another log"
                )
            if rec.prev != self.tail:
                return (
                    f"prev {rec.prev[:12]}… does not match the hash of seq {n - 1} "
                    f"({self.tail[:12]}…): a record was removed, inserted, reordered or spliced in"
                )
        if rec.ts < self.last_ts:
            return f"timestamp {rec.ts} is earlier than the record before it ({self.last_ts})"
        want = self.anchors.get(n)
        if want is not None and rec.hash != want:
            return (
                f"record seq {n} has hash {rec.hash[:12]}…, the anchor says {want[:12]}…: "
                "the log was rewritten up to here or replaced"
            )
        self.last_ts = rec.ts
        self.tail = rec.hash
        self.n = n + 1
        return None


def _verify(
    path: Path,
    genesis: str,
    check_genesis: bool,
    anchors: Mapping[int, str] | None = None,
    collect: Callable[[Record], None] | None = None,
) -> VerifyReport:
    """The reference verifier on its own (one lock-free pass; tests and the benchmark)."""
    fd = open_log(path)
    try:
        return _verify_fd(fd, path, genesis, check_genesis, anchors, collect)[0]
    finally:
        os.close(fd)


def _verify_fd(
    fd: int,
    path: Path,
    genesis: str,
    check_genesis: bool,
    anchors: Mapping[int, str] | None = None,
    collect: Callable[[Record], None] | None = None,
    *,
    locked: bool = False,
) -> tuple[VerifyReport, bool]:
    """The reference verifier: one pass, one process, exact first failure. Also says whether
    the file shrank while it was read (then the pass may have seen a mix of two states).
    `locked`: the caller holds the shared lock, so a torn tail cannot be an append in flight."""
    w = _Walk(genesis, check_genesis, anchors)
    size0 = os.fstat(fd).st_size
    torn_note = ""

    def report(ok: bool, reason: str | None, torn: tuple[int, int] | None = None) -> VerifyReport:
        return VerifyReport(
            ok=ok,
            events=w.n,
            head=w.head,
            tail=w.tail,
            first_bad_seq=None if ok else w.n,
            reason=reason,
            torn_tail=torn is not None,
            log_id=w.log_id,
            torn_offset=torn[0] if torn else None,
            torn_bytes=torn[1] if torn else 0,
            path=str(path),
        )

    def done(r: VerifyReport) -> tuple[VerifyReport, bool]:
        return r, os.fstat(fd).st_size < size0

    torn: tuple[int, int] | None = None
    try:
        for offset, line, complete in fd_lines(fd):
            if not complete:
                bad = torn_problem(offset, line)
                if bad is not None:
                    return done(report(False, bad))
                torn = (offset, len(line))
                break
            try:
                rec = check_line(line)
            except BadRecord as exc:
                return done(report(False, f"{exc} (line at byte {offset})"))
            problem = w.step(rec)
            if problem is not None:
                return done(report(False, problem))
            if collect is not None:
                collect(rec)
    except OverlongLine as exc:
        return done(report(False, f"{exc} (line at byte {exc.offset})"))
    if torn is not None and not locked:
        flight = _in_flight(fd, torn[0])
        if flight:
            torn = None
        elif flight is None:
            torn_note = _LOCK_HELD.format(wait=LOCK_WAIT)
    problem = w.missing_anchor()
    if problem is not None:
        return done(report(False, problem, torn))
    if torn is not None:
        return done(report(True, torn_reason(*torn) + torn_note, torn))
    return done(report(True, None))


_PARALLEL_MIN_BYTES = 16 * 1024 * 1024
"""Logs at least this big are verified by one forked worker per CPU (each checks a byte range,
the parent checks the seams). Any doubt sends the whole file through the one-process
verifier, so the report (first bad seq, reason) is always the reference one."""


def _check_range(
    fd: int,
    start: int,
    end: int,
    genesis: str,
    check_genesis: bool,
    anchors: Mapping[int, str] | None,
) -> dict[str, Any]:
    """Verify the records starting in [start, end) as far as possible without the rest.
    Any damage (an overlong line or a tail that is not a torn append included) is {"ok": False}:
    the parent then runs the reference verifier, which says what and where."""
    w = _Walk(genesis, check_genesis, anchors)
    first: dict[str, Any] | None = None
    torn = None
    lines = fd_lines(fd, start, end)
    while True:
        try:
            offset, line, complete = next(lines)
        except StopIteration:
            break
        except OverlongLine:
            return {"ok": False}
        if not complete:
            if torn_problem(offset, line) is not None:
                return {"ok": False}
            torn = [offset, len(line)]
            break
        try:
            rec = check_line(line)
        except BadRecord:
            return {"ok": False}
        if first is None:
            first = {"seq": rec.seq, "prev": rec.prev, "ts": rec.ts}
            if start > 0:
                # Prime the walk as if the record before this range had been seen; the parent
                # checks that seam against the previous range's last record.
                w.n, w.tail, w.last_ts = rec.seq, rec.prev, rec.ts
        if w.step(rec) is not None:
            return {"ok": False}
    return {
        "ok": True,
        "first": first,
        "n": w.n,
        "tail": w.tail,
        "ts": w.last_ts,
        "head": w.head,
        "log_id": w.log_id,
        "torn": torn,
    }


def _workers() -> int:
    """How many verify workers: the CPUs this process may run on (at most 16)."""
    cpus = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    return max(1, min(cpus or 1, 16))


def _split(fd: int, size: int, parts: int) -> list[int]:
    """Range starts: offset 0 and the first line start after each k*size/parts.

    Only [0] (no split: the reference verifier decides) if no newline follows a split point
    within MAX_LINE + 1 bytes, since a line that long is damage.
    """
    starts = [0]
    for k in range(1, parts):
        at = k * size // parts
        nl = os.pread(fd, MAX_LINE + 1, at).find(b"\n")
        if nl < 0:
            return [0]
        pos = at + nl + 1  # the next line start
        if starts[-1] < pos < size:
            starts.append(pos)
    return starts


def _verify_parallel(
    path: Path, genesis: str, check_genesis: bool, anchors: Mapping[int, str] | None
) -> VerifyReport | None:
    """Verify with one forked worker per CPU; None when anything is off (use the reference)."""
    fd = open_log(path)
    try:
        return _verify_parallel_fd(fd, path, genesis, check_genesis, anchors)
    finally:
        os.close(fd)


def _verify_parallel_fd(
    fd: int, path: Path, genesis: str, check_genesis: bool, anchors: Mapping[int, str] | None
) -> VerifyReport | None:
    # The workers inherit `fd` and read it with pread (no shared file offset, no reopening).
    size = os.fstat(fd).st_size
    starts = _split(fd, size, _workers())
    if len(starts) < 2:
        return None
    bounds = list(zip(starts, [*starts[1:], size], strict=True))
    children: list[tuple[int, int]] = []
    results: list[dict[str, Any] | None] = []
    try:
        for a, b in bounds:
            rfd, wfd = os.pipe()
            pid = os.fork()
            if pid == 0:  # pragma: no cover - runs in the child (coverage does not see it)
                code = 1
                try:
                    os.close(rfd)
                    doc = _check_range(fd, a, b, genesis, check_genesis, anchors)
                    with os.fdopen(wfd, "wb") as out:
                        out.write(json.dumps(doc).encode())
                    code = 0
                finally:
                    os._exit(code)
            os.close(wfd)
            children.append((pid, rfd))
        for pid, rfd in children:
            with os.fdopen(rfd, "rb") as inp:
                raw = inp.read()
            _, status = os.waitpid(pid, 0)
            results.append(json.loads(raw) if status == 0 and raw else None)
    except OSError:
        return None
    # Seams: each range must continue exactly where the previous one ended.
    total = 0
    prev_tail = prev_ts = ""
    done: list[dict[str, Any]] = []
    for k, res in enumerate(results):
        if res is None or not res["ok"] or res["first"] is None:
            return None
        done.append(res)
        first = res["first"]
        if k > 0 and (first["seq"] != total or first["prev"] != prev_tail or first["ts"] < prev_ts):
            return None
        if k < len(results) - 1 and res["torn"] is not None:
            return None
        total, prev_tail, prev_ts = res["n"], res["tail"], res["ts"]
    if anchors and max(anchors) >= total:
        return None
    if os.fstat(fd).st_size < size:
        return None  # shrank while read (a repair): the reference verifier looks again
    head, log_id, torn = done[0]["head"], done[0]["log_id"], done[-1]["torn"]
    torn_note = ""
    if torn is not None:
        flight = _in_flight(fd, torn[0])
        if flight:
            torn = None
        elif flight is None:
            torn_note = _LOCK_HELD.format(wait=LOCK_WAIT)
    return VerifyReport(
        ok=True,
        events=total,
        head=head,
        tail=prev_tail,
        first_bad_seq=None,
        reason=torn_reason(*torn) + torn_note if torn else None,
        torn_tail=torn is not None,
        log_id=log_id,
        torn_offset=torn[0] if torn else None,
        torn_bytes=torn[1] if torn else 0,
        path=str(path),
    )


class RecordScan:
    """One read of a log's records in order, one at a time (nothing is kept), that stops at
    the first line that is not a valid record: what `audit show` and `read_records` read.
    Linkage is not checked (that is `verify_file`'s job).

    After `records()` ends: `count` records were read; `stop` is None if the log was read to
    its end, else (offset, why, kind) with kind `torn` (a torn last line: a crash, harmless),
    `unterminated` (an unterminated last line that is not one), `damaged` (a line that is not
    a valid record) or `overlong`. NotALog and OSError (FileNotFoundError too) are raised as
    they are, for the caller to word.
    """

    def __init__(self, path: Path) -> None:
        self.path = path
        self.count = 0
        self.stop: tuple[int, str, str] | None = None

    def records(self, upto: int | None = None) -> Iterator[Record]:
        """Each readable record in order (at most `upto`); sets `count` and `stop`."""
        self.count = 0
        self.stop = None
        try:
            for offset, line, complete in iter_lines(self.path):
                if upto is not None and self.count >= upto:
                    return
                if not complete:
                    bad = torn_problem(offset, line)
                    if bad is None:
                        self.stop = (offset, torn_reason(offset, len(line)), "torn")
                    else:
                        self.stop = (offset, bad, "unterminated")
                    return
                try:
                    rec = check_line(line)
                except BadRecord as exc:
                    self.stop = (offset, str(exc), "damaged")
                    return
                self.count += 1
                yield rec
        except OverlongLine as exc:
            self.stop = (exc.offset, str(exc), "overlong")


def read_records(path: Path) -> list[Record]:
    """All complete, individually valid records of a file (linkage not checked; see verify)."""
    scan = RecordScan(path)
    try:
        out = list(scan.records())
    except NotALog as exc:
        raise AuditError(f"audit log {exc}", HINT_NOT_A_LOG) from None
    except FileNotFoundError:
        raise AuditError(f"no audit log at {path}", "nothing has been recorded there yet") from None
    except OSError as exc:
        raise AuditError(
            f"could not read the audit log {path}: {exc.strerror or exc}",
            "check the file's permissions",
        ) from None
    if scan.stop is not None:
        offset, why, kind = scan.stop
        if kind == "overlong":
            raise AuditError(
                f"audit log {path} has a damaged record at byte {offset}: {why}", HINT_VERIFY
            )
        if kind == "damaged":
            raise AuditError(
                f"audit log {path}: damaged record at byte {offset}: {why}", HINT_VERIFY
            )
        if kind == "unterminated":
            raise AuditError(f"audit log {path}: {why}", HINT_VERIFY)
    return out


class Chain:
    """One chain file. Cheap to create; every append opens, locks, writes and closes."""

    def __init__(self, path: Path, genesis: str | None = None):
        if genesis is not None and not _HEX64.fullmatch(genesis):
            raise AuditError(
                "the chain's genesis is not a sha256 hex digest",
                "pass the audit_hash of an applied profile revision",
            )
        self.path = Path(path)
        self.genesis = genesis if genesis is not None else ZERO_HASH

    def __repr__(self) -> str:
        return f"Chain({str(self.path)!r})"

    def append(self, type: str, data: Mapping[str, Any]) -> Record:
        """Record one event durably, or raise AuditError (then the action must not happen)."""
        core.check_type(type)
        where = str(self.path)
        fd = core.open_locked(where)
        try:
            done = core.append_locked(fd, where, self.genesis, [(type, data)])
        finally:
            os.close(fd)  # closing releases the flock
        if done is None:  # pragma: no cover - only the simple mode gives up
            raise AuditError(f"could not record to the audit log {where}", HINT_WRITE)
        [result] = done.results
        if isinstance(result, AuditError):
            raise result
        return Record(*result)

    def verify(self) -> VerifyReport:
        """Verify this chain against its genesis."""
        return verify_file(self.path, self.genesis)

    def last(self) -> Record | None:
        """The last complete record (no lock: a snapshot), None for an empty or missing log."""
        try:
            fd = open_log(self.path)
        except FileNotFoundError:
            return None
        except NotALog as exc:
            raise AuditError(f"audit log {exc}", HINT_NOT_A_LOG) from None
        except OSError as exc:
            raise AuditError(
                f"could not read the audit log {self.path}: {exc.strerror or exc}",
                "check the file's permissions",
            ) from None
        try:
            last, _ = _read_tail(fd, os.fstat(fd).st_size)
            return last
        finally:
            os.close(fd)


def _read_tail(fd: int, size: int) -> tuple[Record | None, int | None]:
    """The last complete record and, if the file ends in a torn line, where that line starts."""
    line, torn_at = core.tail_line(fd, size)
    if line is None:
        return None, torn_at
    try:
        rec = check_line(line)
    except BadRecord as exc:
        raise AuditError(
            f"the audit log's last record is damaged ({exc}); refusing to chain onto it",
            HINT_VERIFY,
        ) from None
    return rec, torn_at


RESERVE_FILE = ".reserve"
RESERVE_BYTES = 256 << 10
"""Space kept in the audit dir for the records of `stop` and `rm` (about 800 of them): a
state dir an agent filled (a session log flood) must not lock the person out of stopping."""
_NO_SPACE = (errno.ENOSPC, errno.EDQUOT)


def keep_reserve() -> None:
    """Put the reserve back if it is not there (after a record went in: there is space). A
    reserve that cannot be written is left out, never a reason to fail."""
    path = Path(admin_log()).parent / RESERVE_FILE
    if os.path.lexists(path):
        return
    tmp = path.with_name(RESERVE_FILE + ".tmp")
    try:
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC | os.O_NOFOLLOW,
                     0o600)
        try:
            # Written, not fallocated: tmpfs and every filesystem then really hold the blocks.
            core.write_all(fd, b"\0" * RESERVE_BYTES)
            os.fsync(fd)
        finally:
            os.close(fd)
        os.rename(tmp, path)
    except OSError:
        with contextlib.suppress(OSError):
            os.unlink(tmp)


def _no_space(exc: AuditError) -> bool:
    return (exc.details or {}).get("errno") in _NO_SPACE


def append_stopping(type: str, data: Mapping[str, Any]) -> str | None:
    """Record a step in the safe direction (`container.stop`, `container.rm`) in the admin
    chain; on a full state dir, in the space of the reserve (`RESERVE_BYTES`), and if even
    that is gone, not at all: the step goes ahead either way. Returns what to tell the person
    (None when the record went in as any other). AuditError for anything but a full disk."""
    chain = admin_chain()
    try:
        chain.append(type, data)
        return None
    except AuditError as exc:
        if not _no_space(exc):
            raise
    reserve = chain.path.parent / RESERVE_FILE
    released = False
    with contextlib.suppress(FileNotFoundError):
        os.unlink(reserve)
        released = True
    where = str(chain.path.parent.parent)
    if released:
        try:
            chain.append(type, data)
            return (f"warning: the state dir {where} is full: the {type} record was written in "
                    "the space linpodx keeps for stop and rm; free space there (nothing else "
                    "can be recorded, so nothing can be started or run until then)")
        except AuditError as exc:
            if not _no_space(exc):
                raise
    return (f"warning: the state dir {where} is full: the {type} record could not be written "
            "(No space left on device), and the step went ahead anyway (stopping and removing "
            "are the safe direction); free space there: nothing else can be recorded, so "
            "nothing can be started or run until then")


def admin_chain() -> Chain:
    """The chain of administrative actions (profile.apply, container.run, …)."""
    return Chain(Path(admin_log()))


def session_path(session_id: str) -> Path:
    """Where a session's chain lives. Refuses ids that could name another path."""
    if not _SESSION_RE.fullmatch(session_id) or session_id in {".", ".."}:
        raise AuditError(
            f"invalid session id {session_id!r}",
            "session ids look like sess_01J…; see `linpodx audit show`",
        )
    return sessions_audit_dir() / f"{session_id}.jsonl"


def session_chain(session_id: str, genesis: str) -> Chain:
    """The chain of one MCP session; its first prev is the profile revision's audit_hash."""
    return Chain(session_path(session_id), genesis)


def open_session(
    session_id: str, profile_id: str, audit_hash: str, data: Mapping[str, Any] | None = None
) -> tuple[Chain, Record]:
    """Start a session chain and anchor it in the admin chain.

    The session's first record (`session.start`) starts from the profile revision's audit_hash
    and names `profile_id`/`audit_hash` in its data, so verification can find the anchor; the
    admin chain then gets `session.open` with the session's head and first hash. Rewriting
    either log alone then no longer matches the other.
    """
    chain = session_chain(session_id, audit_hash)
    first = chain.append(
        "session.start",
        {
            **(data or {}),
            "session_id": session_id,
            "profile_id": profile_id,
            "audit_hash": audit_hash,
        },
    )
    admin_chain().append(
        "session.open",
        {
            "session_id": session_id,
            "profile_id": profile_id,
            "head": audit_hash,
            "first": first.hash,
        },
    )
    return chain, first


def anchor_session(session_id: str, tail_hash: str, events: int) -> Record:
    """Record a session's end in the admin chain with its tail hash and record count.

    After this, truncating or rewriting the session log is detected by `verify --session`.
    """
    if not _HEX64.fullmatch(tail_hash):
        raise AuditError(
            "could not record to the audit log: the session tail is not a sha256 hex digest",
            "this is a bug in linpodx: pass the hash of the session's last record",
        )
    session_path(session_id)  # validates the id
    return admin_chain().append(
        "session.close", {"session_id": session_id, "tail": tail_hash, "events": events}
    )
