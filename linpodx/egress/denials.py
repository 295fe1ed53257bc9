"""Recording denied lookups for people (events) and for the record (admin audit chain),
bounded so a hostile container cannot flood either.

Bound: per container, at most `max_records` denial records per `window` seconds, each name at
most once per window; everything past that is counted and written as ONE summary record
(`suppressed: N`) when the next window starts or the guard stops. So at most
max_records + 1 records per window (defaults: 31 per minute). The lookup is denied whatever
happens to the record: a failing audit append is logged, never turned into an allow.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from typing import Any

log = logging.getLogger(__name__)

Sink = Callable[[str, dict[str, Any]], None]


class DenialRecorder:
    """Rate-limited writer of `dns.denied` and `egress.denied` records."""

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
        self._start = clock()
        self._seen: set[tuple[str, str, str]] = set()
        self._written = 0
        self._suppressed: dict[str, int] = {}

    def deny(self, name: str, rtype: str, reason: str) -> None:
        """Note one denied lookup; write a record unless the bound says to count it instead."""
        self._note(
            "dns.denied",
            (name, reason),
            {
                "name": name,
                "qtype": rtype,
                "reason": reason,
                "message": f"dns lookup denied for {name}",
            },
        )

    def deny_connection(self, target: str, address: str, reason: str) -> None:
        """Note one refused connection (`target`: what it asked for, `NAME:PORT` or
        `ADDRESS:PORT`), under the same bound as the lookups."""
        self._note(
            "egress.denied",
            (target, reason),
            {
                "target": target,
                "address": address,
                "reason": reason,
                "message": f"egress denied: {target} to {address} ({reason})",
            },
        )

    def _note(self, kind: str, key: tuple[str, str], data: dict[str, Any]) -> None:
        out: list[tuple[str, dict[str, Any]]] = []
        with self._lock:
            now = self._clock()
            if now - self._start >= self._window:
                out.extend(self._roll())
                self._start = now
            if (kind, *key) in self._seen or self._written >= self._max:
                self._suppressed[kind] = self._suppressed.get(kind, 0) + 1
            else:
                self._seen.add((kind, *key))
                self._written += 1
                out.append((kind, {"container": self._container, **data}))
        for k, d in out:
            self._write(k, d)

    def flush(self) -> None:
        """Write the pending summary (called when the guard stops)."""
        with self._lock:
            out = self._roll()
        for kind, data in out:
            self._write(kind, data)

    def _roll(self) -> list[tuple[str, dict[str, Any]]]:
        out: list[tuple[str, dict[str, Any]]] = []
        for kind, n in sorted(self._suppressed.items()):
            what = "dns lookups" if kind == "dns.denied" else "connections"
            out.append(
                (
                    kind,
                    {
                        "container": self._container,
                        "suppressed": n,
                        "message": f"{n} more {what} denied (not recorded one by one)",
                    },
                )
            )
        self._seen.clear()
        self._written = 0
        self._suppressed = {}
        return out

    def _write(self, kind: str, data: dict[str, Any]) -> None:
        try:
            self._sink(kind, data)
        except Exception:  # the lookup stays denied; say so in the guard log
            log.exception("could not record %s", kind)


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
