"""Small file helpers: atomic replace and private files."""

from __future__ import annotations

import contextlib
import os
import tempfile
from pathlib import Path

from linpodx.paths import FILE_MODE, ensure_dir


def fsync_dir(path: Path) -> None:
    """fsync a directory so a rename or create in it survives a crash."""
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _durable_temp(path: Path, data: bytes, mode: int, *, sync: bool = True) -> str:
    """Write `data` to a new temp file beside `path` (same filesystem), fsynced unless `sync` is
    False; return its name."""
    ensure_dir(path.parent)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        os.fchmod(fd, mode)
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            if sync:
                os.fsync(f.fileno())
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        raise
    return tmp


def atomic_write(path: Path, data: bytes, *, mode: int = FILE_MODE, durable: bool = True) -> None:
    """Replace `path` with `data` all at once: temp file in the same dir, fsync, rename.

    `durable=False` keeps the all-at-once replace but skips both fsyncs: for runtime files that
    are rewritten before every use and mean nothing after a crash (a guard's resolv.conf, the
    OCI hooks file of one `podman run`), where two fsyncs would sit on a container's start-up.
    """
    tmp = _durable_temp(path, data, mode, sync=durable)
    try:
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        raise
    if durable:
        fsync_dir(path.parent)


def create_exclusive(path: Path, data: bytes, *, mode: int = FILE_MODE) -> bool:
    """Create `path` with `data` only if it does not exist yet. Returns False if it existed.

    Used where "the first writer wins" (approval answers): the file appears complete or not at
    all, because we write a temp file and hard-link it into place (link fails if taken).
    """
    tmp = _durable_temp(path, data, mode)
    try:
        try:
            os.link(tmp, path)
        except FileExistsError:
            return False
        fsync_dir(path.parent)
        return True
    finally:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
