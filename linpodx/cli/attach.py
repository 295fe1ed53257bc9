"""`linpodx attach NAME`: this terminal to a running linpodx container, as `podman attach`."""

from __future__ import annotations

from typing import Annotated

import typer

from linpodx.errors import CommandFailed, LinpodxError, UsageError
from linpodx.output import safe_text

# What podman's --detach-keys takes (its term.ToBytes): comma-separated keys, each one
# character or one of these control keys; empty turns detaching off.
_CTRL_KEYS = frozenset(
    ["ctrl-@", *(f"ctrl-{c}" for c in "abcdefghijklmnopqrstuvwxyz"), "ctrl-[", "ctrl-\\",
     "ctrl-]", "ctrl-^", "ctrl-_"]
)  # fmt: skip


def check_detach_keys(keys: str | None) -> None:
    """UsageError for a --detach-keys podman would refuse only after the attach was recorded
    (exit 125, in its own words)."""
    if not keys:
        return
    for key in keys.split(","):
        # (lower case: what podman compares is its own list, but refusing a key podman takes
        # would be worse than leaving it to podman)
        if len(key.encode()) != 1 and key.lower() not in _CTRL_KEYS:
            raise UsageError(
                f"invalid --detach-keys: {safe_text(repr(key), 40)} is not a key",
                "give keys like ctrl-p,ctrl-q: one character or ctrl-a … ctrl-z, ctrl-@, "
                "ctrl-[, ctrl-\\, ctrl-], ctrl-^, ctrl-_, separated by commas (empty: none)",
            )


def register(app: typer.Typer) -> None:
    """Add `attach` to the top-level app."""

    @app.command("attach")
    def attach_cmd(
        name: Annotated[str, typer.Argument(help="Container name.", show_default=False)],
        detach_keys: Annotated[
            str | None,
            typer.Option(
                "--detach-keys",
                metavar="KEYS",
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
            check_detach_keys(detach_keys)
            rc = containers.attach(
                name, detach_keys=detach_keys, no_stdin=no_stdin, sig_proxy=sig_proxy
            )
        except LinpodxError as err:
            raise CommandFailed("attach", False, err) from None
        raise typer.Exit(rc)
