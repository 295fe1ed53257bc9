"""Entry point: `linpodx …` and `python -m linpodx …`."""

from __future__ import annotations

import contextlib
import errno
import importlib
import os
import signal
import sys

from linpodx import __version__
from linpodx.errors import (
    EXIT_BUG,
    EXIT_INTERRUPTED,
    CommandFailed,
    LinpodxError,
    Terminated,
    UsageError,
    raise_terminated,
    terminated_error,
)
from linpodx.output import (
    envelope,
    envelopes_printed,
    print_error,
    print_json,
    printable_streams,
    safe_text,
)

TYPE_CHECKING = False  # the fast path's budget: linpodx/fastpath/__init__.py
if TYPE_CHECKING:
    from collections.abc import Callable, Sequence
    from typing import Any

    import typer

# Command groups (typer sub-apps) and modules that add top-level commands, in help order.
# They are imported only when their command is asked for: importing all of them costs several
# hundred milliseconds (jsonschema, the MCP stack), which every `linpodx run` would pay.
_GROUPS = {
    "sandbox": "linpodx.cli.sandbox",
    "audit": "linpodx.cli.audit",
    "mcp": "linpodx.cli.mcp",
    "snapshot": "linpodx.cli.snapshot",
    "approvals": "linpodx.cli.approvals",
}
_TOP_LEVEL = {
    "linpodx.cli.containers": ("run", "ps", "start", "stop", "rm", "logs", "exec", "doctor"),
    "linpodx.cli.approvals": ("events", "approve", "deny"),
    "linpodx.cli.attach": ("attach",),
    "linpodx.cli.egress": ("_egress-guard",),
}


def version_cmd(json_mode: bool = False) -> None:
    """Print the linpodx version (also `linpodx --version`); with --json, one JSON document."""
    if not json_mode:
        print(f"linpodx {__version__}")
        return
    import platform

    print_json(
        envelope("version", {"version": __version__, "python": platform.python_version()})
    )


def help_cmd(words: list[str] | None = None, man: bool = False) -> int:
    """Show the help of a command (`linpodx help sandbox apply`), or with --man the man page."""
    if man:
        from linpodx.cli import surface

        if words:
            raise UsageError(
                f"--man prints the whole man page and takes no command (got `{' '.join(words)}`)",
                "run `linpodx help --man` alone (each command is a section of it), or "
                f"`linpodx help {' '.join(words)}` for that command's help",
            )

        sys.stdout.write(surface.man_page(command_tree(None), __version__))
        return 0
    rc = _main([*(words or []), "--help"])
    return rc.exit_code if isinstance(rc, LinpodxError) else rc


def completion_cmd(shell: str) -> None:
    """Print the shell completion script for bash, zsh or fish (e.g. `source <(linpodx
    completion bash)`, or save it where the shell loads completions from)."""
    from linpodx.cli import surface

    if shell not in surface.SHELLS:
        raise UsageError(
            f"no completion for shell {shell!r}", f"use one of {', '.join(surface.SHELLS)}"
        )
    sys.stdout.write(surface.completion_script(shell).rstrip("\n") + "\n")


_CONVENTIONS = ("version", "help", "completion")


def build_app(command: str | None = None) -> typer.Typer:
    """The CLI app; with `command`, only the module that provides it is loaded.

    An unknown or missing command loads everything, so help and "No such command" are complete.
    """
    from linpodx.cli import surface
    from linpodx.cli.common import new_app

    app = new_app(surface.HELP)
    known = (
        command in _CONVENTIONS
        or command in _GROUPS
        or any(command in names for names in _TOP_LEVEL.values())
    )
    for module, names in _TOP_LEVEL.items():
        if not known or command in names:
            importlib.import_module(module).register(app)
    for name, module in _GROUPS.items():
        if not known or command == name:
            app.add_typer(importlib.import_module(module).app, name=name)
    # `--version`, `version`, `help`, `completion`: last in the list
    surface.register(app, version_cmd, help_cmd, completion_cmd)
    return app


def command_tree(command: str | None) -> Any:
    """The click command of `build_app(command)`, with linpodx's help conventions
    (`surface.tidy`)."""
    import typer

    from linpodx.cli import surface

    return surface.tidy(typer.main.get_command(build_app(command)))


# OSError numbers that say something about the machine (space, permissions, what a path is),
# not about linpodx's code: an `error:` for the person, not a bug report.
_ENVIRONMENT_ERRNOS = frozenset(
    {
        errno.ENOSPC, errno.EDQUOT, errno.EROFS, errno.EACCES, errno.EPERM, errno.ENOTDIR,
        errno.EISDIR, errno.ELOOP, errno.ENAMETOOLONG, errno.EIO, errno.EMFILE, errno.ENFILE,
    }
)  # fmt: skip


