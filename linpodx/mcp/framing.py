"""Newline-delimited JSON framing with a bounded buffer.

MCP's stdio transport delimits messages with the byte `\\n`. We split on that byte only: U+2028,
U+0085 and friends are ordinary characters inside JSON strings. A line longer than
`max_line_bytes` is never accumulated: once the bound is crossed the reader switches to
"discarding" until the next `\\n`, so memory stays bounded whatever the peer sends.
"""

from __future__ import annotations

import os
import select
from dataclasses import dataclass

READ_CHUNK = 64 * 1024


@dataclass(frozen=True)
class Line:
    """One complete frame (without its `\\n`)."""

    data: bytes


@dataclass(frozen=True)
class Oversize:
    """A frame that crossed the bound; its bytes were dropped while reading."""

    size: int
    """How many bytes the frame had (counted, never kept)."""
    head: bytes
    """The first bytes of the frame (at most 256), kept to find the request id if possible."""


Frame = Line | Oversize


class LineSplitter:
    """Feed bytes in, get complete frames out. Holds at most `max_line_bytes` (+ one chunk)."""

    HEAD = 256

    def __init__(self, max_line_bytes: int) -> None:
        if max_line_bytes < 1:
            raise ValueError("max_line_bytes must be positive")
        self.max_line_bytes = max_line_bytes
        self._buf = bytearray()
        self._discarding = False
        self._discard_size = 0
        self._discard_head = b""

    @property
    def buffered(self) -> int:
        """Bytes currently held (for tests of the memory bound)."""
        return len(self._buf)

    def feed(self, data: bytes) -> list[Frame]:
        """Split `data` (appended to what is pending) into frames."""
        frames: list[Frame] = []
        start = 0
        n = len(data)
        while start < n:
            nl = data.find(b"\n", start)
            if 0 <= nl - start <= self.max_line_bytes and not self._buf and not self._discarding:
                # A whole line inside this chunk: one slice, no copy through the buffer.
                frames.append(Line(data[start:nl]))
                start = nl + 1
                continue
            end = n if nl < 0 else nl
            piece = data[start:end]
            if self._discarding:
                self._discard_size += len(piece)
            elif len(self._buf) + len(piece) > self.max_line_bytes:
                # Cross the bound: remember only the head and the size, drop the rest.
                self._discard_head = (bytes(self._buf) + piece[: self.HEAD])[: self.HEAD]
                self._discard_size = len(self._buf) + len(piece)
                self._buf = bytearray()
                self._discarding = True
            else:
                self._buf += piece
            if nl < 0:
                break
            # A complete frame ends here.
            if self._discarding:
                frames.append(Oversize(self._discard_size, self._discard_head))
                self._discarding = False
                self._discard_size = 0
                self._discard_head = b""
            else:
                frames.append(Line(bytes(self._buf)))
                self._buf = bytearray()
            start = nl + 1
        return frames

    def finish(self) -> list[Frame]:
        """End of stream: a trailing unterminated frame is still delivered."""
        frames: list[Frame] = []
        if self._discarding:
            frames.append(Oversize(self._discard_size, self._discard_head))
        elif self._buf:
            frames.append(Line(bytes(self._buf)))
        self._buf = bytearray()
        self._discarding = False
        return frames


class FrameReader:
    """Blocking reader of frames from a file descriptor."""

    def __init__(self, fd: int, max_line_bytes: int, chunk: int = READ_CHUNK) -> None:
        self.fd = fd
        self.splitter = LineSplitter(max_line_bytes)
        self.chunk = chunk
        self.eof = False
        self._pending: list[Frame] = []
        self._poll: select.poll | None = None  # (registered once: asked once per frame)

    def has_more(self) -> bool:
        """True if another frame (or bytes of one) is already waiting to be read."""
        if self._pending:
            return True
        if self.eof:
            return False
        try:
            if self._poll is None:
                self._poll = select.poll()
                self._poll.register(self.fd, select.POLLIN)
            return bool(self._poll.poll(0))
        except (OSError, ValueError):
            return False

    def read_frame(self) -> Frame | None:
        """The next frame, or None at end of stream."""
        while not self._pending:
            if self.eof:
                return None
            try:
                data = os.read(self.fd, self.chunk)
            except OSError:
                data = b""
            if not data:
                self.eof = True
                self._pending.extend(self.splitter.finish())
            else:
                self._pending.extend(self.splitter.feed(data))
        return self._pending.pop(0)
