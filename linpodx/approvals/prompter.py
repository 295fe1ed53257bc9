"""Answering a pending approval on the listener's own terminal (`linpodx events`).

The answer is bound to the digest of the request file this prompter displayed (the source of
truth, not what the event stream said), and it comes only from this terminal: input typed ahead
is discarded first, and the window closes when the request expires or is settled elsewhere.
"""

from __future__ import annotations

import contextlib
import os
import select
import time
from collections.abc import Callable
from typing import Any, TextIO

from linpodx.approvals import store as approvals
from linpodx.errors import LinpodxError
from linpodx.output import safe_lines


class Prompter:
    """Asks `approve? [y/N]:` on the listener's own terminal and records the answer;
    `approve? [y/N/s]:` when the request can be approved for the session (`s`: this call and
    later ones of its session that the same rule decides for the same tool).

    `render` turns an event into the lines a person reads (the CLI's; the prompter shows the
    request from its file in that form).
    """

    def __init__(
        self, tty_in: TextIO, out: TextIO, render: Callable[[dict[str, Any]], list[str]]
    ) -> None:
        self.tty_in = tty_in
        self.out = out
        self.render = render
        self.seen: set[str] = set()

    def _flush_typeahead(self) -> None:
        # Anything typed before the question was shown must not count as its answer.
        with contextlib.suppress(Exception):
            import termios

            termios.tcflush(self.tty_in.fileno(), termios.TCIFLUSH)

    def _readline(self, deadline: float, settled: Callable[[], bool]) -> str | None:
        """A line typed before `deadline`; None once the window is over or, checked between
        keystrokes, the request was `settled` elsewhere (another listener, `linpodx approve`)."""
        fd = self.tty_in.fileno()
        buf = b""
        while True:
            left = deadline - time.time()
            if left <= 0:
                return None
            ready, _, _ = select.select([fd], [], [], min(left, 0.5))
            if not ready:
                if settled():
                    return None
                continue
            chunk = os.read(fd, 1024)
            if not chunk:
                return ""  # EOF on the terminal: no answer => deny
            buf += chunk
            if b"\n" in buf or b"\r" in buf:
                return buf.decode("utf-8", "replace").splitlines()[0] if buf.strip() else ""

    def _say(self, text: str) -> None:
        # Every line the prompter writes quotes an id or a message built from one; it goes
        # through safe_text here too, so no caller can put raw bytes on the terminal.
        self.out.write(safe_lines(text) + "\n")
        self.out.flush()

    @staticmethod
    def _status(approval_id: str) -> str:
        """The request's status; a request removed or damaged while its prompt is open is
        no longer pending (and must not end the listener)."""
        try:
            return approvals.status(approval_id)
        except LinpodxError as exc:
            return f"unreadable: {exc.message}"

    def ask(self, approval_id: str, event: dict[str, Any] | None = None) -> None:
        """Show one pending request from its file (the source of truth: what the answer binds
        is what is shown, not what the event stream says) and record the answer."""
        if approval_id in self.seen:
            return
        self.seen.add(approval_id)
        shown = approvals.shown_id(approval_id)
        try:
            pending = approvals.load(approval_id)
        except LinpodxError as exc:
            if event is not None:
                self._say(self.render(event)[0])
            self._say(f"approval: {shown}: {exc.message}")
            return
        if event is not None:
            from_file = {**pending.to_dict(), "ts": event.get("ts"), "type": event["type"]}
            shown_lines = self.render(from_file)
            self.out.write("".join(x + "\n" for x in shown_lines))
            self.out.flush()
        st = approvals.status(approval_id)
        if st != "pending":
            self._say(f"approval: {shown} already {st}")
            return
        self._flush_typeahead()
        self.out.write("approve? [y/N/s]: " if pending.grantable else "approve? [y/N]: ")
        self.out.flush()
        line = self._readline(pending.expires, lambda: self._status(approval_id) != "pending")
        if line is None:
            st = self._status(approval_id)
            if st != "pending":
                # Answered elsewhere while this prompt was open: say how, not "expired".
                self._say(f"\napproval: {shown} already decided ({st})")
            else:
                self._say(f"\napproval: {shown} expired (denied after the window)")
            return
        word = line.strip().lower()
        # `s` where it was not offered is no answer the person was given: a deny, like any other.
        session = pending.grantable and word in ("s", "session")
        decision = approvals.APPROVE if word in ("y", "yes") or session else approvals.DENY
        scope = approvals.SCOPE_SESSION if session else approvals.SCOPE_CALL
        reason = "approved by a person" if decision == approvals.APPROVE else "denied by a person"
        if session:
            reason += " for the session"
        try:
            written = approvals.answer(approval_id, pending.digest, decision, reason, scope=scope)
        except LinpodxError as exc:
            self._say(f"approval: {shown}: {exc.message}")
            return
        if written:
            word = "APPROVED" if decision == approvals.APPROVE else "DENIED"
            if session:
                word += " FOR THE SESSION"
            self._say(f"approval: {shown} → {word}")
        else:
            self._say(f"approval: {shown} already decided ({approvals.status(approval_id)})")