def environment_error(exc: OSError) -> LinpodxError | None:
    """A clean error for an OSError that the machine caused, None for anything else.

    Commands turn the failures they expect into errors of their own; this is the last resort
    for the rest (a state dir on a full or read-only disk, a file where a directory belongs),
    which would otherwise be reported as a bug.
    """
    from linpodx import paths
    from linpodx.errors import EXIT_AUDIT, EXIT_FAILURE

    path = exc.filename if isinstance(exc.filename, str) else None
    try:
        state = os.path.abspath(paths.named_root())
    except LinpodxError:
        state = None
    inside = (
        path is not None
        and state is not None
        and (os.path.abspath(path) + "/").startswith(state.rstrip("/") + "/")
    )
    if not inside and exc.errno not in _ENVIRONMENT_ERRNOS:
        return None
    why = exc.strerror or str(exc)
    shown = f": {safe_text(path)}" if path else ""
    if inside:
        return LinpodxError(
            f"cannot use linpodx's state dir: {why}{shown}",
            f"the state dir {safe_text(state or '')} must be a directory you can write, on a "
            "file system with free space (LINPODX_STATE_DIR picks another)",
            exit_code=EXIT_AUDIT,
        )
    if path:
        hint = "check that path, its permissions and the free space of its file system"
    else:
        # A write() failing tells no file name; most of what linpodx writes is in its state dir.
        where = f" ({safe_text(state)})" if state else ""
        hint = (
            f"check the free space and permissions of linpodx's state dir{where} and of "
            "podman's storage (`df -h`, `podman info`)"
        )
    return LinpodxError(f"{why}{shown}", hint, exit_code=EXIT_FAILURE)


def _command_name(args: list[str]) -> str:
    """`sandbox validate`, `run` …: the command as a `--json` envelope names it."""
    words = [a for a in args[:2] if not a.startswith("-")]
    if words and words[0] in _GROUPS and len(words) > 1:
        return " ".join(words)
    return words[0] if words else "linpodx"


def format_as_json(args: list[str]) -> list[str]:
    """`--format json` and `--format=json` (before `--`) are `--json`, as podman users type
    it; except in `sandbox show`, whose own `--format yaml|json` picks how the profile reads."""
    end = args.index("--") if "--" in args else len(args)
    if _command_name(args) == "sandbox show":
        return args
    out: list[str] = []
    i = 0
    while i < end:
        if args[i] == "--format" and i + 1 < end and args[i + 1] == "json":
            out.append("--json")
            i += 2
            continue
        out.append("--json" if args[i] == "--format=json" else args[i])
        i += 1
    return out + args[end:]


def _format_left(args: list[str]) -> LinpodxError | None:
    """A `--format` that `format_as_json` left (not `json`): click would call the option
    unknown, though the README and every command's help name it."""
    end = args.index("--") if "--" in args else len(args)
    for i, arg in enumerate(args[:end]):
        if arg == "--format" or arg.startswith("--format="):
            value = arg.partition("=")[2] if "=" in arg else " ".join(args[i + 1 : i + 2])
            value = "" if value.startswith("-") else value
            return UsageError(
                f"--format takes only json here (got {value!r})" if value else
                "--format needs a value: json",
                "use `--format json` (or `--json`); podman's Go templates are not supported",
            )
    return None


def main(argv: Sequence[str] | None = None) -> int:
    """Run the CLI and return its exit code. Expected failures never print a traceback.

    With `--json`, a failure that no command turned into its envelope (a usage error, an
    unexpected one) still prints exactly one: the README promises one document, errors too.
    """
    args = format_as_json(list(sys.argv[1:] if argv is None else argv))
    json_mode = "--json" in (args[: args.index("--")] if "--" in args else args)
    if json_mode or "linpodx.progress" in sys.modules:  # (not loaded on the fast path)
        from linpodx import progress

        progress.quiet(json_mode)  # one document on stdout, nothing extra on stderr either
    err: LinpodxError | None = None
    printed = envelopes_printed()
    left = None if _command_name(args) == "sandbox show" else _format_left(args)
    if left is not None:
        print_error(left)
    rc = _main(args) if left is None else left
    if isinstance(rc, LinpodxError):
        err, rc = rc, rc.exit_code
    name = _command_name(args)
    # `mcp attach`'s stdout is the MCP client's: nothing but protocol messages, ever.
    if json_mode and rc != 0 and envelopes_printed() == printed and name != "mcp attach":
        doc = envelope(name, error=err or LinpodxError(f"exit status {rc}", exit_code=rc))
        # `events --json` prints one object per line; everything else pretty documents.
        _unless_reader_gone(lambda: print_json(doc, compact=name == "events"))
    return rc


