"""The one writer of chain files: `append_locked` is the only code that appends records.

`chain.Chain.append` (one record, fsync), `mcp.auditlog.GroupCommitChain` (batches, fsync by
its sync role) and `append_simple` (the fast run path: an intact tail only, else the full
append decides) are its three modes. Records are encoded and read back by `linpodx.audit.core`
(the codec). Like the codec, this module keeps to the standard library's cheapest modules:
`linpodx.fastpath.run` appends its `container.run` record before it starts podman.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import os
import stat
from collections.abc import Mapping

from linpodx.audit.core import (
    _BRACKETS,
    _HEX64,
    _LOG_RE,
    ASTRAL,
    HINT_VERIFY,
    HINT_WRITE,
    MAX_LINE,
    TAIL_CHUNK,
    ZERO_HASH,
    BadRecord,
    Fields,
    build_line,
    check_type,
    fast_fields,
    parse_strict,
    torn_problem,
)
from linpodx.canonical import MAX_DEPTH, SAFE_INT
from linpodx.digest import sha256
from linpodx.errors import AuditError, LinpodxError
from linpodx.paths import FILE_MODE, check_dir_str, ensure_dir_str

TYPE_CHECKING = False  # not typing's: see linpodx/fastpath/__init__.py
if TYPE_CHECKING:
    from typing import Any

def pread_all(fd: int, offset: int, length: int) -> bytes:
    parts = []
    while length > 0:
        chunk = os.pread(fd, min(length, 1 << 20), offset)
        if not chunk:
            break
        parts.append(chunk)
        offset += len(chunk)
        length -= len(chunk)
    return b"".join(parts)


def write_all(fd: int, data: bytes) -> None:
    n = os.write(fd, data)
    if n == len(data):  # as good as always: one write of a record or a batch
        return
    if n <= 0:  # pragma: no cover - write(2) reports errors by raising
        raise OSError(28, "short write")
    view = memoryview(data)[n:]
    while view:
        n = os.write(fd, view)
        if n <= 0:  # pragma: no cover - write(2) reports errors by raising
            raise OSError(28, "short write")
        view = view[n:]


_LOG_DIRS: dict[tuple[str, int], tuple[int, int, int, str, str]] = {}
"""(a chain file's path as named, euid) -> (an fd held open on its directory, the directory's
st_dev and st_ino, the directory's name, the file's name in it), for the files `open_chain`
has opened in this process: the fd keeps the inode from being reused while it is cached, so
the pair names that directory and no other."""
_LOG_DIRS_MAX = 8
_DIR_OPEN_MASK = stat.S_IFMT(0o777777) | 0o077
"""The file type bits and the group's and others' permission bits of a mode."""


def open_chain(path: str, flags: int, *, create: bool) -> int:
    """Chain file `path` opened with `flags` (mode 0600 if created) after checking its
    directory; the caller closes the fd. OSError or LinpodxError as the checks raise.

    The directory is checked as `paths.ensure_dir_str` (with `create`: made if missing) or
    `paths.check_dir_str` checks it (no link or other user's directory on the way: either
    would put records outside the state dir), then held open, and the file is opened relative
    to it: into the directory that was checked, even if its name is swapped in between.
    Every later open of the same file costs one lstat instead of the checks: the name must
    still be that very directory (same device and inode, pinned by the held fd), still ours,
    closed to others and not a link; anything else gets the full checks again.
    """
    euid = os.geteuid()
    key = (path, euid)
    known = _LOG_DIRS.get(key)
    if known is not None:
        fd, dev, ino, where, name = known
        try:
            st: os.stat_result | None = os.lstat(where)
        except OSError:
            st = None  # gone (made again below) or unreadable (the checks say why)
        if (
            st is not None
            and st.st_ino == ino
            and st.st_dev == dev
            and st.st_uid == euid
            and st.st_mode & _DIR_OPEN_MASK == stat.S_IFDIR  # a directory, closed to others
        ):
            return os.open(name, flags, FILE_MODE, dir_fd=fd)
        del _LOG_DIRS[key]
        os.close(fd)
    where = os.path.dirname(path)
    if create:
        ensure_dir_str(where)
    else:
        check_dir_str(where)
    fd = os.open(where, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        # The checks once more, now that the fd is open: what gets cached is a directory the
        # name led to, with no link on the way, both before and after it was opened.
        check_dir_str(where)
        st, now = os.fstat(fd), os.lstat(where)
    except BaseException:
        os.close(fd)
        raise
    if (now.st_dev, now.st_ino) != (st.st_dev, st.st_ino):
        # Reached through a link (allowed outside the state dir) or swapped since the checks:
        # nothing to cache; the file is opened by its name, as the checks saw it.
        os.close(fd)
        return os.open(path, flags, FILE_MODE)
    _LOG_DIRS[key] = (fd, st.st_dev, st.st_ino, where, os.path.basename(path))
    while len(_LOG_DIRS) > _LOG_DIRS_MAX:
        os.close(_LOG_DIRS.pop(next(iter(_LOG_DIRS)))[0])
    return os.open(os.path.basename(path), flags, FILE_MODE, dir_fd=fd)


def open_append(path: str) -> int:
    """The chain file opened for appending (created 0600 in 0700 dirs if missing), not locked;
    the caller closes it. AuditError on failure."""
    flags = os.O_RDWR | os.O_CREAT | os.O_APPEND | os.O_CLOEXEC | os.O_NOFOLLOW
    try:
        # Every time, not only for a first record: a link (or another user's directory) on the
        # way would put the record outside the state dir (`open_chain`).
        return open_chain(path, flags, create=True)
    except OSError as exc:
        if exc.errno == errno.ELOOP and os.path.islink(path):
            # O_NOFOLLOW refused it: "too many levels of symbolic links" and a disk-space
            # hint would send the person looking at the wrong thing.
            raise AuditError(
                f"could not record to the audit log {path}: it is a symbolic link, and "
                "linpodx does not write through links",
                "replace the link with the file it points to; nothing was done because it "
                "could not be recorded",
            ) from None
        raise AuditError(
            f"could not record to the audit log {path}: {exc.strerror or exc}", HINT_WRITE
        ) from None


def lock(fd: int, path: str) -> None:
    """Take the writers' exclusive flock on an open chain file; AuditError on failure."""
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
    except OSError as exc:
        raise AuditError(
            f"could not record to the audit log {path}: lock failed: {exc.strerror or exc}",
            HINT_WRITE,
        ) from None


