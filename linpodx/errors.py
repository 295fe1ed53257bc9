"""The one error family of linpodx.

Every expected failure is a `LinpodxError`: a message saying what happened, a hint saying what
to do, and the exit code the CLI returns. The CLI catches exactly this base class; anything else
is a bug and is reported as one (still without leaking locals).
"""

from __future__ import annotations

from collections.abc import Sequence

# Exit codes: one per kind of error, the same from every command. README.md's table lists
# them (from EXIT_CODES below; tests/unit/test_cli_exit_codes.py holds the README to it). 2 is
# also what typer/click use for usage errors.
EXIT_OK = 0
EXIT_FAILURE = 1  # a check failed (`doctor`), or nothing more specific fits
EXIT_USAGE = 2
EXIT_INVALID = 3  # input (profile, label, payload) refused
EXIT_NOT_FOUND = 4
EXIT_ENGINE = 5  # podman / nft / a helper failed
EXIT_AUDIT = 6  # the audit log could not be written or read
EXIT_TAMPERED = 7  # verification found damage
EXIT_NOT_MANAGED = 8  # a container linpodx did not create (or not the one it created)
EXIT_CONFLICT = 9  # the name, label or answer is taken already
EXIT_DENIED = 10  # a policy or a person said no
EXIT_BUG = 70  # EX_SOFTWARE: an unexpected exception
EXIT_INTERRUPTED = 130  # Ctrl-C: 128 + SIGINT, what a shell reports for a command it killed

EXIT_CODES: tuple[tuple[int, str, str], ...] = (
    (EXIT_OK, "ok", "it worked"),
    (EXIT_FAILURE, "failure", "a `doctor` check failed, or a failure of no kind below"),
    (EXIT_USAGE, "usage", "the command line is wrong (unknown option, missing argument)"),
    (EXIT_INVALID, "invalid input", "a profile, label, name or payload was refused"),
    (EXIT_NOT_FOUND, "not found", "no such profile, file, container, snapshot, job or approval"),
    (EXIT_ENGINE, "podman failed", "podman, nft or a helper failed (its own words are shown)"),
    (EXIT_AUDIT, "audit", "the audit log could not be written or read (nothing was done)"),
    (EXIT_TAMPERED, "tampered", "an audit chain or a stored revision is damaged"),
    (EXIT_NOT_MANAGED, "not managed", "the container is not one linpodx created"),
    (EXIT_CONFLICT, "conflict", "the name or label is taken, the approval answered already"),
    (EXIT_DENIED, "denied", "a policy or a person said no"),
    (EXIT_BUG, "internal", "a bug in linpodx"),
    (EXIT_INTERRUPTED, "interrupted", "Ctrl-C (SIGTERM and SIGHUP: 128 + the signal)"),
)
"""Every exit status linpodx gives for itself: (code, kind, meaning). A foreground `run`,
`exec` and `mcp attach` exit with the container's command's own status once it ran."""


class Terminated(BaseException):
    """SIGTERM or SIGHUP arrived while a command ran (`cli.main` installs the handler that
    raises it). Like Ctrl-C's KeyboardInterrupt it is not an Exception: it unwinds through the
    same cleanup (`except BaseException`), so a command killed the polite way leaves nothing
    half done (no container created and never started), as one interrupted by Ctrl-C does."""

    def __init__(self, signum: int) -> None:
        super().__init__(signum)
        self.signum = signum


def raise_terminated(signum: int, _frame: object) -> None:
    """The SIGTERM/SIGHUP handler of every linpodx command (see `Terminated`)."""
    raise Terminated(signum)


def terminated_error(exc: Terminated) -> LinpodxError:
    """How a `Terminated` is reported: `error: terminated (SIGTERM)`, exit 128 + the signal."""
    import signal

    return LinpodxError(
        f"terminated ({signal.Signals(exc.signum).name})", exit_code=128 + exc.signum
    )


