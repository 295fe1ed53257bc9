"""The event stream `linpodx events` follows: an append-only JSON-lines file under the state dir.

Like `podman events` with the file logger: writers append one line each under an exclusive
flock; readers poll the file. Nothing resident is needed. An event is a notification for people,
never a record of truth: the audit chain is that.
"""

from __future__ import annotations

import fcntl
import json
import os
from datetime import UTC, datetime
from typing import Any

from linpodx.paths import FILE_MODE, ensure_dir, events_file


def now_iso() -> str:
    """UTC time as `2026-11-30T04:32:19.123456Z`."""
    return datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def emit(event_type: str, **data: Any) -> dict[str, Any]:
    """Append one event `{"ts", "type", ...data}` and return it.

    `event_type` is dotted: `approval.pending`, `approval.decided`, `mcp.decision`,
    `container.start`, `dns.denied`, `snapshot.create`, … `linpodx events --filter approval`
    matches the first component.
    """
    event = {"ts": now_iso(), "type": event_type, **data}
    line = (json.dumps(event, ensure_ascii=False, separators=(",", ":")) + "\n").encode()
    path = events_file()
    ensure_dir(path.parent)
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, FILE_MODE)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        os.write(fd, line)
    finally:
        os.close(fd)
    return event


def emit_many(items: list[tuple[str, dict[str, Any]]]) -> list[dict[str, Any]]:
    """Append several events with one open, one lock and one write (busy emitters batch).

    Each item is `(event_type, data)`; the lines are exactly what `emit` would write.
    """
    if not items:
        return []
    out = [{"ts": now_iso(), "type": t, **d} for t, d in items]
    data = b"".join(
        (json.dumps(e, ensure_ascii=False, separators=(",", ":")) + "\n").encode() for e in out
    )
    path = events_file()
    ensure_dir(path.parent)
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, FILE_MODE)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        os.write(fd, data)
    finally:
        os.close(fd)
    return out