def open_locked(path: str) -> int:
    """The chain file opened for appending and locked exclusively (`open_append`, `lock`); the
    caller closes it, which releases the lock. AuditError on failure."""
    fd = open_append(path)
    try:
        lock(fd, path)
    except AuditError:
        os.close(fd)
        raise
    return fd


def checked_size(fd: int, path: str) -> int:
    """The size of the open chain file; AuditError unless it is a regular file. Tightens its
    mode to 0600 if it is ours."""
    st = os.fstat(fd)
    if not stat.S_ISREG(st.st_mode):
        raise AuditError(
            f"could not record to the audit log {path}: not a regular file",
            "move it away; linpodx creates the log itself",
        )
    if stat.S_IMODE(st.st_mode) != FILE_MODE and st.st_uid == os.getuid():
        os.fchmod(fd, FILE_MODE)
    return st.st_size


def tail_line(fd: int, size: int) -> tuple[bytes | None, int | None]:
    """(the last complete line without its newline, where a torn last line starts).

    (None, None) for an empty file, (None, 0) when the whole file is one torn line. Reads
    backwards from the end in chunks; never more than the last line plus one chunk.
    """
    if size == 0:
        return None, None
    buf = b""
    pos = size
    line = b""
    # Find the end of the last complete line (the last newline) and the line before it.
    end_nl: int | None = None  # offset of the newline ending the last complete line
    while pos > 0:
        step = min(TAIL_CHUNK, pos)
        pos -= step
        buf = os.pread(fd, step, pos) + buf
        if end_nl is None:
            i = buf.rfind(b"\n")
            if i >= 0:
                end_nl = pos + i
        if end_nl is not None:
            j = buf.rfind(b"\n", 0, end_nl - pos)
            if j >= 0 or pos == 0:
                start = pos + j + 1 if j >= 0 else 0
                line = buf[start - pos : end_nl - pos]
                break
        if size - pos > 2 * MAX_LINE + 2 * TAIL_CHUNK:
            raise AuditError(
                "the audit log's last line is longer than any record we write", HINT_VERIFY
            )
    if end_nl is None:
        # No newline at all: the whole file is one torn line (the very first append crashed).
        return None, 0
    return line, (end_nl + 1 if end_nl + 1 < size else None)


def commit(
    fd: int, payload: bytes, base: int, path: str, *, cut_to: int | None = None, sync: bool = True
) -> None:
    """Write `payload` at the end (after cutting the file to `cut_to`, a torn tail) and, unless
    `sync` is False (group commit: its sync role fsyncs), fsync.

    On failure no partial line is left behind (the file is cut back to `base`): the action is
    not going to happen, so no record of it may remain either. AuditError then.
    """
    try:
        if cut_to is not None:
            os.ftruncate(fd, cut_to)
        write_all(fd, payload)
        if sync:
            os.fsync(fd)
    except OSError as exc:
        # A torn tail that was cut off stays cut: it was never a record.
        try:
            os.ftruncate(fd, base)
            os.fsync(fd)
        except OSError:
            pass
        raise AuditError(
            f"could not record to the audit log {path}: {exc.strerror or exc}", HINT_WRITE,
            details={"errno": exc.errno},
        ) from None


