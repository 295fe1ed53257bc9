"""Small file helpers: atomic replace and private files.

Paths may be `Path`s or strings. Standard library's cheapest modules only (no tempfile or
pathlib): a guarded `linpodx run` writes its guard's files with these before podman starts
(`linpodx.fastpath.run`).
"""

from __future__ import annotations

import contextlib
import errno
import os
import stat

from linpodx.paths import FILE_MODE, check_dir_str, ensure_dir_str

TYPE_CHECKING = False  # the fast path's budget: linpodx/fastpath/__init__.py
if TYPE_CHECKING:
    from pathlib import Path

_TEMP_TRIES = 100


def fsync_dir(path: Path | str) -> None:
    """fsync a directory so a rename or create in it survives a crash."""
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _durable_temp(
    path: Path | str, data: bytes, mode: int, *, sync: bool = True, make_dir: bool = True
) -> str:
    """Write `data` to a new temp file beside `path` (same filesystem), fsynced unless `sync` is
    False; return its name. Without `make_dir`, a missing directory is FileNotFoundError."""
    where, name = os.path.split(os.fspath(path))
    # Under the state dir, no link or other user's directory on the way (`paths._walk`).
    if make_dir:
        ensure_dir_str(where)
    else:
        check_dir_str(where)
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC | os.O_NOFOLLOW
    for _ in range(_TEMP_TRIES):  # as tempfile.mkstemp: a fresh random name, created exclusively
        tmp = os.path.join(where, f".{name}.{os.urandom(6).hex()}.tmp")
        try:
            fd = os.open(tmp, flags, 0o600)
            break
        except FileExistsError:
            continue
    else:
        raise FileExistsError(f"no free temporary name beside {os.fspath(path)}")
    try:
        os.fchmod(fd, mode)
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            if sync:
                os.fsync(f.fileno())
    except BaseException:
        _unlink_quietly(tmp)
        raise
    return tmp


def atomic_write(
    path: Path | str,
    data: bytes,
    *,
    mode: int = FILE_MODE,
    durable: bool = True,
    make_dir: bool = True,
) -> None:
    """Replace `path` with `data` all at once: temp file in the same dir, fsync, rename.

    `durable=False` keeps the all-at-once replace but skips both fsyncs: for runtime files that
    are rewritten before every use and mean nothing after a crash (a guard's resolv.conf, the
    OCI hooks file of one `podman run`), where two fsyncs would sit on a container's start-up.
    `make_dir=False`: the directory must exist (FileNotFoundError), for a writer that must not
    bring back a directory someone removed.
    """
    tmp = _durable_temp(path, data, mode, sync=durable, make_dir=make_dir)
    try:
        os.replace(tmp, path)
    except BaseException:
        _unlink_quietly(tmp)
        raise
    if durable:
        fsync_dir(os.path.dirname(os.fspath(path)))


def stage(path: Path | str, data: bytes, *, mode: int = FILE_MODE) -> str:
    """The part of an atomic replace that needs disk space: `data` in a new fsynced temp file
    beside `path`, whose name is returned. `os.replace(tmp, path)` then needs none, so a change
    can be staged before its audit record and put in place after it. `discard` the temp file if
    it is not used."""
    return _durable_temp(path, data, mode)


def discard(tmp: str) -> None:
    """Remove a temp file from `stage` that was not put in place (gone already is fine)."""
    _unlink_quietly(tmp)


