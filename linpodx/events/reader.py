"""Reading the event stream (`linpodx events`, the approval prompter): the lines other
commands append (`linpodx.events`), parsed strictly, in bounded chunks."""

from __future__ import annotations

import errno
import os
import stat
from collections.abc import Iterator
from typing import Any

from linpodx.audit.chain import READ_CHUNK, OverlongLine, fd_lines
from linpodx.canonical import CanonicalError, strict_loads
from linpodx.errors import EXIT_FAILURE, LinpodxError
from linpodx.paths import events_file


def parse_event(line: bytes) -> dict[str, Any] | None:
    """One event from one line of events.jsonl, None for a line that is not one.

    Parsed with the strict parser: a line that nests deeper than it allows, holds NaN, Infinity,
    a number that overflows to it (1e999) or an integer beyond 2^53, or repeats a key is skipped
    like any damaged line. json.loads would have let NaN through to `--json` (which then prints
    invalid JSON) and ended the listener with RecursionError on deep nesting.
    """
    if not line.strip():
        return None
    try:
        event = strict_loads(line, allow_floats=True)
    except CanonicalError:
        return None  # not ours to interpret; the stream is for people, not a record
    return event if isinstance(event, dict) else None


class EventFile:
    """Reads the events added to events.jsonl since the last read, in bounded memory.

    Lines are read in chunks (`audit.chain.fd_lines`, as audit chains are), so at most a chunk
    and one line of MAX_LINE bytes are held. An unfinished last line stays in the file and is
    read once its newline is there. A line longer than MAX_LINE (linpodx writes none) is
    skipped up to its newline without being held, also while it is still being written.

    The file is only ever appended to. One that shrank, or another file in its place (a new
    inode, or none for a while), was truncated or replaced: all its lines are new, and it is
    read from its start.
    """

    def __init__(self) -> None:
        self.path = events_file()
        self.offset = 0
        """Where the next line starts (or where the rest of a line being skipped starts)."""
        self.skipping = False
        """The bytes from `offset` up to the next newline belong to a line too long to read."""
        self.file_id: tuple[int, int] | None = None
        """(st_dev, st_ino) of the file `offset` is in; None before it exists."""
        self.size = 0
        """How many bytes that file held at the last read: an append-only file never holds less."""

    def skip_to_end(self) -> None:
        """Start after what the file holds now (a follower shows only what comes next)."""
        try:
            st = self.path.stat()
        except FileNotFoundError:
            self._start(None)
            return
        self.file_id = (st.st_dev, st.st_ino)
        self.offset = self.size = st.st_size

    def read_new(self) -> Iterator[dict[str, Any]]:
        """The events in the lines completed since the last call; damaged lines are skipped."""
        fd = self._open()
        if fd is None:
            self._start(None)  # a file that appears later is read from its start
            return
        try:
            st = os.fstat(fd)
            file_id = (st.st_dev, st.st_ino)
            if file_id != self.file_id or st.st_size < self.size:
                self._start(file_id)
            elif st.st_size == self.size:
                return  # nothing appended (an unfinished line is read again only when it grows)
            yield from self._events(fd)
            self.size = max(st.st_size, self.offset)  # it may have grown while it was read
        finally:
            os.close(fd)

    def _start(self, file_id: tuple[int, int] | None) -> None:
        self.file_id = file_id
        self.offset = self.size = 0
        self.skipping = False

    def _open(self) -> int | None:
        try:
            # O_NONBLOCK: a FIFO in the file's place must not hang the listener (refused below);
            # O_NOFOLLOW: a link would show another file's lines as linpodx's events.
            fd = os.open(
                self.path, os.O_RDONLY | os.O_CLOEXEC | os.O_NONBLOCK | os.O_NOFOLLOW
            )
        except FileNotFoundError:
            return None
        except OSError as exc:
            if exc.errno != errno.ELOOP:
                raise
            raise LinpodxError(
                f"cannot follow the event stream: {self.path} is a symbolic link",
                "linpodx writes events.jsonl as a regular file; move the link aside",
                exit_code=EXIT_FAILURE,
            ) from None
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            os.close(fd)
            raise LinpodxError(
                f"cannot follow the event stream: {self.path} is not a regular file",
                "linpodx writes events.jsonl as a regular file; move what is there aside",
                exit_code=EXIT_FAILURE,
            )
        return fd

    def _events(self, fd: int) -> Iterator[dict[str, Any]]:
        while True:
            if self.skipping and not self._skip_long_line(fd):
                return  # the long line's newline is not written yet
            try:
                for offset, line, complete in fd_lines(fd, self.offset):
                    if not complete:
                        return  # still being written: read it again once it is whole
                    self.offset = offset + len(line) + 1
                    event = parse_event(line)
                    if event is not None:
                        yield event
                return
            except OverlongLine as exc:
                self.offset = exc.offset
                self.skipping = True

    def _skip_long_line(self, fd: int) -> bool:
        """Move `offset` past the newline of the line being skipped; False if none is there yet."""
        while True:
            chunk = os.pread(fd, READ_CHUNK, self.offset)
            if not chunk:
                return False
            newline = chunk.find(b"\n")
            if newline >= 0:
                self.offset += newline + 1
                self.skipping = False
                return True
            self.offset += len(chunk)
