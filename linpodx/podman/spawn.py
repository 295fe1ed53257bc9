"""Signals while linpodx waits on a foreground podman: held, passed on, and a stop after grace.

`linpodx.fastpath.run` loads this before podman starts (see there), so it keeps to the modules the
interpreter already has. The child itself is a `linpodx.proc.Child` (the one place programs
are started).
"""

from __future__ import annotations

import os
import signal

TYPE_CHECKING = False  # the fast path's budget: linpodx/fastpath/__init__.py
if TYPE_CHECKING:
    from collections.abc import Callable
    from typing import Any


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
"""The holds in effect, outermost first (`linpodx.fastpath.run` holds while podman starts, then
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
        import threading  # only here: `linpodx.fastpath.run` keeps its imports to what it needs

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
