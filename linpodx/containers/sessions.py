"""Attached sessions: who is in a container's terminal right now, and what to tell them.

podman says nothing reliable about who is attached (`podman inspect` has no such field, and
conmon's attach socket is shared by every client), so linpodx keeps its own marker: `linpodx
run` without `--detach` (`attached_start`) and `linpodx attach` write
`containers_dir()/NAME/sessions/PID.json` for the life of the session and remove it after. A
marker counts only while its process lives (the pid and that process's start time, so a
reused pid of a killed session is not taken for it).

A rollback that stops the container (`linpodx.snapshot.rollback`) first leaves a notice beside
each live marker (`tell_all`); the session's process, once podman returns, prints it to the
terminal the person is looking at, with how to get back in.
"""

from __future__ import annotations

import contextlib
import json
import os
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from linpodx.containers.state import spec_dir
from linpodx.fsutil import NotRegularFile, atomic_write, read_small
from linpodx.output import note, safe_text
from linpodx.paths import ensure_dir

MAX_MARKER_BYTES = 4096
MAX_SESSIONS = 256
"""Markers `live` reads at most (each one is a person's terminal: far fewer in practice)."""


@dataclass(frozen=True)
class Session:
    """One attached session of a container."""

    pid: int
    """The linpodx process that holds the terminal (`run` or `attach`)."""
    how: str
    """`run` (the container's first start, attached) or `attach`."""
    marker: Path

    @property
    def notice_path(self) -> Path:
        return self.marker.with_suffix(".notice")

    def describe(self) -> str:
        return f"`linpodx {self.how}`, pid {self.pid}"


def _dir(name: str) -> Path:
    return spec_dir(name) / "sessions"


def _start_time(pid: int) -> str | None:
    """The start time of process `pid` (field 22 of /proc/PID/stat), None if there is none."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            stat = f.read().decode("ascii", "replace")
    except OSError:
        return None
    # The command name (field 2) is in parentheses and may hold spaces or `)`.
    fields = stat[stat.rfind(")") + 2 :].split()
    return fields[19] if len(fields) > 19 else None


@contextlib.contextmanager
def attached(name: str, how: str) -> Iterator[Session]:
    """Mark this process as attached to NAME for the block; afterwards, say on stderr what a
    rollback left for it (`tell_all`), if anything. Best effort: a marker that cannot be
    written only means a rollback cannot see the session (it then stops it unwarned, as
    before), never that the person cannot get in."""
    pid = os.getpid()
    marker = _dir(name) / f"{pid}.json"
    session = Session(pid, how, marker)
    doc = {"pid": pid, "start": _start_time(pid), "how": how}
    with contextlib.suppress(OSError):
        ensure_dir(marker.parent)
        with contextlib.suppress(FileNotFoundError):
            session.notice_path.unlink()  # an earlier session's, of a reused pid
        atomic_write(marker, json.dumps(doc).encode(), durable=False)
    try:
        yield session
    finally:
        told = _read_notice(session)
        for path in (marker, session.notice_path):
            with contextlib.suppress(OSError):
                path.unlink()
        if told:
            with contextlib.suppress(OSError):  # the terminal may be gone with the session
                # \r: the terminal may still be in raw mode for a moment after podman.
                note(f"\r\nlinpodx: {told}")


def live(name: str) -> list[Session]:
    """The sessions attached to NAME now (markers of processes that still run), by pid."""
    try:
        entries = sorted(os.listdir(_dir(name)))[:MAX_SESSIONS]
    except OSError:
        return []
    found = []
    for entry in entries:
        if not entry.endswith(".json"):
            continue
        marker = _dir(name) / entry
        try:
            raw = read_small(marker, MAX_MARKER_BYTES)
            doc = json.loads(raw) if raw is not None else None
        except (OSError, ValueError, NotRegularFile):
            continue
        if not isinstance(doc, dict):
            continue
        pid, start, how = doc.get("pid"), doc.get("start"), doc.get("how")
        if not isinstance(pid, int) or isinstance(pid, bool) or pid <= 0:
            continue
        if start is None or _start_time(pid) != start or how not in ("run", "attach"):
            continue  # ended (or killed, and its pid taken by another process since)
        found.append(Session(pid, str(how), marker))
    return found


def tell_all(name: str, text: str) -> list[Session]:
    """Leave `text` for every session attached to NAME (each prints it once podman returns);
    returns those it was left for."""
    told = []
    for session in live(name):
        with contextlib.suppress(OSError):
            atomic_write(session.notice_path, text.encode(), durable=False)
            told.append(session)
    return told


def _read_notice(session: Session) -> str | None:
    try:
        raw = read_small(session.notice_path, MAX_MARKER_BYTES)
    except (OSError, NotRegularFile):
        return None
    return safe_text(raw.decode("utf-8", "replace")) if raw else None