Tail = tuple[int, str, str]
"""Where the next append continues: (its seq, its prev, the last record's ts)."""


class Appended:
    """What `append_locked` did."""

    __slots__ = ("base", "end", "last", "results", "tail")

    def __init__(
        self,
        results: list[Fields | AuditError],
        tail: Tail | None,
        base: int,
        end: int,
        last: bytes = b"",
    ) -> None:
        self.results = results
        """Per entry, in order: the record's fields, or why this entry alone was not recorded."""
        self.tail = tail
        """Where the next append continues; None when nothing was written."""
        self.base = base
        """The file's size before the write (after cutting a torn tail): what was there."""
        self.end = end
        """The file's size after the write."""
        self.last = last
        """The last line written, with its newline (b"" when nothing was): what the file must
        still end with for `tail` to hold (group commit's tail proof)."""


_WRITTEN: dict[str, tuple[bytes, Fields]] = {}
"""A chain file's path -> (the last line this process appended to it, without its newline;
its fields), for the next append's tail proof (`_written_tail`)."""
_WRITTEN_MAX = 8


def _remember(path: str, line: bytes, fields: Fields) -> None:
    """Keep the line just written (with its newline) and its fields for the next append's
    tail proof (`_written_tail`). Nothing is checked here: a lone append, the only one of its
    process, pays only for the store."""
    _WRITTEN.pop(path, None)  # re-inserted last: the oldest entry goes first
    _WRITTEN[path] = (line[:-1], fields)
    while len(_WRITTEN) > _WRITTEN_MAX:
        _WRITTEN.pop(next(iter(_WRITTEN)), None)


def _written_tail(path: str, line: bytes) -> Fields | None:
    """The fields of `line`, the locked file's last complete line, if it is exactly the line
    this process appended to `path` last and `fast_fields` provably returns the fields it was
    built from; else None (the codec parses it).

    The same bytes parse to the same fields, whatever happened to the file in between
    (another writer, a truncation, a replaced file, a swapped directory): the line is read
    from the file and compared in full, as ever; only the parse of it is saved.
    build_line made it from checked parts: data by `encode_data` (canonical, its ints in
    range), type by TYPE_RE, ts by now_ts or the parsed tail's, the log id by new_id, the hash
    its own, in canonical order (`encode_record`, held equal to canonical_bytes by a unit
    test); prev is the hash of a record parsed or built, or for seq 0 the caller's genesis.
    Left to check are what fast_fields asks of the whole line that the parts do not imply:
    its nesting, no character beyond the BMP (the canonical_bytes fallback may write one), seq
    in the integer range, a genesis a hex digest. A unit test holds built lines to fast_fields.
    """
    mine = _WRITTEN.get(path)
    if mine is None or mine[0] != line:
        return None
    fields = mine[1]
    if (
        len(line) - len(line.translate(None, _BRACKETS)) <= MAX_DEPTH
        and (line.isascii() or not ASTRAL.search(line))
        and fields[0] <= SAFE_INT
        and (fields[0] or (_HEX64.fullmatch(fields[3]) and _LOG_RE.fullmatch(fields[6] or "")))
    ):
        return fields
    return None


def _read_tail(fd: int, path: str, simple: bool) -> tuple[int, Fields | None, int | None] | None:
    """(size, last record, where a torn last line starts) of the locked file. In simple mode
    None whenever the full append is needed (empty file, torn tail, a tail the fast parser
    cannot vouch for, an I/O error it would report)."""
    try:
        size = checked_size(fd, path)
        line, torn_at = tail_line(fd, size)
    except OSError as exc:
        if simple:
            return None
        raise AuditError(
            f"could not record to the audit log {path}: {exc.strerror or exc}", HINT_WRITE
        ) from None
    if line is not None and torn_at is None:
        mine = _written_tail(path, line)
        if mine is not None:
            return size, mine, None
    if simple:
        last = fast_fields(line) if line is not None and torn_at is None else None
        return None if last is None else (size, last, None)
    if line is None:
        return size, None, torn_at
    try:
        return size, fast_fields(line) or parse_strict(line), torn_at
    except BadRecord as exc:
        raise AuditError(
            f"the audit log's last record is damaged ({exc}); refusing to chain onto it",
            HINT_VERIFY,
        ) from None


