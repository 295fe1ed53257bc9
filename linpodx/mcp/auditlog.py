"""Group commit for a session's audit chain.

The bridge must not act before its record is on disk, and an fsync costs what the disk says it
costs (from ~0.1 ms idle to several ms under load). With many calls in flight, paying one fsync
per record caps throughput at the disk's fsync rate; so records that arrive while a write is
in progress are written together, with one write and one fsync, and every caller returns only
after the fsync that covers its record (leader/follower: no extra thread, no extra latency for a
lone caller).

The file stays open for the whole session and the chain's tail (seq, hash, ts, size) is kept in
memory, so an append does not re-read the file. Before each batch the file is locked and its size
compared with what this process last wrote: if anyone else touched it (or on the first batch),
the first record goes through `Chain.append`, which reads the tail and repairs a torn line, and
the in-memory tail is taken from its result. Records are encoded with the chain's own
`encode_record`, so the format is the chain module's, not ours.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import os
import re
import threading
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from linpodx.audit import chain as audit_chain
from linpodx.canonical import CanonicalError, canonical_bytes
from linpodx.errors import AuditError
from linpodx.paths import FILE_MODE, ensure_dir


def _encode_data(data: Any) -> tuple[bytes, Any]:
    encode = getattr(audit_chain, "encode_data", None)
    if encode is not None:
        return encode(data)  # type: ignore[no-any-return]
    raw = canonical_bytes(data)
    return raw, json.loads(raw)


_TYPE_RE = re.compile(r"^[a-z][a-z0-9_]*(?:\.[a-z][a-z0-9_]*)+$")


@dataclass
class _Item:
    type: str
    data: Mapping[str, Any]
    done: bool = False
    record: Any = None
    error: AuditError | None = None
    extra: dict[str, Any] = field(default_factory=dict)


class GroupCommitChain:
    """`append(type, data) -> Record` like `Chain.append`, batching concurrent callers."""

    def __init__(self, chain: audit_chain.Chain) -> None:
        self.chain = chain
        self.path = chain.path
        self._cv = threading.Condition()
        self._queue: list[_Item] = []
        self._writing = False
        self._fd: int | None = None
        self._tail: tuple[int, str, str] | None = None  # (next seq, prev hash, last ts)
        self._size: int | None = None
        self.batches = 0
        self.records = 0

    def append(self, type: str, data: Mapping[str, Any]) -> Any:
        """Record one event durably (possibly with others in one fsync), or raise AuditError."""
        return self.wait(self.submit(type, data))

    def submit(self, type: str, data: Mapping[str, Any]) -> _Item:
        """Queue a record without waiting; `wait(ticket)` returns once it is on disk."""
        item = _Item(type, data)
        with self._cv:
            self._queue.append(item)
        return item

    def wait(self, item: _Item) -> Any:
        """Block until `item` is durable (writing the queue ourselves if nobody is); its Record."""
        with self._cv:
            while not item.done:
                if self._writing:
                    self._cv.wait()
                    continue
                self._writing = True
                batch, self._queue = self._queue, []
                self._cv.release()
                try:
                    self._commit(batch)
                finally:
                    self._cv.acquire()
                    self._writing = False
                    for b in batch:
                        b.done = True
                    self._cv.notify_all()
        if item.error is not None:
            raise item.error
        return item.record

    def close(self) -> None:
        """Close the file (appends after this reopen it)."""
        with self._cv:
            if self._fd is not None:
                with contextlib.suppress(OSError):
                    os.close(self._fd)
                self._fd = None
                self._size = None

    # ---- one batch ------------------------------------------------------------------------

    def _open(self) -> int:
        if self._fd is None:
            flags = os.O_RDWR | os.O_APPEND | os.O_CLOEXEC | os.O_NOFOLLOW | os.O_CREAT
            try:
                try:
                    self._fd = os.open(self.path, flags, FILE_MODE)
                except FileNotFoundError:
                    ensure_dir(self.path.parent)  # first record of this log: dirs are 0700
                    self._fd = os.open(self.path, flags, FILE_MODE)
            except OSError as exc:
                raise AuditError(
                    f"could not record to the audit log {self.path}: {exc.strerror or exc}",
                    audit_chain.HINT_WRITE,
                ) from None
        return self._fd

    def _commit(self, batch: list[_Item]) -> None:
        try:
            fd = self._open()
            fcntl.flock(fd, fcntl.LOCK_EX)
        except AuditError as exc:
            for b in batch:
                b.error = exc
            return
        except OSError as exc:
            err = AuditError(
                f"could not record to the audit log {self.path}: lock failed: "
                f"{exc.strerror or exc}",
                audit_chain.HINT_WRITE,
            )
            for b in batch:
                b.error = err
            return
        try:
            size = os.fstat(fd).st_size
            rest = batch
            if self._tail is None or self._size != size:
                # Unknown or foreign state: let the chain itself read (and repair) the tail.
                fcntl.flock(fd, fcntl.LOCK_UN)
                first = batch[0]
                try:
                    first.record = self.chain.append(first.type, first.data)
                except AuditError as exc:
                    for b in batch:
                        b.error = exc
                    return
                finally:
                    fcntl.flock(fd, fcntl.LOCK_EX)
                rec = first.record
                self._tail = (rec.seq + 1, rec.hash, rec.ts)
                self._size = os.fstat(fd).st_size
                self.records += 1
                rest = batch[1:]
                if self._size != os.fstat(fd).st_size:  # pragma: no cover - raced again
                    self._tail = None
            if rest:
                self._write(fd, rest)
        except OSError as exc:
            err = AuditError(
                f"could not record to the audit log {self.path}: {exc.strerror or exc}",
                audit_chain.HINT_WRITE,
            )
            for b in batch:
                if b.record is None:
                    b.error = err
        finally:
            with contextlib.suppress(OSError):
                fcntl.flock(fd, fcntl.LOCK_UN)

    def _write(self, fd: int, items: list[_Item]) -> None:
        if self._tail is None or self._size is None:
            err = AuditError(
                "could not record to the audit log: its tail is unknown", audit_chain.HINT_VERIFY
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
            os.fsync(fd)
        except OSError as exc:
            # Nothing of a failed batch may remain: none of its actions will happen.
            with contextlib.suppress(OSError):
                os.ftruncate(fd, base)
                os.fsync(fd)
            err = AuditError(
                f"could not record to the audit log {self.path}: {exc.strerror or exc}",
                audit_chain.HINT_WRITE,
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

    @staticmethod
    def _build(
        seq: int, prev: str, last_ts: str, typ: str, data: Mapping[str, Any]
    ) -> tuple[Any, bytes]:
        if not _TYPE_RE.fullmatch(typ):
            raise AuditError(f"could not record to the audit log: invalid event type {typ!r}")
        ts = max(audit_chain.now_ts(), last_ts)
        try:
            # The chain module's encoder: canonical bytes, C-accelerated when provably equal.
            data_bytes, stored = _encode_data(data)
        except (CanonicalError, RecursionError) as exc:
            raise AuditError(
                f"could not record to the audit log: the event data cannot be recorded: {exc}"
            ) from None
        head, after = audit_chain.encode_record(seq, ts, typ, prev, data_bytes, None)
        h = hashlib.sha256(audit_chain.DOMAIN + head + after).hexdigest()
        line = head + b',"hash":"' + h.encode("ascii") + b'"' + after + b"\n"
        if len(line) > audit_chain.MAX_LINE:
            raise AuditError(
                "could not record to the audit log: record larger than "
                f"{audit_chain.MAX_LINE} bytes"
            )
        rec = audit_chain.Record(
            seq=seq, ts=ts, type=typ, prev=prev, hash=h, data=stored, log_id=None
        )
        return rec, line
