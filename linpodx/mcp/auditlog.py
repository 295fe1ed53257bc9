"""Group commit for a session's audit chain, and the one kind of record whose fsync may wait.

The bridge must not act before its record is on disk, and an fsync costs what the disk says it
costs (from ~0.1 ms idle to several ms under load). Writing and syncing are therefore two steps
with two roles: one thread at a time *writes* every record queued so far (one `write`), and one
thread at a time *syncs* (one `fsync` covering everything written before it started). Records
written while an fsync runs are covered together by the next one; a lone caller pays one write
and one fsync and no thread hand-off.

Durability rule (docs/mcp.md says the same, with its crash analysis):

- A *decision* record (requests in both directions, notifications, approvals, refusals, drops)
  goes through `append_written`, which returns once the record is written (`write(2)` done: the
  kernel holds it). The bridge acts on it (forwards the request to the server) only after it
  returns, and denies when it raises. The sync thread starts an fsync covering it at once, so
  the fsync overlaps the server's own work; `decisions_durable()` waits until every decision
  record written so far (or up to the answered call's, `upto`) is fsync'd, and the bridge
  calls it before anything reaches the client (the server's answer, anything the server
  sends, linpodx's own answers): nobody sees an effect whose decision record is not on disk.
- `append` returns only once its record is written *and* fsync'd (`session.close`, and any
  caller that needs the record on disk before it returns).
- `append_deferred` returns once its record is written to the log file, before its fsync. Only
  outcome records (`mcp.response`: status and duration of an answered request) use it: the
  answer is passed on after the write. The record is then in the kernel's page cache, so it
  survives the bridge being killed, even with SIGKILL; it is made durable by the next fsync of
  the file: the next decision's, or the sync thread's at most `FLUSH_DELAY` seconds later,
  and always by `flush`/`close`, which every exit path of `mcp attach` runs. Only a crash of the
  whole machine before it reached the disk can lose it, and then the session also lacks its
  `session.close` record and its admin-chain anchor, which `audit verify --session` reports.
- A failed fsync may have lost anything it should have covered (Linux reports a writeback error
  once, later fsyncs succeed). The chain is then *failed*: the part not known to be durable is
  cut off (best effort), every waiting and later append raises AuditError (so the bridge denies
  every call from then on, and withholds every answer), `failure` says why and `on_failure` is
  told (the session ends). Nothing is dropped without a trace.

The file stays open for the whole session and the chain's tail (seq, hash, ts, size) is kept in
memory, so an append does not parse the file again. Each batch is written by the chain's one
writer (`audit.writer.append_locked`, in its group-commit mode: no fsync) holding the file's lock
for the whole batch; the file's size and its last line (one `pread`) are compared with what this
process last wrote, as `Chain.append` compares them, and if anyone else touched it (or on the
first write) the writer reads the real tail and repairs a torn line first, as `Chain.append`
does. The format is therefore the chain module's, not ours.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import threading
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from linpodx.audit import chain as audit_chain
from linpodx.audit import writer as audit_writer
from linpodx.audit.core import HINT_WRITE
from linpodx.errors import AuditError

FLUSH_DELAY = 0.05
"""Seconds a deferred record may wait for its fsync (if no decision record comes first)."""

SYNCED = "synced"
"""`wait` returns once the record is written and fsync'd (`append`)."""
WRITTEN = "written"
"""A decision record: `wait` returns once it is written; its fsync starts at once, and
`decisions_durable` waits for it (`append_written`)."""
DEFERRED = "deferred"
"""An outcome record: `wait` returns once it is written; fsync'd within FLUSH_DELAY."""


