"""`linpodx attach NAME`: this terminal to a running linpodx container, as `podman attach`."""

from __future__ import annotations

from typing import Annotated

import typer

from linpodx.errors import CommandFailed, LinpodxError


def register(app: typer.Typer) -> None:
    """Add `attach` to the top-level app."""

    @app.command("attach")
    def attach_cmd(
        name: Annotated[str, typer.Argument(help="Container name.", show_default=False)],
        detach_keys: Annotated[
            str | None,
            typer.Option(
                "--detach-keys",
                help="Keys that detach and leave it running (podman's default: ctrl-p,ctrl-q; "
                "empty: none).",
                show_default=False,
            ),
        ] = None,
        no_stdin: Annotated[
            bool, typer.Option("--no-stdin", help="Do not pass this terminal's input on.")
        ] = False,
        sig_proxy: Annotated[
            bool,
            typer.Option(
                "--sig-proxy/--no-sig-proxy",
                help="Pass signals (Ctrl-C without a TTY) on to the container.",
            ),
        ] = True,
    ) -> None:
        """Attach this terminal to a running linpodx container (audited; keys detach)."""
        from linpodx import containers

        try:
            rc = containers.attach(
                name, detach_keys=detach_keys, no_stdin=no_stdin, sig_proxy=sig_proxy
            )
        except LinpodxError as err:
            raise CommandFailed("attach", False, err) from None
        raise typer.Exit(rc)
