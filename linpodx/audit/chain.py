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
import os
import re
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any, TypeVar

from linpodx.audit import core, writer
from linpodx.audit.core import DOMAIN, HINT_VERIFY, HINT_WRITE, MAX_LINE, ZERO_HASH
from linpodx.audit.logfile import (
    HINT_NOT_A_LOG,
    READ_CHUNK,
    NotALog,
    OverlongLine,
    RecordScan,
    check_regular,
    fd_lines,
    first_record,
    iter_lines,
    open_log,
    read_records,
)
from linpodx.audit.record import (
    BadRecord,
    Record,
    check_line,
    parse_line,
    record_hash,
    record_of,
    torn_problem,
    torn_reason,
)
from linpodx.audit.walk import LOCK_WAIT, VerifyReport, verify_file
from linpodx.errors import AuditError
from linpodx.paths import admin_log, sessions_audit_dir

__all__ = [  # the chain API, wherever each part lives
    "DOMAIN", "HINT_NOT_A_LOG", "HINT_VERIFY", "LOCK_WAIT", "MAX_LINE", "READ_CHUNK",
    "RESERVE_BYTES", "RESERVE_FILE", "ZERO_HASH", "BadRecord", "Chain", "NotALog",
    "OverlongLine", "Record", "RecordScan", "VerifyReport", "admin_chain", "anchor_session",
    "append_stopping", "check_line", "check_regular", "fd_lines", "first_record", "in_reserve",
    "iter_lines", "keep_reserve", "open_log", "open_session", "parse_line", "read_records",
    "record_hash", "session_chain", "session_path", "torn_problem", "torn_reason", "verify_file",
]  # fmt: skip

T = TypeVar("T")

_HEX64 = re.compile(r"^[0-9a-f]{64}\Z")
_SESSION_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,127}\Z")


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
        fd = writer.open_locked(where)
        try:
            done = writer.append_locked(fd, where, self.genesis, [(type, data)], typed=True)
        finally:
            os.close(fd)  # closing releases the flock
        if done is None:  # pragma: no cover - only the simple mode gives up
            raise AuditError(f"could not record to the audit log {where}", HINT_WRITE)
        [result] = done.results
        if isinstance(result, AuditError):
            raise result
        return record_of(result)

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
    line, torn_at = writer.tail_line(fd, size)
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
            writer.write_all(fd, b"\0" * RESERVE_BYTES)
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
    _, warning = in_reserve(lambda: chain.append(type, data), type, "the step went ahead")
    return warning


def in_reserve(append: Callable[[], T], what: str, went_ahead: str) -> tuple[T | None, str | None]:
    """`append()` for a record of the safe direction (a stop, an rm, the end of an MCP
    session); on a full state dir, again in the space of the reserve (`RESERVE_BYTES`), and if
    even that is gone, not at all. (its result or None; what to tell the person, None when
    the record went in as any other). `went_ahead` says what happened without the record.
    AuditError for anything but a full disk."""
    try:
        return append(), None
    except AuditError as exc:
        if not _no_space(exc):
            raise
    reserve = Path(admin_log()).parent / RESERVE_FILE
    released = False
    with contextlib.suppress(FileNotFoundError):
        os.unlink(reserve)
        released = True
    where = str(reserve.parent.parent)
    if released:
        try:
            done = append()
            return done, (
                f"warning: the state dir {where} is full: the {what} record was written in "
                "the space linpodx keeps for stop and rm; free space there (nothing else "
                "can be recorded, so nothing can be started or run until then)")
        except AuditError as exc:
            if not _no_space(exc):
                raise
    return None, (
        f"warning: the state dir {where} is full: the {what} record could not be written "
        f"(No space left on device), and {went_ahead} anyway (stopping and removing "
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
