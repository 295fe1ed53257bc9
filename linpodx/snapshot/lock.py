"""The snapshot lock of a container: one snapshot operation (create, rollback, recovery, rm, a
dead job's cleanup) at a time on it. Not the container name's lock (`linpodx.namelock`'s
CONTAINERS scope), which `run`/`start`/`stop`/`rm` take: a snapshot worker holds this one for a
whole job, and those commands must not wait for it. The same lock in a scope of its own
(`SNAPSHOTS`): its files stay, a wait is not said but bounded, and the thread that holds it
does not take it again (a second operation in the same process waits, then gives up, as one in
another process does). Its fd is lent to short-lived programs (`proc.lending`), so one that
outlives a killed holder keeps it held until it ends."""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator

from linpodx import namelock, paths
from linpodx.errors import LinpodxError


def _locks_dir() -> str:
    return os.path.join(paths.state_root(), "snapshots", ".locks")


SNAPSHOTS = namelock.Scope(_locks_dir, guarded=None, reentrant=False, what=None, suffix=".lock")


@contextlib.contextmanager
def container_lock(name: str, timeout: float = 60.0) -> Iterator[int]:
    """Serialize snapshot operations (create, rollback, rm) on one container; yields the
    lock's file descriptor (for `proc.lending`)."""
    try:
        lock = namelock.acquire(name, SNAPSHOTS, timeout)
    except namelock.Busy:
        raise LinpodxError(
            f"another snapshot operation on {name} is still running",
            "wait for it to finish (`linpodx snapshot job-status JOB`) and retry",
        ) from None
    with lock:
        yield lock.fd