class LinpodxError(Exception):
    """Base class: `message` for what happened, `hint` for what to do about it."""

    exit_code: int = EXIT_FAILURE

    def __init__(
        self,
        message: str,
        hint: str | None = None,
        *,
        exit_code: int | None = None,
        details: dict[str, object] | None = None,
    ):
        super().__init__(message)
        self.message = message
        self.hint = hint
        # Structured facts about the failure (for `--json`), e.g. the first bad seq of a chain.
        self.details = details or {}
        if exit_code is not None:
            self.exit_code = exit_code

    def diagnostics(self) -> str:
        """The text a person sees on stderr: `error: …` and, when known, `hint: …`."""
        lines = [f"error: {self.message}"]
        if self.hint:
            lines.append(f"hint: {self.hint}")
        return "\n".join(lines)

    def to_dict(self) -> dict[str, object]:
        """The error as it appears in a `--json` envelope."""
        return {
            "type": type(self).__name__,
            "message": self.message,
            "hint": self.hint,
            "exit_code": self.exit_code,
            "details": self.details,
        }


class CommandFailed(Exception):
    """A command's `LinpodxError` on its way out of typer to the CLI's one error boundary
    (`linpodx.cli.main`), which prints it: with `--json` first the envelope named after the
    command on stdout, then `error:`/`hint:` on stderr. Not a LinpodxError itself: only that
    boundary handles it."""

    def __init__(self, name: str, json_mode: bool, error: LinpodxError) -> None:
        super().__init__(error.message)
        self.name = name
        """The command as its envelope names it (`sandbox apply`)."""
        self.json_mode = json_mode
        self.error = error


class UsageError(LinpodxError):
    """The command line itself is wrong."""

    exit_code = EXIT_USAGE


class InvalidInput(LinpodxError):
    """A profile, label, payload or other input was refused."""

    exit_code = EXIT_INVALID


class ProfileError(InvalidInput):
    """A profile failed to load; `problems` holds every `FILE:LINE:COL: message` found."""

    def __init__(self, message: str, hint: str | None = None, problems: Sequence[str] = ()):
        super().__init__(message, hint)
        self.problems = tuple(problems)

    def diagnostics(self) -> str:
        lines = [f"error: {p}" for p in self.problems] or [f"error: {self.message}"]
        if self.problems:
            lines.append(f"error: {self.message}")
        if self.hint:
            lines.append(f"hint: {self.hint}")
        return "\n".join(lines)

    def to_dict(self) -> dict[str, object]:
        d = super().to_dict()
        d["problems"] = list(self.problems)
        return d


class NotFound(LinpodxError):
    """A named thing (profile, container, session, snapshot, job) does not exist."""

    exit_code = EXIT_NOT_FOUND


class EngineError(LinpodxError):
    """An external program (podman, nft, a helper) failed. Carries its argv and its own words."""

    exit_code = EXIT_ENGINE

    def __init__(
        self,
        message: str,
        hint: str | None = None,
        *,
        argv: Sequence[str] = (),
        returncode: int | None = None,
        stderr: str = "",
    ):
        super().__init__(message, hint)
        self.argv = tuple(argv)
        self.returncode = returncode
        self.stderr = stderr

    def diagnostics(self) -> str:
        lines = [f"error: {self.message}"]
        said = self.stderr.strip()
        if said:
            # The engine's own words, indented, so the person sees what podman said.
            lines.extend(f"  {line}" for line in said.splitlines()[-20:])
        if self.hint:
            lines.append(f"hint: {self.hint}")
        return "\n".join(lines)

    def to_dict(self) -> dict[str, object]:
        d = super().to_dict()
        d.update(argv=list(self.argv), returncode=self.returncode, stderr=self.stderr)
        return d


class AuditError(LinpodxError):
    """The audit log could not be written or read; the action it would record must not happen."""

    exit_code = EXIT_AUDIT


class ChainBroken(LinpodxError):
    """Verification found a damaged or tampered chain."""

    exit_code = EXIT_TAMPERED


class NotManaged(LinpodxError):
    """The container exists but linpodx did not create it (or not this one under that name):
    linpodx acts only on its own."""

    exit_code = EXIT_NOT_MANAGED


class Conflict(LinpodxError):
    """What the command would create or answer is taken already (a container name, a snapshot
    label, an approval answered before)."""

    exit_code = EXIT_CONFLICT


class Denied(LinpodxError):
    """A policy or a person refused the action."""

    exit_code = EXIT_DENIED
