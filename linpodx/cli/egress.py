"""Egress commands: the hidden internal entry of the per-container egress guard."""

from __future__ import annotations

from typing import Annotated

import typer


def register(app: typer.Typer) -> None:
    """Add this module's commands to the top-level app."""

    @app.command("_egress-guard", hidden=True)
    def egress_guard(
        container: Annotated[str, typer.Option("--container", help="Container name.")],
        control_fd: Annotated[
            int, typer.Option("--control-fd", help="Socket on which the container's PID comes.")
        ],
        wait: Annotated[float, typer.Option("--wait", help="Seconds to wait for the PID.")] = 300.0,
    ) -> None:
        """Internal: the egress guard of one container (started by linpodx, ends with it)."""
        import socket

        from linpodx.egress.runner import run_guard

        raise typer.Exit(run_guard(container, socket.socket(fileno=control_fd), wait))
