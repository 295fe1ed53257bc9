"""Entry point: `linpodx …` and `python -m linpodx …`."""

from __future__ import annotations

import importlib
import os
import sys

from linpodx import __version__
from linpodx.errors import EXIT_BUG, EXIT_USAGE, LinpodxError
from linpodx.output import print_error

TYPE_CHECKING = False  # not typing's: `linpodx run` starts here (see linpodx/fastrun.py)
if TYPE_CHECKING:
    from collections.abc import Sequence

    import typer

HELP = "Run an AI agent's CLI inside a rootless Podman sandbox. No daemon."

# Command groups (typer sub-apps) and modules that add top-level commands, in help order.
# They are imported only when their command is asked for: importing all of them costs several
# hundred milliseconds (jsonschema, the MCP stack), which every `linpodx run` would pay.
_GROUPS = {
    "sandbox": "linpodx.cli.sandbox",
    "audit": "linpodx.cli.audit",
    "mcp": "linpodx.cli.mcp",
    "snapshot": "linpodx.cli.snapshot",
}
_TOP_LEVEL = {
    "linpodx.cli.containers": ("run", "ps", "start", "stop", "rm", "logs", "exec", "doctor"),
    "linpodx.cli.approvals": ("events", "approve", "deny"),
    "linpodx.cli.egress": ("_egress-guard",),
}


def version_cmd() -> None:
    """Print the linpodx version."""
    print(f"linpodx {__version__}")


def _root() -> None:
    pass


def build_app(command: str | None = None) -> typer.Typer:
    """The CLI app; with `command`, only the module that provides it is loaded.

    An unknown or missing command loads everything, so help and "No such command" are complete.
    """
    from linpodx.cli.common import new_app

    app = new_app(HELP)
    # A callback keeps typer in group mode even when only one command is registered (otherwise
    # `linpodx version` would be parsed as `version` being an argument of the sole command).
    app.callback()(_root)
    known = (
        command == "version"
        or command in _GROUPS
        or any(command in names for names in _TOP_LEVEL.values())
    )
    for module, names in _TOP_LEVEL.items():
        if not known or command in names:
            importlib.import_module(module).register(app)
    for name, module in _GROUPS.items():
        if not known or command == name:
            app.add_typer(importlib.import_module(module).app, name=name)
    app.command("version")(version_cmd)
    return app


def _kind(exc: BaseException) -> set[str]:
    """Names in the exception's class hierarchy.

    typer ≥0.29 vendors its own copy of click (`typer._click`) while older releases use click
    itself; matching by class name handles both without importing a private module.
    """
    return {cls.__name__ for cls in type(exc).__mro__}


def main(argv: Sequence[str] | None = None) -> int:
    """Run the CLI and return its exit code. Expected failures never print a traceback."""
    args = list(sys.argv[1:] if argv is None else argv)
    command = args[0] if args and not args[0].startswith("-") else None
    try:
        if command == "run":
            # typer costs ~0.2 s of start-up; the plain forms of `run` skip it (see runcmd).
            from linpodx.cli import runcmd

            fields = runcmd.parse_fields(args[1:])
            if fields is not None:
                return runcmd.run_fields(fields)
        app = build_app(command)
        rv = app(args=args, prog_name="linpodx", standalone_mode=False)
    except LinpodxError as exc:
        print_error(exc)
        return exc.exit_code
    except KeyboardInterrupt:
        sys.stderr.write("error: interrupted\n")
        return 130
    except Exception as exc:
        kind = _kind(exc)
        if "NoArgsIsHelpError" in kind:
            # A group called without a subcommand: its help is what the person wants to see.
            ctx = getattr(exc, "ctx", None)
            sys.stdout.write((ctx.get_help() if ctx is not None else str(exc)) + "\n")
            return 0
        if "UsageError" in kind:
            ctx = getattr(exc, "ctx", None)
            cmd = ctx.command_path if ctx is not None else "linpodx"
            print_error(LinpodxError(exc.format_message(), f"run `{cmd} --help` for usage"))  # type: ignore[attr-defined]
            return EXIT_USAGE
        if "Exit" in kind:
            return int(getattr(exc, "exit_code", 0))
        if "Abort" in kind:
            sys.stderr.write("error: aborted\n")
            return 130
        if "ClickException" in kind:
            print_error(LinpodxError(exc.format_message()))  # type: ignore[attr-defined]
            return int(getattr(exc, "exit_code", 1))
        sys.stderr.write(f"error: internal error: {type(exc).__name__}: {exc}\n")
        sys.stderr.write("hint: this is a bug in linpodx; LINPODX_DEBUG=1 shows where\n")
        if os.environ.get("LINPODX_DEBUG"):
            raise
        return EXIT_BUG
    return rv if isinstance(rv, int) else 0


def entry() -> None:
    """The `linpodx` command: `main`, then exit with its status.

    After a run that took the fast path (`linpodx.fastrun`), the process leaves with `os._exit`
    once stdout and stderr are flushed: tearing down the interpreter and the ~300 modules the
    run loaded costs ~20 ms after the container has already ended, and there is nothing left to
    do then (every file linpodx wrote is written and closed, the relay threads are joined, and
    linpodx registers no atexit handlers). Every other command exits normally.
    """
    rc = main()
    fast = sys.modules.get("linpodx.fastrun")
    if fast is not None and getattr(fast, "finished", False):
        for stream in (sys.stdout, sys.stderr):
            try:
                stream.flush()
            except (OSError, ValueError):
                rc = rc or 1  # output that could not be written is a failure, as at normal exit
        os._exit(rc)
    sys.exit(rc)
