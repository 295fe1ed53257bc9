"""Verifying one chain file: `verify_file`, the one walk over its records (hashes, seq, prev,
genesis, log id, timestamps, anchors), run in one process or, for a large log, over byte ranges
in forked workers whose seams the parent checks. Lock-free first; a second look under the shared
lock decides before anything is called damage."""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from linpodx import proc
from linpodx.audit import batch, core, logfile
from linpodx.audit.core import MAX_LINE, ZERO_HASH, Fields
from linpodx.audit.logfile import (
    HINT_NOT_A_LOG,
    NotALog,
    OverlongLine,
    fd_line_batches,
    read_failure,
)
from linpodx.audit.record import BadRecord, Record, torn_problem, torn_reason
from linpodx.errors import AuditError


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
            "log": self.path,
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
        fd = logfile.open_log(path)
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
    except OSError as exc:
        raise read_failure(path, exc) from None


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

    def step(self, rec: Fields) -> str | None:
        """Check `rec` (its fields: `core.parse`) as the next record; return the reason it is
        bad, or None."""
        seq, ts, _type, prev, hash_, _data, log_id = rec
        n = self.n
        if seq != n:
            return f"seq {seq} where {n} was expected: a record was removed, inserted or moved"
        if n == 0:
            if log_id is None:
                return "the first record carries no log id"
            if self.check_genesis and prev != self.genesis:
                return (
                    f"the first record starts from {prev[:12]}…, expected genesis "
                    f"{self.genesis[:12]}…: the log was replaced or belongs elsewhere"
                )
            self.log_id = log_id
            self.head = prev
            self.tail = prev
        else:
            if log_id is not None:
                return (
                    f"log id {log_id} on a record other than the first: "
                    "records spliced in from another log"
                )
            if prev != self.tail:
                return (
                    f"prev {prev[:12]}… does not match the hash of seq {n - 1} "
                    f"({self.tail[:12]}…): a record was removed, inserted, reordered or spliced in"
                )
        if ts < self.last_ts:
            return f"timestamp {ts} is earlier than the record before it ({self.last_ts})"
        want = self.anchors.get(n)
        if want is not None and hash_ != want:
            return (
                f"record seq {n} has hash {hash_[:12]}…, the anchor says {want[:12]}…: "
                "the log was rewritten up to here or replaced"
            )
        self.last_ts = ts
        self.tail = hash_
        self.n = n + 1
        return None


BATCH = 64
"""Lines parsed together (`batch.fast_batch`): enough to share the json stage's per-call cost,
few enough that the batch's values stay in the CPU's cache."""


def _walk_range(
    fd: int,
    w: _Walk,
    start: int = 0,
    end: int | None = None,
    collect: Callable[[Record], None] | None = None,
) -> tuple[str | None, tuple[int, int] | None, Fields | None]:
    """Walk the records of the lines starting in [start, end) (to the end of the file when
    `end` is None) with `w`: the one loop of both verifiers. Returns (why the first bad line
    or record is bad, else None; the torn last line as (offset, length), if the range ends in
    one; the range's first record). A range after the first (start > 0) primes the walk from
    its first record, as if the record before it had been seen: the caller checks that seam.

    Lines are parsed a batch at a time (`batch.fast_batch`, which gives each line's
    `core.fast_fields`); a line it is unsure of gets the strict parser's verdict, as in
    `core.parse`.
    """
    first: Fields | None = None
    fast_batch, strict, chain_batch = batch.fast_batch, core.parse_strict, batch.chain_batch
    step = w.step
    anchors = w.anchors
    anchored = bool(anchors)
    try:
        for offset, lines, complete in fd_line_batches(fd, start, end):
            if not complete:
                line = lines[0]
                bad = torn_problem(offset, line)
                return (bad, None, first) if bad is not None else (None, (offset, len(line)), first)
            for k in range(0, len(lines), BATCH):
                part = lines[k : k + BATCH]
                if first is not None and (
                    not anchored or anchors.keys().isdisjoint(range(w.n, w.n + len(part)))
                ):
                    # The common case, a batch of records that all pass: `chain_batch` checks
                    # the whole batch at once, the same checks as below (`step`'s included).
                    recs = chain_batch(part, w.n, w.tail, w.last_ts)
                    if recs is not None:
                        last = recs[-1]
                        w.n, w.tail, w.last_ts = last[0] + 1, last[4], last[1]
                        if collect is not None:
                            for fields in recs:
                                collect(Record(*fields))
                        continue
                for j, rec in enumerate(fast_batch(part)):
                    if rec is None:
                        try:
                            rec = strict(part[j])
                        except BadRecord as exc:
                            at = offset + sum(map(len, lines[: k + j])) + k + j
                            return f"{exc} (line at byte {at})", None, first
                    if first is None:
                        first = rec
                        if start > 0:
                            w.n, w.tail, w.last_ts = rec[0], rec[3], rec[1]
                    seq, ts, _type, prev, hash_, _data, log_id = rec
                    if (
                        seq == w.n
                        and prev == w.tail
                        and log_id is None
                        and ts >= w.last_ts
                        and not anchored
                        and seq
                    ):
                        # `step`'s checks for the common case (a record after the first, no
                        # anchors), all passed; anything else gets them one by one.
                        w.n, w.tail, w.last_ts = seq + 1, hash_, ts
                    else:
                        problem = step(rec)
                        if problem is not None:
                            return problem, None, first
                    if collect is not None:
                        collect(Record(*rec))
    except OverlongLine as exc:
        return f"{exc} (line at byte {exc.offset})", None, first
    return None, None, first


def _verify(
    path: Path,
    genesis: str,
    check_genesis: bool,
    anchors: Mapping[int, str] | None = None,
    collect: Callable[[Record], None] | None = None,
) -> VerifyReport:
    """The reference verifier on its own (one lock-free pass; tests and the benchmark)."""
    fd = logfile.open_log(path)
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

    bad, torn, _first = _walk_range(fd, w, collect=collect)
    if bad is not None:
        return done(report(False, bad))
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
    bad, torn, first = _walk_range(fd, w, start, end)
    if bad is not None:
        return {"ok": False}
    return {
        "ok": True,
        "first": None if first is None else {"seq": first[0], "prev": first[3], "ts": first[1]},
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
    fd = logfile.open_log(path)
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

            def work(a: int = a, b: int = b) -> bytes:
                doc = _check_range(fd, a, b, genesis, check_genesis, anchors)
                return json.dumps(doc).encode()

            children.append(proc.fork_worker(work))
        for pid, rfd in children:
            with os.fdopen(rfd, "rb") as inp:
                raw = inp.read()
            status = proc.reap(pid)
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


