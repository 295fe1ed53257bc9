"""Entry point: `linpodx …` and `python -m linpodx …`."""

from __future__ import annotations

import os
import sys
from collections.abc import Sequence

import typer

from linpodx import __version__
from linpodx.cli import approvals, audit, containers, egress, mcp, sandbox, snapshot
from linpodx.cli.common import new_app
from linpodx.errors import EXIT_BUG, EXIT_USAGE, LinpodxError
from linpodx.output import print_error

app = new_app("Run an AI agent's CLI inside a rootless Podman sandbox. No daemon.")
app.add_typer(sandbox.app, name="sandbox")
app.add_typer(audit.app, name="audit")
app.add_typer(mcp.app, name="mcp")
app.add_typer(snapshot.app, name="snapshot")
containers.register(app)
approvals.register(app)
egress.register(app)


@app.command("version")
def version_cmd() -> None:
    """Print the linpodx version."""
    typer.echo(f"linpodx {__version__}")


def _kind(exc: BaseException) -> set[str]:
    """Names in the exception's class hierarchy.

    typer ≥0.29 vendors its own copy of click (`typer._click`) while older releases use click
    itself; matching by class name handles both without importing a private module.
    """
    return {cls.__name__ for cls in type(exc).__mro__}


def main(argv: Sequence[str] | None = None) -> int:
    """Run the CLI and return its exit code. Expected failures never print a traceback."""
    args = list(sys.argv[1:] if argv is None else argv)
    try:
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
