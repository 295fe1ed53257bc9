"""The one place linpodx starts other programs.

argv lists only (never a shell string). Four ways, one per kind of child, and one for a copy
of this process:
- `run`: to completion, output captured, a timeout on every call, failures raised as
  `EngineError` carrying argv, exit code and the program's own stderr;
- `popen`: a child that lives on beside linpodx (a helper for a container's life, an MCP
  server, a followed log); the caller owns it and waits for it;
- `Child`: the fast path's child with its stdout/stderr in pipes, started without `subprocess`;
- `spawn_detached`: a helper that outlives the command that starts it, with no parent to wait;
- `fork_worker`: a forked copy of this process that computes one result (the audit verifier's
  parallel ranges), never a program.

`linpodx.fastpath.run` loads this module before podman starts, so it imports nothing at the top that
the interpreter does not already have at start-up: `subprocess` (several milliseconds) is
imported where it is used, and `Result` is a plain class rather than a dataclass.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import signal
import time
from collections.abc import Callable, Iterator, Mapping, Sequence

from linpodx.errors import EngineError

TYPE_CHECKING = False  # the fast path's budget: linpodx/fastpath/__init__.py
if TYPE_CHECKING:
    import subprocess
    from typing import IO

DEFAULT_TIMEOUT = 120.0

# File descriptors lent to every program `run` starts while `lending` is active (see there).
_lent: tuple[int, ...] = ()


class Result:
    """What a finished program left behind."""

    __slots__ = ("argv", "returncode", "stderr", "stdout")

    def __init__(self, argv: tuple[str, ...], returncode: int, stdout: str, stderr: str) -> None:
        self.argv = argv
        """The argv that ran."""
        self.returncode = returncode
        """Its exit status."""
        self.stdout = stdout
        """Everything it printed on stdout (decoded as UTF-8, invalid bytes replaced)."""
        self.stderr = stderr
        """Everything it printed on stderr."""

    def _fields(self) -> tuple[tuple[str, ...], int, str, str]:
        return (self.argv, self.returncode, self.stdout, self.stderr)

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Result) and self._fields() == other._fields()

    def __hash__(self) -> int:
        return hash(self._fields())

    def __repr__(self) -> str:
        return (
            f"Result(argv={self.argv!r}, returncode={self.returncode!r}, "
            f"stdout={self.stdout!r}, stderr={self.stderr!r})"
        )


SBIN_DIRS = ("/usr/local/sbin", "/usr/sbin", "/sbin")


def which(program: str) -> str | None:
    """Full path of `program` on PATH (as `shutil.which` finds it), also looking in the sbin
    dirs a normal user's PATH lacks."""
    if "/" in program:
        return program if _runnable(program) else None
    dirs = os.environ.get("PATH", os.defpath).split(os.pathsep)
    for d in [*dirs, *SBIN_DIRS]:
        cand = os.path.join(d or ".", program)
        if _runnable(cand):
            return cand
    return None


def _runnable(path: str) -> bool:
    return os.access(path, os.X_OK) and not os.path.isdir(path)


@contextlib.contextmanager
def lending(*fds: int) -> Iterator[None]:
    """Let the programs `run` starts in this block inherit `fds`.

    For a lock held with flock: the lock lives as long as any open copy of its file, so a
    program that outlives this process (killed with kill -9 while it waits) keeps the lock
    until it has finished, and the next command that takes the lock cannot act on a container
    while a stray `podman rename` or `tar` of ours is still changing it. Only for short-lived
    programs: never around a start, whose conmon would hold the lock for the container's life.
    """
    global _lent
    before = _lent
    _lent = (*before, *fds)
    try:
        yield
    finally:
        _lent = before


def run(
    argv: Sequence[str],
    *,
    check: bool = True,
    timeout: float | None = DEFAULT_TIMEOUT,
    input: str | bytes | None = None,
    env: Mapping[str, str] | None = None,
    what: str | None = None,
    hint: str | None = None,
) -> Result:
    """Run `argv` to completion and capture its output.

    With `check`, a non-zero exit raises `EngineError("<what> failed", hint)` whose stderr is the
    program's own. A missing program or a timeout always raises.
    """
    import subprocess

    argv = tuple(argv)
    label = what or os.path.basename(argv[0])
    data = input.encode() if isinstance(input, str) else input
    try:
        cp = subprocess.run(
            argv,
            input=data,
            capture_output=True,
            timeout=timeout,
            env=dict(env) if env is not None else None,
            check=False,
            pass_fds=_lent,
        )
    except FileNotFoundError as exc:
        raise EngineError(
            f"{argv[0]} not found",
            hint or f"install {os.path.basename(argv[0])} (see `linpodx doctor`)",
            argv=argv,
        ) from exc
    except subprocess.TimeoutExpired as exc:
        raise EngineError(
            f"{label} did not finish within {timeout:g}s",
            hint or "check the engine with `linpodx doctor`",
            argv=argv,
            stderr=(exc.stderr or b"").decode("utf-8", "replace"),
        ) from exc
    res = Result(
        argv=argv,
        returncode=cp.returncode,
        stdout=cp.stdout.decode("utf-8", "replace"),
        stderr=cp.stderr.decode("utf-8", "replace"),
    )
    if check and cp.returncode != 0:
        raise EngineError(
            f"{label} failed (exit {cp.returncode})",
            hint,
            argv=argv,
            returncode=cp.returncode,
            stderr=res.stderr,
        )
    return res


