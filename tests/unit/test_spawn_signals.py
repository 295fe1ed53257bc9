"""How a foreground podman's end is reported when linpodx passed it a signal, or when podman
itself was killed (real child processes standing in for podman)."""

from __future__ import annotations

import os
import signal
import sys

from linpodx.podman import engine, spawn


def test_a_zero_status_after_a_forwarded_signal_is_the_signals() -> None:
    held = spawn.hold_signals(lambda _sig: None)
    try:
        assert held.status(0) == 0 and held.status(3) == 3
        os.kill(os.getpid(), signal.SIGTERM)  # forwarded (to nobody here), not fatal
        assert held.received == [signal.SIGTERM]
        # podman 4.3 says 0 when the signal lands before the container started.
        assert held.status(0) == 143
        assert held.status(1) == 1  # a status of its own is kept
    finally:
        spawn.restore_signals(held)


def test_run_inherited_reports_a_killed_podman_as_a_shell_does() -> None:
    code = "import os, signal; os.kill(os.getpid(), signal.SIGKILL)"
    assert engine.run_inherited([sys.executable, "-c", code]) == 128 + signal.SIGKILL
    assert engine.run_inherited([sys.executable, "-c", "raise SystemExit(4)"]) == 4