def _repair_data(fd: int, path: str, size: int, torn_at: int) -> dict[str, Any]:
    """The `audit.repair` record's data for cutting off the torn tail at `torn_at`.

    Only a tail that looks like a torn append is cut off as a crash; anything else (longer than
    any record, zeros, foreign bytes) is damage for a person to look at, exactly as `verify`
    reports it: AuditError then.
    """
    if size - torn_at > MAX_LINE:
        raise AuditError(
            f"could not record to the audit log {path}: the unterminated last line "
            f"at byte {torn_at} is longer than any record we write; refusing to cut it off",
            HINT_VERIFY,
        )
    removed = pread_all(fd, torn_at, size - torn_at)
    bad = torn_problem(torn_at, removed)
    if bad is not None:
        raise AuditError(
            f"could not record to the audit log {path}: {bad}; refusing to cut it off",
            HINT_VERIFY,
        )
    return {
        "reason": "torn last line removed (crash during an earlier append)",
        "offset": torn_at,
        "removed_bytes": len(removed),
        "removed_sha256": sha256(removed).hexdigest(),
    }


def append_locked(
    fd: int,
    path: str,
    genesis: str,
    entries: list[tuple[str, Mapping[str, Any]]],
    *,
    known: tuple[Tail, int] | None = None,
    sync: bool = True,
    simple: bool = False,
    typed: bool = False,
) -> Appended | None:
    """Append `entries` (type, data) to the chain file open as `fd`, which the caller holds
    locked exclusively: the one writer of every chain file.

    The tail is read from the file (its last record parsed, fast stage then strict) unless
    `known` gives it with the file size it belongs to (group commit, which wrote that tail
    itself); when the last line is exactly the one this process appended last, its fields are
    remembered, not parsed again (`_written_tail`). A torn last line is cut off and an
    `audit.repair` record saying what was removed goes first. An entry that cannot be
    recorded (type, data, size) fails alone, in its result; the others go in, in one write,
    fsync'd unless `sync` is False. AuditError when the log itself cannot be written: then
    nothing was. `simple` (the fast run path): None, having written nothing, whenever the full
    append is needed instead (see `append_simple`). `typed`: the caller has checked every
    entry's type with `check_type` (then it is not checked again).
    """
    torn_at: int | None = None
    if known is not None:
        tail, size = known
    else:
        got = _read_tail(fd, path, simple)
        if got is None:
            return None
        size, last, torn_at = got
        tail = (0, genesis, "") if last is None else (last[0] + 1, last[4], last[1])
    seq, prev, last_ts = tail
    lines: list[bytes] = []
    results: list[Fields | AuditError] = []
    todo = list(entries)
    if torn_at is not None:
        todo.insert(0, ("audit.repair", _repair_data(fd, path, size, torn_at)))
    for typ, data in todo:
        try:
            if not typed:
                check_type(typ)
            log_id = None
            if seq == 0:
                from linpodx.ids import new_id  # only for a new log: off the fast path

                log_id = new_id("log")
            h, ts, line, stored = build_line(seq, prev, last_ts, typ, data, log_id)
        except AuditError as exc:
            results.append(exc)
            continue
        lines.append(line)
        written: Fields = (seq, ts, typ, prev, h, stored, log_id)
        results.append(written)
        seq, prev, last_ts = seq + 1, h, ts
    if torn_at is not None:
        repaired = results.pop(0)  # the repair record is ours, not an entry's
        if isinstance(repaired, AuditError):  # pragma: no cover - its data is always recordable
            raise repaired
    base = torn_at if torn_at is not None else size
    if not lines or (torn_at is not None and len(lines) == 1):
        return Appended(results, None, base, size)  # nothing of the caller's to write
    payload = b"".join(lines)
    commit(fd, payload, base, path, cut_to=torn_at, sync=sync)
    _remember(path, lines[-1], written)
    if base == 0:
        from linpodx.fsutil import fsync_dir  # a new file: off the fast path

        with contextlib.suppress(OSError):
            fsync_dir(os.path.dirname(path))
    return Appended(results, (seq, prev, last_ts), base, base + len(payload), lines[-1])


def append_simple(path: str, typ: str, data: Mapping[str, Any]) -> bool:
    """Append one record to an existing, intact chain file, durably; False, having written
    nothing, whenever the full append (`chain.Chain.append`) is needed instead: no file yet or
    an empty one (a first record names its log), a torn last line to repair, or a last line the
    fast parser cannot vouch for (the strict parser then decides). AuditError as for append.
    """
    try:
        # No link on the way (`paths.check_dir_str`, by `open_chain`).
        fd = open_chain(path, os.O_RDWR | os.O_APPEND | os.O_CLOEXEC | os.O_NOFOLLOW, create=False)
    except (OSError, LinpodxError):
        return False  # the full append refuses it and says why
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
        except OSError:
            return False
        done = append_locked(fd, path, ZERO_HASH, [(typ, data)], simple=True)
        if done is None:
            return False
        [result] = done.results
        if isinstance(result, AuditError):
            raise result
        return True
    finally:
        os.close(fd)
