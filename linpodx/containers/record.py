"""Audit before every action, and the outcome record of a run or start that fails after its
record (`recorded`: the frame every run and start goes through)."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

from linpodx import events
from linpodx.errors import (
    LinpodxError,
)
from linpodx.output import note


def audit(event_type: str, data: dict[str, Any]) -> None:
    """Append to the administrative chain BEFORE the action; AuditError means: do not act."""
    from linpodx.audit.chain import admin_chain, keep_reserve  # not on the fast run path

    admin_chain().append(event_type, data)
    keep_reserve()


def audit_stopping(event_type: str, data: dict[str, Any]) -> None:
    """`audit` for stop and rm, which go ahead on a full state dir (`append_stopping`), saying
    so on stderr."""
    from linpodx.audit.chain import append_stopping, keep_reserve
    from linpodx.output import note

    warning = append_stopping(event_type, data)
    if warning is None:
        keep_reserve()
        return
    with contextlib.suppress(OSError):
        note(warning)


def emit(event_type: str, **data: Any) -> None:
    # Events are notifications, not truth (the chain is): a failed emit must not undo an action
    # that is already audited and done.
    with contextlib.suppress(OSError):
        events.emit(event_type, **data)


REASON_MAX = 300
"""Characters of an error message an outcome record keeps."""


class Outcome:
    """How far a recorded run (`container.run`) or start (`container.start`) got, for the
    outcome record it gets if it fails: `container.run.failed` / `container.start.failed`."""

    def __init__(self, record: str, name: str) -> None:
        self.record = record
        self.name = name
        self.step = "prepare"
        """What was being done when it failed (a short constant, e.g. `podman_create`)."""
        self.created = False
        """podman created the container (a run) before the failure."""
        self.removed = False
        """The clean-up removed it again (a run), or stopped it (a start)."""

    def __enter__(self) -> Outcome:
        return self

    def __exit__(self, _typ: object, exc: BaseException | None, _tb: object) -> None:
        """Leaving a `with outcome:` block by an exception records the failure (and lets the
        exception go on)."""
        if exc is not None:
            self.failed(exc)

    def failed(self, exc: BaseException) -> None:
        """Append the `<record>.failed` record for `exc`. It records what already happened and
        cannot undo anything: if it cannot be written, that is a warning on stderr and `exc`
        stays the error reported (with its exit code)."""
        fate: dict[str, bool | str]
        if self.record == "container.start":
            fate = {"stopped": self.removed}
        else:
            container = "removed" if self.removed else "left"
            fate = {"container": container if self.created else "not_created"}
        data = {"name": self.name, "step": self.step, **_reason(exc), **fate}
        try:
            audit(f"{self.record}.failed", data)
        except Exception as err:  # any: it must not replace the error being reported
            said = err.message if isinstance(err, LinpodxError) else type(err).__name__
            with contextlib.suppress(Exception):
                note(
                    f"warning: could not record {self.record}.failed for {self.name} in the "
                    f"audit log: {said}"
                )


def _reason(exc: BaseException) -> dict[str, str]:
    """What an outcome record says about an error: its type and linpodx's own message (never
    podman's stderr, argv or an exception's text, which may hold anything), shortened."""
    if isinstance(exc, LinpodxError):
        message = exc.message.splitlines()[0] if exc.message else ""
        if len(message) > REASON_MAX:
            message = message[: REASON_MAX - 1] + "…"
    elif isinstance(exc, OSError) and exc.strerror:
        message = exc.strerror  # the C library's fixed text ("No space left on device")
    else:
        message = "unexpected error" if isinstance(exc, Exception) else "interrupted"
    return {"error": type(exc).__name__, "reason": message}


@contextlib.contextmanager
def recorded(
    record: str, name: str, data: dict[str, Any] | None, *, step: str = "prepare"
) -> Iterator[Outcome]:
    """The frame of every run and start: `record` (with `data`) appended to the admin chain
    before the block runs (None: it is already there, as when the fast path wrote it), then
    the block with its Outcome; leaving it by an exception records `<record>.failed` at the
    step the block had reached, and lets the exception go on."""
    if data is not None:
        audit(record, data)
    outcome = Outcome(record, name)
    outcome.step = step
    with outcome:
        yield outcome
