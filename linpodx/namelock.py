"""Scoped name locks: an `flock` on one file per name, with its fd, an optional timeout.

The container name's lock (`acquire`, scope CONTAINERS) is held while linpodx makes, starts or
removes a container. What linpodx keeps under `containers_dir()/NAME` (run spec, mount pins,
the egress guard's files and log) is written before `podman create` decides who gets the name.
Two runs of one name at once would both write there, and the one podman refuses would then
clean up files that are the other's (its guard's log, its policy file). So every command that
writes or removes what lives under a name takes this lock first, and looks at the name again
once it has it: the second run then finds the name taken and refuses before touching anything.
Its file is `containers_dir()/.locks/NAME` (no container name starts with a dot), removed on
release once nothing is left under the name (names are often random, one per `--rm` run);
whoever waited on the removed file takes the lock again on the file now there.

Other scopes (`Scope`: the snapshot lock of a container, `linpodx.snapshot.lock`) are the same
lock in another directory, with their own rules: whether the file goes on release, whether
the thread that holds a name takes it again at once, whether a wait is said on stderr. A lock
is released when its process ends, however it ends; its fd (`NameLock.fd`) can be lent to
short-lived programs (`proc.lending`), which then hold it until they end.

Standard library's cheapest modules only: the fast run path (`linpodx.fastpath.run`) takes the lock
before podman starts.
"""

from __future__ import annotations

import _thread  # threading's own id function, without importing threading (see above)
import fcntl
import os
import time

from linpodx import paths

TYPE_CHECKING = False  # the fast path's budget: linpodx/fastpath/__init__.py
if TYPE_CHECKING:
    from collections.abc import Callable

LOCKS_DIR = ".locks"


class Scope:
    """Where a kind of name lock keeps its files, and its rules."""

    __slots__ = ("guarded", "locks_dir", "reentrant", "suffix", "what")

    def __init__(
        self,
        locks_dir: Callable[[], str],
        *,
        guarded: Callable[[str], str] | None,
        reentrant: bool,
        what: str | None,
        suffix: str = "",
    ) -> None:
        self.locks_dir = locks_dir
        """The directory of the lock files (made 0700 if missing)."""
        self.guarded = guarded
        """What a name's lock guards (a path): its file is removed on release once that is
        gone. None: lock files stay."""
        self.reentrant = reentrant
        """Whether the thread that holds a name takes it again at once (else it waits, as
        another process would)."""
        self.what = what
        """How a wait is said on stderr (`waiting for another linpodx command on WHAT NAME`);
        None: a wait is not said."""
        self.suffix = suffix
        """Appended to the name to give its lock file's name."""

    def path(self, name: str) -> str:
        return os.path.join(self.locks_dir(), name + self.suffix)


def _containers_locks() -> str:
    return os.path.join(paths.containers_root(), LOCKS_DIR)


def _container_dir(name: str) -> str:
    return os.path.join(paths.containers_root(), name)


CONTAINERS = Scope(_containers_locks, guarded=_container_dir, reentrant=True, what="container")
"""The container name's lock (see the module docstring). Taking it again in the same thread
is not a wait: a snapshot rollback holds its container's name throughout, and the stop, create
and start it makes take it again (flock would make the second open of the file wait for the
first, for ever). Another thread waits like another process would."""


class Busy(OSError):
    """The lock was still held by another when the timeout ran out."""


def lock_path(name: str) -> str:
    """`containers_dir()/.locks/NAME` (NAME already validated by the caller)."""
    return CONTAINERS.path(name)


class _Held:
    """The flock itself (one per name and thread in a reentrant scope, one per acquire in the
    others), shared by every handle of it."""

    def __init__(
        self, scope: Scope, name: str, path: str, fd: int, key: tuple[str, int] | None
    ) -> None:
        self.scope = scope
        self.name = name
        self.path = path
        self.fd: int | None = fd
        self.key = key
        self.handles = 0  # handles not yet released

    def drop(self) -> None:
        """The last handle went: remove the lock file if nothing is left of what it guards,
        while still holding it (see the module docstring), then let go."""
        if self.key is not None:
            _HELD.pop(self.key, None)
        fd, self.fd = self.fd, None
        if fd is None:
            return
        try:
            guarded = self.scope.guarded
            if guarded is not None and not os.path.lexists(guarded(self.name)):
                os.unlink(self.path)
        except OSError:
            pass  # an empty file left behind costs nothing; the lock goes with the fd
        finally:
            os.close(fd)


class NameLock:
    """A handle on a held name lock; `release` (or leaving a `with` block) gives it up, and the
    last handle given up lets the next one in. Each handle is released once, however often
    `release` is called."""

    def __init__(self, held: _Held) -> None:
        self.name = held.name
        self.path = held.path
        self._held: _Held | None = held
        held.handles += 1

    @property
    def held(self) -> bool:
        return self._held is not None and self._held.fd is not None

    @property
    def fd(self) -> int:
        """The lock's file descriptor (for `proc.lending`), while it is held."""
        fd = self._held.fd if self._held is not None else None
        if fd is None:
            raise ValueError(f"the lock of {self.name} is not held")
        return fd

    def release(self) -> None:
        held, self._held = self._held, None
        if held is None:
            return
        held.handles -= 1
        if held.handles == 0:
            held.drop()

    def __enter__(self) -> NameLock:
        return self

    def __exit__(self, *exc: object) -> None:
        self.release()


