"""The bridge's two writer threads: a `Lane` per direction runs "record, then act" steps in
arrival order once each record is written (group commit), and `Notices` writes the
`mcp.decision` events off the call's path."""

from __future__ import annotations

import collections
import threading
import time
from collections.abc import Callable
from typing import Any

from linpodx import events
from linpodx.errors import AuditError

LANE_BACKLOG_MAX = 256
"""Steps one direction may have queued before its reader waits (see `Lane.put`)."""
EVENT_LINGER = 0.02
"""Seconds the event writer lets a burst of `mcp.decision` events gather into one write."""


class Lane:
    """Runs "record, then act" steps of one direction in arrival order, off the reader thread.

    The reader submits each record at once and goes on parsing; this thread waits for each
    record to be written and then performs its action (what reaches the client also waits for
    the fsync, in `send_client`). Records of many in-flight messages thus share one write and
    one fsync (group commit), and no action ever runs before its record is written.
    """

    def __init__(self, chain: Any, name: str, log: Callable[[str], None]) -> None:
        self.chain = chain
        self.log = log
        self.queue: collections.deque[Any] = collections.deque()
        self.lock = threading.Lock()  # (`idle` takes it alone: no Condition's Python-level enter)
        self.cv = threading.Condition(self.lock)
        self.closed = False
        self.busy = False
        self.thread = threading.Thread(target=self._run, name=f"lane-{name}", daemon=True)
        self.thread.start()

    def put(self, ticket: Any, ok: Callable[[], None], fail: Callable[[AuditError], None]) -> None:
        """Queue a step; with LANE_BACKLOG_MAX steps waiting, wait for room first. That is the
        backpressure: a peer that does not read (a client ignoring stdout, a server ignoring
        stdin) blocks this lane, and then the reader feeding it, and so the other peer's
        writes, instead of the queue growing without bound (hundreds of MB in seconds)."""
        with self.cv:
            if threading.current_thread() is not self.thread:  # (never wait for ourselves)
                while len(self.queue) >= LANE_BACKLOG_MAX and not self.closed:
                    self.cv.wait(0.5)
            self.queue.append((ticket, ok, fail))
            self.cv.notify_all()

    def _run(self) -> None:
        while True:
            with self.cv:
                while not self.queue and not self.closed:
                    self.cv.wait()
                if not self.queue:
                    return
                ticket, ok, fail = self.queue.popleft()
                self.busy = True
            try:
                try:
                    self.chain.wait(ticket)
                except AuditError as exc:
                    fail(exc)
                else:
                    ok()
            except Exception as exc:  # one bad step must not stop the whole session
                self.log(
                    f"bridge: internal error in {self.thread.name}: {type(exc).__name__}: {exc}"
                )
            finally:
                with self.cv:
                    self.busy = False
                    self.cv.notify_all()

    def idle(self) -> bool:
        """Nothing queued and nothing running."""
        with self.lock:
            return not self.queue and not self.busy

    def settle(self, timeout: float) -> None:
        """Wait until every step queued so far ran (the thread keeps running)."""
        deadline = time.monotonic() + timeout
        with self.cv:
            while (self.queue or self.busy) and time.monotonic() < deadline:
                self.cv.wait(0.05)

    def drain(self, timeout: float) -> None:
        """Wait until every queued step ran, then stop the thread."""
        deadline = time.monotonic() + timeout
        self.settle(timeout)
        with self.cv:
            self.closed = True
            self.cv.notify_all()
        self.thread.join(max(0.0, deadline - time.monotonic()))


class Notices:
    """`mcp.decision` events, written off the call's path by one thread.

    The first event of a burst wakes the thread, which lets the burst gather for `linger`
    seconds and writes it at once: busy sessions pay one wake-up and one write per burst, not
    per call. A `prompt` or `deny` is written at once by the caller (`put_now`), after whatever
    is pending, so a person watching sees it before the approval it leads to, in call order.
    Events are notices for people, never records: a failed write is only logged.
    """

    def __init__(
        self, emit: Callable[..., Any], log: Callable[[str], None], linger: float = EVENT_LINGER
    ) -> None:
        self.emit = emit
        self.log = log
        self.linger = linger
        # `put` takes the plain lock alone: entering a Condition is a Python call, and its
        # default RLock one more (once per auto-allowed call).
        self.lock = threading.Lock()
        self.cv = threading.Condition(self.lock)
        self.writing = threading.Lock()  # batches are taken and written in order
        self.pending: list[dict[str, Any]] = []
        self.stopping = False
        self.thread = threading.Thread(target=self._run, name="events", daemon=True)
        self.thread.start()

    def put(self, data: dict[str, Any]) -> None:
        with self.lock:
            self.pending.append(data)
            if len(self.pending) == 1:
                self.cv.notify()

    def put_now(self, data: dict[str, Any]) -> None:
        """Write what is pending and `data` now, on the caller's thread."""
        with self.writing:
            with self.cv:
                batch, self.pending = [*self.pending, data], []
            self._write(batch)

    def close(self, timeout: float) -> None:
        """Write what is pending, then stop the thread."""
        with self.cv:
            self.stopping = True
            self.cv.notify()
        self.thread.join(timeout)

    def _run(self) -> None:
        while True:
            with self.cv:
                while not self.pending and not self.stopping:
                    self.cv.wait()
                if not self.pending:
                    return
                stopping = self.stopping
            if not stopping:
                time.sleep(self.linger)
            with self.writing:
                with self.cv:
                    batch, self.pending = self.pending, []
                if batch:
                    self._write(batch)

    def _write(self, batch: list[dict[str, Any]]) -> None:
        items = [("mcp.decision", d) for d in batch]
        try:
            if self.emit is events.emit:
                events.emit_many(items)
            else:
                for t, d in items:
                    self.emit(t, **d)
        except OSError as exc:
            self.log(f"bridge: could not emit mcp.decision: {exc}")
