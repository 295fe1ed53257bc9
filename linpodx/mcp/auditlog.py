"""Group commit for a session's audit chain, and the one kind of record whose fsync may wait.

The bridge must not act before its record is on disk, and an fsync costs what the disk says it
costs (from ~0.1 ms idle to several ms under load). Writing and syncing are therefore two steps
with two roles: one thread at a time *writes* every record queued so far (one `write`), and one
thread at a time *syncs* (one `fsync` covering everything written before it started). Records
written while an fsync runs are covered together by the next one; a lone caller pays one write
and one fsync and no thread hand-off.

Durability rule (docs/mcp.md says the same):

- `append` returns only once its record is written *and* fsync'd. Every decision goes through
  it (requests in both directions, notifications, approvals, refusals, drops, session start and
  close): the bridge acts only after it returns and denies when it raises.
- `append_deferred` returns once its record is written to the log file, before its fsync. Only
  outcome records (`mcp.response`: status and duration of an answered request) use it: the
  answer is passed on after the write. The record is then in the kernel's page cache, so it
  survives the bridge being killed, even with SIGKILL; it is made durable by the next fsync of
  the file: the next decision's, or the flusher thread's at most `FLUSH_DELAY` seconds later,
  and always by `flush`/`close`, which every exit path of `mcp attach` runs. Only a crash of the
  whole machine before it reached the disk can lose it (never a decision record), and then the
  session also lacks its `session.close` record and its admin-chain anchor, which
  `audit verify --session` reports.
- A failed fsync may have lost anything it should have covered (Linux reports a writeback error
  once, later fsyncs succeed). The chain is then *failed*: the part not known to be durable is
  cut off (best effort), every waiting and later append raises AuditError (so the bridge denies
  every call from then on) and `failure` says why. Nothing is dropped without a trace.

The file stays open for the whole session and the chain's tail (seq, hash, ts, size) is kept in
memory, so an append does not re-read the file. Before each write the file is locked and its size
compared with what this process last wrote: if anyone else touched it (or on the first write),
the first record goes through `Chain.append`, which reads the tail and repairs a torn line, and
the in-memory tail is taken from its result if, with the lock taken back, that record is still
the file's last line (else the next record goes through `Chain.append` too). Records are
encoded with the chain's own `encode_record`, so the format is the chain module's, not ours.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import os
import re
import threading
import time
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from linpodx.audit import chain as audit_chain
from linpodx.audit import core as audit_core
from linpodx.canonical import CanonicalError
from linpodx.errors import AuditError
from linpodx.paths import FILE_MODE, ensure_dir

FLUSH_DELAY = 0.05
"""Seconds a deferred record may wait for its fsync (if no decision record comes first)."""


_TYPE_RE = re.compile(r"^[a-z][a-z0-9_]*(?:\.[a-z][a-z0-9_]*)+\Z")


@dataclass
class _Item:
    type: str
    data: Mapping[str, Any]
    durable: bool = True
    written: bool = False
    gen: int = 0
    """The write generation that carried this record (durable once a sync covers it)."""
    record: Any = None
    error: AuditError | None = None


class GroupCommitChain:
    """`append(type, data) -> Record` like `Chain.append`, batching concurrent callers."""

    def __init__(self, chain: audit_chain.Chain, flush_delay: float | None = None) -> None:
        self.chain = chain
        self.path = chain.path
        self.flush_delay = FLUSH_DELAY if flush_delay is None else flush_delay
        self._lock = threading.Lock()
        self._cv = threading.Condition(self._lock)  # writers and syncers wait here
        self._flush_cv = threading.Condition(self._lock)  # the flusher waits here
        self._flusher_idle = False  # the flusher waits with no deadline
        self._queue: list[_Item] = []
        self._writing = False
        self._syncing = False
        self._fd: int | None = None
        self._tail: tuple[int, str, str] | None = None  # (next seq, prev hash, last ts)
        self._size: int | None = None  # the file's size after our last write (writer's view)
        self._written_size: int | None = None  # the same, as of the last finished generation
        self._gen = 0  # write generations done
        self._synced_gen = 0  # every generation up to this one is durable
        self._synced_size: int | None = None  # the file's size when that sync started
        self._deferred_gen = 0  # the last generation that carried a deferred record
        self._dirty_since = 0.0  # when the oldest deferred record not yet durable was written
        self._flusher: threading.Thread | None = None
        self._closed = False
        self.failure: AuditError | None = None
        self.batches = 0
        self.records = 0
        self.syncs = 0

    @property
    def size(self) -> int | None:
        """The log file's size after the last finished write (None before the first): what
        the bridge holds against `mcp.audit_max_bytes`."""
        return self._written_size

    def append(self, type: str, data: Mapping[str, Any]) -> Any:
        """Record one event durably (possibly with others in one fsync), or raise AuditError."""
        return self.wait(self.submit(type, data))

    def append_deferred(self, type: str, data: Mapping[str, Any]) -> Any:
        """Write one outcome record now and fsync it later (see the module's durability rule)."""
        return self.wait(self.submit(type, data, durable=False))

    def submit(self, type: str, data: Mapping[str, Any], durable: bool = True) -> _Item:
        """Queue a record without waiting; `wait(ticket)` returns once it is on disk (written
        and fsync'd; only written for `durable=False`)."""
        item = _Item(type, data, durable)
        with self._cv:
            self._queue.append(item)
        return item

    def wait(self, item: _Item) -> Any:
        """Block until `item` is written (writing the queue ourselves if nobody is) and, unless
        deferred, durable (syncing ourselves if nobody is); its Record, or raise AuditError."""
        with self._cv:
            while not item.written:
                if self._writing:
                    self._cv.wait()
                else:
                    self._write_queue()
            if item.error is None and item.durable:
                self._sync_through(item.gen)
                if self._synced_gen < item.gen:
                    item.error = self.failure
            elif item.error is None and self._synced_gen < item.gen:
                self._defer(item.gen)
        if item.error is not None:
            raise item.error
        return item.record

    def flush(self) -> None:
        """Make every record written so far durable; raise AuditError if that failed."""
        with self._cv:
            while self._writing:
                self._cv.wait()
            self._sync_through(self._gen)
            if self.failure is not None:
                raise self.failure

    def close(self) -> None:
        """Flush, stop the flusher and close the file (appends after this reopen it). A failed
        flush stays in `failure` for the caller to report."""
        with contextlib.suppress(AuditError):  # kept in self.failure
            self.flush()
        with self._cv:
            self._closed = True
            self._flush_cv.notify()
            flusher = self._flusher
        if flusher is not None:
            flusher.join()
        with self._cv:
            while self._writing or self._syncing:  # never close the fd under a write
                self._cv.wait()
            self._flusher = None
            self._closed = False
            if self._fd is not None:
                with contextlib.suppress(OSError):
                    os.close(self._fd)
                self._fd = None
                self._size = None

    # ---- the two roles (called with self._cv held) -----------------------------------------

    def _write_queue(self) -> None:
        """Take the writer role and write everything queued (the lock is dropped meanwhile)."""
        self._writing = True
        batch, self._queue = self._queue, []
        failure = self.failure
        durable_upto: int | None = None
        self._cv.release()
        try:
            if failure is not None:
                for b in batch:
                    b.error = failure
            else:
                durable_upto = self._commit(batch)
        finally:
            self._cv.acquire()
            self._writing = False
            self._gen += 1
            self._written_size = self._size
            if durable_upto is not None:
                self._synced_size = max(self._synced_size or 0, durable_upto)
            for b in batch:
                b.written = True
                b.gen = self._gen
            self._cv.notify_all()

    def _sync_through(self, gen: int) -> None:
        """Return once generation `gen` is durable or the chain failed (fsync'ing ourselves if
        nobody is: one fsync covers every generation written before it started)."""
        while self._synced_gen < gen and self.failure is None:
            if self._syncing:
                self._cv.wait()
                continue
            self._syncing = True
            target, size, fd = self._gen, self._written_size, self._fd
            self._cv.release()
            error: OSError | None = None
            try:
                if fd is not None:
                    os.fsync(fd)
            except OSError as exc:
                error = exc
            finally:
                self._cv.acquire()
                self._syncing = False
            if error is None:
                self._synced_gen = max(self._synced_gen, target)
                if size is not None:
                    self._synced_size = max(self._synced_size or 0, size)
                self.syncs += 1
            else:
                self._fail(error)
            self._cv.notify_all()

    def _fail(self, exc: OSError) -> None:
        """A sync failed: cut what is not known durable, refuse every append from now on."""
        self.failure = AuditError(
            f"could not record to the audit log {self.path}: fsync failed "
            f"({exc.strerror or exc}); this session can record, and so do, nothing more",
            audit_core.HINT_WRITE,
        )
        while self._writing:
            self._cv.wait()
        if self._fd is not None and self._synced_size is not None:
            with contextlib.suppress(OSError):
                os.ftruncate(self._fd, self._synced_size)
                os.fsync(self._fd)
        self._tail = None

    def _defer(self, gen: int) -> None:
        """Generation `gen` carries a deferred record: a sync must come within `flush_delay`."""
        if self._deferred_gen <= self._synced_gen:
            self._dirty_since = time.monotonic()  # the oldest one not yet durable
        self._deferred_gen = max(self._deferred_gen, gen)
        if self._flusher is None:
            self._flusher = threading.Thread(
                target=self._flush_loop, name="audit-flush", daemon=True
            )
            self._flusher.start()
        elif self._flusher_idle:
            # A flusher already waiting for a deadline will look again then: only wake an idle
            # one (a wake-up per answer would cost a thread switch per call).
            self._flush_cv.notify()

    def _flush_loop(self) -> None:
        """The flusher: syncs deferred records nobody else's fsync covered in time."""
        with self._cv:
            while not self._closed:
                if self.failure is not None or self._deferred_gen <= self._synced_gen:
                    self._flusher_idle = True
                    self._flush_cv.wait()
                    self._flusher_idle = False
                    continue
                left = self._dirty_since + self.flush_delay - time.monotonic()
                if left > 0:
                    self._flush_cv.wait(left)
                    continue
                self._sync_through(self._deferred_gen)

    # ---- one batch ------------------------------------------------------------------------

    def _open(self) -> int:
        if self._fd is None:
            flags = os.O_RDWR | os.O_APPEND | os.O_CLOEXEC | os.O_NOFOLLOW | os.O_CREAT
            try:
                # Every time, not only for a first record: a link (or another user's
                # directory) on the way would put the records outside the state dir.
                ensure_dir(self.path.parent)
                self._fd = os.open(self.path, flags, FILE_MODE)
            except OSError as exc:
                raise AuditError(
                    f"could not record to the audit log {self.path}: {exc.strerror or exc}",
                    audit_core.HINT_WRITE,
                ) from None
        return self._fd

    def _commit(self, batch: list[_Item]) -> int | None:
        """Write `batch` (no fsync); the file size up to which it is durable if it went
        through `Chain.append` (which fsyncs), else None."""
        durable_upto: int | None = None
        try:
            fd = self._open()
            fcntl.flock(fd, fcntl.LOCK_EX)
        except AuditError as exc:
            for b in batch:
                b.error = exc
            return None
        except OSError as exc:
            err = AuditError(
                f"could not record to the audit log {self.path}: lock failed: "
                f"{exc.strerror or exc}",
                audit_core.HINT_WRITE,
            )
            for b in batch:
                b.error = err
            return None
        try:
            size = os.fstat(fd).st_size
            rest = batch
            while rest and (self._tail is None or self._size != size):
                # Unknown or foreign state: let the chain itself read (and repair) the tail.
                fcntl.flock(fd, fcntl.LOCK_UN)
                try:
                    while True:
                        first = rest[0]
                        try:
                            first.record = self.chain.append(first.type, first.data)
                            break
                        except AuditError as exc:
                            if not self._unrecordable(first):
                                for b in rest:  # the log itself failed: nothing goes in
                                    b.error = exc
                                return None
                            # Only this record cannot be written (as in `_write`): the
                            # others of the batch are someone else's calls and still go in.
                            first.error = exc
                            rest = rest[1:]
                            if not rest:
                                return None
                finally:
                    fcntl.flock(fd, fcntl.LOCK_EX)
                rec = first.record
                self.records += 1
                rest = rest[1:]
                size = durable_upto = os.fstat(fd).st_size
                # The lock was let go around that append: another process may have appended
                # after our record. Keep our record as the tail only if it still is the last
                # line; else the next record goes through `Chain.append` again (which reads the
                # real tail), never chained onto ours beside theirs (a fork).
                if self._is_tail(fd, size, rec.hash):
                    self._tail = (rec.seq + 1, rec.hash, rec.ts)
                    self._size = size
                else:
                    self._tail = self._size = None
            if rest:
                self._write(fd, rest)
        except OSError as exc:
            err = AuditError(
                f"could not record to the audit log {self.path}: {exc.strerror or exc}",
                audit_core.HINT_WRITE,
            )
            for b in batch:
                if b.record is None:
                    b.error = err
        finally:
            with contextlib.suppress(OSError):
                fcntl.flock(fd, fcntl.LOCK_UN)
        return durable_upto

    @staticmethod
    def _is_tail(fd: int, size: int, hash_: str) -> bool:
        """Whether the file (locked, `size` bytes) ends with the complete record `hash_`."""
        try:
            line, torn_at = audit_core.tail_line(fd, size)
        except AuditError:
            return False
        if line is None or torn_at is not None:
            return False
        try:
            return bool(audit_chain.check_line(line).hash == hash_)
        except audit_chain.BadRecord:
            return False

    def _write(self, fd: int, items: list[_Item]) -> None:
        """Append the records with one write (their fsync is the sync role's business)."""
        if self._tail is None or self._size is None:
            err = AuditError(
                "could not record to the audit log: its tail is unknown", audit_core.HINT_VERIFY
            )
            for b in items:
                b.error = err
            return
        seq, prev, last_ts = self._tail
        lines: list[bytes] = []
        built: list[tuple[_Item, Any]] = []
        for item in items:
            try:
                rec, line = self._build(seq, prev, last_ts, item.type, item.data)
            except AuditError as exc:
                item.error = exc  # this record only; the others still go in
                continue
            lines.append(line)
            built.append((item, rec))
            seq, prev, last_ts = rec.seq + 1, rec.hash, rec.ts
        if not lines:
            return
        payload = b"".join(lines)
        base = self._size
        try:
            view = memoryview(payload)
            while view:
                view = view[os.write(fd, view) :]
        except OSError as exc:
            # Nothing of a failed write may remain: none of its actions will happen.
            with contextlib.suppress(OSError):
                os.ftruncate(fd, base)
                os.fsync(fd)
            err = AuditError(
                f"could not record to the audit log {self.path}: {exc.strerror or exc}",
                audit_core.HINT_WRITE,
            )
            for item, _rec in built:
                item.error = err
            return
        for item, rec in built:
            item.record = rec
        self._tail = (seq, prev, last_ts)
        self._size = base + len(payload)
        self.batches += 1
        self.records += len(built)

    @classmethod
    def _unrecordable(cls, item: _Item) -> bool:
        """Whether `item` itself cannot be recorded (its type or data), whatever the log's
        state: built as if it came first (a real sequence number adds at most a few bytes)."""
        try:
            cls._build(0, "0" * 64, "", item.type, item.data)
        except AuditError:
            return True
        return False

    @staticmethod
    def _build(
        seq: int, prev: str, last_ts: str, typ: str, data: Mapping[str, Any]
    ) -> tuple[Any, bytes]:
        if not _TYPE_RE.fullmatch(typ):
            raise AuditError(
                f"could not record to the audit log: invalid event type {typ!r}",
                audit_core.HINT_EVENT_TYPE,
            )
        ts = max(audit_core.now_ts(), last_ts)
        try:
            # The chain module's encoder: canonical bytes, C-accelerated when provably equal.
            data_bytes, stored = audit_core.encode_data(data)
        except (CanonicalError, RecursionError) as exc:
            raise AuditError(
                f"could not record to the audit log: the event data cannot be recorded: {exc}",
                audit_core.HINT_UNCANONICAL,
            ) from None
        head, after = audit_core.encode_record(seq, ts, typ, prev, data_bytes, None)
        h = hashlib.sha256(audit_core.DOMAIN + head + after).hexdigest()
        line = head + b',"hash":"' + h.encode("ascii") + b'"' + after + b"\n"
        if len(line) > audit_core.MAX_LINE:
            raise AuditError(
                "could not record to the audit log: record larger than "
                f"{audit_core.MAX_LINE} bytes",
                audit_core.HINT_TOO_LARGE,
            )
        rec = audit_chain.Record(
            seq=seq, ts=ts, type=typ, prev=prev, hash=h, data=stored, log_id=None
        )
        return rec, line