# The locks of reentrant scopes this process holds, per lock file and thread.
_HELD: dict[tuple[str, int], _Held] = {}


def acquire(name: str, scope: Scope = CONTAINERS, timeout: float | None = None) -> NameLock:
    """Wait for and take the lock of NAME in `scope` (the container name's, by default): for at
    most `timeout` seconds (Busy after that), or as long as it takes. At once if this thread
    holds it already and the scope is reentrant: the lock then goes with the last handle
    released. OSError if the state dir cannot hold it."""
    path = scope.path(name)
    key = (path, _thread.get_ident()) if scope.reentrant else None
    held = _HELD.get(key) if key is not None else None
    if held is None or held.fd is None:
        held = _Held(scope, name, path, _acquire(scope, name, path, timeout), key)
        if key is not None:
            _HELD[key] = held
    return NameLock(held)


def _acquire(scope: Scope, name: str, path: str, timeout: float | None) -> int:
    paths.ensure_dir_str(os.path.dirname(path))
    flags = os.O_RDWR | os.O_CREAT | os.O_CLOEXEC | os.O_NOFOLLOW
    said = False
    deadline = None if timeout is None else time.monotonic() + timeout
    while True:
        fd = os.open(path, flags, paths.FILE_MODE)
        try:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                if not said and scope.what is not None:
                    # A wait can last a guarded bring-up or a snapshot rollback (seconds):
                    # say why nothing happens, and who holds it, once, on stderr (stdout may
                    # be a protocol).
                    _note(
                        f"note: waiting for another linpodx command on {scope.what} {name} "
                        f"to finish{_holder(fd)}"
                    )
                    said = True
                _wait(fd, name, deadline)
            mine = os.fstat(fd)
            try:
                now = os.stat(path, follow_symlinks=False)
            except FileNotFoundError:
                now = None
        except BaseException:
            os.close(fd)
            raise
        if now is not None and (now.st_dev, now.st_ino) == (mine.st_dev, mine.st_ino):
            _sign(fd)
            return fd
        os.close(fd)  # the one before us removed this file on release: take the one there now


def _wait(fd: int, name: str, deadline: float | None) -> None:
    """Take the flock on `fd`, which another holds: blocking, or polling until `deadline`."""
    if deadline is None:
        fcntl.flock(fd, fcntl.LOCK_EX)
        return
    while True:
        if time.monotonic() >= deadline:
            raise Busy(f"the lock of {name} is held by another")
        time.sleep(0.1)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            return
        except BlockingIOError:
            continue


_PID_FIELD = 11
"""The holder's pid, right-aligned in a fixed width with a newline: each holder overwrites the
whole of the last one's in one write."""


def _sign(fd: int) -> None:
    """Write this process's pid into the lock file, for a waiter's note (best effort)."""
    try:
        os.pwrite(fd, f"{os.getpid():>{_PID_FIELD - 1}}\n".encode(), 0)
    except OSError:
        pass  # the note then just names no holder


def _holder(fd: int) -> str:
    """`` (pid N: linpodx snapshot rollback …)`` for the lock's holder, or "" if unknown.

    The pid is what the holder wrote; a program it lent the lock to (`proc.lending`) may hold
    it after the holder is gone, so a pid that is not a linpodx command is not named."""
    try:
        pid = int(os.pread(fd, _PID_FIELD, 0).decode("ascii"))
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            argv = f.read(4096).split(b"\0")
    except (OSError, ValueError):
        return ""
    words = [w.decode("utf-8", "replace") for w in argv if w]
    at = next((i for i, w in enumerate(words) if os.path.basename(w) == "linpodx"), None)
    if at is None:
        return ""
    from linpodx.output import safe_text  # only on a wait

    return f" (pid {pid}: {safe_text(' '.join(['linpodx', *words[at + 1 :]]), 200)})"


def _note(line: str) -> None:
    try:
        os.write(2, (line + "\n").encode("utf-8", "replace"))
    except OSError:
        pass  # a closed stderr is no reason not to wait


def sweep() -> None:
    """Remove the lock files of names that have nothing left under them and that nobody holds
    (best effort). A `--rm` container's state dir is removed by its poststop hook, which
    cannot take the lock (its `podman rm` may be what holds it), so its lock file stays."""
    root = paths.containers_root()
    where = os.path.join(root, LOCKS_DIR)
    try:
        names = os.listdir(where)
    except OSError:
        return
    for name in names:
        if os.path.lexists(os.path.join(root, name)):
            continue
        path = os.path.join(where, name)
        try:
            fd = os.open(path, os.O_RDWR | os.O_CLOEXEC | os.O_NOFOLLOW)
        except OSError:
            continue
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            mine, now = os.fstat(fd), os.stat(path, follow_symlinks=False)
            if (now.st_dev, now.st_ino) == (mine.st_dev, mine.st_ino) and not os.path.lexists(
                os.path.join(root, name)
            ):
                os.unlink(path)
        except OSError:
            pass  # held (a run of that name is under way) or gone meanwhile
        finally:
            os.close(fd)
