"""Progress on waits: a spinner on stderr saying what linpodx waits for (the first use of an
image in podman, a snapshot's commit, a rollback), so a 20-second wait does not look like a hang.

Shown only when stderr is a terminal, only once a wait has lasted `DELAY` seconds (the usual
sub-second ones stay silent), never under `--json` (`quiet`), and gone without a trace when
the wait ends (transient). rich is imported only when a spinner is really shown. Its live
display never takes over stdout or stderr (no redirection): stdout is data, and whatever the
command prints meanwhile goes where it always goes.
"""

from __future__ import annotations

import contextlib
import os
import sys
import threading
from collections.abc import Iterator
from typing import Any

DELAY = 2.0
"""Seconds a wait lasts before the spinner appears."""

_quiet = False


def quiet(on: bool = True) -> None:
    """No progress in this process (`--json`: nothing extra on either stream)."""
    global _quiet
    _quiet = on


def _shown_here() -> bool:
    if _quiet or os.environ.get("TERM") == "dumb":
        return False
    try:
        return sys.stderr.isatty()
    except (AttributeError, ValueError, OSError):  # closed, replaced by a non-file
        return False


@contextlib.contextmanager
def waiting(what: str, *, delay: float = DELAY) -> Iterator[None]:
    """A spinner saying `what` (plain text, never markup: it may hold a name or an image)
    while the block runs, once it has run `delay` seconds, on a terminal only."""
    if not _shown_here():
        yield
        return
    done = threading.Event()
    lock = threading.Lock()
    live: list[Any] = []

    def show() -> None:
        if done.wait(delay):
            return
        with lock:
            if done.is_set():
                return
            with contextlib.suppress(Exception):  # progress never fails a command
                live.append(_start(what))

    timer = threading.Thread(target=show, name="linpodx-progress", daemon=True)
    timer.start()
    try:
        yield
    finally:
        with lock:
            done.set()
            for shown in live:
                with contextlib.suppress(Exception):
                    shown.stop()
        timer.join(timeout=1.0)


def _start(what: str) -> Any:
    from rich.console import Console
    from rich.live import Live
    from rich.spinner import Spinner
    from rich.text import Text

    from linpodx.output import safe_text

    console = Console(file=sys.stderr, highlight=False, markup=False, emoji=False)
    text = Text(f" {safe_text(what, 200)}", no_wrap=True, overflow="ellipsis")
    spinner = Spinner("dots", text=text)
    live = Live(
        spinner, console=console, transient=True, refresh_per_second=8,
        redirect_stdout=False, redirect_stderr=False,
    )  # fmt: skip
    live.start()
    return live
