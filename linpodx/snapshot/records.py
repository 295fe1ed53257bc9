"""What snapshot operations record: the administrative audit chain (before anything happens)
and the event stream (a notification)."""

from __future__ import annotations

import contextlib
from collections.abc import Mapping
from typing import Any

from linpodx import events


def audit(event_type: str, data: Mapping[str, Any]) -> str:
    """Append to the administrative chain (raises AuditError: then do nothing); returns hash."""
    from linpodx.audit.chain import admin_chain

    return admin_chain().append(event_type, dict(data)).hash


def emit(event_type: str, **data: Any) -> None:
    """Emit an event; the event stream is a notification, so a failure here is not fatal."""
    with contextlib.suppress(OSError):
        events.emit(event_type, **data)
