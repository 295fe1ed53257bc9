"""Recording what the resolver decides about names, for people (events) and for the record
(admin audit chain), bounded so a hostile container cannot flood either.

Two kinds, each bounded on its own (a flood of one never hides the other):
- `dns.denied`: a lookup denied. Per container, at most `max_records` records per `window`
  seconds, each (name, reason) at most once per window; everything past that is counted and
  written as ONE summary record (`suppressed: N`). So at most max_records + 1 records per
  window (defaults: 31 per minute). The lookup is denied whatever happens to the record: a
  failing audit append is logged, never turned into an allow.
- `dns.wildcard`: a new name under a wildcard is about to be asked upstream (the wildcard
  budget admitted it). The first `max_records` per window are written one by one; past that
  the names go into summary records that list them (`names`, at most SUMMARY_NAMES each).
  Either way a name's record is written BEFORE its lookup goes on (an allow is recorded
  before it takes effect): a name past the bound waits for the summary write that carries
  it, and the names that arrive while one write is under way share the next one (a group
  commit), so a burst costs a few writes, not one per name. So every name that left is in
  the audit chain, even if the guard is killed right after. The budget bounds how many
  there are (`linpodx.egress.budget`). If a name's record cannot be written, or the last
  write failed, `new_name` says so and the resolver refuses the lookup instead.

Denial summaries are written when the window ends (`tick`, called each second by the guard,
or the next record) and when the guard stops (`flush`).
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

log = logging.getLogger(__name__)

Sink = Callable[[str, dict[str, Any]], None]
_Record = tuple[str, dict[str, Any]]
_Write = tuple[_Record, "_Batch | None"]
"""A record to write, and the batch of names it carries (set as written once it is)."""

SUMMARY_NAMES = 256
"""New names listed in one `dns.wildcard` summary record at most (~64 KiB)."""


@dataclass
class _Bucket:
    """One kind's share of a window."""

    seen: set[tuple[str, str]] = field(default_factory=set)
    written: int = 0
    suppressed: int = 0


@dataclass
class _Batch:
    """New names waiting for the one summary record that will list them all."""

    names: list[str] = field(default_factory=list)
    written: threading.Event = field(default_factory=threading.Event)
    """Set once the summary was written, or failed (`ok` says which)."""
    ok: bool = False