@dataclass(slots=True)
class _Item:
    type: str
    data: Mapping[str, Any]
    mode: str = SYNCED
    wake: bool = True
    """A WRITTEN record wakes the sync thread (False: its caller syncs after acting)."""
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
        self._where = str(chain.path)  # (what the audit writer's messages name, once)
        self.flush_delay = FLUSH_DELAY if flush_delay is None else flush_delay
        self._lock = threading.Lock()
        self._cv = threading.Condition(self._lock)  # writers and syncers wait here
        self._flush_cv = threading.Condition(self._lock)  # the sync thread waits here
        self._waiters = 0  # threads waiting on _cv (see `_wait`)
        self._queue: list[_Item] = []
        self._writing = False
        self._syncing = False
        self._fd: int | None = None
        self._tail: tuple[int, str, str] | None = None  # (next seq, prev hash, last ts)
        self._size: int | None = None  # the file's size after our last write (writer's view)
        self._last = b""  # the last line we wrote, with its newline (the file must end so)
        self._written_size: int | None = None  # the same, as of the last finished generation
        self._gen = 0  # write generations done
        self._synced_gen = 0  # every generation up to this one is durable
        self._synced_size: int | None = None  # the file's size when that sync started
        self._decided_gen = 0  # the last generation that carried a decision record (WRITTEN)
        self._deferred_gen = 0  # the last generation that carried a deferred record
        self._syncer_idle = False  # the sync thread waits with no deadline
        self._flusher: threading.Thread | None = None  # the sync thread
        self._closed = False
        self.failure: AuditError | None = None
        self.on_failure: Callable[[AuditError], None] | None = None
        """Told once when the chain fails (with the lock held: it must only note it)."""
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
        return self._append_now(_Item(type, data, SYNCED))

    def append_written(self, type: str, data: Mapping[str, Any], wake: bool = True) -> Any:
        """Write one decision record now; its fsync starts at once in the sync thread, and
        `decisions_durable` waits for it (see the module's durability rule). `wake=False`: the
        caller calls `decisions_durable` itself right after acting (the bridge's reader, for a
        lone call: the fsync then overlaps the server's work with no thread woken for it)."""
        return self._append_now(_Item(type, data, WRITTEN, wake=wake))

    def append_deferred(self, type: str, data: Mapping[str, Any]) -> Any:
        """Write one outcome record now and fsync it later (see the module's durability rule)."""
        return self._append_now(_Item(type, data, DEFERRED))

    def _append_now(self, item: _Item) -> Any:
        """`wait(submit(…))` in one hold of the lock (a lone caller: every call of the bridge)."""
        with self._lock:
            self._queue.append(item)
            self._settle(item)
        if item.error is not None:
            raise item.error
        return item.record

    def submit(self, type: str, data: Mapping[str, Any], mode: str = SYNCED) -> _Item:
        """Queue a record without waiting; `wait(ticket)` returns once it is written and, for
        `SYNCED`, fsync'd."""
        item = _Item(type, data, mode)
        with self._lock:
            self._queue.append(item)
        return item

    def wait(self, item: _Item) -> Any:
        """Block until `item` is written (writing the queue ourselves if nobody is) and, for
        `SYNCED`, durable (syncing ourselves if nobody is); its Record, or raise AuditError."""
        with self._lock:
            self._settle(item)
        if item.error is not None:
            raise item.error
        return item.record

    def _settle(self, item: _Item) -> None:
        """`wait`'s work, with the lock held."""
        while not item.written:
            if self._writing:
                self._wait()
            else:
                self._write_queue()
        if item.error is None and self.failure is not None:
            item.error = self.failure  # (written into a chain that failed meanwhile)
        if item.error is None and item.mode == SYNCED:
            self._sync_through(item.gen)
            if self._synced_gen < item.gen:
                item.error = self.failure
        elif item.error is None and item.mode == DEFERRED and self._synced_gen < item.gen:
            self._defer(item.gen)

    def _wait(self) -> None:
        """Wait on `_cv` (lock held), counted: a notify with nobody waiting is skipped (it is
        Python code, paid twice per call otherwise)."""
        self._waiters += 1
        try:
            self._cv.wait()
        finally:
            self._waiters -= 1

    def _notify_all(self) -> None:
        if self._waiters:
            self._cv.notify_all()

    @property
    def decided_gen(self) -> int:
        """The write generation of the last decision record written (for `decisions_durable`)."""
        return self._decided_gen

    def decisions_durable(self, upto: int | None = None) -> None:
        """Return once every decision record written so far (or up to generation `upto`, a
        `decided_gen` read earlier) is fsync'd (the sync thread's fsync, usually under way
        already); raise AuditError if the chain failed. Called before anything reaches the
        client."""
        with self._lock:
            target = self._decided_gen if upto is None else min(upto, self._decided_gen)
            if self._synced_gen >= target and self.failure is None:
                return  # (the usual case once the fsync overlapped the server's work)
            self._sync_through(target)
            if self.failure is not None:
                raise self.failure

    def flush(self) -> None:
        """Make every record written so far durable; raise AuditError if that failed."""
        with self._lock:
            while self._writing:
                self._wait()
            self._sync_through(self._gen)
            if self.failure is not None:
                raise self.failure

    def close(self) -> None:
        """Flush, stop the flusher and close the file (appends after this reopen it). A failed
        flush stays in `failure` for the caller to report."""
        with contextlib.suppress(AuditError):  # kept in self.failure
            self.flush()
        with self._lock:
            self._closed = True
            self._flush_cv.notify()
            flusher = self._flusher
        if flusher is not None:
            flusher.join()
        with self._lock:
            while self._writing or self._syncing:  # never close the fd under a write
                self._wait()
            self._flusher = None
            self._closed = False
            if self._fd is not None:
                with contextlib.suppress(OSError):
                    os.close(self._fd)
                self._fd = None
                self._size = None

    # ---- the two roles (called with self._lock held) --------------------------------------

    def _write_queue(self) -> None:
        """Take the writer role and write everything queued (the lock is dropped meanwhile)."""
        self._writing = True
        batch, self._queue = self._queue, []
        failure = self.failure
        durable_upto: int | None = None
        self._lock.release()
        try:
            if failure is not None:
                for b in batch:
                    b.error = failure
            else:
                durable_upto = self._commit(batch)
        finally:
            self._lock.acquire()
            self._writing = False
            self._gen += 1
            self._written_size = self._size
            if durable_upto is not None:
                self._synced_size = max(self._synced_size or 0, durable_upto)
            decided = wake = False
            for b in batch:
                b.written = True
                b.gen = self._gen
                if b.mode == WRITTEN and b.error is None:
                    decided, wake = True, wake or b.wake
            if decided:
                self._decided_gen = self._gen
            if wake:
                self._wake_syncer()
            if self._waiters:  # (`_notify_all`, inline: once per write)
                self._cv.notify_all()

    def _sync_through(self, gen: int) -> None:
        """Return once generation `gen` is durable or the chain failed (fsync'ing ourselves if
        nobody is: one fsync covers every generation written before it started)."""
        while self._synced_gen < gen and self.failure is None:
            if self._syncing:
                self._wait()
                continue
            self._syncing = True
            target, size, fd = self._gen, self._written_size, self._fd
            self._lock.release()
            error: OSError | None = None
            try:
                if fd is not None:
                    os.fsync(fd)
            except OSError as exc:
                error = exc
            finally:
                self._lock.acquire()
                self._syncing = False
            if error is None:
                self._synced_gen = max(self._synced_gen, target)
                if size is not None:
                    self._synced_size = max(self._synced_size or 0, size)
                self.syncs += 1
            else:
                self._fail(error)
            self._notify_all()

    def _fail(self, exc: OSError) -> None:
        """A sync failed: cut what is not known durable, refuse every append from now on."""
        self.failure = AuditError(
            f"could not record to the audit log {self.path}: fsync failed "
            f"({exc.strerror or exc}); this session can record, and so do, nothing more",
            HINT_WRITE,
        )
        while self._writing:
            self._wait()
        if self._fd is not None and self._synced_size is not None:
            with contextlib.suppress(OSError):
                os.ftruncate(self._fd, self._synced_size)
                os.fsync(self._fd)
        self._tail = None
        if self.on_failure is not None:
            self.on_failure(self.failure)

    def _wake_syncer(self) -> None:
        """Make sure the sync thread runs and looks again (a decision was written, or a
        deferred record came while it was idle)."""
        if self._flusher is None:
            self._flusher = threading.Thread(target=self._sync_loop, name="audit-sync", daemon=True)
            self._flusher.start()
        else:
            self._flush_cv.notify()

    def _defer(self, gen: int) -> None:
        """Generation `gen` carries a deferred record: a sync must come within `flush_delay`.
        A sync thread that ticks (see `_sync_loop`) finds it by itself: only an idle one is
        woken (a wake-up per answer would cost a thread switch per call)."""
        self._deferred_gen = max(self._deferred_gen, gen)
        if self._flusher is None or self._syncer_idle:
            self._wake_syncer()

    def _sync_loop(self) -> None:
        """The sync thread: fsyncs every decision record written by a caller that does not
        sync it itself, as soon as it is written (so the fsync overlaps the server's work), and
        deferred records nobody else's fsync covered: it looks every `flush_delay / 2` while
        they keep coming, so none waits longer than `flush_delay`, and sleeps until woken once
        a look finds nothing to do."""
        tick = self.flush_delay / 2
        with self._lock:
            while not self._closed:
                if self.failure is None and self._decided_gen > self._synced_gen:
                    self._sync_through(self._decided_gen)
                    continue
                if self.failure is not None or self._deferred_gen <= self._synced_gen:
                    self._syncer_idle = True
                    self._flush_cv.wait()
                    self._syncer_idle = False
                    continue
                self._flush_cv.wait(tick)
                if self._closed or self._decided_gen > self._synced_gen:
                    continue
                # Deferred records older than a tick that no decision's fsync covered.
                self._sync_through(self._deferred_gen)

    # ---- one batch ------------------------------------------------------------------------

    def _open(self) -> int:
        if self._fd is None:
            self._fd = audit_writer.open_append(str(self.path))
        return self._fd

    def _commit(self, batch: list[_Item]) -> int | None:
        """Write `batch` (no fsync: the sync role's business) through the chain's one writer;
        the file size known durable before it when the tail had to be read (the first write,
        or the file changed under us), else None."""
        where = self._where
        try:
            fd = self._fd if self._fd is not None else self._open()
            audit_writer.lock(fd, where)
        except AuditError as exc:
            for b in batch:
                b.error = exc
            return None
        durable_upto: int | None = None
        try:
            size = os.fstat(fd).st_size
            # Our own tail while the file is as we left it: its size, and its last bytes still
            # the line we wrote last (with the newline before it), as the plain writer checks
            # (`writer._written_tail`), so a same-size rewrite is seen too; else (first write, or
            # anyone else touched it) the writer reads the real tail and repairs a torn line.
            known = None
            if self._tail is not None and self._size == size:
                last = self._last
                start = size - len(last)
                if start > 0:
                    start -= 1
                    last = b"\n" + last
                if start >= 0 and os.pread(fd, len(last), start) == last:
                    known = (self._tail, size)
            done = audit_writer.append_locked(
                fd, where, self.chain.genesis, [(b.type, b.data) for b in batch],
                known=known, sync=False,
            )
            if done is None:  # pragma: no cover - only the simple mode gives up
                raise AuditError(f"could not record to the audit log {where}", HINT_WRITE)
        except AuditError as exc:
            # The log itself failed: nothing of the batch went in (the writer cut it back).
            self._tail = self._size = None
            for b in batch:
                b.error = exc
            return None
        except OSError as exc:
            self._tail = self._size = None
            err = AuditError(
                f"could not record to the audit log {self.path}: {exc.strerror or exc}", HINT_WRITE
            )
            for b in batch:
                b.error = err
            return None
        finally:
            try:
                fcntl.flock(fd, fcntl.LOCK_UN)
            except OSError:
                pass  # (closing the file releases it; a try costs less than suppress())
        if known is None:
            durable_upto = done.base
        written = 0
        for b, result in zip(batch, done.results, strict=True):
            if isinstance(result, AuditError):
                b.error = result  # this record only; the others still went in
            else:
                b.record = audit_chain.Record(*result)
                written += 1
        if done.tail is not None:
            self._tail, self._size, self._last = done.tail, done.end, done.last
            self.batches += 1
            self.records += written
        return durable_upto
