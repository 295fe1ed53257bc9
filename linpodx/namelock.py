"""One lock per container name, held while linpodx makes, starts or removes a container.

What linpodx keeps under `containers_dir()/NAME` (run spec, mount pins, the egress guard's
files and log) is written before `podman create` decides who gets the name. Two runs of one
name at once would both write there, and the one podman refuses would then clean up files that
are the other's (its guard's log, its policy file). So every command that writes or removes
what lives under a name takes this lock first, and looks at the name again once it has it:
the second run then finds the name taken and refuses before touching anything.

The lock is an `flock` on `containers_dir()/.locks/NAME` (no container name starts with a
dot). It is released when its process ends, however it ends. The file is removed on release
once nothing is left under the name (names are often random, one per `--rm` run); whoever
waited on the removed file takes the lock again on the file now there.

Standard library's cheapest modules only: the fast run path (`linpodx.fastpath.run`) takes the lock
before podman starts.
"""

from __future__ import annotations

import _thread  # threading's own id function, without importing threading (see above)
import fcntl
import os

from linpodx import paths

LOCKS_DIR = ".locks"


def lock_path(name: str) -> str:
    """`containers_dir()/.locks/NAME` (NAME already validated by the caller)."""
    return os.path.join(paths.containers_root(), LOCKS_DIR, name)


class _Held:
    """The flock itself (one per name and thread), shared by every handle of it."""

    def __init__(self, name: str, path: str, fd: int, key: tuple[str, int]) -> None:
        self.name = name
        self.path = path
        self.fd: int | None = fd
        self.key = key
        self.handles = 0  # handles not yet released

    def drop(self) -> None:
        """The last handle went: remove the lock file if nothing is left under the name, while
        still holding it (see the module docstring), then let go."""
        _HELD.pop(self.key, None)
        fd, self.fd = self.fd, None
        if fd is None:
            return
        try:
            if not os.path.lexists(os.path.join(paths.containers_root(), self.name)):
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


# The name locks this process holds, per thread. Taking one again in the same thread is not a
# wait: a snapshot rollback holds its container's name throughout, and the stop, create and
# start it makes take it again (flock would make the second open of the file wait for the
# first, for ever). Another thread waits like another process would.
_HELD: dict[tuple[str, int], _Held] = {}


def acquire(name: str) -> NameLock:
    """Wait for and take the lock of the container name NAME (at once, if this thread holds it
    already: the lock then goes with the last handle released). OSError if the state dir
    cannot hold it."""
    key = (name, _thread.get_ident())
    held = _HELD.get(key)
    if held is None or held.fd is None:
        path, fd = _acquire(name)
        held = _HELD[key] = _Held(name, path, fd, key)
    return NameLock(held)


def _acquire(name: str) -> tuple[str, int]:
    path = lock_path(name)
    paths.ensure_dir_str(os.path.dirname(path))
    flags = os.O_RDWR | os.O_CREAT | os.O_CLOEXEC | os.O_NOFOLLOW
    said = False
    while True:
        fd = os.open(path, flags, paths.FILE_MODE)
        try:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                if not said:
                    # A wait can last a guarded bring-up or a snapshot rollback (seconds):
                    # say why nothing happens, and who holds it, once, on stderr (stdout may
                    # be a protocol).
                    _note(
                        f"note: waiting for another linpodx command on container {name} "
                        f"to finish{_holder(fd)}"
                    )
                    said = True
                fcntl.flock(fd, fcntl.LOCK_EX)
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
            return path, fd
        os.close(fd)  # the one before us removed this file on release: take the one there now


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
