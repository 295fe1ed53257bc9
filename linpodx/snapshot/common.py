"""Helpers shared by the snapshot service and its worker: podman facts, audit, locks."""

from __future__ import annotations

import contextlib
import fcntl
import os
import time
from collections.abc import Iterator, Mapping
from typing import Any

from linpodx import events
from linpodx.errors import Denied, LinpodxError
from linpodx.paths import FILE_MODE, ensure_dir, snapshots_dir
from linpodx.podman import engine

MANAGED_LABEL = "linpodx.managed"
PROFILE_LABELS = (
    "linpodx.profile",
    "linpodx.profile_id",
    "linpodx.revision",
    "linpodx.audit_hash",
)


def inspect_container(name: str) -> dict[str, Any]:
    """`podman inspect` of a container; NotFound if it does not exist."""
    return engine.container_info(name)


def labels_of(info: Mapping[str, Any]) -> dict[str, str]:
    cfg = info.get("Config") or {}
    labels = cfg.get("Labels") or {}
    return {str(k): str(v) for k, v in labels.items()}


def require_managed(name: str) -> dict[str, Any]:
    """Inspect `name` and refuse it unless linpodx manages it."""
    info = inspect_container(name)
    if labels_of(info).get(MANAGED_LABEL) != "1":
        raise Denied(
            f"{name} is not a linpodx container (label {MANAGED_LABEL}=1 missing)",
            "linpodx only snapshots and rolls back containers it created (`linpodx ps`)",
        )
    return info


def audit(event_type: str, data: Mapping[str, Any]) -> str:
    """Append to the administrative chain (raises AuditError: then do nothing); returns hash."""
    from linpodx.audit.chain import admin_chain

    return admin_chain().append(event_type, dict(data)).hash


def emit(event_type: str, **data: Any) -> None:
    """Emit an event; the event stream is a notification, so a failure here is not fatal."""
    with contextlib.suppress(OSError):
        events.emit(event_type, **data)


@contextlib.contextmanager
def container_lock(name: str, timeout: float = 60.0) -> Iterator[int]:
    """Serialize snapshot operations (create, rollback, rm) on one container; yields the
    lock's file descriptor (for `proc.lending`)."""
    d = ensure_dir(snapshots_dir() / ".locks")
    fd = os.open(d / f"{name}.lock", os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, FILE_MODE)
    try:
        deadline = time.monotonic() + timeout
        while True:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                if time.monotonic() > deadline:
                    raise LinpodxError(
                        f"another snapshot operation on {name} is still running",
                        "wait for it to finish (`linpodx snapshot job-status JOB`) and retry",
                    ) from None
                time.sleep(0.1)
        yield fd
    finally:
        os.close(fd)