def _main(args: list[str]) -> int | LinpodxError:
    """`main` without the `--json` last resort; a failure is returned as the error it is."""
    global _nothing_left
    command = args[0] if args and not args[0].startswith("-") else None
    # Both printed before the one error boundary below: a reader that went away (`linpodx
    # --help | head -1`) ends them as it ends every command (`_unless_reader_gone`).
    if args == ["--version"]:
        # Without building the app: as quick as `podman --version`.
        return 0 if _unless_reader_gone(lambda: _flushed(version_cmd)) else 1
    if args in ([], ["-h"], ["--help"], ["help"]) and not os.environ.get("_LINPODX_COMPLETE"):
        text = _stored_root_help()
        if text is not None:
            return 0 if _unless_reader_gone(lambda: _flushed(lambda: sys.stdout.write(text))) else 1
    # SIGTERM and SIGHUP unwind like Ctrl-C (see `Terminated`); commands that wait on a child
    # or serve a session put their own handlers in place meanwhile and restore these.
    for signum in (signal.SIGTERM, signal.SIGHUP):
        signal.signal(signum, raise_terminated)
    try:
        try:
            if command == "run":
                # typer costs ~0.2 s of start-up; the plain forms of `run` skip it, and take the
                # fast path where they can (see linpodx/fastpath/__init__.py).
                from linpodx.fastpath import argv

                fields = argv.parse_fields(args[1:])
                if fields is not None:
                    from linpodx.fastpath import run

                    rc = run.main(fields)
                    if rc is not None:
                        return rc
                    from linpodx.cli import runcmd

                    return runcmd.execute(runcmd.request(fields))
            if command == "ps":
                # typer costs more than `podman ps` itself: plain forms skip it (`pscmd`).
                from linpodx.cli import pscmd

                plain = pscmd.parse(args[1:])
                if plain is not None:
                    rc = pscmd.execute(*plain)
                    _nothing_left = True  # see `entry`
                    return rc
            if command == "help" and "--man" not in args and not _asks_help(args[1:]):
                # `linpodx help sandbox apply` is `linpodx sandbox apply --help`.
                args = [*args[1:], "--help"]
                command = args[0] if not args[0].startswith("-") else None
            if os.environ.get("_LINPODX_COMPLETE"):
                from linpodx.cli import surface

                surface.init_completion()  # then click answers the shell and exits
            rv = command_tree(command).main(args=args, prog_name="linpodx", standalone_mode=False)
        except CommandFailed as failed:
            # Inside the outer `try`: printing it can fail as the command's own output can.
            return _report(failed)
    except LinpodxError as exc:
        print_error(exc)
        return exc
    except OSError as exc:
        if exc.errno == errno.EPIPE and _stdout_reader_gone():
            # `linpodx ps --json | head -1`: the command's own output met a closed pipe.
            _silence_stdout()
            return 1
        clean = environment_error(exc)
        if clean is None:
            return _bug(exc)
        print_error(clean)
        return clean
    except KeyboardInterrupt:
        sys.stderr.write("error: interrupted\n")
        return EXIT_INTERRUPTED
    except Terminated as exc:
        err = terminated_error(exc)
        with contextlib.suppress(OSError):  # SIGHUP: the terminal may be gone
            print_error(err)
        return err
    except Exception as exc:
        return _click_failure(exc, args)
    return rv if isinstance(rv, int) else 0


def _stored_root_help() -> str | None:
    """`linpodx --help` as typer would print it, rendered in advance (`roothelp.txt`, made by
    `python -m linpodx.cli.docgen`; tests/unit/test_cli_surface.py holds it current): typer and
    every command module cost ~0.3 s to import, `podman --help` takes ~0.03 s. None where it
    would not be what typer prints: a terminal narrower than the text was rendered for."""
    try:
        columns = int(os.environ.get("COLUMNS") or 0) or os.get_terminal_size(1).columns
    except (OSError, ValueError):
        columns = 80  # not a terminal: click renders 80 wide too
    if columns < 80:
        return None
    try:
        with open(os.path.join(os.path.dirname(__file__), "roothelp.txt"), encoding="utf-8") as f:
            return f.read()
    except OSError:
        return None


def _asks_help(args: list[str]) -> bool:
    return any(a in ("-h", "--help") for a in (args[: args.index("--")] if "--" in args else args))


