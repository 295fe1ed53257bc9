"""The snapshot lock of a container: one snapshot operation (create, rollback, recovery, rm, a
dead job's cleanup) at a time on it. Not the container name's lock (`linpodx.namelock`), which
`run`/`start`/`stop`/`rm` take: a snapshot worker holds this one for a whole job, and those
commands must not wait for it. Its fd is lent to short-lived programs (`proc.lending`), so one
that outlives a killed holder keeps it held until it ends."""

from __future__ import annotations

import contextlib
import fcntl
import os
import time
from collections.abc import Iterator

from linpodx.errors import LinpodxError
from linpodx.paths import FILE_MODE, ensure_dir, snapshots_dir


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
