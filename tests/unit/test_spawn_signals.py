"""How a foreground podman's end is reported when linpodx passed it a signal, or when podman
itself was killed (real child processes standing in for podman)."""

from __future__ import annotations

import os
import signal
import sys

import pytest

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


def test_a_podman_the_forwarded_signal_ended_has_its_container_stopped(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """SIGTERM lands before podman set up its signal proxy: podman dies of it, and the
    container it started runs on (seen in CI: exit 143, the container `running`). The run's
    `stop` ends it."""
    import subprocess

    real = subprocess.Popen
    stopped: list[bool] = []

    def popen(argv: list[str], **kw: object) -> subprocess.Popen[bytes]:
        child = real(argv, **kw)  # type: ignore[call-overload]
        os.kill(os.getpid(), signal.SIGTERM)  # passed on to the child, which dies of it
        return child  # type: ignore[no-any-return]

    monkeypatch.setattr(subprocess, "Popen", popen)
    code = "import time; time.sleep(30)"
    rc = engine.run_inherited([sys.executable, "-c", code], stop=lambda: stopped.append(True))
    assert rc == 128 + signal.SIGTERM
    assert stopped == [True]
    # Without a signal, an ordinary failure stops nothing.
    monkeypatch.undo()
    assert engine.run_inherited([sys.executable, "-c", "raise SystemExit(4)"],
                                stop=lambda: stopped.append(True)) == 4  # fmt: skip
    assert stopped == [True]


def test_a_signal_before_podman_exists_is_passed_on_once_it_does(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """SIGTERM lands after linpodx decided to run podman and before podman exists: it is held
    and passed on (before, it ended linpodx and left podman and the container running)."""
    import subprocess

    real = subprocess.Popen

    def popen(argv: list[str], **kw: object) -> subprocess.Popen[bytes]:
        os.kill(os.getpid(), signal.SIGTERM)
        return real(argv, **kw)  # type: ignore[call-overload,no-any-return]

    monkeypatch.setattr(subprocess, "Popen", popen)
    code = "import time; time.sleep(30)"
    assert engine.run_inherited([sys.executable, "-c", code]) == 128 + signal.SIGTERM


def test_a_signal_an_enclosing_hold_passed_on_starts_the_inner_holds_stop(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """fastrun holds the signals while podman starts, then relay_announced holds them again
    with a grace-period `stop`. A SIGTERM that came in between (passed on to podman, ignored by
    the container) must still start that stop, or linpodx waits for ever (seen on podman 5
    under load: `linpodx run --rm` of a command that traps TERM hung)."""
    import threading

    monkeypatch.setattr(spawn, "STOP_GRACE_SECONDS", 0.2)
    sent: list[int] = []
    outer = spawn.hold_signals(sent.append)
    try:
        os.kill(os.getpid(), signal.SIGTERM)
        assert sent == [signal.SIGTERM]
        stopped = threading.Event()
        inner = spawn.hold_signals(sent.append, stopped.set)
        try:
            assert stopped.wait(10), "the signal before the inner hold did not start its stop"
            assert inner.status(0) == 143  # and it is reported as that run's signal
        finally:
            spawn.restore_signals(inner)
    finally:
        spawn.restore_signals(outer)
    # Once the holds are gone, a new hold starts clean.
    quiet = threading.Event()
    held = spawn.hold_signals(sent.append, quiet.set)
    spawn.restore_signals(held)
    assert not quiet.wait(0.5)
