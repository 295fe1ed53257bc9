"""Per-second bounds on what a peer can make the bridge write (pure, no I/O).

A server that writes `x\\n` lines, or answers ids nobody asked for, costs it nothing and cost the
host ~10 MB/s of session log and ~4 MB/s of stderr: each refused line was a record and a line
on stderr. `Window` lets a set number of such events (or bytes) through per one-second window
and counts the rest; the caller writes what it returns as one summary for a whole window.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

REASONS_MAX = 16
"""Distinct reasons a summary names; the rest are counted under `other`."""


@dataclass
class Summary:
    """What a window held back."""

    count: int = 0
    """Events held back."""
    amount: int = 0
    """Their total weight (bytes, for stderr; the count otherwise)."""
    reasons: dict[str, int] = field(default_factory=dict)
    """How many per reason (at most REASONS_MAX, then `other`)."""
    since: float = 0.0
    """When the window started (the caller's clock)."""

    def to_record(self) -> dict[str, object]:
        return {"count": self.count, "amount": self.amount, "reasons": dict(self.reasons)}


class Window:
    """At most `limit` units of weight per one-second window; the rest is held back and
    summarised. Not thread-safe: the caller holds its own lock."""

    def __init__(self, limit: int, clock: Callable[[], float]) -> None:
        self.limit = limit
        self.clock = clock
        self.start = clock()
        self.used = 0
        self.held = Summary(since=self.start)
        self.total_held = 0
        """Events held back over the whole session."""

    def admit(self, reason: str, weight: int = 1) -> tuple[bool, Summary | None]:
        """Whether this event goes through, and the summary of a window that has just ended
        with events held back (to be written now), if any."""
        ended = self._roll()
        if self.used + weight <= self.limit:
            self.used += weight
            return True, ended
        # (the window is full: later events in it are held back too, even lighter ones)
        self.used = self.limit
        h = self.held
        h.count += 1
        h.amount += weight
        self.total_held += 1
        key = reason if reason in h.reasons or len(h.reasons) < REASONS_MAX else "other"
        h.reasons[key] = h.reasons.get(key, 0) + 1
        return False, ended

    def take(self) -> Summary | None:
        """The summary of what is held back so far (the session ends), if anything was."""
        held, self.held = self.held, Summary(since=self.clock())
        return held if held.count else None

    def _roll(self) -> Summary | None:
        now = self.clock()
        if now - self.start < 1.0:
            return None
        self.start, self.used = now, 0
        return self.take()