def popen(
    argv: Sequence[str],
    *,
    stdin: int | IO[bytes] | None = None,
    stdout: int | IO[bytes] | None = None,
    stderr: int | IO[bytes] | None = None,
    pass_fds: Sequence[int] = (),
    bufsize: int = -1,
    new_session: bool = False,
) -> subprocess.Popen[bytes]:
    """Start `argv` as a child that lives on beside this process; the caller waits for it.

    `stdin`/`stdout`/`stderr` as `subprocess.Popen` takes them (None: inherited); `pass_fds`
    stay open in it, no other descriptor does. `new_session`: a child that outlives this
    command (the snapshot worker) runs in its own session, so the terminal's job control (a
    Ctrl-C of the CLI) does not reach it. OSError (FileNotFoundError for a missing program) if
    it cannot be started.
    """
    import subprocess

    return subprocess.Popen(
        list(argv),
        stdin=stdin,
        stdout=stdout,
        stderr=stderr,
        pass_fds=pass_fds,
        bufsize=bufsize,
        start_new_session=new_session,
    )


class Child:
    """A child with its stdout and stderr in pipes; `out_fd`/`err_fd` are their read ends.

    Started with `os.posix_spawn` (not `subprocess`, see the module docstring), doing what
    `subprocess.Popen` would do by default: the child gets only stdin/stdout/stderr (every other
    descriptor that is not close-on-exec is closed in it), and SIGPIPE and SIGXFSZ, which Python
    ignores, are back to their defaults in it. `engine.run_announced` relays the pipes.
    """

    def __init__(self, argv: Sequence[str]) -> None:
        """Start argv[0] (a full path) with argv. OSError (FileNotFoundError for a missing
        program) if it cannot be started; then nothing is left open."""
        out_r, out_w = os.pipe2(os.O_CLOEXEC)
        err_r, err_w = os.pipe2(os.O_CLOEXEC)
        actions: list[tuple[int, ...]] = [
            (os.POSIX_SPAWN_DUP2, out_w, 1),
            (os.POSIX_SPAWN_DUP2, err_w, 2),
        ]
        for name in os.listdir("/proc/self/fd"):
            fd = int(name)
            if fd > 2 and not _cloexec(fd):
                actions.append((os.POSIX_SPAWN_CLOSE, fd))
        try:
            self.pid = os.posix_spawn(
                argv[0],
                list(argv),
                os.environ,
                file_actions=actions,
                setsigdef=(signal.SIGPIPE, signal.SIGXFSZ),
            )
        except BaseException:
            for fd in (out_r, out_w, err_r, err_w):
                os.close(fd)
            raise
        os.close(out_w)
        os.close(err_w)
        self.argv = tuple(argv)
        self.out_fd, self.err_fd = out_r, err_r
        self.returncode: int | None = None

    def poll(self) -> int | None:
        """The exit status if the child has ended (negative: killed by that signal), else None."""
        if self.returncode is None:
            pid, status = os.waitpid(self.pid, os.WNOHANG)
            if pid == self.pid:
                self.returncode = os.waitstatus_to_exitcode(status)
        return self.returncode

    def wait(self, timeout: float | None = None) -> int:
        """Wait for the child; TimeoutError if it is still running after `timeout` seconds."""
        if self.returncode is not None:
            return self.returncode
        if timeout is None:
            _, status = os.waitpid(self.pid, 0)
            self.returncode = os.waitstatus_to_exitcode(status)
            return self.returncode
        deadline = time.monotonic() + timeout
        # The child's pidfd becomes readable when it ends: no sleep between looks (a poll loop
        # added up to its whole step to every wait, 10 ms on each `linpodx ps`).
        pidfd = _pidfd(self.pid)
        try:
            while (rc := self.poll()) is None:
                left = deadline - time.monotonic()
                if left <= 0:
                    raise TimeoutError(f"process {self.pid} still running after {timeout} s")
                if pidfd is None:
                    time.sleep(min(0.01, left))
                else:
                    import select  # a built-in module: nothing to load from disk

                    select.select([pidfd], [], [], left)
        finally:
            if pidfd is not None:
                os.close(pidfd)
        return rc

    def signal(self, sig: int) -> None:
        """Send `sig` unless the child was already reaped (its pid may be someone else's)."""
        if self.returncode is None:
            try:
                os.kill(self.pid, sig)
            except ProcessLookupError:
                pass

    def terminate(self) -> None:
        self.signal(signal.SIGTERM)

    def kill(self) -> None:
        self.signal(signal.SIGKILL)

    def collect(self, timeout: float | None = DEFAULT_TIMEOUT) -> tuple[int, bytes, bytes]:
        """Read both pipes to their end, then wait: (exit status, stdout, stderr), as `run`
        captures them. Both are read as they come (a child that fills one pipe while linpodx
        waits on the other would hang both). After `timeout` seconds the child is killed and
        TimeoutError raised. The pipes are closed either way."""
        import select  # a built-in module: nothing to load from disk

        chunks: dict[int, list[bytes]] = {self.out_fd: [], self.err_fd: []}
        poller = select.poll()
        for fd in chunks:
            poller.register(fd, select.POLLIN)
        open_fds = set(chunks)
        deadline = None if timeout is None else time.monotonic() + timeout
        try:
            while open_fds:
                left = None if deadline is None else deadline - time.monotonic()
                if left is not None and left <= 0:
                    self.kill()
                    self.wait()
                    raise TimeoutError(f"process {self.pid} still running after {timeout} s")
                for fd, _event in poller.poll(None if left is None else left * 1000):
                    chunk = os.read(fd, 65536)
                    if chunk:
                        chunks[fd].append(chunk)
                    else:
                        poller.unregister(fd)
                        open_fds.discard(fd)
            left = None if deadline is None else max(0.0, deadline - time.monotonic())
            try:
                rc = self.wait(left)
            except TimeoutError:
                # Its pipes closed but it runs on: killed as one still writing would be.
                self.kill()
                self.wait()
                raise
        finally:
            self.close()
        return rc, b"".join(chunks[self.out_fd]), b"".join(chunks[self.err_fd])

    def close(self) -> None:
        """Close the read ends of the pipes."""
        for fd in (self.out_fd, self.err_fd):
            try:
                os.close(fd)
            except OSError:
                pass


