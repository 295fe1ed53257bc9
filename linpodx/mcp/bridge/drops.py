"""Refused and dropped messages: each gets a record (`mcp.invalid`, `mcp.drop`) and a stderr
line, up to `mcp.drop_records_per_second` per direction; past that they are counted into one
`mcp.suppressed` summary (see `mcp.bounds`)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from linpodx.errors import AuditError
from linpodx.mcp import bounds
from linpodx.mcp.bridge.core import BridgeCore
from linpodx.mcp.bridge.state import short


class Drops(BridgeCore):
    """The bounded records of what the bridge refuses or drops, in either direction."""

    def _admit(self, direction: str, reason: str, lane: str) -> bool:
        """Whether a refused/dropped message gets its own record and stderr line, under
        `mcp.drop_records_per_second`; a window that ended with messages held back is
        summarised now (`mcp.suppressed`)."""
        with self._lock:
            admitted, ended = self._windows[direction].admit(reason)
            if not admitted:
                self.suppressed += 1
        if ended is not None:
            self._summarise(direction, ended, lane)
        return admitted

    def _summarise(self, direction: str, held: bounds.Summary, lane: str) -> None:
        limit = self.settings.drop_records_per_second
        self._log(
            f"bridge: {held.count} refused or dropped messages from the {direction} were not "
            f"recorded one by one (over mcp.drop_records_per_second = {limit}); "
            "one mcp.suppressed record counts them"
        )
        record = {
            "dir": direction,
            "limit": limit,
            "window_ms": int(max(0.0, self._clock() - held.since) * 1000),
            **held.to_record(),
        }

        def unrecorded(exc: AuditError) -> None:
            self._log(f"bridge: could not record a summary of dropped messages: {exc.message}")

        self._then(lane, "mcp.suppressed", record, lambda: None, unrecorded)

    def flush_summaries(self) -> None:
        """Record what the per-second windows still hold back (the session ends)."""
        for direction, window in self._windows.items():
            with self._lock:
                held = window.take()
            if held is not None:
                self._summarise(direction, held, direction)

    def _invalid(
        self,
        direction: str,
        reason: str,
        msg_id: Any,
        size: int,
        *,
        then: Callable[[], None] = lambda: None,
        lane: str = "client",
    ) -> bool:
        """Record a refused frame, then `then()` (the refusal is sent even if unrecorded).
        Past `mcp.drop_records_per_second` the frame is counted into a summary instead: the
        refusal is the safe direction and needs no record of its own before it is sent."""
        with self._lock:
            self.stats.invalid += 1
        if not self._admit(direction, reason[:160], lane):
            then()
            return False

        def unrecorded(exc: AuditError) -> None:
            self._log(f"bridge: could not record an invalid message: {exc.message}")
            then()

        record = {"dir": direction, "reason": short(reason), "id": short(msg_id), "size": size}
        self._then(lane, "mcp.invalid", record, then, unrecorded)
        return True

    def _dropped(self, direction: str, reason: str, msg_id: Any, *, lane: str = "client") -> None:
        with self._lock:
            self.stats.dropped += 1
        if not self._admit(direction, reason[:160], lane):
            return
        self._log(f"bridge: dropped a message from the {direction}: {reason}")

        def unrecorded(exc: AuditError) -> None:
            self._log(f"bridge: could not record a dropped message: {exc.message}")

        record = {"dir": direction, "reason": short(reason), "id": short(msg_id)}
        self._then(lane, "mcp.drop", record, lambda: None, unrecorded)
