"""Reading chain files safely: only regular files, never through a link, never blocking, in
bounded chunks; one record at a time (`RecordScan`) or the first one alone."""

from __future__ import annotations

import errno
import os
import stat
from collections.abc import Iterator
from pathlib import Path

from linpodx.audit.core import HINT_VERIFY, MAX_LINE
from linpodx.audit.record import BadRecord, Record, check_line, torn_problem, torn_reason
from linpodx.errors import AuditError
from linpodx.output import safe_text


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
    for offset, lines, complete in fd_line_batches(fd, start, end):
        for line in lines:
            yield offset, line, complete
            offset += len(line) + 1


def fd_line_batches(
    fd: int, start: int = 0, end: int | None = None
) -> Iterator[tuple[int, list[bytes], bool]]:
    """`fd_lines` a chunk at a time: (offset of the first line, the lines, complete), where
    the lines of one batch follow each other (each next one starts len(line) + 1 bytes on),
    and an incomplete last line comes alone. OverlongLine where fd_lines raises it, after
    the lines before it."""
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
        if lines and max(map(len, lines)) > MAX_LINE:
            for k, line in enumerate(lines):
                if len(line) > MAX_LINE:
                    if k:
                        yield offset, lines[:k], True
                    raise OverlongLine(offset + sum(map(len, lines[:k])) + k)
        if lines:
            yield offset, lines, True
        if len(rest) > MAX_LINE:
            raise OverlongLine(pos - len(rest))
    if rest:
        yield pos - len(rest), [rest], False


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
    except OSError as exc:
        raise read_failure(path, exc) from None
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


def read_failure(path: Path | str, exc: OSError) -> AuditError:
    """The error for an audit log that could not be read: missing, or unreadable."""
    if isinstance(exc, FileNotFoundError):
        return AuditError(f"no audit log at {path}", "nothing has been recorded there yet")
    return AuditError(
        f"could not read the audit log {path}: {exc.strerror or exc}",
        "check the file's permissions",
    )
