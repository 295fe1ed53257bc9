"""The event stream `linpodx events` follows: an append-only JSON-lines file under the state dir.

Like `podman events` with the file logger: writers append one line each under an exclusive
flock; readers poll the file. Nothing resident is needed. An event is a notification for people,
never a record of truth: the audit chain is that.

This module writes the stream (every command that emits loads it, the container service
included); `linpodx.events.reader` reads it (`linpodx events`), with the audit chain's
bounded line reader, which a writer need not load.
"""

from __future__ import annotations

import errno
import fcntl
import json
import os
import stat
from datetime import UTC, datetime
from typing import Any

from linpodx.paths import FILE_MODE, ensure_dir, events_file

EVENT_TYPES = (
    "approval.pending",
    "approval.decided",
    "approval.granted",
    "mcp.decision",
    "container.start",
    "container.stop",
    "container.rm",
    "container.exec",
    "container.attach",
    "dns.denied",
    "dns.wildcard",
    "egress.denied",
    "snapshot.create",
    "snapshot.rm",
    "snapshot.rollback",
)
"""Every type linpodx writes to the stream (tests/unit checks the emitters against it): what
`linpodx events --filter` accepts, with their first components."""


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
    _append((json.dumps(event, ensure_ascii=False, separators=(",", ":")) + "\n").encode())
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
    _append(data)
    return out


_APPEND_FLAGS = (
    os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_NONBLOCK | os.O_NOFOLLOW | os.O_CLOEXEC
)


def _append(data: bytes) -> None:
    """Append whole lines to the stream under its lock. Only to a regular file, opened without
    blocking or following a link: a FIFO put in its place would otherwise hang every command
    that emits (OSError instead, which emitters treat as a lost notice)."""
    path = events_file()
    ensure_dir(path.parent)
    fd = os.open(path, _APPEND_FLAGS, FILE_MODE)
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise OSError(errno.EINVAL, "the event stream is not a regular file", str(path))
        fcntl.flock(fd, fcntl.LOCK_EX)
        os.write(fd, data)
    finally:
        os.close(fd)