def _click_failure(exc: Exception, args: list[str]) -> int | LinpodxError:
    """What click's own exceptions mean for linpodx (anything else is a bug)."""
    import typer

    from linpodx.cli import surface

    click = surface.click_exceptions()
    if isinstance(exc, click.NoArgsIsHelpError):
        # A group called without a subcommand: its help is what the person wants to see.
        ctx = getattr(exc, "ctx", None)
        sys.stdout.write((ctx.get_help() if ctx is not None else str(exc)) + "\n")
        return 0
    if isinstance(exc, click.UsageError):
        ctx = exc.ctx
        # An option without its value (`audit show --limit`) comes without a context: the
        # command is the one the words name, not linpodx itself.
        name = _command_name(args)
        cmd = ctx.command_path if ctx is not None else " ".join(dict.fromkeys(("linpodx", name)))
        message = exc.format_message()
        if isinstance(exc, click.BadParameter) and not isinstance(exc, click.MissingParameter):
            message = surface.bad_value(exc)
        usage = UsageError(message, f"run `{cmd} --help` for usage")
        print_error(usage)
        return usage
    if isinstance(exc, (typer.Exit, getattr(click, "Exit", typer.Exit))):
        return int(getattr(exc, "exit_code", 0))
    if isinstance(exc, (typer.Abort, getattr(click, "Abort", typer.Abort))):
        sys.stderr.write("error: aborted\n")
        return EXIT_INTERRUPTED
    if isinstance(exc, click.ClickException):
        click_err = LinpodxError(exc.format_message(), exit_code=int(exc.exit_code))
        print_error(click_err)
        return click_err
    return _bug(exc)


def _report(failed: CommandFailed) -> int:
    """Print a command's failure (with `--json`, its envelope on stdout first); its exit status.

    A reader of stdout that went away (`… --json | head -c1`) takes the envelope only: the
    failure is still said on stderr and the exit status is still the failure's own (it was 1
    and nothing said: a script saw neither what failed nor how).
    """
    if failed.json_mode:
        # `events --json` prints one object per line; everything else pretty documents.
        doc = envelope(failed.name, error=failed.error)
        _unless_reader_gone(lambda: print_json(doc, compact=failed.name == "events"))
    print_error(failed.error)
    return failed.error.exit_code


def _unless_reader_gone(write: Callable[[], None]) -> bool:
    """`write()` to stdout; False (stdout then silenced) if its reader went away. The output
    was data nobody reads any more: the command goes on to end as it would have (see
    `_report`). Any other OSError is the boundary's."""
    try:
        write()
    except OSError as exc:
        if exc.errno != errno.EPIPE:
            raise
        _silence_stdout()
        return False
    return True


def _flushed(write: Callable[[], object]) -> None:
    """`write()`, then stdout flushed: a closed pipe is met here, not at the interpreter's exit."""
    write()
    sys.stdout.flush()


def _silence_stdout() -> None:
    """Point stdout at /dev/null: the interpreter's last flush then goes nowhere rather than
    into a traceback."""
    with contextlib.suppress(OSError, ValueError):
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())


def _stdout_reader_gone() -> bool:
    """stdout is a pipe nobody reads any more (an EPIPE from elsewhere, a pipe to a child,
    stays the boundary's)."""
    import select

    try:
        poller = select.poll()
        poller.register(sys.stdout.fileno(), select.POLLOUT)
        return any(ev & select.POLLERR for _fd, ev in poller.poll(0))
    except (OSError, ValueError):
        return False


def _bug(exc: Exception) -> LinpodxError:
    bug = LinpodxError(
        f"internal error: {type(exc).__name__}: {exc}",
        "this is a bug in linpodx; LINPODX_DEBUG=1 shows where",
        exit_code=EXIT_BUG,
    )
    print_error(bug)
    if os.environ.get("LINPODX_DEBUG"):
        raise exc
    return bug


_nothing_left = False
"""A plain `linpodx ps` has printed everything it had: `entry` may leave without the teardown."""


def entry() -> None:
    """The `linpodx` command: `main`, then exit with its status.

    After a run that took the fast path (`linpodx.fastpath.run`), the process leaves with `os._exit`
    once stdout and stderr are flushed: tearing down the interpreter and the ~300 modules the
    run loaded costs ~20 ms after the container has already ended, and there is nothing left to
    do then (every file linpodx wrote is written and closed, the relay threads are joined, and
    linpodx registers no atexit handlers). So does a plain `linpodx ps` (no thread, no file
    left open; the teardown is ~2.5 ms, 15% of `podman ps`: bench/bench_cli.py). Every other
    command exits normally.
    """
    printable_streams()
    rc = main()
    fast = sys.modules.get("linpodx.fastpath.run")
    if _nothing_left or (fast is not None and getattr(fast, "finished", False)):
        for stream in (sys.stdout, sys.stderr):
            try:
                stream.flush()
            except (OSError, ValueError):
                rc = rc or 1  # output that could not be written is a failure, as at normal exit
        os._exit(rc)
    sys.exit(rc)
