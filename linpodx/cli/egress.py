"""Egress commands: the hidden internal entry of the per-container egress guard."""

from __future__ import annotations

from typing import Annotated

import typer

from linpodx.errors import UsageError

FD_MAX = 2**31 - 1
"""File descriptors are C ints."""
WAIT_MAX = 86400.0
"""A day: socket timeouts must stay below what the C call takes."""
_INTERNAL_HINT = "`_egress-guard` is started by `linpodx run`; it is not meant to be run by hand"


def register(app: typer.Typer) -> None:
    """Add this module's commands to the top-level app."""

    @app.command("_egress-guard", hidden=True)
    def egress_guard(
        container: Annotated[str, typer.Option("--container", help="Container name.")],
        control_fd: Annotated[
            int,
            typer.Option(
                "--control-fd",
                min=0,
                max=FD_MAX,
                help="Socket on which the container's PID comes.",
            ),
        ],
        wait: Annotated[
            float,
            typer.Option("--wait", min=0, max=WAIT_MAX, help="Seconds to wait for the PID."),
        ] = 300.0,
    ) -> None:
        """Internal: the egress guard of one container (started by linpodx, ends with it)."""
        import math
        import socket

        from linpodx.egress.runner import run_guard

        if not math.isfinite(wait):  # NaN passes click's range check (no comparison holds)
            raise UsageError(f"--wait must be a number of seconds, not {wait}", _INTERNAL_HINT)
        try:
            control = socket.socket(fileno=control_fd)
        except OSError as exc:
            raise UsageError(
                f"--control-fd {control_fd} is not an open socket ({exc.strerror or exc})",
                _INTERNAL_HINT,
            ) from None
        raise typer.Exit(run_guard(container, control, wait))
