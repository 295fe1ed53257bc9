"""A child process with its stdout and stderr in pipes, started without `subprocess`.

`linpodx.fastrun` starts `podman run` before it imports anything it does not need for that (see
there); `subprocess` and its imports would cost it several milliseconds. `os.posix_spawn` does
the same job here, with what `subprocess.Popen` would do by default: the child gets only
stdin/stdout/stderr (every other descriptor that is not close-on-exec is closed in it), and
SIGPIPE and SIGXFSZ, which Python ignores, are back to their defaults in it.
`engine.run_announced` relays the pipes.
"""

from __future__ import annotations

import fcntl
import os
import signal
import time

TYPE_CHECKING = False  # not typing's: see the module docstring
if TYPE_CHECKING:
    from collections.abc import Callable, Sequence
    from typing import Any


class Child:
    """A started child. `out_fd`/`err_fd` are the read ends of its stdout/stderr pipes."""

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
        while (rc := self.poll()) is None:
            if time.monotonic() >= deadline:
                raise TimeoutError(f"process {self.pid} still running after {timeout} s")
            time.sleep(0.01)
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

    def close(self) -> None:
        """Close the read ends of the pipes."""
        for fd in (self.out_fd, self.err_fd):
            try:
                os.close(fd)
            except OSError:
                pass


FORWARDED = (signal.SIGTERM, signal.SIGHUP)
"""Signals passed on to a foreground podman instead of ending linpodx: `kill`, a CI job's
timeout and a closed terminal send them to linpodx alone. Ended by them, linpodx would leave
podman (and the container, which podman keeps running) behind with nobody to clean up after
the run; passed on, podman's --sig-proxy hands them to the container, which ends the run the
usual way and linpodx cleans up as after any run."""

STOP_GRACE_SECONDS = 10.0
"""After a forwarded signal, how long the container may take to end by itself before `stop`
(given to `hold_signals`) ends it: its PID 1 may ignore SIGTERM (no --init without catatonit)
or trap it (a hostile agent), and linpodx must not then wait on it for ever."""


class Held:
    """Signal handlers `hold_signals` replaced, and its stop timer; `restore_signals` undoes."""

    def __init__(self, old: dict[int, Any], fired: Any = None, ended: Any = None) -> None:
        self.old = old
        self.fired = fired
        self.ended = ended
        self.received: list[int] = []
        """The forwarded signals that arrived, in order."""

    def status(self, rc: int) -> int:
        """podman's exit status `rc`, unless a forwarded signal arrived and podman still said
        0: podman 4.3 exits 0 when the signal lands between creating and starting the
        container (which it leaves behind, never started). Then 128 + the signal, as a shell
        reports a command its signal ended, so that the caller cleans up as after a failure."""
        return 128 + self.received[0] if rc == 0 and self.received else rc


_HOLDS: list[Held] = []
"""The holds in effect, outermost first (`linpodx.fastrun` holds while podman starts, then
`engine.relay_announced` holds again, with a `stop`, for the same podman)."""


def hold_signals(send: Callable[[int], None], stop: Callable[[], None] | None = None) -> Held:
    """While linpodx waits on a foreground podman: SIGINT ignored (a Ctrl-C reaches podman
    through the terminal's process group, or is a byte for the container in a TTY session),
    FORWARDED signals handed to `send`. With `stop`, the first forwarded signal also starts a
    timer: if the wait is still on STOP_GRACE_SECONDS later, `stop()` runs (in a thread), to end
    a container that did not end by itself. A signal an enclosing hold already passed on counts
    as this hold's first: it came for the same podman, and without it a container that ignored
    a signal sent in between the two holds kept linpodx waiting for ever (seen under load: the
    run's grace-period stop never came). Call from the main thread."""
    old: dict[int, Any] = {s: signal.getsignal(s) for s in (signal.SIGINT, *FORWARDED)}
    held = Held(old)
    held.received.extend(sig for outer in _HOLDS for sig in outer.received)
    if stop is not None:
        import threading  # only here: `linpodx.fastrun` keeps its imports to what it needs

        held.fired, held.ended = threading.Event(), threading.Event()
        if held.received:
            held.fired.set()
        threading.Thread(
            target=_stop_after_grace, args=(held, stop), name="stop-after-signal", daemon=True
        ).start()

    def on_signal(signum: int, _frame: Any) -> None:
        held.received.append(signum)
        send(signum)
        if held.fired is not None:
            held.fired.set()

    signal.signal(signal.SIGINT, signal.SIG_IGN)
    for sig in FORWARDED:
        signal.signal(sig, on_signal)
    _HOLDS.append(held)
    return held


def _stop_after_grace(held: Held, stop: Callable[[], None]) -> None:
    held.fired.wait()
    if held.ended.is_set() or held.ended.wait(STOP_GRACE_SECONDS):
        return
    try:
        stop()
    except Exception as exc:  # the wait goes on; a second signal is forwarded as the first was
        os.write(2, f"linpodx: could not stop the container after the signal: {exc}\n".encode())


def restore_signals(held: Held) -> None:
    if held in _HOLDS:
        _HOLDS.remove(held)
    for sig, handler in held.old.items():
        # None: a handler not set from Python; the default is the closest we can put back.
        signal.signal(sig, handler if handler is not None else signal.SIG_DFL)
    if held.ended is not None:
        held.ended.set()
        held.fired.set()  # wakes the timer thread, which then sees `ended` and returns


def _cloexec(fd: int) -> bool:
    try:
        return bool(fcntl.fcntl(fd, fcntl.F_GETFD) & fcntl.FD_CLOEXEC)
    except OSError:
        return True  # closed meanwhile (the listdir's own descriptor): nothing to close


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