def _pidfd(pid: int) -> int | None:
    """A pidfd of `pid` (Linux 5.3 and later), None where there is none to be had."""
    try:
        return os.pidfd_open(pid)
    except (AttributeError, OSError):
        return None


def _cloexec(fd: int) -> bool:
    try:
        return bool(fcntl.fcntl(fd, fcntl.F_GETFD) & fcntl.FD_CLOEXEC)
    except OSError:
        return True  # closed meanwhile (the listdir's own descriptor): nothing to close


def spawn_detached(argv: Sequence[str], log: str, fd: tuple[int, int] | None = None) -> None:
    """Start `argv` in its own session, detached (double fork: no zombie, no parent to wait),
    stdin /dev/null, stdout and stderr appended to the file `log`; with `fd` = (source,
    target), descriptor `source` becomes descriptor `target` in it.

    Popen is not enough: the long-lived parent (a test run, a shell) would keep a zombie that
    looks alive to whoever checks the helper's pid; the helper owns its own lifetime.
    """
    logfd = os.open(log, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
    try:
        pid = os.fork()
        if pid == 0:  # pragma: no cover - child side
            try:
                os.setsid()
                if os.fork() != 0:
                    os._exit(0)
                devnull = os.open(os.devnull, os.O_RDONLY)
                os.dup2(devnull, 0)
                os.dup2(logfd, 1)
                os.dup2(logfd, 2)
                keep = 3
                if fd is not None:
                    source, target = fd
                    os.dup2(source, target)
                    os.set_inheritable(target, True)
                    keep = target + 1
                os.closerange(keep, 65536)
                # Python ignores SIGPIPE and a calling thread may block signals; both would be
                # inherited across exec (pasta refuses to start with them).
                signal.signal(signal.SIGPIPE, signal.SIG_DFL)
                signal.pthread_sigmask(signal.SIG_SETMASK, [])
                os.execv(argv[0], list(argv))  # noqa: S606 - argv list, no shell wanted
            finally:
                os._exit(127)
        os.waitpid(pid, 0)
    finally:
        os.close(logfd)


def fork_worker(work: Callable[[], bytes]) -> tuple[int, int]:
    """Run `work` in a forked copy of this process and return (pid, read end of a pipe that
    carries its result). For CPU-parallel work on what this process already has open (the
    children inherit its descriptors), never for starting a program. The child exits 0 once
    the whole result is written, 1 if `work` raised; the caller reads the pipe to its end,
    closes it, then `reap`s the pid. OSError if the pipe or the fork fails."""
    rfd, wfd = os.pipe()
    try:
        pid = os.fork()
    except OSError:
        os.close(rfd)
        os.close(wfd)
        raise
    if pid == 0:  # pragma: no cover - runs in the child (coverage does not see it)
        code = 1
        try:
            os.close(rfd)
            data = work()
            with os.fdopen(wfd, "wb") as out:
                out.write(data)
            code = 0
        finally:
            os._exit(code)
    os.close(wfd)
    return pid, rfd


def reap(pid: int) -> int:
    """Wait for child `pid` to end; its wait status (0: exited 0)."""
    _, status = os.waitpid(pid, 0)
    return status
