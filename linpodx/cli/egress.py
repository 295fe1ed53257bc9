"""Egress commands: the hidden internal entry of the per-container egress guard."""

from __future__ import annotations

from typing import Annotated

import typer


def register(app: typer.Typer) -> None:
    """Add this module's commands to the top-level app."""

    @app.command("_egress-guard", hidden=True)
    def egress_guard(
        container: Annotated[str, typer.Option("--container", help="Container name.")],
        pid: Annotated[int, typer.Option("--pid", help="The container's init PID.")],
    ) -> None:
        """Internal: the egress guard of one container (started by linpodx, ends with it)."""
        from linpodx.egress.runner import run_guard

        raise typer.Exit(run_guard(container, pid))
