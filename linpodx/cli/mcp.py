"""`linpodx mcp …` commands."""

from __future__ import annotations

from typing import Annotated

import typer

from linpodx.cli.common import new_app
from linpodx.errors import CommandFailed, LinpodxError

app = new_app("Bridge MCP clients to servers running inside linpodx containers.")


@app.command(
    "attach",
    context_settings={"allow_interspersed_args": False},
)
def attach_cmd(
    container: Annotated[
        str, typer.Option("--container", "-c", metavar="NAME", help="Running linpodx container.")
    ],
    command: Annotated[
        list[str], typer.Argument(help="Server command to run in the container (after --).")
    ],
) -> None:
    """Run CMD in the container (podman exec -i) and gate every MCP message between it and stdio.

    stdout carries only MCP protocol messages; everything else goes to stderr.
    """
    from linpodx.mcp.attach import attach

    try:
        code = attach(container, command)
    except LinpodxError as err:
        # Never an envelope: stdout is the MCP client's.
        raise CommandFailed("mcp attach", False, err) from None
    raise typer.Exit(code)