class DenialRecorder:
    """Rate-limited writer of `dns.denied` and `dns.wildcard` records."""

    def __init__(
        self,
        container: str,
        sink: Sink,
        *,
        max_records: int = 30,
        window: float = 60.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._container = container
        self._sink = sink
        self._max = max_records
        self._window = window
        self._clock = clock
        self._lock = threading.Lock()
        # Writes happen outside the lock (an audit append fsyncs); this one keeps them in
        # the order they were decided, so a summary never lands before what it follows.
        self._write_lock = threading.Lock()
        self._start = clock()
        self._denied = _Bucket()
        self._new = _Bucket()
        self._waiting = _Batch()
        self._sink_failed = False

    def deny(self, name: str, rtype: str, reason: str) -> None:
        """Note one denial; write a record unless the bound says to count it instead."""
        with self._lock:
            out = self._rolled()
            b = self._denied
            key = (name, reason)
            if key in b.seen or b.written >= self._max:
                b.suppressed += 1
            else:
                b.seen.add(key)
                b.written += 1
                out.append(
                    (
                        (
                            "dns.denied",
                            {
                                "container": self._container,
                                "name": name,
                                "qtype": rtype,
                                "reason": reason,
                                "message": f"dns lookup denied for {name}",
                            },
                        ),
                        None,
                    )
                )
        self._write_all(out)

    def new_name(self, name: str, wildcard: str, used: int, budget: int, window: str) -> bool:
        """Note a new name about to be asked upstream under `wildcard` (`used` of `budget`
        names in the budget's `window`, e.g. `10 minutes`), and return once its record (one
        by one, or a summary listing it) is written. False if it could not be recorded: its
        record failed, or the last write failed (the resolver then refuses the lookup)."""
        batch: _Batch | None = None
        with self._lock:
            out = self._rolled()
            b = self._new
            mine: int | None = None  # which write carries this name, if one now does
            if b.written < self._max:
                b.written += 1
                mine = len(out)
                out.append(
                    (
                        (
                            "dns.wildcard",
                            {
                                "container": self._container,
                                "name": name,
                                "wildcard": wildcard,
                                "used": used,
                                "budget": budget,
                                "message": f"dns lookup of new name {name} under {wildcard} "
                                f"({used} of {budget} per {window})",
                            },
                        ),
                        None,
                    )
                )
            elif self._sink_failed:
                # Its summary would go to a sink that just failed: refuse it now rather
                # than hold the lookup for a write that is likely to fail too.
                mine = -1
            else:
                batch = self._waiting
                batch.names.append(name)
                if len(batch.names) >= SUMMARY_NAMES:
                    out.extend(self._new_summary())
        ok = self._write_all(out)
        if batch is None:
            return mine is not None and mine >= 0 and ok[mine]
        if not batch.written.is_set():
            # Write the batch ourselves unless another thread took it (it then writes it):
            # the names that joined while we waited for the write lock go in the same record.
            with self._write_lock:
                with self._lock:
                    take = self._new_summary() if self._waiting is batch else []
                self._write_locked(take)
            batch.written.wait()
        return batch.ok

    def tick(self) -> None:
        """Write the summaries of a window that has ended (the guard calls this each second,
        so they come out on time even when no further record does)."""
        with self._lock:
            out = self._rolled()
        self._write_all(out)

    def flush(self) -> None:
        """Write the pending summaries (called when the guard stops)."""
        with self._lock:
            out = self._summaries()
        self._write_all(out)

    def _rolled(self) -> list[_Write]:
        """The summaries of the window, if it has ended (a new one starts now)."""
        now = self._clock()
        if now - self._start < self._window:
            return []
        self._start = now
        return self._summaries()

    def _summaries(self) -> list[_Write]:
        out: list[_Write] = []
        if self._denied.suppressed:
            n = self._denied.suppressed
            out.append(
                (
                    (
                        "dns.denied",
                        {
                            "container": self._container,
                            "suppressed": n,
                            "message": f"{n} more dns lookups denied (not recorded one by one)",
                        },
                    ),
                    None,
                )
            )
        out.extend(self._new_summary())
        self._denied = _Bucket()
        self._new = _Bucket()
        return out

    def _new_summary(self) -> list[_Write]:
        """The waiting names' summary (taken: later names wait for the next one)."""
        batch, self._waiting = self._waiting, _Batch()
        if not batch.names:
            batch.ok = True
            batch.written.set()
            return []
        n = len(batch.names)
        record = (
            "dns.wildcard",
            {
                "container": self._container,
                "names": batch.names,
                "suppressed": n,
                "message": f"{n} more new names looked up under wildcards (listed in "
                "the record, not one by one)",
            },
        )
        return [(record, batch)]

    def _write_all(self, out: list[_Write]) -> list[bool]:
        with self._write_lock:
            return self._write_locked(out)

    def _write_locked(self, out: list[_Write]) -> list[bool]:
        done = []
        for (kind, data), batch in out:
            ok = self._write(kind, data)
            if batch is not None:
                batch.ok = ok
                batch.written.set()
            done.append(ok)
        return done

    def _write(self, kind: str, data: dict[str, Any]) -> bool:
        try:
            self._sink(kind, data)
        except Exception:  # the lookup stays denied (or is refused); say so in the guard log
            log.exception("could not record %s", kind)
            self._sink_failed = True
            return False
        self._sink_failed = False
        return True


def default_sink(kind: str, data: dict[str, Any]) -> None:
    """Admin audit chain first (the record of truth), then the event stream for people."""
    from linpodx import events

    audit_exc: Exception | None = None
    try:
        from linpodx.audit.chain import admin_chain

        admin_chain().append(kind, data)
    except Exception as exc:  # recorded below; the event still tells the person
        audit_exc = exc
    events.emit(kind, **data)
    if audit_exc is not None:
        raise audit_exc
