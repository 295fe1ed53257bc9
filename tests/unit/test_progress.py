"""Progress on waits (`linpodx.progress`): a spinner on a real terminal (a pty) once a wait has
lasted its delay, and nothing at all when stderr is not a terminal, under `--json`, or for a
short wait."""

from __future__ import annotations

import io
import os
import pty
import select
import sys
import time
from collections.abc import Iterator

import pytest

from linpodx import progress


class Terminal:
    """A new pty; `use()` puts stderr on its slave side (inside the test itself: pytest's own
    capture sets sys.stderr again after fixtures ran), `shown()` reads what it displayed."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.master, slave = pty.openpty()
        self.out = os.fdopen(slave, "w", buffering=1, encoding="utf-8")
        self.monkeypatch = monkeypatch

    def use(self) -> None:
        self.monkeypatch.setattr(sys, "stderr", self.out)
        self.monkeypatch.setenv("TERM", "xterm")
        self.monkeypatch.setattr(progress, "_quiet", False)

    def shown(self) -> str:
        data = b""
        while select.select([self.master], [], [], 0.2)[0]:
            try:
                chunk = os.read(self.master, 65536)
            except OSError:
                break
            if not chunk:
                break
            data += chunk
        return data.decode("utf-8", "replace")


@pytest.fixture
def terminal(monkeypatch: pytest.MonkeyPatch) -> Iterator[Terminal]:
    term = Terminal(monkeypatch)
    try:
        yield term
    finally:
        monkeypatch.undo()
        term.out.close()
        os.close(term.master)


def test_a_long_wait_on_a_terminal_shows_what_it_waits_for(terminal: Terminal) -> None:
    terminal.use()
    with progress.waiting("podman is creating agent-1 from img", delay=0.1):
        time.sleep(1.5)
    seen = terminal.shown()
    assert "podman is creating agent-1 from img" in seen
    # Transient: the cursor is shown again and the line cleared at the end.
    assert "\x1b[?25h" in seen and seen.endswith("\x1b[2K")


def test_a_short_wait_shows_nothing(terminal: Terminal) -> None:
    terminal.use()
    with progress.waiting("quick", delay=0.5):
        time.sleep(0.05)
    time.sleep(0.6)  # past the delay: the timer must have been called off
    assert terminal.shown() == ""


def test_json_mode_shows_nothing_even_on_a_terminal(terminal: Terminal) -> None:
    terminal.use()
    from linpodx.cli.main import main

    main(["version", "--json"])  # any command: `--json` is what counts
    assert progress._quiet is True
    with progress.waiting("hidden", delay=0.05):
        time.sleep(0.4)
    assert "hidden" not in terminal.shown()
    main(["version"])  # a later command in the same process without --json shows it again
    assert progress._quiet is False


def test_not_a_terminal_shows_nothing(monkeypatch: pytest.MonkeyPatch) -> None:
    err = io.StringIO()
    monkeypatch.setattr(sys, "stderr", err)
    monkeypatch.setattr(progress, "_quiet", False)
    with progress.waiting("hidden", delay=0.05):
        time.sleep(0.3)
    assert err.getvalue() == ""


def test_control_characters_in_what_never_reach_the_terminal(terminal: Terminal) -> None:
    terminal.use()
    with progress.waiting("image \x1b]0;pwned\x07 name", delay=0.05):
        time.sleep(1.5)
    seen = terminal.shown()
    assert "\x1b]0;pwned" not in seen and "pwned" in seen
