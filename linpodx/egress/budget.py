"""The wildcard budget: how many distinct new names under `*.suffix` entries may go upstream.

A wildcard lets the agent choose the labels of every name it looks up, and each new name is
one message to the zone's authoritative servers: without a bound, random subdomains carried
~180 KB/s out of a container. An exact name carries nothing in its labels, so only names
allowed by a wildcard alone are counted.

The window slides: a name counts when it is asked upstream and it was not asked in the last
WINDOW seconds; asking it again (its cached answer lapsed, or another record type) costs
nothing and starts its WINDOW again. A new name is admitted only while fewer than the budget
are in the window, so in any WINDOW seconds at most `budget` new names leave (every name
admitted in such a span is still in the window at its end), and the names remembered are
never more than the largest budget in force. Pure: the resolver holds one per container and
gives it a clock.
"""

from __future__ import annotations

import threading
import time
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass

from linpodx.egress.policy import normalize_name

WINDOW = 600.0
"""Seconds a name asked under a wildcard is remembered (10 minutes)."""
DEFAULT_BUDGET = 100
"""`network.wildcard_budget` when the profile does not set it."""
MAX_BUDGET = 10000
"""The largest `network.wildcard_budget` (the profile schema's maximum; the smallest is 1)."""


def window_text(window: float = WINDOW) -> str:
    """`10 minutes` for people (events, denial reasons)."""
    minutes, seconds = divmod(int(window), 60)
    if seconds:
        return f"{int(window)} seconds"
    return f"{minutes} minute" if minutes == 1 else f"{minutes} minutes"


@dataclass(frozen=True)
class Admission:
    """What the budget said about one name."""

    allowed: bool
    """It may be asked upstream."""
    new: bool
    """It was not in the window: this lookup counted (only when allowed)."""
    used: int
    """Names in the window now, this one included when allowed."""
    budget: int
    """The budget the name was judged against."""
    recording: threading.Event | None = None
    """Set when the name is in the window but its first lookup's record is not written yet:
    wait for this before asking upstream, then ask `admit` again."""


class WildcardBudget:
    """Distinct names asked under wildcards in the last `window` seconds (thread-safe)."""

    def __init__(
        self, window: float = WINDOW, clock: Callable[[], float] = time.monotonic
    ) -> None:
        self.window = window
        self._clock = clock
        self._lock = threading.Lock()
        # name -> when it was last asked, oldest first (a repeat moves it to the end), so the
        # names that left the window are always at the front.
        self._seen: OrderedDict[str, float] = OrderedDict()
        # Names admitted as new whose record is not written yet -> set once it is (`settle`)
        # or the name was given back (`forget`). Another lookup of such a name (its AAAA
        # beside its A, as getaddrinfo sends them) waits: it must not go upstream before the
        # name's record exists.
        self._recording: dict[str, threading.Event] = {}

    def admit(self, name: str, budget: int) -> Admission:
        """Whether `name` (allowed by a wildcard only) may be asked upstream now; counts it
        if so. `budget` is the policy's, read at each lookup: a re-apply that lowers it
        admits no new name until the window holds fewer than it."""
        key = normalize_name(name)
        with self._lock:
            now = self._clock()
            self._expire(now)
            if key in self._seen:
                self._seen.move_to_end(key)
                self._seen[key] = now
                waiting = self._recording.get(key)
                return Admission(True, False, len(self._seen), budget, waiting)
            if len(self._seen) >= budget:
                return Admission(False, False, len(self._seen), budget)
            self._seen[key] = now
            self._recording[key] = threading.Event()
            return Admission(True, True, len(self._seen), budget)

    def settle(self, name: str) -> None:
        """`name`, admitted as new, is recorded: other lookups of it may go upstream now."""
        with self._lock:
            done = self._recording.pop(normalize_name(name), None)
        if done is not None:
            done.set()

    def forget(self, name: str) -> None:
        """Take `name` out of the window (it was admitted but then not asked after all)."""
        key = normalize_name(name)
        with self._lock:
            self._seen.pop(key, None)
            done = self._recording.pop(key, None)
        if done is not None:
            done.set()

    def holds(self, name: str) -> bool:
        """Whether `name` is in the window now (asking it again would cost nothing)."""
        key = normalize_name(name)
        with self._lock:
            last = self._seen.get(key)
            return last is not None and self._clock() - last < self.window

    def used(self) -> int:
        """Names in the window now."""
        with self._lock:
            self._expire(self._clock())
            return len(self._seen)

    def _expire(self, now: float) -> None:
        while self._seen:
            name, last = next(iter(self._seen.items()))
            if now - last < self.window:
                break
            del self._seen[name]
            done = self._recording.pop(name, None)
            if done is not None:  # pragma: no cover - a record pending for 10 minutes
                done.set()