class Staged:
    """A replace of `path` made ready ahead of time: `data` is already in a fsynced temp file
    beside it, so `commit` only renames it into place.

    For changes that are audited first: whatever can fail for lack of space or a read-only
    disk runs before the record is written, and after the record only the rename is left.
    `discard` (or a failed `commit`) removes the temp file. (`stage`/`discard` as an object,
    for callers that only rename; the profile store also writes into its staged files.)
    """

    def __init__(self, path: Path | str, data: bytes, *, mode: int = FILE_MODE) -> None:
        self.path = os.fspath(path)
        self._tmp: str | None = stage(path, data, mode=mode)

    def commit(self) -> None:
        if self._tmp is None:
            raise ValueError(f"nothing staged for {self.path}")
        tmp, self._tmp = self._tmp, None
        try:
            os.replace(tmp, self.path)
        except BaseException:
            discard(tmp)
            raise
        # The rename is done: a failed directory fsync must not make a caller that recorded the
        # change first report it as not done (the file is in place for every reader).
        with contextlib.suppress(OSError):
            fsync_dir(os.path.dirname(self.path))

    def discard(self) -> None:
        if self._tmp is not None:
            discard(self._tmp)
            self._tmp = None


def create_exclusive(path: Path | str, data: bytes, *, mode: int = FILE_MODE) -> bool:
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
        fsync_dir(os.path.dirname(os.fspath(path)))
        return True
    finally:
        _unlink_quietly(tmp)


def _unlink_quietly(path: str) -> None:
    try:
        os.unlink(path)
    except FileNotFoundError:
        pass


class NotRegularFile(Exception):
    """Something other than a regular file (a FIFO, a device, a directory) is where a store
    file belongs."""


def present(path: Path | str) -> bool:
    """Is anything at `path` itself (a link, even dangling, counts)? False only when nothing
    is (ENOENT); any other error is raised. `os.path.lexists` says False for a directory it
    may not search (EACCES) or a file where a directory belongs (ENOTDIR), which would make
    an unreadable log look like no log at all."""
    try:
        os.lstat(path)
    except FileNotFoundError:
        return False
    return True


def is_dir(path: Path | str) -> bool:
    """A directory at `path` (links followed): True; nothing there: False; anything else (a
    file in its place, a parent that may not be searched) raises, where `Path.is_dir` would
    say False and a listing would look empty."""
    try:
        st = os.stat(path)
    except FileNotFoundError:
        return False
    if not stat.S_ISDIR(st.st_mode):
        raise NotADirectoryError(errno.ENOTDIR, os.strerror(errno.ENOTDIR), str(path))
    return True


def read_regular(path: Path | str, limit: int) -> bytes | None:
    """Up to `limit` + 1 bytes of the regular file at `path`; None if nothing is there.

    For files linpodx wrote and reads back (the profile store, the run plans, run specs, the
    egress policy, a rollback's journal). Opened non-blocking and without following a link: a
    FIFO or a device in such a file's place must not hang the command (or a lock it holds),
    and a link is not a file linpodx wrote. Under the state dir, the directories on the way
    are checked as for a write (`paths.check_dir_str`: no links, no other user's). Raises
    NotRegularFile (also for a link), or OSError; the caller judges the size.
    """
    got = read_regular_stat(path, limit)
    return None if got is None else got[0]


def read_regular_stat(path: Path | str, limit: int) -> tuple[bytes, os.stat_result] | None:
    """`read_regular`, with the file's own stat (from the descriptor read: which file it
    was, even if it is replaced right after)."""
    try:
        check_dir_str(os.path.dirname(os.fspath(path)))
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_NOFOLLOW | os.O_CLOEXEC)
    except FileNotFoundError:
        return None
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            raise NotRegularFile(path) from None
        raise
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise NotRegularFile(path)
        chunks = []
        left = limit + 1
        while left > 0:
            chunk = os.read(fd, left)
            if not chunk:
                break
            chunks.append(chunk)
            left -= len(chunk)
        return b"".join(chunks), st
    finally:
        os.close(fd)


def read_small(path: Path | str, limit: int) -> bytes | None:
    """`read_regular`, with anything but a regular file of at most `limit` bytes raising
    NotRegularFile (whose text says what is wrong): for callers that call such a file damaged
    as they do bad JSON in it."""
    data = read_regular(path, limit)
    if data is not None and len(data) > limit:
        raise NotRegularFile(f"{os.fspath(path)}: larger than {limit} bytes")
    return data
